"""The job on simulated nodes (launcher/simcluster/, docs/rehearse.md): `python -m launcher JOB --target local
--nodes N` as users run it, against the same world size on one node."""

from __future__ import annotations

import json
import os
import pathlib
import re
import signal
import subprocess
import sys
import time

import pytest
import yaml
from helpers import (
    ROOT,
    TINY,
    assert_same_final_weights,
    env,
    final_weights,
    learnable_tree,
    metrics,
    record_launch,
    wait_until,
)

from datatools import prepare
from launcher.simcluster import cluster

pytestmark = pytest.mark.skipif(cluster.missing() is not None, reason=f"no simulated nodes here: {cluster.missing()}")

JOB = "jobs/pytorch-resnet50-synthetic.yaml"
ARGS = TINY + ["--epochs", "2", "--batch-size", "8"]
# The shard job with its --cache-decoded, its cache in /dev/shm as the launcher places it on Azure ML (cachehome.py)
SHARDS_JOB = "jobs/pytorch-resnet50-imagenet-shards.yaml"
SHARDS_ARGS = [a for a in TINY if a not in ("--synthetic-samples", "128")]
SHARDS_ARGS += ["--epochs", "2", "--batch-size", "4", "--shuffle-buffer", "5", "--cache-dir", "/dev/shm"]


def launcher(*args: str, job: str | pathlib.Path = JOB, timeout: float = 300) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        [sys.executable, "-m", "launcher", str(job), "--target", "local", *args],
        cwd=ROOT, env=env(), capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip
    return proc


def job_with_env(tmp_path: pathlib.Path, source: str = JOB, **variables: str) -> pathlib.Path:
    """The job file with environment_variables added, which Azure ML (and the simulated nodes) give every node."""
    job = yaml.safe_load((ROOT / source).read_text())
    job["environment_variables"] = {**(job.get("environment_variables") or {}), **variables}
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job, sort_keys=False))
    return path


def beats(run: pathlib.Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted((run / "progress").glob("rank*.json"))]


@pytest.mark.launches
@pytest.mark.parametrize(
    "backend, nodes, per_node, data",
    [
        ("horovod", 2, 1, "synthetic"),
        ("horovod", 2, 2, "shards"),
        ("ddp", 2, 2, "synthetic"),
    ],
    ids=["horovod-2x1", "horovod-2x2-shards", "ddp-2x2"],
)
def test_n_simulated_nodes_train_bitwise_as_one_node_with_the_same_world(tmp_path, backend, nodes, per_node, data):
    """mpirun on node 0 reaching node 1's daemons (Horovod), or each node's processes with Azure ML's variables
    (DDP): the same numbers as the same world on one host, every rank on its node by Azure ML's order, each node's
    hostname in its heartbeats and in the epoch's report, and nothing left on this machine. Horovod's 2 x 1 runs
    with the whole environment the launcher gives the dev stack's cpu-smoke cluster (D4s_v5: Open MPI's settings
    over the old image's pml). On shards, the decoded cache: each rank fills its file once, in its own node's
    /dev/shm, which this machine's never sees."""
    world = nodes * per_node
    sim, one = tmp_path / "sim", tmp_path / "one"
    common = ["--backend", backend]
    cpu_smoke = (backend, per_node) == ("horovod", 1)
    on = ["--stack-outputs", "infra/review/dev-outputs.json", "--cluster", "cpu-smoke"] if cpu_smoke else []
    job, args = JOB, ARGS
    if data == "shards":  # the job's input, shared with every node as Azure ML mounts it
        learnable_tree(tmp_path / "img")
        prepare.run(tmp_path / "img", tmp_path / "shards", shards=4, formats=["webdataset"], progress=False)
        job, args = SHARDS_JOB, SHARDS_ARGS
        common += ["--input", f"imagenet={tmp_path / 'shards' / 'webdataset'}"]
    shm_before = set(os.listdir("/dev/shm"))
    proc = launcher(*common, *on, "--nodes", str(nodes), "--processes-per-node", str(per_node), "--output-dir",
                    str(sim), "--", *args, job=job)  # fmt: skip
    record_launch(world, args, "pytorch", proc.returncode)
    text = proc.stdout + proc.stderr
    assert proc.returncode == 0, text[-5000:]
    assert not {n for n in set(os.listdir("/dev/shm")) - shm_before if n.startswith("decoded-")}
    ref = launcher(*common, "--np", str(world), "--output-dir", str(one), "--", *args, job=job)
    record_launch(world, args, "pytorch", ref.returncode)
    assert ref.returncode == 0, (ref.stdout + ref.stderr)[-5000:]

    assert f"simulated cluster: {nodes} nodes (node-0, node-1; each its own network" in text
    if backend == "horovod":  # one mpirun, on node 0, with the nodes as its hosts
        assert f"mpirun -np {world} -H node-0:{per_node},node-1:{per_node} bash -c" in text
    if on:  # the nodes' environment is cpu-smoke's
        assert "TRAINING_VM_SIZE=Standard_D4s_v5" in text and "OMPI_MCA_pml=ob1 " in text, text[-5000:]
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
    if data == "shards":  # filled once per rank in epoch 1, in /dev/shm, by its node's host name; 48 images in all
        kept = re.findall(r"kept (\d+) decoded images of rank (\d+) in (\S+)", text)
        assert sorted(int(r) for _, r, _ in kept) == list(range(world)), kept
        for _, r, path in kept:
            assert re.fullmatch(rf"/dev/shm/decoded-node-{int(r) // per_node}-\d+-rank{r}-\w+\.u8", path), path
        assert sum(int(n) for n, _, _ in kept) == 48 and [e["images"] for e in a["epochs"]] == [48, 48]
    assert not cluster.leftovers(), cluster.leftovers()  # of launchers that have ended


