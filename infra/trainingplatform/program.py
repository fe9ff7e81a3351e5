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
from .access import AccessGrants, Grant, QuotaReaders, container_scope, deployer_users
from .compute import ComputeClusters, compute_identity, describe
from .config import PROJECT, ConfigError, PlatformConfig
from .datastack import DataStackReference, default_reference
from .network import PlatformNetwork
from .privatelink import PrivateDnsZones, PrivateLink
from .registry import Registry
from .workspace import Workspace, WorkspaceArgs


def build(
    cfg: PlatformConfig,
    ssh_public_key: pulumi.Input[str] | None = None,
    jump_host_ssh_public_key: pulumi.Input[str] | None = None,
) -> dict[str, pulumi.Input]:
    """ssh_public_key: the `sshPublicKey` secret, for clusters with sshEnabled; jump_host_ssh_public_key: the
    `jumpHostSshPublicKey` secret, for the jump host alone (each key's change touches only its own resources)."""
    users = deployer_users(cfg.users, PROJECT)  # before anything is declared: it may refuse
    problems = private.jump_host_problems(cfg, jump_host_ssh_public_key, users)
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
        location=cfg.location,
        prefix=cfg.prefix,
        stack=cfg.stack,
        suffix=suffix,
        public_access=cfg.registry_public_access,
        tags=tags,
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

    job_identity = identity.principal_id
    workspace_identity = ws.workspace.identity.apply(lambda i: i.principal_id)
    data_scope = container_scope(data.data_account.id, data.data_container.name)
    logs_scope = container_scope(data.logs_account.id, data.logs_container.name)
    grants = [
        Grant("compute-reads-data", "Storage Blob Data Reader", job_identity, data_scope),
        Grant("compute-writes-logs", "Storage Blob Data Contributor", job_identity, logs_scope),
        Grant("compute-pulls-images", "AcrPull", job_identity, registry.registry.id),
        # Jobs upload code snapshots to and read them from the workspace's own storage.
        Grant("compute-workspace-storage", "Storage Blob Data Contributor", job_identity, ws.storage.id),
        # The workspace identity browses the datastores in the studio.
        Grant("workspace-reads-data", "Storage Blob Data Reader", workspace_identity, data_scope),
        Grant("workspace-reads-logs", "Storage Blob Data Reader", workspace_identity, logs_scope),
    ]
    # Users' roles on this stack's own resources only. Their access to the data and logs containers is the
    # data stack's grant (its `users`): two platforms on one data stack would otherwise both claim the same
    # (scope, principal, role), which Azure holds once (access.py).
    for u in users:
        label = f"user-{u.object_id}"  # from the object id alone: listing the deployer keeps the same resources
        grants += [
            # Submitting a job uploads its code snapshot to the workspace storage with the user's token
            # (blob), and the studio's file views need the file share (how-to-disable-local-auth-storage).
            Grant(f"{label}-workspace-blob", "Storage Blob Data Contributor", u.object_id, ws.storage.id, u.type),
            Grant(
                f"{label}-workspace-files",
                "Storage File Data Privileged Contributor",
                u.object_id,
                ws.storage.id,
                u.type,
            ),
            Grant(f"{label}-submits-jobs", "AzureML Data Scientist", u.object_id, ws.workspace.id, u.type),
            # The cost ledger's status log: AmlRunStatusChangedEvent, which the workspace's diagnostic setting sends
            # to the stack's Log Analytics workspace (workspace.py). Querying it, on that workspace alone.
            Grant(f"{label}-reads-status-log", "Log Analytics Reader", u.object_id, ws.logs.id, u.type),
        ]
        # Reading the registry's tags (the doctor's image check) and pulling a job's image to reproduce it: AcrPull,
        # and no more. Pushing is the builders' (below): a user who could push could overwrite the image every job
        # runs (learn.microsoft.com/azure/container-registry/container-registry-roles: AcrPush "Push artifacts to
        # or pull artifacts from a registry"; AcrPull "Pull artifacts from a registry").
        grants.append(Grant(f"{label}-pulls-images", "AcrPull", u.object_id, registry.registry.id, u.type))
    # Who builds and pushes the images (config imageBuilders). Absent with a private registry: the users, since
    # images are pushed from inside the VNet and every job pulls one; absent with a public one: nobody by this grant.
    builders = cfg.image_builders
    if builders is None and not cfg.registry_public_access:
        builders = users
    for b in builders or ():
        grants.append(
            Grant(f"builder-{b.object_id}-pushes-images", "AcrPush", b.object_id, registry.registry.id, b.type)
        )
        if cfg.registry_public_access:
            # `az acr build` (docs/images.md, the public profile's build) queues an ACR Tasks run, which AcrPush
            # does not allow: Container Registry Tasks Contributor (registries/scheduleRun/action and the runs'
            # logs). A private registry has no Tasks path (shared agents cannot reach it): docker push from the
            # jump host, AcrPush alone.
            grants.append(
                Grant(
                    f"builder-{b.object_id}-runs-builds",
                    "Container Registry Tasks Contributor",
                    b.object_id,
                    registry.registry.id,
                    b.type,
                )
            )
    # The studio reads the datastores' accounts and the workspace storage (not the NFS share: no datastore).
    studio_links = [*links[:2], *(link for k, link in ws.links.items() if k.startswith("storage"))]
    grants += private.grants(
        cfg,
        [(f"user-{u.object_id}", u.object_id, u.type) for u in users],
        workspace_identity,
        registry,
        way_in,
        studio_links,
    )
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
