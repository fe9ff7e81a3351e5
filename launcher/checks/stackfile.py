"""A platform stack's settings from Pulumi.<stack>.yaml, validated by the program's own config.load, plus the
subscription it pins; read without the Pulumi CLI (preflight runs before there is anything to ask it)."""

from __future__ import annotations

import pathlib
from dataclasses import dataclass

import yaml

from trainingplatform import config

from ..errors import JobError

ROOT = pathlib.Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class StackFile:
    settings: config.PlatformConfig
    subscription: str | None  # azure-native:subscriptionId


def read(stack: str, root: pathlib.Path | None = None) -> StackFile:
    path = (root or ROOT) / f"Pulumi.{stack}.yaml"
    if not path.is_file():
        raise JobError(f"{path} not found: copy Pulumi.dev.yaml to it and edit it (docs/deploying.md#deploy)")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as e:
        raise JobError(f"{path} is not YAML: {e}") from None
    raw, native = {}, {}
    for key, value in (data.get("config") or {}).items():
        namespace, _, name = str(key).partition(":")
        if namespace == config.PROJECT and not (isinstance(value, dict) and "secure" in value):
            raw[name] = value
        elif namespace == "azure-native":
            native[name] = value
    subscription = native.get("subscriptionId")
    subscription = str(subscription).strip() if subscription else None
    try:
        # The program refuses a stack that pins no subscription (its names hash it), with the fix.
        settings = config.load(raw, stack, native.get("location"), subscription)
    except config.ConfigError as e:
        raise JobError(f"{path}: {e}") from None
    return StackFile(settings, subscription)
