"""Preflight in hub mode and for the data stack (issue 28, items 2 and 3), against a fake Azure at the HTTP adapter
(tests/fake_arm.py). The answers are the REST reference's documented shapes:

- Virtual Networks - Get (Microsoft.Network 2024-05-01): `properties.addressSpace.addressPrefixes` and
  `properties.virtualNetworkPeerings[]`, each peering's `properties.remoteAddressSpace.addressPrefixes` and
  `properties.remoteVirtualNetwork.id` (as Virtual Network Peerings - Get/List show a peering).
- Permissions - List For Resource / List For Resource Group (Microsoft.Authorization 2022-04-01): Permission =
  "actions", "notActions", "dataActions", "notDataActions" ("Allowed actions.", "Denied actions.", ...): no
  condition, which is why a conditional role-assignment right is looked up in the caller's role assignments.
- Role Assignments - List For Scope (2022-04-01) with `$filter=assignedTo('{objectId}')`, each with
  `properties.condition` and `conditionVersion` ("Currently the only accepted value is '2.0'"); Role
  Definitions - Get By Id: `properties.permissions`.
- Private Zones - Get (privateDnsZones 2020-06-01).

Errors come back as ARM error bodies and azure-core raises its own types (ResourceNotFoundError for 404,
HttpResponseError for 403), as the generated management SDKs do."""

from __future__ import annotations

import io
import pathlib

import fake_arm
import pytest
import yaml
from azure.core.exceptions import HttpResponseError, ResourceNotFoundError
from test_preflight import ARM, CONTRIBUTOR, ML, ROOT, SUB, lines, usages

from azurecheck import hub, preflight, roles, stackfile
from azurecheck.arm import NETWORK_API, Arm
from trainingplatform import naming, networkconfig

HUB_SUB = "0c0c0000-aaaa-bbbb-cccc-ddddeeeeffff"  # a landing zone's connectivity subscription
HUB_RG = "rg-connectivity"
HUB = f"/subscriptions/{HUB_SUB}/resourceGroups/{HUB_RG}/providers/Microsoft.Network/virtualNetworks/vnet-hub"
HUB_RE = HUB.replace(".", r"\.")
ZONES_RG = f"/subscriptions/{HUB_SUB}/resourceGroups/rg-dns/providers/Microsoft.Network/privateDnsZones"
# Every zone the prod profile's private endpoints need (the program's own list), as a landing zone holds them.
ZONE_NAMES = sorted(networkconfig.required_dns_zones(False, False, False, True))
ZONE_IDS = [f"{ZONES_RG}/{z}" for z in ZONE_NAMES]
OTHER_SPOKE = f"/subscriptions/{HUB_SUB}/resourceGroups/rg-spoke-a/providers/Microsoft.Network/virtualNetworks/spoke-a"
# Network Contributor's actions; Private DNS Zone Contributor's
NETWORK_CONTRIBUTOR = fake_arm.permissions(["Microsoft.Network/*", "*/read"])
ZONE_CONTRIBUTOR = fake_arm.permissions(["Microsoft.Network/privateDnsZones/*", "*/read"])
READER = fake_arm.permissions(["*/read"])
# Role Based Access Control Administrator (f58310d9-a9f6-439a-9e8d-f62e7b41a168): its actions
RBAC_ADMIN_ROLE = "f58310d9-a9f6-439a-9e8d-f62e7b41a168"
RBAC_ADMIN = [
    "Microsoft.Authorization/roleAssignments/write",
    "Microsoft.Authorization/roleAssignments/delete",
    "*/read",
]
CONTRIBUTOR_ROLE = "b24988ac-6180-42a0-ab88-20f7382dd24c"
UAA_ROLE = "18d7d88d-d35e-4fb5-a5c3-7773c4a72d9d"
# The "Constrain roles" delegation condition as learn.microsoft.com/azure/role-based-access-control/
# delegate-role-assignments-examples writes it, here allowing the two Storage Blob Data roles only.
CONSTRAIN_ROLES = (
    "((!(ActionMatches{'Microsoft.Authorization/roleAssignments/write'})) OR "
    "(@Request[Microsoft.Authorization/roleAssignments:RoleDefinitionId] ForAnyOfAnyValues:GuidEquals "
    "{ba92f5b4-2d11-453d-a403-e96b0029c9fe, 2a2b9908-6ea1-4ae2-8e65-a410df84e7d1})) AND "
    "((!(ActionMatches{'Microsoft.Authorization/roleAssignments/delete'})) OR "
    "(@Resource[Microsoft.Authorization/roleAssignments:RoleDefinitionId] ForAnyOfAnyValues:GuidEquals "
    "{ba92f5b4-2d11-453d-a403-e96b0029c9fe, 2a2b9908-6ea1-4ae2-8e65-a410df84e7d1}))"
)


