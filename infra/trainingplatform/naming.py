"""Resource names.

Storage accounts and the registry need globally unique DNS names, so they carry a short hash of
subscription/prefix/stack/location (`global_suffix`): two teams deploying the same committed stack file
into different subscriptions get different names (no `StorageAccountAlreadyTaken`), and one stack gets the
same names on every `pulumi up`, which is what lets the data stack's accounts outlive platform stacks.
Key Vaults and Azure ML workspaces are soft-deleted by Azure (name held for 7-90 days), so they carry a
random suffix made once per stack lifetime (pulumi_random): a recreated stack never collides with its
soft-deleted predecessor.
"""
from __future__ import annotations

import hashlib
import re

import pulumi

SUFFIX_LENGTH = 8   # 32 bits of hash: the storage name still fits 24 characters with an 8-letter prefix


def _clean(text: str) -> str:
    return re.sub(r"[^a-z0-9]", "", text.lower())


def stable_suffix(*parts: str, length: int = SUFFIX_LENGTH) -> str:
    return hashlib.sha256("/".join(parts).encode()).hexdigest()[:length]


def global_suffix(subscription_id: pulumi.Input[str] | str, prefix: str, stack: str,
                  location: str) -> pulumi.Output[str] | str:
    """The suffix of globally unique names: deterministic per subscription, prefix, stack and region."""
    if isinstance(subscription_id, str):
        return stable_suffix(subscription_id.lower(), prefix, stack, location)
    return pulumi.Output.from_input(subscription_id).apply(lambda s: global_suffix(s, prefix, stack, location))


def storage_account(prefix: str, stack: str, role: str, suffix):
    """3-24 lowercase letters and digits (Azure's rule for storage account names)."""
    if not isinstance(suffix, str):
        return pulumi.Output.from_input(suffix).apply(lambda s: storage_account(prefix, stack, role, s))
    return (_clean(prefix) + _clean(stack)[:4] + _clean(role)[:4] + suffix)[:24]


def registry(prefix: str, stack: str, suffix):
    """5-50 letters and digits (Azure's rule for container registry names)."""
    if not isinstance(suffix, str):
        return pulumi.Output.from_input(suffix).apply(lambda s: registry(prefix, stack, s))
    return (_clean(prefix) + _clean(stack)[:8] + "acr" + suffix)[:50]


def dashed(prefix: str, stack: str, role: str) -> str:
    return f"{_clean(prefix)}-{_clean(stack)[:6]}-{role}"
