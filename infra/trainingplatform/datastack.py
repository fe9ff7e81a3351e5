"""The data stack: the durable storage of one environment, with a lifecycle of its own.

Pulumi's answer to resources with different lifecycles is separate stacks. This one (project
`azure-horovod-training-data`, `infra/data-stack/`) holds the data resource group, the training-data,
logs and NFS accounts, their containers and share, every one `protect`ed, and its users' access to the
containers (config `users`; access.py says why the data stack, not the platforms, grants it). Platform
stacks read its outputs through a StackReference and create, each life, what connects their VNet and
identities to it (private endpoints, DNS, the role assignments of their own identities). So `pulumi destroy` of the platform leaves this state and these
resources untouched, and the next platform `up` creates nothing that already exists: no import, no
name juggling. Deleting the data is a deliberate act on this stack (docs/deploying.md#deleting-the-data-for-good).

The outputs are the contract with the platform (program.py reads them by these names).
"""

from __future__ import annotations

from dataclasses import dataclass

import pulumi
from pulumi_azure_native import resources

from . import naming
from .access import AccessGrants, Grant, container_scope, deployer_users
from .dataconfig import PROJECT, DataConfig
from .nfs import MOUNT_OPTIONS, NfsShare
from .storage import StorageArgs, TrainingStorage

OUTPUTS = (
    "subscription_id",
    "location",
    "resource_group",
    "data_account_name",
    "data_account_id",
    "data_container",
    "logs_account_name",
    "logs_account_id",
    "logs_container",
    "nfs",
)


def default_reference(organization: str, platform_stack: str) -> str:
    """The data stack a platform stack reads unless config `dataStack` says otherwise: same org, same stack name."""
    from .dataconfig import PROJECT

    return f"{organization}/{PROJECT}/{platform_stack}"


def build(cfg: DataConfig) -> dict[str, pulumi.Input]:
    users = deployer_users(cfg.users, PROJECT)  # before anything is declared: it may refuse
    for warning in cfg.warnings:
        pulumi.log.warn(warning)
    suffix = naming.global_suffix(cfg.subscription_id, cfg.prefix, cfg.stack, cfg.location)
    protect = pulumi.ResourceOptions(protect=True)
    group = resources.ResourceGroup(
        "data",
        resource_group_name=cfg.resource_group_name or naming.dashed(cfg.prefix, cfg.stack, "data-rg"),
        location=cfg.location,
        tags=cfg.tags,
        opts=protect,
    )
    store = TrainingStorage(
        "storage",
        resource_group=group.name,
        args=StorageArgs.of(cfg),
        suffix=suffix,
        opts=protect,
    )
    data_scope = container_scope(store.data_account.id, store.data_container.name)
    logs_scope = container_scope(store.logs_account.id, store.logs_container.name)
    grants = []
    for u in users:
        grants += [
            Grant(f"user-{u.object_id}-uploads-data", "Storage Blob Data Contributor", u.object_id, data_scope, u.type),
            Grant(f"user-{u.object_id}-reads-logs", "Storage Blob Data Reader", u.object_id, logs_scope, u.type),
        ]
    # Not protected: access is no data, and a changed users list must be able to revoke.
    AccessGrants("access", cfg.subscription_id, cfg.stack, grants)
    nfs = None
    if cfg.nfs.enabled:
        nfs = NfsShare(
            "nfs",
            resource_group=group.name,
            location=cfg.location,
            prefix=cfg.prefix,
            stack=cfg.stack,
            suffix=suffix,
            cfg=cfg.nfs,
            tags=cfg.tags,
            opts=protect,
        )
    return {
        "subscription_id": cfg.subscription_id,
        "location": cfg.location,
        "resource_group": group.name,
        "data_account_name": store.data_account.name,
        "data_account_id": store.data_account.id,
        "data_container": store.data_container.name,
        "logs_account_name": store.logs_account.name,
        "logs_account_id": store.logs_account.id,
        "logs_container": store.logs_container.name,
        "nfs": (
            {
                "account_name": nfs.account.name,
                "account_id": nfs.account.id,
                "share": nfs.share.name,
                "mount_target": nfs.mount_target,
                "mount_options": MOUNT_OPTIONS,
            }
            if nfs
            else None
        ),
    }


@dataclass(frozen=True)
class Named:
    """A data-stack resource as the platform sees it: its Azure name and id."""

    name: pulumi.Output
    id: pulumi.Output


class DataStackReference:
    """The platform's view of its data stack (a StackReference), checked against the platform's settings.

    Every id read here carries the checks: a data stack in another region, or without the NFS share the
    platform wants to mount, fails `pulumi preview` with the fix instead of declaring endpoints to nothing."""

    def __init__(self, reference: str, location: str, mount_nfs: bool):
        self.reference = reference
        self.stack = pulumi.StackReference("data-stack", stack_name=reference)
        out = self.stack.require_output
        checked = pulumi.Output.all(out("location"), self.stack.get_output("nfs")).apply(
            lambda a: _check(reference, a[0], location, a[1], mount_nfs)
        )

        def read(key: str) -> pulumi.Output:
            return pulumi.Output.all(checked, out(key)).apply(lambda a: a[1])

        self.resource_group = read("resource_group")
        self.data_account = Named(read("data_account_name"), read("data_account_id"))
        self.logs_account = Named(read("logs_account_name"), read("logs_account_id"))
        self.data_container = Named(read("data_container"), None)
        self.logs_container = Named(read("logs_container"), None)
        self.nfs = read("nfs") if mount_nfs else None


def _check(reference: str, data_location: str, location: str, nfs, mount_nfs: bool) -> bool:
    problems = []
    if data_location != location:
        problems.append(
            f"the data stack {reference} is in {data_location}, this platform in {location}: set "
            f"azure-native:location to {data_location} here (jobs would read their data across regions)"
        )
    if mount_nfs and not nfs:
        problems.append(
            f"the data stack {reference} has no NFS share (nfs.enabled is false there): set "
            "`pulumi config set mountNfs false` here, or enable nfs in the data stack and `pulumi up` it first"
        )
    if problems:
        raise ValueError("the platform does not fit its data stack:\n  - " + "\n  - ".join(problems))
    return True
