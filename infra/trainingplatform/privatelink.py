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
"""

from __future__ import annotations

from collections.abc import Sequence

import pulumi
from pulumi_azure_native import network, privatedns

# group id -> the private DNS zones its endpoint needs (public Azure cloud).
# https://learn.microsoft.com/azure/private-link/private-endpoint-dns#azure-services-dns-zone-configuration
ZONES: dict[str, tuple[str, ...]] = {
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
    ):
        super().__init__("trainingplatform:privatelink:PrivateDnsZones", name, None, opts)
        self._name, self._resource_group, self._vnet_id, self._tags = name, resource_group, vnet_id, tags
        self.zones: dict[str, privatedns.PrivateZone] = {}
        self.links: dict[str, privatedns.VirtualNetworkLink] = {}
        for zone_name in zone_names:
            self.ensure(zone_name)
        self.register_outputs({})

    def ensure(self, zone_name: str) -> privatedns.PrivateZone:
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
        zones = [dns.ensure(z) for z in zone_names]
        # Links first: a record in a zone the VNet does not see yet resolves to the public address.
        self.zone_group = network.PrivateDnsZoneGroup(
            f"{name}-zone-group",
            private_endpoint_name=self.endpoint.name,
            resource_group_name=resource_group,
            private_dns_zone_group_name="default",
            private_dns_zone_configs=[
                network.PrivateDnsZoneConfigArgs(name=zone_slug(z), private_dns_zone_id=zone.id)
                for z, zone in zip(zone_names, zones)
            ],
            opts=pulumi.ResourceOptions(parent=self, depends_on=[dns.links[z] for z in zone_names]),
        )
        self.ready: list[pulumi.Resource] = [self.endpoint, self.zone_group]
        self.register_outputs({"endpoint_id": self.endpoint.id})
