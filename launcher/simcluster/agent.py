"""The simulated cluster's `ssh`: what Open MPI's rsh launcher (plm_rsh_agent, `ssh` by default) and horovodrun
call to start a command on another node. `ssh [options] HOST COMMAND...` here enters HOST's namespaces and runs
COMMAND through `sh -c`, as sshd runs it through the login shell, with a fresh node's environment (cluster.py
Cluster.environment: the job's, not the caller's) in the node's CPU share.

Open MPI's own command line carries what it forwards (its MCA parameters as `-mca` pairs), exactly as over ssh.
"""

from __future__ import annotations

import json
import os
import pathlib
import sys

# ssh's options that take a value (ssh(1)); the others are flags
WITH_VALUE = set("BbcDEeFIiJLlmOoPpQRSWw")


def split(argv: list[str]) -> tuple[str, list[str]]:
    """(host, command words) from ssh's arguments."""
    i = 0
    while i < len(argv) and argv[i].startswith("-") and argv[i] != "--":
        flag = argv[i][1:]
        i += 2 if flag[-1:] in WITH_VALUE and len(flag) == 1 else 1
    if i < len(argv) and argv[i] == "--":
        i += 1
    if i >= len(argv):
        raise SystemExit("ssh (simulated cluster): no host given")
    host = argv[i].split("@")[-1]
    return host, argv[i + 1 :]


def main(state: str, argv: list[str]) -> None:
    host, words = split(argv)
    record = json.loads((pathlib.Path(state) / "cluster.json").read_text())
    if host not in record["hosts"]:
        sys.stderr.write(f"ssh: Could not resolve hostname {host}: Name or service not known\n")
        raise SystemExit(255)
    i = record["hosts"].index(host)
    env = json.loads((pathlib.Path(state) / "node-env.json").read_text())
    group = record["cgroups"][i]
    if group:
        with open(os.path.join(group, "tasks"), "w") as f:
            f.write(str(os.getpid()))
    command = " ".join(words) or "exec sh -l"
    nsenter = ["nsenter", "-t", str(record["holders"][i]), "-n", "-u", "-m", "--", "env", "-i"]
    os.chdir("/")
    os.execvp("nsenter", [*nsenter, *(f"{k}={v}" for k, v in env.items()), "sh", "-c", f"cd; {command}"])


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
