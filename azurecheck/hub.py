"""Hub mode (config `access: {mode: hub}`, wayin.py): what `pulumi up` does on the hub VNet, checked before it.

The stack peers its VNet with the hub both ways and, without `access.privateDnsZoneIds`, links its own private
DNS zones to the hub VNet; with them, every private endpoint's zone group registers in the hub's zones. All of
that comes at the end of `up`, after everything else exists, so preflight reads the hub first:

- Address space. "The address spaces of the virtual networks can't overlap" (virtual-network-manage-peering,
  requirements and constraints), and a hub's peerings route to their networks too: network.vnetCidr is compared
  with the hub's `properties.addressSpace.addressPrefixes` and with every existing peering's
  `properties.remoteAddressSpace.addressPrefixes` (Virtual Networks - Get, Microsoft.Network 2024-05-01: the VNet
  carries its `virtualNetworkPeerings`). This stack's own peering (its remote VNet in the stack's resource
  group: preflight run again after `up`) is left out.
- Rights on the hub VNet (Permissions - List For Resource): `virtualNetworkPeerings/write` for the hub's side of
  the peering, `peer/action` for this VNet's side, which names the hub as its remote network (the peering
  how-to's permissions table), and without central zones `virtualNetworks/join/action` to link the stack's zones
  to the hub (a virtual network link joins the VNet).
- Central zones (`access.privateDnsZoneIds`): each one exists (Private Zones - Get) and the deployer may
  `Microsoft.Network/privateDnsZones/join/action` on it, which a private endpoint's zone group needs.
- The data accounts' records in the hub's blob zone (with the data stack file: Record Sets - Get, the A record of
  each account's name): with `access.dataEndpointRecords: this-platform` no other platform's endpoint may hold
  one (this platform's endpoint would take it over); with `another-platform` one must, or the data is unreachable,
  and network.computeRouteTableId's routes must send its addresses to the hub's firewall (check_data_route).
"""

from __future__ import annotations

import ipaddress
import re

from azure.core.exceptions import AzureError, ClientAuthenticationError, ResourceNotFoundError

from trainingplatform import config, naming, networkconfig

from .arm import NETWORK_API, PRIVATE_DNS_API, Arm, attempt, describe
from .findings import FAIL, OK, Finding
from .roles import allowed, read_permissions

PEERING_WRITE = "Microsoft.Network/virtualNetworks/virtualNetworkPeerings/write"
PEER = "Microsoft.Network/virtualNetworks/peer/action"
VNET_JOIN = "Microsoft.Network/virtualNetworks/join/action"
ZONE_JOIN = "Microsoft.Network/privateDnsZones/join/action"
_GROUP = re.compile(r"^/subscriptions/([^/]+)/resourceGroups/([^/]+)/", re.IGNORECASE)


def _name(resource_id: str) -> str:
    return resource_id.rstrip("/").rsplit("/", 1)[-1]


def _network(text) -> ipaddress.IPv4Network | ipaddress.IPv6Network | None:
    try:
        return ipaddress.ip_network(str(text), strict=False)
    except ValueError:
        return None


def _ours(remote_id: str, subscription: str, group: str) -> bool:
    m = _GROUP.match(remote_id or "")
    return bool(m) and m.group(1).lower() == subscription.lower() and m.group(2).lower() == group.lower()


def address_ranges(vnet: dict, subscription: str, own_group: str) -> list[tuple[str, str]]:
    """(where, prefix) for the hub's own address space and each of its peerings' remote address space
    (Virtual Networks - Get), without this stack's own peering."""
    props = vnet.get("properties") or {}
    ranges = [("the hub's address space", p) for p in (props.get("addressSpace") or {}).get("addressPrefixes") or []]
    for peering in props.get("virtualNetworkPeerings") or []:
        pp = peering.get("properties") or {}
        remote = str((pp.get("remoteVirtualNetwork") or {}).get("id") or "")
        if _ours(remote, subscription, own_group):
            continue
        where = f"peering {peering.get('name') or '?'} (to {_name(remote) if remote else 'an unnamed network'})"
        ranges += [(where, p) for p in (pp.get("remoteAddressSpace") or {}).get("addressPrefixes") or []]
    return ranges


