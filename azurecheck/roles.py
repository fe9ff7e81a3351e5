"""Who deploys, and whether they may do what `pulumi up` does: create role assignments, and assign the
user roles to the right kind of principal.

- Permissions: Microsoft.Authorization's Permissions - List (REST, 2022-04-01) answers the caller's
  effective actions at a scope, through groups included. The program creates role assignments (access.py)
  and its resource group, so the deployer needs Microsoft.Authorization/roleAssignments/write (Owner, User
  Access Administrator, Role Based Access Control Administrator) besides Contributor's writes; so does the data
  stack (its users' Storage Blob Data roles). Permissions show no ABAC conditions: a role-assignment right that
  comes only with one is looked up in the caller's role assignments and warned about.
- The quota reader role (config quotaReaderRole, access.QuotaReaders): the platform defines a custom role on the
  subscription and assigns it there, so the deployer needs Microsoft.Authorization/roleDefinitions/write and
  roleAssignments/write on the subscription itself (Owner, User Access Administrator).
- Principal kind: without `users`, program.py assigns the user roles to the deployer as principalType
  User; a service principal (CI, a managed identity) deploying that way is refused by Azure
  (UnmatchedPrincipalType). The kind comes from the deployer's own ARM access token: `idtyp` is "app" for
  app-only tokens and "user" for users; without it, a token with `scp` (delegated scopes) is a user's and
  one without is an application's (learn.microsoft.com/entra/identity-platform/access-token-claims-reference).
  The token is read, not verified: it describes ourselves to ourselves.
"""

from __future__ import annotations

import base64
import fnmatch
import json

from azure.core.exceptions import AzureError, ClientAuthenticationError, ResourceNotFoundError

from .arm import PERMISSIONS_API, SCOPE, Arm, attempt, describe
from .findings import FAIL, OK, WARN, Finding

NEEDED = {
    "Microsoft.Authorization/roleAssignments/write": "the stack assigns roles (data access, AcrPull, AzureML Data "
    "Scientist): Owner, User Access Administrator or Role Based "
    "Access Control Administrator",
    "Microsoft.Resources/subscriptions/resourceGroups/write": "the stack creates its resource group: Contributor",
}
# The data stack (infra/data-stack, datastack.py) creates its resource group, the accounts, and its users' role
# assignments on the containers: Contributor alone leaves it half built (every resource protected).
DATA_NEEDED = {
    "Microsoft.Authorization/roleAssignments/write": "the data stack assigns its users Storage Blob Data "
    "Contributor and Storage Blob Data Reader on the containers: Owner, User Access Administrator or Role Based "
    "Access Control Administrator",
    "Microsoft.Resources/subscriptions/resourceGroups/write": "the data stack creates its resource group: Contributor",
}
ROLE_ASSIGNMENT_WRITE = "Microsoft.Authorization/roleAssignments/write"
# The roles each program assigns (access.ROLES, which imports Pulumi; a test holds these to it), named in the
# warning about a conditional role-assignment right.
PLATFORM_ROLES = (
    "AzureML Data Scientist",
    "AcrPull",
    "AcrPush",
    "Container Registry Tasks Contributor",
    "Desktop Virtualization Power On Contributor",
    "Log Analytics Reader",
    "Reader",
    "Storage Blob Data Contributor",
    "Storage Blob Data Reader",
    "Storage File Data Privileged Contributor",
    "Virtual Machine Administrator Login",
    "Virtual Machine User Login",
)
DATA_ROLES = ("Storage Blob Data Contributor", "Storage Blob Data Reader")
# With quotaReaderRole (the default) the platform defines a custom role at the subscription and assigns it there to its
# users (access.QuotaReaders): both rights are needed on the subscription itself, not only on the resource group.
# Role Based Access Control Administrator has roleAssignments/write but not roleDefinitions/write.
QUOTA_ROLE_NEEDED = {
    "Microsoft.Authorization/roleDefinitions/write": "quotaReaderRole: the stack defines a custom role that reads "
    "Azure ML's quota (usages, VM sizes, quotas) in the subscription: Owner or User Access Administrator on it",
    ROLE_ASSIGNMENT_WRITE: "quotaReaderRole: the stack assigns that role to its users on the subscription: Owner or "
    "User Access Administrator on it",
}
QUOTA_ROLE_CHECK = "quota reader role"


def claims(credential) -> dict:
    """The claims of the credential's ARM access token (its JWT payload)."""
    token = credential.get_token(SCOPE).token
    try:
        payload = token.split(".")[1]
        return json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    except (IndexError, ValueError):
        return {}


