"""toolchain/check_training_path.py, the check each image's build ends with, run against this machine's .venv.

Issue 19, item 2: `horovodrun --check-build` passed on an interpreter (Ubuntu 22.04's Python 3.11.0rc1) on
which every optimizer step dies; this check must fail there, naming the cause, and pass on a working one.
"""

import importlib.util
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "toolchain/check_training_path.py"
HOROVODRUN = str(pathlib.Path(sys.executable).with_name("horovodrun"))
# what this machine's Horovod has beyond Gloo (toolchain/bootstrap.sh adds MPI where it can install Open MPI)
LOCAL_REQUIRE = ["--require", "MPI"] if shutil.which("mpicxx") else []

_spec = importlib.util.spec_from_file_location("check_training_path", SCRIPT)
check = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(check)


def run_check(*args, env_extra=None, timeout=1800) -> subprocess.CompletedProcess:
    """The check as an image build runs it."""
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", **(env_extra or {})}
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
        cwd=ROOT,
    )


def rc1_interpreter(tmp_path) -> dict:
    """Python 3.11.0rc1 as far as torch can tell: sys without get/set_int_max_str_digits (added in 3.11.0rc2)."""
    site = tmp_path / "rc1"
    site.mkdir()
    (site / "sitecustomize.py").write_text("import sys\ndel sys.get_int_max_str_digits, sys.set_int_max_str_digits\n")
    return {"PYTHONPATH": str(site)}


def _step_with(site: pathlib.Path, monkeypatch) -> list[str]:
    """The check's two-process step (check_step, as main() runs it) with `site`'s sitecustomize in the workers."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")])))
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "2")
    return check.check_step("pytorch", HOROVODRUN, 600)


@pytest.mark.launches
@pytest.mark.parametrize("framework", [pytest.param("pytorch", marks=pytest.mark.one_core), "tensorflow"])
def test_the_check_passes_on_the_local_environment(framework):
    proc = run_check("--framework", framework, *LOCAL_REQUIRE)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "[check] two-process optimizer step: ok" in out
    assert f"[check] the {framework} training path works" in out
    if framework == "pytorch":  # the payload's own step, with torch 2.14's fused SGD on the CPU
        assert "pytorch-payload-fused" in out, out


@pytest.mark.launches
def test_a_resume_that_seeds_the_optimizer_with_horovods_zero_step_fails_the_check(tmp_path, monkeypatch):
    """Issue 26, items 2 and 4: the payload's step restores a checkpoint into a fresh optimizer on both ranks
    with every fused SGD call held to CUDA's layout rule. Horovod's broadcast_optimizer_state (what the
    payload called before) seeds the other ranks' state with a step on default-layout zero gradients, which
    CUDA's fused kernel refuses for channels_last weights: the check must fail there."""
    site = tmp_path / "hvdseed"
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        "import sys\n"
        "if '--worker' in sys.argv:\n"
        "    from payloads.pytorch import backends\n"
        "    backends.Horovod.broadcast_optimizer_state = (\n"
        "        lambda self, opt: self.hvd.broadcast_optimizer_state(opt, root_rank=0))\n"
    )
    folder = tmp_path / "tmp"  # the ranks' temporary folder
    folder.mkdir()

    def left() -> set[pathlib.Path]:
        return {p for p in folder.iterdir() if p.name.startswith("check-")}

    before = left()
    monkeypatch.setenv("TMPDIR", str(folder))
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    # The step alone, from here: the rest of the check (imports, --check-build) is the passing test's.
    problems = _step_with(site, monkeypatch)
    assert len(problems) == 1 and "the two-process pytorch optimizer step failed" in problems[0], problems
    assert "CUDA's fused SGD would refuse this step" in problems[0], problems[0][-3000:]
    # The ranks failed after writing their checkpoint: its folder goes with the failed check all the same.
    assert not left() - before


@pytest.mark.launches
@pytest.mark.one_core
def test_an_rc1_interpreter_fails_the_check_naming_the_cause_where_check_build_passes(tmp_path):
    env = rc1_interpreter(tmp_path)
    # ... while every optimizer step dies: torch.optim imports torch._dynamo, which calls the missing function
    step = subprocess.run(
        [
            sys.executable,
            "-c",
            "import torch; p = torch.nn.Parameter(torch.ones(1)); "
            "p.grad = torch.ones(1); torch.optim.SGD([p], lr=0.1).step()",
        ],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        timeout=300,
    )
    assert step.returncode != 0 and "get_int_max_str_digits" in step.stderr, step.stderr[-2000:]

    proc = run_check("--framework", "pytorch", *LOCAL_REQUIRE, env_extra=env)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    # what the images checked before, run by the check in the same interpreter: Horovod's extensions load
    assert "[check] horovodrun --check-build (PyTorch, Gloo" in proc.stdout
    assert "horovod build:" not in proc.stderr, "horovodrun --check-build alone passes on this interpreter"
    assert "interpreter: this interpreter lacks sys.get_int_max_str_digits, sys.set_int_max_str_digits" in proc.stderr
    assert "import torch._dynamo: AttributeError: module 'sys' has no attribute 'get_int_max_str_digits'" in proc.stderr
    assert "install a released CPython 3.11" in proc.stderr


