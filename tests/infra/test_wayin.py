"""The private profile (Pulumi.prod.yaml) under mocks: the way in, image pushes, studio access, datastores
and storage egress. Each test encodes a documented Azure constraint (cited) that the program must meet.
"""

import base64
import copy
import os
import shutil
import subprocess

import pytest
import yaml
from infra_helpers import one

from trainingplatform import access, config, egress, mocked, wayin, wayinconfig

HUB = "/subscriptions/33333333-3333-3333-3333-333333333333/resourceGroups/hub-rg/providers/Microsoft.Network/virtualNetworks/hub-vnet"


def _run(prod_raw, prod_data_out, random_result="x7k2q", **changes):
    raw, location = copy.deepcopy(prod_raw)
    raw.update(changes)
    return mocked.run(
        raw, "prod", location, mocked.RecordingMocks(random_result=random_result), data_outputs=prod_data_out
    )


@pytest.fixture(scope="module")
def hub(prod_raw, prod_data_out):
    return _run(
        prod_raw,
        prod_data_out,
        access={"mode": "hub", "hubVnetId": HUB, "useHubGateway": True, "resolverSubnetCidr": "10.41.18.0/28"},
    )


def _load(raw, location="westeurope"):
    return config.load(raw, "prod", location, mocked.SUBSCRIPTION)


def _problems(raw):
    with pytest.raises(config.ConfigError) as e:
        _load(raw)
    return "\n".join(e.value.problems)


def _roles_of(mocks, principal):
    return {
        (r.inputs["roleDefinitionId"].rsplit("/", 1)[1], r.inputs["scope"])
        for r in mocks.of_type("RoleAssignment")
        if r.inputs["principalId"] == principal
    }


# ---- item 2: the way in ----


def test_a_private_workspace_without_a_way_in_is_refused(prod_raw):
    # Public access off: the workspace answers only on its private endpoint, whose DNS zone is linked to the
    # platform VNet alone (https://learn.microsoft.com/azure/machine-learning/how-to-configure-private-link,
    # "You can only access the workspace from inside the VNet"): without a way in nobody can use it.
    raw = copy.deepcopy(prod_raw[0])
    del raw["access"]
    assert "access is missing while workspacePublicAccess is false" in _problems(raw)
    raw["access"] = {"mode": "none"}
    assert "access.mode = 'none': workspacePublicAccess is false, so nobody could reach the workspace" in _problems(raw)
    # A public workspace needs none.
    raw.update(workspacePublicAccess=True)
    assert _load(raw).access.mode == "none"


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
    assert message in _problems(raw)


def test_bastion_is_allowed_on_the_public_profile(dev_raw):
    # Decision: nodes have no public IP in every profile, so SSH to a node (sshEnabled) needs a way into the
    # VNet in the public profile too; Bastion there is a cost, not a contradiction.
    raw = dict(
        copy.deepcopy(dev_raw[0]),
        access={"mode": "bastion", "bastionSubnetCidr": "10.40.17.0/26", "jumpHostSubnetCidr": "10.40.17.64/28"},
    )
    assert _load(raw).access.mode == "bastion"


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
    assert "cloud-init status --wait" in wait["settings"]["commandToExecute"]
    assert wait["vmName"] == ext["vmName"]
    assert ext["provisionAfterExtensions"] == [wait["vmExtensionName"]]
    assert "wayin-jumphost-cloud-init-done" in mocks.depends_on("wayin-jumphost-entra-login")
    # Users sign in with Entra ID: "Virtual Machine User Login" on the VM, Administrator Login for jumpHostAdmins
    # only (https://learn.microsoft.com/entra/identity/devices/howto-vm-sign-in-azure-ad-linux; item 6 below).
    assert (access.ROLES["Virtual Machine User Login"], vm.id) in _roles_of(mocks, mocked.DEPLOYER)
    assert outputs["way_in"]["mode"] == "bastion" and outputs["way_in"]["jump_host_id"] == vm.id
    # Subnets change one at a time in a VNet: each new one waits for the one before.
    assert "net-endpoints" in mocks.depends_on("wayin-bastion-subnet")
    assert "wayin-bastion-subnet" in mocks.depends_on("wayin-jumphost-subnet")


# ---- issue 28, item 10: the jump host's OS settings cannot change after creation ----

JUMP_KEY = "ssh-rsa AAAAB3NzaC1yc2EAAAADAQABAAABAQCjumphostkey jump@laptop"


