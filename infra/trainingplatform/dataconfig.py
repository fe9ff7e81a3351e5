"""Typed, validated configuration of the data stack (project `azure-horovod-training-data`,
`infra/data-stack/Pulumi.<stack>.yaml`): the durable storage that outlives platform stacks.

Same rules as the platform's config (config.py): every problem is listed, with the key, the bad value and
what is allowed, before anything is declared.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from . import config, networkconfig
from .reader import ConfigError, Principal, Reader

PROJECT = "azure-horovod-training-data"

CONTAINER_NAME = config.CONTAINER_NAME
SHARE_NAME = config.SHARE_NAME
# Resource group names: 1-90 letters, digits, underscores, hyphens, periods and parentheses, not ending in
# a period (learn.microsoft.com/azure/azure-resource-manager/management/resource-name-rules, resourcegroups).
_GROUP = re.compile(r"^[-\w.()]{0,89}[-\w()]$")

DATA_KEYS = ("prefix", "allowedClientIps", "allowedSubnetIds", "storage", "nfs", "tags", "users", "resourceGroupName")
STORAGE_KEYS = ("dataContainer", "logsContainer", "replication", "softDeleteDays")
NFS_KEYS = ("enabled", "shareName", "quotaGiB", "rootSquash")


@dataclass(frozen=True, kw_only=True)
class Storage:
    data_container: str
    logs_container: str
    replication: str  # LRS | ZRS
    soft_delete_days: int


@dataclass(frozen=True, kw_only=True)
class Nfs:
    enabled: bool
    share_name: str
    quota_gib: int
    root_squash: str


@dataclass(frozen=True, kw_only=True)
class DataConfig:
    stack: str
    subscription_id: str  # azure-native:subscriptionId, required (see config.PlatformConfig)
    prefix: str
    location: str
    allowed_client_ips: tuple[str, ...]
    storage: Storage
    nfs: Nfs
    tags: dict[str, str]
    # VNet rules of the data and logs accounts: subnets (full ids) that reach them from the same region.
    allowed_subnet_ids: tuple[str, ...] = ()
    # Who may upload data and read outputs; None: whoever runs `pulumi up` here (access.py). The data
    # stack grants this, not the platform stacks: several platforms may share one data stack.
    users: tuple[Principal, ...] | None = None
    # The data resource group's name; None: derived from prefix and stack (naming.dashed). Set it to keep the
    # group of a data stack deployed before the names carried the stack's hash (docs/stack-lifecycle.md).
    resource_group_name: str | None = None
    warnings: tuple[str, ...] = ()


def _storage(r: Reader, raw: dict) -> Storage:
    s = r.get(raw, "storage", "", dict, {})
    p = "storage."
    r.known(s, p, STORAGE_KEYS, also=("retainOnDelete",))
    data = r.get(s, "dataContainer", p, str, "training-data")
    logs = r.get(s, "logsContainer", p, str, "logs")
    for k, v in (("dataContainer", data), ("logsContainer", logs)):
        if v is not None and not CONTAINER_NAME.match(v):
            r.bad(p + k, v, "3-63 lowercase letters, digits and single hyphens")
    repl = r.choice(
        s,
        "replication",
        p,
        "LRS",
        ("LRS", "ZRS"),
        "LRS or ZRS (premium block blob and file storage offer no geo-replication)",
    )
    days = r.within(s, "softDeleteDays", p, 14, 1, 365, "1 to 365 days")
    _retired_retain_key(r, s, p)
    return Storage(data_container=data, logs_container=logs, replication=repl, soft_delete_days=days)


def _nfs(r: Reader, raw: dict) -> Nfs:
    n = r.get(raw, "nfs", "", dict, {})
    p = "nfs."
    r.known(n, p, NFS_KEYS, also=("retainOnDelete",))
    enabled = r.get(n, "enabled", p, bool, True)
    share = r.get(n, "shareName", p, str, "shared")
    if share is not None and not SHARE_NAME.match(share):
        r.bad(p + "shareName", share, "3-63 lowercase letters, digits and single hyphens")
    quota = r.within(n, "quotaGiB", p, 100, 100, 102400, "premium NFS shares take 100 to 102400 GiB")
    squash = r.choice(
        n,
        "rootSquash",
        p,
        "RootSquash",
        ("RootSquash", "NoRootSquash", "AllSquash"),
        "RootSquash, NoRootSquash or AllSquash",
    )
    _retired_retain_key(r, n, p)
    return Nfs(enabled=enabled, share_name=share, quota_gib=quota, root_squash=squash)


def _retired_retain_key(r: Reader, d: dict, p: str) -> None:
    # A silently ignored "retainOnDelete: false" would let a user believe `pulumi destroy` removes the data.
    if "retainOnDelete" in d:
        r.bad(
            p + "retainOnDelete",
            d["retainOnDelete"],
            "no longer a setting: the data stack's resources are always "
            "protected; remove the key (to delete the data for good see docs/deploying.md#deleting-the-data-for-good)",
        )


def load(raw: dict, stack: str, location: str | None, subscription_id: str | None = None) -> DataConfig:
    r = Reader()
    config.location_and_subscription(r, location, subscription_id, " in infra/data-stack")
    r.known(raw, "", DATA_KEYS)
    prefix = r.get(raw, "prefix", "", str, allowed="2-8 lowercase letters and digits, starting with a letter")
    if prefix is not None and not config.PREFIX_NAME.match(prefix):
        r.bad(
            "prefix",
            prefix,
            "2-8 lowercase letters and digits, starting with a letter (it goes into storage account names)",
        )
    ips = networkconfig.read_client_ips(r, raw, "")
    subnets = networkconfig.read_subnet_ids(r, raw, "")
    storage = _storage(r, raw)
    nfs = _nfs(r, raw)
    users = config.read_users(r, raw)
    group = r.get(raw, "resourceGroupName", "", str, None)
    if group is not None and not _GROUP.match(group):
        r.bad("resourceGroupName", group, "1-90 letters, digits, _ - . ( ), not ending in a period (Azure's rule)")
    tags = r.get(raw, "tags", "", dict, {})
    if r.problems:
        raise ConfigError(r.problems)
    return DataConfig(
        stack=stack,
        subscription_id=subscription_id.lower(),
        prefix=prefix,
        location=location,
        allowed_client_ips=tuple(str(i) for i in ips),
        storage=storage,
        nfs=nfs,
        tags={"project": PROJECT, "stack": stack, **{str(k): str(v) for k, v in tags.items()}},
        allowed_subnet_ids=subnets,
        users=users,
        resource_group_name=group,
        warnings=tuple(r.warnings),
    )


def from_pulumi() -> DataConfig:
    """Read the current data stack's config through Pulumi (infra/data-stack/__main__.py)."""
    return load(*config.pulumi_settings(PROJECT))
