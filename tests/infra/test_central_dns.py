"""Issue 28, item 1: hub mode on a hub that already has central private DNS zones (a landing zone's).

Azure refuses a second zone of one name on a VNet: "A virtual network cannot be linked to multiple zones with
overlapping namespaces. You tried to link virtual network with '<zone>' and '<zone>' zones." (Azure's BadRequest,
as Microsoft's troubleshooting article CreateOrUpdateVirtualNetworkLinkFailed quotes it; cause: "You link a private
DNS zone that has the same name as the original one, but that's located in a different resource group or
subscription"). A hub whose central `privatelink.*` zones are linked to it therefore refuses every hub link of a
stack that brings its own zones. With `access.privateDnsZoneIds` the stack creates no zone and no link and points
every private endpoint's DNS zone group at the hub's zones; its VNet asks the hub's DNS (`access.dnsServers`),
because Azure's own DNS answers only from zones linked to the asking VNet ("DNS resolution against a private DNS
zone works only from virtual networks that are linked to it", learn.microsoft.com/azure/dns/private-dns-privatednszone).
"""

import copy

import pytest
import training_policies

from trainingplatform import config, mocked, networkconfig, privatelink

HUB = "/subscriptions/33333333-3333-3333-3333-333333333333/resourceGroups/hub-rg/providers/Microsoft.Network/virtualNetworks/hub-vnet"
DNS_RG = "/subscriptions/33333333-3333-3333-3333-333333333333/resourceGroups/dns-rg/providers/Microsoft.Network/privateDnsZones/"
ALL_ZONES = sorted({z for zones in networkconfig.PRIVATE_DNS_ZONES.values() for z in zones})
HUB_DNS = "10.0.0.4"


def _hub(zones=ALL_ZONES, servers=(HUB_DNS,), records="this-platform", **extra):
    access = {"mode": "hub", "hubVnetId": HUB, **extra}
    if zones is not None:
        access["privateDnsZoneIds"] = [DNS_RG + z for z in zones]
        if records is not None:
            access["dataEndpointRecords"] = records
    if servers is not None:
        access["dnsServers"] = list(servers)
    return access


def _run(prod_raw, prod_data_out, access, **changes):
    raw, location = copy.deepcopy(prod_raw)
    raw.update(changes, access=access)
    return mocked.run(raw, "prod", location, data_outputs=prod_data_out)


@pytest.fixture(scope="module")
def central(prod_raw, prod_data_out):
    return _run(prod_raw, prod_data_out, _hub())


def _links_by_vnet(mocks):
    """{VNet id: [zone name of each link]}: what Azure checks for overlapping namespaces."""
    out = {}
    for link in mocks.of_type("privatedns:VirtualNetworkLink"):
        zone = next(
            z.inputs["privateZoneName"]
            for z in mocks.of_type("PrivateZone")
            if z.inputs["privateZoneName"] == link.inputs["privateZoneName"]
        )
        out.setdefault(link.inputs["virtualNetwork"]["id"], []).append(zone)
    return out


def _zone_groups(mocks):
    """{endpoint logical name: (group id, [zone name, ...])}."""
    endpoints = {r.id: r for r in mocks.of_type("PrivateEndpoint")}
    by_name = {e.inputs.get("privateEndpointName", e.name): e for e in endpoints.values()}
    out = {}
    for group in mocks.of_type("PrivateDnsZoneGroup"):
        endpoint = by_name[group.inputs["privateEndpointName"]]
        group_id = endpoint.inputs["privateLinkServiceConnections"][0]["groupIds"][0]
        out[endpoint.name] = (
            group_id,
            [c["privateDnsZoneId"] for c in group.inputs["privateDnsZoneConfigs"]],
        )
    return out


