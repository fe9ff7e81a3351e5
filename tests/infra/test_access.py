"""People's access (config `users`) and role-assignment names.

Azure's rules these tests hold the program to:
- With shared keys off and identity-based system datastores, azure-ai-ml uploads a job's code snapshot
  with the submitting user's token: users need Storage Blob Data Contributor and Storage File Data
  Privileged Contributor on the workspace storage (learn.microsoft.com/azure/machine-learning/
  how-to-disable-local-auth-storage); submitting needs AzureML Data Scientist on the workspace.
- principalType must be given for principals that may be new (Azure: "set principalType ... to avoid a
  replication delay" error, PrincipalNotFound; learn.microsoft.com/azure/role-based-access-control/
  role-assignments-template#new-service-principal) and must match the principal (UnmatchedPrincipalType).
- An assignment's principal cannot change (RoleAssignmentUpdateNotPermitted): names must be derived from
  scope, principal and role, as Azure's templates do with guid(scope, principalId, roleDefinitionId).
- Azure holds one assignment per (scope, principal, role): a second one, whatever its name, is refused with
  RoleAssignmentExists (learn.microsoft.com/azure/role-based-access-control/troubleshooting, "Role
  assignment already exists"), so no two stacks may declare the same triple.
"""

import copy
import json
import re
import uuid

import pytest
from infra_helpers import one

from trainingplatform import access, config, mocked

# Azure's built-in role ids, as Microsoft's "Azure built-in roles" page lists them (learn.microsoft.com/azure/
# role-based-access-control/built-in-roles; the role JSON's "name"), not taken from trainingplatform.access:
# a role definition id Azure does not know fails the assignment in the middle of `pulumi up`.
BUILT_IN_ROLES = {
    "Storage Blob Data Reader": "2a2b9908-6ea1-4ae2-8e65-a410df84e7d1",
    "Storage Blob Data Contributor": "ba92f5b4-2d11-453d-a403-e96b0029c9fe",
    "Storage File Data Privileged Contributor": "69566ab7-960f-475b-8e7c-b3118f30c6bd",
    "AzureML Data Scientist": "f6c7c914-8db3-469d-8ca1-694a8f32e121",
    "AcrPull": "7f951dda-4ed3-4680-a7ca-43fe172d538d",
    # "Azure built-in roles for Monitor", Log Analytics Reader: "id":
    # "/providers/Microsoft.Authorization/roleDefinitions/73c42c96-874c-492b-b04d-ab87d138a893", "roleName":
    # "Log Analytics Reader", "description": "Log Analytics Reader can view and search all monitoring data as well as
    # and view monitoring settings, including viewing the configuration of Azure diagnostics on all Azure resources."
    "Log Analytics Reader": "73c42c96-874c-492b-b04d-ab87d138a893",
}
ALICE = "3f2504e0-4f89-41d3-9a0c-0305e82c3301"
TEAM = "7c9e6679-7425-40de-944b-e07fc1f90ae7"
BOB = "9b2d5b1a-1c3e-4d5f-8a7b-6c5d4e3f2a10"


def _run(dev_raw, dev_data, users=None):
    raw = copy.deepcopy(dev_raw[0])
    if users is not None:
        raw["users"] = users
    return mocked.run(raw, "dev", dev_raw[1], data_outputs=dev_data[1])[0]


def _expected(mocks):
    """A user's roles on the platform's own resources (the dev profile: a public registry)."""
    ws_storage = one(mocks, "StorageAccount", "ml-storage").id
    quota_role = one(mocks, "RoleDefinition", "quota-role").inputs
    return {
        (BUILT_IN_ROLES["Storage Blob Data Contributor"], ws_storage),
        (BUILT_IN_ROLES["Storage File Data Privileged Contributor"], ws_storage),
        (BUILT_IN_ROLES["AzureML Data Scientist"], one(mocks, "machinelearningservices:Workspace", "ml-workspace").id),
        # the doctor's image check lists the registry's tags: AcrPull
        (BUILT_IN_ROLES["AcrPull"], one(mocks, "Registry", "registry-acr").id),
        # the cost ledger queries the status log in the stack's Log Analytics workspace, and nothing else there
        (BUILT_IN_ROLES["Log Analytics Reader"], one(mocks, "operationalinsights:Workspace", "ml-log-analytics").id),
        # the submission's quota check reads the subscription's Azure ML quota: the stack's own narrow role, there
        (quota_role["roleDefinitionId"], quota_role["scope"]),
    }