def test_a_new_jump_host_key_or_cloud_init_replaces_the_vm_instead_of_failing(
    prod, prod_raw, prod_data_out, monkeypatch
):
    # Azure refuses to change a VM's OS profile after creation, with PropertyChangeNotAllowed: "Changing property
    # 'linuxConfiguration.ssh.publicKeys' is not allowed." (github.com/Azure/azure-cli/issues/11840,
    # Azure/azure-quickstart-templates#5442), "Changing property 'customData' is not allowed."
    # (Azure/azure-sdk-for-node#2297); azure-native's VirtualMachine docs (pulumi-azure-native 3.29.0,
    # compute.OSProfileArgs, from the REST spec), custom_data and admin_username: "This property cannot be
    # updated after the VM is created." So a change there must replace the VM (Pulumi's replaceOnChanges)
    # rather than fail in the middle of `up`.
    mocks, _ = prod
    opts = mocks.options["wayin-jumphost"]
    assert "osProfile" in opts.replace_on_changes
    # Deleted first: its NIC belongs to one VM at a time (a second VM on it: NicInUse, "Network Interface ... is
    # used by existing VM"), and the replacement is auto-named anew.
    assert opts.delete_before_replace is True
    before = one(mocks, "compute:VirtualMachine", "wayin-jumphost").inputs["osProfile"]
    assert "vmName" not in one(mocks, "compute:VirtualMachine", "wayin-jumphost").inputs  # auto-named

    # Its own key setting: jumpHostSshPublicKey changes the jump host's osProfile ...
    keyed = one(
        _run(prod_raw, prod_data_out, jumpHostSshPublicKey=JUMP_KEY)[0], "compute:VirtualMachine", "wayin-jumphost"
    )
    profile = keyed.inputs["osProfile"]
    assert profile != before
    assert profile["linuxConfiguration"]["disablePasswordAuthentication"] is True
    assert profile["linuxConfiguration"]["ssh"]["publicKeys"][0]["keyData"] == JUMP_KEY
    assert "adminPassword" not in profile
    # ... and the clusters' sshPublicKey does not touch it.
    cluster_key = _run(prod_raw, prod_data_out, sshPublicKey="ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIClusters c@l")[0]
    assert one(cluster_key, "compute:VirtualMachine", "wayin-jumphost").inputs["osProfile"] == before

    # An edited cloud-init (custom data) changes osProfile too, so it replaces the VM as well.
    monkeypatch.setattr(wayin, "CLOUD_INIT", wayin.CLOUD_INIT + "  - [sh, -c, 'echo edited']\n")
    edited = one(_run(prod_raw, prod_data_out)[0], "compute:VirtualMachine", "wayin-jumphost").inputs["osProfile"]
    assert edited["customData"] != before["customData"]


def test_a_jump_host_key_without_a_jump_host_is_refused(prod_raw, prod_data_out):
    with pytest.raises(ValueError, match="jumpHostSshPublicKey is set, but only access.mode bastion declares"):
        _run(
            prod_raw,
            prod_data_out,
            jumpHostSshPublicKey=JUMP_KEY,
            access={"mode": "hub", "hubVnetId": HUB},
        )


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
        mocks, _ = _run(prod_raw, prod_data_out, random_result, access={"mode": "hub", "hubVnetId": HUB})
        assert mocks.retained == set() and mocks.protected == set()
        back = one(mocks, "VirtualNetworkPeering", "wayin-from-hub").inputs
        assert back["remoteVirtualNetwork"]["id"] == one(mocks, "VirtualNetwork", "net-vnet").id
        assert len(mocks.of_type("privatedns:VirtualNetworkLink")) == 2 * len(mocks.of_type("PrivateZone"))


# ---- item 3: images are pushed from inside the VNet ----


def test_only_image_builders_can_push_and_every_user_pulls(prod, prod_raw, prod_data_out, dev, dev_raw, dev_data):
    # Issue 28, item 18; issue 43, items 8-9. ACR's built-in roles (learn.microsoft.com/azure/container-registry/
    # container-registry-roles): AcrPush "Push artifacts to or pull artifacts from a registry", AcrPull "Pull
    # artifacts from a registry". A user with AcrPush can overwrite any tag every job runs, so imageBuilders get it;
    # with a private registry and no imageBuilders, the users (images are pushed from inside the VNet: without it no
    # non-Owner could, and every job pulls one); with a public one, nobody by this grant.
    mocks, _ = prod
    acr = one(mocks, "Registry", "registry-acr")
    assert acr.inputs["publicNetworkAccess"] == "Disabled"
    push, pull = access.ROLES["AcrPush"], access.ROLES["AcrPull"]
    tasks = BUILT_IN_ROLES["Container Registry Tasks Contributor"]
    assert {role for role, scope in _roles_of(mocks, mocked.DEPLOYER) if scope == acr.id} == {pull, push}
    assert not [r for r in dev[0].of_type("RoleAssignment") if r.inputs["roleDefinitionId"].endswith(push)]
    listed = _run(
        prod_raw,
        prod_data_out,
        users=[{"objectId": ALICE, "type": "User"}, {"objectId": BOB, "type": "User"}],
        imageBuilders=[{"objectId": TEAM, "type": "Group"}],
    )[0]
    pushers = {
        (r.inputs["principalId"], r.inputs["principalType"], r.inputs["scope"])
        for r in listed.of_type("RoleAssignment")
        if r.inputs["roleDefinitionId"].endswith(push)
    }
    assert pushers == {(TEAM, "Group", acr.id)}
    for user in (ALICE, BOB):
        assert {role for role, scope in _roles_of(listed, user) if scope == acr.id} == {pull}, user
    # No Tasks role on a private registry: `az acr build` cannot reach it (docker push from the jump host).
    assert not [r for r in listed.of_type("RoleAssignment") if r.inputs["roleDefinitionId"].endswith(tasks)]
    # A public registry: the builders build with `az acr build` (docs/images.md), whose quick runs need Container
    # Registry Tasks Contributor, which AcrPush does not include ("registries/scheduleRun/action").
    raw = dict(copy.deepcopy(dev_raw[0]), imageBuilders=[{"objectId": TEAM, "type": "Group"}])
    public = mocked.run(raw, "dev", dev_raw[1], data_outputs=dev_data[1])[0]
    dev_acr = one(public, "Registry", "registry-acr")
    assert {role for role, scope in _roles_of(public, TEAM) if scope == dev_acr.id} == {push, tasks}
    # The jump host resolves the registry privately: its VNet is the one the registry's zone is linked to.
    zone = next(r for r in mocks.of_type("PrivateZone") if r.inputs["privateZoneName"] == "privatelink.azurecr.io")
    links = [
        link
        for link in mocks.of_type("privatedns:VirtualNetworkLink")
        if link.inputs["privateZoneName"] == zone.inputs["privateZoneName"]
    ]
    assert [link.inputs["virtualNetwork"]["id"] for link in links] == [one(mocks, "VirtualNetwork", "net-vnet").id]
    # No ACR Tasks path: shared agents lost the trusted-services bypass on 2025-06-01 unless
    # networkRuleBypassAllowedForTasks is set (learn.microsoft.com/azure/container-registry/
    # manage-network-bypass-policy-for-tasks), which azure-native 3.29.0's Registry (API 2023-01-01-preview)
    # cannot set; the program declares no task, agent pool or bypass for them.
    assert not mocks.of_type("containerregistry:Task") and not mocks.of_type("containerregistry:AgentPool")


