"""Private endpoints with their private DNS zones: how a service with public access off is reached from the VNet.

Two pieces, so that endpoints can share zones:

- `PrivateDnsZones`: one private DNS zone per zone name, each linked to the VNet, created once per stack.
  Azure resolves a name through at most one linked zone of a given name per VNet, so two endpoints that
  need `privatelink.blob.core.windows.net` (two storage accounts) must register in the same zone
  (https://learn.microsoft.com/azure/private-link/private-endpoint-dns, "Azure services DNS zone
  configuration"). `ensure(zone_name)` creates a zone the first time it is asked for and returns it after.
- `PrivateLink`: one private endpoint to one sub-resource (`group_id`) of one target, plus the endpoint's
  DNS zone group, which makes Azure write the endpoint's A records into the zones and keep them current.

The zone names per group id are Azure's documented ones for the public cloud (`ZONES`; same page).

With `existing` (hub mode's `privateDnsZoneIds`: a landing zone's central zones) `PrivateDnsZones` declares
nothing: `zone_id()` answers the given id and the endpoints' zone groups point there. "A virtual network cannot
be linked to multiple zones with overlapping namespaces" (Azure's BadRequest for a second zone of one name on a
VNet), so a stack on such a hub must not bring zones of its own.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pulumi
from pulumi_azure_native import network, privatedns

from .networkconfig import PRIVATE_DNS_ZONES

# group id -> the private DNS zones its endpoint needs (public Azure cloud); networkconfig.py holds the table, since
# the configuration also checks that hub mode's existing zones (privateDnsZoneIds) cover every endpoint before anything
# is declared (wayinconfig.central_zones_cover).
ZONES: dict[str, tuple[str, ...]] = PRIVATE_DNS_ZONES


def zone_slug(zone_name: str) -> str:
    return zone_name.replace(".", "-")


class PrivateDnsZones(pulumi.ComponentResource):
    """The stack's private DNS zones, each linked (without auto-registration) to the VNet.

    zones: {zone name: PrivateZone}; `ensure()` adds one on first use, so callers never create zones.
    """

    def __init__(
        self,
        name: str,
        resource_group: pulumi.Input[str],
        vnet_id: pulumi.Input[str],
        tags: dict,
        zone_names: Sequence[str] = (),
        opts: pulumi.ResourceOptions | None = None,
        existing: Mapping[str, str] | None = None,
    ):
        """existing: {zone name: resource id} of zones someone else owns (config access.privateDnsZoneIds)."""
        super().__init__("trainingplatform:privatelink:PrivateDnsZones", name, None, opts)
        self._name, self._resource_group, self._vnet_id, self._tags = name, resource_group, vnet_id, tags
        self.existing: dict[str, str] = dict(existing or {})
        self.zones: dict[str, privatedns.PrivateZone] = {}
        self.links: dict[str, privatedns.VirtualNetworkLink] = {}
        self.used: list[str] = []  # zone names asked for, in order (the existing ones included)
        for zone_name in zone_names:
            self.ensure(zone_name)
        self.register_outputs({})

    def zone_id(self, zone_name: str) -> pulumi.Input[str]:
        """The id of the zone of that name: the existing one given, else the stack's own (created on first use)."""
        if zone_name not in self.used:
            self.used.append(zone_name)
        if self.existing:
            if zone_name not in self.existing:
                # the configuration checks the list covers every endpoint first (wayinconfig.py); this is the program's own guard.
                raise ValueError(f"no existing private DNS zone {zone_name} given (access.privateDnsZoneIds)")
            return self.existing[zone_name]
        return self.ensure(zone_name).id

    def link_dependencies(self, zone_name: str) -> list[pulumi.Resource]:
        """What a zone group in that zone waits for: the zone's link to the VNet (none for an existing zone)."""
        return [self.links[zone_name]] if zone_name in self.links else []

    def ensure(self, zone_name: str) -> privatedns.PrivateZone:
        if self.existing:
            raise ValueError("the stack uses existing private DNS zones (access.privateDnsZoneIds): it creates none")
        if zone_name not in self.zones:
            child = pulumi.ResourceOptions(parent=self)
            slug = zone_slug(zone_name)
            zone = privatedns.PrivateZone(
                f"{self._name}-{slug}",
                private_zone_name=zone_name,
                resource_group_name=self._resource_group,
                location="Global",
                tags=self._tags,
                opts=child,
            )
            self.links[zone_name] = privatedns.VirtualNetworkLink(
                f"{self._name}-{slug}-link",
                private_zone_name=zone.name,
                resource_group_name=self._resource_group,
                location="Global",
                registration_enabled=False,
                virtual_network=privatedns.SubResourceArgs(id=self._vnet_id),
                tags=self._tags,
                opts=child,
            )
            self.zones[zone_name] = zone
        return self.zones[zone_name]


class PrivateLink(pulumi.ComponentResource):
    """A private endpoint to `target_id`'s `group_id` in `subnet_id`, registered in `dns`'s zones.

    zone_names defaults to Azure's zones for the group id (`ZONES`). Depend on `self.ready` (endpoint and
    DNS zone group) for anything that must resolve the target privately (compute clusters).
    """

    def __init__(
        self,
        name: str,
        resource_group: pulumi.Input[str],
        location: str,
        target_id: pulumi.Input[str],
        group_id: str,
        subnet_id: pulumi.Input[str],
        dns: PrivateDnsZones,
        tags: dict,
        zone_names: Sequence[str] | None = None,
        opts: pulumi.ResourceOptions | None = None,
    ):
        super().__init__("trainingplatform:privatelink:PrivateLink", name, None, opts)
        if zone_names is None:
            if group_id not in ZONES:
                raise ValueError(
                    f"no private DNS zone known for group id {group_id!r}: pass zone_names "
                    f"(known: {', '.join(sorted(ZONES))})"
                )
            zone_names = ZONES[group_id]
        child = pulumi.ResourceOptions(parent=self)
        self.endpoint = network.PrivateEndpoint(
            f"{name}-endpoint",
            resource_group_name=resource_group,
            location=location,
            subnet=network.SubnetArgs(id=subnet_id),
            private_link_service_connections=[
                network.PrivateLinkServiceConnectionArgs(
                    name=group_id, private_link_service_id=target_id, group_ids=[group_id]
                )
            ],
            tags=tags,
            opts=child,
        )
        zone_ids = [dns.zone_id(z) for z in zone_names]
        # Links first: a record in a zone the VNet does not see yet resolves to the public address.
        self.zone_group = network.PrivateDnsZoneGroup(
            f"{name}-zone-group",
            private_endpoint_name=self.endpoint.name,
            resource_group_name=resource_group,
            private_dns_zone_group_name="default",
            private_dns_zone_configs=[
                network.PrivateDnsZoneConfigArgs(name=zone_slug(z), private_dns_zone_id=zone_id)
                for z, zone_id in zip(zone_names, zone_ids)
            ],
            opts=pulumi.ResourceOptions(
                parent=self, depends_on=[d for z in zone_names for d in dns.link_dependencies(z)]
            ),
        )
        self.ready: list[pulumi.Resource] = [self.endpoint, self.zone_group]
        self.register_outputs({"endpoint_id": self.endpoint.id})