USER_ROLES = 6  # the five above and the quota reader


def _expected_data(data_mocks):
    """A user's roles on the data stack's containers (granted by the data stack)."""
    data = one(data_mocks, "StorageAccount", "storage-data").id
    logs = one(data_mocks, "StorageAccount", "storage-logs").id
    return {
        (BUILT_IN_ROLES["Storage Blob Data Contributor"], f"{data}/blobServices/default/containers/training-data"),
        (BUILT_IN_ROLES["Storage Blob Data Reader"], f"{logs}/blobServices/default/containers/logs"),
    }


def _roles(grants):
    return {(r.inputs["roleDefinitionId"].rsplit("/", 1)[1], r.inputs["scope"]) for r in grants}


def _grants_of(mocks, principal):
    return [r for r in mocks.of_type("RoleAssignment") if r.inputs["principalId"] == principal]


def test_the_deployer_gets_the_user_roles_by_default(dev, dev_data):
    mocks, _ = dev
    grants = _grants_of(mocks, mocked.DEPLOYER)  # getClientConfig's objectId: whoever runs `pulumi up`
    assert _roles(grants) == _expected(mocks) and len(grants) == USER_ROLES
    data_grants = _grants_of(dev_data[0], mocked.DEPLOYER)
    assert _roles(data_grants) == _expected_data(dev_data[0]) and len(data_grants) == 2
    grants += data_grants
    # A person after `az login`; CI deployers (service principals) list `users` instead, since Azure
    # refuses a principalType that does not match (UnmatchedPrincipalType).
    assert {r.inputs["principalType"] for r in grants} == {"User"}


def test_a_deployer_who_lists_themselves_keeps_the_same_assignments(dev, dev_raw, dev_data):
    # The README tells a deployer who adds teammates to list themselves too. Were the default's resources
    # named apart from the listed ones, that change would plan creates of assignments that exist (Azure
    # refuses them) and deletes of the same assignments.
    default = {
        (r.name, r.inputs["principalId"], r.inputs["principalType"]) for r in _grants_of(dev[0], mocked.DEPLOYER)
    }
    listed = _run(dev_raw, dev_data, [{"objectId": mocked.DEPLOYER.upper(), "type": "User"}])
    assert {
        (r.name, r.inputs["principalId"], r.inputs["principalType"]) for r in _grants_of(listed, mocked.DEPLOYER)
    } == default
    assert len(default) == USER_ROLES


def test_listed_users_and_groups_get_exactly_the_user_roles_with_their_principal_type(dev_raw, dev_data):
    mocks = _run(dev_raw, dev_data, [{"objectId": ALICE, "type": "User"}, {"objectId": TEAM.upper(), "type": "Group"}])
    expected = _expected(mocks)
    for principal, kind in ((ALICE, "User"), (TEAM, "Group")):
        grants = _grants_of(mocks, principal)
        assert _roles(grants) == expected
        assert len(grants) == USER_ROLES and {r.inputs["principalType"] for r in grants} == {kind}
    assert _grants_of(mocks, mocked.DEPLOYER) == [], "a listed set replaces the default"
    identities = {"principal-compute-identity", "principal-ml-workspace", ALICE, TEAM}
    assert {r.inputs["principalId"] for r in mocks.of_type("RoleAssignment")} == identities, "nobody else"


def test_an_empty_list_grants_no_user_roles(dev_raw, dev_data):
    mocks = _run(dev_raw, dev_data, [])
    assert {r.inputs["principalId"] for r in mocks.of_type("RoleAssignment")} == {
        "principal-compute-identity",
        "principal-ml-workspace",
    }