def test_a_private_registry_without_builders_is_warned_about(prod_raw):
    cfg = _load(copy.deepcopy(prod_raw[0]))
    assert any(w.startswith("imageBuilders is not set: every principal in users gets AcrPush") for w in cfg.warnings)
    raw = dict(copy.deepcopy(prod_raw[0]), imageBuilders=[{"objectId": TEAM, "type": "Group"}])
    assert not any("imageBuilders" in w for w in _load(raw).warnings)


# ---- item 12: the studio's data preview ----


def test_workspace_identity_reads_the_storage_private_endpoints(prod):
    # "Add the workspace managed identity to the Reader role for the storage private endpoint(s)"
    # (https://learn.microsoft.com/azure/machine-learning/how-to-enable-studio-virtual-network).
    mocks, _ = prod
    roles = _roles_of(mocks, "principal-ml-workspace")
    for endpoint in (
        "data-blob-endpoint",
        "logs-blob-endpoint",
        "ml-storage-blob-link-endpoint",
        "ml-storage-file-link-endpoint",
    ):
        assert (access.ROLES["Reader"], one(mocks, "PrivateEndpoint", endpoint).id) in roles, endpoint


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_storage_service_endpoint_sits_in_the_workspace_endpoints_subnet(dev, prod, stack):
    # "If the storage account uses a service endpoint, the workspace private endpoint and storage service
    # endpoint must be in the same subnet" (how-to-enable-studio-virtual-network, "Limitations").
    mocks, _ = dev if stack == "dev" else prod
    ws = one(mocks, "machinelearningservices:Workspace", "ml-workspace")
    endpoint = next(
        e
        for e in mocks.of_type("PrivateEndpoint")
        if e.inputs["privateLinkServiceConnections"][0]["privateLinkServiceId"] == ws.id
    )
    subnet = next(s for s in mocks.of_type("network:Subnet") if s.id == endpoint.inputs["subnet"]["id"])
    assert "Microsoft.Storage" in {e["service"] for e in subnet.inputs.get("serviceEndpoints") or []}
    rules = one(mocks, "StorageAccount", "ml-storage").inputs["networkRuleSet"]["virtualNetworkRules"]
    assert subnet.id in {r["virtualNetworkResourceId"] for r in rules}


# ---- item 14: datastores over storage that Azure ML's service cannot reach ----


def test_datastores_skip_the_validation_that_would_fail_the_up(prod, prod_data_out):
    # Azure ML validates a new datastore from its service; the data accounts take no public traffic (no
    # allowedClientIps), so that call fails. Datastores - Create Or Update: `skipValidation`
    # (https://learn.microsoft.com/rest/api/azureml/datastores/create-or-update).
    mocks, _ = prod
    stores = mocks.of_type("machinelearningservices:Datastore")
    assert len(stores) == 2 and all(s.inputs["skipValidation"] is True for s in stores)
    assert {s.inputs["properties"]["accountName"] for s in stores} == {
        prod_data_out["data_account_name"],
        prod_data_out["logs_account_name"],
    }


# ---- item 15: storage egress limited to the stack's accounts ----


def test_compute_reaches_only_the_stacks_storage_and_azure_mls(prod, prod_data_out):
    mocks, _ = prod
    policy = one(mocks, "ServiceEndpointPolicy", "egress-policy")
    compute = one(mocks, "Subnet", "net-compute").inputs
    # The policy applies to traffic over the subnet's Microsoft.Storage service endpoint
    # (virtual-network-service-endpoint-policies-overview): both on the compute subnet.
    assert [p["id"] for p in compute["serviceEndpointPolicies"]] == [policy.id]
    assert "Microsoft.Storage" in {e["service"] for e in compute["serviceEndpoints"]}
    defs = {d["service"]: d["serviceResources"] for d in policy.inputs["serviceEndpointPolicyDefinitions"]}
    ws_storage = one(mocks, "StorageAccount", "ml-storage").inputs
    ws_id = (
        f"/subscriptions/{mocked.SUBSCRIPTION}/resourceGroups/{one(mocks, 'ResourceGroup', 'platform').inputs['resourceGroupName']}"
        f"/providers/Microsoft.Storage/storageAccounts/{ws_storage['accountName']}"
    )
    assert sorted(defs["Microsoft.Storage"]) == sorted(
        [ws_id, prod_data_out["data_account_id"], prod_data_out["logs_account_id"], prod_data_out["nfs"]["account_id"]]
    )
    # Azure ML's compute needs Microsoft-managed accounts: the alias (how-to-prevent-data-loss-exfiltration).
    assert defs["Global"] == [egress.AML_ALIAS] == ["/services/Azure/MachineLearning"]
    assert policy.inputs["location"] == "westeurope"
    # The NSG opens storage of this region only: elsewhere there is no service endpoint and no policy.
    rules = one(mocks, "NetworkSecurityGroup", "net-compute-nsg").inputs["securityRules"]
    storage = {
        r["destinationAddressPrefix"]
        for r in rules
        if r["direction"] == "Outbound"
        and r["access"] == "Allow"
        and r["destinationAddressPrefix"].startswith("Storage")
    }
    assert storage == {"Storage.westeurope"}


