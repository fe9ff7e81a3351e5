"""A platform stack's settings from Pulumi.<stack>.yaml, validated by the program's own config.load, plus the
subscription it pins; the data stack's from infra/data-stack/Pulumi.<stack>.yaml, validated by dataconfig.load;
read without the Pulumi CLI (preflight runs before there is anything to ask it)."""

from __future__ import annotations

import pathlib
from dataclasses import dataclass

import yaml

from azureaccess.errors import JobError
from trainingplatform import config, dataconfig

ROOT = pathlib.Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class StackFile:
    settings: config.PlatformConfig
    subscription: str | None  # azure-native:subscriptionId


@dataclass(frozen=True)
class DataStackFile:
    settings: dataconfig.DataConfig
    subscription: str | None  # azure-native:subscriptionId


def _settings(path: pathlib.Path, project: str) -> tuple[dict, dict]:
    """(the project's plain settings, azure-native's) of a Pulumi.<stack>.yaml."""
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as e:
        raise JobError(f"{path} is not YAML: {e}") from None
    raw, native = {}, {}
    for key, value in (data.get("config") or {}).items():
        namespace, _, name = str(key).partition(":")
        if namespace == project and not (isinstance(value, dict) and "secure" in value):
            raw[name] = value
        elif namespace == "azure-native":
            native[name] = value
    return raw, native


def _load(path: pathlib.Path, stack: str, program, template: str):
    """(settings, subscription) of a stack file, validated by `program`'s own load (config or dataconfig)."""
    if not path.is_file():
        raise JobError(f"{path} not found: copy {template} to it and edit it (docs/deploying.md#deploy)")
    raw, native = _settings(path, program.PROJECT)
    subscription = native.get("subscriptionId")
    subscription = str(subscription).strip() if subscription else None
    try:
        # The programs refuse a stack that pins no subscription (their names hash it), with the fix.
        settings = program.load(raw, stack, native.get("location"), subscription)
    except config.ConfigError as e:
        raise JobError(f"{path}: {e}") from None
    return settings, subscription


def read(stack: str, root: pathlib.Path | None = None) -> StackFile:
    return StackFile(*_load((root or ROOT) / f"Pulumi.{stack}.yaml", stack, config, "Pulumi.dev.yaml"))


def read_data(stack: str, root: pathlib.Path | None = None) -> DataStackFile:
    """infra/data-stack/Pulumi.<stack>.yaml (project azure-horovod-training-data), as the data program reads it."""
    path = (root or ROOT) / "infra" / "data-stack" / f"Pulumi.{stack}.yaml"
    return DataStackFile(*_load(path, stack, dataconfig, "infra/data-stack/Pulumi.dev.yaml"))
