"""Before `pulumi up`: the subscription, its resource providers, the deployer's permissions and kind, the hub
VNet in hub mode, and every cluster's quota, each with its fix; with a data stack, its subscription and the
deployer's rights there too. Exit status 1 when anything fails."""

from __future__ import annotations

import sys

from azure.core.exceptions import AzureError, ClientAuthenticationError

from trainingplatform import naming

from . import hub, providers, quota, roles, subscription
from .arm import Arm, attempt, describe, signed_out
from .findings import FAIL, WARN, Finding, report
from .stackfile import DataStackFile, StackFile


def quota_findings(
    arm: Arm,
    subscription_id: str,
    location: str,
    needs: list[quota.Need],
    nodes: int | None = None,
    workspace_id: str | None = None,
) -> list[Finding]:
    """workspace_id: a deployed workspace, whose own per-family quotas count too (doctor)."""
    region, failed = attempt(
        lambda: quota.read_region(arm, subscription_id, location),
        "quota",
        f"reading Azure ML quotas and VM sizes in {location}",
        "needs Reader on the subscription, or the stack's quota reader role (quotaReaderRole, given to "
        "`users`: docs/deploying.md#who-can-use-it); is Microsoft.MachineLearningServices registered?",
    )
    if failed:
        return failed
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
        token_claims = roles.claims(credential)
        object_id, _ = roles.principal(token_claims)
        found += providers.check(arm, sub)
        found += roles.check_permissions(arm, sub, naming.dashed(cfg.prefix, cfg.stack, "rg"), object_id)
        found += roles.check_principal(token_claims, cfg.users)
        if cfg.quota_reader_role:
            found += roles.check_quota_reader_role(arm, sub)
        found += hub.check(arm, cfg)
        needs = [quota.Need(c.name, c.vm_size, c.max_nodes, c.low_priority) for c in cfg.clusters]
        return found + quota_findings(arm, sub, cfg.location, needs)
    except ClientAuthenticationError as e:
        return [signed_out(e)]


def data_findings(
    data: DataStackFile, credential, transport=None, current=None, platform: StackFile | None = None
) -> list[Finding]:
    """The data stack (infra/data-stack): its subscription (unless the platform's, checked already), the
    providers (unless checked for the platform: one list covers both programs), and the deployer's rights on the
    data resource group, where it creates role assignments too."""
    cfg = data.settings
    arm = Arm(credential, transport)
    current = current if current is not None else subscription.in_use()
    same = platform is not None and (platform.subscription or "").lower() == (data.subscription or "").lower()
    try:
        found = [] if same else [_data(f) for f in subscription.check(arm, data.subscription, current)]
        if any(f.status == FAIL for f in found):
            return found
        sub = data.subscription
        token_claims = roles.claims(credential)
        object_id, _ = roles.principal(token_claims)
        if platform is None:
            found += providers.check(arm, sub)
        group = cfg.resource_group_name or naming.dashed(cfg.prefix, cfg.stack, "data-rg")
        found += roles.check_permissions(
            arm, sub, group, object_id, roles.DATA_NEEDED, "data permissions", roles.DATA_ROLES
        )
        return found + [_data(f) for f in roles.check_principal(token_claims, cfg.users)]
    except ClientAuthenticationError as e:
        return [signed_out(e)]


def _data(f: Finding) -> Finding:
    return Finding(f.status, f"data {f.check}", f.message, f.fix)


def run(
    stack: StackFile | None,
    credential=None,
    transport=None,
    current=None,
    out=sys.stdout,
    data: DataStackFile | None = None,
) -> int:
    if credential is None:
        from azureaccess.credential import azure_credential

        credential = azure_credential()  # the person's sign-in, not this machine's identity
    found: list[Finding] = []
    if stack is not None:
        print(
            f"preflight for stack {stack.settings.stack}: subscription {stack.subscription or '(not pinned)'}, "
            f"region {stack.settings.location}",
            file=out,
        )
        found = findings(stack, credential, transport, current)
        for f in found:
            print(f.render(), file=out)
    if data is not None and not any(f.status == FAIL and f.check == "subscription" for f in found):
        print(
            f"preflight for data stack {data.settings.stack} (infra/data-stack): subscription "
            f"{data.subscription or '(not pinned)'}, region {data.settings.location}",
            file=out,
        )
        more = data_findings(data, credential, transport, current, stack)
        if stack is not None:
            try:
                more += hub.check_data_records(Arm(credential, transport), stack.settings, hub.data_accounts(data))
            except ClientAuthenticationError as e:
                more.append(signed_out(e))
        for f in more:
            print(f.render(), file=out)
        found += more
    return report(found, out, printed=True)
