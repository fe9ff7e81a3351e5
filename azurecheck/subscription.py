"""The subscription you are signed in to, against the one the stack pins (`azure-native:subscriptionId`).

Pulumi deploys to the pinned subscription; `az`, the launcher's follow-up commands and a later `pulumi
config` edit follow the session's. A difference means someone is about to look at, pay for or break the
wrong one, so preflight refuses it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable, Mapping

from azure.core.exceptions import AzureError, ClientAuthenticationError

from .arm import SUBSCRIPTIONS_API, Arm, describe
from .findings import FAIL, OK, WARN, Finding

ENV_KEYS = ("ARM_SUBSCRIPTION_ID", "AZURE_SUBSCRIPTION_ID")  # what the Pulumi provider / azure tools read


def az_cli_subscription() -> str | None:
    """`az account show`'s subscription (the default of a signed-in Azure CLI), or None without one."""
    az = shutil.which("az")
    if az is None:
        return None
    proc = subprocess.run(
        [az, "account", "show", "--query", "id", "-o", "tsv"], capture_output=True, text=True, check=False, timeout=60
    )
    return proc.stdout.strip() or None if proc.returncode == 0 else None


def in_use(
    env: Mapping[str, str] = os.environ, cli: Callable[[], str | None] = az_cli_subscription
) -> tuple[str | None, str]:
    """(subscription id, where it came from)."""
    for key in ENV_KEYS:
        if env.get(key):
            return env[key].strip(), f"${key}"
    found = cli()
    return (found, "`az account show`") if found else (None, "")


def check(arm: Arm, pinned: str | None, current: tuple[str | None, str]) -> list[Finding]:
    if not pinned:
        return [
            Finding(
                FAIL,
                "subscription",
                "the stack pins no subscription (azure-native:subscriptionId): it "
                "would deploy to whichever one the session is on",
                "pulumi config set azure-native:subscriptionId <id> --stack <stack>",
            )
        ]
    found, source = current
    findings = []
    if found is None:
        findings.append(
            Finding(
                WARN,
                "subscription",
                f"cannot tell which subscription you are signed in to (no "
                f"{' or '.join(ENV_KEYS)}, no signed-in Azure CLI); checking {pinned}",
            )
        )
    elif found.lower() != pinned.lower():
        return [
            Finding(
                FAIL,
                "subscription",
                f"you are signed in to subscription {found} ({source}), the stack "
                f"deploys to {pinned} (azure-native:subscriptionId)",
                f"az account set --subscription {pinned} (and unset {' / '.join(ENV_KEYS)}), or fix "
                "azure-native:subscriptionId if the stack file is what is wrong",
            )
        ]
    try:
        sub = arm.get(f"/subscriptions/{pinned}", SUBSCRIPTIONS_API)
    except ClientAuthenticationError:
        raise
    except AzureError as e:
        return findings + [
            Finding(
                FAIL,
                "subscription",
                describe(e, f"reading subscription {pinned}"),
                "sign in to the subscription's tenant (`az login --tenant <tenant>`) with an "
                "identity that has a role on it",
            )
        ]
    state = sub.get("state")
    if state != "Enabled":
        return findings + [
            Finding(
                FAIL,
                "subscription",
                f"{sub.get('displayName', pinned)} is {state}: Azure creates nothing in it",
                "re-enable it (billing) or pick another",
            )
        ]
    return findings + [
        Finding(
            OK,
            "subscription",
            f"{sub.get('displayName', '')} ({pinned}) is the stack's and the one you are signed in to, Enabled",
        )
    ]
