"""The format of what each node should deliver, in one place: the launcher writes it from the VM-size catalog
(launcher/interconnect.py, the figures of Azure's node health checks in infra/trainingplatform/vm_sizes.py) into
the job's environment, and the health check reads it back (options.py), with --expect in the same format.

HEALTHCHECK_EXPECTED: "check=value[@message_bytes][/processes]" joined by commas, e.g.
allreduce_in_node=460@17179869184/8,ib_write_bw=380@8388608. Plain characters only: no quotes, spaces or $ for a
shell or mpirun to mangle. HEALTHCHECK_MIN_BUSBW_GBYTES_PER_SEC: the all-reduce floor in GB/s.
"""

from __future__ import annotations

from collections.abc import Iterable

from ..common.errors import ConfigError

EXPECTED = "HEALTHCHECK_EXPECTED"
MIN_BUSBW = "HEALTHCHECK_MIN_BUSBW_GBYTES_PER_SEC"

IN_NODE, OVER_IB, IB_WRITE = "allreduce_in_node", "allreduce_over_ib", "ib_write_bw"
NODE_CHECKS = (IN_NODE, OVER_IB, IB_WRITE)
UNITS = {IN_NODE: "GB/s", OVER_IB: "GB/s", IB_WRITE: "Gb/s"}


def write(figures: Iterable) -> str:
    """HEALTHCHECK_EXPECTED's value for figures with .check, .value, .message_bytes and .processes (vm_sizes.Expected)."""
    return ",".join(
        f"{e.check}={e.value:g}@{e.message_bytes}" + (f"/{e.processes}" if e.processes else "") for e in figures
    )


def parse(text: str, source: str) -> dict[str, dict]:
    """{check: {value, unit, message_bytes, processes, source}} from "check=value[@bytes][/processes],..."."""
    out = {}
    for item in (x.strip() for x in text.split(",")):
        if not item:
            continue
        check, sep, rest = item.partition("=")
        figure, _, processes = rest.partition("/")
        value, _, size = figure.partition("@")
        try:
            entry = {
                "value": float(value),
                "unit": UNITS[check],
                "message_bytes": int(size) if size else None,
                "processes": int(processes) if processes else None,
                "source": source,
            }
        except (KeyError, ValueError):
            entry = None
        if not sep or entry is None or entry["value"] <= 0:
            raise ConfigError(
                f"{source}: {item!r} is not CHECK=VALUE[@MESSAGE_BYTES][/PROCESSES] with CHECK one of "
                f"{', '.join(NODE_CHECKS)} and VALUE in its unit (GB/s, Gb/s for ib_write_bw), e.g. "
                "allreduce_over_ib=18"
            )
        out[check] = entry
    return out


def floor(text: str | None, source: str) -> float | None:
    """The all-reduce floor in GB/s; None (reported, not judged) when unset or `none`, which a user gives to keep a
    CPU or simulated node from being judged against its VM size's floor."""
    if text is None or text.strip().lower() in ("", "none"):
        return None
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if value <= 0:
        raise ConfigError(
            f"{source} {text!r}: a bus bandwidth floor in GB/s, a positive number like 20 (none: not judged)"
        )
    return value
