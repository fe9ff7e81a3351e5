"""The way in (config `access`): how people outside the VNet reach a private platform, read and validated beside
nothing else, for wayin.py (the Bastion and jump host, or the hub peering) and privatelink.py (hub mode's central
DNS zones). config.load calls read_access and central_zones_cover; messages name the keys as the stack file does.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

from .networkconfig import Network, required_dns_zones
from .reader import Principal, Reader, read_principals

ACCESS_MODES = ("bastion", "hub", "none")
_ACCESS_KEYS = {
    "bastion": {
        "mode",
        "bastionSubnetCidr",
        "jumpHostSubnetCidr",
        "jumpHostVmSize",
        "jumpHostAdmins",
        "jumpHostShutdownTime",
        "jumpHostShutdownTimeZone",
    },
    "hub": {
        "mode",
        "hubVnetId",
        "useHubGateway",
        "resolverSubnetCidr",
        "privateDnsZoneIds",
        "dnsServers",
        "dataEndpointRecords",
    },
    "none": {"mode"},
}
# An existing private DNS zone's resource id (a landing zone's central zones, usually in its connectivity
# subscription).
_ZONE_ID = re.compile(
    r"^/subscriptions/[0-9a-fA-F-]{36}/resourceGroups/[^/]+/providers/Microsoft\.Network/privateDnsZones/([^/]+)$",
    re.IGNORECASE,
)
# The jump host's daily auto-shutdown (wayin.py): DevTest Labs' `dailyRecurrence.time`, "HHmm" on a 24-hour clock
# (Microsoft's examples: "1900"), in a Windows time zone id (`timeZoneId`: "UTC", "W. Europe Standard Time").
_SHUTDOWN_TIME = re.compile(r"^([01][0-9]|2[0-3])[0-5][0-9]$")
DEFAULT_SHUTDOWN_TIME, DEFAULT_SHUTDOWN_TIME_ZONE = "1900", "UTC"
_VNET_ID = re.compile(
    r"^/subscriptions/([0-9a-fA-F-]{36})/resourceGroups/([^/]+)/providers/Microsoft\.Network/"
    r"virtualNetworks/([^/]+)$",
    re.IGNORECASE,
)
_VM_SIZE = re.compile(r"^Standard_[A-Za-z0-9_]+$")


@dataclass(frozen=True)
class AccessConfig:
    """`bastion`: Azure Bastion plus a Linux jump host in the VNet (Microsoft's machine-learning-end-to-end-secure
    template deploys the same pair by default). `hub`: peering with an existing hub VNet (VPN or ExpressRoute
    gateway, its own jump hosts) and the private DNS zones linked to it too; optionally a DNS private resolver
    inbound endpoint for clients whose DNS is not Azure's. `none`: nobody outside the VNet (public profile)."""

    mode: str = "none"
    bastion_subnet_cidr: str | None = None
    jump_host_subnet_cidr: str | None = None
    jump_host_vm_size: str = "Standard_D4s_v5"
    hub_vnet_id: str | None = None
    use_hub_gateway: bool = False
    resolver_subnet_cidr: str | None = None
    # Who among `users` signs in to the jump host with sudo ("Virtual Machine Administrator Login"); every other
    # user gets "Virtual Machine User Login" (program.py checks they are users) and builds with rootless Docker.
    jump_host_admins: tuple[Principal, ...] = ()
    # Hub mode with the hub's own private DNS zones: ((zone name, zone id), ...). Then the stack creates no zone
    # and no zone link; every endpoint's zone group points at these, and the VNet asks `dns_servers` (the hub's
    # DNS: a DNS private resolver's inbound endpoint or the firewall's DNS proxy), which resolve through the zones'
    # links to the hub.
    private_dns_zones: tuple[tuple[str, str], ...] = ()
    dns_servers: tuple[str, ...] = ()
    # With the hub's zones, who writes the data stack's accounts into them (DATA_ENDPOINT_RECORDS): the data
    # accounts' names are the same for every platform that shares the data stack, and one record holds one address.
    data_endpoint_records: str | None = None
    # The jump host's daily auto-shutdown: "HHmm" (24-hour) in a Windows time zone id; None: never shut down.
    jump_host_shutdown_time: str | None = DEFAULT_SHUTDOWN_TIME
    jump_host_shutdown_time_zone: str = DEFAULT_SHUTDOWN_TIME_ZONE

    @property
    def hub(self) -> tuple[str, str, str] | None:
        """(subscription, resource group, VNet name) of the hub VNet."""
        m = _VNET_ID.match(self.hub_vnet_id or "")
        return (m.group(1).lower(), m.group(2), m.group(3)) if m else None