def hub_root(tmp_path: pathlib.Path, central: bool = True, vnet_cidr: str = "10.41.0.0/16") -> pathlib.Path:
    """Pulumi.prod.yaml as committed, pinned to SUB, with the way in switched to hub mode (read by the program's
    own config.load through stackfile.read), and the data stack's file pinned too."""
    data = yaml.safe_load((ROOT / "Pulumi.prod.yaml").read_text())
    c = data["config"]
    c["azure-native:subscriptionId"] = SUB
    c["azure-horovod-training:access"] = {"mode": "hub", "hubVnetId": HUB}
    if central:
        c["azure-horovod-training:access"] |= {
            "privateDnsZoneIds": ZONE_IDS,
            "dnsServers": ["10.0.0.4"],
            "dataEndpointRecords": "this-platform",
        }
    c["azure-horovod-training:network"]["vnetCidr"] = vnet_cidr
    (tmp_path / "Pulumi.prod.yaml").write_text(yaml.safe_dump(data))
    (tmp_path / "infra" / "data-stack").mkdir(parents=True)
    for stack in ("dev", "prod"):
        d = yaml.safe_load((ROOT / "infra" / "data-stack" / f"Pulumi.{stack}.yaml").read_text())
        d["config"]["azure-native:subscriptionId"] = SUB
        (tmp_path / "infra" / "data-stack" / f"Pulumi.{stack}.yaml").write_text(yaml.safe_dump(d))
    return tmp_path


def own_vnet() -> str:
    """The platform's VNet as a re-run after `up` sees it from the hub: in the stack's own resource group."""
    return f"/subscriptions/{SUB}/resourceGroups/{naming.dashed('hvd', 'prod', 'rg')}/providers/Microsoft.Network/virtualNetworks/hvd-prod-vnet1234"


@pytest.fixture
def hub_azure(azure):
    """A landing-zone hub 10.0.0.0/16 peered with one other spoke (10.1.0.0/16) and, from an earlier `up`, with
    this stack's own VNet; the deployer has Network Contributor on the hub and Private DNS Zone Contributor on
    the zones."""
    peerings = [
        fake_arm.vnet_peering(HUB, "to-spoke-a", OTHER_SPOKE, ["10.1.0.0/16"]),
        fake_arm.vnet_peering(HUB, "to-hvd-prod-vnet1234", own_vnet(), ["10.41.0.0/16"]),
    ]
    azure.on("GET", rf"{ARM}{HUB_RE}", (200, fake_arm.virtual_network(HUB, ["10.0.0.0/16"], peerings), {}))
    azure.on("GET", rf"{ARM}{HUB_RE}/providers/Microsoft\.Authorization/permissions", (200, NETWORK_CONTRIBUTOR, {}))
    azure.on("GET", rf"{ML}/usages", (200, usages(nd_dedicated=400), {}))  # prod's Dedicated gpu-ib fits
    zones = ZONES_RG.replace(".", r"\.")
    azure.on("GET", rf"{ARM}{zones}/([^/]+)", lambda r, m: (200, fake_arm.private_zone(f"{ZONES_RG}/{m[1]}"), {}))
    azure.on("GET", rf"{ARM}{zones}/[^/]+/providers/Microsoft\.Authorization/permissions", (200, ZONE_CONTRIBUTOR, {}))
    return azure


def run(root: pathlib.Path, stack: str | None = "prod", data: str | None = None) -> tuple[int, str]:
    out = io.StringIO()
    platform = stackfile.read(stack, root) if stack else None
    data_stack = stackfile.read_data(data, root) if data else None
    code = preflight.run(
        platform, fake_arm.Credential(), current=(SUB, "$ARM_SUBSCRIPTION_ID"), out=out, data=data_stack
    )
    return code, out.getvalue()


