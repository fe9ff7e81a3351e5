"""The health check judges what it measures, and every payload refuses a GPU node whose GPUs it cannot see.

All with real processes (horovodrun), on this CPU-only machine: no driver, no CUDA, no NCCL, no
InfiniBand, which the health check must report as such. Its training part is failed from outside the
code, the way real clusters fail: a sitecustomize.py on PYTHONPATH breaks the interpreter or one rank's
optimizer before the health check starts. The per-node verdicts run the same way: the sitecustomize gives
each process a host name (several "nodes" on this one machine) and makes chosen ranks late to chosen
all-reduces; the measuring and judging code is what runs on GPUs, over Gloo instead of NCCL.

How the per-node verdicts judge recorded figures, the InfiniBand card check and NCCL's log, and what identifies a
node: test_healthcheck_verdicts.py.
"""

from __future__ import annotations

import json
import math
import os
import pathlib
import re
import shutil
import socket
import subprocess
import sys
import textwrap

import helpers
import pytest
from helpers import ROOT, TINY, train

from payloads.common import devices
from payloads.common.errors import ConfigError
from payloads.healthcheck import allreduce, mpistop, options, training
from payloads.healthcheck import expected as node_figures
from payloads.healthcheck import facts as node_facts
from payloads.pytorch import affinity, models

pytestmark = pytest.mark.launches  # horovodrun runs: one at a time under xdist (tests/conftest.py)


def healthcheck_run(
    tmp_path, *args: str, env: dict | None = None, np: int = 2, sizes: str = "1,2"
) -> subprocess.CompletedProcess:
    cmd = [
        str(pathlib.Path(sys.executable).with_name("horovodrun")),
        "-np",
        str(np),
        "-H",
        f"localhost:{np}",
        "--gloo",
        *helpers.python_m("payloads.healthcheck"),
        "--sizes-mb",
        sizes,
        "--iterations",
        "2",
        "--model",
        "tiny_cnn",
        "--image-size",
        "32",
        "--output",
        str(tmp_path / "allreduce.json"),
        *args,
    ]
    e = helpers.env()
    e.pop(node_figures.MIN_BUSBW, None)
    e.pop(node_figures.EXPECTED, None)
    e.pop(devices.GPUS_PER_NODE, None)
    e.update(env or {})
    return subprocess.run(cmd, cwd=ROOT, env=e, capture_output=True, text=True, timeout=180)


# A figure two CPU processes reach many times over through Gloo on this machine (0.08-0.25 GB/s measured at
# 2 MB), and a late rank (LATE seconds per all-reduce) cannot: 2 MB x 2(n-1)/n / 0.5 s = 0.004 GB/s at most,
# whatever the load (the sleep guarantees it).
EXPECT = 0.01
LATE = 0.5


@pytest.mark.skipif(shutil.which("ompi_info") is None, reason="no Open MPI here (Gloo-only set-up)")
def test_the_stop_grace_is_read_as_the_nodes_open_mpi_reads_it_from_the_environment_a_file_or_its_default(tmp_path):
    """Against the installed ompi_info (Debian's Open MPI 4.1): the value and where it came from, with the job's
    variable (which wins) and without it (the image's file, or Open MPI's 1 s default, which the line names)."""
    empty, image = tmp_path / "empty.conf", tmp_path / "openmpi-mca-params.conf"
    empty.write_text("")
    image.write_text("odls_base_sigkill_timeout = 30\n")
    base = {k: v for k, v in os.environ.items() if not k.startswith("OMPI_MCA_")}
    default = {**base, "OMPI_MCA_mca_base_param_files": str(empty)}
    assert mpistop.read(default) == {"value": 1, "source": "default"}
    in_image = {**base, "OMPI_MCA_mca_base_param_files": str(image)}
    assert mpistop.read(in_image) == {"value": 30, "source": f"file ({image}:1)"}
    both = mpistop.settings({**in_image, mpistop.VARIABLE: "7"})
    assert both == {
        "effective": {"value": 7, "source": "environment"},
        "image": {"value": 30, "source": f"file ({image}:1)"},
    }
    line = mpistop.line("vm", both)
    assert line == (
        "node vm: mpirun's stop grace (odls_base_sigkill_timeout) 7 s from the environment; without "
        f"OMPI_MCA_odls_base_sigkill_timeout 30 s from file ({image}:1)"
    ), line
    said = mpistop.line("vm", mpistop.settings(default))
    assert "1 s from Open MPI's default" in said and "a stop's checkpoint gets 2 s before SIGKILL" in said, said
    said = mpistop.line("vm", mpistop.settings({**default, mpistop.VARIABLE: "30"}))
    assert said.endswith("an mpirun or orted started without the job's environment stops with Open MPI's default")
    assert mpistop.line("vm", {"effective": None, "image": None}).count("unknown (no ompi_info)") == 2