def test_no_storage_egress_policy_without_restrict_outbound(dev):
    mocks, _ = dev
    assert not mocks.of_type("ServiceEndpointPolicy")
    assert not one(mocks, "Subnet", "net-compute").inputs.get("serviceEndpointPolicies")


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


# ---- issue 28, item 6: the roles Bastion's native client and Entra ID sign-in need ----

# Azure's built-in role ids, as Microsoft's "Azure built-in roles" page lists them
# (learn.microsoft.com/azure/role-based-access-control/built-in-roles, ms.date 2026-09-10), for example:
#   "| [Virtual Machine Administrator Login](built-in-roles/compute#virtual-machine-administrator-login) | View
#    Virtual Machines in the portal and login as administrator | 1c0163c0-47e6-4577-8991-ea5c82e286e4 |"
#   "| [Virtual Machine User Login](built-in-roles/compute#virtual-machine-user-login) | View Virtual Machines in
#    the portal and login as a regular user. | fb879df8-f326-4884-b1cf-06f3ad86be52 |"
#   "| [Reader](built-in-roles/general#reader) | View all resources, but does not allow you to make any changes. |
#    acdd72a7-3385-48ef-bd42-f606fba81ae7 |"
# and "Azure built-in roles for Compute" (learn.microsoft.com/azure/role-based-access-control/built-in-roles/compute,
# "Desktop Virtualization Power On Contributor"):
#   "id": "/providers/Microsoft.Authorization/roleDefinitions/489581de-a3bd-480d-9518-53dea7416b33"
# A role definition id Azure does not know fails the assignment in the middle of `pulumi up`.
BUILT_IN_ROLES = {
    "Reader": "acdd72a7-3385-48ef-bd42-f606fba81ae7",
    "Virtual Machine Administrator Login": "1c0163c0-47e6-4577-8991-ea5c82e286e4",
    "Virtual Machine User Login": "fb879df8-f326-4884-b1cf-06f3ad86be52",
    "Storage Blob Data Reader": "2a2b9908-6ea1-4ae2-8e65-a410df84e7d1",
    "Storage Blob Data Contributor": "ba92f5b4-2d11-453d-a403-e96b0029c9fe",
    "Storage File Data Privileged Contributor": "69566ab7-960f-475b-8e7c-b3118f30c6bd",
    "AzureML Data Scientist": "f6c7c914-8db3-469d-8ca1-694a8f32e121",
    "AcrPull": "7f951dda-4ed3-4680-a7ca-43fe172d538d",
    "AcrPush": "8311e382-0749-4cb8-b61a-304f252e45ec",
    # learn.microsoft.com/azure/role-based-access-control/built-in-roles/containers, Container Registry Tasks
    # Contributor: "Provides the ability to manage ACR tasks..." | fb382eab-e894-4461-af04-94435c366c3f
    "Container Registry Tasks Contributor": "fb382eab-e894-4461-af04-94435c366c3f",
    "Desktop Virtualization Power On Contributor": "489581de-a3bd-480d-9518-53dea7416b33",
    # learn.microsoft.com/azure/role-based-access-control/built-in-roles/monitor, Log Analytics Reader:
    # "id": "/providers/Microsoft.Authorization/roleDefinitions/73c42c96-874c-492b-b04d-ab87d138a893"
    "Log Analytics Reader": "73c42c96-874c-492b-b04d-ab87d138a893",
}
ALICE = "a11ce000-0000-4000-8000-000000000001"
BOB = "b0b00000-0000-4000-8000-000000000002"
TEAM = "7ea70000-0000-4000-8000-000000000003"


def test_role_ids_are_azures_built_in_ones():
    assert {role: access.ROLES[role] for role in access.ROLES} == {role: BUILT_IN_ROLES[role] for role in access.ROLES}
    assert {"Reader", "Virtual Machine User Login", "Virtual Machine Administrator Login"} <= set(access.ROLES)


def _way_in_ids(mocks):
    return (
        one(mocks, "compute:VirtualMachine", "wayin-jumphost").id,
        one(mocks, "NetworkInterface", "wayin-jumphost-nic").id,
        one(mocks, "BastionHost", "wayin-bastion").id,
    )


