"""Resource names: valid for every stack name Pulumi accepts, and distinct for every two stacks.

- Storage accounts and the registry need globally unique DNS names, so they carry a short hash of
  subscription/prefix/stack/location (`global_suffix`): two teams deploying the same committed stack file
  into different subscriptions get different names (no `StorageAccountAlreadyTaken`), and one stack gets the
  same names on every `pulumi up`, which is what lets the data stack's accounts outlive platform stacks.
  The subscription is the stack's `azure-native:subscriptionId` (required: config.py).
- Names unique within a subscription (resource groups, and the Key Vault and workspace bases) carry
  `stack_id`: a few letters of the stack name for people, plus a hash of the WHOLE stack name. Cut text
  alone made `staging1` and `staging2` both `hvd-stagin-rg`, and a stack called `-_-` an empty part (a Key
  Vault name with two hyphens in a row, which Azure refuses).
- Key Vaults and Azure ML workspaces are soft-deleted by Azure (name held for 7-90 days), so they also
  carry a random suffix made once per stack lifetime (pulumi_random): a recreated stack never collides with
  its soft-deleted predecessor.

- Azure ML compute cluster names are unique per REGION, not per workspace ("Name needs to be unique across
  all existing computes within an Azure region", learn.microsoft.com/azure/machine-learning/
  how-to-create-attach-compute-cluster), so they hash the workspace's own name (see `cluster`).

Azure's rules (learn.microsoft.com/azure/azure-resource-manager/management/resource-name-rules) are
checked for each name in tests/infra/test_naming.py, for thousands of generated stack names.
"""

from __future__ import annotations

import hashlib
import re

import pulumi

SUFFIX_LENGTH = 8  # 32 bits of hash: the storage name still fits 24 characters with an 8-letter prefix
STACK_HASH_LENGTH = 4
STACK_TEXT_LENGTH = 3  # with the hash: 7 characters, so a Key Vault name fits 24 (vault_name)
# Azure ML compute names: 2-16 characters (resource-name-rules, Microsoft.MachineLearningServices
# "workspaces / computes"; the studio's form for clusters says 3-24: 3-16 meets both). The cluster's hash is
# letters only (26**5, about 11.9 million values): see `cluster` for why never digits.
CLUSTER_NAME_MAX = 16
CLUSTER_HASH_LENGTH = 5
CLUSTER_TEXT_LENGTH = CLUSTER_NAME_MAX - 1 - CLUSTER_HASH_LENGTH  # 10, then "-" and the hash
_LETTERS = "abcdefghijklmnopqrstuvwxyz"


def _clean(text: str) -> str:
    return re.sub(r"[^a-z0-9]", "", text.lower())


def stable_suffix(*parts: str, length: int = SUFFIX_LENGTH) -> str:
    return hashlib.sha256("/".join(parts).encode()).hexdigest()[:length]


def letter_suffix(*parts: str, length: int = CLUSTER_HASH_LENGTH) -> str:
    """A hash of `parts` written in lowercase letters only (base 26 of the SHA-256 digest)."""
    n = int(hashlib.sha256("/".join(parts).encode()).hexdigest(), 16)
    out = []
    for _ in range(length):
        n, digit = divmod(n, len(_LETTERS))
        out.append(_LETTERS[digit])
    return "".join(out)


def stack_id(stack: str) -> str:
    """Letters and digits only, never empty, different for every two stack names (up to the hash)."""
    return _clean(stack)[:STACK_TEXT_LENGTH] + stable_suffix("stack", stack, length=STACK_HASH_LENGTH)


def global_suffix(
    subscription_id: pulumi.Input[str] | str, prefix: str, stack: str, location: str
) -> pulumi.Output[str] | str:
    """The suffix of globally unique names: deterministic per subscription, prefix, stack and region."""
    if isinstance(subscription_id, str):
        return stable_suffix(subscription_id.lower(), prefix, stack, location)
    return pulumi.Output.from_input(subscription_id).apply(lambda s: global_suffix(s, prefix, stack, location))