# ---- item 2: the hub VNet -----------------------------------------------------------------------------------


def test_hub_with_room_and_rights_passes(hub_azure, tmp_path):
    code, out = run(hub_root(tmp_path))
    print(out)
    assert code == 0, out
    assert "[  ok] hub network: network.vnetCidr 10.41.0.0/16 overlaps neither" in out
    assert "10.0.0.0/16, 10.1.0.0/16)" in out  # this stack's own peering (10.41.0.0/16) is not held against it
    assert f"[  ok] hub rights: {hub.PEERING_WRITE}, {hub.PEER} allowed on {HUB}" in out
    assert hub.VNET_JOIN not in lines(out, "hub rights")  # central zones: the stack links nothing to the hub
    for name in ZONE_NAMES:
        assert f"[  ok] hub zone {name}: {hub.ZONE_JOIN} allowed on {ZONES_RG}/{name}" in out


def test_vnet_cidr_inside_the_hubs_address_space_fails_with_a_free_range(hub_azure, tmp_path):
    # the prod subnets would have to move with vnetCidr, so the hub's address space grows over it instead
    hub_azure.on("GET", rf"{ARM}{HUB_RE}", (200, fake_arm.virtual_network(HUB, ["10.0.0.0/16", "10.40.0.0/15"]), {}))
    code, out = run(hub_root(tmp_path))
    block = lines(out, "hub network")
    print(block)
    assert code == 1 and block.startswith("[FAIL]"), out
    assert "network.vnetCidr 10.41.0.0/16 overlaps the hub's address space 10.40.0.0/15" in block
    assert "Azure refuses a peering between overlapping address spaces" in block
    assert "e.g. 10.1.0.0/16," in block  # 10.0/16 and 10.40/15 are taken; the first free /16 is suggested


def test_vnet_cidr_overlapping_another_spokes_peering_fails_naming_it(hub_azure, tmp_path):
    peerings = [fake_arm.vnet_peering(HUB, "to-spoke-a", OTHER_SPOKE, ["10.41.128.0/17", "fd00:41::/48"])]
    hub_azure.on("GET", rf"{ARM}{HUB_RE}", (200, fake_arm.virtual_network(HUB, ["10.0.0.0/16"], peerings), {}))
    code, out = run(hub_root(tmp_path))
    block = lines(out, "hub network")
    assert code == 1 and block.count("[FAIL]") == 1, out  # the IPv6 prefix is compared with nothing
    assert "overlaps peering to-spoke-a (to spoke-a) 10.41.128.0/17" in block


def test_address_ranges_read_the_documented_fields_and_skip_the_stacks_own_peering():
    vnet = fake_arm.virtual_network(
        HUB,
        ["10.0.0.0/16"],
        [
            fake_arm.vnet_peering(HUB, "a", OTHER_SPOKE, ["10.1.0.0/16"]),
            fake_arm.vnet_peering(HUB, "mine", own_vnet(), ["10.41.0.0/16"]),
        ],
    )
    assert hub.address_ranges(vnet, SUB, naming.dashed("hvd", "prod", "rg")) == [
        ("the hub's address space", "10.0.0.0/16"),
        ("peering a (to spoke-a)", "10.1.0.0/16"),
    ]


def test_reader_on_the_hub_fails_for_both_sides_of_the_peering(hub_azure, tmp_path):
    hub_azure.on("GET", rf"{ARM}{HUB_RE}/providers/Microsoft\.Authorization/permissions", (200, READER, {}))
    code, out = run(hub_root(tmp_path))
    block = lines(out, "hub rights")
    print(block)
    assert code == 1
    assert f"[FAIL] hub rights: you may not {hub.PEERING_WRITE} on {HUB}: the stack creates the hub's side" in block
    assert f"[FAIL] hub rights: you may not {hub.PEER} on {HUB}: this VNet's side of the peering" in block
    assert f'--role "Network Contributor" --scope {HUB}' in block


