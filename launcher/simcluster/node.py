"""One simulated node's holder: the process whose namespaces the node's other processes enter (nsenter).

Started by cluster.py as `ip netns exec <node's network namespace> unshare --uts --mount --propagation private
python -m launcher.simcluster.node SPEC`: it gives its UTS namespace the node's hostname and its mount namespace
what an Azure ML node has of its own (a tmpfs /tmp and /dev/shm of the job's size, /etc/hosts naming the
cluster's nodes, on InfiniBand sizes a /sys/class/infiniband shaped like an ND H100 v5's), binds the job's shared
folders (its inputs and outputs, Azure ML's mounts) back over the private /tmp, then serves the instance metadata
endpoint at 169.254.169.254:80 inside the node until it is killed. It writes `ready` in its state folder last.

Nothing here is special to the payloads: they read the hostname, sysfs and IMDS as on a VM.
"""

from __future__ import annotations

import http.server
import json
import os
import pathlib
import socket
import subprocess
import sys

IMDS_ADDRESS = "169.254.169.254"
# An ND H100 v5's RDMA devices as Azure's HPC images name them (Azure/azhpc-images
# install_azure_persistent_rdma_naming.sh): eight InfiniBand cards and the accelerated-networking NIC.
IB_CARDS = {**{f"mlx5_ib{i}": "InfiniBand" for i in range(8)}, "mlx5_an0": "Ethernet"}


def _mount(*args: str) -> None:
    subprocess.run(["mount", *args], check=True)


def _bind(source: pathlib.Path | str, target: pathlib.Path | str) -> None:
    _mount("--bind", str(source), str(target))


def set_up(spec: dict) -> None:
    state = pathlib.Path(spec["state"])
    socket.sethostname(spec["hostname"])
    stage = state / "stage"
    hidden = [pathlib.Path(p) for p in spec["shared"] if p.startswith(("/tmp", "/dev/shm"))]
    for i, path in enumerate(hidden):  # keep a way to the shared folders that the private /tmp will cover
        (stage / str(i)).mkdir(parents=True, exist_ok=True)
        path.mkdir(parents=True, exist_ok=True)  # an output folder the job has not made yet
        _bind(path, stage / str(i))
    _mount("-t", "tmpfs", "-o", f"size={spec['tmp_bytes']},mode=1777", "tmpfs", "/tmp")
    _mount("-t", "tmpfs", "-o", f"size={spec['shm_bytes']},mode=1777", "tmpfs", "/dev/shm")
    for i, path in enumerate(hidden):
        path.mkdir(parents=True, exist_ok=True)
        _bind(stage / str(i), path)
    hosts = state / "hosts"
    hosts.write_text(
        "127.0.0.1 localhost\n" + "".join(f"{address} {name}\n" for name, address in spec["hosts"].items())
    )
    _bind(hosts, "/etc/hosts")
    (state / "hostname").write_text(spec["hostname"] + "\n")
    _bind(state / "hostname", "/etc/hostname")
    if spec["infiniband"]:
        _fake_infiniband(stage)


def _fake_infiniband(stage: pathlib.Path) -> None:
    """/sys/class as it is, plus infiniband/: a tmpfs over /sys/class with each real class bound back into it."""
    real = stage / "sysclass"
    real.mkdir(parents=True, exist_ok=True)
    _bind("/sys/class", real)
    _mount("-t", "tmpfs", "tmpfs", "/sys/class")
    for entry in sorted(real.iterdir()):
        (pathlib.Path("/sys/class") / entry.name).mkdir()
        _bind(entry, pathlib.Path("/sys/class") / entry.name)
    for card, layer in IB_CARDS.items():
        port = pathlib.Path("/sys/class/infiniband") / card / "ports" / "1"
        port.mkdir(parents=True)
        (port / "link_layer").write_text(layer + "\n")
        (port / "state").write_text("4: ACTIVE\n")
        (port / "rate").write_text("400 Gb/sec (4X NDR)\n" if layer == "InfiniBand" else "200 Gb/sec (4X HDR)\n")


class Metadata(http.server.BaseHTTPRequestHandler):
    """Azure's instance metadata service as the payloads read it: the VM's name and its Scheduled Events, which
    cluster.post_event() writes into this node's state folder (scheduledevents.json). Like IMDS it answers only
    requests with `Metadata: true` and refuses proxied ones (X-Forwarded-For)."""

    spec: dict = {}

    def log_message(self, *args) -> None:  # a node's metadata service logs nothing into the job's output
        pass

    def _answer(self, code: int, body: bytes, kind: str = "application/json") -> None:
        self.send_response(code)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        if self.headers.get("Metadata") != "true" or self.headers.get("X-Forwarded-For"):
            return self._answer(400, b'{"error": "Bad request: Metadata header required, no proxy"}')
        state = pathlib.Path(self.spec["state"])
        path = self.path.split("?")[0]
        if path == "/metadata/instance/compute/name":
            return self._answer(200, self.spec["vm_name"].encode(), "text/plain")
        if path == "/metadata/scheduledevents":
            try:
                body = (state / "scheduledevents.json").read_bytes()
            except FileNotFoundError:
                body = json.dumps({"DocumentIncarnation": 0, "Events": []}).encode()
            return self._answer(200, body)
        self._answer(404, b'{"error": "not found"}')

    def do_POST(self) -> None:  # approving an event (StartRequests): accepted, nothing else simulated
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self._answer(200, b"")


def main(spec_path: str) -> None:
    spec = json.loads(pathlib.Path(spec_path).read_text())
    set_up(spec)
    Metadata.spec = spec
    server = http.server.ThreadingHTTPServer((IMDS_ADDRESS, 80), Metadata)
    (pathlib.Path(spec["state"]) / "ready").write_text(str(os.getpid()))
    server.serve_forever()


if __name__ == "__main__":
    main(sys.argv[1])
