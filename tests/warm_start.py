"""Warm start for the tests' payload launches: a process that has imported the framework once forks each rank.

Most of a test launch was start-up, not training: every rank imported PyTorch (and torch._dynamo, which the
optimizer's first param group pulls in) or TensorFlow, 5-6 s of CPU each, two ranks per launch, a few hundred
launches per test run. Here one server per framework imports those third-party modules once; horovodrun and torchrun
still start every rank, but each rank is `warm_client.py`, which hands its argv, environment, working folder and
stdin/stdout/stderr to the server, and the server forks a child that runs the payload module as `python -m` would.
The project's own modules are imported fresh in every child (none is preloaded), so what a test checks is the
payload as written; only the framework import is shared. Ranks stay separate real processes, over real Gloo.

The client stays in the launcher's process tree for the rank: it forwards the signals a launcher or a test sends it,
and exits with the child's status (or dies by the same signal). If the client dies (horovodrun's SIGKILL of a process
group, a test killing it), the server SIGKILLs the child. A child's heartbeat names its own pid, so tests that signal
a rank by that pid signal the payload itself.

TEST_WARM_START=0 runs every launch cold (`python -m payloads...` from a fresh interpreter), as jobs do; the launcher
and job tests always launch cold.

Run as `python warm_start.py SOCKET FRAMEWORK`: the server. Imported: `command()` and `stop_all()` for tests/helpers.
"""

from __future__ import annotations

import array
import json
import os
import pathlib
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile

# What every rank of that payload imports before its first step. The payload package comes first where its own
# import sets the environment the framework reads at import (payloads/tensorflow: TF_ENABLE_ONEDNN_OPTS); the
# project's modules are then forgotten, so each rank imports them fresh.
PRELOAD = {
    "torch": ["numpy", "torch", "torch._dynamo", "torch.utils.tensorboard", "horovod.torch", "PIL.Image"],
    "tensorflow": ["payloads.tensorflow", "numpy", "tensorflow", "horovod.tensorflow", "horovod.tensorflow.keras"],
}
# Variables the framework reads once, at import: a rank that ends with another value than the server imported with
# ran with the server's, so it fails naming the fix (launch it cold). TensorFlow --xla sets TF_XLA_FLAGS on a CPU
# (payloads/tensorflow/launch.py): tests/helpers.py launches those cold.
READ_AT_IMPORT = {"torch": [], "tensorflow": ["TF_ENABLE_ONEDNN_OPTS", "TF_XLA_FLAGS"]}


def framework(module: str) -> str:
    """The server a payload module's ranks come from: payloads.tensorflow and payloads.keras TensorFlow's, the rest
    (payloads.pytorch, payloads.segmentation, payloads.healthcheck) PyTorch's."""
    return "tensorflow" if module.split(".")[1:2] in (["tensorflow"], ["keras"]) else "torch"


CLIENT = pathlib.Path(__file__).with_name("warm_client.py")
_MAX_REQUEST = 1 << 20


def enabled() -> bool:
    return os.environ.get("TEST_WARM_START", "1") != "0"


# ---------------------------------------------------------------- the test side: start servers, build commands

_servers: dict[str, tuple[subprocess.Popen, str]] = {}


def socket_for(framework: str, environ: dict) -> str:
    """The server for this framework, started on first use (its start-up is one cold import)."""
    running = _servers.get(framework)
    if running and running[0].poll() is None:
        return running[1]
    path = os.path.join(tempfile.mkdtemp(prefix="warm-"), "server.sock")
    # PYTHONPATH the repository alone: a test's hook folder there (tests/nudge, ...) must not load into the server,
    # only into the ranks that ask for it. -s: no user site.
    server_env = {**environ, "PYTHONPATH": str(pathlib.Path(__file__).resolve().parents[1])}
    proc = subprocess.Popen(
        [sys.executable, "-s", str(pathlib.Path(__file__).resolve()), path, framework],
        env=server_env,
        stdout=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
    )
    line = proc.stdout.readline()  # "ready" once it listens, after its imports
    if line.strip() != "ready":
        proc.kill()
        raise RuntimeError(f"warm start server for {framework} did not start: {line!r}")
    _servers[framework] = (proc, path)
    return path


def command(module: str, environ: dict) -> list[str]:
    """What a launcher runs for one rank in place of `python -m MODULE` (payloads.pytorch.train, ...)."""
    return [sys.executable, "-S", str(CLIENT), socket_for(framework(module), environ), module]


