"""Shared NFS file system: an Azure Files premium NFS 4.1 share (in the data stack), reachable from a
platform's VNet only, through the private endpoint each platform life creates (program.py).

Why managed NFS rather than the VM-based NFS server of the source documents: no VM to patch, size or back
up, capacity and IOPS scale with the provisioned size, snapshots and soft delete come with it.

NFS 4.1 on Azure Files does not use HTTPS, so the account must turn "secure transfer required" off. That
is made safe by closing the account to every network but private endpoints (public network access
disabled); the policy pack allows this exception for exactly that shape.
"""

from __future__ import annotations

import pulumi
from pulumi_azure_native import storage

from . import naming
from .dataconfig import Nfs

MOUNT_OPTIONS = "vers=4,minorversion=1,sec=sys,nconnect=4"


class NfsShare(pulumi.ComponentResource):
    """Outputs: account, share, mount_target (`host:/account/share`, for `mount -t nfs -o vers=4,minorversion=1`).

    Protected like the blob storage (storage.py)."""

    def __init__(
        self,
        name: str,
        resource_group,
        location: str,
        prefix: str,
        stack: str,
        suffix: pulumi.Input[str],
        cfg: Nfs,
        tags: dict,
        opts: pulumi.ResourceOptions | None = None,
    ):
        super().__init__("trainingplatform:nfs:NfsShare", name, None, opts)
        keep = pulumi.ResourceOptions(parent=self, protect=True)
        self.account = storage.StorageAccount(
            f"{name}-account",
            account_name=naming.storage_account(prefix, stack, "nfs", suffix),
            resource_group_name=resource_group,
            location=location,
            kind="FileStorage",
            sku=storage.SkuArgs(name="Premium_LRS"),
            enable_https_traffic_only=False,  # NFS 4.1 requires it; see the module docstring
            minimum_tls_version="TLS1_2",
            allow_blob_public_access=False,
            allow_shared_key_access=False,
            public_network_access="Disabled",
            network_rule_set=storage.NetworkRuleSetArgs(default_action="Deny", bypass="None"),
            tags=tags,
            opts=keep,
        )
        storage.FileServiceProperties(
            f"{name}-file-service",
            account_name=self.account.name,
            resource_group_name=resource_group,
            file_services_name="default",
            share_delete_retention_policy=storage.DeleteRetentionPolicyArgs(enabled=True, days=14),
            opts=keep,
        )
        self.share = storage.FileShare(
            f"{name}-share",
            account_name=self.account.name,
            resource_group_name=resource_group,
            share_name=cfg.share_name,
            enabled_protocols="NFS",
            root_squash=cfg.root_squash,
            share_quota=cfg.quota_gib,
            opts=keep,
        )
        self.mount_target = pulumi.Output.concat(
            self.account.name, ".file.core.windows.net:/", self.account.name, "/", self.share.name
        )
        self.register_outputs({"account": self.account.name, "mount_target": self.mount_target})