def test_passes_above_the_floor_and_reports_what_it_saw(tmp_path):
    """Also the control of the per-node verdicts: the in-node all-reduce of a normal run passes the EXPECT that
    a late rank fails (test_a_late_rank_fails_its_node...), over as many runs as that test (a median of 3, which one
    descheduled run on a loaded machine does not move; a median of 2 is their mean, which it does)."""
    expect = ["--iterations", "3", "--expect", f"allreduce_in_node={EXPECT}"]
    grace = {mpistop.VARIABLE: "30"}  # the job's (launcher/interconnect.py MPI_STOP_ENV)
    # as on an InfiniBand size (launcher/interconnect.py), on a node without cards: NCCL_IB_HCA is left unset
    ib = {"NCCL_IB_DISABLE": "0"}
    proc = healthcheck_run(tmp_path, *expect, env={node_figures.MIN_BUSBW: "0.0001", **grace, **ib})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads((tmp_path / "allreduce.json").read_text())
    assert report["passed"] is True and report["processes"] == 2 and report["failures"] == []
    bw = report["bandwidth"]
    assert bw["judged"] is True and bw["ok"] is True and bw["min_busbw_gbytes_per_sec"] == 0.0001
    assert bw["judged_mbytes"] == 2 and bw["busbw_gbytes_per_sec"] == report["results"][-1]["bus_gbytes_per_sec"] > 0
    # no GPU, no driver, no InfiniBand here: said so, in the report and in the log
    (node,) = report["node_facts"]
    assert (node["driver"], node["cuda"], node["nccl"], node["gpus_visible"]) == ("none", "none", "none", 0)
    assert node["infiniband_devices"] == [] and node["nccl_ib_hca"] is None
    assert "driver none, CUDA none, NCCL none, 0 GPUs, InfiniBand devices: none" in proc.stdout
    # each node's disks (root, temporary folder, shared memory: one entry per file system) and each rank's CPUs
    import tempfile

    places = {d["path"]: d for d in node["disks"]}
    assert "/" in places and places["/"]["total_gbytes"] == round(shutil.disk_usage("/").total / 1e9, 1)
    assert tempfile.gettempdir() in places or os.stat(tempfile.gettempdir()).st_dev in {
        os.stat(d).st_dev for d in places
    }
    assert f"node {node['host']} disks: / " in proc.stdout and " GB free" in proc.stdout
    # mpirun's stop grace as the node reads it: the job's variable, and without it what this machine's Open MPI gives
    if shutil.which("ompi_info"):
        stop = node["mpi_stop"]
        assert stop["effective"] == {"value": 30, "source": "environment"}, stop
        assert stop["image"] == mpistop.read({k: v for k, v in os.environ.items() if k != mpistop.VARIABLE}), stop
        assert mpistop.line(node["host"], stop) in proc.stdout, proc.stdout[-3000:]
    cpus = affinity.ranges(os.sched_getaffinity(0))
    assert report["cpu_binding"] == [{"rank": r, "host": node["host"], "cpus": cpus} for r in (0, 1)]
    assert (
        f"CPU binding for training (the payload's own, runtime.resolve): rank 0 on {node['host']}: {cpus}"
        in proc.stdout
    )
    # the training part, with the PyTorch payload's CPU defaults: full precision, default memory format
    t = report["training"]
    assert (t["model"], t["steps"], t["precision"], t["memory_format"]) == ("tiny_cnn", 5, "fp32", "contiguous")
    assert t["ranks_agree"] is True and t["failed_part"] is None and t["errors"] == []
    assert math.isfinite(t["loss"]) and t["loss"] > 0 and t["seconds"] > 0
    assert "training tiny_cnn 32px x 8 per process, 2 process(es), fp32, contiguous: 5 steps in" in proc.stdout
    assert "healthcheck passed" in proc.stdout
    # one node (both processes on this host): judged in the node, nothing to pair with, no InfiniBand
    (v,) = report["node_verdicts"]
    assert v["verdict"] == "PASS" and v["ranks"] == [0, 1] and v["private_ip"] == node_facts.private_ip()
    c = v["checks"]
    inside = c["allreduce_in_node"]
    assert inside["status"] == "PASS" and inside["figure"] >= EXPECT and inside["expected"] == EXPECT
    assert inside["at_bytes"] == 2_000_000 and [s["bytes"] for s in inside["sizes"]] == [1_000_000, 2_000_000]
    assert c["allreduce_over_ib"]["status"] == "NOT JUDGED"
    assert c["allreduce_over_ib"]["reason"] == "one node: no other node to pair with"
    assert c["ib_write_bw"]["status"] == "SKIPPED" and "no InfiniBand devices" in c["ib_write_bw"]["reason"]
    row = rf"\[0\]<stdout>:{re.escape(v['host'])} +{re.escape(v['private_ip'])} +[0-9.]+ GB/s >= {EXPECT} PASS "
    assert v["host"] == socket.gethostname() and re.search(row, proc.stdout)