# Long enough to be stopped mid-epoch: 2 epochs of 300 steps per rank.
STOP_ARGS = TINY + [
    "--synthetic-samples",
    "16384",
    "--max-steps-per-epoch",
    "300",
    "--epochs",
    "2",
    "--batch-size",
    "8",
]
STOP_ARGS += ["--checkpoint-every-minutes", "0"]
SAVE_SECONDS = 40  # the stop's checkpoint takes most of mpirun's window before the head node's SIGKILL (2 x 30 s)
WINDOW = 2 * 30  # the job's own OMPI_MCA_odls_base_sigkill_timeout (launcher/interconnect.py MPI_STOP_ENV), twice


def _stopped(runs: dict) -> dict:
    """Each job on 2 simulated nodes of its own, stopped by `stop(launcher)` once both its ranks trained 4 steps (the
    rank the stop reaches first holds at step 5 until it does: tests/stop_at); all of them at once, since a stop is
    mostly waiting (the checkpoint's held write, mpirun's schedule). `runs`: name -> (job file, output folder, stop);
    returns name -> (exit code, its output, when the stop was made)."""
    started = {}
    try:
        for name, (job, out, _) in runs.items():
            log = out.parent / f"{out.name}.log"
            cmd = [sys.executable, "-m", "launcher", str(job), "--target", "local", "--nodes", "2", "--output-dir",
                   str(out), "--", *STOP_ARGS]  # fmt: skip
            with open(log, "w") as sink:  # a file: nobody reads a pipe while the test waits
                started[name] = subprocess.Popen(cmd, cwd=ROOT, env=env(), stdout=sink, stderr=subprocess.STDOUT)
        at = {}
        for name, (_, out, stop) in runs.items():
            proc = started[name]
            wait_until(proc, lambda run=out / "run": len(b := beats(run)) == 2 and all(x["steps"] >= 4 for x in b),
                       "4 steps")  # fmt: skip
            at[name] = time.time()
            stop(proc)
        for proc in started.values():
            proc.wait(timeout=240)
    finally:
        for proc in started.values():
            if proc.poll() is None:
                proc.kill()
    ended = {}
    for name, (_, out, _) in runs.items():
        record_launch(2, STOP_ARGS, "pytorch", started[name].returncode)
        ended[name] = (started[name].returncode, (out.parent / f"{out.name}.log").read_text(), at[name])
    return ended


