"""The private profile (Pulumi.prod.yaml) under mocks, the services behind its way in: images pushed by their
builders only, the studio's data preview, datastores that skip validation, storage egress held to the stack's
accounts, the Key Vault's listed subnets, and no restricted outbound with a public registry."""

import copy

import pytest
from infra_helpers import one
from wayin_helpers import ALICE, BOB, BUILT_IN_ROLES, TEAM, load_config, problems_of, roles_of, run_stack

from trainingplatform import access, config, egress, mocked

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
    assert {role for role, scope in roles_of(mocks, mocked.DEPLOYER) if scope == acr.id} == {pull, push}
    assert not [r for r in dev[0].of_type("RoleAssignment") if r.inputs["roleDefinitionId"].endswith(push)]
    listed = run_stack(
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
        assert {role for role, scope in roles_of(listed, user) if scope == acr.id} == {pull}, user
    # No Tasks role on a private registry: `az acr build` cannot reach it (docker push from the jump host).
    assert not [r for r in listed.of_type("RoleAssignment") if r.inputs["roleDefinitionId"].endswith(tasks)]
    # A public registry: the builders build with `az acr build` (docs/images.md), whose quick runs need Container
    # Registry Tasks Contributor, which AcrPush does not include ("registries/scheduleRun/action").
    raw = dict(copy.deepcopy(dev_raw[0]), imageBuilders=[{"objectId": TEAM, "type": "Group"}])
    public = mocked.run(raw, "dev", dev_raw[1], data_outputs=dev_data[1])[0]
    dev_acr = one(public, "Registry", "registry-acr")
    assert {role for role, scope in roles_of(public, TEAM) if scope == dev_acr.id} == {push, tasks}
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


FIX = "imageBuilders: [{objectId: <group id>, type: Group}] in Pulumi.prod.yaml"


def _pushers(mocks):
    push = access.ROLES["AcrPush"]
    return {
        r.inputs["principalId"] for r in mocks.of_type("RoleAssignment") if r.inputs["roleDefinitionId"].endswith(push)
    }


def test_a_private_registry_refuses_other_users_without_builders(prod_raw, prod_data_out):
    # Issue 54, item 14: without imageBuilders every user gets AcrPush on the private registry (platform_grants), so
    # any of them could replace the image every job and every resume runs. Refused, with the fix, before anything is
    # declared, once users names anyone but the deployer (getClientConfig's objectId, which the mocks answer).
    deployer = {"objectId": mocked.DEPLOYER.upper(), "type": "User"}  # listed ids are compared lower-cased
    for users in ([deployer, {"objectId": ALICE, "type": "User"}], [{"objectId": TEAM, "type": "Group"}]):
        raw, location = copy.deepcopy(prod_raw)
        raw.update(users=users)
        mocks = mocked.RecordingMocks()
        with pytest.raises(config.ConfigError) as e:
            mocked.run(raw, "prod", location, mocks, data_outputs=prod_data_out)
        (line,) = [p for p in e.value.problems if "imageBuilders" in p]
        assert FIX in line and "AcrPush" in line and "\n" not in line, line
        assert mocks.resources == [], "refused before anything is declared"


def test_a_private_registry_without_builders_takes_the_deployer_alone_or_the_builders(prod, prod_raw, prod_data_out):
    # The deployer alone, by default (the shipped Pulumi.prod.yaml lists no users) or listed: the deployer pushes.
    assert _pushers(prod[0]) == {mocked.DEPLOYER}
    alone = run_stack(prod_raw, prod_data_out, users=[{"objectId": mocked.DEPLOYER.upper(), "type": "User"}])[0]
    assert _pushers(alone) == {mocked.DEPLOYER}
    # imageBuilders set: accepted with any users, and the builders alone push.
    users = [{"objectId": mocked.DEPLOYER, "type": "User"}, {"objectId": ALICE, "type": "User"}]
    built = run_stack(prod_raw, prod_data_out, users=users, imageBuilders=[{"objectId": TEAM, "type": "Group"}])[0]
    assert _pushers(built) == {TEAM}
    # A public registry grants nobody AcrPush without imageBuilders: nothing to refuse.
    public = run_stack(
        prod_raw,
        prod_data_out,
        users=users,
        registryPublicAccess=True,
        network=dict(prod_raw[0]["network"], restrictOutbound=False),
    )[0]
    assert _pushers(public) == set()
    # The settings alone carry no warning any more: config cannot tell the deployer from the others.
    assert not any("imageBuilders" in w for w in load_config(copy.deepcopy(prod_raw[0])).warnings)


# ---- item 12: the studio's data preview ----


def test_workspace_identity_reads_the_storage_private_endpoints(prod):
    # "Add the workspace managed identity to the Reader role for the storage private endpoint(s)"
    # (https://learn.microsoft.com/azure/machine-learning/how-to-enable-studio-virtual-network).
    mocks, _ = prod
    roles = roles_of(mocks, "principal-ml-workspace")
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
    problems = problems_of(raw)
    assert "registryPublicAccess = True: network.restrictOutbound" in problems
    assert "registryPublicAccess: false" in problems and "restrictOutbound: false" in problems
    # Each alone is fine: the private profile (private registry), the public profile (open outbound).
    assert load_config(copy.deepcopy(prod_raw[0])).network.restrict_outbound is True
    assert load_config(copy.deepcopy(dev_raw[0])).registry_public_access is True
