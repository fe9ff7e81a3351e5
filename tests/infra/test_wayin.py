"""The private profile (Pulumi.prod.yaml) under mocks: the way in (Bastion and its jump host, or a hub's peering and
DNS), in every life of the stack and read by `pulumi up`, and the jump host's evening shutdown and who may start it.
Each test encodes a documented Azure constraint (cited) that the program must meet.
"""

import base64
import copy

import pytest
from infra_helpers import one
from wayin_helpers import ALICE, BOB, HUB, TEAM, load_config, problems_of, roles_of, run_stack

from trainingplatform import access, config, mocked, wayin, wayinconfig


@pytest.fixture(scope="module")
def hub(prod_raw, prod_data_out):
    return run_stack(
        prod_raw,
        prod_data_out,
        access={"mode": "hub", "hubVnetId": HUB, "useHubGateway": True, "resolverSubnetCidr": "10.41.18.0/28"},
    )


# ---- item 2: the way in ----


def test_a_private_workspace_without_a_way_in_is_refused(prod_raw):
    # Public access off: the workspace answers only on its private endpoint, whose DNS zone is linked to the
    # platform VNet alone (https://learn.microsoft.com/azure/machine-learning/how-to-configure-private-link,
    # "You can only access the workspace from inside the VNet"): without a way in nobody can use it.
    raw = copy.deepcopy(prod_raw[0])
    del raw["access"]
    assert "access is missing while workspacePublicAccess is false" in problems_of(raw)
    raw["access"] = {"mode": "none"}
    assert "access.mode = 'none': workspacePublicAccess is false, so nobody could reach the workspace" in problems_of(
        raw
    )
    # A public workspace needs none.
    raw.update(workspacePublicAccess=True)
    assert load_config(raw).access.mode == "none"


@pytest.mark.parametrize(
    "access_cfg,message",
    [
        # https://learn.microsoft.com/azure/bastion/configuration-settings#subnet: "/26 or larger".
        (
            {"mode": "bastion", "bastionSubnetCidr": "10.41.17.0/27", "jumpHostSubnetCidr": "10.41.17.64/28"},
            "access.bastionSubnetCidr = '10.41.17.0/27': Azure Bastion needs a subnet of /26 or larger",
        ),
        (
            {"mode": "bastion", "bastionSubnetCidr": "10.41.16.0/26", "jumpHostSubnetCidr": "10.41.17.64/28"},
            "overlaps 10.41.16.0/24, another subnet of the VNet",
        ),
        (
            {"mode": "bastion", "bastionSubnetCidr": "10.42.0.0/26", "jumpHostSubnetCidr": "10.41.17.64/28"},
            "must lie inside network.vnetCidr 10.41.0.0/16",
        ),
        (
            {"mode": "bastion", "bastionSubnetCidr": "10.41.17.0/26", "jumpHostSubnetCidr": "10.41.17.0/28"},
            "access.jumpHostSubnetCidr = '10.41.17.0/28': overlaps 10.41.17.0/26",
        ),
        ({"mode": "bastion", "bastionSubnetCidr": "10.41.17.0/26"}, "access.jumpHostSubnetCidr is missing"),
        (
            {
                "mode": "bastion",
                "bastionSubnetCidr": "10.41.17.0/26",
                "jumpHostSubnetCidr": "10.41.17.64/28",
                "hubVnetId": HUB,
            },
            "access.hubVnetId = '/subscriptions/3333",
        ),
        ({"mode": "hub", "hubVnetId": "hub-vnet"}, "a VNet resource id /subscriptions/<id>/resourceGroups/<rg>"),
        ({"mode": "hub"}, "access.hubVnetId is missing"),
        # https://learn.microsoft.com/azure/dns/dns-private-resolver-overview#subnet-restrictions: /28 to /24.
        (
            {"mode": "hub", "hubVnetId": HUB, "resolverSubnetCidr": "10.41.18.0/29"},
            "a DNS private resolver's inbound subnet is /28 to /24",
        ),
        (
            {"mode": "hub", "hubVnetId": HUB, "resolverSubnetCidr": "10.41.20.0/23"},
            "a DNS private resolver's inbound subnet is /28 to /24",
        ),
        ({"mode": "vpn"}, "access.mode = 'vpn': bastion, hub or none"),
    ],
)
def test_way_in_settings_are_checked_before_anything_is_declared(prod_raw, access_cfg, message):
    raw = dict(copy.deepcopy(prod_raw[0]), access=access_cfg)
    assert message in problems_of(raw)


