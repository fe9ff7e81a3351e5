"""The policy pack against what the mocked dev stack declares (all pass) and against bad resources."""

import copy
import json
import pathlib

import pytest
import training_policies as tp
from infra_helpers import one
from pulumi_policy.policy import PolicyResource, PolicyResourceOptions, ResourceValidationArgs, StackValidationArgs

from trainingplatform import mocked


def _validate(policy, resource_type, props, config=None):
    violations = []
    args = ResourceValidationArgs(
        resource_type,
        props,
        "urn:test",
        "test",
        PolicyResourceOptions(False, [], None, [], None, []),
        None,
        config or {},
    )
    policy.validate(args, lambda message, urn=None: violations.append(message))
    return violations


def _resource_policies():
    """The per-resource rules of RULES (the other policies have tests of their own below)."""
    return [p for p in tp.policies() if p.name in {rule.name for rule in tp.RULES}]


def test_every_policy_passes_on_the_dev_stack(dev, dev_data):
    mocks, _ = dev
    checked = set()
    for policy in _resource_policies():
        for r in mocks.resources + dev_data[0].resources:  # the platform and its data stack
            assert _validate(policy, r.type, r.inputs) == [], (policy.name, r.name)
            if r.type == next(rule.resource_type for rule in tp.RULES if rule.name == policy.name):
                checked.add(policy.name)
    assert checked == {rule.name for rule in tp.RULES}, "every rule met at least one resource"
    assert tp.check_gpu_budget(((r.type, r.inputs) for r in mocks.resources), 16) is None


def _props(dev, dev_data, name):
    return copy.deepcopy(next(r for r in dev[0].resources + dev_data[0].resources if r.name == name))


@pytest.mark.parametrize(
    "name,edit,rule,message",
    [
        (
            "storage-data",
            lambda p: p.update(enableHttpsTrafficOnly=False),
            "storage-secure-transfer",
            "secure transfer",
        ),
        ("storage-data", lambda p: p.update(minimumTlsVersion="TLS1_0"), "storage-min-tls-1-2", "TLS1_2 or later"),
        ("storage-logs", lambda p: p.update(allowBlobPublicAccess=True), "storage-no-public-blob-access", "anonymous"),
        # ml-storage: the data accounts also have public network access off, which the rule accepts on its own.
        (
            "ml-storage",
            lambda p: p["networkRuleSet"].update(defaultAction="Allow"),
            "storage-network-deny-by-default",
            "deny",
        ),
        ("storage-data", lambda p: p.update(allowSharedKeyAccess=True), "storage-no-shared-keys", "Entra ID"),
        (
            "nfs-account",
            lambda p: p.update(publicNetworkAccess="Enabled"),
            "storage-secure-transfer",
            "secure transfer",
        ),
        ("registry-acr", lambda p: p.update(adminUserEnabled=True), "registry-admin-user-disabled", "admin user"),
        ("registry-acr", lambda p: p.update(sku={"name": "Basic"}), "registry-premium", "Premium"),
        (
            "ml-kv",
            lambda p: p["properties"].update(enablePurgeProtection=False),
            "keyvault-purge-protection-rbac",
            "purge",
        ),
        (
            "compute-gpu-ib",
            lambda p: p["properties"]["properties"].update(enableNodePublicIp=True),
            "compute-no-public-ip",
            "no public IP",
        ),
        (
            "compute-gpu-ib",
            lambda p: p["properties"]["properties"].update(vmSize="Standard_NC24rs_v3"),
            "compute-current-vm-size",
            "ND96isr_H100_v5",
        ),
        (
            "compute-gpu-ib",
            lambda p: p["properties"]["properties"].update(remoteLoginPortPublicAccess="Enabled"),
            "compute-ssh-disabled",
            "SSH",
        ),
    ],
)
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


def _stack(mocks, drop=lambda r: False):
    return [
        PolicyResource(r.type, r.inputs, "urn", r.name, None, None, None, [], {})
        for r in mocks.resources
        if not drop(r)
    ]


def _stack_violations(policy_name, resources, config=None):
    policy = next(p for p in tp.policies() if p.name == policy_name)
    violations: list[str] = []
    policy.validate(StackValidationArgs(resources, config or {}), _reporter(violations))
    return violations


