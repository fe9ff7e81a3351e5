"""The data stack: the durable storage of one environment, with a lifecycle of its own.

Pulumi's answer to resources with different lifecycles is separate stacks. This one (project
`azure-horovod-training-data`, `infra/data-stack/`) holds the data resource group, the training-data,
logs and NFS accounts, their containers and share, every one `protect`ed. Platform stacks read its
outputs through a StackReference and create, each life, what connects their VNet to it (private
endpoints, DNS, role assignments). So `pulumi destroy` of the platform leaves this state and these
resources untouched, and the next platform `up` creates nothing that already exists: no import, no
name juggling. Deleting the data is a deliberate act on this stack (docs/deploying.md#deleting-the-data-for-good).

The outputs are the contract with the platform (program.py reads them by these names).
"""
from __future__ import annotations

from dataclasses import dataclass

import pulumi
from pulumi_azure_native import authorization, resources

from . import naming
from .dataconfig import DataConfig
from .nfs import MOUNT_OPTIONS, NfsShare
from .storage import TrainingStorage

OUTPUTS = ("subscription_id", "location", "resource_group", "data_account_name", "data_account_id",
           "data_container", "logs_account_name", "logs_account_id", "logs_container", "nfs")


def default_reference(organization: str, platform_stack: str) -> str:
    """The data stack a platform stack reads unless config `dataStack` says otherwise: same org, same stack name."""
    from .dataconfig import PROJECT
    return f"{organization}/{PROJECT}/{platform_stack}"


def build(cfg: DataConfig) -> dict[str, pulumi.Input]:
    client = authorization.get_client_config_output()
    suffix = naming.global_suffix(client.subscription_id, cfg.prefix, cfg.stack, cfg.location)
    protect = pulumi.ResourceOptions(protect=True)
    group = resources.ResourceGroup("data", resource_group_name=naming.dashed(cfg.prefix, cfg.stack, "data-rg"),
                                    location=cfg.location, tags=cfg.tags, opts=protect)
    store = TrainingStorage("storage", group.name, cfg.location, cfg.prefix, cfg.stack, suffix, cfg.storage,
                            cfg.allowed_client_ips, cfg.tags, opts=protect)
    nfs = None
    if cfg.nfs.enabled:
        nfs = NfsShare("nfs", group.name, cfg.location, cfg.prefix, cfg.stack, suffix, cfg.nfs, cfg.tags, opts=protect)
    return {
        "subscription_id": client.subscription_id,
        "location": cfg.location,
        "resource_group": group.name,
        "data_account_name": store.data_account.name,
        "data_account_id": store.data_account.id,
        "data_container": store.data_container.name,
        "logs_account_name": store.logs_account.name,
        "logs_account_id": store.logs_account.id,
        "logs_container": store.logs_container.name,
        "nfs": ({"account_name": nfs.account.name, "account_id": nfs.account.id, "share": nfs.share.name,
                 "mount_target": nfs.mount_target, "mount_options": MOUNT_OPTIONS} if nfs else None),
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
            lambda a: _check(reference, a[0], location, a[1], mount_nfs))

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
        problems.append(f"the data stack {reference} is in {data_location}, this platform in {location}: set "
                        f"azure-native:location to {data_location} here (jobs would read their data across regions)")
    if mount_nfs and not nfs:
        problems.append(f"the data stack {reference} has no NFS share (nfs.enabled is false there): set "
                        "`pulumi config set mountNfs false` here, or enable nfs in the data stack and `pulumi up` it first")
    if problems:
        raise ValueError("the platform does not fit its data stack:\n  - " + "\n  - ".join(problems))
    return True
