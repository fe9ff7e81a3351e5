"""The environment contract every training environment meets: the images and the local .venv.

Runs through testinfra. Locally (CI): `scripts/test tests/images` checks this machine's .venv with the
CPU-only expectations. Against a built image, with a Docker engine:

    docker run -d --name hvd-pytorch training/pytorch:torch2.14.1-horovod0.28.1 sleep infinity
    IMAGE_PROFILE=pytorch-gpu .venv/bin/python -m pytest tests/images --hosts=docker://hvd-pytorch
"""

import os
import pathlib
import re
import shutil
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


def pin(requirements: pathlib.Path, package: str) -> str:
    for line in requirements.read_text().splitlines():
        m = re.match(rf"^{re.escape(package)}(\[[^\]]*\])?==([^\s;#]+)", line.strip())
        if m:
            return m.group(2)
    raise AssertionError(f"{package} is not pinned in {requirements}")


TORCH = pin(ROOT / "payloads/requirements.txt", "torch")
TF = pin(ROOT / "images/tensorflow/requirements.txt", "tensorflow")

TF_LOCAL = pin(ROOT / "payloads/requirements-tensorflow.txt", "tensorflow-cpu")
# toolchain/bootstrap.sh installs Open MPI where it can (root or sudo, apt); where it could not, Gloo only.
LOCAL_MPI = shutil.which("mpicxx") is not None

PROFILES = {
    # this machine's .venv: CPU only, both frameworks, Gloo, and MPI where the machine has Open MPI
    "local-cpu": dict(
        python=sys.executable,
        modules={"torch": TORCH, "tensorflow": TF_LOCAL},
        frameworks=["PyTorch", "TensorFlow"],
        controllers=["Gloo"] + ["MPI"] * LOCAL_MPI,
        ops=["Gloo"],
        not_ops=["NCCL"],
        mpi=LOCAL_MPI,
        mca_file=False,  # this machine's Open MPI is Debian's, as installed: no job settings in its system file
    ),
    "pytorch-gpu": dict(
        python="/opt/venv/bin/python",
        modules={"torch": TORCH},
        frameworks=["PyTorch"],
        controllers=["MPI", "Gloo"],
        ops=["NCCL"],
        not_ops=[],
        mpi=True,
        mca_file=True,  # images/mpi_settings.sh
    ),
    "tensorflow-gpu": dict(
        python="/opt/venv/bin/python",
        modules={"tensorflow": TF},
        frameworks=["TensorFlow"],
        controllers=["MPI", "Gloo"],
        ops=["NCCL"],
        not_ops=[],
        mpi=True,
        mca_file=True,  # images/mpi_settings.sh
    ),
}
PROFILE = PROFILES[os.environ.get("IMAGE_PROFILE", "local-cpu")]
BIN = str(pathlib.PurePosixPath(PROFILE["python"]).parent)


def test_python_is_3_11(host):
    out = host.check_output(f"{PROFILE['python']} -c 'import sys; print(sys.version_info[:2])'")
    assert out == "(3, 11)"


def test_python_is_a_release_with_what_torch_calls(host):
    """Ubuntu 22.04's apt python3.11 is 3.11.0rc1, which lacks sys.get_int_max_str_digits (3.11.0rc2) that
    torch._dynamo calls at import; every optimizer step imports torch._dynamo (issue 19, item 1)."""
    out = host.check_output(
        f"{PROFILE['python']} -c 'import sys; "
        "print(sys.version_info.releaselevel, hasattr(sys, \"get_int_max_str_digits\"))'"
    )
    assert out == "final True"


@pytest.mark.parametrize("module", sorted(PROFILE["modules"]))
def test_framework_version_matches_the_pins(host, module):
    version = host.check_output(f"{PROFILE['python']} -c 'import {module}; print({module}.__version__)'")
    assert version.split("+")[0] == PROFILE["modules"][module], "the environment drifted from the pins"


def _check_build(host) -> str:
    return host.check_output(f"{BIN}/horovodrun --check-build")


def _marked(text: str, name: str) -> bool:
    return re.search(rf"\[X\] {re.escape(name)}\b", text) is not None


