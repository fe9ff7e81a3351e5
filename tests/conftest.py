# Tests import the checkout's packages through pytest.ini's `pythonpath`, and `trainingplatform` as installed
# (infra/pyproject.toml, editable: toolchain/bootstrap.sh).
import ctypes
import os
import pathlib
import shutil
import tempfile

import pytest


def pytest_configure(config):
    # The platform program reads the Azure CLI's login (trainingplatform/access.py); tests never see this machine's.
    os.environ["AZURE_CONFIG_DIR"] = tempfile.mkdtemp(prefix="no-azure-cli-")


def pytest_unconfigure(config):
    shutil.rmtree(os.environ.pop("AZURE_CONFIG_DIR", ""), ignore_errors=True)


_libc = ctypes.CDLL(None)
_libc.getenv.restype = ctypes.c_char_p


@pytest.fixture(autouse=True)
def _no_mpi_inside_pytest(request):
    """A test that calls hvd.init() in pytest's own process starts an Open MPI singleton, which sets PMIX_*
    and OMPI_MCA_ess=singleton in the C environment (not in os.environ) of pytest's process: every later
    horovodrun started without an explicit env inherits them and exits 1 with no message. Run payloads as
    processes of their own (helpers.train) instead; this names the test that did it."""
    yield
    if _libc.getenv(b"PMIX_RANK") is not None or _libc.getenv(b"OMPI_MCA_ess") == b"singleton":
        pytest.fail(
            f"{request.node.nodeid} initialised MPI inside pytest's process: later horovodrun calls fail; "
            "run the payload as a subprocess",
            pytrace=False,
        )


@pytest.fixture
def cuda_fused_sgd_rule(tmp_path, monkeypatch):
    """Every process the test starts holds torch._fused_sgd_ to CUDA's layout rule (tests/gpu_rules). Returns a
    function giving the number of fused calls checked by each process that made any."""
    log = tmp_path / "fused-sgd-checked"
    log.mkdir()
    hook = pathlib.Path(__file__).with_name("gpu_rules")
    monkeypatch.setenv("PYTHONPATH", str(hook) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    monkeypatch.setenv("FUSED_SGD_STRIDE_CHECK", "1")
    monkeypatch.setenv("FUSED_SGD_STRIDE_LOG", str(log))
    return lambda: sorted(int(f.read_text()) for f in log.iterdir())