def read_access(r: Reader, raw: dict, network: Network | None, workspace_public: bool) -> AccessConfig | None:
    a = r.get(raw, "access", "", dict, None, "a mapping {mode: bastion|hub|none, ...}")
    p = "access."
    if a is None:
        if workspace_public is False:
            r.problems.append(
                "access is missing while workspacePublicAccess is false: with public access off on the "
                "workspace, nobody outside the VNet can submit jobs, upload data or open the studio; "
                "declare the way in, e.g. access: {mode: bastion, bastionSubnetCidr: <a /26 in the VNet>, "
                "jumpHostSubnetCidr: <a /29 or larger>} or access: {mode: hub, hubVnetId: <resource id>} "
                "(docs/private-access.md)"
            )
        return None
    mode = r.choice(a, "mode", p, "none", ACCESS_MODES, "bastion, hub or none")
    if mode not in ACCESS_MODES:
        return None
    for k in sorted(set(a) - _ACCESS_KEYS[mode]):
        r.bad(
            p + k,
            a[k],
            f"not a setting of mode {mode} (its settings: {', '.join(sorted(_ACCESS_KEYS[mode]))}); remove it",
        )
    if mode == "none" and workspace_public is False:
        r.bad(
            p + "mode",
            mode,
            "workspacePublicAccess is false, so nobody could reach the workspace: choose bastion "
            "(a jump host behind Azure Bastion) or hub (peering with your hub VNet)",
        )
    taken = (
        []
        if network is None
        else [
            ipaddress.IPv4Network(network.compute_subnet_cidr),
            ipaddress.IPv4Network(network.private_endpoint_subnet_cidr),
        ]
    )

    def subnet(key: str, min_addresses: int, rule: str, required: bool) -> str | None:
        text = r.get(a, key, p, str, ... if required else None, f"an IPv4 CIDR inside network.vnetCidr ({rule})")
        if text is None:
            return None
        try:
            net = ipaddress.IPv4Network(text, strict=True)
        except ValueError as e:
            r.bad(p + key, text, f"not a valid IPv4 CIDR ({e}); use the network address, e.g. 10.41.17.0/26")
            return None
        if net.num_addresses < min_addresses:
            r.bad(p + key, text, rule)
        if network is not None:
            if not net.subnet_of(ipaddress.IPv4Network(network.vnet_cidr)):
                r.bad(p + key, text, f"must lie inside network.vnetCidr {network.vnet_cidr}")
            for other in taken:
                if net.overlaps(other):
                    r.bad(p + key, text, f"overlaps {other}, another subnet of the VNet; subnets must not overlap")
            taken.append(net)
        return text

    if mode == "bastion":
        # https://learn.microsoft.com/azure/bastion/configuration-settings#subnet: "The subnet must be /26 or
        # larger" and be named AzureBastionSubnet (wayin.py names it).
        bastion = subnet(
            "bastionSubnetCidr",
            64,
            "Azure Bastion needs a subnet of /26 or larger (learn.microsoft.com/azure/bastion/configuration-settings)",
            True,
        )
        # Azure's smallest subnet is /29 (https://learn.microsoft.com/azure/virtual-network/virtual-networks-faq).
        jump = subnet("jumpHostSubnetCidr", 8, "Azure's smallest subnet is a /29", True)
        size = r.get(a, "jumpHostVmSize", p, str, "Standard_D4s_v5")
        if size is not None and not _VM_SIZE.match(size):
            r.bad(
                p + "jumpHostVmSize",
                size,
                "an Azure VM size such as Standard_D4s_v5 (it builds the images: 4 vCPUs or more)",
            )
        # Same shape as `users`; a subset of them (checked by program.py once the default user is known).
        admins = read_principals(r, a, "jumpHostAdmins", p) or ()
        time, zone = _shutdown(r, a, p)
        return AccessConfig(
            "bastion",
            bastion,
            jump,
            size or "Standard_D4s_v5",
            jump_host_admins=admins,
            jump_host_shutdown_time=time,
            jump_host_shutdown_time_zone=zone,
        )
    if mode == "hub":
        hub = r.get(
            a,
            "hubVnetId",
            p,
            str,
            allowed="the hub VNet's resource id: `az network vnet show -g RG -n NAME --query id -o tsv`",
        )
        if hub is not None and not _VNET_ID.match(hub):
            r.bad(
                p + "hubVnetId",
                hub,
                "a VNet resource id /subscriptions/<id>/resourceGroups/<rg>/providers/"
                "Microsoft.Network/virtualNetworks/<name> (`az network vnet show ... --query id -o tsv`)",
            )
        gateway = r.get(a, "useHubGateway", p, bool, False)
        # DNS private resolver: inbound endpoints need a dedicated subnet of /28 to /24
        # (https://learn.microsoft.com/azure/dns/dns-private-resolver-overview#subnet-restrictions).
        resolver = subnet("resolverSubnetCidr", 16, "a DNS private resolver's inbound subnet is /28 to /24", False)
        if resolver is not None and ipaddress.IPv4Network(resolver).prefixlen < 24:
            r.bad(p + "resolverSubnetCidr", resolver, "a DNS private resolver's inbound subnet is /28 to /24")
        zones, servers = _central_dns(r, a, p, network, resolver)
        return AccessConfig(
            "hub",
            hub_vnet_id=hub,
            use_hub_gateway=bool(gateway),
            resolver_subnet_cidr=resolver,
            private_dns_zones=zones,
            dns_servers=servers,
            data_endpoint_records=_data_endpoint_records(r, a, p, bool(zones)),
        )
    return AccessConfig("none")