@pytest.mark.launches
def test_a_step_without_averaged_gradients_fails_the_check(tmp_path, monkeypatch):
    """The step compares each rank's weights with those the averaged gradient gives: a DistributedOptimizer
    that applies the rank's own gradient (no allreduce) must fail it."""
    site = tmp_path / "noavg"
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        "import sys\n"
        "if '--worker' in sys.argv:\n"
        "    import horovod.torch as hvd\n"
        "    hvd.DistributedOptimizer = lambda optimizer, **kwargs: optimizer\n"
    )
    problems = _step_with(site, monkeypatch)
    assert len(problems) == 1 and "the two-process pytorch optimizer step failed" in problems[0], problems
    assert "PyTorch SGD step with Horovod's averaged gradient" in problems[0], problems[0][-3000:]


@pytest.mark.launches
@pytest.mark.one_core
def test_a_missing_controller_or_op_fails_the_check(monkeypatch):
    """This machine's Horovod has no NCCL (CPU build): requiring it, as the images do, must fail."""
    real, answers = subprocess.run, []

    def once(cmd, **kwargs):  # one real `horovodrun --check-build` (it imports TensorFlow), read by both calls
        if not answers:
            answers.append(real(cmd, **kwargs))
        assert cmd == answers[0].args
        return answers[0]

    monkeypatch.setattr(check.subprocess, "run", once)
    problems = check.check_build("pytorch", ["NCCL"], HOROVODRUN)
    assert problems and "Horovod was built without NCCL" in problems[0]
    assert check.check_build("pytorch", [], HOROVODRUN) == []


def test_a_pre_release_interpreter_is_named():
    class Info(tuple):
        releaselevel = "candidate"

    problems = check.check_interpreter(Info((3, 11, 0)), sys)
    assert any("3.11.0candidate is a pre-release" in p for p in problems)
    assert check.check_interpreter() == []


def _cuda_dir(tmp_path, libdevice=True, ptxas="#!/bin/sh\necho 'ptxas: NVIDIA (R) Ptx optimizing assembler'\n"):
    d = tmp_path / "cuda_nvcc"
    (d / "nvvm/libdevice").mkdir(parents=True)
    (d / "bin").mkdir()
    if libdevice:
        (d / check.LIBDEVICE).write_bytes(b"BC")
    if ptxas is not None:
        (d / "bin/ptxas").write_text(ptxas)
        (d / "bin/ptxas").chmod(0o755)
    return d


def test_libdevice_check_follows_xla_flags(tmp_path):
    """XLA takes libdevice from <dir>/nvvm/libdevice and ptxas from <dir>/bin (--xla_gpu_cuda_data_dir)."""
    good = _cuda_dir(tmp_path)
    assert check.check_libdevice({"XLA_FLAGS": f"--xla_gpu_cuda_data_dir={good}"}) == []
    assert "XLA_FLAGS does not set" in check.check_libdevice({})[0]
    (good / check.LIBDEVICE).unlink()
    assert any(
        "libdevice.10.bc is missing" in p
        for p in check.check_libdevice({"XLA_FLAGS": f"--xla_gpu_cuda_data_dir={good}"})
    )
    (good / "bin/ptxas").unlink()
    assert any("does not run" in p for p in check.check_libdevice({"XLA_FLAGS": f"--xla_gpu_cuda_data_dir={good}"}))


def test_forward_compat_check(tmp_path):
    d = tmp_path / "compat"
    d.mkdir()
    assert any("no libcuda.so" in p for p in check.check_cuda_compat(str(d), "13.0"))
    (d / "libcuda.so.570.133.20").write_text("")
    assert any("branch 570, older than CUDA 13.0 needs (580)" in p for p in check.check_cuda_compat(str(d), "13.0"))
    (d / "libcuda.so.580.82.07").write_text("")
    hook_missing = check.check_cuda_compat(str(d), "13.0")  # this venv has no cuda_forward_compat module
    assert hook_missing == [
        "cuda_forward_compat is not importable: the start-up hook (a .pth in site-packages) "
        "that loads the forward-compatibility driver is missing"
    ]