def test_assignment_names_change_with_the_principal_and_stay_put_otherwise(dev_raw, dev_data):
    first = _run(dev_raw, dev_data, [{"objectId": ALICE, "type": "User"}])
    again = _run(dev_raw, dev_data, [{"objectId": ALICE, "type": "User"}])
    swapped = _run(dev_raw, dev_data, [{"objectId": BOB, "type": "User"}])

    def names(mocks, principal):
        return {
            (r.inputs["roleDefinitionId"], r.inputs["scope"]): r.inputs["roleAssignmentName"]
            for r in _grants_of(mocks, principal)
        }

    assert names(first, ALICE) == names(again, ALICE), "the same grant keeps its name (no churn on every up)"
    alice, bob = names(first, ALICE), names(swapped, BOB)
    assert alice.keys() == bob.keys() and len(alice) == USER_ROLES
    for key in alice:  # same scope and role, another principal: another assignment, never an update
        assert alice[key] != bob[key], key
    every = [r.inputs["roleAssignmentName"] for r in first.of_type("RoleAssignment")]
    assert len(set(every)) == len(every)
    assert all(str(uuid.UUID(n)) == n for n in every), "Azure wants a GUID as the assignment name"


def test_assignment_name_is_a_function_of_scope_principal_role_and_stack():
    base = access.assignment_name("/s/a", "p1", "/r/1", "dev")
    assert base == access.assignment_name("/S/A", "P1", "/R/1", "dev")  # ARM ids compare case-insensitively
    assert (
        len(
            {
                base,
                access.assignment_name("/s/b", "p1", "/r/1", "dev"),
                access.assignment_name("/s/a", "p2", "/r/1", "dev"),
                access.assignment_name("/s/a", "p1", "/r/2", "dev"),
                access.assignment_name("/s/a", "p1", "/r/1", "dev2"),
            }
        )
        == 5
    )


def _triples(mocks, stack):
    # The mocks name a managed identity's principal after its logical name; in Azure each stack's identities
    # are principals of their own, so those are told apart by stack here.
    def principal(p):
        return f"{stack}/{p}" if p.startswith("principal-") else p.lower()

    # Likewise a resource's id: Azure's names its resource group, the mocks' does not (only the type and name). A
    # resource that Pulumi names itself (the Log Analytics workspace) has the same mock id in every platform stack,
    # though in Azure each is in its own stack's resource group: a scope at or under a resource in the platform's own
    # group is told apart by that group here. The data stack's resources are not in it: their ids stay as they are.
    group = next((r.inputs["resourceGroupName"] for r in mocks.of_type("ResourceGroup") if r.name == "platform"), None)
    own = [r.id.lower() for r in mocks.resources if group and r.inputs.get("resourceGroupName") == group]

    def scope(s):
        s = s.lower()
        return f"{group}:{s}" if any(s == i or s.startswith(i + "/") for i in own) else s

    return [
        (scope(r.inputs["scope"]), principal(r.inputs["principalId"]), r.inputs["roleDefinitionId"].lower())
        for r in mocks.of_type("RoleAssignment")
    ]


def test_two_platform_stacks_on_one_data_stack_never_claim_the_same_assignment(dev_raw, dev_data_raw):
    # Team A and team B, each a platform stack, both on the data stack `shared`, with the same users.
    shared = "organization/azure-horovod-training-data/shared"
    users = [{"objectId": ALICE, "type": "User"}, {"objectId": TEAM, "type": "Group"}]
    data_mocks, data_out = mocked.run_data(dict(copy.deepcopy(dev_data_raw[0]), users=users), "shared", dev_data_raw[1])
    stacks = {"data": data_mocks}
    for team in ("team-a", "team-b"):
        raw = dict(copy.deepcopy(dev_raw[0]), users=users, dataStack=shared)
        stacks[team] = mocked.run(raw, team, dev_raw[1], data_outputs=data_out)[0]
    owner = {}
    for stack, mocks in stacks.items():
        for triple in _triples(mocks, stack):
            # Azure keeps one per triple: the second `up` would fail, and either destroy revoke both.
            assert triple not in owner, f"{stack} and {owner.get(triple)} both grant {triple}"
            owner[triple] = stack
    # Data access is the data stack's grant; each platform grants its users on its own resources only.
    for user in (ALICE, TEAM):
        assert _roles(_grants_of(data_mocks, user)) == _expected_data(data_mocks)
        for team in ("team-a", "team-b"):
            assert _roles(_grants_of(stacks[team], user)) == _expected(stacks[team])
    names = [r.inputs["roleAssignmentName"] for m in stacks.values() for r in m.of_type("RoleAssignment")]
    assert len(set(names)) == len(names)