def test_bastion_is_allowed_on_the_public_profile(dev_raw):
    # Decision: nodes have no public IP in every profile, so SSH to a node (sshEnabled) needs a way into the
    # VNet in the public profile too; Bastion there is a cost, not a contradiction.
    raw = dict(
        copy.deepcopy(dev_raw[0]),
        access={"mode": "bastion", "bastionSubnetCidr": "10.40.17.0/26", "jumpHostSubnetCidr": "10.40.17.64/28"},
    )
    assert load_config(raw).access.mode == "bastion"


def test_bastion_and_jump_host(prod):
    mocks, outputs = prod
    vnet = one(mocks, "VirtualNetwork", "net-vnet")
    subnet = one(mocks, "Subnet", "wayin-bastion-subnet").inputs
    # Azure Bastion: a subnet named exactly AzureBastionSubnet, /26 or larger, and a Standard static public IP
    # (https://learn.microsoft.com/azure/bastion/configuration-settings).
    assert subnet["subnetName"] == wayin.BASTION_SUBNET == "AzureBastionSubnet"
    assert int(subnet["addressPrefix"].split("/")[1]) <= 26
    assert subnet["virtualNetworkName"] == vnet.inputs.get("virtualNetworkName", "net-vnet")
    ip = one(mocks, "PublicIPAddress", "wayin-bastion-ip").inputs
    assert ip["sku"]["name"] == "Standard" and ip["publicIPAllocationMethod"] == "Static"
    bastion = one(mocks, "BastionHost", "wayin-bastion").inputs
    conf = bastion["ipConfigurations"][0]
    assert conf["subnet"]["id"] == one(mocks, "Subnet", "wayin-bastion-subnet").id
    assert conf["publicIPAddress"]["id"] == one(mocks, "PublicIPAddress", "wayin-bastion-ip").id
    # Native client tunnelling (`az network bastion ssh/tunnel`) needs Standard or higher.
    assert bastion["sku"]["name"] in ("Standard", "Premium") and bastion["enableTunneling"] is True
    # The jump host: in the platform VNet, no public IP; its only way in is Bastion.
    nic = one(mocks, "NetworkInterface", "wayin-jumphost-nic").inputs
    jump_subnet = one(mocks, "Subnet", "wayin-jumphost-subnet")
    assert nic["ipConfigurations"][0]["subnet"]["id"] == jump_subnet.id
    assert "publicIPAddress" not in nic["ipConfigurations"][0]
    assert jump_subnet.inputs["virtualNetworkName"] == subnet["virtualNetworkName"]
    # It builds the images: outbound through the platform's NAT gateway (default outbound access is off).
    assert jump_subnet.inputs["natGateway"]["id"] == one(mocks, "NatGateway", "net-nat").id
    assert jump_subnet.inputs["defaultOutboundAccess"] is False
    vm = one(mocks, "compute:VirtualMachine", "wayin-jumphost")
    assert (
        vm.inputs["networkProfile"]["networkInterfaces"][0]["id"]
        == one(mocks, "NetworkInterface", "wayin-jumphost-nic").id
    )
    ext = one(mocks, "VirtualMachineExtension", "wayin-jumphost-entra-login").inputs
    assert (ext["publisher"], ext["type"], ext["vmName"]) == (
        "Microsoft.Azure.ActiveDirectory",
        "AADSSHLoginForLinux",
        vm.inputs.get("vmName", "wayin-jumphost"),
    )
    # Both install with apt: cloud-init (packages, Docker's repository, the Azure CLI) and the login extension
    # (aadsshlogin). Run together, one meets dpkg's lock (Azure/azure-linux-extensions#1318): the login extension
    # comes after one that waits for cloud-init, in Azure's order and in Pulumi's.
    assert "packages:" in wayin.CLOUD_INIT and "apt" in wayin.CLOUD_INIT
    wait = one(mocks, "VirtualMachineExtension", "wayin-jumphost-cloud-init-done").inputs
    assert (wait["publisher"], wait["type"]) == ("Microsoft.Azure.Extensions", "CustomScript")
    assert base64.b64decode(wait["settings"]["script"]).decode() == wayin.APT_WAIT
    assert "cloud-init status --wait" in wayin.APT_WAIT
    assert wait["vmName"] == ext["vmName"]
    assert ext["provisionAfterExtensions"] == [wait["vmExtensionName"]]
    assert "wayin-jumphost-cloud-init-done" in mocks.depends_on("wayin-jumphost-entra-login")
    # Users sign in with Entra ID: "Virtual Machine User Login" on the VM, Administrator Login for jumpHostAdmins
    # only (https://learn.microsoft.com/entra/identity/devices/howto-vm-sign-in-azure-ad-linux; item 6 in
    # test_wayin_jumphost.py).
    assert (access.ROLES["Virtual Machine User Login"], vm.id) in roles_of(mocks, mocked.DEPLOYER)
    assert outputs["way_in"]["mode"] == "bastion" and outputs["way_in"]["jump_host_id"] == vm.id
    # Subnets change one at a time in a VNet: each new one waits for the one before.
    assert "net-endpoints" in mocks.depends_on("wayin-bastion-subnet")
    assert "wayin-bastion-subnet" in mocks.depends_on("wayin-jumphost-subnet")


