"""Before `pulumi up`: the subscription, its resource providers, the deployer's permissions and kind, and
every cluster's quota, each with its fix. Exit status 1 when anything fails."""

from __future__ import annotations

import sys

from azure.core.exceptions import AzureError, ClientAuthenticationError

from trainingplatform import naming

from . import providers, quota, roles, subscription
from .arm import SIGN_IN, Arm, describe
from .findings import FAIL, WARN, Finding, report
from .stackfile import StackFile


def quota_findings(
    arm: Arm,
    subscription_id: str,
    location: str,
    needs: list[quota.Need],
    nodes: int | None = None,
    workspace_id: str | None = None,
) -> list[Finding]:
    """workspace_id: a deployed workspace, whose own per-family quotas count too (doctor)."""
    try:
        region = quota.read_region(arm, subscription_id, location)
    except ClientAuthenticationError:
        raise
    except AzureError as e:
        return [
            Finding(
                FAIL,
                "quota",
                describe(e, f"reading Azure ML quotas and VM sizes in {location}"),
                "needs Reader on the subscription; is Microsoft.MachineLearningServices registered?",
            )
        ]
    found = []
    if workspace_id:
        try:
            quota.read_workspace_quotas(arm, region, subscription_id, workspace_id)
        except ClientAuthenticationError:
            raise
        except AzureError as e:
            found.append(
                Finding(
                    WARN,
                    "quota",
                    describe(e, "reading the workspace's own quotas") + "; judged by the subscription's alone",
                )
            )
    found += [f for need in needs for f in quota.check(region, need, nodes)]
    return found + quota.check_totals(region, needs)


def findings(stack: StackFile, credential, transport=None, current=None) -> list[Finding]:
    cfg = stack.settings
    arm = Arm(credential, transport)
    current = current if current is not None else subscription.in_use()
    try:
        found = subscription.check(arm, stack.subscription, current)
        if any(f.status == FAIL for f in found):
            return found  # every other answer would be about the wrong (or no) subscription
        sub = stack.subscription
        found += providers.check(arm, sub)
        found += roles.check_permissions(arm, sub, naming.dashed(cfg.prefix, cfg.stack, "rg"))
        found += roles.check_principal(roles.claims(credential), cfg.users)
        needs = [quota.Need(c.name, c.vm_size, c.max_nodes, c.low_priority) for c in cfg.clusters]
        return found + quota_findings(arm, sub, cfg.location, needs)
    except ClientAuthenticationError as e:
        return [Finding(FAIL, "sign-in", describe(e, "asking Azure"), SIGN_IN)]


def run(stack: StackFile, credential=None, transport=None, current=None, out=sys.stdout) -> int:
    if credential is None:
        from ..credential import azure_credential

        credential = azure_credential()  # the person's sign-in, not this machine's identity
    print(
        f"preflight for stack {stack.settings.stack}: subscription {stack.subscription or '(not pinned)'}, "
        f"region {stack.settings.location}",
        file=out,
    )
    return report(findings(stack, credential, transport, current), out)