def test_fails_below_the_floor_naming_the_measurement_and_the_floor(tmp_path):
    """A floor no CPU pair can reach (1000 GB/s): the job fails, and says by how much and why it may be."""
    proc = healthcheck_run(tmp_path, "--min-busbw", "1000")
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads((tmp_path / "allreduce.json").read_text())
    assert report["passed"] is False and report["bandwidth"]["ok"] is False
    assert all(r["correct"] for r in report["results"]), "the sums were right: only the bandwidth failed"
    assert "healthcheck FAILED: bus bandwidth" in proc.stdout and "below the floor of 1000 GB/s" in proc.stdout
    assert "NET/IB" in proc.stdout, "the message says where to look"


# ---- the training part: what a training job does, failed the ways real clusters fail it ----------------------


def fault(tmp_path, code: str, name: str = "fault") -> dict:
    """Environment whose worker processes (horovodrun sets HOROVOD_RANK) run `code` at interpreter start-up."""
    d = tmp_path / name
    d.mkdir()
    (d / "sitecustomize.py").write_text("import os\nif 'HOROVOD_RANK' in os.environ:\n" + textwrap.indent(code, "    "))
    return {"PYTHONPATH": str(d) + ":" + helpers.env()["PYTHONPATH"]}


# Python 3.11.0rc1 (the images' Python once) lacked what torch/_dynamo/polyfills/sys.py reads at import, and
# torch's optimizers import torch._dynamo (torch/optim/optimizer.py): deleting it reproduces that failure.
BROKEN_DYNAMO = "import sys\ndel sys.get_int_max_str_digits\n"