def test_role_assignments_are_deleted_before_they_are_replaced(dev):
    # A replaced assignment of the same triple (a renamed one) cannot be created while the old one exists.
    mocks, _ = dev
    for r in mocks.of_type("RoleAssignment"):
        assert mocks.options[r.name].delete_before_replace is True, r.name


@pytest.mark.parametrize("how", ["ARM_CLIENT_ID", "ARM_USE_OIDC", "azure-native:clientId"])
def test_a_service_principal_deployment_without_users_is_refused_with_the_fix(dev_raw, dev_data_raw, monkeypatch, how):
    # Without `users` the deployer gets the user roles as principalType User; for a service principal Azure
    # refuses that (UnmatchedPrincipalType) in the middle of `up`. The provider signs in as a service
    # principal when these are set (pulumi.com/registry/packages/azure-native/installation-configuration).
    if how.startswith("ARM_"):
        monkeypatch.setenv(how, "true" if how == "ARM_USE_OIDC" else "44444444-4444-4444-4444-444444444444")
    else:
        monkeypatch.setenv("PULUMI_CONFIG", '{"azure-native:clientId": "44444444-4444-4444-4444-444444444444"}')
    for run, raw in ((mocked.run, dev_raw), (mocked.run_data, dev_data_raw)):
        mocks = mocked.RecordingMocks()
        with pytest.raises(config.ConfigError) as e:
            kwargs = {"data_outputs": {}} if run is mocked.run else {}
            run(copy.deepcopy(raw[0]), "dev", raw[1], mocks=mocks, **kwargs)
        assert "signs in as a service principal" in str(e.value) and how in str(e.value)
        assert "UnmatchedPrincipalType" in str(e.value) and "users[0].objectId" in str(e.value)
        assert mocks.resources == [], "refused before anything is declared"
    # Listing the users is the fix.
    raw = dict(copy.deepcopy(dev_data_raw[0]), users=[{"objectId": ALICE, "type": "User"}])
    mocks, _ = mocked.run_data(raw, "dev", dev_data_raw[1])
    assert {r.inputs["principalId"] for r in mocks.of_type("RoleAssignment")} == {ALICE}


def _cli_profile(folder, *accounts):
    """azureProfile.json as azure-cli writes it (UTF-8 with a byte-order mark): (subscription, user type, default)."""
    subs = [
        {"id": sub, "isDefault": default, "user": {"name": "55555555-5555-5555-5555-555555555555", "type": kind}}
        for sub, kind, default in accounts
    ]
    (folder / "azureProfile.json").write_text(json.dumps({"installationId": "x", "subscriptions": subs}), "utf-8-sig")


def test_an_azure_cli_service_principal_login_without_users_is_refused(dev_raw, tmp_path, monkeypatch):
    # `az login --service-principal` (or --identity) sets no provider setting or ARM_* variable: the provider
    # uses the CLI's login, which azureProfile.json records with user.type "servicePrincipal".
    monkeypatch.setenv("AZURE_CONFIG_DIR", str(tmp_path))
    _cli_profile(tmp_path, (mocked.SUBSCRIPTION, "servicePrincipal", True))
    mocks = mocked.RecordingMocks()
    with pytest.raises(config.ConfigError) as e:
        mocked.run(copy.deepcopy(dev_raw[0]), "dev", dev_raw[1], mocks=mocks)
    assert "signs in as a service principal (the Azure CLI's login as 55555555-" in str(e.value)
    assert "UnmatchedPrincipalType" in str(e.value) and mocks.resources == []


def test_the_cli_account_is_the_pinned_subscriptions_not_the_default(tmp_path, monkeypatch):
    monkeypatch.setenv("AZURE_CONFIG_DIR", str(tmp_path))
    other = "11111111-1111-1111-1111-111111111111"
    _cli_profile(tmp_path, (other, "servicePrincipal", True), (mocked.SUBSCRIPTION.upper(), "user", False))
    assert access.azure_cli_account(mocked.SUBSCRIPTION)["user"]["type"] == "user"
    assert access.azure_cli_account(None)["id"] == other  # nothing pinned: the CLI's default
    monkeypatch.setenv("PULUMI_CONFIG", json.dumps({"azure-native:subscriptionId": mocked.SUBSCRIPTION}))
    assert access.signed_in_as_service_principal() == []
    monkeypatch.setenv("PULUMI_CONFIG", json.dumps({"azure-native:subscriptionId": other}))
    assert "the Azure CLI's login as" in access.signed_in_as_service_principal()[0]
    (tmp_path / "azureProfile.json").write_text("{not json")
    assert access.azure_cli_account(other) is None  # an unreadable profile: the provider reports its own sign-in


