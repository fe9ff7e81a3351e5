"""What Horovod was built with is read from its library, not learnt by importing TensorFlow (issue 27).

Unpatched, horovod/common/util.py answers mpi_built(), gloo_built(), nccl_built(), ddl_built() and ccl_built() by
forking a process that imports horovod.tensorflow: several seconds of TensorFlow for every horovodrun (a PyTorch
job's too), six for `horovodrun --check-build`, and once more for the launcher's controller choice.
toolchain/patch_horovod.py puts the answers into the compiled library as one string and util.py reads it from the
file, importing no framework. These tests record every process that looks for TensorFlow or PyTorch (a
sys.meta_path finder installed by a sitecustomize, so forked probes are seen too), and check the answers against
the library's own, asked through horovod.torch. Against the unpatched Horovod every test here fails."""

from __future__ import annotations

import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import textwrap

import helpers
import pytest

HOROVODRUN = str(pathlib.Path(sys.executable).with_name("horovodrun"))
FLAGS = ("mpi", "gloo", "nccl", "ddl", "ccl")
CHECK_BUILD_NAME = {"mpi": "MPI", "gloo": "Gloo", "nccl": "NCCL", "ddl": "DDL", "ccl": "CCL"}

# Each process that looks for the top-level tensorflow or torch package appends the name, its pid and where it
# was asked from.
RECORDER = textwrap.dedent(
    """
    import os, sys, traceback

    class _FrameworkLookups:
        def find_spec(self, name, path=None, target=None):
            if name in ("tensorflow", "torch"):
                frames = [f for f in traceback.extract_stack()[:-1] if not f.filename.startswith("<frozen")]
                where = " < ".join(f"{os.path.basename(f.filename)}:{f.name}" for f in reversed(frames[-6:]))
                with open(os.environ["FRAMEWORK_LOOKUP_LOG"], "a") as log:
                    log.write(f"{name} {os.getpid()} {where}\\n")
            return None

    sys.meta_path.insert(0, _FrameworkLookups())
    """
)


@pytest.fixture
def recorded(tmp_path):
    """(environment whose Python processes record framework lookups, function(framework) -> {pid: where})."""
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(RECORDER)
    log = tmp_path / "framework-lookups"
    env = helpers.env()
    env["PYTHONPATH"] = f"{hook}{os.pathsep}{env['PYTHONPATH']}"
    env["FRAMEWORK_LOOKUP_LOG"] = str(log)

    def lookups(framework: str = "tensorflow") -> dict[str, str]:
        lines = log.read_text().splitlines() if log.exists() else []
        return {pid: where for name, pid, where in (line.split(" ", 2) for line in lines) if name == framework}

    return env, lookups


def _seen(found: dict[str, str]) -> str:
    """A failure message: how many processes, and where one of them was asked from."""
    return f"{len(found)} process(es), the first from {next(iter(found.values()), '')}"


def _python(env: dict, code: str, timeout: float = 300) -> str:
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=helpers.ROOT, capture_output=True, text=True, timeout=timeout
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


@pytest.fixture(scope="module")
def library_says() -> dict:
    """The answers of the compiled library itself, loaded the way training loads it (horovod.torch)."""
    code = "import json, horovod.torch as hvd; print(json.dumps({f: getattr(hvd, f + '_built')() for f in %r}))"
    return json.loads(_python(helpers.env(), code % (FLAGS,)).splitlines()[-1])


def _probes(env: dict, setup: str = "", flags: tuple[str, ...] = FLAGS) -> dict:
    """horovod.common.util's answers (what horovodrun asks), in a process of their own."""
    code = f"import json\nfrom horovod.common import util\n{setup}\n"
    code += f"print(json.dumps({{f: getattr(util, f + '_built')() for f in {flags!r}}}))"
    return json.loads(_python(env, code).splitlines()[-1])