def test_with_the_hubs_zones_the_stack_creates_no_zone_and_no_link(central):
    mocks, outputs = central
    # Every link the stack would make to the hub meets a zone of the same name linked there already.
    assert not mocks.of_type("PrivateZone") and not mocks.of_type("privatedns:VirtualNetworkLink")
    # Every endpoint's zone group points at the hub's zone of each name Azure documents for its group id.
    groups = _zone_groups(mocks)
    assert groups and len(groups) == len(mocks.of_type("PrivateEndpoint"))
    for endpoint, (group_id, zone_ids) in groups.items():
        assert zone_ids == [DNS_RG + z for z in privatelink.ZONES[group_id]], endpoint
    # The VNet asks the hub's DNS, which resolves through the zones' links to the hub.
    vnet = next(r for r in mocks.of_type("VirtualNetwork") if r.name == "net-vnet").inputs
    assert vnet["dhcpOptions"]["dnsServers"] == [HUB_DNS]
    assert outputs["way_in"]["dns_servers"] == [HUB_DNS]
    # Still peered both ways.
    assert {p.name for p in mocks.of_type("VirtualNetworkPeering")} == {"wayin-to-hub", "wayin-from-hub"}


@pytest.mark.parametrize("mode", ["own zones", "hub zones"])
def test_no_vnet_is_ever_linked_to_two_zones_of_one_name(prod_raw, prod_data_out, central, mode):
    # The constraint itself, over every link the stack declares: per VNet, one zone per name; and with the hub's
    # zones none at all of a name the hub is already linked to.
    mocks = central[0] if mode == "hub zones" else _run(prod_raw, prod_data_out, _hub(None, None))[0]
    for vnet, names in _links_by_vnet(mocks).items():
        assert len(names) == len(set(names)), vnet
        if mode == "hub zones":
            assert not set(names) & set(ALL_ZONES), vnet
    # Without the hub's zones the default still links the stack's own to the hub (a hub without central DNS).
    if mode == "own zones":
        assert HUB in _links_by_vnet(mocks)
        vnet = next(r for r in mocks.of_type("VirtualNetwork") if r.name == "net-vnet").inputs
        assert not vnet.get("dhcpOptions"), "Azure's DNS: it answers from the zones linked to the VNet"


@pytest.mark.parametrize(
    "changes",
    [
        {},
        {"keyVaultPublicAccess": True, "mountNfs": False},
        {"workspacePublicAccess": True, "mountNfs": False, "keyVaultPublicAccess": True},
        {"workspacePublicAccess": True, "keyVaultPublicAccess": True},
    ],
)
def test_the_zones_config_requires_are_exactly_those_the_endpoints_use(prod_raw, prod_data_out, changes):
    # networkconfig.required_dns_zones decides, before anything is declared, which of the hub's zones must be listed; it
    # must name every zone an endpoint registers in (else the program fails mid-`up`) and no other (else a hub
    # without, say, the vault's zone is refused for a vault that is public).
    mocks, _ = _run(prod_raw, prod_data_out, _hub(), **changes)
    used = {z.rsplit("/", 1)[1] for _, ids in _zone_groups(mocks).values() for z in ids}
    raw = dict(copy.deepcopy(prod_raw[0]), **changes)
    cfg = config.load(dict(raw, access=_hub()), "prod", prod_raw[1], mocked.SUBSCRIPTION)
    assert used == set(
        networkconfig.required_dns_zones(
            cfg.workspace_public_access, cfg.registry_public_access, cfg.key_vault_public_access, cfg.mount_nfs
        )
    )


