"""The warm start (tests/warm_start.py) the launch tests use: a warm-started rank is the process a cold one would be.
Same weights bit for bit as a cold launch; exit codes, tracebacks, signals forwarded and deaths by signal as a
fresh interpreter gives them; a rank whose client is killed goes too; a test hook on PYTHONPATH loads in the rank."""

import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import warm_start
from helpers import ROOT, TINY, env, metrics, train

pytestmark = pytest.mark.launches  # starts the warm start servers and training processes (tests/conftest.py)


@pytest.mark.parametrize("payload", ["pytorch", "tensorflow"])
def test_a_warm_launch_trains_bit_for_bit_as_a_cold_one(tmp_path, payload, monkeypatch):
    args = TINY + ["--epochs", "2", "--batch-size", "16"]
    monkeypatch.setenv("TEST_WARM_START", "0")
    train(2, args + ["--output-dir", str(tmp_path / "cold")], payload=payload)
    monkeypatch.setenv("TEST_WARM_START", "1")
    train(2, args + ["--output-dir", str(tmp_path / "warm")], payload=payload)
    cold, warm = metrics(tmp_path / "cold"), metrics(tmp_path / "warm")
    assert warm["summary"]["ranks_identical"] is True
    assert warm["summary"]["parameters_sha256"] == cold["summary"]["parameters_sha256"]
    assert [e["train_loss"] for e in warm["epochs"]] == [e["train_loss"] for e in cold["epochs"]]


# A module the server runs as a rank: says its pid, then acts as its first argument asks.
_RANK = """
import os, pathlib, signal, sys, time
out = pathlib.Path(sys.argv[2])
def stopped(signum, frame):
    out.joinpath("stopped").write_text(str(signum))
    sys.exit(75)
signal.signal(signal.SIGTERM, stopped)
out.joinpath("pid").write_text(str(os.getpid()))
print("argv", sys.argv[1:], "hook", os.environ.get("HOOKED"), "orig", " ".join(sys.orig_argv[1:]), flush=True)
what = sys.argv[1]
if what == "raise":
    raise ValueError("the rank's own error")
if what == "message":
    sys.exit("a message to stderr")
if what == "abort":
    os.kill(os.getpid(), signal.SIGKILL)
if what == "wait":
    time.sleep(60)
if what == "xla":
    import payloads.tensorflow  # its import-time environment, as the payload's ranks have it
    os.environ["TF_XLA_FLAGS"] = "--tf_xla_cpu_global_jit"  # as payloads/tensorflow/launch.py does for --xla
"""


def _client(framework: str = "pytorch") -> list[str]:
    """The warm client and server socket, without the module: the test's own module follows."""
    return warm_start.command(f"payloads.{framework}.train", env())[:-1]


def _rank(tmp_path, what: str, payload: str = "pytorch", prefix=(), hook: str | None = None, **popen):
    """The test's rank module run warm; `hook`: the text of a sitecustomize put first on its PYTHONPATH."""
    (tmp_path / "warmrank.py").write_text(textwrap.dedent(_RANK))
    environ = env()
    environ["PYTHONPATH"] = f"{tmp_path}{os.pathsep}{environ['PYTHONPATH']}"
    if hook is not None:
        (tmp_path / "hook").mkdir(exist_ok=True)
        (tmp_path / "hook" / "sitecustomize.py").write_text(hook)
        environ["PYTHONPATH"] = f"{tmp_path / 'hook'}{os.pathsep}{environ['PYTHONPATH']}"
    cmd = [*prefix, *_client(payload), "warmrank", what, str(tmp_path)]
    return subprocess.Popen(cmd, cwd=ROOT, env=environ, text=True, **popen)


def _refused(tmp_path, **kw) -> str:
    """A rank the server refuses before running the module: exit 1, the module never started; its stderr."""
    proc = _rank(tmp_path, "done", stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kw)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 1, err
    assert not (tmp_path / "pid").exists()
    return err


def _pid(tmp_path, proc: subprocess.Popen) -> int:
    deadline = time.monotonic() + 30
    while not (tmp_path / "pid").exists() or not (tmp_path / "pid").read_text():
        assert proc.poll() is None and time.monotonic() < deadline, "the rank never started"
        time.sleep(0.05)
    return int((tmp_path / "pid").read_text())


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:
        return f.read().split(")")[1].split()[0] != "Z"