def test_every_user_can_connect_through_bastion_as_an_ordinary_user(prod):
    # Bastion's native client (learn.microsoft.com/azure/bastion/connect-vm-native-client-linux, "Verify roles and
    # ports"): "Reader role on the virtual machine. Reader role on the NIC with private IP of the virtual machine.
    # Reader role on the Azure Bastion resource. Virtual Machine Administrator Login or Virtual Machine User Login
    # role, if you're using the Azure AD sign-in method." Entra ID sign-in
    # (learn.microsoft.com/entra/identity/devices/howto-vm-sign-in-azure-ad-linux): "Virtual Machine User Login:
    # Users who have this role assigned can log in to an Azure virtual machine with regular user privileges";
    # "Users who are assigned the VM User role won't be able to run sudo."
    mocks, _ = prod  # no `users`: the deployer is the one user
    vm, nic, bastion = _way_in_ids(mocks)
    reader, user_login = access.ROLES["Reader"], access.ROLES["Virtual Machine User Login"]
    roles = _roles_of(mocks, mocked.DEPLOYER)
    assert {(reader, vm), (reader, nic), (reader, bastion), (user_login, vm)} <= roles
    assert BUILT_IN_ROLES["Virtual Machine Administrator Login"] not in {role for role, _ in roles}, "no sudo"


def test_jump_host_admins_get_administrator_login_and_everyone_the_readers(prod_raw, prod_data_out):
    users = [
        {"objectId": ALICE, "type": "User"},
        {"objectId": TEAM, "type": "Group"},
        {"objectId": BOB, "type": "User"},
    ]
    way_in = dict(prod_raw[0]["access"], jumpHostAdmins=[{"objectId": BOB.upper(), "type": "User"}])
    mocks, _ = _run(prod_raw, prod_data_out, users=users, access=way_in)
    vm, nic, bastion = _way_in_ids(mocks)
    reader = access.ROLES["Reader"]
    user_login = access.ROLES["Virtual Machine User Login"]
    admin_login = access.ROLES["Virtual Machine Administrator Login"]
    for principal, kind in ((ALICE, "User"), (TEAM, "Group"), (BOB, "User")):
        roles = _roles_of(mocks, principal)
        assert {(reader, vm), (reader, nic), (reader, bastion)} <= roles, principal
        logins = {role for role, scope in roles if scope == vm and role in (user_login, admin_login)}
        assert logins == ({admin_login} if principal == BOB else {user_login}), principal
        kinds = {
            r.inputs["principalType"] for r in mocks.of_type("RoleAssignment") if r.inputs["principalId"] == principal
        }
        assert kinds == {kind}
    assert _roles_of(mocks, mocked.DEPLOYER) == set(), "a listed set replaces the default"


@pytest.mark.parametrize(
    "admins,message",
    [
        (
            [{"objectId": ALICE, "type": "User"}],
            f"access.jumpHostAdmins[0].objectId = '{ALICE}': not one of the platform's users",
        ),
        (
            [{"objectId": "bob@example.com", "type": "User"}],
            "access.jumpHostAdmins[0].objectId = 'bob@example.com': an Entra object id (a GUID)",
        ),
        (
            [{"objectId": BOB, "type": "user"}],
            "access.jumpHostAdmins[0].type = 'user': User, Group or ServicePrincipal",
        ),
    ],
)
def test_bad_jump_host_admins_are_refused_before_anything_is_declared(prod_raw, prod_data_out, admins, message):
    raw, location = copy.deepcopy(prod_raw)
    raw.update(users=[{"objectId": BOB, "type": "User"}], access=dict(raw["access"], jumpHostAdmins=admins))
    mocks = mocked.RecordingMocks()
    with pytest.raises(config.ConfigError) as e:
        mocked.run(raw, "prod", location, mocks, data_outputs=prod_data_out)
    assert message in str(e.value) and mocks.resources == []


def test_jump_host_admins_belong_to_the_bastion_mode(prod_raw):
    raw = dict(copy.deepcopy(prod_raw[0]), access={"mode": "hub", "hubVnetId": HUB, "jumpHostAdmins": []})
    assert "access.jumpHostAdmins = []: not a setting of mode hub" in _problems(raw)


# ---- issue 28, item 17: the break-glass admin signs in with a key only; people with Entra ID ----


def test_the_jump_hosts_admin_account_takes_a_key_only(prod):
    # Azure Policy 630c64f9-8b6b-4c64-b511-6544ceff6fd6, "Authentication to Linux machines should require SSH
    # keys": "Although SSH itself provides an encrypted connection, using passwords with SSH still leaves the VM
    # vulnerable to brute-force attacks. The most secure option for authenticating to an Azure Linux virtual
    # machine over SSH is with a public-private key pair, also known as SSH keys." People sign in with Entra ID.
    mocks, _ = prod
    profile = one(mocks, "compute:VirtualMachine", "wayin-jumphost").inputs["osProfile"]
    linux = profile["linuxConfiguration"]
    assert linux["disablePasswordAuthentication"] is True and "adminPassword" not in profile
    assert [k["path"] for k in linux["ssh"]["publicKeys"]] == [f"/home/{wayin.ADMIN_USER}/.ssh/authorized_keys"]
    assert not mocks.of_type("RandomPassword"), "no password exists for the jump host, not even in the state"


def test_a_jump_host_without_a_key_is_refused_with_the_fix(prod_raw, prod_data_out):
    raw, location = copy.deepcopy(prod_raw)
    raw["jumpHostSshPublicKey"] = None  # the secret is not set
    mocks = mocked.RecordingMocks()
    with pytest.raises(config.ConfigError) as e:
        mocked.run(raw, "prod", location, mocks, data_outputs=prod_data_out)
    assert "pulumi config set --secret jumpHostSshPublicKey" in str(e.value)
    assert mocks.resources == [], "refused before anything is declared"


