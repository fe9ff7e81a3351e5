"""What the way-in tests share (test_wayin.py, test_wayin_jumphost.py, test_wayin_services.py): the private profile
rendered with changed settings, its settings checked, the roles a principal holds, Azure's built-in role ids and a
few principals."""

import copy

import pytest

from trainingplatform import config, mocked

HUB = "/subscriptions/33333333-3333-3333-3333-333333333333/resourceGroups/hub-rg/providers/Microsoft.Network/virtualNetworks/hub-vnet"


def run_stack(prod_raw, prod_data_out, random_result="x7k2q", **changes):
    raw, location = copy.deepcopy(prod_raw)
    raw.update(changes)
    return mocked.run(
        raw, "prod", location, mocked.RecordingMocks(random_result=random_result), data_outputs=prod_data_out
    )


def load_config(raw, location="westeurope"):
    return config.load(raw, "prod", location, mocked.SUBSCRIPTION)


def problems_of(raw):
    with pytest.raises(config.ConfigError) as e:
        load_config(raw)
    return "\n".join(e.value.problems)


def roles_of(mocks, principal):
    return {
        (r.inputs["roleDefinitionId"].rsplit("/", 1)[1], r.inputs["scope"])
        for r in mocks.of_type("RoleAssignment")
        if r.inputs["principalId"] == principal
    }


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