@pytest.mark.parametrize(
    "what, code, stderr",
    [
        ("raise", 1, "ValueError: the rank's own error"),
        ("message", 1, "a message to stderr"),
        ("done", 0, ""),
        ("abort", -signal.SIGKILL, ""),
    ],
)
def test_a_warm_rank_ends_as_a_fresh_interpreter_would(tmp_path, what, code, stderr):
    proc = _rank(tmp_path, what, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == code, err
    assert stderr in err
    assert f"argv ['{what}', '{tmp_path}']" in out  # its stdout is the client's
    assert f"orig -m warmrank {what}" in out  # the command line a cold `python -m` would have had
    assert int((tmp_path / "pid").read_text()) != proc.pid  # a forked process, not the client


def test_a_rank_that_sets_what_tensorflow_read_at_import_fails_naming_the_fix(tmp_path):
    proc = _rank(tmp_path, "xla", payload="tensorflow", stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 1
    assert "TF_XLA_FLAGS, which the framework reads at import" in err and "launch this run cold" in err


def test_a_rank_in_another_mount_namespace_is_refused_naming_the_fix(tmp_path):
    """A rank forked by the server would live in the server's mounts, not the private tmpfs a test set up with
    unshare (test_disk_full.py, test_shards_training.py): refused, not run in the wrong place."""
    prefix = ["unshare", "--mount", "--propagation", "private"]
    if not shutil.which("unshare") or subprocess.run([*prefix, "true"], capture_output=True).returncode != 0:
        pytest.skip("no private mounts here (unshare needs root)")
    err = _refused(tmp_path, prefix=prefix)
    assert "runs in other namespaces than the warm start server" in err and "launch it cold" in err


def test_a_rank_with_an_import_hook_that_cannot_see_preloaded_modules_is_refused(tmp_path):
    """test_without_horovod.py's kind of hook: a meta-path finder hiding Horovod, which the server already imported."""
    hide = (
        "import sys\nclass Hide:\n    def find_spec(self, name, path=None, target=None):\n        return None\n"
        "sys.meta_path.insert(0, Hide())\n"
    )
    err = _refused(tmp_path, hook=hide)
    assert "added an import hook (Hide)" in err and "launch it cold" in err


def test_signals_to_the_client_reach_the_rank_and_its_status_comes_back(tmp_path):
    proc = _rank(tmp_path, "wait", stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    _pid(tmp_path, proc)
    proc.send_signal(signal.SIGTERM)  # what horovodrun and torchrun send their ranks
    proc.communicate(timeout=30)
    assert proc.returncode == 75
    assert (tmp_path / "stopped").read_text() == str(int(signal.SIGTERM))


def test_a_killed_client_takes_its_rank_with_it(tmp_path):
    proc = _rank(tmp_path, "wait", stdout=subprocess.DEVNULL)
    pid = _pid(tmp_path, proc)
    proc.kill()  # horovodrun's last resort, and what a test does to a rank's launcher process
    proc.wait(timeout=10)
    deadline = time.monotonic() + 10
    while _alive(pid):
        assert time.monotonic() < deadline, f"rank {pid} outlived its client"
        time.sleep(0.05)


def test_a_hook_on_the_ranks_pythonpath_loads_in_the_rank_only(tmp_path):
    hooked = _rank(tmp_path, "done", hook="import os\nos.environ['HOOKED'] = 'yes'\n", stdout=subprocess.PIPE)
    hooked_out, _ = hooked.communicate(timeout=60)
    plain = _rank(tmp_path, "done", stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, _ = plain.communicate(timeout=60)
    assert "hook yes" in hooked_out
    assert "hook None" in out  # not carried over from the previous rank into the server or the next one


@pytest.mark.one_core
def test_the_interpreter_for_the_products_own_launches_warms_payload_modules_and_nothing_else(tmp_path, monkeypatch):
    """helpers.python(): the launcher, the drill and the GPU benchmark start `python -m payloads...` themselves,
    through PATH or sys.executable; from this interpreter those are warm ranks (torch already imported when the
    rank's sitecustomize runs), and everything else is a fresh interpreter that still names this one as
    sys.executable, so what it starts comes back here."""
    from helpers import python

    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        "import os, sys\n"
        "with open(os.environ['PROBE'], 'a') as f:\n"
        "    f.write(f\"{'torch' in sys.modules} {sys.executable} {':'.join(sys.argv)}\\n\")\n"
    )
    monkeypatch.setenv("TEST_WARM_START", "1")  # also under a TEST_WARM_START=0 run of the suite
    py = python()
    assert py != sys.executable

    def probe(*args: str) -> tuple[str, str]:
        record = tmp_path / f"probe{len(list(tmp_path.glob('probe*')))}"
        e = {**env(), "PYTHONPATH": f"{site}{os.pathsep}{ROOT}", "PROBE": str(record)}
        proc = subprocess.run([py, *args], env=e, cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr[-2000:]
        return tuple(record.read_text().split())

    # Forked from the warm server; its sitecustomize sees sys.argv as a fresh interpreter's does (["-m", *args]).
    assert probe("-m", "payloads.pytorch.train", "--help")[::2] == ("True", "-m:--help")
    assert probe("-m", "payloads.healthcheck", "--help")[::2] == ("True", "-m:--help")
    assert probe("-c", "pass") == ("False", py, "-c")  # cold, and sys.executable is this interpreter
    assert probe("-m", "launcher", "--help") == ("False", py, "-m:--help")
    assert probe("-m", "payloads.keras.train", "--help") == ("False", py, "-m:--help")  # no TensorFlow server
    monkeypatch.setenv("TEST_WARM_START", "0")
    assert probe("-m", "payloads.pytorch.train", "--help") == ("False", py, "-m:--help")
