# Tests import the checkout's packages through pytest.ini's `pythonpath`, and `trainingplatform` as installed
# (infra/pyproject.toml, editable: toolchain/bootstrap.sh).
import ctypes
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile

import pytest

# Tests that start processes which train (horovodrun, torchrun, mpirun, a payload, the launcher's local
# target) carry this marker; under pytest-xdist (scripts/test: -n auto --dist loadgroup) they all run on one
# worker, one after another, so two multi-process runs never share the cores, while the in-process tests
# spread over the other workers. `_guarded_popen_init` below refuses such a launch from an unmarked test.
LAUNCHES = "launches"
# Launches measured at about one core (CPU seconds at most 1.1 times their wall seconds, run alone, /proc/stat):
# one training process at a time (the GPU benchmark's CPU runs, the runs without Horovod), ranks that end at import
# or a check that trains nothing (--check-build), or ranks that mostly wait (a rank stopped or asleep for the
# watchdog, a launcher's grace before SIGKILL: the DDP stopped-rank test 3.7 s of CPU in 37.6 s) also carry this
# one: they run one after another in a group of their own, on the other worker, beside the in-process tests, so
# the launches' group keeps both cores for the runs that use both and the other core is not left idle.
ONE_CORE = "one_core"
# The file counting the session's training launches (conftest._count_launch), shared by xdist's workers.
LAUNCH_COUNT = "TEST_LAUNCH_COUNT"


def _worker(config) -> bool:
    """True in a pytest-xdist worker: the controller alone owns the session's shared files and verdicts."""
    return hasattr(config, "workerinput")


def pytest_configure(config):
    config.addinivalue_line(
        "markers", f"{LAUNCHES}: starts processes that train; run serially with every other such test (conftest.py)"
    )
    config.addinivalue_line(
        "markers", f"{ONE_CORE}: a launch keeping about one core busy; serially with its kind, beside the launches"
    )
    # The platform program reads the Azure CLI's login (trainingplatform/access.py); tests never see this machine's.
    os.environ["AZURE_CONFIG_DIR"] = tempfile.mkdtemp(prefix="no-azure-cli-")
    # The session's launch count (conftest._count_launch) and every payload launch (helpers.record_launch, for the
    # device rule below): files made by the session that starts first, shared with its xdist workers and with any
    # pytest a test starts, and removed only by the session that made them.
    for variable, prefix in ((LAUNCH_COUNT, "launch-count-"), ("TEST_LAUNCH_LOG", "launches-")):
        if variable not in os.environ:
            fd, path = tempfile.mkstemp(prefix=prefix)
            os.close(fd)
            os.environ[variable] = path
            _made.append(path)


_made: list[str] = []  # the files this process made (pytest_unconfigure removes them)


def _whole_suite(session) -> bool:
    """Run as scripts/test and CI run it: the tests folder, nothing selected or deselected."""
    o = session.config.option
    tests = pathlib.Path(__file__).parent.resolve()
    args = [pathlib.Path(a.split("::")[0]).resolve() for a in session.config.args]
    narrowed = o.keyword or o.markexpr or getattr(o, "deselect", None) or getattr(o, "lf", False)
    return all(a == tests for a in args) and not narrowed


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    # tryfirst: before xdist's own hook, which reads the xdist_group markers to make the groups.
    for item in items:
        if item.get_closest_marker(ONE_CORE):
            assert item.get_closest_marker(LAUNCHES), f"{item.nodeid}: `{ONE_CORE}` is for tests marked `{LAUNCHES}`"
            item.add_marker(pytest.mark.xdist_group(ONE_CORE))
        elif item.get_closest_marker(LAUNCHES):
            item.add_marker(pytest.mark.xdist_group(LAUNCHES))
        # xdist joins every group name a test carries into one: a launch with a group of its own would leave the
        # serial group and share the cores with the other launches.
        groups = {m.args[0] if m.args else m.kwargs.get("name") for m in item.iter_markers("xdist_group")}
        assert len(groups) <= 1 or not item.get_closest_marker(LAUNCHES), (
            f"{item.nodeid}: a `{LAUNCHES}` test in the xdist groups {sorted(groups)}; launches run in theirs alone"
        )


# What the checkout's top folder holds when the session starts: a test that writes there instead of under its
# tmp_path (a payload run without --output-dir writes outputs/ in its working folder) fails the session.
_CHECKOUT = pathlib.Path(__file__).resolve().parents[1]
_CHECKOUT_BEFORE = set(os.listdir(_CHECKOUT))
_CHECKOUT_CACHES = {".pytest_cache", "__pycache__"}