# ---------------------------------------------------------------- a Python for the product's own launches

_interpreters: dict[tuple, str] = {}

# `python` in the copy's bin/: `python -m payloads...` becomes a warm rank (the client); anything else is this
# interpreter, started under the copy's path (exec -a), so sys.executable names the copy and what that process
# starts through sys.executable or PATH comes here too. TensorFlow with --xla stays cold (READ_AT_IMPORT).
_SHIM = """#!/bin/bash
# tests/warm_start.py interpreter(): python -m payloads.* (and the backends benchmark's loops and torchrun, the
# image check's PyTorch worker) forked from a warm start server, anything else cold.
if [ "${{TEST_WARM_START:-1}}" != 0 ]; then
  case "$1" in
    -m) case "$2" in
          payloads.tensorflow.*|payloads.keras.*) {tensorflow} ;;
          payloads.*|benchmarks._horovod_loop|torch.distributed.run) {torch} ;;
        esac ;;
    -u) [ "$2" = -m ] && case "$3" in  # torchrun starts each rank as python -u -m MODULE
          benchmarks._ddp_loop|benchmarks._ps_rpc) {torch_unbuffered} ;;
        esac ;;
    */toolchain/check_training_path.py) [ "$2 $3" = "--worker pytorch" ] && {torch_script} ;;
  esac
fi
exec -a "$0" {python} "$@"
"""


def interpreter(environ: dict, frameworks: tuple[str, ...] = ("torch",)) -> str:
    """A Python for tests whose code under test starts the payload itself (the launcher's local target and drill,
    mpirun, the GPU benchmark): a copy of this virtual environment (pyvenv.cfg, its lib/ and bin/ linked) whose
    `python` sends `python -m payloads...` of these frameworks to their servers. The launcher puts its
    interpreter's folder first on the ranks' PATH and finds horovodrun beside sys.executable, so its ranks are warm
    and everything else (the launcher, horovodrun, mpirun) runs as written. sys.executable when not warm."""
    if not enabled() or sys.prefix == sys.base_prefix:
        return sys.executable
    key = tuple(sorted(frameworks))
    if key in _interpreters:
        return _interpreters[key]
    venv, root = pathlib.Path(sys.prefix), pathlib.Path(tempfile.mkdtemp(prefix="warm-venv-"))
    shutil.copy(venv / "pyvenv.cfg", root)
    for name in ("lib", "lib64", "include"):
        if (venv / name).exists():
            (root / name).symlink_to(venv / name)
    (root / "bin").mkdir()
    for entry in (venv / "bin").iterdir():
        if not entry.name.startswith("python"):
            (root / "bin" / entry.name).symlink_to(entry)

    def warm(framework: str, argv: str = '"${@:2}"', flags: str = "-S") -> str:
        """The shim's line for a rank of this framework: the client with the module (after -m) or script and its
        arguments; a no-op for a framework not asked for. `flags`: the client's own (-u reaches the rank)."""
        if framework not in key:
            return ":"
        # WARM_START_EXECUTABLE: the rank's sys.executable is this shim, as a cold process started through it has,
        # so what the rank starts with sys.executable (torchrun's ranks) comes back here.
        return (
            f'WARM_START_EXECUTABLE="$0" exec {sys.executable} {flags} {CLIENT} {socket_for(framework, environ)} {argv}'
        )

    tensorflow = f'case " $* " in *" --xla "*) ;; *) {warm("tensorflow")} ;; esac'
    torch_script = warm("torch", '"$@"')
    torch_unbuffered = warm("torch", '"${@:3}"', "-u -S")
    shim = _SHIM.format(
        tensorflow=tensorflow,
        torch=warm("torch"),
        torch_script=torch_script,
        torch_unbuffered=torch_unbuffered,
        python=sys.executable,
    )
    for name in ("python", "python3", f"python{sys.version_info[0]}.{sys.version_info[1]}"):
        (root / "bin" / name).write_text(shim)
        (root / "bin" / name).chmod(0o755)
    _interpreters[key] = str(root / "bin" / "python3")
    return _interpreters[key]


def stop_all() -> None:
    for path in _interpreters.values():
        shutil.rmtree(pathlib.Path(path).parents[1], ignore_errors=True)
    _interpreters.clear()
    for proc, path in _servers.values():
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
        shutil.rmtree(os.path.dirname(path), ignore_errors=True)
    _servers.clear()


