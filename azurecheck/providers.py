"""Resource providers the stacks' resources need, registered in the subscription.

A resource of an unregistered namespace fails at deploy time (MissingSubscriptionRegistration), after
the resources before it exist. The namespaces come from the modules of the azure-native resource types
the two programs declare (tests/azurecheck/test_preflight.py runs both programs under mocks and fails when
a declared module is missing here).
"""

from __future__ import annotations

from .arm import PROVIDERS_API, Arm, attempt
from .findings import FAIL, OK, Finding

# azure-native module -> the ARM namespace its resource types live in.
NAMESPACES = {
    "machinelearningservices": "Microsoft.MachineLearningServices",
    "storage": "Microsoft.Storage",
    "containerregistry": "Microsoft.ContainerRegistry",
    "keyvault": "Microsoft.KeyVault",
    "network": "Microsoft.Network",
    "privatedns": "Microsoft.Network",
    "applicationinsights": "Microsoft.Insights",
    "monitor": "Microsoft.Insights",  # the workspace's diagnostic setting (Microsoft.Insights/diagnosticSettings)
    "operationalinsights": "Microsoft.OperationalInsights",
    "managedidentity": "Microsoft.ManagedIdentity",
    "compute": "Microsoft.Compute",  # the jump host of access.mode bastion (wayin.py)
    "devtestlab": "Microsoft.DevTestLab",  # the jump host's daily auto-shutdown schedule (wayin.py)
    # Registered in every subscription (learn.microsoft.com/azure/azure-resource-manager/management/
    # resource-providers-and-types, "registered by default"): nothing to check.
    "resources": None,
    "authorization": None,
}
REQUIRED = tuple(sorted({ns for ns in NAMESPACES.values() if ns}))


def check(arm: Arm, subscription: str, namespaces: tuple[str, ...] = REQUIRED) -> list[Finding]:
    findings = []
    for ns in namespaces:
        provider, failed = attempt(
            lambda ns=ns: arm.get(f"/subscriptions/{subscription}/providers/{ns}", PROVIDERS_API),
            f"provider {ns}",
            f"reading {ns}'s registration",
            f"`az provider show -n {ns} --subscription {subscription}` with an identity that can read the subscription",
        )
        findings += failed
        if failed:
            continue
        state = provider.get("registrationState")
        if state == "Registered":
            findings.append(Finding(OK, f"provider {ns}", "registered"))
        else:
            findings.append(
                Finding(
                    FAIL,
                    f"provider {ns}",
                    f"{state or 'NotRegistered'} in subscription {subscription}: "
                    "deploying its resources fails with MissingSubscriptionRegistration",
                    f"az provider register --namespace {ns} --subscription {subscription} --wait "
                    "(needs */register/action, e.g. Contributor on the subscription)",
                )
            )
    return findings
