"""Typed, validated configuration of the data stack (project `azure-horovod-training-data`,
`infra/data-stack/Pulumi.<stack>.yaml`): the durable storage that outlives platform stacks.

Same rules as the platform's config (config.py): every problem is listed, with the key, the bad value and
what is allowed, before anything is declared.
"""
from __future__ import annotations

from dataclasses import dataclass

from . import config
from .config import ConfigError, _Reader

PROJECT = "azure-horovod-training-data"

_CONTAINER = config._CONTAINER
_SHARE = config._SHARE


@dataclass(frozen=True)
class Storage:
    data_container: str
    logs_container: str
    replication: str              # LRS | ZRS
    soft_delete_days: int


@dataclass(frozen=True)
class Nfs:
    enabled: bool
    share_name: str
    quota_gib: int
    root_squash: str


@dataclass(frozen=True)
class DataConfig:
    stack: str
    prefix: str
    location: str
    allowed_client_ips: tuple[str, ...]
    storage: Storage
    nfs: Nfs
    tags: dict[str, str]


def _storage(r: _Reader, raw: dict) -> Storage:
    s = r.get(raw, "storage", "", dict, {})
    p = "storage."
    data = r.get(s, "dataContainer", p, str, "training-data")
    logs = r.get(s, "logsContainer", p, str, "logs")
    for k, v in (("dataContainer", data), ("logsContainer", logs)):
        if v is not None and not _CONTAINER.match(v):
            r.bad(p + k, v, "3-63 lowercase letters, digits and single hyphens")
    repl = r.choice(s, "replication", p, "LRS", ("LRS", "ZRS"),
                    "LRS or ZRS (premium block blob and file storage offer no geo-replication)")
    days = r.within(s, "softDeleteDays", p, 14, 1, 365, "1 to 365 days")
    _retired_retain_key(r, s, p)
    return Storage(data, logs, repl, days)


def _nfs(r: _Reader, raw: dict) -> Nfs:
    n = r.get(raw, "nfs", "", dict, {})
    p = "nfs."
    enabled = r.get(n, "enabled", p, bool, True)
    share = r.get(n, "shareName", p, str, "shared")
    if share is not None and not _SHARE.match(share):
        r.bad(p + "shareName", share, "3-63 lowercase letters, digits and single hyphens")
    quota = r.within(n, "quotaGiB", p, 100, 100, 102400, "premium NFS shares take 100 to 102400 GiB")
    squash = r.choice(n, "rootSquash", p, "RootSquash", ("RootSquash", "NoRootSquash", "AllSquash"),
                      "RootSquash, NoRootSquash or AllSquash")
    _retired_retain_key(r, n, p)
    return Nfs(enabled, share, quota, squash)


def _retired_retain_key(r: _Reader, d: dict, p: str) -> None:
    # A silently ignored "retainOnDelete: false" would let a user believe `pulumi destroy` removes the data.
    if "retainOnDelete" in d:
        r.bad(p + "retainOnDelete", d["retainOnDelete"], "no longer a setting: the data stack's resources are always "
              "protected; remove the key (to delete the data for good see docs/deploying.md#deleting-the-data-for-good)")


def load(raw: dict, stack: str, location: str | None) -> DataConfig:
    r = _Reader()
    if not location:
        r.problems.append("azure-native:location is missing: set the Azure region, e.g. "
                          "`pulumi config set azure-native:location westeurope` in infra/data-stack")
    elif not config._LOCATION.match(location):
        r.bad("azure-native:location", location, "an Azure region's short name such as westeurope or eastus2 "
              "(lowercase, no spaces)")
    prefix = r.get(raw, "prefix", "", str, allowed="2-8 lowercase letters and digits, starting with a letter")
    if prefix is not None and not config._PREFIX.match(prefix):
        r.bad("prefix", prefix, "2-8 lowercase letters and digits, starting with a letter (it goes into "
              "storage account names)")
    ips = config._client_ips(r, raw, "")
    storage = _storage(r, raw)
    nfs = _nfs(r, raw)
    tags = r.get(raw, "tags", "", dict, {})
    if r.problems:
        raise ConfigError(r.problems)
    return DataConfig(stack, prefix, location, tuple(str(i) for i in ips), storage, nfs,
                      {"project": PROJECT, "stack": stack, **{str(k): str(v) for k, v in tags.items()}})


def from_pulumi() -> DataConfig:
    """Read the current data stack's config through Pulumi (infra/data-stack/__main__.py)."""
    return load(*config.pulumi_settings(("prefix", "allowedClientIps", "storage", "nfs", "tags")))

