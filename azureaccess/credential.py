"""The one Azure credential every tool here signs in with (submission, --resume-from, preflight, doctor,
datatools.transfer): the person's own sign-in, never the machine's managed identity unless asked.

DefaultAzureCredential tries, in order (azure-identity 1.27.0, the version .venv pins): "1. A service principal
configured by environment variables ... 2. WorkloadIdentityCredential ... 3. An Azure managed identity ...
6. The identity currently logged in to the Azure CLI." On the jump host (docs/private-access.md) the VM has a
system-assigned managed identity, which Entra ID SSH sign-in requires ("Ensure that your VM is configured with
... System-assigned managed identity", learn.microsoft.com/entra/identity/devices/howto-vm-sign-in-azure-ad-linux).
So the chain answered with the VM's token before reaching the person's `az login`, and every call that Azure
authorizes by the person's roles (the workspace, its storage, the logs container, the registry) was refused with
403. Here the managed identity is left out of the chain; the rest stays in its order (a service principal in
AZURE_CLIENT_ID/AZURE_TENANT_ID/AZURE_CLIENT_SECRET first, for CI; then the person's developer sign-ins).

Asking for another chain is azure-identity's own switch, AZURE_TOKEN_CREDENTIALS: when it is set, it decides
alone (`ManagedIdentityCredential` or `prod` for a machine's identity, `AzureCliCredential` for `az login` only,
`dev` for the developer sign-ins; azure-identity refuses any other value with ValueError naming the valid ones).
"""

from __future__ import annotations

import os
import re

SWITCH = "AZURE_TOKEN_CREDENTIALS"
SIGN_IN_FIX = (
    "sign in: `az login` (and `az account set --subscription <id>`), or set AZURE_CLIENT_ID/AZURE_TENANT_ID/"
    f"AZURE_CLIENT_SECRET for a service principal; to use this machine's managed identity instead, "
    f"{SWITCH}=ManagedIdentityCredential"
)


ON_BEHALF_OF = ("LAUNCHER_CREDENTIAL", "azureml-on-behalf-of")


# Entra's answer when a Conditional Access policy refuses a sign-in (AADSTS53003), which is how a tenant that blocks
# the device-code flow refuses `az login --use-device-code` (Microsoft recommends blocking it: Conditional Access,
# "Block authentication flows").
CONDITIONAL_ACCESS = re.compile(r"AADSTS53003|Conditional Access|device[- ]code", re.IGNORECASE)
DEVICE_CODE_FIX = (
    "your tenant's Conditional Access refused the sign-in (a tenant that blocks device-code sign-in refuses "
    "`az login --use-device-code` where no browser opens, as on the jump host): sign in on your own machine and "
    "submit from there through the jump host's tunnel (docs/private-access.md#where-device-code-sign-in-is-blocked)"
)


def sign_in_fix(error: BaseException | str) -> str:
    """The fix for a refused sign-in: the Conditional Access one where Entra said so, else SIGN_IN_FIX."""
    return DEVICE_CODE_FIX if CONDITIONAL_ACCESS.search(str(error)) else SIGN_IN_FIX


def azure_credential():
    """DefaultAzureCredential without the managed identity, unless AZURE_TOKEN_CREDENTIALS says otherwise; inside an
    Azure ML job submitted with `identity: user_identity` (the auto-resume supervisor, launcher/supervisor.yaml sets
    LAUNCHER_CREDENTIAL), the submitting person's identity through Azure ML's on-behalf-of credential."""
    from azure.identity import DefaultAzureCredential  # looked up at call time: tests replace it

    chosen = os.environ.get(ON_BEHALF_OF[0], "").strip()
    if chosen:
        if chosen != ON_BEHALF_OF[1]:
            from .errors import JobError

            raise JobError(f"{ON_BEHALF_OF[0]}={chosen}: the one value is {ON_BEHALF_OF[1]} (inside Azure ML jobs)")
        from azure.ai.ml.identity import AzureMLOnBehalfOfCredential

        return AzureMLOnBehalfOfCredential()

    if os.environ.get(SWITCH, "").strip():
        return DefaultAzureCredential()  # the switch decides; an explicit exclusion would override it
    return DefaultAzureCredential(exclude_managed_identity_credential=True)


def whose(claims: dict) -> str:
    """Who an access token belongs to, from its claims (learn.microsoft.com/entra/identity-platform/
    access-token-claims-reference: oid, tid, idtyp, upn/unique_name/preferred_username, appid; a managed identity's
    token also carries xms_mirid, the identity's resource id)."""
    oid = claims.get("oid", "?")
    if claims.get("xms_mirid"):
        return f"managed identity {claims['xms_mirid']} (object id {oid})"
    kind = str(claims.get("idtyp", "")).lower() or ("user" if "scp" in claims else "app")
    if kind == "user":
        name = claims.get("upn") or claims.get("unique_name") or claims.get("preferred_username") or claims.get("email")
        tenant = f", tenant {claims['tid']}" if claims.get("tid") else ""
        return f"user {name or '(no name claim)'} (object id {oid}{tenant})"
    return f"service principal {claims.get('appid') or claims.get('azp') or '?'} (object id {oid})"


def source(credential) -> str:
    """Which credential of a chain gave the last token (ChainedTokenCredential keeps it), else the credential's
    own type."""
    chosen = getattr(credential, "_successful_credential", None) or credential
    return type(chosen).__name__
