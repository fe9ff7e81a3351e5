"""The job on simulated nodes (launcher/simcluster/, docs/rehearse.md): `python -m launcher JOB --target local
--nodes N` as users run it, against the same world size on one node."""

from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest
import yaml
from helpers import ROOT, TINY, assert_same_final_weights, env, final_weights, metrics, record_launch, wait_until

from launcher.simcluster import cluster

pytestmark = pytest.mark.skipif(cluster.missing() is not None, reason=f"no simulated nodes here: {cluster.missing()}")

JOB = "jobs/pytorch-resnet50-synthetic.yaml"
ARGS = TINY + ["--epochs", "2", "--batch-size", "8"]


def launcher(*args: str, job: str | pathlib.Path = JOB, timeout: float = 300) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        [sys.executable, "-m", "launcher", str(job), "--target", "local", *args],
        cwd=ROOT, env=env(), capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip
    return proc


def left_behind() -> list[str]:
    """What simulated clusters left on this machine: their namespaces and state folders."""
    names = [p.name for p in cluster.NETNS_ROOT.iterdir()] if cluster.NETNS_ROOT.is_dir() else []
    state = [str(p) for p in cluster.STATE_ROOT.iterdir()] if cluster.STATE_ROOT.is_dir() else []
    return [n for n in names if n.startswith(cluster.PREFIX)] + state


def job_with_env(tmp_path: pathlib.Path, **variables: str) -> pathlib.Path:
    """The job file with environment_variables added, which Azure ML (and the simulated nodes) give every node."""
    job = yaml.safe_load((ROOT / JOB).read_text())
    job["environment_variables"] = {**(job.get("environment_variables") or {}), **variables}
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job, sort_keys=False))
    return path


def beats(run: pathlib.Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted((run / "progress").glob("rank*.json"))]


@pytest.mark.launches
@pytest.mark.parametrize(
    "backend, nodes, per_node",
    [("horovod", 2, 1), ("ddp", 2, 2)],
    ids=["horovod-2x1", "ddp-2x2"],
)
def test_n_simulated_nodes_train_bitwise_as_one_node_with_the_same_world(tmp_path, backend, nodes, per_node):
    """mpirun on node 0 reaching node 1's daemons (Horovod), or each node's processes with Azure ML's variables
    (DDP): the same numbers as the same world on one host, every rank on its node by Azure ML's order, each node's
    hostname in its heartbeats and in the epoch's report, and nothing left on this machine."""
    world = nodes * per_node
    sim, one = tmp_path / "sim", tmp_path / "one"
    common = ["--backend", backend]
    proc = launcher(*common, "--nodes", str(nodes), "--processes-per-node", str(per_node), "--output-dir", str(sim),
                    "--", *ARGS)  # fmt: skip
    record_launch(world, ARGS, "pytorch", proc.returncode)
    text = proc.stdout + proc.stderr
    assert proc.returncode == 0, text[-5000:]
    ref = launcher(*common, "--np", str(world), "--output-dir", str(one), "--", *ARGS)
    record_launch(world, ARGS, "pytorch", ref.returncode)
    assert ref.returncode == 0, (ref.stdout + ref.stderr)[-5000:]

    assert f"simulated cluster: {nodes} nodes (node-0, node-1; each its own network" in text
    if backend == "horovod":  # one mpirun, on node 0, with the nodes as its hosts
        assert f"mpirun -np {world} -H node-0:{per_node},node-1:{per_node} bash -c" in text
    a, b = metrics(sim / "run"), metrics(one / "run")
    keys = ("train_loss", "train_accuracy", "images")
    assert [[e[k] for k in keys] for e in a["epochs"]] == [[e[k] for k in keys] for e in b["epochs"]]
    assert a["summary"]["parameters_sha256"] == b["summary"]["parameters_sha256"]
    assert_same_final_weights(sim / "run", one / "run")
    assert final_weights(sim / "run")  # a checkpoint to compare, not two empty ones
    # Ranks by node as Azure ML assigns them: node r // P, P processes per node; the hosts in the reports.
    hosts = {b["rank"]: b["host"] for b in beats(sim / "run")}
    assert hosts == {r: f"node-{r // per_node}" for r in range(world)}, hosts
    assert a["run"]["world"]["processes"] == world and a["run"]["world"]["local_processes"] == per_node
    assert b["run"]["world"]["local_processes"] == world
    reported = {p["rank"]: p["host"] for p in a["epochs"][-1]["phase_seconds"]}
    assert reported == hosts
    assert not left_behind(), left_behind()