@pytest.mark.parametrize(
    "access,message",
    [
        (
            _hub([z for z in ALL_ZONES if z != "privatelink.azurecr.io"]),
            "access.privateDnsZoneIds lacks privatelink.azurecr.io (for the registry endpoints)",
        ),
        (
            dict(_hub(), privateDnsZoneIds=["privatelink.blob.core.windows.net"]),
            "access.privateDnsZoneIds = 'privatelink.blob.core.windows.net': a private DNS zone's resource id",
        ),
        (
            dict(
                _hub(),
                privateDnsZoneIds=[DNS_RG + z for z in ALL_ZONES] + [DNS_RG.replace("dns-rg", "other") + ALL_ZONES[0]],
            ),
            "a second zone named",
        ),
        (_hub(servers=None), "access.dnsServers is missing while access.privateDnsZoneIds is set"),
        (_hub(zones=None), "access.dnsServers = ['10.0.0.4']: only with privateDnsZoneIds"),
        (
            _hub(resolverSubnetCidr="10.41.18.0/28"),
            "access.resolverSubnetCidr = '10.41.18.0/28': a DNS private resolver",
        ),
        (_hub(servers=["8.8.8.8"]), "access.dnsServers = '8.8.8.8': a private address in the hub"),
        (_hub(records=None), "access.dataEndpointRecords is missing while access.privateDnsZoneIds is set"),
        (_hub(records="both"), "access.dataEndpointRecords = 'both': this-platform or another-platform"),
        (
            dict(_hub(None, None), dataEndpointRecords="this-platform"),
            "access.dataEndpointRecords = 'this-platform': only with privateDnsZoneIds",
        ),
        (
            _hub(servers=["10.41.16.4"]),
            "access.dnsServers = '10.41.16.4': lies inside this platform's network.vnetCidr",
        ),
        (
            {
                "mode": "bastion",
                "bastionSubnetCidr": "10.41.17.0/26",
                "jumpHostSubnetCidr": "10.41.17.64/28",
                "privateDnsZoneIds": [DNS_RG + ALL_ZONES[0]],
            },
            "access.privateDnsZoneIds = ['/subscriptions/3333",
        ),
    ],
)
def test_hub_settings_that_cannot_work_are_refused_before_anything_is_declared(
    prod_raw, prod_data_out, access, message
):
    raw, location = copy.deepcopy(prod_raw)
    raw["access"] = access
    mocks = mocked.RecordingMocks()
    with pytest.raises(config.ConfigError) as e:
        mocked.run(raw, "prod", location, mocks, data_outputs=prod_data_out)
    assert message in str(e.value)
    assert mocks.resources == []


def test_hub_mode_with_its_own_zones_warns_about_central_dns(prod_raw):
    cfg = config.load(
        dict(copy.deepcopy(prod_raw[0]), access=_hub(None, None)), "prod", "westeurope", mocked.SUBSCRIPTION
    )
    assert any("overlapping namespaces" in w and "privateDnsZoneIds" in w for w in cfg.warnings)
    central = config.load(dict(copy.deepcopy(prod_raw[0]), access=_hub()), "prod", "westeurope", mocked.SUBSCRIPTION)
    assert not any("overlapping namespaces" in w for w in central.warnings)


def test_the_policy_sees_the_workspace_zones_by_id(central):
    # The policy pack's check that no-public-IP clusters have the workspace's zones must accept the hub's zones.
    resources = [(r.type, r.inputs) for r in central[0].resources]
    assert training_policies.check_workspace_endpoint(resources) is None
    without = [(t, p) for t, p in resources if not (t == training_policies.ZONE_GROUP and "notebooks" in str(p))]
    assert "privatelink.notebooks.azure.net" in (training_policies.check_workspace_endpoint(without) or "")


def test_only_one_platform_of_a_data_stack_writes_its_accounts_into_the_hubs_zones(prod_raw, prod_data_out, central):
    """Issue 43, item 12: the data accounts' names are the same for every platform of one data stack, and a record
    in the hub's zone holds one address (a second endpoint's zone group takes it over, and deleting either endpoint
    deletes it). The platform set to another-platform declares no endpoint of the data accounts, so no record of
    theirs; its own (workspace storage, registry) it still registers."""

    def endpoints(mocks):
        return {r.name for r in mocks.of_type("network:PrivateEndpoint")}

    owner = endpoints(central[0])
    other_mocks, _ = _run(prod_raw, prod_data_out, _hub(records="another-platform"))
    other = endpoints(other_mocks)
    data = {n for n in owner if n.startswith(("data-blob", "logs-blob", "nfs"))}
    assert data and not {n for n in other if n.startswith(("data-blob", "logs-blob", "nfs"))}, (owner, other)
    assert owner - data == other, "everything else the same"
    zone_groups = {r.name for r in other_mocks.of_type("PrivateDnsZoneGroup")}
    assert zone_groups and not any(n.startswith(("data-blob", "logs-blob", "nfs")) for n in zone_groups)
