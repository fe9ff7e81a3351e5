"""Azure ML workspace with its Key Vault, workspace-based Application Insights, its own storage,
and identity-based datastores for the training data and logs containers.

The workspace always has a private endpoint (group `amlworkspace`, zones `privatelink.api.azureml.ms` and
`privatelink.notebooks.azure.net`): clusters without node public IPs reach the workspace only through it,
and Azure ML refuses to create them otherwise ("Provided EnableNodePublicIp 'False' requires workspace
private endpoint"; https://learn.microsoft.com/azure/machine-learning/how-to-secure-training-vnet, "Compute
instance/cluster or serverless compute with no public IP": "You must use a workspace private endpoint").
`workspacePublicAccess` only decides whether the workspace is also reachable from the internet.

Private settings bring their endpoints: `keyVaultPublicAccess: false` gives the vault one (`vault`), and a
private workspace keeps its own storage private too (`blob` and `file` endpoints), as Microsoft's secure
templates (machine-learning-end-to-end-secure, 201-machine-learning-moderately-secure) do.

A workspace's storage account and Key Vault are fixed at creation: Azure ML answers a change with "Storage
Account update is not supported yet" (and likewise for the vault), in the middle of an `up` whose earlier
steps already replaced the account. So the workspace is declared to be replaced when either changes
(`replace_on_changes`), and its name hashes their names (naming.workspace_name): the replacement is a new
workspace under a new name, created before the old one is deleted (the old name stays held while
soft-deleted), instead of a failing update.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pulumi
from pulumi_azure_native import applicationinsights, keyvault, monitor, operationalinsights
from pulumi_azure_native import machinelearningservices as ml

from . import naming
from .clusterconfig import Cluster
from .compute import compute_name
from .config import Network
from .privatelink import PrivateDnsZones, PrivateLink
from .storage import network_rules, secure_account

# The workspace inputs Azure ML cannot update (see the module docstring).
REPLACE_ON_CHANGES = ("storageAccount", "keyVault")

# The cost ledger's status log (launcher/cost, `--status-log`): every status change of every run, which it reads
# from the table of this name. Microsoft's "Supported logs for Microsoft.MachineLearningServices/workspaces" (the
# resource logs of "Azure Machine Learning monitoring data reference") lists the category `AmlRunStatusChangedEvent`,
# display name AmlRunStatusChangedEvent, log table AmlRunStatusChangedEvent: "Azure Machine Learning services run
# status event logs" (learn.microsoft.com/azure/azure-monitor/reference/tables/amlrunstatuschangedevent; columns
# RunId "The unique run identifier", Status "The updated run status", TimeGenerated).
STATUS_LOG_CATEGORY = "AmlRunStatusChangedEvent"
# Resource-specific mode: "Data is written to individual tables for each category of the resource", where "Azure
# diagnostics: All data is written to the AzureDiagnostics table" (learn.microsoft.com/azure/azure-monitor/essentials/
# resource-logs, "Collection mode"). Diagnostic Settings - Create Or Update: logAnalyticsDestinationType "Dedicated",
# "a destination type constructed as follows: <normalized service identity>_<normalized category name>", instead of
# null, "the default destination type, i.e. AzureDiagnostics". The ledger queries the table AmlRunStatusChangedEvent.
STATUS_LOG_DESTINATION_TYPE = "Dedicated"


@dataclass(frozen=True)
class WorkspaceArgs:
    """What the workspace and its dependencies (Key Vault, storage) take from the stack's configuration."""

    prefix: str
    stack: str
    public_access: bool  # workspacePublicAccess
    key_vault_public_access: bool
    network: Network  # its allowed client IPs and subnets, for the storage and Key Vault firewalls
    image_build_cluster: Cluster | None  # imageBuildCluster, a declared CPU cluster (config.py checks)

    @classmethod
    def of(cls, cfg) -> WorkspaceArgs:
        build = next((c for c in cfg.clusters if c.name == cfg.image_build_cluster), None)
        return cls(cfg.prefix, cfg.stack, cfg.workspace_public_access, cfg.key_vault_public_access, cfg.network, build)


def image_build_compute(build: Cluster | None, compute_subnet_id, workspace_name) -> pulumi.Input[str] | None:
    """The Azure ML name of the `imageBuildCluster`, made by the same function that names the cluster itself
    (compute.compute_name), in this workspace."""
    return None if build is None else compute_name(build, compute_subnet_id, workspace_name)