# ---- issue 28, item 12: allowedSubnetIds in the Key Vault's rules ----

RUNNERS = (
    "/subscriptions/33333333-3333-3333-3333-333333333333/resourceGroups/ci-rg/providers/"
    "Microsoft.Network/virtualNetworks/ci-vnet/subnets/runners"
)


def test_a_listed_subnet_without_the_key_vault_endpoint_does_not_fail_the_vault(dev_raw, dev_data):
    # Azure refuses a vault rule for a subnet without the Microsoft.KeyVault service endpoint:
    # "SubnetsHaveNoServiceEndpointsConfigured ... do not have ServiceEndpoints for Microsoft.KeyVault resources
    # configured. Add Microsoft.KeyVault to subnet's ServiceEndpoints collection before trying to ACL
    # Microsoft.KeyVault resources to these subnets." (Azure/avdaccelerator#818; Microsoft's "Configure Azure Key
    # Vault networking settings": "Enable a service endpoint for Key Vault on an existing virtual network and
    # subnet", then "Add a network rule"). allowedSubnetIds are the user's subnets, whose endpoints this program
    # neither declares nor sees; the documented requirement for them is Microsoft.Storage (the workspace storage).
    # Key Vault's VirtualNetworkRule.ignoreMissingVnetServiceEndpoint: "Property to specify whether NRP will
    # ignore the check if parent subnet has serviceEndpoints configured" (Key Vault REST API, 2023-07-01).
    raw, location = copy.deepcopy(dev_raw)
    raw["network"]["allowedSubnetIds"] = [RUNNERS]
    mocks, _ = mocked.run(raw, "dev", location, data_outputs=dev_data[1])
    rules = one(mocks, "keyvault:Vault", "ml-kv").inputs["properties"]["networkAcls"]["virtualNetworkRules"]
    by_id = {r["id"]: r for r in rules}
    assert by_id[RUNNERS].get("ignoreMissingVnetServiceEndpoint") is True
    # The compute subnet's endpoint is this program's own: Azure checks that rule as usual.
    compute = one(mocks, "Subnet", "net-compute")
    assert "Microsoft.KeyVault" in {e["service"] for e in compute.inputs["serviceEndpoints"]}
    assert not by_id[compute.id].get("ignoreMissingVnetServiceEndpoint")
    # The workspace storage still admits the listed subnet (it needs Microsoft.Storage, as documented).
    storage_rules = one(mocks, "StorageAccount", "ml-storage").inputs["networkRuleSet"]["virtualNetworkRules"]
    assert RUNNERS in {r["virtualNetworkResourceId"] for r in storage_rules}


# ---- issue 28, item 13: restrictOutbound with a public registry ----


def test_restricted_outbound_with_a_public_registry_is_refused(prod_raw, dev_raw):
    # With restrictOutbound the compute subnet gets a service endpoint policy over Microsoft.Storage
    # (egress.py): "Once a policy is configured on that subnet, only the resources specified in the policy can be
    # accessed from compute instances in that subnet. Access to all other resources, for the specific service,
    # will be denied." (virtual-network-service-endpoint-policies-overview). A registry reached over its public
    # endpoint serves image layers from storage: "Storage (data) endpoint - Allow access to all Azure blob storage
    # accounts using the wildcard *.blob.core.windows.net" (container-registry-firewall-access-rules); "The
    # registry service manages the data endpoint storage accounts" (container-registry-dedicated-data-endpoints),
    # so no policy can list them. Azure ML says the same of its own images: "If the container registry is
    # viennaglobal.azurecr.io you cannot use the curated environment with the data exfiltration preview"
    # (how-to-prevent-data-loss-exfiltration). A private registry's layers come through its private endpoint, which
    # the policy does not filter.
    raw = dict(copy.deepcopy(prod_raw[0]), registryPublicAccess=True)
    problems = _problems(raw)
    assert "registryPublicAccess = True: network.restrictOutbound" in problems
    assert "registryPublicAccess: false" in problems and "restrictOutbound: false" in problems
    # Each alone is fine: the private profile (private registry), the public profile (open outbound).
    assert _load(copy.deepcopy(prod_raw[0])).network.restrict_outbound is True
    assert _load(copy.deepcopy(dev_raw[0])).registry_public_access is True


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
    mocks, _ = _run(prod_raw, prod_data_out, access=way_in)
    schedule = one(mocks, "devtestlab:GlobalSchedule", "wayin-jumphost-shutdown").inputs
    assert (schedule["dailyRecurrence"]["time"], schedule["timeZoneId"]) == ("0730", "W. Europe Standard Time")
    off, _ = _run(prod_raw, prod_data_out, access=dict(prod_raw[0]["access"], jumpHostShutdownTime="off"))
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
    assert message in _problems(raw)


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
    mocks, _ = _run(prod_raw, prod_data_out, users=users, access=way_in)
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
    assert (POWER_ON, vm) in _roles_of(mocks, mocked.DEPLOYER)
    assert len(_starters(mocks)) == 1


def test_no_start_right_without_a_jump_host(dev, hub):
    # The public profile has no way in, hub mode no VM: nothing to start, no assignment.
    for mocks, _ in (dev, hub):
        assert not mocks.of_type("compute:VirtualMachine")
        assert _starters(mocks) == []


# ---- issue 28, item 16: Docker without root for the jump host's users ----