def _free_range(own: ipaddress.IPv4Network, taken: list) -> ipaddress.IPv4Network | None:
    """A range of vnetCidr's size in 10.0.0.0/8 clear of `taken` and of Docker's bridge, to suggest."""
    if own.version != 4 or own.prefixlen < 8:
        return None
    avoid = [n for n in taken if n.version == 4] + [networkconfig.DOCKER_BRIDGE]
    for i, candidate in enumerate(ipaddress.IPv4Network("10.0.0.0/8").subnets(new_prefix=own.prefixlen)):
        if i >= 4096:
            return None
        if not any(candidate.overlaps(n) for n in avoid):
            return candidate
    return None


def check_overlap(vnet: dict, cfg: config.PlatformConfig) -> list[Finding]:
    own = ipaddress.ip_network(cfg.network.vnet_cidr)
    group = naming.dashed(cfg.prefix, cfg.stack, "rg")
    ranges = [(where, text, _network(text)) for where, text in address_ranges(vnet, cfg.subscription_id, group)]
    clashes = [
        (where, net) for where, _, net in ranges if net is not None and net.version == own.version and net.overlaps(own)
    ]
    listed = ", ".join(text for _, text, _ in ranges) or "none"
    if not clashes:
        return [
            Finding(
                OK,
                "hub network",
                f"network.vnetCidr {own} overlaps neither the hub's address space nor its peerings' ({listed})",
            )
        ]
    free = _free_range(own, [net for _, _, net in ranges if net is not None])
    return [
        Finding(
            FAIL,
            "hub network",
            f"network.vnetCidr {own} overlaps {where} {net}: Azure refuses a peering between overlapping address "
            "spaces, and `pulumi up` would reach the peering last, after creating everything else",
            f"choose a network.vnetCidr clear of every range the hub reaches ({listed})"
            + (f", e.g. {free}," if free else "")
            + " and move computeSubnetCidr, privateEndpointSubnetCidr and the access subnets into it",
        )
        for where, net in clashes
    ]


def _rights(permissions: list[dict], needed: dict[str, str], scope: str, what: str, fix: str) -> list[Finding]:
    missing = [(action, why) for action, why in needed.items() if not allowed(action, permissions)]
    if not missing:
        return [Finding(OK, what, f"{', '.join(needed)} allowed on {scope}")]
    return [Finding(FAIL, what, f"you may not {action} on {scope}: {why}", fix) for action, why in missing]


def check(arm: Arm, cfg: config.PlatformConfig) -> list[Finding]:
    access = cfg.access
    if access is None or access.mode != "hub" or not access.hub_vnet_id:
        return []
    hub = access.hub_vnet_id
    try:
        vnet = arm.get(hub, NETWORK_API)
    except ClientAuthenticationError:
        raise
    except ResourceNotFoundError as e:
        return [
            Finding(
                FAIL,
                "hub network",
                describe(e, f"reading the hub VNet {hub} (access.hubVnetId)"),
                "set access.hubVnetId to the hub's id (`az network vnet show -g <group> -n <name> --query id -o "
                "tsv`, signed in to a tenant and subscription that see it)",
            )
        ]
    except AzureError as e:
        return [
            Finding(
                FAIL,
                "hub network",
                describe(e, f"reading the hub VNet {hub} (access.hubVnetId)"),
                f"ask the hub's owners for Network Contributor on {hub} (the stack peers with it; Reader at least "
                "lets preflight compare address spaces)",
            )
        ]
    found = check_overlap(vnet, cfg)
    needed = {
        PEERING_WRITE: "the stack creates the hub's side of the peering",
        PEER: "this VNet's side of the peering names the hub as its remote network",
    }
    if not access.private_dns_zones:
        needed[VNET_JOIN] = "without access.privateDnsZoneIds the stack links its own private DNS zones to the hub VNet"
    fix = (
        f'ask the hub\'s owners for Network Contributor on it: az role assignment create --assignee <you> --role '
        f'"Network Contributor" --scope {hub} (or a custom role with {", ".join(needed)})'
    )
    found += _read_rights(arm, hub, needed, "hub rights", fix)
    for zone_name, zone_id in access.private_dns_zones:
        found += check_zone(arm, zone_name, zone_id)
    return found