@pytest.mark.parametrize(
    "users,message",
    [
        (
            [{"objectId": "alice@example.com", "type": "User"}],
            "users[0].objectId = 'alice@example.com': an Entra object id (a GUID), not a name or e-mail",
        ),
        ([{"objectId": ALICE, "type": "user"}], "users[0].type = 'user': User, Group or ServicePrincipal"),
        ([{"objectId": ALICE}, {"objectId": ALICE.upper(), "type": "User"}], "listed twice"),
        ([ALICE], "expected {objectId: <guid>, type: User|Group|ServicePrincipal}"),
    ],
)
def test_bad_users_fail_before_anything_is_declared(dev_raw, users, message):
    raw = dict(copy.deepcopy(dev_raw[0]), users=users)
    mocks = mocked.RecordingMocks()
    with pytest.raises(config.ConfigError) as e:
        mocked.run(raw, "dev", dev_raw[1], mocks=mocks)
    assert message in str(e.value) and mocks.resources == []
    assert re.search(r"az ad (user|group) show|objectId|User, Group", str(e.value))


# ---- issue 28, item 9: the platform's users read the subscription's Azure ML quota ----


def test_users_read_azure_mls_quota_through_a_narrow_role_of_the_stacks_own(dev, dev_raw, dev_data):
    # The submission's quota check reads Usages - List, Virtual Machine Sizes - List and Quotas - List at the
    # subscription, which workspace roles cannot. Azure's permissions for them ("Azure permissions for AI + machine
    # learning", Microsoft.MachineLearningServices): locations/usages/read "Usage report for aml compute resources in a
    # subscription", locations/vmsizes/read "Get supported vm sizes", locations/quotas/read "Gets the currently assigned
    # Workspace Quotas based on VMFamily". tests/azurecheck/test_quota_reader.py holds them to the calls the check makes.
    mocks, outputs = dev
    subscription = f"/subscriptions/{mocked.SUBSCRIPTION}"
    role = one(mocks, "RoleDefinition", "quota-role").inputs
    assert role["permissions"] == [
        {
            "actions": [
                "Microsoft.MachineLearningServices/locations/usages/read",
                "Microsoft.MachineLearningServices/locations/vmsizes/read",
                "Microsoft.MachineLearningServices/locations/quotas/read",
            ]
        }
    ], "reads only: no write, no other provider, no data actions"
    assert role["scope"] == subscription and role["assignableScopes"] == [subscription]
    assert role["roleType"] == "CustomRole" and str(uuid.UUID(role["roleDefinitionId"])) == role["roleDefinitionId"]
    # Custom role names are unique in the tenant: the stack and the subscription are in it.
    assert role["roleName"] == f"Azure ML quota reader (hvd-dev, subscription {mocked.SUBSCRIPTION})"
    assert outputs["quota_reader_role"] == role["roleName"], "the quota check names it"
    # Each user holds it at the subscription, with the assignment waiting for the role to exist.
    grant = one(mocks, "RoleAssignment", f"quota-user-{mocked.DEPLOYER}")
    assert grant.inputs["scope"] == subscription and grant.inputs["principalType"] == "User"
    assert grant.inputs["roleDefinitionId"] == (
        f"{subscription}/providers/Microsoft.Authorization/roleDefinitions/{role['roleDefinitionId']}"
    )
    # A custom role just written is not yet on every replica of Azure's authorization service: the assignment waits
    # for the pause after the role (create), and on destroy the role waits for the pause after the assignments.
    assert mocks.depends_on(grant.name) == {"quota-role-settled"}
    assert mocks.depends_on("quota-role-settled") == {"quota-role"}
    pause = one(mocks, "time:index/sleep:Sleep", "quota-role-settled").inputs
    assert pause["createDuration"] == "120s" and pause["destroyDuration"] == "60s"
    assert pause["triggers"] == {"after": one(mocks, "RoleDefinition", "quota-role").id}, "a new role: waited for again"
    assert mocks.options[grant.name].delete_before_replace is True
    # The same on every `up`; another stack has a role of its own (destroying one never takes the other's away).
    again = _run(dev_raw, dev_data)
    assert one(again, "RoleDefinition", "quota-role").inputs == role
    other = mocked.run(copy.deepcopy(dev_raw[0]), "team-b", dev_raw[1], data_outputs=dev_data[1])[0]
    theirs = one(other, "RoleDefinition", "quota-role").inputs
    assert theirs["roleDefinitionId"] != role["roleDefinitionId"] and theirs["roleName"] != role["roleName"]
    assert access.quota_reader_role_id("hvd", "dev", mocked.SUBSCRIPTION) != access.quota_reader_role_id(
        "hvd", "dev", "11111111-1111-1111-1111-111111111111"
    ), "another subscription, another role"