def test_private_dns_zones_are_linked_to_the_platform_vnet_only(prod):
    # Outside the VNet the private endpoints do not resolve (private-endpoint-dns): nobody but the way in gets in.
    mocks, _ = prod
    vnet = one(mocks, "VirtualNetwork", "net-vnet").id
    links = mocks.of_type("privatedns:VirtualNetworkLink")
    assert links and {link.inputs["virtualNetwork"]["id"] for link in links} == {vnet}
    assert len(links) == len(mocks.of_type("PrivateZone"))


def test_hub_mode_peers_both_ways_and_links_every_zone_to_the_hub(hub):
    mocks, outputs = hub
    vnet = one(mocks, "VirtualNetwork", "net-vnet")
    # A peering is two resources, one per VNet (virtual-network-peering-overview); gateway transit needs
    # allowGatewayTransit on the hub side and useRemoteGateways on this side.
    out = one(mocks, "VirtualNetworkPeering", "wayin-to-hub").inputs
    back = one(mocks, "VirtualNetworkPeering", "wayin-from-hub").inputs
    assert out["remoteVirtualNetwork"]["id"] == HUB and out["useRemoteGateways"] is True
    assert (back["resourceGroupName"], back["virtualNetworkName"]) == ("hub-rg", "hub-vnet")
    assert back["remoteVirtualNetwork"]["id"] == vnet.id and back["allowGatewayTransit"] is True
    assert "wayin-from-hub" in mocks.depends_on("wayin-to-hub")  # transit offered before it is used
    # The hub side goes through a provider for the hub's subscription.
    provider = mocks.options["wayin-from-hub"].provider
    assert provider is not None
    hub_provider = [r for r in mocks.resources if r.type == "pulumi:providers:azure-native"]
    assert [p.inputs["subscriptionId"] for p in hub_provider] == ["33333333-3333-3333-3333-333333333333"]
    # Every zone: linked to the platform VNet and to the hub.
    zones = {r.inputs["privateZoneName"] for r in mocks.of_type("PrivateZone")}
    zone_ids = {r.id: r.inputs["privateZoneName"] for r in mocks.of_type("PrivateZone")}
    linked = {}
    for link in mocks.of_type("privatedns:VirtualNetworkLink"):
        name = next(z for i, z in zone_ids.items() if i.endswith("/" + link.inputs["privateZoneName"]))
        linked.setdefault(name, set()).add(link.inputs["virtualNetwork"]["id"])
    assert linked == {z: {vnet.id, HUB} for z in zones}
    # The resolver's inbound endpoint sits in a subnet delegated to it (dns-private-resolver-overview).
    subnet = one(mocks, "Subnet", "wayin-resolver-subnet")
    assert subnet.inputs["delegations"][0]["serviceName"] == "Microsoft.Network/dnsResolvers"
    inbound = one(mocks, "InboundEndpoint", "wayin-resolver-inbound").inputs
    assert inbound["ipConfigurations"][0]["subnet"]["id"] == subnet.id
    assert one(mocks, "DnsResolver", "wayin-resolver").inputs["virtualNetwork"]["id"] == vnet.id
    assert not mocks.of_type("BastionHost") and outputs["way_in"]["mode"] == "hub"


