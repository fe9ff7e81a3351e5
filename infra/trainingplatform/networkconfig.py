"""The `network` settings (the VNet, its subnets, who the storage and Key Vault firewalls admit) and the private DNS
zones the platform's endpoints register in, read and checked beside network.py and privatelink.py, which use them."""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

from .reader import Reader


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
    # An existing route table attached to the compute subnet (full resource id), e.g. the hub's that sends another
    # platform's data endpoints to its firewall (access.dataEndpointRecords another-platform, docs/private-access.md).
    compute_route_table_id: str | None = None


# A subnet's ARM id. Resource group: 1-90 letters, digits, _ - . ( ) not ending in a period; VNet 2-64 and
# subnet 1-80 letters, digits, _ - . (resource-name-rules, Microsoft.Network).
_SUBNET_ID = re.compile(
    r"^/subscriptions/[0-9a-fA-F-]{36}/resourceGroups/[-\w.()]{0,89}[-\w()]"
    r"/providers/Microsoft\.Network/virtualNetworks/[-\w.]{2,64}/subnets/[-\w.]{1,80}$",
    re.IGNORECASE,
)
_ROUTE_TABLE_ID = re.compile(
    r"^/subscriptions/[0-9a-fA-F-]{36}/resourceGroups/[-\w.()]{0,89}[-\w()]"
    r"/providers/Microsoft\.Network/routeTables/[-\w.]{1,80}$",
    re.IGNORECASE,
)
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


NETWORK_KEYS = (
    "vnetCidr",
    "computeSubnetCidr",
    "privateEndpointSubnetCidr",
    "allowedClientIps",
    "allowedSubnetIds",
    "restrictOutbound",
    "computeRouteTableId",
)


def read_network(r: Reader, raw: dict, key: str) -> Network | None:
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
    route_table = r.get(n, "computeRouteTableId", p, str, None, "a route table's full resource id")
    if route_table is not None and not _ROUTE_TABLE_ID.match(route_table):
        r.bad(
            p + "computeRouteTableId",
            route_table,
            "a route table's full resource id: /subscriptions/<id>/resourceGroups/<group>/providers/"
            "Microsoft.Network/routeTables/<name> (`az network route-table show -g <group> -n <name> --query id -o tsv`)",
        )
    if len(nets) < 3:
        return None
    return Network(
        vnet_cidr=str(nets["vnetCidr"]),
        compute_subnet_cidr=str(nets["computeSubnetCidr"]),
        private_endpoint_subnet_cidr=str(nets["privateEndpointSubnetCidr"]),
        allowed_client_ips=ips,
        restrict_outbound=restrict,
        allowed_subnet_ids=subnets,
        compute_route_table_id=route_table,
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