@pytest.mark.parametrize("amp_dtype,model", [("bf16", "resnet18"), ("fp16", "tiny_cnn")])
def test_training_passes_with_channels_last_and_mixed_precision_on_the_cpu(tmp_path, amp_dtype, model):
    """The GPU defaults (channels_last, autocast; fp16 adds the GradScaler of older GPUs), switched on for a CPU;
    resnet18 has the batch norm layers of the payloads' ResNet-50."""
    proc = healthcheck_run(tmp_path, "--amp", "--amp-dtype", amp_dtype, "--channels-last", "--model", model)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    t = json.loads((tmp_path / "allreduce.json").read_text())["training"]
    assert (t["model"], t["precision"], t["memory_format"], t["steps"]) == (model, amp_dtype, "channels_last", 5)
    assert t["ranks_agree"] is True and math.isfinite(t["loss"]) and t["failed_part"] is None
    assert (
        f"training {model} 32px x 8 per process, 2 process(es), {amp_dtype}, channels_last: 5 steps in" in proc.stdout
        and "ranks agree" in proc.stdout
    )


def test_a_rank_whose_weights_drift_fails_the_agreement(tmp_path):
    """Rank 1 nudges its weights after every optimizer step (what a faulty GPU or an unaveraged rank does). No floor
    for this size: bandwidth is reported, not judged, and the failure is the agreement's alone."""
    drift = textwrap.dedent("""\
        if os.environ['HOROVOD_RANK'] == '1':
            import torch
            from torch.optim.optimizer import register_optimizer_step_post_hook

            def drift(optimizer, args, kwargs):
                with torch.no_grad():
                    for group in optimizer.param_groups:
                        for p in group['params']:
                            p.add_(1e-3)

            register_optimizer_step_post_hook(drift)
        """)
    proc = healthcheck_run(tmp_path, "--train-steps", "2", env=fault(tmp_path, drift))
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads((tmp_path / "allreduce.json").read_text())
    t = report["training"]
    assert t["ranks_agree"] is False and t["failed_part"] == "agreement" and math.isfinite(t["loss"])
    assert report["bandwidth"]["judged"] is False and report["bandwidth"]["ok"] is None
    assert "bus bandwidth not judged: no floor for this VM size" in proc.stdout
    assert all(r["correct"] for r in report["results"]) and len(report["failures"]) == 1, report["failures"]
    assert "RANKS DIFFER" in proc.stdout
    assert (
        "healthcheck FAILED: training agreement failed: after 2 steps the parameters of rank(s) 1 differ" in proc.stdout
    )


def test_a_broken_torch_dynamo_fails_the_check_where_bandwidth_alone_passes(tmp_path):
    """resnet18 meets it in torchvision's import, as the payload would (tiny_cnn in the optimizer: the next test)."""
    part = "import"
    proc = healthcheck_run(tmp_path, "--min-busbw", "0.0001", "--model", "resnet18", env=fault(tmp_path, BROKEN_DYNAMO))
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads((tmp_path / "allreduce.json").read_text())
    assert report["bandwidth"]["ok"] is True and all(r["correct"] for r in report["results"]), "bandwidth passed"
    t = report["training"]
    assert t["failed_part"] == part and t["ranks_agree"] is None
    assert [e["rank"] for e in t["errors"]] == [0, 1] and {e["part"] for e in t["errors"]} == {part}
    assert f"{part.upper()} FAILED" in proc.stdout
    assert (
        f"healthcheck FAILED: training {part} failed on rank(s) 0, 1: AttributeError: module 'sys' has no "
        "attribute 'get_int_max_str_digits'"
    ) in proc.stdout
    assert "torch/_dynamo" in proc.stderr, "the traceback shows where"
    assert len(report["failures"]) == 1