@pytest.mark.launches
def test_build_probes_import_no_framework_and_tell_the_truth(recorded, library_says):
    env, lookups = recorded
    said = _probes(env)
    assert not lookups(), f"probing what Horovod was built with looked for TensorFlow: {_seen(lookups())}"
    # read from the library's file: not even PyTorch is imported (it would be for a library without the string)
    assert not lookups("torch"), f"probing what Horovod was built with imported torch: {_seen(lookups('torch'))}"
    assert said == library_says  # a build without MPI still says no MPI


@pytest.mark.launches
def test_without_the_library_string_the_probe_asks_pytorch_not_tensorflow(recorded, library_says):
    """A library without the string (a build the patch did not touch) is asked by importing an extension:
    PyTorch's, whose import is the cheaper, and TensorFlow is not looked for."""
    env, lookups = recorded
    said = _probes(env, setup="util._read_built_with = lambda path: None", flags=("mpi",))  # a probe: 1 import
    assert not lookups(), f"the fallback probe looked for TensorFlow: {_seen(lookups())}"
    assert lookups("torch"), "the fallback probe did not ask PyTorch's extension"
    assert said["mpi"] == library_says["mpi"]


def test_library_string_is_what_the_reader_answers(tmp_path):
    from horovod.common import util

    lib = tmp_path / "mpi_lib.so"
    lib.write_bytes(b"\x7fELF\0junk\0HOROVOD_BUILT_WITH[mpi=0;gloo=1;nccl=22703;ddl=0;ccl=0]\0more")
    assert util._read_built_with(str(lib)) == {"mpi": 0, "gloo": 1, "nccl": 22703, "ddl": 0, "ccl": 0}
    lib.write_bytes(b"\x7fELF\0a library from a build without the patch\0")
    assert util._read_built_with(str(lib)) is None  # then the caller probes by importing an extension
    lib.write_bytes(b"HOROVOD_BUILT_WITH[mpi=1;nccl=NCCL_VERSION(2,27,3);gloo=1]")
    assert util._read_built_with(str(lib)) == {"mpi": 1, "gloo": 1}  # nccl: not a number, so probed


@pytest.mark.launches
def test_check_build_looks_for_tensorflow_once_and_marks_what_the_library_says(recorded, library_says):
    """`horovodrun --check-build` imports TensorFlow for its TensorFlow line only (whether Horovod's TensorFlow
    extension loads), not for each controller and operation (6 processes unpatched)."""
    env, lookups = recorded
    done = subprocess.run([HOROVODRUN, "--check-build"], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert len(lookups()) <= 1, f"looked for TensorFlow: {_seen(lookups())}"
    marked = set(re.findall(r"\[X\] ([A-Za-z]+)", done.stdout))
    for flag, name in CHECK_BUILD_NAME.items():
        assert (name in marked) == bool(library_says[flag]), (name, done.stdout)


@pytest.mark.launches
@pytest.mark.parametrize("controller", ["--gloo", None], ids=["gloo", "auto"])
def test_a_launch_imports_no_framework(recorded, controller):
    """horovodrun starting a job: with --gloo it checks the build has Gloo, without a controller it picks MPI
    when built with it. Neither imports TensorFlow or PyTorch."""
    env, lookups = recorded
    command = [HOROVODRUN, "-np", "1", "-H", "localhost:1", *([controller] if controller else []), "true"]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert not lookups(), f"horovodrun {controller or ''} looked for TensorFlow: {_seen(lookups())}"
    assert not lookups("torch"), f"horovodrun {controller or ''} imported torch: {_seen(lookups('torch'))}"


@pytest.mark.launches
def test_local_jobs_controller_choice_imports_no_framework(recorded, library_says):
    """The launcher's local target picks MPI when Horovod has it and mpirun is on PATH, importing no framework
    (it used to import TensorFlow, and horovodrun then imported it again)."""
    env, lookups = recorded
    chosen = _python(env, "from launcher import local; print(local.controller())").split()[-1]
    assert not lookups(), f"the controller choice looked for TensorFlow: {_seen(lookups())}"
    assert not lookups("torch"), f"the controller choice imported torch: {_seen(lookups('torch'))}"
    assert chosen == ("mpi" if library_says["mpi"] and shutil.which("mpirun") else "gloo")
