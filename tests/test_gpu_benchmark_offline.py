"""`python -m benchmarks.gpu` on a GPU machine without Horovod (issue 29), checked here without a GPU: what it plans
to run (its rows, the payload's commands, the payload's PYTHONPATH), with Horovod hidden as
tests/test_without_horovod.py hides it (a sitecustomize.py first on PYTHONPATH whose finder refuses `horovod`), and
the whole benchmark at toy sizes on this CPU in that state."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from helpers import ROOT, env
from test_without_horovod import HIDE_HOROVOD

from benchmarks import gpu, input_pipeline
from payloads.pytorch import backends


@pytest.fixture
def hidden(tmp_path) -> tuple[dict, str]:
    """(an environment whose Python has no Horovod, the PYTHONPATH it was given: hook folder, a caller's folder)."""
    hook = tmp_path / "no-horovod"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(HIDE_HOROVOD)
    e = {k: v for k, v in env().items() if k not in dict(backends.LAUNCHER_COUNTS)}
    given = os.pathsep.join([str(hook), str(tmp_path / "a-callers-folder")])
    e["PYTHONPATH"] = given  # what the caller set; the benchmark itself finds the checkout (cwd)
    return e, given


def plan(environ: dict, *args: str) -> dict:
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.gpu", "--plan", *args],
        cwd=ROOT,
        env=environ,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(proc.stdout)


@pytest.mark.launches
@pytest.mark.one_core
def test_without_horovod_the_payload_rows_are_plain_processes_on_an_extended_pythonpath(hidden):
    environ, given = hidden
    p = plan(environ)
    assert p["horovod_installed"] is False
    train = [sys.executable, "-m", "payloads.pytorch.train"]
    for name, cmd in p["payload"].items():
        assert cmd[:3] == train, (name, cmd)
        assert "horovodrun" not in " ".join(cmd)
        assert cmd[cmd.index("--model") + 1] == "resnet50" and cmd[cmd.index("--batch-size") + 1] == "256"
    real = p["payload"]["real"]
    assert real[real.index("--data") + 1] == "shards" and real[real.index("--workers") + 1] == "12"
    assert real[real.index("--epochs") + 1] == "3"
    # Extended, never replaced: the checkout first, then every folder the caller gave, in order (the hook among them,
    # so the payload processes are as Horovod-less as the benchmark's).
    assert p["pythonpath"] == str(ROOT) + os.pathsep + given
    # The real-data rows read shards of the shards job's size; no compiled row unless asked for.
    assert p["sizes"]["shard_side"] == 256 and "--resize 256" in p["shards"]
    # The sentinel's row: the same run with --replica-check-every 0.
    off = p["payload"]["synthetic, sentinel off"]
    assert off[: off.index("--output-dir")] == p["payload"]["synthetic"][:-2] + ["--replica-check-every", "0"]
    assert [(c["batch"], c["dtype"], c["compiled"]) for c in p["ceiling"]] == [
        (64, "fp16", False),
        (64, "bf16", False),
        (256, "fp16", False),
        (256, "bf16", False),
    ]


@pytest.mark.launches
@pytest.mark.one_core
def test_with_horovod_the_payload_rows_run_under_horovodrun(tmp_path):
    environ = {k: v for k, v in env().items() if k not in dict(backends.LAUNCHER_COUNTS)}
    environ.pop("PYTHONPATH", None)  # nothing given: PYTHONPATH is the checkout alone, no empty entry (the cwd)
    p = plan(environ)
    assert p["horovod_installed"] is True
    for cmd in p["payload"].values():
        assert cmd[0].endswith("horovodrun") and cmd[1:6] == ["-np", "1", "-H", "localhost:1", "--gloo"]
        assert cmd[6:9] == [sys.executable, "-m", "payloads.pytorch.train"]
    assert p["pythonpath"] == str(ROOT)


def test_the_ceiling_rows_compile_where_asked_and_once_in_a_quick_run():
    """What --compiled, --quick and --no-compiled choose (the plan's ceiling rows); nothing here depends on Horovod."""
    assert len(gpu.ceiling_cases(quick=False, compiled=True)) == 8
    assert [(d, c) for _, d, c in gpu.ceiling_cases(quick=True, compiled=None)] == [
        ("fp16", False),
        ("bf16", False),
        ("bf16", True),
    ]
    assert [c for _, _, c in gpu.ceiling_cases(quick=True, compiled=False)] == [False, False]


def test_command_building_in_process():
    assert gpu.payload_env({"PYTHONPATH": "/a" + os.pathsep + "/b", "X": "1"}, {"Y": "2"}) == {
        "PYTHONPATH": str(ROOT) + os.pathsep + "/a" + os.pathsep + "/b",
        "X": "1",
        "Y": "2",
    }
    assert gpu.payload_env({})["PYTHONPATH"] == str(ROOT)
    plain = gpu.payload_command(["--model", "resnet50"], "/out", horovod=False)
    assert plain == [
        sys.executable,
        "-m",
        "payloads.pytorch.train",
        "--no-progress",
        "--no-resume",
        "--no-mlflow",
        "--model",
        "resnet50",
        "--output-dir",
        "/out",
    ]
    with pytest.raises(SystemExit, match="a row of 2 payload processes needs Horovod and horovodrun"):
        gpu.payload_command([], "/out", processes=2, horovod=False)
    assert gpu.payload_command([], "/out", processes=2, horovod=True)[1:5] == ["-np", "2", "-H", "localhost:2"]


@pytest.mark.launches
@pytest.mark.one_core
def test_the_whole_benchmark_runs_without_horovod_at_toy_sizes(hidden, tmp_path):
    """`python -m benchmarks.gpu` is meant for a GPU; --quick --device cpu runs the same code at toy sizes, so a
    GPU user never finds it broken. Every row, Horovod hidden from the benchmark and from the payload processes it
    starts (the GPU machine has none): the payload rows train alone (backends.Single), the fp16 ceiling row steps
    through the payload's loss scaler, the compiled row compiles."""
    environ, _ = hidden
    out = tmp_path / "gpu.json"
    cmd = [sys.executable, "-m", "benchmarks.gpu", "--quick", "--device", "cpu", "--workers", "1"]
    proc = subprocess.run(
        [*cmd, "--json", str(out)], cwd=ROOT, env=environ, capture_output=True, text=True, timeout=900
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    machine, rows = result["machine"], result["rows"]
    assert machine["horovod"] is False and machine["payload_backend"] == "single"
    kinds = [r["kind"] for r in rows]
    ceiling = {(r["dtype"], r["compiled"]): r for r in rows if r["kind"] == "ceiling"}
    assert set(ceiling) == {("fp16", False), ("bf16", False), ("bf16", True)} and {
        "payload",
        "pipeline",
        "real",
    } <= set(kinds), kinds
    assert ceiling["fp16", False]["loss_scaler"] is True
    # The check comes first: this machine's /dev/shm is the ring's tmpfs (no GPU: nothing to register).
    assert rows[0]["kind"] == "check" and rows[0]["check"]["tmpfs"] is True and rows[0]["check"]["free_mib"] > 0
    assert all(r["images_per_sec"] > 0 and r["seconds"] >= 0 for r in rows[1:])
    assert "payload backend single" in proc.stdout
    real = next(r for r in rows if r["kind"] == "real")
    assert real["ratio_to_synthetic"] > 0 and "of synthetic" in proc.stdout
    # How long each epoch's steps waited for input, beside the epoch's seconds (issue 29: where real data loses).
    epochs = len(real["epoch_images_per_sec"])
    assert len(real["epoch_seconds"]) == len(real["epoch_input_seconds"]) == epochs, real
    assert all(0 <= w < s for w, s in zip(real["epoch_input_seconds"], real["epoch_seconds"])), real
    assert "waits for input" in real["note"]


def test_the_photos_are_made_by_several_processes_into_one_tree(tmp_path):
    """The full benchmark's 12,800 photos take minutes in one process: parts are generated in parallel (spawned, as
    the parent holds CUDA by then) and moved into one class-folder tree, every file kept."""
    tree = input_pipeline.photos(tmp_path, 250, classes=5, workers=2)
    files = sorted(p.relative_to(tree).as_posix() for p in tree.rglob("*.JPEG"))
    assert len(files) == 250 and len(set(files)) == 250
    assert sorted(p.name for p in tree.iterdir()) == [f"n{c:08d}" for c in range(5)]
    assert {f.split("/")[1].split("-")[0] for f in files} == {"p0", "p1"}
    assert not list(tmp_path.glob("part*"))


def test_a_failing_row_is_a_row_with_its_error_and_the_deadline_skips_the_rest():
    """One failing row (nvJPEG's hardware backend in a VM, a missing package) is a row with its error, printed with
    its last line, and the run goes on; a row not started by the deadline says so."""

    def fails():
        raise RuntimeError("a payload row exited 1:\nTraceback ...\nRuntimeError: nvjpegCreateEx failed")

    failed, late = gpu.guarded(fails, remaining=100), gpu.guarded(lambda: {"images_per_sec": 1.0}, remaining=0)
    assert failed["error"].startswith("RuntimeError: a payload row exited 1") and "skipped" in late
    assert gpu.guarded(lambda: {"images_per_sec": 5.0}, remaining=100) == {"images_per_sec": 5.0}
    lines = gpu.table([{"what": "real", **failed}, {"what": "late", **late}, {"what": "ok", "images_per_sec": 5.0}])
    assert "-  (RuntimeError: nvjpegCreateEx failed)" in lines and "deadline" in lines and "5.0" in lines
