"""Resource names.

Storage accounts and the registry need globally unique names, so they carry a short hash of
project/prefix/stack/location: stable across `pulumi destroy` and `up`, which lets the retained data
accounts be re-attached. Key Vaults and Azure ML workspaces are soft-deleted by Azure (name held for
7-90 days), so they carry a random suffix made once per stack lifetime (pulumi_random): a recreated stack
never collides with its soft-deleted predecessor.
"""
from __future__ import annotations

import hashlib
import re


def _clean(text: str) -> str:
    return re.sub(r"[^a-z0-9]", "", text.lower())


def stable_suffix(*parts: str, length: int = 6) -> str:
    return hashlib.sha256("/".join(parts).encode()).hexdigest()[:length]


def storage_account(prefix: str, stack: str, role: str, suffix: str) -> str:
    """3-24 lowercase letters and digits."""
    return (_clean(prefix) + _clean(stack)[:4] + _clean(role)[:4] + suffix)[:24]


def registry(prefix: str, stack: str, suffix: str) -> str:
    """5-50 letters and digits."""
    return (_clean(prefix) + _clean(stack)[:8] + "acr" + suffix)[:50]


def dashed(prefix: str, stack: str, role: str) -> str:
    return f"{_clean(prefix)}-{_clean(stack)[:6]}-{role}"
