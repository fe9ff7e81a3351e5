"""One rank of a warm-started test launch (tests/warm_start.py): `python -S warm_client.py SOCKET MODULE ARGS...`.

Hands this process's argv, environment, working folder and stdin/stdout/stderr to the warm start server, which forks
the rank; forwards the signals this process receives to it; exits with its status, or by the signal that ended it.
Standard library only, started with -S: it must cost a launcher nothing.
"""

import array
import json
import os
import signal
import socket
import struct
import sys

FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)


def _recv_int(conn: socket.socket) -> int:
    data = b""
    while len(data) < 4:
        chunk = conn.recv(4 - len(data))
        if not chunk:
            sys.exit("warm start: the server closed the connection before the rank's status")
        data += chunk
    return struct.unpack("!i", data)[0]


def main() -> None:
    path, module, *args = sys.argv[1:]
    request = {
        "module": module,
        "args": args,
        "env": dict(os.environ),
        "cwd": os.getcwd(),
        "unbuffered": sys.stdout.write_through,  # -u or PYTHONUNBUFFERED
    }
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.connect(path)
    # Signals arriving before the child exists are held, then delivered to it.
    pending: list[int] = []
    child = {"pid": None}

    def forward(sig, _frame):
        if child["pid"] is None:
            pending.append(sig)
        else:
            try:
                os.kill(child["pid"], sig)
            except ProcessLookupError:
                pass

    for sig in FORWARDED:
        signal.signal(sig, forward)
    conn.sendmsg(
        [json.dumps(request).encode() + b"\n"],
        [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [0, 1, 2]))],
    )
    child["pid"] = _recv_int(conn)
    if child["pid"] == 0:
        sys.exit(
            "warm start: this rank runs in other namespaces than the warm start server (a launch under unshare?), "
            "where a forked rank would not see its mounts: launch it cold (tests/helpers.py: warm=False)"
        )
    for sig in pending:
        os.kill(child["pid"], sig)
    code = _recv_int(conn)
    if code < 0:
        if -code in FORWARDED:
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    sys.exit(code)


if __name__ == "__main__":
    main()
