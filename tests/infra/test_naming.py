"""Global names (storage accounts, registry): unique per subscription, stable per stack, valid for Azure.

Azure's rules (learn.microsoft.com/azure/azure-resource-manager/management/resource-name-rules):
storage account names are 3-24 lowercase letters and digits, globally unique; container registry names
5-50 letters and digits, globally unique. A name hashed only from prefix/stack/region is the same for
every team that deploys the committed stack file: the second one gets StorageAccountAlreadyTaken.
"""

import copy
import itertools
import random
import re
import string

from trainingplatform import clusterconfig, config, mocked, naming

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


# Azure ML compute names (issue 28, item 4). Sources, quoted:
# - resource-name-rules (learn.microsoft.com/azure/azure-resource-manager/management/resource-name-rules),
#   Microsoft.MachineLearningServices: "workspaces / computes | workspace | 2-16 | Alphanumerics and hyphens."
# - "Create an Azure Machine Learning compute cluster" (learn.microsoft.com/azure/machine-learning/
#   how-to-create-attach-compute-cluster), "Compute name": "Name is required and must be between 3 to 24
#   characters long", "Valid characters are upper and lower case letters, digits, and the - character", "Name
#   must start with a letter", "Name needs to be unique across all existing computes within an Azure region",
#   "If - character is used, then it needs to be followed by at least one letter later in the name."
# - Azure ML's answer to `cpu-cluster-1` (github.com/microsoftdocs/pipelines-azureml/issues/19; its message
#   states the compute-instance form of the rule): "Numbers cannot be the ending of the name if the previous
#   character is a minus symbol (-)."
# Both length rules hold: 3-16.
COMPUTE_CHARS = re.compile(r"^[a-zA-Z][a-zA-Z0-9-]{2,15}$")


def compute_name_problems(name: str) -> list[str]:
    """Every documented rule `name` breaks (empty: a valid Azure ML compute cluster name)."""
    problems = []
    if not 3 <= len(name) <= 16:
        problems.append(f"{len(name)} characters: 2-16 (resource-name-rules) and 3-24 (the studio) both hold")
    if not COMPUTE_CHARS.match(name):
        problems.append("letters, digits and '-', starting with a letter")
    if re.search(r"-[0-9]+$", name):
        problems.append("ends in '-' and digits ('Numbers cannot be the ending of the name ...')")
    for i, ch in enumerate(name):
        if ch == "-" and not any(c.isalpha() for c in name[i + 1 :]):
            problems.append(f"the '-' at {i} is not 'followed by at least one letter later in the name'")
            break
    return problems


def test_the_compute_rules_refuse_what_azure_refuses():
    # The rule itself, on the names Azure's messages and the docs use.
    assert compute_name_problems("cpu-cluster-1")  # the refused name of pipelines-azureml#19
    assert compute_name_problems("cpu-smoke-1234")  # a hex suffix of digits only: ~15% of the former names
    assert compute_name_problems("gpu-ib-")
    assert compute_name_problems("1gpu-ib-abcde")
    assert compute_name_problems("gpu-ib-abcdefghij")  # 17 characters
    assert compute_name_problems("gpu-ib_abcde")
    for ok in ("cpu-smoke-qhxbm", "gpu-ib-a1b2c", "cpu-smoke-1a", "cpu"):
        assert not compute_name_problems(ok), ok