# Hub mode with the hub's private DNS zones: which platform writes the data stack's accounts (data, logs, NFS) into
# them. A private endpoint's zone group writes its address into the zone under the account's name, and a second
# endpoint of the same account in the same zone takes that record over; deleting either endpoint deletes the
# record (learn.microsoft.com/azure/private-link/private-endpoint-dns-integration, "Private DNS zone group"). So of
# several platforms sharing one data stack on one hub, exactly one may register those accounts.
DATA_ENDPOINT_RECORDS = ("this-platform", "another-platform")


def _data_endpoint_records(r: Reader, a: dict, p: str, central: bool) -> str | None:
    choices = "this-platform or another-platform"
    value = r.get(a, "dataEndpointRecords", p, str, None, choices)
    if not central:
        if value is not None:
            r.bad(
                p + "dataEndpointRecords",
                value,
                "only with privateDnsZoneIds: without the hub's zones each platform registers in zones of its own",
            )
        return None
    if value is None:
        r.problems.append(
            f"{p}dataEndpointRecords is missing while {p}privateDnsZoneIds is set: the data stack's accounts have "
            "one record each in the hub's zones, and the endpoint of every platform that registers them takes it "
            "over (and deletes it with itself). Set it to this-platform on exactly one platform of the data stack "
            "(it creates the data accounts' endpoints and their records) and to another-platform on the others (they "
            "reach the data through that platform's endpoints, routed through the hub): docs/private-access.md"
        )
        return None
    if value not in DATA_ENDPOINT_RECORDS:
        r.bad(p + "dataEndpointRecords", value, choices)
        return None
    return value