def test_one_failing_rank_is_named_and_the_others_do_not_hang(tmp_path):
    """Only rank 1 fails, in its optimizer's import of torch._dynamo (tiny_cnn's first step), where bandwidth alone
    passes: rank 0's gradient allreduces still complete (Horovod's join), and rank 1 alone is named."""
    code = "if os.environ['HOROVOD_RANK'] == '1':\n" + textwrap.indent(BROKEN_DYNAMO, "    ")
    proc = healthcheck_run(tmp_path, "--min-busbw", "0.0001", "--model", "tiny_cnn", env=fault(tmp_path, code))
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads((tmp_path / "allreduce.json").read_text())
    assert report["bandwidth"]["ok"] is True and all(r["correct"] for r in report["results"]), "bandwidth passed"
    t = report["training"]
    assert t["failed_part"] == "step" and t["ranks_agree"] is None and len(report["failures"]) == 1
    assert t["errors"] == [
        {"rank": 1, "part": "step", "error": "AttributeError: module 'sys' has no attribute 'get_int_max_str_digits'"}
    ]
    assert "STEP FAILED" in proc.stdout and "torch/_dynamo" in proc.stderr, "the traceback shows where"
    assert (
        "healthcheck FAILED: training step failed on rank(s) 1: AttributeError: module 'sys' has no attribute "
        "'get_int_max_str_digits'"
    ) in proc.stdout


def test_a_non_finite_loss_fails_the_step():
    ok = {"failed": None, "error": None, "seconds": 1.0, "digest": "d"}
    verdict, failures = training.judge_training(
        [{**ok, "rank": 0, "losses": [2.3, 2.2]}, {**ok, "rank": 1, "losses": [2.3, float("nan")]}], 2
    )
    assert verdict["failed_part"] == "step" and verdict["ranks_agree"] is True
    assert failures == [
        "training step failed on rank(s) 1: the loss is not finite ([2.3, nan]): a training job "
        "would diverge the same way"
    ]