class Workspace(pulumi.ComponentResource):
    """Outputs: workspace_name, datastores {data, logs}; `logs` is the Log Analytics workspace (Application Insights'
    and the status log's), `status_log` the diagnostic setting that sends run status changes to it."""

    def __init__(
        self,
        name: str,
        *,
        resource_group,
        location: str,
        args: WorkspaceArgs,
        tenant_id,
        random_suffix,
        stable_suffix: str,
        registry_id,
        compute_subnet_id,
        data_storage,
        tags: dict,
        endpoint_subnet_id,
        dns: PrivateDnsZones,
        depends_on: Sequence[pulumi.Resource] = (),
        opts: pulumi.ResourceOptions | None = None,
    ):
        """depends_on: private endpoints of the workspace's dependencies declared elsewhere (the registry's)."""
        super().__init__("trainingplatform:workspace:Workspace", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        ready: list[pulumi.Resource] = list(depends_on)  # dependency endpoints the workspace waits for

        def link(label: str, target_id, group_id: str) -> PrivateLink:
            return PrivateLink(
                f"{name}-{label}-link",
                resource_group=resource_group,
                location=location,
                target_id=target_id,
                group_id=group_id,
                subnet_id=endpoint_subnet_id,
                dns=dns,
                tags=tags,
                opts=child,
            )

        self.vault = keyvault.Vault(
            f"{name}-kv",
            vault_name=naming.vault_name(args.prefix, args.stack, random_suffix),
            resource_group_name=resource_group,
            location=location,
            properties=keyvault.VaultPropertiesArgs(
                tenant_id=tenant_id,
                sku=keyvault.SkuArgs(family="A", name="standard"),
                enable_rbac_authorization=True,
                enable_soft_delete=True,
                soft_delete_retention_in_days=7,
                enable_purge_protection=True,
                public_network_access="Enabled" if args.key_vault_public_access else "Disabled",
                network_acls=keyvault.NetworkRuleSetArgs(
                    default_action="Deny",
                    bypass="AzureServices",
                    # The compute subnet has the Microsoft.KeyVault service endpoint (network.py), which Azure
                    # checks. allowedSubnetIds are the user's subnets, listed for the storage firewall (which needs
                    # their Microsoft.Storage endpoint); Azure refuses a vault rule for a subnet without the
                    # Microsoft.KeyVault endpoint (SubnetsHaveNoServiceEndpointsConfigured: "Add Microsoft.KeyVault
                    # to subnet's ServiceEndpoints collection before trying to ACL Microsoft.KeyVault resources to
                    # these subnets"), in the middle of `up`. ignoreMissingVnetServiceEndpoint ("whether NRP will
                    # ignore the check if parent subnet has serviceEndpoints configured") lets the vault take the
                    # rule: it admits the subnet once it has that endpoint, and nothing before (its traffic then
                    # arrives from a public address, which only ipRules could admit).
                    virtual_network_rules=[keyvault.VirtualNetworkRuleArgs(id=compute_subnet_id)]
                    + [
                        keyvault.VirtualNetworkRuleArgs(id=s, ignore_missing_vnet_service_endpoint=True)
                        for s in args.network.allowed_subnet_ids
                    ],
                    ip_rules=[keyvault.IPRuleArgs(value=ip) for ip in args.network.allowed_client_ips],
                ),
            ),
            tags=tags,
            opts=child,
        )
        self.links: dict[str, PrivateLink] = {}
        if not args.key_vault_public_access:
            self.links["vault"] = link("kv", self.vault.id, "vault")
        self.logs = operationalinsights.Workspace(
            f"{name}-log-analytics",
            resource_group_name=resource_group,
            location=location,
            sku=operationalinsights.WorkspaceSkuArgs(name="PerGB2018"),
            retention_in_days=30,
            tags=tags,
            opts=child,
        )
        self.insights = applicationinsights.Component(
            f"{name}-insights",
            resource_group_name=resource_group,
            location=location,
            kind="web",
            application_type="web",
            ingestion_mode="LogAnalytics",
            workspace_resource_id=self.logs.id,
            tags=tags,
            opts=child,
        )
        self.storage = secure_account(
            f"{name}-storage",
            naming.storage_account(args.prefix, args.stack, "mlws", stable_suffix),
            resource_group,
            location,
            "StorageV2",
            "Standard_LRS",
            network_rules(args.network, compute_subnet_id, endpoint_subnet_id),
            tags,
            child,
            public_network_access="Enabled" if args.public_access else "Disabled",
        )
        if not args.public_access:
            # Azure ML reaches its storage's blob (snapshots, outputs) and file (code share) endpoints.
            self.links["storage-blob"] = link("storage-blob", self.storage.id, "blob")
            self.links["storage-file"] = link("storage-file", self.storage.id, "file")
        for endpoint in self.links.values():
            ready.extend(endpoint.ready)
        workspace_name = naming.workspace_name(
            args.prefix, args.stack, random_suffix, self.storage.name, self.vault.name
        )
        self.workspace = ml.Workspace(
            f"{name}-workspace",
            workspace_name=workspace_name,
            resource_group_name=resource_group,
            location=location,
            kind="Default",
            identity=ml.ManagedServiceIdentityArgs(type="SystemAssigned"),
            sku=ml.SkuArgs(name="Basic", tier="Basic"),
            key_vault=self.vault.id,
            application_insights=self.insights.id,
            storage_account=self.storage.id,
            container_registry=registry_id,
            # The build cluster's Azure ML name (`cpu-smoke-<hash>`), not its config name: Azure ML builds
            # environments on the compute of exactly this name, and there is none called `cpu-smoke`.
            image_build_compute=image_build_compute(args.image_build_cluster, compute_subnet_id, workspace_name),
            public_network_access="Enabled" if args.public_access else "Disabled",
            system_datastores_auth_mode="identity",  # the workspace storage has shared keys off
            v1_legacy_mode=False,
            hbi_workspace=False,
            tags=tags,
            opts=pulumi.ResourceOptions(parent=self, depends_on=ready, replace_on_changes=list(REPLACE_ON_CHANGES)),
        )
        # Always: no-public-IP clusters need it (module docstring). Clusters depend on `self.endpoint.ready`.
        self.endpoint = link("workspace", self.workspace.id, "amlworkspace")
        # Every run status change, to this stack's Log Analytics workspace (kept for its retention_in_days): the cost
        # ledger's status log, read with Log Analytics Reader (access.py grants it to `users`). Only that category:
        # the others (compute, data, model events) would be ingested and billed for nothing here reads them.
        self.status_log = monitor.DiagnosticSetting(
            f"{name}-status-log",
            name="run-status-to-log-analytics",
            resource_uri=self.workspace.id,
            workspace_id=self.logs.id,
            log_analytics_destination_type=STATUS_LOG_DESTINATION_TYPE,
            logs=[monitor.DiagnosticsLogSettingsArgs(category=STATUS_LOG_CATEGORY, enabled=True)],
            opts=child,
        )
        self.datastores = {
            "data": self._datastore(
                "training_data",
                "Training data (premium blob), read by jobs",
                data_storage.data_account,
                data_storage.data_container,
                resource_group,
            ),
            "logs": self._datastore(
                "training_logs",
                "Checkpoints, TensorBoard logs, metrics and models",
                data_storage.logs_account,
                data_storage.logs_container,
                resource_group,
            ),
        }
        self.register_outputs({"workspace_name": self.workspace.name})

    def _datastore(self, datastore_name, description, account, container, resource_group) -> ml.Datastore:
        # Identity-based ("None" credentials): each job reads/writes with its compute identity's roles.
        return ml.Datastore(
            f"datastore-{datastore_name}",
            name=datastore_name,
            resource_group_name=resource_group,
            workspace_name=self.workspace.name,
            properties=ml.AzureBlobDatastoreArgs(
                datastore_type="AzureBlob",
                account_name=account.name,
                container_name=container.name,
                credentials=ml.NoneDatastoreCredentialsArgs(credentials_type="None"),
                description=description,
                service_data_access_auth_identity="WorkspaceSystemAssignedIdentity",
                protocol="https",
                endpoint="core.windows.net",
            ),
            # Azure ML validates a new datastore by reaching the account from its service, which the data
            # accounts' firewalls never admit (public access off; reached through private endpoints only): the
            # `up` would fail. Datastores - Create Or Update takes `skipValidation`
            # (learn.microsoft.com/rest/api/azureml/datastores/create-or-update); whether the datastore works is
            # checked after deployment from inside the VNet.
            skip_validation=True,
            opts=pulumi.ResourceOptions(parent=self),
        )
