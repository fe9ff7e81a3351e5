"""Teardown and re-attach: the platform's second life over the kept data creates nothing that exists.

What Azure and Pulumi do, which these tests hold the program to:
- azure-native refuses to create a resource that already exists (it would otherwise adopt it silently):
  a new life of a stack must not declare the data group, accounts, containers or share that outlived the
  last one (`pulumi import` with the right parent URN was the old, manual way out).
- `protect`: "a protected resource cannot be deleted directly, and it will be an error to do a Pulumi
  deployment which tries to delete a protected resource for any reason", a replacement included
  (pulumi.com/docs/iac/concepts/resources/options/protect). Retain-on-delete, by contrast, also applies
  on replace: a renamed account would silently leave the old one (and its data) behind.
- Key Vault and Azure ML workspace names stay taken while soft-deleted (days), so a new life needs new names.
"""

import copy

from infra_helpers import one

from trainingplatform import mocked

# Inputs that name an ARM resource (with its parents): two declarations with the same values are the same
# Azure resource.
_NAME_KEYS = (
    "resourceGroupName",
    "accountName",
    "containerName",
    "shareName",
    "registryName",
    "vaultName",
    "workspaceName",
    "computeName",
    "virtualNetworkName",
    "privateZoneName",
    "roleAssignmentName",
    "blobServicesName",
    "fileServicesName",
    "subnetName",
    "privateEndpointName",
    "privateDnsZoneGroupName",
    "name",
    "scope",
)


def azure_key(r):
    named = tuple((k, str(r.inputs[k]).lower()) for k in _NAME_KEYS if isinstance(r.inputs.get(k), str))
    # Without a name input the provider auto-names it (logical name + random suffix).
    return (r.type, named or (("auto", r.name),))


def _custom(mocks):
    return [r for r in mocks.resources if r.type.startswith("azure-native:")]


def _life(dev_raw, data_out, random_result):
    return mocked.run(
        copy.deepcopy(dev_raw[0]),
        "dev",
        dev_raw[1],
        mocked.RecordingMocks(random_result=random_result),
        data_outputs=data_out,
    )


def test_destroy_then_up_creates_nothing_that_exists_and_leaves_the_data_alone(dev_raw, dev_data_raw):
    # Day 1: the data stack, then the platform over it.
    data1, data_out1 = mocked.run_data(copy.deepcopy(dev_data_raw[0]), "dev", dev_data_raw[1])
    life1, out1 = _life(dev_raw, data_out1, "x7k2q")
    azure = {azure_key(r) for r in _custom(data1)} | {azure_key(r) for r in _custom(life1)}

    # `pulumi destroy` of the platform: every resource of its state goes (none is retained or protected,
    # or destroy would leave it behind or fail); the data stack's state and resources are untouched.
    assert life1.retained == set() and life1.protected == set()
    azure -= {azure_key(r) for r in _custom(life1)}
    soft_deleted = {r.inputs["vaultName"] for r in life1.of_type("keyvault:Vault")} | {
        r.inputs["workspaceName"] for r in life1.of_type("machinelearningservices:Workspace")
    }
    assert azure == {azure_key(r) for r in _custom(data1)}

    # Day 2: `pulumi up` of the platform again; the data stack, if run again, declares exactly what it did.
    data2, data_out2 = mocked.run_data(copy.deepcopy(dev_data_raw[0]), "dev", dev_data_raw[1])
    life2, out2 = _life(dev_raw, data_out2, "p3m9w")
    creates = {azure_key(r): r.name for r in _custom(life2)}  # a new state: everything is a create
    clash = sorted(name for key, name in creates.items() if key in azure)
    assert clash == [], f"the second life would create resources that exist: {clash}"
    assert not soft_deleted & (
        {r.inputs["vaultName"] for r in life2.of_type("keyvault:Vault")}
        | {r.inputs["workspaceName"] for r in life2.of_type("machinelearningservices:Workspace")}
    )
    # No update, hence no replacement, of any data resource: same resources, same inputs.
    assert {r.name: r.inputs for r in _custom(data2)} == {r.name: r.inputs for r in _custom(data1)}
    assert data_out2 == data_out1
    # Jobs keep finding their data: the contract's data outputs are those of the first life.
    for key in ("datastores", "nfs", "data_resource_group", "subscription_id"):
        assert out2[key] == out1[key], key
    # And the second life is wired to the kept accounts, not to something new.
    for account in ("storage-data", "storage-logs", "nfs-account"):
        target = one(data1, "StorageAccount", account).id
        assert [
            r
            for r in life2.of_type("PrivateEndpoint")
            if r.inputs["privateLinkServiceConnections"][0]["privateLinkServiceId"] == target
        ], account


def test_the_data_stack_depends_on_nothing_of_the_platforms_lifecycle(dev, dev_data):
    platform_ids = {r.id for r in _custom(dev[0])}

    def values(v):
        if isinstance(v, dict):
            for x in v.values():
                yield from values(x)
        elif isinstance(v, list):
            for x in v:
                yield from values(x)
        else:
            yield v

    for r in _custom(dev_data[0]):
        assert not platform_ids & {v for v in values(r.inputs) if isinstance(v, str)}, r.name
        rules = r.inputs.get("networkRuleSet") or {}
        assert not rules.get("virtualNetworkRules"), f"{r.name}: a VNet rule would dangle after the platform's destroy"


def _data(mocks):
    """The data stack's data: everything but its users' role assignments, which are access, not data, and
    must be removable (a user taken off `users` loses access at the next `up`)."""
    return [r for r in _custom(mocks) if not r.type.endswith("RoleAssignment")]


def test_every_data_resource_is_protected(dev_data):
    mocks, _ = dev_data
    assert {r.name for r in _data(mocks)} == mocks.protected
    assert not {r.name for r in mocks.of_type("RoleAssignment")} & mocks.protected
    assert mocks.retained == set(), "retain-on-delete also applies on replace: it would orphan data silently"


def test_a_prefix_change_would_replace_only_protected_resources(dev_data_raw, dev_data):
    # A new prefix renames the group and the accounts: Pulumi plans a replacement, and refuses it because
    # they are protected, instead of orphaning the data under the old names.
    before = {r.name: azure_key(r) for r in _custom(dev_data[0])}
    raw = dict(copy.deepcopy(dev_data_raw[0]), prefix="hvx")
    mocks, _ = mocked.run_data(raw, "dev", dev_data_raw[1])
    renamed = {r.name for r in _data(mocks) if azure_key(r) != before[r.name]}
    assert {"data", "storage-data", "storage-logs", "nfs-account", "storage-data-container", "nfs-share"} <= renamed
    assert renamed <= dev_data[0].protected