def test_hub_mode_with_own_zones_needs_join_on_the_hub(hub_azure, tmp_path):
    # Network Contributor minus joining the VNet: peering allowed, linking the stack's own zones to the hub not
    hub_azure.on(
        "GET",
        rf"{ARM}{HUB_RE}/providers/Microsoft\.Authorization/permissions",
        (200, fake_arm.permissions(["Microsoft.Network/*"], [hub.VNET_JOIN]), {}),
    )
    code, out = run(hub_root(tmp_path, central=False))
    block = lines(out, "hub rights")
    assert code == 1 and block.count("[FAIL]") == 1, out
    assert f"you may not {hub.VNET_JOIN} on {HUB}: without access.privateDnsZoneIds the stack links its own" in block
    assert "hub zone" not in out


def test_hub_vnet_not_found_names_the_setting(hub_azure, tmp_path):
    answer = fake_arm.arm_error(
        404,
        "ResourceNotFound",
        f"The Resource 'Microsoft.Network/virtualNetworks/vnet-hub' under resource group '{HUB_RG}' was not found.",
    )
    hub_azure.on("GET", rf"{ARM}{HUB_RE}", answer)
    with pytest.raises(ResourceNotFoundError):  # what azure-core raises at this boundary
        Arm(fake_arm.Credential()).get(HUB, NETWORK_API)
    code, out = run(hub_root(tmp_path))
    block = lines(out, "hub network")
    assert code == 1 and "Azure answered 404 ResourceNotFound" in block and "(access.hubVnetId)" in block
    assert "set access.hubVnetId to the hub's id" in block


def test_hub_vnet_forbidden_asks_the_hubs_owners(hub_azure, tmp_path):
    hub_azure.on(
        "GET",
        rf"{ARM}{HUB_RE}",
        fake_arm.arm_error(
            403,
            "AuthorizationFailed",
            "The client 'someone@example.com' with object id '33333333' does not have authorization to perform "
            f"action 'Microsoft.Network/virtualNetworks/read' over scope '{HUB}' or the scope is invalid.",
        ),
    )
    with pytest.raises(HttpResponseError) as e:
        Arm(fake_arm.Credential()).get(HUB, NETWORK_API)
    assert e.value.status_code == 403
    code, out = run(hub_root(tmp_path))
    block = lines(out, "hub network")
    assert code == 1 and "Azure refused it (403 AuthorizationFailed)" in block
    assert f"ask the hub's owners for Network Contributor on {HUB}" in block


def test_missing_central_zone_fails_naming_it(hub_azure, tmp_path):
    name = ZONE_NAMES[0]
    zone = f"{ZONES_RG}/{name}".replace(".", r"\.")
    hub_azure.on(
        "GET",
        rf"{ARM}{zone}",
        fake_arm.arm_error(
            404, "ResourceNotFound", f"The Resource 'Microsoft.Network/privateDnsZones/{name}' was not found."
        ),
    )
    code, out = run(hub_root(tmp_path))
    block = lines(out, f"hub zone {name}")
    assert code == 1 and block.startswith("[FAIL]") and ": no such zone" in block, out
    assert f"az network private-dns zone list --query \"[?name=='{name}'].id\"" in block


def test_central_zone_without_join_fails(hub_azure, tmp_path):
    name = ZONE_NAMES[-1]
    zone = f"{ZONES_RG}/{name}".replace(".", r"\.")
    hub_azure.on("GET", rf"{ARM}{zone}/providers/Microsoft\.Authorization/permissions", (200, READER, {}))
    code, out = run(hub_root(tmp_path))
    block = lines(out, f"hub zone {name}")
    assert code == 1 and f"[FAIL] hub zone {name}: you may not {hub.ZONE_JOIN} on {ZONES_RG}/{name}" in block
    assert '"Private DNS Zone Contributor"' in block
    assert all(lines(out, f"hub zone {z}").startswith("[  ok]") for z in ZONE_NAMES[:-1])


def test_no_hub_checks_outside_hub_mode(azure):
    from test_preflight import dev_stack

    assert hub.check(Arm(fake_arm.Credential()), dev_stack().settings) == []


# ---- item 3: the data stack's rights, and conditions the Permissions API does not show -------------------------