def test_workspace_endpoint_policy(dev):
    mocks, _ = dev
    name = "workspace-endpoint-for-private-nodes"
    assert _stack_violations(name, _stack(mocks)) == []
    # Without the workspace endpoint: refused, as Azure ML would refuse the clusters.
    no_endpoint = _stack(
        mocks,
        lambda r: (
            r.type.endswith("PrivateEndpoint")
            and r.inputs["privateLinkServiceConnections"][0]["groupIds"] == ["amlworkspace"]
        ),
    )
    violations = _stack_violations(name, no_endpoint)
    assert len(violations) == 1 and "need a workspace private endpoint (group amlworkspace)" in violations[0]
    # Endpoint present but the notebooks zone missing: refused, naming the zone.
    no_zone = _stack(
        mocks,
        lambda r: r.type.endswith("PrivateZone") and r.inputs["privateZoneName"] == "privatelink.notebooks.azure.net",
    )
    violations = _stack_violations(name, no_zone)
    assert len(violations) == 1 and "privatelink.notebooks.azure.net" in violations[0]
    # Nodes with public IPs do not need it.
    public_nodes = copy.deepcopy(no_endpoint)
    for r in public_nodes:
        if r.resource_type == tp.COMPUTE:
            r.props["properties"]["properties"]["enableNodePublicIp"] = True
    assert _stack_violations(name, public_nodes) == []


def test_private_profile_policy(dev, prod):
    policy = next(p for p in tp.policies() if p.name == "no-public-network-access-in-private-profile")
    on = {"privateProfile": True}
    prod_mocks, _ = prod
    checked = set()
    for r in prod_mocks.resources:
        assert _validate(policy, r.type, r.inputs, on) == [], r.name
        checked.add(r.type)
    assert set(tp.PRIVATE_PROFILE_TYPES) <= checked
    dev_mocks, _ = dev
    failing = {r.name: _validate(policy, r.type, r.inputs, on) for r in dev_mocks.resources}
    failing = {k: v for k, v in failing.items() if v}
    assert sorted(failing) == ["ml-kv", "ml-storage", "ml-workspace", "registry-acr"]
    assert "publicNetworkAccess 'Enabled' in the private profile: set it to Disabled" in failing["registry-acr"][0]
    # Off by default: the dev stack is not the private profile.
    assert all(_validate(policy, r.type, r.inputs) == [] for r in dev_mocks.resources)
    # The committed policy config turns it on.
    config = json.loads((pathlib.Path(tp.__file__).parent / "private-profile.json").read_text())
    assert config[policy.name] == on
    # Storage accounts are checked too (issue 20, item 16): the dev workspace storage has public access on.
    assert "storage account has publicNetworkAccess 'Enabled'" in failing["ml-storage"][0]


def test_every_stack_policy_passes_on_dev_and_prod(dev, prod):
    for mocks, _ in (dev, prod):
        resources = _stack(mocks)
        assert _stack_violations("workspace-endpoint-for-private-nodes", resources) == []
        assert _stack_violations("gpu-budget", resources, {"maxGpus": 64}) == []


@pytest.mark.parametrize("policy_name", ["outbound-deny-in-private-profile", "no-client-ips-in-private-profile"])
def test_private_profile_policies_pass_on_prod_and_are_off_by_default(dev, prod, policy_name):
    policy = next(p for p in tp.policies() if p.name == policy_name)
    on = {"privateProfile": True}
    prod_mocks, _ = prod
    assert [r.name for r in prod_mocks.resources if _validate(policy, r.type, r.inputs, on)] == []
    dev_mocks, _ = dev
    assert all(_validate(policy, r.type, r.inputs) == [] for r in dev_mocks.resources)
    config = json.loads((pathlib.Path(tp.__file__).parent / "private-profile.json").read_text())
    assert config[policy_name] == on


