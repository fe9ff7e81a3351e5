"""Each node's grace in mpirun's stop, as its Open MPI reads it: `odls_base_sigkill_timeout`, the seconds between
the SIGCONT a signalled mpirun's daemon sends each rank, its SIGTERM, and its SIGKILL (Open MPI 4.1, orte/mca/odls).
A stop reaches the nodes one after the other (issue 54, item 6): the payloads agree it through their own collectives
from the head node's SIGCONT (payloads/common/preemption.py), so every rank's part of the checkpoint must be written
within twice this grace. The images write the jobs' value into Open MPI's system MCA parameters file
(images/mpi_settings.sh) and the launcher sets it in every MPI job's environment (launcher/interconnect.py,
MPI_STOP_ENV): the environment wins where both are set, so the check reads it twice, as the job runs and without
the job's variable (what the image alone gives an mpirun or orted started without it).
"""

from __future__ import annotations

import os
import shutil
import subprocess

PARAM = "odls_base_sigkill_timeout"
VARIABLE = "OMPI_MCA_" + PARAM
COMMAND = ("ompi_info", "--param", "odls", "base", "--level", "9", "--parsable")


def parse(text: str, param: str = PARAM) -> dict | None:
    """{"value", "source"} of `param` in `ompi_info --parsable` output (lines mca:<fw>:<comp>:param:<name>:<key>:<v>)."""
    found = {}
    for line in text.splitlines():
        parts = line.split(":", 6)
        if len(parts) == 7 and parts[3] == "param" and parts[4] == param and parts[5] in ("value", "source"):
            found[parts[5]] = parts[6]
    if "value" not in found:
        return None
    value = found["value"]
    return {"value": int(value) if value.lstrip("-").isdigit() else value, "source": found.get("source", "?")}


def read(environ=None, timeout: float = 30) -> dict | None:
    """The grace as ompi_info reports it in `environ` (this process's by default); None without ompi_info."""
    binary = shutil.which(COMMAND[0])
    if binary is None:
        return None
    try:
        proc = subprocess.run(
            [binary, *COMMAND[1:]],
            env=dict(os.environ if environ is None else environ),
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return parse(proc.stdout) if proc.returncode == 0 else None


def settings(environ=None) -> dict:
    """{"effective": as this job runs, "image": without the job's OMPI_MCA_odls_base_sigkill_timeout}."""
    environ = dict(os.environ if environ is None else environ)
    without = {k: v for k, v in environ.items() if k != VARIABLE}
    return {"effective": read(environ), "image": read(without)}


def _said(found: dict | None) -> str:
    if found is None:
        return "unknown (no ompi_info)"
    seconds = f"{found['value']} s" if isinstance(found["value"], int) else str(found["value"])
    source = {"default": "Open MPI's default", "environment": "the environment"}.get(found["source"], found["source"])
    return f"{seconds} from {source}"


def line(host: str, found: dict) -> str:
    """One line per node: the grace as the job runs, and what the image alone gives, with what a default means."""
    effective, image = found.get("effective"), found.get("image")
    text = f"node {host}: mpirun's stop grace ({PARAM}) {_said(effective)}; without {VARIABLE} {_said(image)}"
    if effective is not None and effective["source"] == "default":
        text += (
            f": a stop's checkpoint gets {2 * effective['value']} s before SIGKILL; set it in the image "
            "(images/mpi_settings.sh) or the job's environment"
        )
    elif image is not None and image["source"] == "default":
        text += ": the image does not set it (images/mpi_settings.sh): an mpirun or orted started without the job's "
        text += "environment stops with Open MPI's default"
    return text
