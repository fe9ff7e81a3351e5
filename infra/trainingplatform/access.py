"""Role assignments: who may do what, at the narrowest scope Azure allows.

- The compute identity reads data, writes outputs and pulls images, and nothing more.
- The workspace identity reads the two datastores (studio browsing).
- The platform's users (config `users`; default: whoever runs `pulumi up`) can submit jobs, upload data
  and browse outputs: with shared keys off and identity-based system datastores, azure-ai-ml uploads each
  job's code snapshot with the submitting user's own token, so the user needs data-plane roles on the
  workspace storage (learn.microsoft.com/azure/machine-learning/how-to-disable-local-auth-storage:
  "Storage Blob Data Contributor" and "Storage File Data Privileged Contributor"); Azure subscription
  Owner grants no data-plane access.

Assignment names are GUIDs derived from (scope, principal, role definition), like Azure's own templates
(`guid(scope, principalId, roleDefinitionId)`): Azure refuses to change the principal of an existing
assignment (RoleAssignmentUpdateNotPermitted), so a new principal must mean a new name, which Pulumi
then creates before deleting the old one.
"""
from __future__ import annotations

import uuid
from dataclasses import dataclass

import pulumi
from pulumi_azure_native import authorization

# Azure built-in role definition IDs (the same in every tenant; learn.microsoft.com/azure/role-based-access-control/built-in-roles).
ROLES = {
    "Storage Blob Data Reader": "2a2b9908-6ea1-4ae2-8e65-a410df84e7d1",
    "Storage Blob Data Contributor": "ba92f5b4-2d11-453d-a403-e96b0029c9fe",
    "Storage File Data Privileged Contributor": "69566ab7-960f-475b-8e7c-b3118f30c6bd",
    "AzureML Data Scientist": "f6c7c914-8db3-469d-8ca1-694a8f32e121",
    "AcrPull": "7f951dda-4ed3-4680-a7ca-43fe172d538d",
    "AcrPush": "8311e382-0749-4cb8-b61a-304f252e45ec",
    "Reader": "acdd72a7-3385-48ef-bd42-f606fba81ae7",
    "Virtual Machine Administrator Login": "1c0163c0-47e6-4577-8991-ea5c82e47dfa",
}

# Fixed namespace for the assignment-name GUIDs: the same inputs give the same name on every machine.
_NAMESPACE = uuid.UUID("5b0f3c3e-7d55-4c6a-9a53-2f1d7c8e9b10")


@dataclass(frozen=True)
class Grant:
    label: str                       # logical-name part; unique within one AccessGrants
    role: str                        # a key of ROLES
    principal_id: pulumi.Input[str]
    scope: pulumi.Input[str]
    # "ServicePrincipal" | "User" | "Group": Azure needs it for principals created moments ago (managed
    # identities: replication delay) and refuses one that does not match the principal.
    principal_type: str = "ServicePrincipal"


def container_scope(account_id: pulumi.Input[str], container_name: pulumi.Input[str]) -> pulumi.Output[str]:
    return pulumi.Output.concat(account_id, "/blobServices/default/containers/", container_name)


def role_definition_id(subscription_id: pulumi.Input[str], role: str) -> pulumi.Output[str]:
    return pulumi.Output.concat("/subscriptions/", subscription_id,
                                "/providers/Microsoft.Authorization/roleDefinitions/", ROLES[role])


def assignment_name(scope: str, principal_id: str, role_definition: str) -> str:
    """guid(scope, principal, role): a changed principal, role or scope gives a new assignment name."""
    return str(uuid.uuid5(_NAMESPACE, "|".join((scope.lower(), principal_id.lower(), role_definition.lower()))))


class AccessGrants(pulumi.ComponentResource):
    """`assignments`: {label: RoleAssignment}, so that other resources can depend on a grant."""

    def __init__(self, name: str, subscription_id: pulumi.Input[str], grants: list[Grant],
                 opts: pulumi.ResourceOptions | None = None):
        super().__init__("trainingplatform:access:AccessGrants", name, None, opts)
        labels = [g.label for g in grants]
        duplicates = sorted({label for label in labels if labels.count(label) > 1})
        if duplicates:
            raise ValueError(f"duplicate grant labels {duplicates}: each grant needs its own label")
        self.assignments: dict[str, authorization.RoleAssignment] = {}
        for g in grants:
            definition = role_definition_id(subscription_id, g.role)
            self.assignments[g.label] = authorization.RoleAssignment(
                f"{name}-{g.label}",
                role_assignment_name=pulumi.Output.all(g.scope, g.principal_id, definition).apply(
                    lambda a: assignment_name(*a)),
                principal_id=g.principal_id, principal_type=g.principal_type, scope=g.scope,
                role_definition_id=definition, description=f"{g.role}: {g.label}",
                opts=pulumi.ResourceOptions(parent=self))
        self.register_outputs({})