def test_data_stack_with_contributor_only_fails_on_role_assignment_write(azure, tmp_path):
    azure.on(
        "GET", rf"{ARM}/subscriptions/{SUB}/providers/Microsoft\.Authorization/permissions", (200, CONTRIBUTOR, {})
    )
    code, out = run(hub_root(tmp_path), stack=None, data="dev")
    block = lines(out, "data permissions")
    print(out)
    assert code == 1 and out.startswith("preflight for data stack dev (infra/data-stack)"), out
    assert (
        f"[FAIL] data permissions: you may not Microsoft.Authorization/roleAssignments/write on /subscriptions/{SUB}"
        in block
    )
    assert "Storage Blob Data Contributor and Storage Blob Data Reader" in block
    assert "[  ok] data permissions: Microsoft.Resources/subscriptions/resourceGroups/write allowed" in block
    assert "[  ok] provider Microsoft.Storage: registered" in out  # no platform stack: providers checked here


def test_data_stack_permissions_read_at_its_own_group(azure, tmp_path):
    group = naming.dashed("hvd", "dev", "data-rg")
    rg = rf"{ARM}/subscriptions/{SUB}/resourceGroups/{group}/providers/Microsoft\.Authorization/permissions"
    azure.on("GET", rg, (200, CONTRIBUTOR, {}))
    code, out = run(hub_root(tmp_path), stack=None, data="dev")
    assert code == 1 and f"roleAssignments/write on /subscriptions/{SUB}/resourceGroups/{group};" in out


def test_both_stacks_in_one_run(hub_azure, tmp_path):
    code, out = run(hub_root(tmp_path), stack="prod", data="prod")
    assert code == 0, out
    assert "preflight for data stack prod (infra/data-stack)" in out
    assert "data subscription" not in out and out.count("provider Microsoft.Storage") == 1  # the same subscription
    assert "[  ok] data users:" in out


def conditional_rbac_admin(azure, *also):
    """The deployer: Contributor and Role Based Access Control Administrator, the latter with a "Constrain roles"
    condition; the Permissions API shows both roles' actions and nothing of the condition."""
    me = fake_arm.USER["oid"]
    scope = f"/subscriptions/{SUB}"
    azure.on(
        "GET",
        rf"{ARM}/subscriptions/{SUB}/providers/Microsoft\.Authorization/permissions",
        (200, {"value": CONTRIBUTOR["value"] + fake_arm.permissions(RBAC_ADMIN)["value"]}, {}),
    )
    assignments = [
        fake_arm.role_assignment(scope, CONTRIBUTOR_ROLE, me),
        fake_arm.role_assignment(scope, RBAC_ADMIN_ROLE, me, CONSTRAIN_ROLES),
        *also,
    ]
    azure.on(
        "GET",
        rf"{ARM}/subscriptions/{SUB}(/resourceGroups/[^/]+)?/providers/Microsoft\.Authorization/roleAssignments",
        lambda r, m: (
            (200, {"value": assignments}, {}) if f"assignedTo('{me}')" in requests_unquote(r.url) else (400, {}, {})
        ),
    )
    defs = rf"{ARM}/subscriptions/{SUB}/providers/Microsoft\.Authorization/roleDefinitions/"
    contributor = fake_arm.role_definition(
        SUB, CONTRIBUTOR_ROLE, "Contributor", ["*"], CONTRIBUTOR["value"][0]["notActions"]
    )
    azure.on("GET", defs + CONTRIBUTOR_ROLE, (200, contributor, {}))
    uaa = fake_arm.role_definition(SUB, UAA_ROLE, "User Access Administrator", ["*/read", "Microsoft.Authorization/*"])
    azure.on("GET", defs + UAA_ROLE, (200, uaa, {}))


def requests_unquote(url: str) -> str:
    from urllib.parse import unquote

    return unquote(url)


