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
"""
import copy
import re
import uuid

import pytest
from infra_helpers import one

from trainingplatform import access, config, mocked

ALICE = "3f2504e0-4f89-41d3-9a0c-0305e82c3301"
TEAM = "7c9e6679-7425-40de-944b-e07fc1f90ae7"
BOB = "9b2d5b1a-1c3e-4d5f-8a7b-6c5d4e3f2a10"


def _run(dev_raw, dev_data, users=None):
    raw = copy.deepcopy(dev_raw[0])
    if users is not None:
        raw["users"] = users
    return mocked.run(raw, "dev", dev_raw[1], data_outputs=dev_data[1])[0]


def _expected(mocks, data_mocks):
    data = one(data_mocks, "StorageAccount", "storage-data").id
    logs = one(data_mocks, "StorageAccount", "storage-logs").id
    ws_storage = one(mocks, "StorageAccount", "ml-storage").id
    return {
        (access.ROLES["Storage Blob Data Contributor"], ws_storage),
        (access.ROLES["Storage File Data Privileged Contributor"], ws_storage),
        (access.ROLES["Storage Blob Data Contributor"], f"{data}/blobServices/default/containers/training-data"),
        (access.ROLES["Storage Blob Data Reader"], f"{logs}/blobServices/default/containers/logs"),
        (access.ROLES["AzureML Data Scientist"], one(mocks, "machinelearningservices:Workspace", "ml-workspace").id),
    }


def _grants_of(mocks, principal):
    return [r for r in mocks.of_type("RoleAssignment") if r.inputs["principalId"] == principal]


def test_the_deployer_gets_the_user_roles_by_default(dev, dev_data):
    mocks, _ = dev
    grants = _grants_of(mocks, mocked.DEPLOYER)   # getClientConfig's objectId: whoever runs `pulumi up`
    assert {(r.inputs["roleDefinitionId"].rsplit("/", 1)[1], r.inputs["scope"]) for r in grants} == _expected(mocks, dev_data[0])
    assert len(grants) == 5
    # A person after `az login`; CI deployers (service principals) list `users` instead, since Azure
    # refuses a principalType that does not match (UnmatchedPrincipalType).
    assert {r.inputs["principalType"] for r in grants} == {"User"}


def test_a_deployer_who_lists_themselves_keeps_the_same_assignments(dev, dev_raw, dev_data):
    # The README tells a deployer who adds teammates to list themselves too. Were the default's resources
    # named apart from the listed ones, that change would plan creates of assignments that exist (Azure
    # refuses them) and deletes of the same assignments.
    default = {(r.name, r.inputs["principalId"], r.inputs["principalType"]) for r in _grants_of(dev[0], mocked.DEPLOYER)}
    listed = _run(dev_raw, dev_data, [{"objectId": mocked.DEPLOYER.upper(), "type": "User"}])
    assert {(r.name, r.inputs["principalId"], r.inputs["principalType"]) for r in _grants_of(listed, mocked.DEPLOYER)} == default
    assert len(default) == 5


def test_listed_users_and_groups_get_exactly_the_user_roles_with_their_principal_type(dev_raw, dev_data):
    mocks = _run(dev_raw, dev_data, [{"objectId": ALICE, "type": "User"}, {"objectId": TEAM.upper(), "type": "Group"}])
    expected = _expected(mocks, dev_data[0])
    for principal, kind in ((ALICE, "User"), (TEAM, "Group")):
        grants = _grants_of(mocks, principal)
        assert {(r.inputs["roleDefinitionId"].rsplit("/", 1)[1], r.inputs["scope"]) for r in grants} == expected
        assert len(grants) == 5 and {r.inputs["principalType"] for r in grants} == {kind}
    assert _grants_of(mocks, mocked.DEPLOYER) == [], "a listed set replaces the default"
    identities = {"principal-compute-identity", "principal-ml-workspace", ALICE, TEAM}
    assert {r.inputs["principalId"] for r in mocks.of_type("RoleAssignment")} == identities, "nobody else"


def test_an_empty_list_grants_no_user_roles(dev_raw, dev_data):
    mocks = _run(dev_raw, dev_data, [])
    assert {r.inputs["principalId"] for r in mocks.of_type("RoleAssignment")} == {
        "principal-compute-identity", "principal-ml-workspace"}


def test_assignment_names_change_with_the_principal_and_stay_put_otherwise(dev_raw, dev_data):
    first = _run(dev_raw, dev_data, [{"objectId": ALICE, "type": "User"}])
    again = _run(dev_raw, dev_data, [{"objectId": ALICE, "type": "User"}])
    swapped = _run(dev_raw, dev_data, [{"objectId": BOB, "type": "User"}])

    def names(mocks, principal):
        return {(r.inputs["roleDefinitionId"], r.inputs["scope"]): r.inputs["roleAssignmentName"]
                for r in _grants_of(mocks, principal)}

    assert names(first, ALICE) == names(again, ALICE), "the same grant keeps its name (no churn on every up)"
    alice, bob = names(first, ALICE), names(swapped, BOB)
    assert alice.keys() == bob.keys() and len(alice) == 5
    for key in alice:   # same scope and role, another principal: another assignment, never an update
        assert alice[key] != bob[key], key
    every = [r.inputs["roleAssignmentName"] for r in first.of_type("RoleAssignment")]
    assert len(set(every)) == len(every)
    assert all(str(uuid.UUID(n)) == n for n in every), "Azure wants a GUID as the assignment name"


def test_assignment_name_is_a_function_of_scope_principal_and_role():
    base = access.assignment_name("/s/a", "p1", "/r/1")
    assert base == access.assignment_name("/S/A", "P1", "/R/1")   # ARM ids compare case-insensitively
    assert len({base, access.assignment_name("/s/b", "p1", "/r/1"), access.assignment_name("/s/a", "p2", "/r/1"),
                access.assignment_name("/s/a", "p1", "/r/2")}) == 4


@pytest.mark.parametrize("users,message", [
    ([{"objectId": "alice@example.com", "type": "User"}],
     "users[0].objectId = 'alice@example.com': an Entra object id (a GUID), not a name or e-mail"),
    ([{"objectId": ALICE, "type": "user"}], "users[0].type = 'user': User, Group or ServicePrincipal"),
    ([{"objectId": ALICE}, {"objectId": ALICE.upper(), "type": "User"}], "listed twice"),
    ([ALICE], "expected {objectId: <guid>, type: User|Group|ServicePrincipal}"),
])
def test_bad_users_fail_before_anything_is_declared(dev_raw, users, message):
    raw = dict(copy.deepcopy(dev_raw[0]), users=users)
    mocks = mocked.RecordingMocks()
    with pytest.raises(config.ConfigError) as e:
        mocked.run(raw, "dev", dev_raw[1], mocks=mocks)
    assert message in str(e.value) and mocks.resources == []
    assert re.search(r"az ad (user|group) show|objectId|User, Group", str(e.value))