def _central_dns(
    r: Reader, a: dict, p: str, network: Network | None, resolver: str | None
) -> tuple[tuple[tuple[str, str], ...], tuple[str, ...]]:
    """Hub mode's `privateDnsZoneIds` (the hub's existing privatelink zones) and `dnsServers` (the hub's DNS).

    Why a hub usually needs them: "A virtual network cannot be linked to multiple zones with overlapping
    namespaces" (Azure's BadRequest, learn.microsoft.com/troubleshoot/azure/azure-kubernetes/error-codes/
    createorupdatevirtualnetworklinkfailed-error, "You link a private DNS zone that has the same name as the
    original one, but that's located in a different resource group or subscription"): a hub whose central
    zones are linked to it refuses the stack's own zones' hub links, and so does the hub of a second platform
    stack. And a VNet with custom DNS servers does not query the zones linked to it: "if a custom DNS server is
    defined in a VNet, then private DNS zones linked to that VNet are not automatically queried"
    (learn.microsoft.com/azure/dns/private-dns-privatednszone, "Private DNS zone resolution")."""
    ids = r.get(
        a,
        "privateDnsZoneIds",
        p,
        list,
        None,
        "a list of existing private DNS zones' resource ids (`az network private-dns zone list --query [].id`)",
    )
    servers_raw = r.get(a, "dnsServers", p, list, None, "the hub's DNS server addresses, e.g. [10.0.0.4]")
    zones: dict[str, str] = {}
    for item in ids or []:
        m = _ZONE_ID.match(str(item).strip())
        if not m:
            r.bad(
                p + "privateDnsZoneIds",
                item,
                "a private DNS zone's resource id /subscriptions/<id>/resourceGroups/<rg>/providers/"
                "Microsoft.Network/privateDnsZones/<zone name> (`az network private-dns zone show -g <rg> -n "
                "privatelink.blob.core.windows.net --query id -o tsv`)",
            )
            continue
        name = m.group(1).lower()
        if name in zones:
            r.bad(
                p + "privateDnsZoneIds",
                item,
                f"a second zone named {name} (the first: {zones[name]}); an endpoint registers in one zone of a "
                "name: list the one the hub's DNS resolves through",
            )
            continue
        zones[name] = str(item).strip()
    servers: list[str] = []
    for item in servers_raw or []:
        try:
            ip = ipaddress.IPv4Address(str(item).strip())
        except ValueError:
            r.bad(p + "dnsServers", item, "an IPv4 address such as 10.0.0.4 (the hub's DNS resolver or firewall)")
            continue
        if not ip.is_private:
            r.bad(
                p + "dnsServers",
                item,
                "a private address in the hub (its DNS private resolver's inbound endpoint "
                "or its firewall's DNS proxy); a public resolver cannot see private DNS zones",
            )
            continue
        if network is not None and ip in ipaddress.IPv4Network(network.vnet_cidr):
            r.bad(
                p + "dnsServers",
                item,
                f"lies inside this platform's network.vnetCidr {network.vnet_cidr}: the hub's DNS lives in the hub",
            )
            continue
        servers.append(str(ip))
    if ids is not None and not ids:
        r.bad(
            p + "privateDnsZoneIds", ids, "empty: list the hub's zones, or leave the key out to create the stack's own"
        )
    if zones and not servers_raw:
        r.problems.append(
            f"{p}dnsServers is missing while {p}privateDnsZoneIds is set: the stack then links no zone to its VNet, "
            "so the VNet's nodes resolve the private endpoints only through the hub's DNS (the DNS private "
            "resolver's inbound endpoint or the firewall's DNS proxy, in the hub VNet the zones are linked to): "
            f"set {p}dnsServers: [<its private IP>]"
        )
    if servers_raw is not None and ids is None:
        r.bad(
            p + "dnsServers",
            servers_raw,
            "only with privateDnsZoneIds: the stack's own zones are linked to its VNet, and a VNet with custom DNS "
            "servers does not query the zones linked to it (private-dns-privatednszone); remove dnsServers, or "
            "list the hub's zones in privateDnsZoneIds",
        )
    if zones and resolver is not None:
        r.bad(
            p + "resolverSubnetCidr",
            resolver,
            "a DNS private resolver in this VNet answers from the zones linked to this VNet, and with "
            "privateDnsZoneIds the stack links none: clients resolve through the hub's DNS; remove resolverSubnetCidr",
        )
    if ids is None:
        r.warnings.append(
            f"{p}mode hub without {p}privateDnsZoneIds: the stack creates its own privatelink zones and links them to "
            "the hub VNet; Azure refuses those links if the hub is already linked to zones of the same names (a "
            "landing zone's central DNS, or another platform stack on this hub: \"A virtual network cannot be "
            "linked to multiple zones with overlapping namespaces\"), and Azure Landing Zones' Deny-Private-DNS-Zones "
            "policy refuses the zones themselves: list the hub's zones in privateDnsZoneIds and its DNS in "
            "dnsServers (docs/private-access.md, \"Hub mode with central DNS\")"
        )
    return tuple(sorted(zones.items())), tuple(servers)