# Azure's naming rules, per resource type (resource-name-rules, cited above).
RULES = {
    "azure-native:resources:ResourceGroup": ("resourceGroupName", re.compile(r"^[-\w.()]{0,89}[-\w()]$").match),
    "azure-native:storage:StorageAccount": ("accountName", STORAGE.match),
    "azure-native:containerregistry:Registry": ("registryName", REGISTRY.match),
    "azure-native:keyvault:Vault": (
        "vaultName",
        re.compile(r"^(?!.*--)[a-zA-Z][a-zA-Z0-9-]{1,22}[a-zA-Z0-9]$").match,
    ),
    # "workspaces | resource group | 3-33 | Alphanumerics and hyphens."
    "azure-native:machinelearningservices:Workspace": (
        "workspaceName",
        re.compile(r"^[a-zA-Z0-9][a-zA-Z0-9-]{2,32}$").match,
    ),
    "azure-native:machinelearningservices:Compute": ("computeName", lambda n: not compute_name_problems(n)),
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
    # Cluster names too: compute names are unique per region, not per workspace (COMPUTE_CHARS' sources).
    seen = {}
    for stack in STACKS:
        for (typ, _logical), name in _names(stack, dev_raw, dev_data_raw).items():
            key, rule = RULES[typ]
            assert rule(name), (stack, typ, key, name, typ.endswith("Compute") and compute_name_problems(name))
            assert (typ, name.lower()) not in seen, f"{stack} and {seen[(typ, name.lower())]} both get {typ} {name}"
            seen[(typ, name.lower())] = stack


def test_stack_id_keeps_a_readable_part_and_hashes_the_whole_name():
    assert naming.stack_id("staging1") != naming.stack_id("staging2")
    assert naming.stack_id("staging1").startswith("sta") and naming.stack_id("-_-").isalnum()
    assert len({naming.stack_id(s) for s in STACKS}) == len(STACKS)


# ---- every name generator over many stack names (issue 28, item 4) ----

PULUMI_STACK_CHARS = string.ascii_letters + string.digits + "-_."  # Pulumi's stack names, up to 100 characters


def _generated_cases(count=2000, seed=28):
    """`count` deterministic (stack, prefix, cluster name, random suffix) cases: stack names as Pulumi accepts
    them, prefixes and cluster names as config.py accepts them, random suffixes as pulumi_random makes them."""
    rng = random.Random(seed)
    fixed_clusters = ["cpu-smoke", "gpu-ib", "gpu-1", "a-1-2", "ab-1234567890123", "x" * 16, "abcdefghij-1", "n-0"]
    for i in range(count):
        stack = "".join(rng.choice(PULUMI_STACK_CHARS) for _ in range(rng.choice((1, 2, 5, 8, 12, 30, 100))))
        prefix = rng.choice(string.ascii_lowercase) + "".join(
            rng.choice(string.ascii_lowercase + string.digits) for _ in range(rng.randint(1, 7))
        )
        inner = "".join(rng.choice(string.ascii_letters + string.digits + "-") for _ in range(rng.randint(1, 14)))
        cluster = (
            fixed_clusters[i % len(fixed_clusters)]
            if i % 3 == 0
            else (rng.choice(string.ascii_letters) + inner + rng.choice(string.ascii_letters + string.digits))
        )
        rand = "".join(rng.choice(string.ascii_lowercase + string.digits) for _ in range(5))
        assert config.PREFIX_NAME.match(prefix) and clusterconfig._CLUSTER.match(cluster), (prefix, cluster)
        yield stack, prefix, cluster, rand


def _every_name(stack, prefix, cluster, rand, subscription=SUB_A, location="westeurope"):
    """What each generator in naming.py makes for one stack, as the programs call them."""
    suffix = naming.global_suffix(subscription, prefix, stack, location)
    accounts = {role: naming.storage_account(prefix, stack, role, suffix) for role in ("data", "logs", "nfs", "mlws")}
    vault = naming.vault_name(prefix, stack, rand)
    workspace = naming.workspace_name(prefix, stack, rand, accounts["mlws"], vault)
    subnet = (
        f"/subscriptions/{subscription}/resourceGroups/{naming.dashed(prefix, stack, 'rg')}/providers/"
        "Microsoft.Network/virtualNetworks/net-vnet1234/subnets/compute"
    )
    return {
        "azure-native:resources:ResourceGroup": [
            naming.dashed(prefix, stack, "rg"),
            naming.dashed(prefix, stack, "data-rg"),
        ],
        "azure-native:storage:StorageAccount": list(accounts.values()),
        "azure-native:containerregistry:Registry": [naming.registry(prefix, stack, suffix)],
        "azure-native:keyvault:Vault": [vault],
        "azure-native:machinelearningservices:Workspace": [workspace],
        "azure-native:machinelearningservices:Compute": [
            naming.cluster(cluster, vm, priority, subnet, ssh_enabled=ssh, workspace_name=workspace)
            for vm, priority, ssh in (
                ("Standard_D4s_v5", "Dedicated", False),
                ("Standard_ND96asr_v4", "LowPriority", True),
            )
        ],
    }


def test_every_generator_makes_valid_names_for_2000_stack_names():
    # Valid by construction, not by luck: every generator, every rule, 2,000 stack names (1-100 characters of
    # every kind Pulumi accepts), prefixes and cluster names of every shape config.py accepts.
    bad = []
    for stack, prefix, cluster, rand in _generated_cases():
        assert naming.stack_id(stack).isalnum()
        for typ, names in _every_name(stack, prefix, cluster, rand).items():
            key, rule = RULES[typ]
            for name in names:
                assert isinstance(name, str), (typ, name)
                if not rule(name):
                    bad.append((stack, typ, name, typ.endswith("Compute") and compute_name_problems(name)))
    assert not bad, f"{len(bad)} invalid names, e.g. {bad[:5]}"


def test_no_two_of_2000_stacks_share_a_name_that_azure_holds_once():
    # Resource groups and vaults are unique per subscription, storage accounts and registries globally, and
    # compute names per region (COMPUTE_CHARS' sources): all of these in one subscription and one region.
    seen: dict[tuple[str, str], str] = {}
    for stack, prefix, cluster, rand in _generated_cases():
        key_stack = (stack, prefix)
        for typ, names in _every_name(stack, prefix, cluster, rand).items():
            for name in set(names):
                other = seen.setdefault((typ, name.lower()), key_stack)
                assert other == key_stack, (typ, name, other, key_stack)
