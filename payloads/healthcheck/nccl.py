"""What NCCL chose on each node of an InfiniBand size, read from its own INFO log: the InfiniBand cards it uses
(its "NET/IB : Using [0]mlx5_ib0:1/IB ..." line) and whether each channel between nodes goes GPU to card directly
(GPUDirect RDMA: "via NET/IB/<card>/GDRDMA"). A node passes when NCCL uses every InfiniBand card the node has
(devices.infiniband_cards, the cards NCCL_IB_HCA names) and GPUDirect RDMA on every network channel; NCCL falling
back to sockets, a card left out or a channel through host memory fails it: each trains, slower than the node can.

The log: NCCL_DEBUG=INFO with NCCL_DEBUG_SUBSYS=INIT,NET into one file per process (NCCL_DEBUG_FILE, whose %h and
%p NCCL replaces with the host name and the process id), set before NCCL starts, on InfiniBand sizes only (the
launcher's NCCL_IB_DISABLE=0).
"""

from __future__ import annotations

import os
import pathlib
import re

USING_IB = re.compile(r"NET/IB ?: Using (.*?)(?:;|$)", re.M)
CARD = re.compile(r"\[\d+\]([\w.-]+?):\d+/(?:IB|RoCE)")
CHANNEL = re.compile(r"via NET/(IB|Socket)/(\d+)(?:\(\d+\))?(/GDRDMA)?")
USING_SOCKET = re.compile(r"NET/Socket ?: Using")
FILE = "nccl.%h.%p.log"


def log_to(folder: pathlib.Path, environ=None) -> bool:
    """Have NCCL write its INFO log of start-up and network into `folder`, one file per process, on an InfiniBand size;
    whether it will."""
    environ = os.environ if environ is None else environ
    if environ.get("NCCL_IB_DISABLE") != "0":
        return False
    folder.mkdir(parents=True, exist_ok=True)
    environ.update(NCCL_DEBUG="INFO", NCCL_DEBUG_SUBSYS="INIT,NET", NCCL_DEBUG_FILE=str(folder / FILE))
    return True


def read(text: str) -> dict:
    """What one process's log says: the cards NCCL's IB transport uses, its network channels and how many of those
    are GPUDirect RDMA, and whether it fell back to sockets."""
    cards = sorted({c for line in USING_IB.findall(text) for c in CARD.findall(line)})
    channels = CHANNEL.findall(text)
    return {
        "cards": cards,
        "channels": len(channels),
        "gdr": sum(1 for kind, _, gdr in channels if kind == "IB" and gdr),
        "socket": bool(USING_SOCKET.search(text)) or any(kind == "Socket" for kind, _, _ in channels),
    }


def seen(folder: pathlib.Path, pid: int | None = None) -> dict | None:
    """This process's log, read; None where NCCL wrote none (no NCCL collective ran, or no log was asked for)."""
    pid = os.getpid() if pid is None else pid
    texts = [p.read_text(errors="replace") for p in sorted(folder.glob(f"nccl.*.{pid}.log"))]
    return read("\n".join(texts)) if texts else None


def judge(host: str, logs: list[dict | None], cards: list[str], across_nodes: bool) -> tuple[str, str | None]:
    """(the line for this node, its failure or None) from its processes' logs and its InfiniBand cards; the network
    channels are judged when the job spans nodes (one node's collectives stay on NVLink)."""
    logs = [log for log in logs if log]
    if not logs:
        return f"node {host}: NCCL's network choice not read (no NCCL log: not an InfiniBand size or no GPU)", None
    used = sorted({c for log in logs for c in log["cards"]})
    channels, gdr = sum(log["channels"] for log in logs), sum(log["gdr"] for log in logs)
    line = (
        f"node {host}: NCCL uses {len(used)} of its {len(cards)} InfiniBand cards ({', '.join(used) or 'none'}), "
        f"GPUDirect RDMA on {gdr} of {channels} network channels"
    )
    problems = []
    if any(log["socket"] for log in logs):
        problems.append("NCCL fell back to TCP sockets")
    missing = sorted(set(cards) - set(used))
    if missing:
        problems.append(f"NCCL does not use {', '.join(missing)}")
    if channels and gdr < channels:
        problems.append(f"{channels - gdr} network channel(s) go through host memory, not GPUDirect RDMA")
    if across_nodes and not channels:
        problems.append("no network channel was opened (the all-reduce across nodes never reached NCCL's network)")
    return line, ("; ".join(problems) or None)