# ---------------------------------------------------------------- the server


def _recv_request(conn: socket.socket) -> tuple[dict, list[int]]:
    fds = array.array("i")
    data, ancdata, _, _ = conn.recvmsg(_MAX_REQUEST, socket.CMSG_LEN(3 * fds.itemsize))
    for level, kind, payload in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(payload[: len(payload) - (len(payload) % fds.itemsize)])
    chunks = [data]
    while not data.endswith(b"\n"):  # a large environment arrives in more than one read
        data = conn.recv(_MAX_REQUEST)
        if not data:
            break
        chunks.append(data)
    return json.loads(b"".join(chunks)), list(fds)


def _become_rank(request: dict, fds: list[int], base_path: list[str], imported_with: dict) -> None:
    """In the forked child: turn into the process `python -m MODULE ARGS` would have been, run it, and end as the
    interpreter ends one: exit status, threads joined, atexit handlers, streams flushed. Never returns."""
    import atexit
    import runpy
    import threading
    import traceback

    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    executable = request["env"].pop("WARM_START_EXECUTABLE", None)  # set by interpreter()'s shim
    if executable:
        sys.executable = os.path.normpath(os.path.join(request["cwd"], executable))
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2, signal.SIGQUIT, signal.SIGCHLD):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    # sys.path as a fresh `python -m` builds it: the working folder, PYTHONPATH, then the interpreter's own.
    extra = [p for p in request["env"].get("PYTHONPATH", "").split(os.pathsep) if p]
    # A script (`python path/to/x.py`, the image check's workers) has its own folder first, a module the cwd.
    script = os.path.join(request["cwd"], request["module"]) if request["module"].endswith(".py") else None
    sys.path[:] = [os.path.dirname(os.path.abspath(script)) if script else request["cwd"], *extra, *base_path]
    sys.dont_write_bytecode = bool(request["env"].get("PYTHONDONTWRITEBYTECODE"))
    run = [request["module"]] if script else ["-m", request["module"]]
    sys.orig_argv = [sys.executable, *run, *request["args"]]  # the command line a hook may log
    # As a fresh interpreter has it while site.py runs (a hook may read it): ["-m", *args] (runpy sets argv[0] to
    # the module's file later), or [script, *args].
    sys.argv = [request["module"] if script else "-m", *request["args"]]
    # site.py's last step at start-up: a sitecustomize on the path (the tests' hooks: tests/nudge, tests/stall, ...).
    sys.modules.pop("sitecustomize", None)
    finders = list(sys.meta_path)
    try:
        import sitecustomize  # noqa: F401
    except ImportError as missing:
        if missing.name != "sitecustomize":
            raise
    # An import hook sees only what is imported after it: not what the server preloaded (import_hooks.after_import
    # applies itself to those), so a rank with any other hook would run unhooked; refused instead.
    blind = [f for f in sys.meta_path if f not in finders and type(f).__module__ != "import_hooks"]
    if request.get("unbuffered"):
        sys.stdout.reconfigure(write_through=True)
        sys.stderr.reconfigure(write_through=True)
    try:
        import numpy

        numpy.random.seed()  # a fresh interpreter's global NumPy stream is seeded from the OS, not inherited
    except ImportError:
        pass
    code = 0
    try:
        if blind:
            sys.exit(
                f"warm start: a sitecustomize on this rank's PYTHONPATH added an import hook ({type(blind[0]).__name__}) "
                "that cannot see the modules the server preloaded: launch it cold (tests/helpers.py: warm=False), or "
                "hook with tests/import_hooks.after_import"
            )
        if script:
            runpy.run_path(script, run_name="__main__")
        else:
            runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
    except SystemExit as stop:  # as the interpreter reads it: None 0, an int itself, anything else printed, 1
        if stop.code is None:
            code = 0
        elif isinstance(stop.code, int):
            code = stop.code
        else:
            print(stop.code, file=sys.stderr)
            code = 1
    except KeyboardInterrupt:
        traceback.print_exc()
        code = -signal.SIGINT  # the interpreter ends by SIGINT itself
    except BaseException:  # noqa: BLE001 - the interpreter prints any uncaught exception and exits 1
        traceback.print_exc()
        code = 1
    changed = [k for k, v in imported_with.items() if os.environ.get(k) != v]
    if changed and code == 0:
        print(
            f"warm start: this rank set {', '.join(changed)}, which the framework reads at import, and the server "
            "imported it without that value: launch this run cold (tests/helpers.py: warm=False)",
            file=sys.stderr,
        )
        code = 1
    # Py_FinalizeEx's observable part, in its order: join non-daemon threads, atexit handlers, flush the streams.
    # The rest (tearing down every module) is skipped: in a fork it writes to every inherited page (copy-on-write),
    # 2-3 s per rank with PyTorch loaded, and nothing a payload does depends on it.
    threading._shutdown()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    if code < 0:
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    os._exit(code & 0xFF)