def _left_in_checkout(session) -> None:
    new = set(os.listdir(_CHECKOUT)) - _CHECKOUT_BEFORE - _CHECKOUT_CACHES
    if new and not _worker(session.config):
        session.config.get_terminal_writer().line(
            f"the tests left {', '.join(sorted(new))} in the checkout ({_CHECKOUT}): a test writes there instead of "
            "under its tmp_path (a payload run needs --output-dir)",
            red=True,
        )
        session.exitstatus = 1


def pytest_sessionfinish(session, exitstatus):
    """The device rule (tests/README.md), checked on what ran: every value of every device-dependent flag trained
    in a successful launch of two or more processes. Deleting those runs fails the whole suite. Checked by the
    controller alone under xdist: each worker saw only its share of the tests."""
    import json

    from helpers import uncovered_device_values

    from payloads.common import config

    _left_in_checkout(session)
    path = os.environ.get("TEST_LAUNCH_LOG")
    if not path or exitstatus != 0 or _worker(session.config) or not _whole_suite(session):
        return
    with open(path) as f:
        launches = [json.loads(line) for line in f if line.strip()]
    missing = uncovered_device_values(launches, config.DEVICE_DEPENDENT)
    if missing:
        session.config.get_terminal_writer().line(
            "device rule (tests/README.md): no successful multi-process launch trained with " + "; ".join(missing),
            red=True,
        )
        session.exitstatus = 1


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """The number of training launches the tests made, by program and by file (the 12 with most): with --durations,
    where the suite's time goes."""
    import collections

    path = os.environ.get(LAUNCH_COUNT)
    if _worker(config) or not path or not os.path.exists(path):
        return
    with open(path) as f:
        launches = [line.rstrip("\n").split("\t") for line in f if line.strip()]
    counts = collections.Counter(program for program, *_ in launches)
    detail = ", ".join(f"{n} {program}" for program, n in counts.most_common())
    terminalreporter.write_line(f"training launches: {sum(counts.values())}" + (f" ({detail})" if detail else ""))
    files = collections.Counter(where[0].split("::")[0] if where else "?" for _, *where in launches)
    terminalreporter.write_line("by file: " + ", ".join(f"{n} {name}" for name, n in files.most_common(12)))


def pytest_unconfigure(config):
    shutil.rmtree(os.environ.pop("AZURE_CONFIG_DIR", ""), ignore_errors=True)
    for path in _made:
        os.unlink(path)


# What starts training processes: these programs, or Python running a payload or the launcher's local target.
_TRAINING_PROGRAMS = {"horovodrun", "torchrun", "mpirun", "mpiexec"}


def _starts_training(args) -> bool:
    argv = [str(a) for a in (args if isinstance(args, (list, tuple)) else [args])]
    if not argv:
        return False
    if any(os.path.basename(a) in _TRAINING_PROGRAMS for a in argv):
        return True
    if "--help" in argv or "-h" in argv:
        return False
    text = " ".join(argv)
    python = os.path.basename(argv[0]).startswith("python") or argv[0] == sys.executable
    return python and (" payloads." in text or "--target local" in text or " benchmarks." in text)


def _count_launch(args) -> None:
    """One line per training launch a test starts (its program's name) in the session's count file: CI prints the
    total (pytest_terminal_summary), the figure that says what the suite costs."""
    path = os.environ.get(LAUNCH_COUNT)
    if path:
        argv = [str(a) for a in (args if isinstance(args, (list, tuple)) else [args])]
        program = next((os.path.basename(a) for a in argv if os.path.basename(a) in _TRAINING_PROGRAMS), "python")
        item = _running["item"]
        where = item.nodeid if item is not None else "?"
        with open(path, "a") as f:
            f.write(f"{program}\t{where}\n")


_running: dict = {"item": None}  # the test being set up, run or torn down (fixtures of any scope included)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    _running["item"] = item


