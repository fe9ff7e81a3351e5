"""The policy pack against what the mocked dev stack declares (all pass) and against bad resources."""
import copy

import pytest
from pulumi_policy.policy import PolicyResourceOptions, ResourceValidationArgs, StackValidationArgs, PolicyResource

import training_policies as tp


def _validate(policy, resource_type, props):
    violations = []
    args = ResourceValidationArgs(resource_type, props, "urn:test", "test",
                                  PolicyResourceOptions(False, [], None, [], None, []), None, {})
    policy.validate(args, lambda message, urn=None: violations.append(message))
    return violations


def _resource_policies():
    return [p for p in tp.policies() if hasattr(p, "validate") and p.name != "gpu-budget"]


def test_every_policy_passes_on_the_dev_stack(dev, dev_data):
    mocks, _ = dev
    checked = set()
    for policy in _resource_policies():
        for r in mocks.resources + dev_data[0].resources:   # the platform and its data stack
            assert _validate(policy, r.type, r.inputs) == [], (policy.name, r.name)
            if r.type == next(rule.resource_type for rule in tp.RULES if rule.name == policy.name):
                checked.add(policy.name)
    assert checked == {rule.name for rule in tp.RULES}, "every rule met at least one resource"
    assert tp.check_gpu_budget(((r.type, r.inputs) for r in mocks.resources), 16) is None


def _props(dev, dev_data, name):
    return copy.deepcopy(next(r for r in dev[0].resources + dev_data[0].resources if r.name == name))


@pytest.mark.parametrize("name,edit,rule,message", [
    ("storage-data", lambda p: p.update(enableHttpsTrafficOnly=False), "storage-secure-transfer", "secure transfer"),
    ("storage-data", lambda p: p.update(minimumTlsVersion="TLS1_0"), "storage-min-tls-1-2", "TLS1_2 or later"),
    ("storage-logs", lambda p: p.update(allowBlobPublicAccess=True), "storage-no-public-blob-access", "anonymous"),
    # ml-storage: the data accounts also have public network access off, which the rule accepts on its own.
    ("ml-storage", lambda p: p["networkRuleSet"].update(defaultAction="Allow"), "storage-network-deny-by-default", "deny"),
    ("storage-data", lambda p: p.update(allowSharedKeyAccess=True), "storage-no-shared-keys", "Entra ID"),
    ("nfs-account", lambda p: p.update(publicNetworkAccess="Enabled"), "storage-secure-transfer", "secure transfer"),
    ("registry-acr", lambda p: p.update(adminUserEnabled=True), "registry-admin-user-disabled", "admin user"),
    ("registry-acr", lambda p: p.update(sku={"name": "Basic"}), "registry-premium", "Premium"),
    ("ml-kv", lambda p: p["properties"].update(enablePurgeProtection=False), "keyvault-purge-protection-rbac", "purge"),
    ("compute-gpu-ib", lambda p: p["properties"]["properties"].update(enableNodePublicIp=True), "compute-no-public-ip", "no public IP"),
    ("compute-gpu-ib", lambda p: p["properties"]["properties"].update(vmSize="Standard_NC24rs_v3"), "compute-current-vm-size", "ND96isr_H100_v5"),
    ("compute-gpu-ib", lambda p: p["properties"]["properties"].update(remoteLoginPortPublicAccess="Enabled"), "compute-ssh-disabled", "SSH"),
])
def test_a_bad_resource_fails_its_policy(dev, dev_data, name, edit, rule, message):
    r = _props(dev, dev_data, name)
    edit(r.inputs)
    policy = next(p for p in _resource_policies() if p.name == rule)
    violations = _validate(policy, r.type, r.inputs)
    assert violations and message in violations[0], violations


def _reporter(into: list):
    return lambda message, urn=None: into.append(message)


def test_gpu_budget_policy(dev):
    mocks, _ = dev
    resources = [PolicyResource(r.type, r.inputs, "urn", r.name, None, None, None, [], {}) for r in mocks.resources]
    budget = next(p for p in tp.policies() if p.name == "gpu-budget")
    for cap, expected in ((16, 0), (8, 1)):
        violations: list[str] = []
        budget.validate(StackValidationArgs(resources, {"maxGpus": cap}), _reporter(violations))
        assert len(violations) == expected, (cap, violations)
    assert "can scale to 16 GPUs, above this stack's cap of 8" in violations[0]
