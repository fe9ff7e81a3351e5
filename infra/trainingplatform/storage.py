"""Storage accounts: Premium block blob for the training data, standard for logs, results and models
(both in the data stack), and the shared helpers the workspace's own account uses.

Shared keys are off: jobs and datastores use Entra ID (managed identities), users `az login`.
The data accounts outlive platform stacks, so their network rules name nothing of a platform's
lifecycle (a VNet whose name changes with each life would leave a dangling rule): they are closed to
every public network but `allowedClientIps` and `allowedSubnetIds` (subnets the user names, of their own
lifecycle), and compute reaches them through private endpoints that each platform life creates in its own
VNet (program.py).

IP rules admit nothing from the account's own Azure region ("IP network rules have no effect on requests
originating from the same Azure region as the storage account":
https://learn.microsoft.com/azure/storage/common/storage-network-security): a VM or CI runner in the region
gets in through a VNet rule (a subnet with the Microsoft.Storage service endpoint) or a private endpoint.
"""

from __future__ import annotations

from dataclasses import dataclass

import pulumi
from pulumi_azure_native import storage

from . import naming
from .config import Network
from .dataconfig import Storage


def network_rules(
    net: Network, compute_subnet_id: pulumi.Input[str], *other_subnet_ids: pulumi.Input[str]
) -> storage.NetworkRuleSetArgs:
    """Deny by default; admit the compute subnet (service endpoint), any other subnets given (the private
    endpoints' subnet, for the studio), the listed subnets and client IPs, and trusted Azure services.

    For accounts of the platform's own lifecycle (the workspace storage)."""
    return storage.NetworkRuleSetArgs(
        default_action="Deny",
        bypass="AzureServices",
        virtual_network_rules=[
            storage.VirtualNetworkRuleArgs(virtual_network_resource_id=s, action="Allow")
            for s in (compute_subnet_id, *other_subnet_ids, *net.allowed_subnet_ids)
        ],
        ip_rules=[storage.IPRuleArgs(i_p_address_or_range=ip, action="Allow") for ip in net.allowed_client_ips],
    )


def closed_rules(
    allowed_client_ips: tuple[str, ...], allowed_subnet_ids: tuple[str, ...] = ()
) -> storage.NetworkRuleSetArgs:
    """Deny by default; admit only the listed subnets and client IPs (and trusted Azure services)."""
    return storage.NetworkRuleSetArgs(
        default_action="Deny",
        bypass="AzureServices",
        virtual_network_rules=[
            storage.VirtualNetworkRuleArgs(virtual_network_resource_id=s, action="Allow") for s in allowed_subnet_ids
        ],
        ip_rules=[storage.IPRuleArgs(i_p_address_or_range=ip, action="Allow") for ip in allowed_client_ips],
    )


def secure_account(
    name: str,
    account_name: pulumi.Input[str],
    resource_group,
    location: str,
    kind: str,
    sku: str,
    rules: storage.NetworkRuleSetArgs,
    tags: dict,
    opts: pulumi.ResourceOptions,
    **extra,
) -> storage.StorageAccount:
    return storage.StorageAccount(
        name,
        account_name=account_name,
        resource_group_name=resource_group,
        location=location,
        kind=kind,
        sku=storage.SkuArgs(name=sku),
        enable_https_traffic_only=True,
        minimum_tls_version="TLS1_2",
        allow_blob_public_access=False,
        allow_shared_key_access=False,
        default_to_o_auth_authentication=True,
        allow_cross_tenant_replication=False,
        network_rule_set=rules,
        tags=tags,
        opts=opts,
        **extra,
    )


# Jobs write their outputs to runs/<job>/<job name>/ in the logs container (jobs/*.yaml), checkpoints
# under checkpoints/ there. With versioning on, every checkpoint the payload overwrites or rotates out (it
# keeps the newest --keep-checkpoints) stays as a previous version: about 200 MB per ResNet-50 epoch, tens of
# GB for one 90-epoch run, kept forever. The rule below deletes previous versions under runs/ once they are
# older than this many days; current versions (the blobs a job resumes from and a user reads) are never
# touched. Previous versions are aged from the time that version was first written, not from when it was
# replaced (Azure "lifecycle management policy structure", action run conditions), and a deleted version
# is soft-deleted for the container's softDeleteDays first ("lifecycle management policies that delete
# blobs": soft delete applies), so an overwritten file can be brought back for this long plus that.
RUN_VERSION_DAYS = 7
RUNS_PREFIX = "runs/"