@pytest.mark.launches
@pytest.mark.one_core  # mostly waiting: mpirun's own stop schedule
def test_a_stop_and_a_preempt_on_one_node_reach_every_rank_on_both_and_the_resumes_are_exact(tmp_path):
    """SIGTERM to the job as Azure ML stops it (mpirun alone is told; it stops the head node first and the others
    only after the head node's SIGKILL), with the job's own 30 s timeout and a checkpoint that takes 40 s of the
    60 s; and a Scheduled Event Preempt posted to node 1 only. Each time every rank on both nodes stops at the same
    mid-epoch step with the checkpoint written before the head node's SIGKILL, every rank exits 75, and the resumed
    run ends bitwise equal to the straight one. The two stopped runs share their waiting, on clusters of their own."""

    def job(holds: int) -> pathlib.Path:
        # `holds`: the rank the stop reaches first (the head node's under mpirun's SIGTERM, node 1's under its
        # Preempt) waits at step 5 until it has it, so that the stop lands mid-epoch however fast this machine is;
        # only in the stopped runs' folders (stop-*), never in a resume
        return job_with_env(tmp_path / f"holds-{holds}", PYTHONPATH=str(ROOT / "tests" / "stop_at"), STOP_AT="5",
                            STOP_RANKS=str(holds), STOP_HOLD="1", STOP_WAIT="120", STOP_IN="stop-",
                            STOP_SAVE_SECONDS=str(SAVE_SECONDS))  # fmt: skip

    straight = launcher("--nodes", "2", "--output-dir", str(tmp_path / "straight"), "--", *STOP_ARGS, job=job(0))
    record_launch(2, STOP_ARGS, "pytorch", straight.returncode)
    assert straight.returncode == 0, (straight.stdout + straight.stderr)[-5000:]

    def posted(proc):
        cluster.post_event(cluster.state_of(proc.pid), 1, "Preempt")

    # The launcher's exit: a launcher stopped by a signal ends 128 + the signal, as a shell reports it (the ranks'
    # 75 is in their lines), so that --auto-resume never resumes a chain someone stopped; Preempt ends 75.
    stops = (
        ("sigterm", lambda proc: proc.send_signal(signal.SIGTERM), "stopped by mpirun's stop (SIGCONT", 0, 143),
        ("preempt", posted, "stopped by Scheduled Event Preempt", 1, 75),
    )
    ended = _stopped({name: (job(first), tmp_path / f"stop-{name}", stop) for name, stop, _, first, _ in stops})
    for name, _, starter, first, exit_code in stops:
        out = tmp_path / f"stop-{name}"
        code, text, at = ended[name]
        assert code == exit_code, text[-5000:]
        lines = [line for line in text.splitlines() if line.startswith("stopped by ")]
        assert len(lines) == 2 and sum(line.startswith(starter) for line in lines) == 1, lines
        assert sum(line.startswith("stopped by a signal on another rank") for line in lines) == 1, lines
        assert all(line.endswith("(exit 75)") for line in lines), lines
        saved = {line.split("wrote ")[1].split(" in ")[0] for line in lines}
        assert len(saved) == 1, lines  # both ranks name the same checkpoint
        path = pathlib.Path(saved.pop())
        assert "-step-" in path.name and path.exists()  # mid-epoch
        assert path.stat().st_mtime - at < WINDOW, (path.stat().st_mtime - at, text[-3000:])
        stopped = beats(out / "run")
        assert {b["host"] for b in stopped} == {"node-0", "node-1"}
        assert all(b["doing"] == "stopped" for b in stopped) and len({tuple(b["at"]) for b in stopped}) == 1
        if name == "sigterm":
            assert "SIGTERM received, sent to mpirun on node-0" in text
        resumed = launcher("--nodes", "2", "--output-dir", str(out), "--", *STOP_ARGS, job=job(first))
        record_launch(2, STOP_ARGS, "pytorch", resumed.returncode)
        assert resumed.returncode == 0, (resumed.stdout + resumed.stderr)[-5000:]
        assert "resuming from" in resumed.stdout + resumed.stderr
        assert_same_final_weights(tmp_path / "straight" / "run", out / "run")
    assert not cluster.leftovers(), cluster.leftovers()  # of launchers that have ended


