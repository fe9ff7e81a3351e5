"""The platform for one stack: config -> components -> outputs (the contract with job submission).

The durable data (accounts, containers, NFS share) belongs to the data stack (datastack.py), read here
through a StackReference; everything this program declares is of the platform's lifecycle, so
`pulumi destroy` and a later `pulumi up` of this stack never meet a resource that outlived it.
"""

from __future__ import annotations

import pulumi
import pulumi_random as random
from pulumi_azure_native import authorization, resources

from . import naming, private
from .access import AccessGrants, QuotaReaders, deployer_users, image_builder_problems, platform_grants
from .compute import ComputeClusters, compute_identity, describe
from .config import PROJECT, ConfigError, PlatformConfig
from .datastack import DataStackReference, default_reference
from .network import PlatformNetwork
from .privatelink import PrivateDnsZones, PrivateLink
from .registry import Registry, RegistryArgs
from .workspace import Workspace, WorkspaceArgs


def build(
    cfg: PlatformConfig,
    ssh_public_key: pulumi.Input[str] | None = None,
    jump_host_ssh_public_key: pulumi.Input[str] | None = None,
) -> dict[str, pulumi.Input]:
    """ssh_public_key: the `sshPublicKey` secret, for clusters with sshEnabled; jump_host_ssh_public_key: the
    `jumpHostSshPublicKey` secret, for the jump host alone (each key's change touches only its own resources)."""
    users = deployer_users(cfg.users, PROJECT)  # before anything is declared: it may refuse
    problems = image_builder_problems(cfg, users)
    problems += private.jump_host_problems(cfg, jump_host_ssh_public_key, users)
    if problems:
        raise ConfigError(problems)  # before anything is declared, like every other setting
    for warning in cfg.warnings:
        pulumi.log.warn(warning)
    client = authorization.get_client_config_output()
    tags = cfg.tags
    # Global names (workspace storage, registry): unique per subscription, stable per stack.
    suffix = naming.global_suffix(cfg.subscription_id, cfg.prefix, cfg.stack, cfg.location)
    # New each time the stack is created: soft-deleted vaults and workspaces keep their names for days.
    rand = random.RandomString("name-suffix", length=5, special=False, upper=False, numeric=True)
    data = DataStackReference(
        cfg.data_stack or default_reference(pulumi.get_organization(), cfg.stack), cfg.location, cfg.mount_nfs
    )

    group = resources.ResourceGroup(
        "platform", resource_group_name=naming.dashed(cfg.prefix, cfg.stack, "rg"), location=cfg.location, tags=tags
    )
    egress = private.egress_policy(cfg, client.subscription_id, group.name, suffix, data)
    central = cfg.access.private_dns_zones if cfg.access else ()
    net = PlatformNetwork(
        "net",
        group.name,
        cfg.location,
        cfg.network,
        tags,
        service_endpoint_policies=[egress.policy.id] if egress else (),
        dns_servers=cfg.access.dns_servers if central else (),
    )
    # Every private endpoint registers in these zones: the stack's own (one per zone name, linked to the VNet), or
    # in hub mode with access.privateDnsZoneIds the hub's existing ones (none created, none linked; privatelink.py).
    dns = PrivateDnsZones("dns", group.name, net.vnet.id, tags, existing=dict(central) or None)
    endpoints = net.private_endpoint_subnet.id

    # The data accounts admit no VNet (their rules must not name a VNet that dies with this stack): compute
    # reaches them through endpoints created, and deleted, with each life of this stack.
    def link(name: str, target_id, group_id: str) -> PrivateLink:
        return PrivateLink(
            name,
            resource_group=group.name,
            location=cfg.location,
            target_id=target_id,
            group_id=group_id,
            subnet_id=endpoints,
            dns=dns,
            tags=tags,
        )

    links = []
    # In the hub's zones the data accounts' records belong to one platform of the data stack (wayinconfig.py,
    # DATA_ENDPOINT_RECORDS); the others reach the data through that platform's endpoints.
    if cfg.access is None or cfg.access.data_endpoint_records != "another-platform":
        links = [link("data-blob", data.data_account.id, "blob"), link("logs-blob", data.logs_account.id, "blob")]
        if data.nfs is not None:
            links.append(link("nfs", data.nfs.apply(lambda n: n["account_id"]), "file"))

    registry = Registry(
        "registry",
        resource_group=group.name,
        args=RegistryArgs.of(cfg),
        suffix=suffix,
        endpoint_subnet_id=endpoints,
        dns=dns,
    )
    ws = Workspace(
        "ml",
        resource_group=group.name,
        location=cfg.location,
        args=WorkspaceArgs.of(cfg),
        tenant_id=client.tenant_id,
        random_suffix=rand.result,
        stable_suffix=suffix,
        registry_id=registry.registry.id,
        compute_subnet_id=net.compute_subnet.id,
        data_storage=data,
        tags=tags,
        endpoint_subnet_id=endpoints,
        dns=dns,
        depends_on=registry.link.ready if registry.link else (),
    )
    identity = compute_identity("compute", group.name, cfg.location, tags)
    way_in = private.way_in(cfg, group.name, net, dns, tags, jump_host_ssh_public_key)  # after every private endpoint
    # Who may do what, at the narrowest scope (access.py).
    grants = platform_grants(cfg, users, identity.principal_id, ws, registry, data, way_in, links)
    access = AccessGrants("access", cfg.subscription_id, cfg.stack, grants)
    # The users' read of Azure ML's quota at the subscription, for the submission's quota check (access.py).
    quota = QuotaReaders("quota", cfg.subscription_id, cfg.prefix, cfg.stack, users) if cfg.quota_reader_role else None
    # Clusters come last: no-public-IP nodes need the workspace endpoint, and the first job's image pull the grant.
    compute = ComputeClusters(
        "compute",
        resource_group=group.name,
        location=cfg.location,
        workspace_name=ws.workspace.name,
        subnet_id=net.compute_subnet.id,
        clusters=cfg.clusters,
        tags=tags,
        identity=identity,
        ssh_public_key=ssh_public_key,
        depends_on=[*ws.endpoint.ready, access.assignments["compute-pulls-images"]],
    )

    nfs = None
    if data.nfs is not None:
        nfs = data.nfs.apply(
            lambda n: {
                "mount_target": n["mount_target"],
                "account": n["account_name"],
                "share": n["share"],
                "mount_options": n["mount_options"],
            }
        )
    return {
        "subscription_id": client.subscription_id,
        "tenant_id": client.tenant_id,
        "location": cfg.location,
        "resource_group": group.name,
        "data_resource_group": data.resource_group,
        "data_stack": data.reference,
        "workspace_name": ws.workspace.name,
        "registry_login_server": registry.login_server,
        "compute_identity_client_id": compute.identity.client_id,
        "compute_identity_id": compute.identity.id,
        "clusters": {c.name: describe(c, compute.clusters[c.name].name) for c in cfg.clusters},
        "datastores": {
            "data": {
                "name": ws.datastores["data"].name,
                "account": data.data_account.name,
                "container": data.data_container.name,
            },
            "logs": {
                "name": ws.datastores["logs"].name,
                "account": data.logs_account.name,
                "container": data.logs_container.name,
            },
        },
        "nfs": nfs,
        "nat_public_ip": net.nat_ip.ip_address,
        "way_in": way_in.describe() if way_in else {"mode": "none"},
        "quota_reader_role": quota.role_name if quota else None,
        # The Log Analytics workspace that receives the run status log: its customerId, the workspace id the query
        # API takes (POST /v1/workspaces/{workspaceId}/query: "This is Workspace ID from the Properties blade in the
        # Azure portal"), not its ARM id. `python -m launcher cost` reads it when --status-log is not given.
        "status_log_workspace_id": ws.logs.customer_id,
    }