def _guarded_popen_init(real):
    """subprocess.Popen.__init__ refusing training processes from a test without the `launches` marker, in
    pytest's own process: otherwise xdist would run it beside another multi-process test, two runs on the same
    cores. Module- and session-scoped fixtures are set up within their first test, so they count as its."""

    def init(self, args, *a, **kw):
        item = _running["item"]
        starts = _starts_training(args)
        if starts:
            _count_launch(args)
        if item is not None and not item.get_closest_marker(LAUNCHES) and starts:
            shown = args if isinstance(args, str) else " ".join(map(str, args))
            pytest.fail(
                f"{item.nodeid} starts training processes ({shown[:200]}) without the `{LAUNCHES}` marker: add "
                f"`pytestmark = pytest.mark.{LAUNCHES}` to its module (or mark the test) so it runs serially with "
                "the other multi-process tests (tests/conftest.py)",
                pytrace=False,
            )
        real(self, args, *a, **kw)

    init.guarded = True
    return init


if not getattr(subprocess.Popen.__init__, "guarded", False):
    subprocess.Popen.__init__ = _guarded_popen_init(subprocess.Popen.__init__)


@pytest.fixture(scope="session", autouse=True)
def _temporary_files_in_basetemp(tmp_path_factory):
    """TMPDIR is a folder under this process's pytest basetemp for the session, inherited by every process the
    tests start: what those leave in the temporary folder (a SIGKILLed rank's checkpoint-*, multiprocessing's
    pymp-*, torchrun's torchelastic_*, TensorFlow's __autograph_generated_file*: about 1 GB over a few runs) is
    rotated away with pytest's basetemps (the last 3 kept, to read after a failure) instead of filling /tmp.
    Inductor's compile cache stays where it was, shared across runs."""
    import getpass

    folder = tmp_path_factory.getbasetemp() / "tmp"
    folder.mkdir(exist_ok=True)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(
            "TORCHINDUCTOR_CACHE_DIR",
            os.environ.get("TORCHINDUCTOR_CACHE_DIR")
            or os.path.join(tempfile.gettempdir(), f"torchinductor_{getpass.getuser()}"),
        )
        mp.setenv("TMPDIR", str(folder))
        mp.setattr(tempfile, "tempdir", str(folder))
        yield


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


@pytest.fixture(scope="session")
def dev_outputs(tmp_path_factory) -> pathlib.Path:
    """The dev stack's outputs as the mocked Pulumi program produces them, saved like `pulumi stack output --json`
    (the launcher's and azurecheck's tests read them)."""
    import json

    from trainingplatform import mocked

    root = pathlib.Path(__file__).resolve().parents[1]
    raw, location = mocked.read_stack_file(root / "Pulumi.dev.yaml")
    _, outputs = mocked.run(raw, "dev", location)
    path = tmp_path_factory.mktemp("stack") / "outputs.dev.json"
    path.write_text(json.dumps(outputs))
    return path


@pytest.fixture(scope="session")
def fp32_references(tmp_path_factory):
    """helpers.one_process_references in float32, made once per worker for every PyTorch averaging test whose flags
    leave the 1-process numbers as they are: the averaging tests share the launches' worker."""
    from helpers import one_process_references

    return one_process_references(tmp_path_factory.mktemp("fp32-references"))


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


@pytest.fixture
def processes_without_rename(tmp_path, monkeypatch):
    """Every process the test starts loads tests/no_rename/sitecustomize.py: rename under tmp_path/runs raises,
    as on a blob mount without it (BlobFuse documents renames as a copy and a delete,
    learn.microsoft.com/azure/storage/blobs/blobfuse2-compare-linux-file-system). Returns (runs folder, a function
    counting the training processes of a module that ran under the hook)."""
    import errno

    from helpers import env

    runs, log = tmp_path / "runs", tmp_path / "hooked"
    runs.mkdir()
    log.mkdir()
    hook = pathlib.Path(__file__).with_name("no_rename")
    monkeypatch.setenv("PYTHONPATH", str(hook) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    monkeypatch.setenv("NO_RENAME_UNDER", str(runs))
    monkeypatch.setenv("NO_RENAME_LOG", str(log))
    # The hook bites: a process under it cannot rename inside the output folder.
    probe = subprocess.run(
        [
            sys.executable,
            "-c",
            "import os, sys; open(sys.argv[1], 'w').close(); os.replace(sys.argv[1], sys.argv[1] + '.b')",
            str(runs / "probe"),
        ],
        env=env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert probe.returncode != 0 and f"[Errno {errno.EXDEV}]" in probe.stderr, probe.stderr

    def hooked(module: str) -> int:
        """Training processes (not the horovodrun launcher, whose command line names the module too)."""
        lines = [p.read_text() for p in log.iterdir()]
        return sum(f"-m {module}" in line and "horovodrun" not in line for line in lines)

    return runs, hooked
