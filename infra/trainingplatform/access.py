"""Role assignments: the compute identity reads data, writes outputs and pulls images, and nothing more.

Scopes are as narrow as Azure allows: single blob containers, not accounts or resource groups.
"""
from __future__ import annotations

import uuid

import pulumi
from pulumi_azure_native import authorization

# Azure built-in role definition IDs (the same in every tenant).
ROLES = {
    "Storage Blob Data Reader": "2a2b9908-6ea1-4ae2-8e65-a410df84e7d1",
    "Storage Blob Data Contributor": "ba92f5b4-2d11-453d-a403-e96b0029c9fe",
    "AcrPull": "7f951dda-4ed3-4680-a7ca-43fe172d538d",
}


def container_scope(account: pulumi.Output, container: pulumi.Output) -> pulumi.Output[str]:
    return pulumi.Output.concat(account.id, "/blobServices/default/containers/", container.name)


class AccessGrants(pulumi.ComponentResource):
    def __init__(self, name: str, subscription_id: pulumi.Input[str], grants: list[tuple[str, str, pulumi.Input[str], pulumi.Input[str]]],
                 opts: pulumi.ResourceOptions | None = None):
        """grants: (label, role name, principal id, scope); the label keeps assignment names stable."""
        super().__init__("trainingplatform:access:AccessGrants", name, None, opts)
        self.assignments = []
        self.by_label: dict[str, authorization.RoleAssignment] = {}   # what other resources wait for
        for label, role, principal, scope in grants:
            self.by_label[label] = authorization.RoleAssignment(
                f"{name}-{label}",
                role_assignment_name=str(uuid.uuid5(uuid.NAMESPACE_URL, f"{pulumi.get_project()}/{pulumi.get_stack()}/{label}")),
                principal_id=principal, principal_type="ServicePrincipal", scope=scope,
                role_definition_id=pulumi.Output.concat("/subscriptions/", subscription_id,
                                                        "/providers/Microsoft.Authorization/roleDefinitions/", ROLES[role]),
                description=f"{role}: {label}",
                opts=pulumi.ResourceOptions(parent=self))
            self.assignments.append(self.by_label[label])
        self.register_outputs({})
