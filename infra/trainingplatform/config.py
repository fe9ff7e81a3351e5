"""Typed, validated stack configuration: the one place that reads `Pulumi.<stack>.yaml`.

`load()` takes the project's config as a plain dict (camelCase keys, as in the YAML) and either returns a
PlatformConfig or raises ConfigError listing every problem, each naming the key, the bad value and what
is allowed. It runs before any resource is declared.
"""

from __future__ import annotations

import datetime as dt
import difflib
import ipaddress
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .clusterconfig import Cluster
    from .wayinconfig import AccessConfig

PROJECT = "azure-horovod-training"


class ConfigError(ValueError):
    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("invalid stack configuration:\n  - " + "\n  - ".join(problems))


@dataclass(frozen=True, kw_only=True)
class Network:
    vnet_cidr: str
    compute_subnet_cidr: str
    private_endpoint_subnet_cidr: str
    allowed_client_ips: tuple[str, ...]
    # True: outbound only to the service tags Azure ML documents (plus the VNet), the internet denied.
    # False: the NSG filters inbound only; outbound goes anywhere through the NAT gateway.
    restrict_outbound: bool = False
    # Subnets (full resource ids) admitted by the workspace storage and Key Vault firewalls: the way in for
    # machines in the same Azure region, which IP rules do not admit (see read_client_ips).
    allowed_subnet_ids: tuple[str, ...] = ()


@dataclass(frozen=True, kw_only=True)
class Principal:
    """An Entra user, group or service principal that uses the platform (config `users`)."""

    object_id: str
    type: str  # User | Group | ServicePrincipal (Azure's principalType)


@dataclass(frozen=True, kw_only=True)
class PlatformConfig:
    stack: str
    # azure-native:subscriptionId: required, because the globally unique names hash it (naming.py): a
    # stack that followed whatever subscription `az account show` prints would plan replacing every
    # globally named resource the day another subscription is the default.
    subscription_id: str
    prefix: str
    location: str
    network: Network
    clusters: tuple[Cluster, ...]
    workspace_public_access: bool
    registry_public_access: bool
    image_build_cluster: str | None
    max_total_gpus: int
    max_total_nodes: int
    tags: dict[str, str]
    key_vault_public_access: bool = True
    # The data stack (storage, NFS) this platform attaches to, "<org>/<project>/<stack>"; None: the data
    # project's stack of the same name in the same organization (see datastack.py).
    data_stack: str | None = None
    # Who gets the user roles (access.py); None: the principal that runs `pulumi up`.
    users: tuple[Principal, ...] | None = None
    # Reach the data stack's NFS share from this platform's VNet (a private endpoint per platform life).
    mount_nfs: bool = True
    # How people reach a private platform from outside its VNet (config `access`; wayin.py).
    access: AccessConfig | None = None
    # Who may push images (AcrPush; config `imageBuilders`). None: with a private registry, the users (they build
    # the images from inside the VNet, and nobody else could); with a public one, nobody by this grant (the deployer
    # pushes as Owner). Every other user gets AcrPull only (program.py).
    image_builders: tuple[Principal, ...] | None = None
    # A custom role that reads Azure ML's quota at the subscription (usages, VM sizes, quotas), given to `users`, so
    # that the submission's quota check works for them (config `quotaReaderRole`; access.QuotaReaders). The deployer
    # then needs Microsoft.Authorization/roleDefinitions/write on the subscription (Owner, User Access Administrator).
    quota_reader_role: bool = True
    # Settings that are valid but probably not what the user wants; the program logs them (pulumi.log.warn).
    warnings: tuple[str, ...] = ()

    @property
    def total_max_gpus(self) -> int:
        return sum(c.max_nodes * c.size.gpus for c in self.clusters)