def test_conditional_role_assignment_right_is_warned_about(azure, tmp_path):
    # assignedTo lists assignments below the scope too: User Access Administrator on another group does not count
    elsewhere = fake_arm.role_assignment(
        f"/subscriptions/{SUB}/resourceGroups/elsewhere", UAA_ROLE, fake_arm.USER["oid"]
    )
    conditional_rbac_admin(azure, elsewhere)
    code, out = run(hub_root(tmp_path), stack=None, data="dev")
    block = lines(out, "data permissions")
    print(block)
    assert code == 0, out  # a warning: whether the condition allows the stack's roles is not knowable here
    assert "[  ok] data permissions: Microsoft.Authorization/roleAssignments/write allowed" in block
    assert (
        f"[WARN] data permissions: your Microsoft.Authorization/roleAssignments/write on /subscriptions/{SUB} comes only with a condition"
        in block
    )
    assert "ActionMatches{'Microsoft.Authorization/roleAssignments/write'}" in block
    assert "the Permissions API does not show conditions" in block
    assert "Storage Blob Data Contributor, Storage Blob Data Reader (to User, Group and ServicePrincipal" in block


def test_an_unconditioned_role_assignment_right_makes_the_condition_moot(azure, tmp_path):
    conditional_rbac_admin(azure, fake_arm.role_assignment(f"/subscriptions/{SUB}", UAA_ROLE, fake_arm.USER["oid"]))
    code, out = run(hub_root(tmp_path), stack=None, data="dev")
    assert code == 0 and "[WARN] data permissions" not in out, out


def test_platform_stack_warns_too_naming_its_roles(azure, tmp_path):
    conditional_rbac_admin(azure)
    from test_preflight import dev_stack

    out = io.StringIO()
    preflight.run(dev_stack(), fake_arm.Credential(), current=(SUB, "$ARM_SUBSCRIPTION_ID"), out=out)
    block = lines(out.getvalue(), "permissions")
    assert "[WARN] permissions: your Microsoft.Authorization/roleAssignments/write" in block
    assert "AzureML Data Scientist, AcrPull, AcrPush" in block


def test_role_assignments_unreadable_is_a_warning(azure, tmp_path):
    azure.on(
        "GET",
        rf"{ARM}/subscriptions/{SUB}(/resourceGroups/[^/]+)?/providers/Microsoft\.Authorization/roleAssignments",
        fake_arm.arm_error(403, "AuthorizationFailed", "no Microsoft.Authorization/roleAssignments/read"),
    )
    code, out = run(hub_root(tmp_path), stack=None, data="dev")
    block = lines(out, "data permissions")
    assert code == 0 and "[WARN] data permissions: reading your role assignments" in block
    assert "Azure refused it (403 AuthorizationFailed)" in block


def test_the_roles_named_are_the_programs():
    from trainingplatform import access

    assert set(roles.PLATFORM_ROLES) == set(access.ROLES)
    datastack = (ROOT / "infra" / "trainingplatform" / "datastack.py").read_text()
    assert all(f'"{r}"' in datastack for r in roles.DATA_ROLES)


def test_cli_takes_the_data_stack(monkeypatch, capsys, tmp_path):
    from launcher import __main__ as cli

    seen = {}
    monkeypatch.setattr(preflight, "run", lambda stack, **kw: seen.update(stack=stack, **kw) or 0)
    monkeypatch.setattr(stackfile, "ROOT", hub_root(tmp_path))
    assert cli.main(["preflight", "--data-stack", "dev"]) == 0
    assert seen["stack"] is None and seen["data"].settings.stack == "dev" and seen["data"].subscription == SUB
    assert cli.main(["preflight", "--stack", "prod", "--data-stack", "prod"]) == 0
    assert seen["stack"].settings.access.mode == "hub" and seen["data"].settings.stack == "prod"
    assert cli.main(["preflight", "--data-stack", "nope"]) == 2
    assert "infra/data-stack/Pulumi.nope.yaml not found" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        cli.main(["preflight"])
    assert e.value.code == 2 and "preflight needs --stack, --data-stack or both" in capsys.readouterr().err