def test_the_quota_reader_role_can_be_left_out(dev_raw, dev_data):
    # Defining a role needs Microsoft.Authorization/roleDefinitions/write on the subscription, which Role Based Access
    # Control Administrator lacks: quotaReaderRole: false deploys without it (the quota check then only warns).
    raw = dict(copy.deepcopy(dev_raw[0]), quotaReaderRole=False)
    mocks, outputs = mocked.run(raw, "dev", dev_raw[1], data_outputs=dev_data[1])
    assert mocks.of_type("RoleDefinition") == [] and outputs["quota_reader_role"] is None
    assert not [
        r for r in mocks.of_type("RoleAssignment") if r.inputs["scope"] == f"/subscriptions/{mocked.SUBSCRIPTION}"
    ]
    with pytest.raises(config.ConfigError, match=r"quotaReaderRole = 'yes': expected bool"):
        config.load(dict(copy.deepcopy(dev_raw[0]), quotaReaderRole="yes"), "dev", "westeurope", mocked.SUBSCRIPTION)


# ---- the cost ledger's status log: users query the stack's Log Analytics workspace ----


def test_each_user_reads_the_status_log_on_the_log_analytics_workspace_alone(dev_raw, dev_data):
    # launcher/cost queries AmlRunStatusChangedEvent through the Log Analytics query API with the person's sign-in:
    # Log Analytics Reader ("view and search all monitoring data"; workspaces/analytics/query/action and
    # workspaces/search/action), assigned on that workspace and nowhere else.
    mocks = _run(dev_raw, dev_data, [{"objectId": ALICE, "type": "User"}, {"objectId": TEAM, "type": "Group"}])
    logs = one(mocks, "operationalinsights:Workspace", "ml-log-analytics")
    reader = BUILT_IN_ROLES["Log Analytics Reader"]
    grants = [r for r in mocks.of_type("RoleAssignment") if r.inputs["roleDefinitionId"].endswith("/" + reader)]
    assert sorted((r.inputs["principalId"], r.inputs["principalType"]) for r in grants) == sorted(
        [(ALICE, "User"), (TEAM, "Group")]
    ), "one per user, and nobody else (no identity needs it)"
    for r in grants:
        assert r.inputs["scope"] == logs.id
        assert r.inputs["roleDefinitionId"] == (
            f"/subscriptions/{mocked.SUBSCRIPTION}/providers/Microsoft.Authorization/roleDefinitions/{reader}"
        )
        assert r.inputs["roleAssignmentName"] == access.assignment_name(
            logs.id, r.inputs["principalId"], r.inputs["roleDefinitionId"], "dev"
        )
        assert r.name == f"access-user-{r.inputs['principalId']}-reads-status-log"
    assert access.ROLES["Log Analytics Reader"] == reader


def test_no_resource_needs_this_package_to_be_created_or_destroyed(dev, prod):
    """A dynamic provider is pickled into the state by reference (its module and class), so a Pulumi venv without
    trainingplatform (one built from infra/requirements.txt alone) could not create or delete the resource. Every
    resource is of a provider plugin Pulumi installs itself (the quota role's pause is pulumiverse-time's Sleep), or one
    of our ComponentResources, which the engine deletes without any provider."""
    plugins = {"azure-native", "random", "time", "pulumi", "trainingplatform"}
    for mocks, _ in (dev, prod):
        assert [r.name for r in mocks.resources if "dynamic" in r.type or "__provider" in r.inputs] == []
        assert {r.type.split(":")[0] for r in mocks.resources} <= plugins