def central_zones_cover(
    r: Reader, access: AccessConfig, ws_public: bool, acr_public: bool, kv_public: bool, mount_nfs: bool
) -> None:
    """Every private endpoint the stack declares needs its zone among access.privateDnsZoneIds."""
    given = dict(access.private_dns_zones)
    needed = required_dns_zones(ws_public, acr_public, kv_public, mount_nfs)
    missing = [z for z in needed if z not in given]
    if missing:
        r.problems.append(
            "access.privateDnsZoneIds lacks "
            + ", ".join(f"{z} (for the {needed[z]} endpoints)" for z in missing)
            + ": the stack creates no zone of its own in that mode, so those endpoints would resolve to public "
            "addresses; add the hub's zone of each name (`az network private-dns zone list --query \"[?name=='"
            + missing[0]
            + "'].id\"`), or ask the hub's owners to create it"
        )


def _shutdown(r: Reader, a: dict, p: str) -> tuple[str | None, str]:
    """access.jumpHostShutdownTime ("HHmm", or "off") and access.jumpHostShutdownTimeZone (a Windows time zone id)."""
    time = r.get(a, "jumpHostShutdownTime", p, str, DEFAULT_SHUTDOWN_TIME, 'quote it: "1900" (HHmm, 24-hour) or "off"')
    zone = r.get(a, "jumpHostShutdownTimeZone", p, str, DEFAULT_SHUTDOWN_TIME_ZONE, 'e.g. "W. Europe Standard Time"')
    if time is not None and time.lower() == "off":
        time = None
    elif time is not None and not _SHUTDOWN_TIME.match(time):
        fix = time.replace(":", "") if re.match(r"^\d\d:\d\d$", time) else "1900"
        r.bad(
            p + "jumpHostShutdownTime",
            time,
            f'the time of day as Azure\'s auto-shutdown takes it, HHmm on a 24-hour clock: "{fix}" (or "off" for none)',
        )
    if zone is not None and ("/" in zone or not zone.strip()):
        r.bad(
            p + "jumpHostShutdownTimeZone",
            zone,
            'a Windows time zone id, as Azure\'s auto-shutdown takes it (not an IANA name such as Europe/Berlin): '
            '"UTC", "W. Europe Standard Time", "Eastern Standard Time"',
        )
    return time, zone or DEFAULT_SHUTDOWN_TIME_ZONE
