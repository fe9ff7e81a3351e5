"""The whole platform for one stack: config -> components -> outputs (the contract with job submission)."""
from __future__ import annotations

import pulumi
import pulumi_random as random
from pulumi_azure_native import authorization, resources

from . import naming
from .access import AccessGrants, container_scope
from .compute import ComputeClusters, compute_identity, describe
from .config import PlatformConfig
from .network import PlatformNetwork
from .nfs import NfsShare
from .privatelink import PrivateDnsZones
from .registry import Registry
from .storage import TrainingStorage
from .workspace import Workspace


def build(cfg: PlatformConfig, ssh_public_key: pulumi.Input[str] | None = None) -> dict[str, pulumi.Input]:
    client = authorization.get_client_config_output()
    tags = cfg.tags
    stable = naming.stable_suffix(cfg.prefix, cfg.stack, cfg.location)
    # New each time the stack is created: soft-deleted vaults and workspaces keep their names for days.
    rand = random.RandomString("name-suffix", length=5, special=False, upper=False, numeric=True)

    group = resources.ResourceGroup("platform", resource_group_name=naming.dashed(cfg.prefix, cfg.stack, "rg"),
                                    location=cfg.location, tags=tags)
    # Durable data lives in its own group: deleting the platform group would take every resource in it,
    # retained or not.
    keep = cfg.storage.retain_on_delete or cfg.nfs.retain_on_delete
    data_group = resources.ResourceGroup("data", resource_group_name=naming.dashed(cfg.prefix, cfg.stack, "data-rg"),
                                         location=cfg.location, tags=tags,
                                         opts=pulumi.ResourceOptions(retain_on_delete=keep))

    net = PlatformNetwork("net", group.name, cfg.location, cfg.network, tags)
    # Every private endpoint registers in these zones (one per zone name, linked to the VNet).
    dns = PrivateDnsZones("dns", group.name, net.vnet.id, tags)
    store = TrainingStorage("storage", data_group.name, cfg.location, cfg.prefix, cfg.stack, stable, cfg.storage,
                            cfg.network, net.compute_subnet.id, tags)
    nfs = None
    if cfg.nfs.enabled:
        nfs = NfsShare("nfs", data_group.name, cfg.location, cfg.prefix, cfg.stack, stable, cfg.nfs, dns,
                       net.private_endpoint_subnet.id, tags)
    registry = Registry("registry", group.name, cfg.location, cfg.prefix, cfg.stack, stable,
                        cfg.registry_public_access, tags, net.private_endpoint_subnet.id, dns)
    ws = Workspace("ml", group.name, cfg.location, cfg, client.tenant_id, rand.result, stable, registry.registry.id,
                   net.compute_subnet.id, store, tags, net.private_endpoint_subnet.id, dns,
                   depends_on=registry.link.ready if registry.link else ())
    identity = compute_identity("compute", group.name, cfg.location, tags)

    job_identity = identity.principal_id
    workspace_identity = ws.workspace.identity.apply(lambda i: i.principal_id)
    data_scope = container_scope(store.data_account, store.data_container)
    logs_scope = container_scope(store.logs_account, store.logs_container)
    grants = AccessGrants("access", client.subscription_id, [
        ("compute-reads-data", "Storage Blob Data Reader", job_identity, data_scope),
        ("compute-writes-logs", "Storage Blob Data Contributor", job_identity, logs_scope),
        ("compute-pulls-images", "AcrPull", job_identity, registry.registry.id),
        # Jobs upload code snapshots to and read them from the workspace's own storage.
        ("compute-workspace-storage", "Storage Blob Data Contributor", job_identity, ws.storage.id),
        # The workspace identity browses the datastores in the studio.
        ("workspace-reads-data", "Storage Blob Data Reader", workspace_identity, data_scope),
        ("workspace-reads-logs", "Storage Blob Data Reader", workspace_identity, logs_scope),
    ])
    # Clusters come last: no-public-IP nodes need the workspace endpoint, and the first job's image pull the grant.
    compute = ComputeClusters("compute", group.name, cfg.location, ws.workspace.name, net.compute_subnet.id,
                              cfg.clusters, tags, identity, ssh_public_key,
                              depends_on=[*ws.endpoint.ready, grants.by_label["compute-pulls-images"]])

    return {
        "subscription_id": client.subscription_id,
        "tenant_id": client.tenant_id,
        "location": cfg.location,
        "resource_group": group.name,
        "data_resource_group": data_group.name,
        "workspace_name": ws.workspace.name,
        "registry_login_server": registry.login_server,
        "compute_identity_client_id": compute.identity.client_id,
        "compute_identity_id": compute.identity.id,
        "clusters": {c.name: describe(c) for c in cfg.clusters},
        "datastores": {
            "data": {"name": ws.datastores["data"].name, "account": store.data_account.name,
                     "container": store.data_container.name},
            "logs": {"name": ws.datastores["logs"].name, "account": store.logs_account.name,
                     "container": store.logs_container.name},
        },
        "nfs": ({"mount_target": nfs.mount_target, "account": nfs.account.name, "share": nfs.share.name,
                 "mount_options": "vers=4,minorversion=1,sec=sys,nconnect=4"} if nfs else None),
        "nat_public_ip": net.nat_ip.ip_address,
    }