def _read_rights(arm: Arm, scope: str, needed: dict[str, str], what: str, fix: str) -> list[Finding]:
    permissions, failed = attempt(
        lambda: read_permissions(arm, scope), what, f"reading your permissions on {scope}", fix
    )
    return failed or _rights(permissions, needed, scope, what, fix)


def check_zone(arm: Arm, zone_name: str, zone_id: str) -> list[Finding]:
    what = f"hub zone {zone_name}"
    try:
        arm.get(zone_id, PRIVATE_DNS_API)
    except ClientAuthenticationError:
        raise
    except ResourceNotFoundError as e:
        return [
            Finding(
                FAIL,
                what,
                describe(e, f"reading {zone_id} (access.privateDnsZoneIds)") + ": no such zone",
                f"list the hub's zone of that name in access.privateDnsZoneIds (`az network private-dns zone list "
                f"--query \"[?name=='{zone_name}'].id\" -o tsv` in the hub's subscription), or ask the hub's owners "
                "to create it",
            )
        ]
    except AzureError as e:
        return [
            Finding(
                FAIL,
                what,
                describe(e, f"reading {zone_id} (access.privateDnsZoneIds)"),
                f"ask the zone's owners for Private DNS Zone Contributor on {zone_id}, or a custom role with "
                f"{ZONE_JOIN} and read",
            )
        ]
    return _read_rights(
        arm,
        zone_id,
        {ZONE_JOIN: "every private endpoint's zone group registers its address in this zone"},
        what,
        f"ask the zone's owners for {ZONE_JOIN} on it: Private DNS Zone Contributor (az role assignment create "
        f'--assignee <you> --role "Private DNS Zone Contributor" --scope {zone_id}) or a custom role with that '
        "action only",
    )


BLOB_ZONE = "privatelink.blob.core.windows.net"


def data_accounts(data) -> list[str]:
    """The data stack's blob accounts (data, logs), named as its program names them (naming.py)."""
    d = data.settings
    suffix = naming.global_suffix(data.subscription or d.subscription_id, d.prefix, d.stack, d.location)
    return [naming.storage_account(d.prefix, d.stack, role, suffix) for role in ("data", "logs")]


def check_data_records(arm: Arm, cfg: config.PlatformConfig, accounts: list[str]) -> list[Finding]:
    """The hub blob zone's record of each data account against access.dataEndpointRecords (wayinconfig.py)."""
    access = cfg.access
    zone_id = dict(access.private_dns_zones).get(BLOB_ZONE) if access is not None else None
    mine = access.data_endpoint_records if access is not None else None
    if not zone_id or not mine:
        return []
    vnet = ipaddress.ip_network(cfg.network.vnet_cidr) if cfg.network is not None else None
    found = []
    for account in accounts:
        what = f"data records {account}"
        try:
            record = arm.get(f"{zone_id}/A/{account}", PRIVATE_DNS_API)
        except ClientAuthenticationError:
            raise
        except ResourceNotFoundError:
            record = None
        except AzureError as e:
            found.append(
                Finding(FAIL, what, describe(e, f"reading {account}'s record in {zone_id}"), "read on the zone")
            )
            continue
        ips = [a.get("ipv4Address") for a in ((record or {}).get("properties") or {}).get("aRecords") or []]
        outside = [ip for ip in ips if vnet is None or _network(ip) is None or not _network(ip).subnet_of(vnet)]
        if mine == "this-platform" and outside:
            found.append(
                Finding(
                    FAIL,
                    what,
                    f"the hub's {BLOB_ZONE} already resolves {account} to {', '.join(outside)}, outside this "
                    f"platform's network.vnetCidr: another platform's endpoint, whose record this platform's would "
                    "take over (and delete with itself)",
                    "set access.dataEndpointRecords: another-platform on this platform (it then reaches the data "
                    "through that endpoint, routed through the hub), or destroy the other platform first",
                )
            )
        elif mine == "another-platform" and not ips:
            found.append(
                Finding(
                    FAIL,
                    what,
                    f"no platform has registered {account} in the hub's {BLOB_ZONE}: this platform creates no "
                    "endpoint of the data accounts (access.dataEndpointRecords: another-platform)",
                    "deploy the platform set to this-platform first, or set this one to this-platform",
                )
            )
        else:
            where = f"resolves to {', '.join(ips)}" if ips else "has no record yet (this platform writes it)"
            found.append(Finding(OK, what, f"{account} {where} in the hub's {BLOB_ZONE}"))
            if mine == "another-platform":
                found += check_data_route(arm, cfg, account, ips)
    return found


