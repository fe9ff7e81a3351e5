"""Who deploys, and whether they may do what `pulumi up` does: create role assignments, and assign the
user roles to the right kind of principal.

- Permissions: Microsoft.Authorization's Permissions - List (REST, 2022-04-01) answers the caller's
  effective actions at a scope, through groups included. The program creates role assignments (access.py)
  and its resource group, so the deployer needs Microsoft.Authorization/roleAssignments/write (Owner, User
  Access Administrator, Role Based Access Control Administrator) besides Contributor's writes.
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

from .arm import PERMISSIONS_API, SCOPE, Arm, describe
from .findings import FAIL, OK, WARN, Finding

NEEDED = {
    "Microsoft.Authorization/roleAssignments/write": "the stack assigns roles (data access, AcrPull, AzureML Data "
    "Scientist): Owner, User Access Administrator or Role Based "
    "Access Control Administrator",
    "Microsoft.Resources/subscriptions/resourceGroups/write": "the stack creates its resource group: Contributor",
}


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


def _allowed(action: str, permissions: list[dict]) -> bool:
    """Azure's rule: some role's actions match and that role's notActions do not (wildcards, any case)."""
    a = action.lower()

    def hit(patterns):
        return any(fnmatch.fnmatchcase(a, str(p).lower()) for p in patterns or [])

    return any(hit(p.get("actions")) and not hit(p.get("notActions")) for p in permissions)


def check_permissions(arm: Arm, subscription: str, resource_group: str) -> list[Finding]:
    scope = f"/subscriptions/{subscription}/resourceGroups/{resource_group}"
    try:
        try:
            permissions = list(arm.list(f"{scope}/providers/Microsoft.Authorization/permissions", PERMISSIONS_API))
        except ResourceNotFoundError:  # the resource group comes with the first `pulumi up`
            scope = f"/subscriptions/{subscription}"
            permissions = list(arm.list(f"{scope}/providers/Microsoft.Authorization/permissions", PERMISSIONS_API))
    except ClientAuthenticationError:
        raise
    except AzureError as e:
        return [
            Finding(
                FAIL,
                "permissions",
                describe(e, f"reading your permissions on {scope}"),
                "ask the subscription's owner for Contributor and User Access Administrator on it",
            )
        ]
    findings = []
    for action, why in NEEDED.items():
        if _allowed(action, permissions):
            findings.append(Finding(OK, "permissions", f"{action} allowed on {scope}"))
        else:
            findings.append(
                Finding(
                    FAIL,
                    "permissions",
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