def _cloud_init(mocks) -> dict:
    """The jump host's cloud-init as the program hands it to Azure: the VM's custom data, base64."""
    vm = one(mocks, "compute:VirtualMachine", "wayin-jumphost")
    return yaml.safe_load(base64.b64decode(vm.inputs["osProfile"]["customData"]))


def test_users_get_docker_without_root_and_nobody_joins_the_docker_group(prod):
    # "The docker group grants root-level privileges to the user" (docs.docker.com/engine/install/linux-postinstall):
    # nobody is put in it. Rootless mode's prerequisites (docs.docker.com/engine/security/rootless): newuidmap and
    # newgidmap (Ubuntu's uidmap), /etc/subuid and /etc/subgid with "at least 65,536 subordinate UIDs/GIDs for the
    # user", and systemd --user (dbus-user-session); slirp4netns for its network.
    init = _cloud_init(prod[0])
    assert init == yaml.safe_load(wayin.CLOUD_INIT)
    assert {"uidmap", "dbus-user-session", "slirp4netns"} <= set(init["packages"])
    text = wayin.CLOUD_INIT
    assert "usermod" not in text and "groups" not in init and "users" not in init and "docker.sock" not in text
    hook = next(f for f in init["write_files"] if f["path"] == "/usr/local/sbin/subid-for-user")
    assert hook["content"] == wayin.SUBID_HOOK and hook["permissions"] == "0755"
    commands = [" ".join(c) if isinstance(c, list) else c for c in init["runcmd"]]
    assert any("pam_exec.so /usr/local/sbin/subid-for-user" in c and "/etc/pam.d/sshd" in c for c in commands)


# ---- issue 28, item 7: the tools on the jump host ----


def test_the_jump_host_runs_ubuntu_24_04_whose_python_runs_the_submission_install(prod):
    # The launcher needs Python 3.11 or later (infra/pyproject.toml: requires-python >= 3.11). Ubuntu 22.04's python3
    # is 3.10 and its python3.11 a release candidate (3.11.0~rc1-1~22.04.1, jammy-updates); Ubuntu 24.04's is 3.12
    # (3.12.3, noble), with python3-venv. Entra ID sign-in supports "Ubuntu 16.04 to Ubuntu 24.04"
    # (learn.microsoft.com/entra/identity/devices/howto-vm-sign-in-azure-ad-linux).
    mocks, _ = prod
    vm = one(mocks, "compute:VirtualMachine", "wayin-jumphost")
    assert vm.inputs["storageProfile"]["imageReference"] == {
        "publisher": "Canonical",
        "offer": "ubuntu-24_04-lts",
        "sku": "server",
        "version": "latest",
    }
    # The submission-only install: `python3 -m venv`, then pip from requirements-submit.txt (wheels only) and git to
    # clone the repository (docs/private-access.md#tools-on-the-jump-host).
    assert {"python3-venv", "git", "ca-certificates"} <= set(_cloud_init(mocks)["packages"])
    # A VM's image is fixed at creation ("Changing property 'imageReference' is not allowed"): a new one replaces the
    # VM, deleted first (its NIC serves one VM at a time), like an osProfile change.
    opts = mocks.options["wayin-jumphost"]
    assert {"osProfile", "storageProfile.imageReference"} <= set(opts.replace_on_changes)
    assert opts.delete_before_replace is True


def test_docker_comes_from_dockers_repository_with_the_rootless_extras(prod):
    # Ubuntu's docker.io ships no rootless scripts: 29.1.3-0ubuntu3~22.04.2 and ~24.04.2 hold only check-config.sh and
    # nuke-graph-directory.sh under /usr/share/docker.io/contrib (dpkg -c, 2026-11-26). Docker's packages do: "If you
    # installed Docker 20.10 or later with RPM/DEB packages, you should have dockerd-rootless-setuptool.sh in /usr/bin
    # ... you may need to install the docker-ce-rootless-extras package" (docs.docker.com/engine/security/rootless).
    # docker-ce conflicts with docker.io and docker-ce-rootless-extras with Ubuntu's rootlesskit
    # (docker-ce-packaging, deb/common/control): neither is installed beside them.
    init = _cloud_init(prod[0])
    assert not {"docker.io", "rootlesskit", "docker-compose"} & set(init["packages"])
    assert "/usr/share/docker.io/contrib" not in wayin.CLOUD_INIT
    script = next(f for f in init["write_files"] if f["path"] == "/usr/local/sbin/install-docker")
    assert script["content"] == wayin.DOCKER_INSTALL and script["permissions"] == "0755"
    install = [line for line in wayin.DOCKER_INSTALL.splitlines() if line.startswith("DEBIAN_FRONTEND=")]
    assert install and install[0].split("install -y ")[1].split() == list(wayin.DOCKER_PACKAGES)
    assert "docker-ce-rootless-extras" in wayin.DOCKER_PACKAGES
    assert "https://download.docker.com/linux/ubuntu" in wayin.DOCKER_INSTALL
    assert "signed-by=$keyring" in wayin.DOCKER_INSTALL and "set -eu" in wayin.DOCKER_INSTALL
    # Docker is installed before its daemon is enabled, after the packages (cloud-init's packages run before runcmd).
    commands = [" ".join(c) for c in init["runcmd"]]
    assert commands.index("/usr/local/sbin/install-docker") < commands.index("systemctl enable --now docker")