def test_preflight_reads_the_hub_zones_record_of_each_data_account(hub_azure, tmp_path):
    """Issue 43, item 12: with the hub's zones, one platform of a data stack writes its accounts' records there. A
    record pointing outside this platform's VNet is another platform's (this one's endpoint would take it over);
    set to another-platform, a platform needs that record to exist (Record Sets - Get, privateDnsZones 2020-06-01)."""
    root = hub_root(tmp_path)
    data, logs = hub.data_accounts(stackfile.read_data("prod", root))
    assert data.endswith(logs[-8:]) and "data" in data and "logs" in logs  # naming.storage_account's
    zone = f"{ZONES_RG}/{hub.BLOB_ZONE}".replace(".", r"\.")

    def record(ip):
        return (200, {"name": data, "properties": {"aRecords": [{"ipv4Address": ip}]}}, {})

    code, out = run(root, stack="prod", data="prod")
    assert code == 0, out
    assert f"[  ok] data records {data}: {data} has no record yet (this platform writes it)" in out

    hub_azure.on("GET", rf"{ARM}{zone}/A/{data}", record("10.1.0.5"))  # another spoke's endpoint
    code, out = run(root, stack="prod", data="prod")
    assert code == 1
    block = lines(out, f"data records {data}")
    assert "resolves " + data + " to 10.1.0.5, outside this platform's network.vnetCidr" in block
    assert "access.dataEndpointRecords: another-platform" in block

    hub_azure.on("GET", rf"{ARM}{zone}/A/{data}", record("10.41.3.7"))  # this platform's own, after its up
    assert run(root, stack="prod", data="prod")[0] == 0

    c = yaml.safe_load((root / "Pulumi.prod.yaml").read_text())
    c["config"]["azure-horovod-training:access"]["dataEndpointRecords"] = "another-platform"
    (root / "Pulumi.prod.yaml").write_text(yaml.safe_dump(c))
    code, out = run(root, stack="prod", data="prod")
    assert code == 1 and f"no platform has registered {logs} in the hub's {hub.BLOB_ZONE}" in out
    assert f"[  ok] data records {data}: {data} resolves to 10.41.3.7" in out


def test_another_platform_needs_a_route_to_the_data_endpoints_through_the_hubs_firewall(hub_azure, tmp_path):
    """Issue 54, item 5: set to another-platform, a platform reaches the data through the first platform's endpoints,
    in that platform's VNet, which peering with the hub does not reach (it is not transitive). The compute subnet's
    route table (network.computeRouteTableId, Route Tables - Get) must send those addresses to the hub's firewall,
    and Azure's default route drops 10.0.0.0/8 outside the VNet: a 0.0.0.0/0 route to the firewall does not."""
    root = hub_root(tmp_path)
    accounts = hub.data_accounts(stackfile.read_data("prod", root))
    zone = f"{ZONES_RG}/{hub.BLOB_ZONE}".replace(".", r"\.")
    for account in accounts:  # the first platform's endpoints, in spoke-a
        body = {"name": account, "properties": {"aRecords": [{"ipv4Address": "10.1.0.5"}]}}
        hub_azure.on("GET", rf"{ARM}{zone}/A/{account}", (200, body, {}))
    table = f"/subscriptions/{HUB_SUB}/resourceGroups/{HUB_RG}/providers/Microsoft.Network/routeTables/rt-spokes"
    routes = [{"name": "default", "properties": {"addressPrefix": "0.0.0.0/0", "nextHopType": "VirtualAppliance"}}]
    hub_azure.on("GET", rf"{ARM}{table}", lambda r, m: (200, {"id": table, "properties": {"routes": routes}}, {}))

    def settings(**network):
        c = yaml.safe_load((root / "Pulumi.prod.yaml").read_text())
        c["config"]["azure-horovod-training:access"]["dataEndpointRecords"] = "another-platform"
        c["config"]["azure-horovod-training:network"].update(network)
        (root / "Pulumi.prod.yaml").write_text(yaml.safe_dump(c))

    settings()
    code, out = run(root, stack="prod", data="prod")
    assert code == 1
    block = lines(out, f"data route {accounts[0]}")
    assert "resolves to 10.1.0.5, another platform's endpoint" in block and "network.computeRouteTableId" in block

    settings(computeRouteTableId=table)
    code, out = run(root, stack="prod", data="prod")
    assert code == 1 and "10.1.0.5 goes by 10.0.0.0/8 to None" in lines(out, f"data route {accounts[0]}")

    routes.append(
        {"name": "spoke-a", "properties": {"addressPrefix": "10.1.0.0/16", "nextHopType": "VirtualAppliance"}}
    )
    code, out = run(root, stack="prod", data="prod")
    assert code == 0, out
    assert f"[  ok] data route {accounts[1]}: 10.1.0.5 routed to the hub's firewall by {table}" in out
