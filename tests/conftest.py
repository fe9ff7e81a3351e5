# Tests import the checkout's packages through pytest.ini's `pythonpath`, and `trainingplatform` as installed
# (infra/pyproject.toml, editable: toolchain/bootstrap.sh).
import ctypes
import os
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