def test_the_way_in_is_part_of_every_life_of_the_stack(prod_raw, prod_data_out):
    # Declared in the stack: `pulumi destroy` removes it (nothing retained or protected would outlive the
    # VNet it points at) and the next `up` declares it again, pointing at that life's VNet.
    for random_result in ("x7k2q", "p3m9w"):
        mocks, _ = run_stack(prod_raw, prod_data_out, random_result, access={"mode": "hub", "hubVnetId": HUB})
        assert mocks.retained == set() and mocks.protected == set()
        back = one(mocks, "VirtualNetworkPeering", "wayin-from-hub").inputs
        assert back["remoteVirtualNetwork"]["id"] == one(mocks, "VirtualNetwork", "net-vnet").id
        assert len(mocks.of_type("privatedns:VirtualNetworkLink")) == 2 * len(mocks.of_type("PrivateZone"))


def test_the_entry_point_reads_the_access_setting(prod_raw):
    # `pulumi up` reads config through config.from_pulumi(): the key must be among those it reads, or the
    # private profile would be refused for a missing way in that its stack file declares.
    import json

    import pulumi

    raw, location = prod_raw
    cli = {f"{config.PROJECT}:{k}": v if isinstance(v, str) else json.dumps(v) for k, v in raw.items()}
    cli["azure-native:location"] = location
    cli["azure-native:subscriptionId"] = mocked.SUBSCRIPTION  # each user pins it (required)
    pulumi.runtime.set_mocks(mocked.RecordingMocks(), project=config.PROJECT, stack="prod", preview=False)
    pulumi.runtime.set_all_config(cli)
    try:
        cfg = config.from_pulumi()
    finally:
        pulumi.runtime.set_all_config({})
    assert cfg.access == wayinconfig.AccessConfig("bastion", "10.41.17.0/26", "10.41.17.64/28", "Standard_D4s_v5")


# ---- issue 28, item 15: the jump host shuts down every evening ----


def test_the_jump_host_shuts_down_daily_as_azure_declares_it(prod):
    # A VM's auto-shutdown is a Microsoft.DevTestLab/schedules resource (REST "Global Schedules - Create Or Update",
    # API 2018-09-15, azure-native devtestlab.GlobalSchedule) named "shutdown-computevm-<vmName>" in the VM's
    # resource group, with taskType "ComputeVmShutdownTask", dailyRecurrence.time "HHmm" and a Windows timeZoneId,
    # and targetResourceId the VM's id (Microsoft's quickstart templates and the portal's auto-shutdown blade
    # write exactly this; Azure answers 400 Bad Request for another name, as the azurerm provider's
    # azurerm_dev_test_global_vm_shutdown_schedule found, hashicorp/terraform-provider-azurerm#5536).
    mocks, outputs = prod
    vm = one(mocks, "compute:VirtualMachine", "wayin-jumphost")
    schedule = one(mocks, "devtestlab:GlobalSchedule", "wayin-jumphost-shutdown").inputs
    vm_name = vm.inputs.get("vmName", vm.name)  # auto-named: the mocks answer the logical name
    assert schedule["name"] == f"shutdown-computevm-{vm_name}"
    assert schedule["resourceGroupName"] == vm.inputs["resourceGroupName"]
    assert schedule["targetResourceId"] == vm.id
    assert (schedule["taskType"], schedule["status"]) == ("ComputeVmShutdownTask", "Enabled")
    assert schedule["dailyRecurrence"] == {"time": "1900"} and schedule["timeZoneId"] == "UTC"
    assert outputs["way_in"]["jump_host_shutdown"] == "1900 UTC"
    # A replaced VM (any osProfile change) has a new name: the schedule goes first and comes back under it.
    assert mocks.options["wayin-jumphost-shutdown"].delete_before_replace is True