@pytest.mark.launches
@pytest.mark.one_core
def test_horovod_is_built_with_the_expected_frameworks_controllers_and_ops(host):
    text = _check_build(host)
    assert "Horovod v0.28.1" in text
    for name in PROFILE["frameworks"] + PROFILE["controllers"] + PROFILE["ops"]:
        assert _marked(text, name), f"Horovod lacks {name}:\n{text}"
    for name in PROFILE["not_ops"]:
        assert not _marked(text, name), f"a CPU environment claims {name}:\n{text}"


@pytest.mark.launches
@pytest.mark.one_core
def test_mpi_where_required(host):
    if not PROFILE["mpi"]:
        pytest.skip("no Open MPI on this machine: the local environment is Gloo-only")
    assert host.run("mpirun --version").rc == 0
    assert _marked(_check_build(host), "MPI")


@pytest.mark.launches
@pytest.mark.parametrize("controller", ["gloo", "mpi"])
def test_allreduce_works_with_two_processes(host, controller):
    if controller == "mpi" and not PROFILE["mpi"]:
        pytest.skip("no MPI in this environment")
    cmd = (
        f"PATH={BIN}:$PATH {BIN}/horovodrun -np 2 -H localhost:2 --{controller} {PROFILE['python']} -c "
        "'import horovod.torch as hvd, torch; hvd.init(); "
        "print(int(hvd.allreduce(torch.ones(4) * (hvd.rank() + 1), op=hvd.Sum)[0]))'"
    )
    if "torch" not in PROFILE["modules"]:
        cmd = cmd.replace("horovod.torch as hvd, torch", "horovod.tensorflow as hvd, tensorflow as torch")
    out = host.check_output(cmd)
    assert re.findall(r"\]<stdout>:(\d+)", out) == ["3", "3"], out


def test_open_mpi_reads_the_jobs_stop_grace_from_its_system_file(host):
    """Every mpirun and orted of a job reads the grace of mpirun's stop from the image's system MCA parameters file
    (images/mpi_settings.sh), whatever environment Azure ML gives them (issue 54, item 6)."""
    if not PROFILE["mca_file"]:
        pytest.skip("this machine's Open MPI is not an image's: tests/images/test_definitions.py checks the script")
    settings = dict(
        re.findall(r"^\s*([a-z0-9_]+)\s*=\s*(\S+)\s*$", (ROOT / "images/openmpi-mca-params.conf").read_text(), re.M)
    )
    out = host.check_output(
        "env -u OMPI_MCA_odls_base_sigkill_timeout ompi_info --param odls base --level 9 --parsable"
    )
    value = settings["odls_base_sigkill_timeout"]
    assert f"mca:odls:base:param:odls_base_sigkill_timeout:value:{value}" in out.splitlines(), out
    assert "mca:odls:base:param:odls_base_sigkill_timeout:source:file (" in out, out


# Extended regex for grep: private keys, storage keys and SAS tokens, service principal secrets. Split
# literals so that this file, which the local profile scans too, does not match itself.
SECRET = (
    r"-----BEGIN [A-Z ]*PRIVATE KEY-----|AccountKey=[A-Za-z0-9+/]{40,}|Shared"
    r"AccessSignature=|"
    r"AZURE_CLIENT"
    r"_SECRET=[A-Za-z0-9._~-]{8,}"
)


def test_no_secrets_in_the_filesystem(host):
    if PROFILE is PROFILES["local-cpu"]:
        # what a local run ships: the checkout's tracked files and the environment's scripts
        commands = [f"git -C {ROOT} grep -lIE -e '{SECRET}'", f"grep -rlIE -e '{SECRET}' {BIN}"]
    else:
        commands = [f"grep -rlIE -e '{SECRET}' /workspace /root /etc /opt/venv/bin"]
    found = []
    for cmd in commands:
        result = host.run(cmd)
        assert result.rc in (0, 1), f"{cmd} failed: {result.stderr}"  # 1: nothing found
        found += result.stdout.split()
    assert found == [], f"secret-looking content in {found}"