@pytest.mark.launches
def test_the_health_check_judges_each_simulated_node_by_its_hostname_and_pins_nccl_to_its_infiniband_cards(tmp_path):
    """The health check on 2 simulated nodes of an InfiniBand size (the dev stack's gpu-ib, ND96asr v4): one verdict
    per node, named by its hostname; NCCL_IB_HCA names each node's eight InfiniBand cards from its sysfs
    (devices.pin_nccl_to_infiniband) and never the Ethernet mlx5_an0. Where a node has no cards it is left unset
    (test_healthcheck.py's run, with the same NCCL_IB_DISABLE=0). The sizes are a CPU's (the ND figures' 8-16 GiB
    messages overflow MPI's int count on a CPU)."""
    # a floor a CPU meets: its bandwidth is not an ND's, and a failed verdict adds mpirun's 2 minutes of stop
    args = ["--", "--sizes-mb", "1", "--iterations", "2", "--train-steps", "1", "--model", "tiny_cnn",
            "--min-busbw", "0.0001"]  # fmt: skip
    ib = ["--stack-outputs", "infra/review/dev-outputs.json", "--cluster", "gpu-ib"]
    out = tmp_path / "ib"
    proc = launcher("--nodes", "2", *ib, "--output-dir", str(out), *args, job="jobs/healthcheck-allreduce.yaml")
    record_launch(2, args, "healthcheck", proc.returncode)
    report = out / "report" / "allreduce.json"
    assert report.is_file(), (proc.stdout + proc.stderr)[-5000:]
    report = json.loads(report.read_text())
    text = proc.stdout + proc.stderr
    assert all(f"node node-{i}: driver" in text for i in range(2)), text[-5000:]
    assert proc.returncode == 0 and report["passed"] is True, text[-5000:]
    assert report["nodes"] == 2 and report["processes"] == 2, report
    assert [v["host"] for v in report["node_verdicts"]] == ["node-0", "node-1"], report["node_verdicts"]
    facts = {f["host"]: f for f in report["node_facts"]}
    assert set(facts) == {"node-0", "node-1"}
    cards = [f"mlx5_ib{i}" for i in range(8)]
    for f in facts.values():
        assert f["infiniband_cards"] == cards and "mlx5_an0" in f["infiniband_devices"], f
        assert f["nccl_ib_hca"] == "=" + ",".join(cards), f
    assert not cluster.leftovers(), cluster.leftovers()  # of launchers that have ended


@pytest.mark.launches
def test_a_slowed_link_is_named_by_the_health_checks_node_pairs(tmp_path):
    """Node 2's eth0 limited to 20 Mbit/s (tc's token bucket, as the rehearsal's slow link) from before the ranks
    start, on 3 simulated nodes: the health check pairs the nodes in a ring, each node is judged by its best pair,
    and node 2 alone fails, both its pairs slow, named by its hostname with the figure. With 2 nodes the one pair is
    both nodes' (the report says a third node tells which). mpirun's stop grace is cut to 1 s: a failed verdict
    would otherwise add its 2 x 30 s."""
    job = job_with_env(tmp_path, "jobs/healthcheck-allreduce.yaml", OMPI_MCA_odls_base_sigkill_timeout="1")
    args = ["--sizes-mb", "1", "--iterations", "2", "--train-steps", "1", "--model", "tiny_cnn",
            "--expect", "allreduce_over_ib=0.05"]  # fmt: skip
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "launcher", str(job), "--target", "local", "--nodes", "3", "--output-dir", str(out),
           "--", *args]  # fmt: skip
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        node2 = cluster.namespace(proc.pid, 2)
        wait_until(proc, lambda: node2 in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout,
                   "node 2's namespace", every=0.02)  # fmt: skip
        cluster.slow_link(proc.pid, 2)
        text, _ = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    record_launch(3, args, "healthcheck", proc.returncode)
    assert proc.returncode == 1, text[-5000:]
    report = json.loads((out / "report" / "allreduce.json").read_text())
    verdicts = {v["host"]: v for v in report["node_verdicts"]}
    assert {h: v["verdict"] for h, v in verdicts.items()} == {"node-0": "PASS", "node-1": "PASS", "node-2": "FAIL"}
    slow = verdicts["node-2"]["checks"]["allreduce_over_ib"]
    assert slow["status"] == "FAIL" and slow["figure"] < 0.05 <= verdicts["node-0"]["checks"]["allreduce_over_ib"][
        "figure"], verdicts  # fmt: skip
    assert f"healthcheck FAILED: node node-2 ({cluster.address(2)}): all-reduce across nodes" in text, text[-3000:]
    assert not cluster.leftovers(), cluster.leftovers()  # of launchers that have ended