def principal(token_claims: dict) -> tuple[str | None, str | None]:
    """(object id, 'User' | 'ServicePrincipal') of whoever the token belongs to."""
    kind = {"app": "ServicePrincipal", "user": "User"}.get(str(token_claims.get("idtyp", "")).lower())
    if kind is None and token_claims:
        kind = "User" if "scp" in token_claims else "ServicePrincipal"
    return token_claims.get("oid"), kind


def read_permissions(arm: Arm, scope: str) -> list[dict]:
    """Permissions - List For Resource Group / List For Resource (`{scope}/providers/Microsoft.Authorization/
    permissions`): the caller's effective `actions`, `notActions`, `dataActions`, `notDataActions` per role, through
    groups included; no conditions (the 2022-04-01 Permission has those four lists only)."""
    return list(arm.list(f"{scope}/providers/Microsoft.Authorization/permissions", PERMISSIONS_API))


def allowed(action: str, permissions: list[dict]) -> bool:
    return _allowed(action, permissions)


def _allowed(action: str, permissions: list[dict]) -> bool:
    """Azure's rule: some role's actions match and that role's notActions do not (wildcards, any case)."""
    a = action.lower()

    def hit(patterns):
        return any(fnmatch.fnmatchcase(a, str(p).lower()) for p in patterns or [])

    return any(hit(p.get("actions")) and not hit(p.get("notActions")) for p in permissions)


def _covers(assignment_scope: str, scope: str) -> bool:
    """An assignment at `assignment_scope` applies at `scope` (the same scope or one above it)."""
    a, s = assignment_scope.rstrip("/").lower(), scope.rstrip("/").lower()
    return s == a or s.startswith(a + "/")


def conditional_role_assignment_rights(arm: Arm, scope: str, object_id: str) -> list[dict]:
    """The caller's role assignments applying at `scope` whose ABAC condition constrains
    Microsoft.Authorization/roleAssignments/write, when no unconditioned assignment grants that action; else [].

    The Permissions API shows a role's actions but not the condition on its assignment, so a Role Based Access
    Control Administrator delegated "Constrain roles" (learn.microsoft.com/azure/role-based-access-control/
    delegate-role-assignments-portal) reads as allowed, and Azure refuses the assignments outside the condition.
    Such a delegation condition names the action it constrains: `!(ActionMatches{'Microsoft.Authorization/
    roleAssignments/write'})` (delegate-role-assignments-examples). Role Assignments - List For Scope with
    `$filter=assignedTo('{objectId}')` lists the caller's assignments, through groups too, each with its
    `properties.condition`; an unconditioned one whose role (Role Definitions - Get: `properties.permissions`)
    allows the action makes any condition moot."""
    assignments = [
        a
        for a in arm.list(
            f"{scope}/providers/Microsoft.Authorization/roleAssignments",
            PERMISSIONS_API,
            {"$filter": f"assignedTo('{object_id}')"},
        )
        if _covers(str((a.get("properties") or {}).get("scope") or ""), scope)
    ]

    def constrains(a: dict) -> bool:
        return ROLE_ASSIGNMENT_WRITE.lower() in str((a.get("properties") or {}).get("condition") or "").lower()

    conditional = [a for a in assignments if constrains(a)]
    if not conditional:
        return []
    definitions = {
        str(a["properties"].get("roleDefinitionId"))
        for a in assignments
        if not (a.get("properties") or {}).get("condition") and (a.get("properties") or {}).get("roleDefinitionId")
    }
    for definition in sorted(definitions):
        role = arm.get(definition, PERMISSIONS_API)
        if _allowed(ROLE_ASSIGNMENT_WRITE, (role.get("properties") or {}).get("permissions") or []):
            return []
    return conditional


def _condition_findings(
    arm: Arm, scope: str, object_id: str | None, check: str, assigns: tuple[str, ...]
) -> list[Finding]:
    roles = ", ".join(assigns)
    if not object_id:
        return []
    try:
        conditional = conditional_role_assignment_rights(arm, scope, object_id)
    except ClientAuthenticationError:
        raise
    except AzureError as e:
        return [
            Finding(
                WARN,
                check,
                describe(e, f"reading your role assignments on {scope} for conditions")
                + f"; if your {ROLE_ASSIGNMENT_WRITE} comes with a condition (Role Based Access Control "
                "Administrator delegated with constraints), Azure may still refuse the stack's role assignments",
                f"make sure any condition on your role assignments allows the roles the stack assigns: {roles}",
            )
        ]
    if not conditional:
        return []
    first = conditional[0]["properties"]
    condition = " ".join(str(first.get("condition")).split())
    condition = condition if len(condition) <= 200 else condition[:197] + "..."
    return [
        Finding(
            WARN,
            check,
            f"your {ROLE_ASSIGNMENT_WRITE} on {scope} comes only with a condition (role assignment "
            f"{conditional[0].get('name') or conditional[0].get('id')}: {condition}); the Permissions API does not "
            "show conditions, so this check cannot tell whether Azure accepts the stack's role assignments: "
            f"{roles} (to User, Group and ServicePrincipal principals)",
            "have the condition allow those roles and principal types (the owner who delegated it: Azure portal, "
            "Access control (IAM), your Role Based Access Control Administrator assignment, Conditions), or get "
            "User Access Administrator without a condition, or let someone who has it run pulumi up",
        )
    ]


