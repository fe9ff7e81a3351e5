"""Global names (storage accounts, registry): unique per subscription, stable per stack, valid for Azure.

Azure's rules (learn.microsoft.com/azure/azure-resource-manager/management/resource-name-rules):
storage account names are 3-24 lowercase letters and digits, globally unique; container registry names
5-50 letters and digits, globally unique. A name hashed only from prefix/stack/region is the same for
every team that deploys the committed stack file: the second one gets StorageAccountAlreadyTaken.
"""

import copy
import itertools
import re

from trainingplatform import mocked, naming

SUB_A = "aaaaaaaa-0000-4000-8000-000000000001"
SUB_B = "bbbbbbbb-0000-4000-8000-000000000002"
STORAGE = re.compile(r"^[a-z0-9]{3,24}$")
REGISTRY = re.compile(r"^[a-zA-Z0-9]{5,50}$")


def _global_names(dev_raw, dev_data_raw, subscription):
    """{logical name: Azure name} of every globally named resource, data stack and platform, in one subscription."""
    data_mocks, data_out = mocked.run_data(
        copy.deepcopy(dev_data_raw[0]), "dev", dev_data_raw[1], mocked.RecordingMocks(subscription=subscription)
    )
    mocks, _ = mocked.run(
        copy.deepcopy(dev_raw[0]),
        "dev",
        dev_raw[1],
        mocked.RecordingMocks(subscription=subscription),
        data_outputs=data_out,
    )
    names = {
        r.name: r.inputs["accountName"]
        for m in (data_mocks, mocks)
        for r in m.of_type("azure-native:storage:StorageAccount")
    }
    names.update({r.name: r.inputs["registryName"] for r in mocks.of_type("containerregistry:Registry")})
    return names


def test_two_subscriptions_get_different_names_one_subscription_the_same_twice(dev_raw, dev_data_raw):
    a1 = _global_names(dev_raw, dev_data_raw, SUB_A)
    a2 = _global_names(dev_raw, dev_data_raw, SUB_A)
    b = _global_names(dev_raw, dev_data_raw, SUB_B)
    assert set(a1) == {"storage-data", "storage-logs", "nfs-account", "ml-storage", "registry-acr"}
    assert a1 == a2, "the same subscription and stack must get the same names on every run"
    for logical in a1:
        assert a1[logical] != b[logical], logical
    assert len(set(a1.values())) == len(a1), "names are distinct within a stack"


def test_names_are_valid_for_every_prefix_and_stack_and_keep_the_whole_hash():
    for prefix, stack, role in itertools.product(
        ("ab", "hvd", "abcdefgh"), ("d", "dev", "Team-B_prod-westeurope"), ("data", "logs", "nfs", "mlws")
    ):
        suffix = naming.global_suffix(SUB_A, prefix, stack, "westeurope")
        name = naming.storage_account(prefix, stack, role, suffix)
        assert STORAGE.match(name), name
        assert name.endswith(suffix), (name, "the hash must never be cut, or uniqueness is lost")
        acr = naming.registry(prefix, stack, suffix)
        assert REGISTRY.match(acr) and acr.endswith(suffix), acr


def test_suffix_depends_on_each_part():
    base = naming.global_suffix(SUB_A, "hvd", "dev", "westeurope")
    assert base == naming.global_suffix(SUB_A.upper(), "hvd", "dev", "westeurope")  # Azure ids are case-insensitive
    for other in (
        naming.global_suffix(SUB_B, "hvd", "dev", "westeurope"),
        naming.global_suffix(SUB_A, "hvx", "dev", "westeurope"),
        naming.global_suffix(SUB_A, "hvd", "prod", "westeurope"),
        naming.global_suffix(SUB_A, "hvd", "dev", "northeurope"),
    ):
        assert other != base


# Azure's naming rules, per resource type (resource-name-rules, cited above; Azure ML compute: "Compute name
# ... 2 to 16 characters ... letters, digits and hyphens, starting with a letter", az ml compute create).
RULES = {
    "azure-native:resources:ResourceGroup": ("resourceGroupName", re.compile(r"^[-\w.()]{0,89}[-\w()]$")),
    "azure-native:storage:StorageAccount": ("accountName", STORAGE),
    "azure-native:containerregistry:Registry": ("registryName", REGISTRY),
    "azure-native:keyvault:Vault": ("vaultName", re.compile(r"^(?!.*--)[a-zA-Z][a-zA-Z0-9-]{1,22}[a-zA-Z0-9]$")),
    "azure-native:machinelearningservices:Workspace": ("workspaceName", re.compile(r"^[a-zA-Z0-9][\w-]{2,32}$")),
    "azure-native:machinelearningservices:Compute": (
        "computeName",
        re.compile(r"^[a-zA-Z][a-zA-Z0-9-]{0,14}[a-zA-Z0-9]$"),
    ),
}
# Stack names Pulumi accepts: letters, digits, hyphens, underscores and periods, up to 100 characters.
STACKS = ("a", "-_-", "staging1", "staging2", "Team-B_prod.westeurope", "x" * 99 + "1", "x" * 99 + "2")


def _names(stack, dev_raw, dev_data_raw):
    data_mocks, data_out = mocked.run_data(copy.deepcopy(dev_data_raw[0]), stack, dev_data_raw[1])
    mocks, _ = mocked.run(copy.deepcopy(dev_raw[0]), stack, dev_raw[1], data_outputs=data_out)
    return {
        (r.type, r.name): r.inputs[RULES[r.type][0]]
        for m in (data_mocks, mocks)
        for r in m.resources
        if r.type in RULES
    }


def test_every_name_is_valid_for_every_stack_name_and_no_two_stacks_share_one(dev_raw, dev_data_raw):
    # `staging1` and `staging2` were both hvd-stagin-rg; `-_-` made a Key Vault name with consecutive hyphens.
    seen = {}
    for stack in STACKS:
        for (typ, _logical), name in _names(stack, dev_raw, dev_data_raw).items():
            key, rule = RULES[typ]
            assert rule.match(name), (stack, typ, key, name)
            if typ.endswith("Compute"):
                continue  # cluster names live inside one workspace, which is the stack's own
            assert (typ, name.lower()) not in seen, f"{stack} and {seen[(typ, name.lower())]} both get {typ} {name}"
            seen[(typ, name.lower())] = stack


def test_stack_id_keeps_a_readable_part_and_hashes_the_whole_name():
    assert naming.stack_id("staging1") != naming.stack_id("staging2")
    assert naming.stack_id("staging1").startswith("sta") and naming.stack_id("-_-").isalnum()
    assert len({naming.stack_id(s) for s in STACKS}) == len(STACKS)