@pytest.mark.launches
def test_the_rehearsal_names_a_killed_rank_and_a_lost_node_and_their_resumes_are_exact(tmp_path):
    """`python -m launcher rehearse` as users run it, three faults of its matrix: a rank killed on node 1 (mpirun's
    word of its signal names its host before the watchdog's stall, which is its consequence) and node 1 lost
    (mpirun loses node 1's daemon: a node fault naming it). Each row says who was named, that auto-resume would
    resume (after the health check of that node, for the node fault), and that the resumed run ends bitwise as the
    straight one; rehearsal.json holds the same rows. And the output folder full on every node (a tmpfs over it in
    each node's mounts): every rank's one line, exit 2, not resumed, nothing written to the folder beneath, and the
    nodes' mount never in this machine's."""
    out = tmp_path / "rehearsal"
    # mpirun's stop grace cut from the job's 30 s to 5 s: after the kill it stops the waiting rank in its own time
    # (120 s with 30 s), which this test is not about
    job = job_with_env(tmp_path, OMPI_MCA_odls_base_sigkill_timeout="5")
    proc = subprocess.run(
        [sys.executable, "-m", "launcher", "rehearse", str(job), "--nodes", "2", "--faults", "rank killed,node lost,full output disk",
         "--output-dir", str(out)],
        cwd=ROOT, env=env(), capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    record_launch(2, ["rehearse"], "pytorch", proc.returncode)
    text = proc.stdout + proc.stderr
    assert proc.returncode == 0, text[-5000:]
    assert "scaled for this machine's CPUs" in text
    rows = {r["fault"]: r for r in json.loads((out / "rehearsal.json").read_text())["rows"]}
    killed, lost = rows["rank killed"], rows["node lost"]
    assert killed["named"] == "node-1" and "exited on signal 9" in killed["ending"], killed
    assert lost["named"] == "node-1" and lost["ending"].startswith("node fault"), lost
    assert "after the health check of the job's nodes (named: node-1)" in lost["auto_resume"], lost
    for row in (killed, lost):
        assert row["auto_resume"].startswith("resume 1 of 1") and row["equal"] is True, row
        assert row["exit_code"] != 0 and row["detected_s"] is not None and row["steps_lost"] is not None, row
    full, folder = rows["full output disk"], out / "full-output-disk" / "run" / "checkpoints"
    assert full["exit_code"] == 2 and full["ending"].startswith("permanent"), full
    assert full["auto_resume"].startswith("not resumed") and full["equal"] is None, full
    assert text.count(f"error: the output folder {folder} is full") == 2, text[-3000:]  # one line from each rank
    assert not os.path.ismount(folder) and list(folder.iterdir()) == []
    # known at the first agreement after epoch 1's failed write (about 2 s), not at the end of epoch 2
    ended = max(tuple(b["at"]) for b in beats(folder.parent))
    assert ended < max(tuple(b["at"]) for b in beats(out / "straight" / "run")), ended
    table = text[text.index("| fault |") :]
    assert "| rank killed |" in table and "| node lost |" in table, table
    assert not cluster.leftovers(), cluster.leftovers()  # of launchers that have ended