def check_permissions(
    arm: Arm,
    subscription: str,
    resource_group: str,
    object_id: str | None = None,
    needed: dict[str, str] = NEEDED,
    check: str = "permissions",
    assigns: tuple[str, ...] = PLATFORM_ROLES,
) -> list[Finding]:
    """`needed` at the stack's resource group (once it exists, else the subscription); with `object_id` (the
    deployer's, from its token) also whether the role-assignment right comes only with an ABAC condition."""
    scope = f"/subscriptions/{subscription}/resourceGroups/{resource_group}"
    try:
        try:
            permissions = read_permissions(arm, scope)
        except ResourceNotFoundError:  # the resource group comes with the first `pulumi up`
            scope = f"/subscriptions/{subscription}"
            permissions = read_permissions(arm, scope)
    except ClientAuthenticationError:
        raise
    except AzureError as e:
        return [
            Finding(
                FAIL,
                check,
                describe(e, f"reading your permissions on {scope}"),
                "ask the subscription's owner for Contributor and User Access Administrator on it",
            )
        ]
    findings = []
    for action, why in needed.items():
        if _allowed(action, permissions):
            findings.append(Finding(OK, check, f"{action} allowed on {scope}"))
            if action == ROLE_ASSIGNMENT_WRITE:
                findings += _condition_findings(arm, scope, object_id, check, assigns)
        else:
            findings.append(
                Finding(
                    FAIL,
                    check,
                    f"you may not {action} on {scope}; {why}",
                    f"az role assignment create --assignee <you> --role \"User Access Administrator\" "
                    f"--scope /subscriptions/{subscription} (by an Owner), or let someone who has it "
                    "run pulumi up",
                )
            )
    return findings


def check_principal(token_claims: dict, users) -> list[Finding]:
    """`users`: the config's tuple of Principals, or None (then the deployer gets the user roles as User)."""
    oid, kind = principal(token_claims)
    who = f"{kind or 'unknown principal'} {oid or '?'}"
    if users is not None:
        if not users:
            return [
                Finding(
                    WARN,
                    "users",
                    "users is an empty list: nobody gets the roles to submit jobs or upload data",
                    "list the people (or a group) in `users` in Pulumi.<stack>.yaml",
                )
            ]
        return [Finding(OK, "users", f"deploying as {who}; the user roles go to the {len(users)} listed principal(s)")]
    if kind == "ServicePrincipal":
        return [
            Finding(
                FAIL,
                "users",
                f"deploying as {who} with no `users`: the stack would assign the user roles "
                "to it as principalType User, which Azure refuses (UnmatchedPrincipalType)",
                "list the people who submit jobs in `users` (objectId and type: User or Group), or this "
                f"service principal itself: - objectId: {oid}  type: ServicePrincipal",
            )
        ]
    if kind is None:
        return [
            Finding(
                WARN,
                "users",
                "cannot tell from the sign-in whether you are a user or a service principal",
                "list the platform's users in `users` (objectId, type) to be independent of who deploys",
            )
        ]
    return [
        Finding(
            OK,
            "users",
            f"deploying as {who}; without `users` the user roles go to you (the last to run "
            "pulumi up): list everyone in `users` when several people deploy",
        )
    ]


def check_quota_reader_role(arm: Arm, subscription: str) -> list[Finding]:
    """With quotaReaderRole: may the deployer define a role and assign it on the subscription (QUOTA_ROLE_NEEDED)?"""
    scope = f"/subscriptions/{subscription}"
    off = "or set quotaReaderRole: false in Pulumi.<stack>.yaml (the users' quota check then only warns)"
    permissions, failed = attempt(
        lambda: read_permissions(arm, scope),
        QUOTA_ROLE_CHECK,
        f"reading your permissions on {scope}",
        f"ask the subscription's owner for User Access Administrator on it, {off}",
    )
    if failed:
        return failed
    findings = []
    for action, why in QUOTA_ROLE_NEEDED.items():
        if _allowed(action, permissions):
            findings.append(Finding(OK, QUOTA_ROLE_CHECK, f"{action} allowed on {scope}"))
        else:
            findings.append(
                Finding(
                    FAIL,
                    QUOTA_ROLE_CHECK,
                    f"you may not {action} on {scope}; {why}",
                    f'az role assignment create --assignee <you> --role "User Access Administrator" --scope {scope} '
                    f"(by an Owner), {off}",
                )
            )
    return findings