def run_versions_rule(logs_container: str) -> storage.ManagementPolicyRuleArgs:
    """Delete previous versions of the blobs under runs/ of the logs container after RUN_VERSION_DAYS.

    Why all of runs/ and not only its checkpoints/ folders: a prefixMatch must start with the container name
    and matches literally ("Prefix strings don't support wildcard matching": Azure "lifecycle management
    policy structure"), so runs/*/*/checkpoints/ cannot be written, and each job's run folder has a name
    only known at submission. Blob index tags could mark checkpoints, but the payloads write through Azure
    ML's rw_mount, which sets no tags; and moving checkpoints to a prefix of their own would split each run
    over two folders and break resuming, which reads OUTPUT/checkpoints. The rest of runs/ (metrics.json,
    TensorBoard events, rewritten as a run goes) has nothing in its previous versions worth more than the
    checkpoints' do: the current version of every blob stays."""
    return storage.ManagementPolicyRuleArgs(
        name="delete-old-run-versions",
        enabled=True,
        type="Lifecycle",
        definition=storage.ManagementPolicyDefinitionArgs(
            filters=storage.ManagementPolicyFilterArgs(
                blob_types=["blockBlob"], prefix_match=[f"{logs_container}/{RUNS_PREFIX}"]
            ),
            actions=storage.ManagementPolicyActionArgs(
                version=storage.ManagementPolicyVersionArgs(
                    delete=storage.DateAfterCreationArgs(days_after_creation_greater_than=RUN_VERSION_DAYS)
                )
            ),
        ),
    )


@dataclass(frozen=True)
class StorageArgs:
    """What the data stack's storage takes from its configuration (dataconfig.DataConfig)."""

    location: str
    prefix: str
    stack: str
    storage: Storage
    allowed_client_ips: tuple[str, ...]
    allowed_subnet_ids: tuple[str, ...]
    tags: dict

    @classmethod
    def of(cls, cfg) -> StorageArgs:
        return cls(
            cfg.location, cfg.prefix, cfg.stack, cfg.storage, cfg.allowed_client_ips, cfg.allowed_subnet_ids, cfg.tags
        )


class TrainingStorage(pulumi.ComponentResource):
    """The data stack's blob storage. Outputs: data_account, data_container, logs_account, logs_container.

    Every resource is protected: Pulumi refuses to delete it, by `destroy` or by a replacement (a changed
    name), until someone unprotects it on purpose (docs/deploying.md#deleting-the-data-for-good)."""

    def __init__(
        self,
        name: str,
        resource_group,
        args: StorageArgs,
        suffix: pulumi.Input[str],
        opts: pulumi.ResourceOptions | None = None,
    ):
        super().__init__("trainingplatform:storage:TrainingStorage", name, None, opts)
        keep = pulumi.ResourceOptions(parent=self, protect=True)
        rules = closed_rules(args.allowed_client_ips, args.allowed_subnet_ids)
        # Public network access on only to admit the listed client IPs and subnets (VNet rules act on the
        # public endpoint too); without any, it is off altogether.
        public = "Enabled" if args.allowed_client_ips or args.allowed_subnet_ids else "Disabled"
        self.data_account = secure_account(
            f"{name}-data",
            naming.storage_account(args.prefix, args.stack, "data", suffix),
            resource_group,
            args.location,
            "BlockBlobStorage",
            f"Premium_{args.storage.replication}",
            rules,
            args.tags,
            keep,
            public_network_access=public,
        )
        self.logs_account = secure_account(
            f"{name}-logs",
            naming.storage_account(args.prefix, args.stack, "logs", suffix),
            resource_group,
            args.location,
            "StorageV2",
            f"Standard_{args.storage.replication}",
            rules,
            args.tags,
            keep,
            access_tier="Hot",
            public_network_access=public,
        )
        self.data_container = self._container(
            f"{name}-data", self.data_account, resource_group, args.storage.data_container, args.storage
        )
        self.logs_container = self._container(
            f"{name}-logs",
            self.logs_account,
            resource_group,
            args.storage.logs_container,
            args.storage,
            versioning=True,
        )
        # An account has one management policy, named "default" (Microsoft.Storage managementPolicies).
        self.logs_lifecycle = storage.ManagementPolicy(
            f"{name}-logs-lifecycle",
            account_name=self.logs_account.name,
            resource_group_name=resource_group,
            management_policy_name="default",
            policy=storage.ManagementPolicySchemaArgs(rules=[run_versions_rule(args.storage.logs_container)]),
            opts=keep,
        )
        self.register_outputs({"data_account": self.data_account.name, "logs_account": self.logs_account.name})

    def _container(self, name, account, resource_group, container, cfg: Storage, versioning=False):
        keep = pulumi.ResourceOptions(parent=self, protect=True)
        retention = storage.DeleteRetentionPolicyArgs(enabled=True, days=cfg.soft_delete_days)
        storage.BlobServiceProperties(
            f"{name}-blob-service",
            account_name=account.name,
            resource_group_name=resource_group,
            blob_services_name="default",
            delete_retention_policy=retention,
            container_delete_retention_policy=retention,
            # Versioning is not offered on premium block blob accounts; the logs account keeps versions
            # of overwritten checkpoints and metrics.
            is_versioning_enabled=versioning or None,
            opts=keep,
        )
        return storage.BlobContainer(
            f"{name}-container",
            account_name=account.name,
            resource_group_name=resource_group,
            container_name=container,
            public_access="None",
            opts=keep,
        )