def serve(path: str, framework: str) -> None:
    import importlib

    for name in PRELOAD[framework]:
        importlib.import_module(name)
    for name in [m for m in sys.modules if m == "payloads" or m.startswith("payloads.")]:
        del sys.modules[name]
    imported_with = {k: os.environ.get(k) for k in READ_AT_IMPORT[framework]}
    # The interpreter's own path (stdlib, site-packages), without this file's folder or the server's PYTHONPATH.
    here = os.path.dirname(os.path.abspath(__file__))
    own = {os.path.abspath(p) for p in [here, *os.environ.get("PYTHONPATH", "").split(os.pathsep)] if p}
    base_path = [p for p in sys.path if p and os.path.abspath(p) not in own]
    own_namespaces = _namespaces(os.getpid())
    parent = os.getppid()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    import gc

    gc.freeze()  # the preloaded objects stay out of the children's collections: fewer copied pages
    print("ready", flush=True)

    ranks: dict[int, tuple[socket.socket, int]] = {}  # pidfd -> (client connection, child pid)
    orphaned: set[int] = set()  # pidfds whose client went away: SIGKILLed, not yet reaped
    while True:
        if os.getppid() != parent:  # the test run ended without stopping us
            for _, pid in ranks.values():
                _kill(pid)
            return
        watched = [listener, *(c for p, (c, _) in ranks.items() if p not in orphaned), *ranks.keys()]
        readable, _, _ = select.select(watched, [], [], 1.0)
        for item in readable:
            if item is listener:
                conn, _ = listener.accept()
                try:
                    request, fds = _recv_request(conn)
                except (OSError, ValueError):
                    conn.close()
                    continue
                if _namespaces(_peer_pid(conn)) != own_namespaces:
                    conn.sendall(struct.pack("!i", 0))  # the client names the fix
                    for fd in fds:
                        os.close(fd)
                    conn.close()
                    continue
                sys.stdout.flush()
                sys.stderr.flush()
                pid = os.fork()
                if pid == 0:
                    listener.close()
                    conn.close()
                    for other, _ in ranks.values():
                        other.close()
                    for pidfd in ranks:
                        os.close(pidfd)
                    _become_rank(request, fds, base_path, imported_with)
                for fd in fds:
                    os.close(fd)
                conn.sendall(struct.pack("!i", pid))
                pidfd = os.pidfd_open(pid)
                ranks[pidfd] = (conn, pid)
            elif isinstance(item, int):  # a child ended: report its status to its client
                conn, pid = ranks.pop(item)
                orphaned.discard(item)
                os.close(item)
                _, status = os.waitpid(pid, 0)
                code = os.waitstatus_to_exitcode(status)  # negative: the signal that ended it
                try:
                    conn.sendall(struct.pack("!i", code))
                except OSError:
                    pass
                conn.close()
            else:  # the client went away (killed): its rank goes too
                try:
                    gone = not item.recv(1, socket.MSG_PEEK)
                except OSError:
                    gone = True
                pidfd = next((p for p, (c, _) in ranks.items() if c is item), None)
                if gone and pidfd is not None:
                    orphaned.add(pidfd)
                    _kill(ranks[pidfd][1])


def _peer_pid(conn: socket.socket) -> int:
    pid, _, _ = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
    return pid


def _namespaces(pid: int) -> dict:
    """A rank forked here lives in the server's namespaces: a launch under `unshare` (a private tmpfs, say) would
    silently run outside its own, so a client in any other is refused."""
    found = {}
    for kind in ("mnt", "net", "pid", "ipc", "uts", "user"):
        try:
            found[kind] = os.readlink(f"/proc/{pid}/ns/{kind}")
        except OSError:
            found[kind] = None
    return found


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


if __name__ == "__main__":
    serve(sys.argv[1], sys.argv[2])