def test_the_shutdown_time_and_zone_are_settings(prod_raw, prod_data_out):
    way_in = dict(
        prod_raw[0]["access"], jumpHostShutdownTime="0730", jumpHostShutdownTimeZone="W. Europe Standard Time"
    )
    mocks, _ = run_stack(prod_raw, prod_data_out, access=way_in)
    schedule = one(mocks, "devtestlab:GlobalSchedule", "wayin-jumphost-shutdown").inputs
    assert (schedule["dailyRecurrence"]["time"], schedule["timeZoneId"]) == ("0730", "W. Europe Standard Time")
    off, _ = run_stack(prod_raw, prod_data_out, access=dict(prod_raw[0]["access"], jumpHostShutdownTime="off"))
    assert not off.of_type("devtestlab:GlobalSchedule")


@pytest.mark.parametrize(
    "settings,message",
    [
        (
            {"jumpHostShutdownTime": "19:00"},
            "access.jumpHostShutdownTime = '19:00': the time of day as Azure's auto-shutdown takes it, HHmm on a 24-hour clock: \"1900\"",
        ),
        ({"jumpHostShutdownTime": "2460"}, "access.jumpHostShutdownTime = '2460'"),
        ({"jumpHostShutdownTime": 1900}, "access.jumpHostShutdownTime = 1900: expected str; quote it"),
        (
            {"jumpHostShutdownTimeZone": "Europe/Berlin"},
            "access.jumpHostShutdownTimeZone = 'Europe/Berlin': a Windows time zone id",
        ),
    ],
)
def test_bad_shutdown_settings_are_refused_naming_the_fix(prod_raw, settings, message):
    raw = dict(copy.deepcopy(prod_raw[0]))
    raw["access"] = dict(raw["access"], **settings)
    assert message in problems_of(raw)


# ---- issue 28: a user starts the jump host after its evening auto-shutdown ----

# The auto-shutdown deallocates the jump host every evening (wayin.py); `az vm start` needs
# Microsoft.Compute/virtualMachines/start/action ("Starts the virtual machine"), which Reader and the login roles lack.
# Microsoft's role, "Azure built-in roles for Compute" (learn.microsoft.com/azure/role-based-access-control/
# built-in-roles/compute, ms.date 2025-01-10), "Desktop Virtualization Power On Contributor", its Compute actions:
#   "Microsoft.Compute/virtualMachines/start/action", "Microsoft.Compute/virtualMachines/read",
#   "Microsoft.Compute/virtualMachines/instanceView/read"
# and no virtualMachines/write, runCommand, extensions/write, restart or deallocate (which DevTest Labs User,
# 76283e04-6283-4c54-8f91-bcf1374a3c64, adds: "Microsoft.Compute/virtualMachines/deallocate/action", "Microsoft.Compute/
# virtualMachines/restart/action"; "Azure built-in roles for DevOps"). Its other actions are not under a VM: at the
# VM's scope they reach nothing, so it is assigned there and nowhere else.
POWER_ON = "489581de-a3bd-480d-9518-53dea7416b33"


def _starters(mocks):
    return [r for r in mocks.of_type("RoleAssignment") if r.inputs["roleDefinitionId"].rsplit("/", 1)[1] == POWER_ON]