@pytest.mark.skipif(shutil.which("gpg") is None, reason="needs gpg")
def test_the_docker_repository_key_is_taken_only_with_dockers_fingerprint(tmp_path):
    # The apt source trusts every key in its keyring file (signed-by): the file must hold Docker's release key, "the
    # key with the fingerprint 9DC8 5822 9FC7 DD38 854A E2D8 8D81 803C 0EBF CD88" (docs.docker.com/engine/install/
    # ubuntu, earlier edition), alone. Checked here with keys of our own, by the script's own check.
    assert wayin.DOCKER_KEY_FINGERPRINT == "9DC8 5822 9FC7 DD38 854A E2D8 8D81 803C 0EBF CD88".replace(" ", "")
    script = tmp_path / "install-docker"
    script.write_text(wayin.DOCKER_INSTALL)
    home = tmp_path / "gnupg"
    home.mkdir(mode=0o700)
    env = {"PATH": os.environ["PATH"], "GNUPGHOME": str(home)}
    keys = {}
    for who in ("docker", "other"):
        subprocess.run(
            ["gpg", "--batch", "--pinentry-mode", "loopback", "--passphrase", "", "--quick-gen-key", f"{who} <{who}@test>",
             "ed25519", "default", "never"],
            env=env, check=True, capture_output=True,
        )  # fmt: skip
        armored = subprocess.run(
            ["gpg", "--armor", "--export", f"{who}@test"], env=env, check=True, capture_output=True
        )
        (tmp_path / f"{who}.asc").write_bytes(armored.stdout)
        listing = subprocess.run(
            ["gpg", "--show-keys", "--with-colons", str(tmp_path / f"{who}.asc")],
            env=env,
            capture_output=True,
            text=True,
        ).stdout
        keys[who] = next(line.split(":")[9] for line in listing.splitlines() if line.startswith("fpr:"))
    (tmp_path / "both.asc").write_bytes((tmp_path / "docker.asc").read_bytes() + (tmp_path / "other.asc").read_bytes())
    (tmp_path / "junk.asc").write_text("<html>not a key</html>")

    def verify(name: str) -> int:
        # TMPDIR: the check's `mktemp -d` GnuPG home stays under tmp_path, not in /tmp
        run_env = {"PATH": os.environ["PATH"], "DOCKER_KEY_FINGERPRINT": keys["docker"], "TMPDIR": str(tmp_path)}
        return subprocess.run(["sh", str(script), "verify", str(tmp_path / name)], env=run_env).returncode

    assert verify("docker.asc") == 0
    assert verify("other.asc") != 0, "another key"
    assert verify("both.asc") != 0, "Docker's key plus another: apt would trust both"
    assert verify("junk.asc") != 0, "a page that is no key"
    assert subprocess.run(["sh", "-n", str(script)]).returncode == 0


def test_the_sign_in_hook_gives_each_user_a_range_of_their_own_once(tmp_path):
    import subprocess

    hook = tmp_path / "hook"
    hook.write_text(wayin.SUBID_HOOK)
    (tmp_path / "subuid").write_text("azureuser:100000:65536\n")

    def sign_in(user):
        env = {"PATH": "/usr/bin:/bin", "PAM_USER": user, "PAM_TYPE": "open_session", "SUBID_DIR": str(tmp_path)}
        subprocess.run(["sh", str(hook)], env=env, check=True)

    for user in ("alice@contoso.com", "bob@contoso.com", "alice@contoso.com", "root"):
        sign_in(user)
    for name in ("subuid", "subgid"):
        rows = [line.split(":") for line in (tmp_path / name).read_text().splitlines()]
        users = [r[0] for r in rows]
        assert sorted(users) == sorted({*users}) and "root" not in users, "one range per user, once"
        assert {"alice@contoso.com", "bob@contoso.com"} <= set(users)
        ranges = sorted((int(r[1]), int(r[1]) + int(r[2])) for r in rows)
        assert all(end - start >= 65536 for start, end in ranges)
        assert all(a_end <= b_start for (_, a_end), (b_start, _) in zip(ranges, ranges[1:])), "disjoint"
        # Entra users' own uids are hashes in the millions: their ranges start above, and stay in uid_t
        signed_in = [(int(r[1]), int(r[1]) + int(r[2])) for r in rows if r[0] != "azureuser"]
        assert all(start >= wayin.SUBID_START and end < 2**32 for start, end in signed_in), signed_in


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
        mocks, _ = _run(prod_raw, prod_data_out, access={"mode": "hub", "hubVnetId": HUB}, users=people)
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


def test_no_role_is_ever_given_to_the_jump_hosts_own_identity(prod_raw, prod_data_out):
    """Issue 43, item 13: the jump host's system-assigned identity exists for Entra sign-in over SSH only. Anyone who
    signs in there could use a role given to it (the credential chain once picked it before the person's own sign-in:
    launcher/credential.py), so no role assignment anywhere in the platform names it."""
    mocks, _ = _run(prod_raw, prod_data_out)
    (vm,) = [r for r in mocks.resources if r.type.endswith(":VirtualMachine")]
    assert vm.inputs["identity"]["type"] == "SystemAssigned"
    own = f"principal-{vm.name}"  # what the mocks answer as its identity's principalId
    assignments = [r for r in mocks.resources if r.type.endswith(":RoleAssignment")]
    assert assignments, "the platform assigns roles: the scan scanned something"
    assert [a.name for a in assignments if a.inputs.get("principalId") == own] == []
    assert all(a.inputs.get("principalId") for a in assignments), "every assignment names its principal"