_LOCATION = re.compile(r"^[a-z]+[a-z0-9]*$")
PREFIX_NAME = re.compile(r"^[a-z][a-z0-9]{1,7}$")
CONTAINER_NAME = re.compile(r"^[a-z0-9](?!.*--)[a-z0-9-]{1,61}[a-z0-9]$")
SHARE_NAME = CONTAINER_NAME
_GUID = re.compile(r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$")
_STACK_REF = re.compile(r"^[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+$")
# A subnet's ARM id. Resource group: 1-90 letters, digits, _ - . ( ) not ending in a period; VNet 2-64 and
# subnet 1-80 letters, digits, _ - . (resource-name-rules, Microsoft.Network).
_SUBNET_ID = re.compile(
    r"^/subscriptions/[0-9a-fA-F-]{36}/resourceGroups/[-\w.()]{0,89}[-\w()]"
    r"/providers/Microsoft\.Network/virtualNetworks/[-\w.]{2,64}/subnets/[-\w.]{1,80}$",
    re.IGNORECASE,
)
PRINCIPAL_TYPES = ("User", "Group", "ServicePrincipal")
# Docker's default bridge network on Azure ML compute nodes (the jobs run in containers there): a VNet that
# overlaps it makes the nodes route part of the VNet into the bridge, so the node cannot reach those
# addresses (https://learn.microsoft.com/azure/machine-learning/how-to-secure-training-vnet: don't use
# 172.17.0.0/16 for the compute's VNet, the range Docker uses inside the nodes).
DOCKER_BRIDGE = ipaddress.IPv4Network("172.17.0.0/16")
SAME_REGION_NOTE = (
    "IP rules have no effect on requests from the same Azure region as the storage account "
    "(https://learn.microsoft.com/azure/storage/common/storage-network-security, \"IP network "
    "rules\"): a VM, Bastion host or CI runner in that region gets in only through a VNet rule "
    "(allowedSubnetIds, a subnet with the Microsoft.Storage service endpoint) or a private endpoint"
)

# Private endpoint group id -> the private DNS zones its endpoint registers in (public Azure cloud), from
# https://learn.microsoft.com/azure/private-link/private-endpoint-dns#azure-services-dns-zone-configuration.
PRIVATE_DNS_ZONES: dict[str, tuple[str, ...]] = {
    # Azure ML: the workspace API and the notebooks (studio) endpoints; both, or the studio and the
    # compute cannot reach the workspace (how-to-custom-dns, "Azure Public regions").
    "amlworkspace": ("privatelink.api.azureml.ms", "privatelink.notebooks.azure.net"),
    "registry": ("privatelink.azurecr.io",),
    "vault": ("privatelink.vaultcore.azure.net",),
    "blob": ("privatelink.blob.core.windows.net",),
    "file": ("privatelink.file.core.windows.net",),
    "dfs": ("privatelink.dfs.core.windows.net",),
    "queue": ("privatelink.queue.core.windows.net",),
    "table": ("privatelink.table.core.windows.net",),
}


def required_dns_zones(
    workspace_public: bool, registry_public: bool, key_vault_public: bool, mount_nfs: bool
) -> dict[str, str]:
    """{zone name: group id} of every private endpoint the platform declares for these settings (program.py,
    workspace.py, registry.py): the data and logs blob endpoints and the workspace endpoint always; the
    workspace storage's blob and file endpoints when the workspace is private; the NFS file endpoint with
    mountNfs; the registry's and the vault's when they are private."""
    groups = ["blob", "amlworkspace"]
    if not workspace_public or mount_nfs:
        groups.append("file")
    if not registry_public:
        groups.append("registry")
    if not key_vault_public:
        groups.append("vault")
    return {zone: g for g in groups for zone in PRIVATE_DNS_ZONES[g]}


# Every setting each level knows; anything else is refused (with the closest name), never ignored.
PLATFORM_KEYS = (
    "prefix",
    "network",
    "clusters",
    "imageBuildCluster",
    "maxTotalGpus",
    "maxTotalNodes",
    "workspacePublicAccess",
    "registryPublicAccess",
    "keyVaultPublicAccess",
    "tags",
    "users",
    "dataStack",
    "mountNfs",
    "sshPublicKey",
    "jumpHostSshPublicKey",
    "access",
    "imageBuilders",
    "quotaReaderRole",
)
NETWORK_KEYS = (
    "vnetCidr",
    "computeSubnetCidr",
    "privateEndpointSubnetCidr",
    "allowedClientIps",
    "allowedSubnetIds",
    "restrictOutbound",
)
PRINCIPAL_KEYS = ("objectId", "type")
# Keys refused with a message of their own (moved to the data stack) rather than as unknown.
_MOVED = ("storage", "nfs")


class Reader:
    """Pulls typed values out of nested dicts, recording problems instead of stopping at the first."""

    def __init__(self):
        self.problems: list[str] = []
        self.warnings: list[str] = []

    def bad(self, key: str, value: Any, allowed: str) -> None:
        self.problems.append(f"{key} = {value!r}: {allowed}")

    def known(self, d: dict, path: str, keys: tuple[str, ...], also: tuple[str, ...] = ()) -> None:
        """Refuse keys of `d` that are no setting at this level: a misspelt key would otherwise deploy
        silently with the default (`keyVaultPublicAcess: false` leaving the vault public)."""
        for key in d:
            if key in keys or key in also:
                continue
            close = difflib.get_close_matches(str(key), keys, n=1, cutoff=0.6)
            hint = f"did you mean {close[0]}?" if close else f"the settings here are {', '.join(keys)}"
            self.problems.append(
                f"{path}{key} is not a setting: {hint} (an unknown key is refused rather than "
                "ignored, which would deploy the default)"
            )

    def get(self, d: dict, key: str, path: str, kind: type, default: Any = ..., allowed: str = "") -> Any:
        full = f"{path}{key}"
        if key not in d or d[key] is None:
            if default is ...:
                self.problems.append(f"{full} is missing: {allowed or 'it is required'}")
                return None
            return default
        value = d[key]
        if kind is int and isinstance(value, str) and value.strip().lstrip("-").isdigit():
            value = int(value)
        if kind is bool and isinstance(value, str) and value.lower() in ("true", "false"):
            value = value.lower() == "true"
        if kind is int and isinstance(value, bool) or not isinstance(value, kind):
            self.bad(full, value, f"expected {kind.__name__}" + (f"; {allowed}" if allowed else ""))
            return None if default is ... else default
        return value

    def within(self, d: dict, key: str, path: str, default: int, lo: int, hi: int, allowed: str) -> int | None:
        value = self.get(d, key, path, int, default)
        if value is not None and not lo <= value <= hi:
            self.bad(f"{path}{key}", value, allowed)
        return value

    def choice(self, d: dict, key: str, path: str, default: str, choices: tuple[str, ...], allowed: str) -> str:
        value = self.get(d, key, path, str, default)
        if value not in choices:
            self.bad(f"{path}{key}", value, allowed)
        return value


def _network(r: Reader, raw: dict, key: str) -> Network | None:
    n = r.get(raw, key, "", dict, allowed="vnetCidr, computeSubnetCidr and privateEndpointSubnetCidr")
    if n is None:
        return None
    p = f"{key}."
    r.known(n, p, NETWORK_KEYS)
    nets = {}
    for k in ("vnetCidr", "computeSubnetCidr", "privateEndpointSubnetCidr"):
        text = r.get(n, k, p, str, allowed="an IPv4 CIDR such as 10.40.0.0/16")
        if text is None:
            continue
        try:
            nets[k] = ipaddress.IPv4Network(text, strict=True)
        except ValueError as e:
            r.bad(p + k, text, f"not a valid IPv4 CIDR ({e}); use the network address, e.g. 10.40.0.0/16")
    if "vnetCidr" in nets and nets["vnetCidr"].overlaps(DOCKER_BRIDGE):
        r.bad(
            p + "vnetCidr",
            str(nets["vnetCidr"]),
            f"overlaps {DOCKER_BRIDGE}, the Docker bridge network inside "
            "Azure ML compute nodes: the nodes could not reach those VNet addresses and jobs fail "
            "(how-to-secure-training-vnet); use a range outside it, e.g. 10.40.0.0/16",
        )
    if len(nets) == 3:
        vnet = nets["vnetCidr"]
        for k in ("computeSubnetCidr", "privateEndpointSubnetCidr"):
            if not nets[k].subnet_of(vnet):
                r.bad(p + k, str(nets[k]), f"must lie inside vnetCidr {vnet}")
        if nets["computeSubnetCidr"].overlaps(nets["privateEndpointSubnetCidr"]):
            r.bad(
                p + "privateEndpointSubnetCidr",
                str(nets["privateEndpointSubnetCidr"]),
                f"overlaps computeSubnetCidr {nets['computeSubnetCidr']}; subnets must not overlap",
            )
        if nets["privateEndpointSubnetCidr"].num_addresses < 16:
            r.bad(p + "privateEndpointSubnetCidr", str(nets["privateEndpointSubnetCidr"]), "needs /28 or larger")
    ips = read_client_ips(r, n, p)
    subnets = read_subnet_ids(r, n, p)
    restrict = r.get(n, "restrictOutbound", p, bool, False)
    if len(nets) < 3:
        return None
    return Network(
        vnet_cidr=str(nets["vnetCidr"]),
        compute_subnet_cidr=str(nets["computeSubnetCidr"]),
        private_endpoint_subnet_cidr=str(nets["privateEndpointSubnetCidr"]),
        allowed_client_ips=ips,
        restrict_outbound=restrict,
        allowed_subnet_ids=subnets,
    )


def read_client_ips(r: Reader, n: dict, p: str) -> tuple[str, ...]:
    """Public IPv4 addresses or ranges the storage and Key Vault firewalls admit.

    Azure Storage's rules (https://learn.microsoft.com/azure/storage/common/storage-network-security,
    "Restrictions for IP network rules"): public internet addresses only (no RFC 1918 ranges), IPv4 only,
    and no /31 or /32 prefixes (a single address is written without a prefix). Azure would reject such a
    rule only at deploy time, after other resources exist. And they admit nothing from the account's own
    region (SAME_REGION_NOTE): that is what allowedSubnetIds is for.
    """
    key = p + "allowedClientIps"
    ips = r.get(n, "allowedClientIps", p, list, [], "a list of public IPv4 addresses or CIDRs allowed to reach storage")
    out = []
    for ip in ips or []:
        text = str(ip).strip()
        try:
            net = ipaddress.ip_network(text, strict=False)
        except ValueError:
            r.bad(
                key,
                ip,
                "not an IP address or CIDR; write an address such as 52.10.20.30 or a range such as 52.10.20.0/24",
            )
            continue
        if net.version == 6:
            r.bad(
                key,
                ip,
                "Azure Storage firewalls take IPv4 only; find your IPv4 address with "
                "`curl -4 ifconfig.me` and list that",
            )
            continue
        if net.is_private or not net.is_global:
            r.bad(
                key,
                ip,
                "storage firewall rules take public internet addresses only (not 10.x, 172.16-31.x, "
                "192.168.x or other reserved ranges); machines inside a VNet get in through a VNet rule: list "
                "their subnet in allowedSubnetIds",
            )
            continue
        if "/" in text and net.prefixlen >= 31:
            fix = " and ".join(str(a) for a in (net if net.prefixlen == 31 else [net.network_address]))
            r.bad(key, ip, f"Azure Storage does not accept /31 or /32 prefixes; write {fix} (no prefix) instead")
            continue
        if "/" in text and str(net) != text:
            r.bad(key, ip, f"host bits set; write the network address {net} instead")
            continue
        out.append(text)
    return tuple(out)


def read_subnet_ids(r: Reader, n: dict, p: str) -> tuple[str, ...]:
    """Subnets admitted by VNet rules (service endpoints): the way in from the storage account's own region.

    Azure takes a subnet's full resource id; the subnet needs the Microsoft.Storage service endpoint
    (storage-network-security, "Grant access from a virtual network"), which Azure checks only at deploy
    time. Without one, `allowedClientIps` alone: warn that same-region clients stay out (SAME_REGION_NOTE)."""
    key = p + "allowedSubnetIds"
    items = r.get(n, "allowedSubnetIds", p, list, [], "a list of subnet resource ids")
    out = []
    for item in items or []:
        text = str(item).strip()
        if not _SUBNET_ID.match(text):
            r.bad(
                key,
                item,
                "a subnet's full resource id: /subscriptions/<id>/resourceGroups/<group>/providers/"
                "Microsoft.Network/virtualNetworks/<vnet>/subnets/<subnet> (`az network vnet subnet show -g <group> "
                "--vnet-name <vnet> -n <subnet> --query id -o tsv`)",
            )
            continue
        if text.lower() in (o.lower() for o in out):
            r.bad(key, item, "listed twice; list each subnet once")
            continue
        out.append(text)
    ips = n.get("allowedClientIps") or []
    if ips and not out:
        r.warnings.append(f"{p}allowedClientIps lists addresses but {key} is empty: {SAME_REGION_NOTE}")
    return tuple(out)


def read_users(r: Reader, raw: dict) -> tuple[Principal, ...] | None:
    return read_principals(r, raw, "users", "")


def read_principals(r: Reader, d: dict, key: str, path: str) -> tuple[Principal, ...] | None:
    """A list of Entra principals {objectId, type} at d[key] (the shape of `users`); None when the key is absent."""
    items = r.get(d, key, path, list, None, "a list of {objectId, type} (type: User, Group or ServicePrincipal)")
    if items is None:
        return None
    out, seen = [], set()
    for i, u in enumerate(items):
        p = f"{path}{key}[{i}]."
        if not isinstance(u, dict):
            r.bad(f"{path}{key}[{i}]", u, "expected {objectId: <guid>, type: User|Group|ServicePrincipal}")
            continue
        r.known(u, p, PRINCIPAL_KEYS)
        oid = r.get(
            u,
            "objectId",
            p,
            str,
            allowed="the Entra object id: `az ad user show --id you@example.com "
            "--query id -o tsv` or `az ad group show --group NAME --query id -o tsv`",
        )
        if oid is not None and not _GUID.match(oid):
            r.bad(
                p + "objectId",
                oid,
                "an Entra object id (a GUID), not a name or e-mail: "
                "`az ad user show --id you@example.com --query id -o tsv`",
            )
        kind = r.choice(
            u,
            "type",
            p,
            "User",
            PRINCIPAL_TYPES,
            "User, Group or ServicePrincipal (Azure's principalType; a wrong type makes the role assignment fail)",
        )
        if oid is not None and _GUID.match(oid):
            if oid.lower() in seen:
                r.bad(p + "objectId", oid, "listed twice; list each principal once")
            seen.add(oid.lower())
            out.append(Principal(object_id=oid.lower(), type=kind))
    return tuple(out)


def location_and_subscription(r: Reader, location: str | None, subscription_id: str | None, where: str = "") -> None:
    """The two azure-native settings a stack must set: the region, and the subscription its names hash."""
    if not location:
        r.problems.append(
            "azure-native:location is missing: set the Azure region, e.g. "
            f"`pulumi config set azure-native:location westeurope`{where}"
        )
    elif not _LOCATION.match(location):
        r.bad(
            "azure-native:location",
            location,
            "an Azure region's short name such as westeurope or eastus2 (lowercase, no spaces)",
        )
    if not subscription_id:
        r.problems.append(
            "azure-native:subscriptionId is missing: resource names hash the subscription, so the "
            "stack must name it rather than follow whichever subscription is the CLI's default (another "
            "default would plan replacing every globally named resource): `pulumi config set "
            f"azure-native:subscriptionId <id>`{where} (`az account show --query id -o tsv`)"
        )
    elif not _GUID.match(subscription_id):
        r.bad(
            "azure-native:subscriptionId",
            subscription_id,
            "a subscription id (a GUID), not its name: `az account show --subscription <name> --query id -o tsv`",
        )


def load(
    raw: dict, stack: str, location: str | None, subscription_id: str | None = None, today: dt.date | None = None
) -> PlatformConfig:
    """Validate the project's config dict (keys without the project prefix) for `stack`."""
    from .clusterconfig import image_build_cluster, read_clusters  # the clusters', beside compute.py
    from .wayinconfig import central_zones_cover, read_access  # the way in's settings, read beside wayin.py

    today = today or dt.date.today()
    r = Reader()
    location_and_subscription(r, location, subscription_id)
    r.known(raw, "", PLATFORM_KEYS, also=_MOVED)
    prefix = r.get(raw, "prefix", "", str, allowed="2-8 lowercase letters and digits, starting with a letter")
    if prefix is not None and not PREFIX_NAME.match(prefix):
        r.bad(
            "prefix",
            prefix,
            "2-8 lowercase letters and digits, starting with a letter (it goes into storage account names)",
        )
    network = _network(r, raw, "network")
    for moved in _MOVED:
        if moved in raw:
            r.problems.append(
                f"{moved} is set in the platform's stack file, but the durable data has a stack of its "
                f"own now: move the key to infra/data-stack/Pulumi.<stack>.yaml (as "
                f"azure-horovod-training-data:{moved}) and remove it here (docs/deploying.md#two-stacks)"
            )
    users = read_users(r, raw)
    mount_nfs = r.get(raw, "mountNfs", "", bool, True)
    data_stack = r.get(raw, "dataStack", "", str, None)
    if data_stack is not None and not _STACK_REF.match(data_stack):
        r.bad(
            "dataStack",
            data_stack,
            "a fully qualified stack name <organization>/<project>/<stack>, e.g. "
            "acme/azure-horovod-training-data/dev; leave it out to use the data stack of the same name",
        )
    clusters = read_clusters(r, raw, today)
    max_gpus = r.get(raw, "maxTotalGpus", "", int, 64)
    max_nodes = r.get(raw, "maxTotalNodes", "", int, 32)
    if clusters and max_gpus is not None:
        total = sum(c.max_nodes * c.size.gpus for c in clusters)
        if total > max_gpus:
            r.bad(
                "clusters",
                [f"{c.name}: {c.max_nodes} x {c.size.gpus} GPUs" for c in clusters if c.size.gpus],
                f"together they can scale to {total} GPUs, above maxTotalGpus = {max_gpus}; lower maxNodes or "
                "raise maxTotalGpus (and your subscription's quota) deliberately",
            )
    if clusters and max_nodes is not None:
        nodes = sum(c.max_nodes for c in clusters)
        if nodes > max_nodes:
            r.bad(
                "clusters",
                f"{nodes} nodes at most",
                f"above maxTotalNodes = {max_nodes}; lower maxNodes or raise maxTotalNodes",
            )
        if network is not None:
            usable = ipaddress.IPv4Network(network.compute_subnet_cidr).num_addresses - 5  # Azure keeps 5
            if nodes > usable:
                r.bad(
                    "network.computeSubnetCidr",
                    network.compute_subnet_cidr,
                    f"has {usable} usable addresses for up to {nodes} nodes; use a larger subnet",
                )
    build = image_build_cluster(r, raw, clusters)
    ws_public = r.get(raw, "workspacePublicAccess", "", bool, True)
    acr_public = r.get(raw, "registryPublicAccess", "", bool, True)
    kv_public = r.get(raw, "keyVaultPublicAccess", "", bool, True)
    tags = r.get(raw, "tags", "", dict, {})
    if network is not None and network.restrict_outbound and acr_public is True:
        r.bad(
            "registryPublicAccess",
            acr_public,
            "network.restrictOutbound puts a service endpoint policy on the compute subnet that drops storage "
            "requests to any account it does not list, and a registry reached over its public endpoint serves the "
            "image layers from storage accounts the registry service owns (*.blob.core.windows.net), which no policy "
            "can list: the clusters could not pull the training images. Set registryPublicAccess: false (the "
            "registry then answers on its private endpoint, which the policy does not filter; images are pushed "
            "from inside the VNet, docs/private-access.md) or restrictOutbound: false",
        )
    access = read_access(r, raw, network, ws_public)
    if access is not None and access.private_dns_zones:
        central_zones_cover(r, access, ws_public, acr_public, kv_public, mount_nfs)
    quota_reader_role = r.get(raw, "quotaReaderRole", "", bool, True)
    builders = read_principals(r, raw, "imageBuilders", "")
    if builders is None and acr_public is False:
        r.warnings.append(
            "imageBuilders is not set: every principal in users gets AcrPush on the private registry (someone "
            "must push the training images from inside the VNet, and every job pulls them), so any of them can "
            "overwrite an image the jobs run; list who builds them to narrow it (a group: "
            "imageBuilders: [{objectId: <group id>, type: Group}]; docs/private-access.md, \"Images\")"
        )
    if r.problems:
        raise ConfigError(r.problems)
    return PlatformConfig(
        stack=stack,
        subscription_id=subscription_id.lower(),
        prefix=prefix,
        location=location,
        network=network,
        clusters=clusters,
        workspace_public_access=ws_public,
        registry_public_access=acr_public,
        image_build_cluster=build,
        max_total_gpus=max_gpus,
        max_total_nodes=max_nodes,
        tags={"project": PROJECT, "stack": stack, **{str(k): str(v) for k, v in tags.items()}},
        key_vault_public_access=kv_public,
        data_stack=data_stack,
        users=users,
        mount_nfs=mount_nfs,
        warnings=tuple(r.warnings),
        access=access,
        image_builders=builders,
        quota_reader_role=quota_reader_role,
    )


def all_settings(project: str) -> dict[str, Any]:
    """Every key the stack sets for `project` (without the prefix), as Pulumi hands them to the program,
    with structured values parsed from their JSON: unknown ones included, so they can be refused."""
    import json

    from pulumi.runtime import config as runtime_config

    every = {**runtime_config.get_config_env(), **runtime_config.CONFIG.get()}
    raw = {}
    for key, text in every.items():
        if not key.startswith(project + ":"):
            continue
        name = key.split(":", 1)[1]
        try:
            raw[name] = json.loads(text) if isinstance(text, str) else text
        except ValueError:
            raw[name] = text
    return raw


def pulumi_settings(project: str) -> tuple[dict, str, str | None, str | None]:
    """The current stack's settings for `project`, its name, and its azure-native location and subscription:
    what `load` takes."""
    import pulumi

    provider = pulumi.Config("azure-native")
    return all_settings(project), pulumi.get_stack(), provider.get("location"), provider.get("subscriptionId")


def from_pulumi() -> PlatformConfig:
    """Read the current stack's config through Pulumi (the program's entry point)."""
    raw, stack, location, subscription = pulumi_settings(PROJECT)
    for secret in ("sshPublicKey", "jumpHostSshPublicKey"):
        raw.pop(secret, None)  # secrets, read by the entry point itself
    return load(raw, stack, location, subscription)
