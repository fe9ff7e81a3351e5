"""ib_write_bw per InfiniBand card (perftest), each card of a node against its loopback partner, as Azure's node
health checks measure it (azurehpc-health-checks azure_ib_write_bw_gdr.nhc).
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import threading
import time

from ..common import devices
from .expected import IB_WRITE

IB_SYSFS = devices.IB_SYSFS


IB_WRITE_BW_MESSAGE = 8388608  # Azure's ib_write_bw message (azurehpc-health-checks azure_ib_write_bw_gdr.nhc)


IB_WRITE_BW_PORT = 18510  # the ports Azure's check uses, one per card from this one


def parse_ib_write_bw(text: str, message: int = IB_WRITE_BW_MESSAGE) -> float | None:
    """'BW average[Gb/sec]' from ib_write_bw --report_gbits: the 4th column of the row of `message` bytes."""
    for line in text.splitlines():
        words = line.split()
        if len(words) >= 4 and words[0] == str(message):
            try:
                return float(words[3])
            except ValueError:
                return None
    return None


def _ib_write_bw_once(binary, device, port, gpu, host, message, wait, timeout) -> tuple[float | None, str | None]:
    common = [binary, "-p", str(port), "-s", str(message), "-x", "0", "-F", "--report_gbits", "--perform_warm_up"]
    common += [f"--use_cuda={gpu}"] if gpu is not None else []
    common += ["-d", device]
    server = subprocess.Popen(common, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(wait)  # Azure's check waits 5 s for the server to listen
        client = subprocess.run([*common, host], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, f"no result within {timeout:g} s"
    finally:
        try:
            server.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
    figure = parse_ib_write_bw(client.stdout, message)
    if client.returncode != 0 or figure is None:
        said = (client.stderr.strip() or client.stdout.strip()).splitlines()
        return None, f"ib_write_bw exited {client.returncode}: {said[-1] if said else 'no output'}"
    return figure, None


def ib_write_bw(
    devices: list[str],
    binary: str,
    repeats: int,
    gpu_memory: bool = False,
    host: str | None = None,
    message: int = IB_WRITE_BW_MESSAGE,
    wait: float = 2.0,
    timeout: float = 120.0,
) -> dict[str, dict]:
    """{card: {"gbits": [each run], "error": ...}}: perftest's ib_write_bw on each card as Azure's check runs it
    (server and client on the same card, every card at once on its own port), `repeats` times. GPU memory
    (--use_cuda, card i with GPU i, as Azure pairs them) where the binary was built with CUDA."""
    host = host or socket.gethostname()
    out = {d: {"gbits": [], "error": None} for d in devices}

    def one(i: int, dev: str) -> None:
        figure, error = _ib_write_bw_once(
            binary, dev, IB_WRITE_BW_PORT + i, i if gpu_memory else None, host, message, wait, timeout
        )
        if figure is None:
            out[dev]["error"] = out[dev]["error"] or error
        else:
            out[dev]["gbits"].append(figure)

    for _ in range(repeats):
        threads = [threading.Thread(target=one, args=(i, d)) for i, d in enumerate(devices)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    return out


def ib_card_check(repeats: int, gpu: bool) -> dict:
    """This node's ib_write_bw record, or why it was skipped."""
    cards = devices.infiniband_cards(IB_SYSFS)
    if not cards:
        return {"check": IB_WRITE, "skipped": f"no InfiniBand devices in {IB_SYSFS}"}
    binary = shutil.which("ib_write_bw")
    if binary is None:
        return {
            "check": IB_WRITE,
            "skipped": "the image has no ib_write_bw (perftest; Ubuntu's package perftest)",
            "cards": cards,
        }
    help_text = subprocess.run([binary, "--help"], capture_output=True, text=True).stdout
    gpu_memory = gpu and "use_cuda" in help_text
    return {
        "check": IB_WRITE,
        "memory": "gpu" if gpu_memory else "host",
        "cards": ib_write_bw(cards, binary, repeats, gpu_memory),
    }