def test_outbound_deny_policy(dev, prod):
    # NSG rules are evaluated lowest priority number first and stop at the first match; the default
    # AllowInternetOutBound (65001) lets out whatever no rule denies first
    # (https://learn.microsoft.com/azure/virtual-network/network-security-groups-overview#security-rules).
    policy = next(p for p in tp.policies() if p.name == "outbound-deny-in-private-profile")
    on = {"privateProfile": True}
    dev_nsg = copy.deepcopy(one(dev[0], "NetworkSecurityGroup", "net-compute-nsg"))
    violations = _validate(policy, dev_nsg.type, dev_nsg.inputs, on)  # dev: restrictOutbound false
    assert violations and "no outbound rule denying the Internet" in violations[0]
    nsg = copy.deepcopy(one(prod[0], "NetworkSecurityGroup", "net-compute-nsg"))
    assert _validate(policy, nsg.type, nsg.inputs, on) == []
    # An allow of the whole Internet ahead of the deny reopens it.
    nsg.inputs["securityRules"].append(
        {
            "name": "out-anything",
            "direction": "Outbound",
            "access": "Allow",
            "priority": 3000,
            "protocol": "*",
            "destinationAddressPrefix": "Internet",
            "destinationPortRange": "*",
        }
    )
    violations = _validate(policy, nsg.type, nsg.inputs, on)
    assert violations and "out-anything allow the whole Internet before the deny" in violations[0]
    # The same rule after the deny changes nothing.
    nsg.inputs["securityRules"][-1]["priority"] = 4090
    assert _validate(policy, nsg.type, nsg.inputs, on) == []
    # A list of destinations that includes the Internet reopens it as well.
    nsg.inputs["securityRules"][-1].update(
        priority=3000, destinationAddressPrefix=None, destinationAddressPrefixes=["AzureMonitor", "Internet"]
    )
    assert _validate(policy, nsg.type, nsg.inputs, on)


@pytest.mark.parametrize(
    "name,edit,message",
    [
        (
            "ml-storage",
            lambda p: p["networkRuleSet"]["ipRules"].append({"iPAddressOrRange": "52.10.20.30", "action": "Allow"}),
            "storage account's networkRuleSet.ipRules admit ['52.10.20.30']",
        ),
        (
            "ml-kv",
            lambda p: p["properties"]["networkAcls"]["ipRules"].append({"value": "52.10.20.30"}),
            "Key Vault's networkAcls.ipRules admit ['52.10.20.30']",
        ),
    ],
)
def test_client_ip_policy(prod, name, edit, message):
    policy = next(p for p in tp.policies() if p.name == "no-client-ips-in-private-profile")
    r = copy.deepcopy(one(prod[0], "", name))
    assert _validate(policy, r.type, r.inputs, {"privateProfile": True}) == []
    edit(r.inputs)
    violations = _validate(policy, r.type, r.inputs, {"privateProfile": True})
    assert violations and message in violations[0], violations
    assert _validate(policy, r.type, r.inputs) == []  # off outside the private profile


def test_client_ips_reach_the_policy_under_the_names_it_reads(dev_data_raw):
    # The policy reads the engine's property names; a data stack with a client IP must trip it.
    raw, location = copy.deepcopy(dev_data_raw)
    raw["allowedClientIps"] = ["52.10.20.30"]
    mocks, _ = mocked.run_data(raw, "dev", location)
    policy = next(p for p in tp.policies() if p.name == "no-client-ips-in-private-profile")
    data = one(mocks, "StorageAccount", "storage-data")
    violations = _validate(policy, data.type, data.inputs, {"privateProfile": True})
    assert violations and "52.10.20.30" in violations[0]


def test_the_prod_data_stack_passes_the_private_profile_policies():
    from infra_helpers import DATA_PROD_FILE

    from trainingplatform import dataconfig

    raw, location = mocked.read_stack_file(DATA_PROD_FILE, dataconfig.PROJECT)
    mocks, _ = mocked.run_data(raw, "prod", location)
    on = {"privateProfile": True}
    names = (
        "no-public-network-access-in-private-profile",
        "outbound-deny-in-private-profile",
        "no-client-ips-in-private-profile",
    )
    checked = 0
    for policy in (p for p in tp.policies() if p.name in names):
        for r in mocks.resources:
            assert _validate(policy, r.type, r.inputs, on) == [], (policy.name, r.name)
            checked += r.type == tp.STORAGE
    assert checked == 3 * len(mocks.of_type("StorageAccount")) == 9