# Azure's default system routes that drop private ranges outside the VNet ("next hop type None") and send the rest to
# the internet (learn.microsoft.com/azure/virtual-network/virtual-networks-udr-overview, "Default"): a user route
# wins only where its prefix is at least as long (longest prefix first; on a tie, a user route first).
SYSTEM_ROUTES = (
    ("0.0.0.0/0", "Internet"),
    *((n, "None") for n in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10")),
)


def check_data_route(arm: Arm, cfg: config.PlatformConfig, account: str, ips: list[str]) -> list[Finding]:
    """access.dataEndpointRecords another-platform: the data endpoints are in the other platform's VNet, which peering
    does not reach from this one (it is not transitive: virtual-network-peering-overview), so the compute subnet's
    route table (network.computeRouteTableId) must send each address to the hub's firewall (next hop
    VirtualAppliance). Route Tables - Get (Microsoft.Network 2024-05-01): properties.routes[].properties
    addressPrefix, nextHopType."""
    what = f"data route {account}"
    table_id = cfg.network.compute_route_table_id if cfg.network is not None else None
    if not table_id:
        return [
            Finding(
                FAIL,
                what,
                f"{account} resolves to {', '.join(ips)}, another platform's endpoint, and the stack declares no route "
                "there: peering with the hub does not reach another spoke (network.computeRouteTableId is not set)",
                "set network.computeRouteTableId to the hub's route table that sends those addresses to its firewall "
                "(next hop VirtualAppliance); the stack attaches it to the compute subnet",
            )
        ]
    try:
        table = arm.get(table_id, NETWORK_API)
    except ClientAuthenticationError:
        raise
    except AzureError as e:
        return [Finding(FAIL, what, describe(e, f"reading {table_id} (network.computeRouteTableId)"), "Reader on it")]
    routes = [(text, hop, False) for text, hop in SYSTEM_ROUTES]
    for r in (table.get("properties") or {}).get("routes") or []:
        props = r.get("properties") or {}
        routes.append((props.get("addressPrefix"), props.get("nextHopType"), True))
    gaps = []
    for ip in ips:
        address = ipaddress.ip_address(ip)
        covering = [(net, hop, user) for text, hop, user in routes if (net := _network(text)) and address in net]
        net, hop, _ = max(covering, key=lambda c: (c[0].prefixlen, c[2]))
        if hop != "VirtualAppliance":
            gaps.append(f"{ip} goes by {net} to {hop}")
    if gaps:
        return [
            Finding(
                FAIL,
                what,
                f"{table_id} does not send {account}'s endpoint to the hub's firewall: {'; '.join(gaps)}",
                "add a route for those addresses with next hop VirtualAppliance (the hub's firewall), as long a "
                "prefix as the one named",
            )
        ]
    return [Finding(OK, what, f"{', '.join(ips)} routed to the hub's firewall by {table_id}")]