def storage_account(prefix: str, stack: str, role: str, suffix):
    """3-24 lowercase letters and digits (Azure's rule for storage account names). The suffix hashes the
    whole stack name already."""
    if not isinstance(suffix, str):
        return pulumi.Output.from_input(suffix).apply(lambda s: storage_account(prefix, stack, role, s))
    return (_clean(prefix) + _clean(stack)[:4] + _clean(role)[:4] + suffix)[:24]


def registry(prefix: str, stack: str, suffix):
    """5-50 letters and digits (Azure's rule for container registry names)."""
    if not isinstance(suffix, str):
        return pulumi.Output.from_input(suffix).apply(lambda s: registry(prefix, stack, s))
    return (_clean(prefix) + _clean(stack)[:8] + "acr" + suffix)[:50]


def dashed(prefix: str, stack: str, role: str) -> str:
    """`<prefix>-<stack id>-<role>`: resource groups (1-90 characters) and the bases below."""
    return f"{_clean(prefix)}-{stack_id(stack)}-{role}"


def vault_name(prefix: str, stack: str, random_suffix):
    """Key Vault: 3-24 letters, digits and hyphens, starting with a letter, ending with a letter or digit,
    no two hyphens in a row. At most 8 + 1 + 7 + 3 + 5 = 24."""
    if isinstance(random_suffix, str):
        return f"{_clean(prefix)}-{stack_id(stack)}-kv{random_suffix}"
    return pulumi.Output.concat(f"{_clean(prefix)}-{stack_id(stack)}-kv", random_suffix)


def workspace_name(prefix: str, stack: str, random_suffix, *dependencies):
    """Azure ML workspace: 3-33 letters, digits, hyphens and underscores, starting with a letter or digit.

    `dependencies` (the Azure names of its storage account and Key Vault) go into a hash in the name:
    Azure ML cannot move a workspace to another storage account or vault ("Storage Account update is not
    supported yet"), so a new one must be a new workspace, and under a new name (the old one's is held while
    soft-deleted). At most 8 + 1 + 7 + 1 + 3 + 5 + 4 = 29."""

    def name(values):
        rand, *deps = values
        return f"{_clean(prefix)}-{stack_id(stack)}-mlw{rand}{stable_suffix(*(str(d).lower() for d in deps), length=4)}"

    if all(isinstance(v, str) for v in (random_suffix, *dependencies)):
        return name([random_suffix, *dependencies])
    return pulumi.Output.all(random_suffix, *dependencies).apply(name)


def cluster(name: str, vm_size: str, priority: str, subnet_id, *, ssh_enabled: bool, workspace_name):
    """Azure ML compute name `<config name, up to 10>-<5 letters>`.

    Valid by construction: 2-16 letters, digits and hyphens starting with a letter (resource-name-rules;
    the config name starts with a letter, config.py), and the hash is letters only, so the name ends in a
    letter. Azure ML refuses a name ending in a hyphen and digits ("Numbers cannot be the ending of the name
    if the previous character is a minus symbol"), and for clusters every "-" "needs to be followed by at
    least one letter later in the name" (how-to-create-attach-compute-cluster): with hex digits, about 15%
    of the former hex suffixes (four digits all 0-9) made names Azure refuses at `up`.

    The hash covers:
    - what Azure ML cannot change on an existing cluster (VM size, priority, subnet: compute.py; SSH access,
      "SSH access can't be changed after creation", how-to-create-attach-compute-cluster), so a change
      creates a new cluster beside the old one instead of a PUT that Azure answers with success while
      keeping the old settings;
    - the workspace's own name. Compute names are unique per region, across workspaces, and a replaced
      workspace gets a new name (workspace_name above) while the old one still exists: its clusters, created
      before the old ones are deleted, need names the old ones do not hold. Nothing else in the hash changes
      on a workspace replacement."""

    def make(values):
        subnet, workspace = values
        parts = (name, vm_size, priority, str(subnet).lower(), f"ssh={bool(ssh_enabled)}", str(workspace).lower())
        return f"{name[:CLUSTER_TEXT_LENGTH].rstrip('-')}-{letter_suffix(*parts)}"

    if isinstance(subnet_id, str) and isinstance(workspace_name, str):
        return make((subnet_id, workspace_name))
    return pulumi.Output.all(subnet_id, workspace_name).apply(make)