def test_every_user_may_start_the_jump_host_and_nothing_else_gets_that_role(prod_raw, prod_data_out):
    users = [
        {"objectId": ALICE, "type": "User"},
        {"objectId": TEAM, "type": "Group"},
        {"objectId": BOB, "type": "User"},
    ]
    way_in = dict(prod_raw[0]["access"], jumpHostAdmins=[{"objectId": BOB, "type": "User"}])
    builders = [{"objectId": TEAM, "type": "Group"}]  # users besides the deployer on a private registry need them
    mocks, _ = run_stack(prod_raw, prod_data_out, users=users, access=way_in, imageBuilders=builders)
    vm = one(mocks, "compute:VirtualMachine", "wayin-jumphost").id
    assert access.ROLES["Desktop Virtualization Power On Contributor"] == POWER_ON
    starters = _starters(mocks)
    # One per user, admins included, as that user's principal type, on the VM alone (not its resource group).
    assert sorted((r.inputs["principalId"], r.inputs["principalType"]) for r in starters) == sorted(
        [(ALICE, "User"), (TEAM, "Group"), (BOB, "User")]
    )
    assert {r.inputs["scope"] for r in starters} == {vm}
    # Named like every other assignment: guid(scope, principal, role, stack), replaced by deleting first.
    for r in starters:
        assert r.inputs["roleAssignmentName"] == access.assignment_name(
            vm, r.inputs["principalId"], r.inputs["roleDefinitionId"], "prod"
        )
        assert (
            r.inputs["description"]
            == f"Desktop Virtualization Power On Contributor: user-{r.inputs['principalId']}-starts-jumphost"
        )
    assert mocks.options[f"access-user-{ALICE}-starts-jumphost"].delete_before_replace is True
    assert mocks.of_type("GlobalSchedule"), "the shutdown it answers"


def test_the_default_user_may_start_the_jump_host(prod):
    mocks, _ = prod  # no `users`: the deployer is the one user
    vm = one(mocks, "compute:VirtualMachine", "wayin-jumphost").id
    assert (POWER_ON, vm) in roles_of(mocks, mocked.DEPLOYER)
    assert len(_starters(mocks)) == 1


def test_no_start_right_without_a_jump_host(dev, hub):
    # The public profile has no way in, hub mode no VM: nothing to start, no assignment.
    for mocks, _ in (dev, hub):
        assert not mocks.of_type("compute:VirtualMachine")
        assert _starters(mocks) == []


def test_the_hubs_provider_signs_in_as_the_default_provider_does(prod_raw, prod_data_out):
    """Issue 43, item 13: an explicit provider reads none of the stack's azure-native: settings; CI that signs in
    through them (a service principal, OIDC) would peer the hub with another identity, or none."""
    import pulumi.runtime.config as runtime_config

    signed_in = {
        "azure-native:clientId": "11111111-1111-1111-1111-111111111111",
        "azure-native:tenantId": "22222222-2222-2222-2222-222222222222",
        "azure-native:useOidc": "true",
        "azure-native:oidcRequestUrl": "https://ci.example.com/token",
        "azure-native:clientSecret": "not-a-real-secret",
    }
    before, secrets = runtime_config.CONFIG.get(), runtime_config._SECRET_KEYS.get()
    runtime_config.set_all_config(signed_in, ["azure-native:clientSecret"])
    try:
        # a service principal's sign-in: the users are listed (program.py refuses the deployer as a User then)
        people = [{"objectId": "55555555-5555-5555-5555-555555555555", "type": "User"}]
        mocks, _ = run_stack(
            prod_raw, prod_data_out, access={"mode": "hub", "hubVnetId": HUB}, users=people, imageBuilders=people
        )
    finally:
        runtime_config.set_all_config(before, list(secrets))
    (provider,) = [r for r in mocks.resources if r.type == "pulumi:providers:azure-native"]
    # the provider keeps client ids and secrets as Pulumi secrets: the mocks see them wrapped
    given = {k: v["value"] if isinstance(v, dict) and "value" in v else v for k, v in provider.inputs.items()}
    assert given["subscriptionId"] == "33333333-3333-3333-3333-333333333333"
    assert (
        given["clientId"] == signed_in["azure-native:clientId"]
        and given["tenantId"] == signed_in["azure-native:tenantId"]
    )
    assert str(given["useOidc"]).lower() == "true" and given["oidcRequestUrl"] == "https://ci.example.com/token"
    assert given["clientSecret"] == "not-a-real-secret"
    assert set(wayin.SIGN_IN_SETTINGS) >= {"clientId", "tenantId", "clientSecret", "useOidc", "useMsi", "oidcToken"}
