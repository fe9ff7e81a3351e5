"""Azure ML workspace with its Key Vault, workspace-based Application Insights, its own storage,
and identity-based datastores for the training data and logs containers."""
from __future__ import annotations

import pulumi
from pulumi_azure_native import applicationinsights, keyvault, machinelearningservices as ml, operationalinsights

from . import naming
from .storage import network_rules, secure_account


class Workspace(pulumi.ComponentResource):
    """Outputs: workspace_name, datastores {data, logs}."""

    def __init__(self, name: str, resource_group, location: str, cfg, tenant_id, random_suffix, stable_suffix: str,
                 registry_id, compute_subnet_id, data_storage, tags: dict, opts: pulumi.ResourceOptions | None = None):
        super().__init__("trainingplatform:workspace:Workspace", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        base = naming.dashed(cfg.prefix, cfg.stack, "")
        self.vault = keyvault.Vault(
            f"{name}-kv", vault_name=pulumi.Output.concat(base, "kv-", random_suffix),
            resource_group_name=resource_group, location=location,
            properties=keyvault.VaultPropertiesArgs(
                tenant_id=tenant_id, sku=keyvault.SkuArgs(family="A", name="standard"),
                enable_rbac_authorization=True, enable_soft_delete=True, soft_delete_retention_in_days=7,
                enable_purge_protection=True, public_network_access="Enabled",
                network_acls=keyvault.NetworkRuleSetArgs(
                    default_action="Deny", bypass="AzureServices",
                    virtual_network_rules=[keyvault.VirtualNetworkRuleArgs(id=compute_subnet_id)],
                    ip_rules=[keyvault.IPRuleArgs(value=ip) for ip in cfg.network.allowed_client_ips])),
            tags=tags, opts=child)
        self.logs = operationalinsights.Workspace(
            f"{name}-log-analytics", resource_group_name=resource_group, location=location,
            sku=operationalinsights.WorkspaceSkuArgs(name="PerGB2018"), retention_in_days=30, tags=tags, opts=child)
        self.insights = applicationinsights.Component(
            f"{name}-insights", resource_group_name=resource_group, location=location, kind="web",
            application_type="web", ingestion_mode="LogAnalytics", workspace_resource_id=self.logs.id, tags=tags,
            opts=child)
        self.storage = secure_account(
            f"{name}-storage", naming.storage_account(cfg.prefix, cfg.stack, "mlws", stable_suffix), resource_group,
            location, "StorageV2", "Standard_LRS", network_rules(cfg.network, compute_subnet_id), tags, child)
        self.workspace = ml.Workspace(
            f"{name}-workspace", workspace_name=pulumi.Output.concat(base, "mlw-", random_suffix),
            resource_group_name=resource_group, location=location, kind="Default",
            identity=ml.ManagedServiceIdentityArgs(type="SystemAssigned"),
            sku=ml.SkuArgs(name="Basic", tier="Basic"),
            key_vault=self.vault.id, application_insights=self.insights.id, storage_account=self.storage.id,
            container_registry=registry_id, image_build_compute=cfg.image_build_cluster,
            public_network_access="Enabled" if cfg.workspace_public_access else "Disabled",
            system_datastores_auth_mode="identity",   # the workspace storage has shared keys off
            v1_legacy_mode=False, hbi_workspace=False, tags=tags, opts=child)
        self.datastores = {
            "data": self._datastore("training_data", "Training data (premium blob), read by jobs",
                                    data_storage.data_account, data_storage.data_container, resource_group),
            "logs": self._datastore("training_logs", "Checkpoints, TensorBoard logs, metrics and models",
                                    data_storage.logs_account, data_storage.logs_container, resource_group),
        }
        self.register_outputs({"workspace_name": self.workspace.name})

    def _datastore(self, datastore_name, description, account, container, resource_group) -> ml.Datastore:
        # Identity-based ("None" credentials): each job reads/writes with its compute identity's roles.
        return ml.Datastore(
            f"datastore-{datastore_name}", name=datastore_name, resource_group_name=resource_group,
            workspace_name=self.workspace.name,
            properties=ml.AzureBlobDatastoreArgs(
                datastore_type="AzureBlob", account_name=account.name, container_name=container.name,
                credentials=ml.NoneDatastoreCredentialsArgs(credentials_type="None"), description=description,
                service_data_access_auth_identity="WorkspaceSystemAssignedIdentity", protocol="https",
                endpoint="core.windows.net"),
            opts=pulumi.ResourceOptions(parent=self))
