"""The stack configuration's reader: typed values pulled out of nested dicts with every problem recorded (not the
first only), the one error that lists them, and the Entra principals several settings name (`users`,
`imageBuilders`, `access.jumpHostAdmins`). Each concern's settings module reads with it (config.py, networkconfig.py,
clusterconfig.py, wayinconfig.py, dataconfig.py)."""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any


class ConfigError(ValueError):
    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("invalid stack configuration:\n  - " + "\n  - ".join(problems))


@dataclass(frozen=True, kw_only=True)
class Principal:
    """An Entra user, group or service principal that uses the platform (config `users`)."""

    object_id: str
    type: str  # User | Group | ServicePrincipal (Azure's principalType)


GUID = re.compile(r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$")
PRINCIPAL_TYPES = ("User", "Group", "ServicePrincipal")
PRINCIPAL_KEYS = ("objectId", "type")


class Reader:
    """Pulls typed values out of nested dicts, recording problems instead of stopping at the first."""

    def __init__(self):
        self.problems: list[str] = []
        self.warnings: list[str] = []

    def bad(self, key: str, value: Any, allowed: str) -> None:
        self.problems.append(f"{key} = {value!r}: {allowed}")

    def known(self, d: dict, path: str, keys: tuple[str, ...], also: tuple[str, ...] = ()) -> None:
        """Refuse keys of `d` that are no setting at this level: a misspelt key would otherwise deploy
        silently with the default (`keyVaultPublicAcess: false` leaving the vault public)."""
        for key in d:
            if key in keys or key in also:
                continue
            close = difflib.get_close_matches(str(key), keys, n=1, cutoff=0.6)
            hint = f"did you mean {close[0]}?" if close else f"the settings here are {', '.join(keys)}"
            self.problems.append(
                f"{path}{key} is not a setting: {hint} (an unknown key is refused rather than "
                "ignored, which would deploy the default)"
            )

    def get(self, d: dict, key: str, path: str, kind: type, default: Any = ..., allowed: str = "") -> Any:
        full = f"{path}{key}"
        if key not in d or d[key] is None:
            if default is ...:
                self.problems.append(f"{full} is missing: {allowed or 'it is required'}")
                return None
            return default
        value = d[key]
        if kind is int and isinstance(value, str) and value.strip().lstrip("-").isdigit():
            value = int(value)
        if kind is bool and isinstance(value, str) and value.lower() in ("true", "false"):
            value = value.lower() == "true"
        if kind is int and isinstance(value, bool) or not isinstance(value, kind):
            self.bad(full, value, f"expected {kind.__name__}" + (f"; {allowed}" if allowed else ""))
            return None if default is ... else default
        return value

    def within(self, d: dict, key: str, path: str, default: int, lo: int, hi: int, allowed: str) -> int | None:
        value = self.get(d, key, path, int, default)
        if value is not None and not lo <= value <= hi:
            self.bad(f"{path}{key}", value, allowed)
        return value

    def mappings(self, items: list, where: str, expected: str, keys: tuple[str, ...]) -> Iterator[tuple[str, dict]]:
        """(key prefix, item) of each mapping in the list at `where`, its unknown keys refused; any other item is
        recorded as bad (`expected` says what belongs there) and skipped."""
        for i, item in enumerate(items):
            if not isinstance(item, dict):
                self.bad(f"{where}[{i}]", item, expected)
                continue
            self.known(item, f"{where}[{i}].", keys)
            yield f"{where}[{i}].", item

    def choice(self, d: dict, key: str, path: str, default: str, choices: tuple[str, ...], allowed: str) -> str:
        value = self.get(d, key, path, str, default)
        if value not in choices:
            self.bad(f"{path}{key}", value, allowed)
        return value


def read_users(r: Reader, raw: dict) -> tuple[Principal, ...] | None:
    return read_principals(r, raw, "users", "")


def read_principals(r: Reader, d: dict, key: str, path: str) -> tuple[Principal, ...] | None:
    """A list of Entra principals {objectId, type} at d[key] (the shape of `users`); None when the key is absent."""
    items = r.get(d, key, path, list, None, "a list of {objectId, type} (type: User, Group or ServicePrincipal)")
    if items is None:
        return None
    out, seen = [], set()
    expected = "expected {objectId: <guid>, type: User|Group|ServicePrincipal}"
    for p, u in r.mappings(items, f"{path}{key}", expected, PRINCIPAL_KEYS):
        oid = r.get(
            u,
            "objectId",
            p,
            str,
            allowed="the Entra object id: `az ad user show --id you@example.com "
            "--query id -o tsv` or `az ad group show --group NAME --query id -o tsv`",
        )
        if oid is not None and not GUID.match(oid):
            r.bad(
                p + "objectId",
                oid,
                "an Entra object id (a GUID), not a name or e-mail: "
                "`az ad user show --id you@example.com --query id -o tsv`",
            )
        kind = r.choice(
            u,
            "type",
            p,
            "User",
            PRINCIPAL_TYPES,
            "User, Group or ServicePrincipal (Azure's principalType; a wrong type makes the role assignment fail)",
        )
        if oid is not None and GUID.match(oid):
            if oid.lower() in seen:
                r.bad(p + "objectId", oid, "listed twice; list each principal once")
            seen.add(oid.lower())
            out.append(Principal(object_id=oid.lower(), type=kind))
    return tuple(out)