@pytest.mark.parametrize(
    "args,message",
    [
        (["--train-steps", "0"], "--train-steps 0: at least 1"),
        (["--model", "mlp"], "--model 'mlp': choose one of resnet18"),
        (["--batch-size", "1"], "--batch-size 1: at least 2 per process"),
        (["--image-size", "8"], "--image-size 8: at least 16 pixels"),
    ],
)
def test_bad_training_options_are_refused_before_anything_runs(args, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        options.parse(args)


def test_the_models_offered_are_the_payloads_conv_models():
    import torch

    for name in options.MODELS:
        assert name in models.MODELS
        assert any(isinstance(m, torch.nn.Conv2d) for m in models.build(name, 10, 32).modules()), name


def test_one_process_is_never_judged_on_bandwidth():
    results = [{"mbytes": 8.0, "bus_gbytes_per_sec": 0.0, "correct": True}]
    verdict, failures = allreduce.judge(results, 1, 20.0)
    assert verdict["judged"] is False and failures == []


def test_a_bad_floor_is_refused_before_anything_runs(tmp_path):
    """Each bad form in-process; one run shows the refusal ends the check with exit 2 before it measures."""
    for value in ("-3", "0", "inf-ish"):
        with pytest.raises(ConfigError, match=f"{node_figures.MIN_BUSBW} {value!r}: a bus bandwidth floor in GB/s"):
            node_figures.floor(value, node_figures.MIN_BUSBW)
    proc = subprocess.run(
        [*helpers.python_m("payloads.healthcheck"), "--output", str(tmp_path / "r.json")],
        cwd=ROOT,
        env={**helpers.env(), node_figures.MIN_BUSBW: "fast"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert f"{node_figures.MIN_BUSBW} 'fast': a bus bandwidth floor in GB/s" in proc.stderr
    assert not (tmp_path / "r.json").exists()


def test_min_busbw_none_reports_without_judging_over_the_launchers_floor(monkeypatch):
    monkeypatch.setenv(node_figures.MIN_BUSBW, "20")
    assert options.parse([]).floor == 20.0
    assert options.parse(["--min-busbw", "none"]).floor is None
    assert options.parse(["--min-busbw", "0.5"]).floor == 0.5


# ---- a GPU cluster's process that sees no GPU --------------------------------------------------------------


def _says_the_cause(text: str, framework: str) -> None:
    assert f"this node should have 1 GPUs ({devices.GPUS_PER_NODE}" in text
    assert f"but {framework} sees 0" in text
    assert "NVIDIA driver" in text and "Nothing was trained" in text


def test_health_check_refuses_a_gpu_node_without_visible_gpus(tmp_path):
    proc = healthcheck_run(tmp_path, env={devices.GPUS_PER_NODE: "1"})
    assert proc.returncode != 0
    _says_the_cause(proc.stderr, "PyTorch")
    assert not (tmp_path / "allreduce.json").exists(), "nothing measured"


@pytest.mark.parametrize("payload,framework", [("pytorch", "PyTorch"), ("tensorflow", "TensorFlow")])
def test_payloads_refuse_a_gpu_node_without_visible_gpus(tmp_path, monkeypatch, payload, framework):
    """Two real processes: each fails at start-up (before data or model) instead of training on the CPU. The Keras
    payload starts through the TensorFlow one's runtime.start, where the check is."""
    monkeypatch.setenv(devices.GPUS_PER_NODE, "1")
    out = tmp_path / "run"
    proc = train(2, TINY + ["--epochs", "1", "--output-dir", str(out)], check=False, payload=payload)
    assert proc.returncode != 0
    _says_the_cause(proc.stderr, framework)
    assert not (out / "metrics.json").exists() and not list(out.glob("checkpoints/*")), "nothing was trained"


def test_the_message_names_the_driver_cuda_needs(monkeypatch):
    monkeypatch.setattr(devices, "driver_version", lambda: "550.54.15")
    with pytest.raises(devices.GpuError) as e:
        devices.require_gpus(0, 2, "PyTorch", "13.0", environ={devices.GPUS_PER_NODE: "8"})
    msg = str(e.value)
    assert "driver (550.54.15) is older than CUDA 13.0 in the image needs (driver >= 580.65.06)" in msg
    assert "for 2 processes, one GPU each, but PyTorch sees 0" in msg


def test_enough_gpus_or_a_cpu_cluster_pass():
    devices.require_gpus(8, 8, "PyTorch", "13.0", environ={devices.GPUS_PER_NODE: "8"})
    devices.require_gpus(2, 2, "PyTorch", "13.0", environ={devices.GPUS_PER_NODE: "8"})  # 2 of 8 used
    devices.require_gpus(0, 2, "PyTorch", None, environ={devices.GPUS_PER_NODE: "0"})
    devices.require_gpus(0, 2, "PyTorch", None, environ={})
    with pytest.raises(devices.GpuError):
        devices.require_gpus(1, 2, "PyTorch", "13.0", environ={devices.GPUS_PER_NODE: "2"})  # one short


def test_a_bad_gpu_count_names_the_variable():
    with pytest.raises(devices.ConfigError, match=f"{devices.GPUS_PER_NODE}='eight' is not a GPU count"):
        devices.expected_gpus({devices.GPUS_PER_NODE: "eight"})


# ---- per-node verdicts: each node against its VM size's figures ---------------------------------------------


def nodes_and_late_ranks(tmp_path, hosts: list[str], late: dict[int, str]) -> dict:
    """Each process on the host name hosts[rank] (several nodes on this one machine), and each rank in `late`
    LATE seconds late to every all-reduce whose name starts with late[rank] (the check's name): a slow GPU,
    link or card as the other ranks of the collective see it."""
    code = textwrap.dedent(f"""\
        import socket, sys, time
        rank = int(os.environ['HOROVOD_RANK'])
        socket.gethostname = lambda: {hosts!r}[rank]
        prefix = {late!r}.get(rank)
        if prefix:
            sys.path.insert(0, {str(ROOT / "tests")!r})
            from import_hooks import after_import
            sys.path.pop(0)

            def make_late(hvd):
                real = hvd.allreduce

                def allreduce(tensor, *args, name=None, **kwargs):
                    if name and name.startswith(prefix):
                        time.sleep({LATE})
                    return real(tensor, *args, name=name, **kwargs)

                hvd.allreduce = allreduce

            after_import('horovod.torch', make_late)
        """)
    return fault(tmp_path, code, "nodes")


@pytest.mark.one_core  # mostly waiting (a held rank, a grace, a stall): about one core
def test_a_late_rank_fails_its_node_with_the_figure_and_the_other_nodes_pass(tmp_path):
    """Three nodes on this machine: node-0 with ranks 0 and 1, node-1 with rank 2, node-2 with rank 3. Rank 1 is
    late to node-0's own all-reduce, rank 3 to every all-reduce over "InfiniBand" (the node pairs 0-1, 1-2,
    2-0). Node-0 fails in the node; node-2 fails across nodes, since both its pairs are slow; node-1 passes
    (its pair with node-0 is fast), and so does node-0 across nodes. The EXPECT figure passes a normal run
    (test_passes_above_the_floor_and_reports_what_it_saw, the same 2 MB)."""
    hosts = ["node-0", "node-0", "node-1", "node-2"]
    env = nodes_and_late_ranks(tmp_path, hosts, {1: node_figures.IN_NODE, 3: node_figures.OVER_IB})
    proc = healthcheck_run(
        tmp_path,
        "--iterations",
        "3",
        "--train-steps",
        "1",
        "--expect",
        f"allreduce_in_node={EXPECT}",
        "--expect",
        f"allreduce_over_ib={EXPECT}",
        np=4,
        sizes="2",
        env=env,
    )
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads((tmp_path / "allreduce.json").read_text())
    v = {n["host"]: n for n in report["node_verdicts"]}
    assert [(h, v[h]["ranks"], v[h]["verdict"]) for h in v] == [
        ("node-0", [0, 1], "FAIL"),
        ("node-1", [2], "PASS"),
        ("node-2", [3], "FAIL"),
    ]
    most = 2e6 / LATE / 1e9  # 2 MB x 2(n-1)/n with n = 2, in no less than LATE seconds
    inside = v["node-0"]["checks"]["allreduce_in_node"]
    assert inside["status"] == "FAIL" and 0 < inside["figure"] <= most and inside["at_bytes"] == 2_000_000
    across = v["node-2"]["checks"]["allreduce_over_ib"]
    assert across["status"] == "FAIL" and 0 < across["figure"] <= most
    assert across["weakest"] == {"process_index": 0, "best_partner": across["weakest"]["best_partner"]}
    for host in ("node-0", "node-1"):  # each has a fast pair: the pair 0-1
        ok = v[host]["checks"]["allreduce_over_ib"]
        assert (
            ok["status"] == "PASS" and ok["figure"] >= EXPECT and ok["weakest"]["best_partner"] in ("node-0", "node-1")
        )
    assert (
        v["node-1"]["checks"]["allreduce_in_node"]["reason"] == "one process on this node: nothing to all-reduce with"
    )
    # the job-wide all-reduce and the training are not what failed
    assert all(r["correct"] for r in report["results"]) and report["training"]["ranks_agree"] is True
    # the log names each failing node, the check, its figure and what was expected
    assert (
        f"node node-0 ({v['node-0']['private_ip']}): all-reduce in the node {inside['figure']:.3g} GB/s at 2 MB, "
        f"expected at least {EXPECT:g} GB/s (--expect)"
    ) in proc.stdout
    assert (
        f"node node-2 ({v['node-2']['private_ip']}): all-reduce across nodes over InfiniBand {across['figure']:.3g} "
        f"GB/s at 2 MB (process 0's card, best with {across['weakest']['best_partner']}), expected at least"
    ) in proc.stdout
    row = rf"<stdout>:node-1 +\S+ +not judged +[0-9.]+ GB/s >= {EXPECT:g} PASS +skipped +PASS"
    assert re.search(row, proc.stdout)
