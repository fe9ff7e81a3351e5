"""Cluster health check: Horovod's allreduce (correctness and bandwidth), each node judged against what its VM
size should deliver, then a few real training steps.

    horovodrun -np 2 -H localhost:2 --gloo python -m payloads.healthcheck --sizes-mb 1,8

Allreduce: each rank fills a tensor with its rank + 1 and sums it; every element must equal size(size+1)/2,
so a broken link or a misconfigured transport fails loudly instead of training slowly or wrongly. Bus
bandwidth uses NCCL-tests' definition for allreduce: bytes x 2(n-1)/n / time. The largest size's bus
bandwidth is judged against the floor of the cluster's VM size (the launcher sets it from the catalog,
HEALTHCHECK_MIN_BUSBW_GBYTES_PER_SEC) or --min-busbw. Every node's driver, CUDA, NCCL versions and
InfiniBand devices are printed and written to the report.

Nodes: each node is judged on its own, against the figures Azure's node health checks publish for its VM size
(Azure/azurehpc-health-checks conf/<size>.conf; the launcher passes them from the VM-size catalog in
HEALTHCHECK_EXPECTED, --expect overrides): the all-reduce among the node's own processes (NVLink on the ND
sizes), the all-reduce across nodes over InfiniBand (nodes paired in rounds, process i of one node with process
i of the other, so that each pair's traffic crosses one IB card of each), and ib_write_bw per InfiniBand card
where the image has perftest. Each figure is the median of --iterations timed runs at the largest message
size, which by default is the one Azure measures at (8 or 16 GiB). Rank 0 prints one verdict per node (host,
private IP, each figure against its expected value, PASS or FAIL) and exits 1 if any node fails; the launcher
adds each node's Azure ML node id (launcher/nodes.py).

Training: every rank takes --train-steps steps of the PyTorch payload's own loop (payloads/pytorch/loop.py: its
set-up, fused SGD, loss scaler, mixed precision and memory format for this device), on synthetic batches that
differ per rank, with one mid-epoch checkpoint written halfway and restored by a fresh run, as a resumed job
does; the ranks compare their parameters bitwise at the save and at the end. A
stack that fails a training job (an image whose Python breaks torch._dynamo, which the optimizer imports; a
Horovod that refuses channels_last tensors) fails here, in the part named: import, step or agreement.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import pathlib
import shutil
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
import traceback

from .common import devices
from .common.errors import ConfigError
from .common.metrics import say

MIN_BUSBW = "HEALTHCHECK_MIN_BUSBW_GBYTES_PER_SEC"
# What each node should deliver, set by the launcher from the VM-size catalog (launcher/interconnect.py):
# "check=value[@message_bytes][/processes],..." (e.g. allreduce_in_node=460@17179869184/8,ib_write_bw=380@8388608).
EXPECTED = "HEALTHCHECK_EXPECTED"
IN_NODE, OVER_IB, IB_WRITE = "allreduce_in_node", "allreduce_over_ib", "ib_write_bw"
NODE_CHECKS = (IN_NODE, OVER_IB, IB_WRITE)
UNITS = {IN_NODE: "GB/s", OVER_IB: "GB/s", IB_WRITE: "Gb/s"}
TITLES = {
    IN_NODE: "all-reduce in the node",
    OVER_IB: "all-reduce across nodes over InfiniBand",
    IB_WRITE: "ib_write_bw per InfiniBand card",
}
PASS, FAIL, NOT_JUDGED, SKIPPED = "PASS", "FAIL", "NOT JUDGED", "SKIPPED"
IB_SYSFS = pathlib.Path("/sys/class/infiniband")
IB_WRITE_BW_MESSAGE = 8388608  # Azure's ib_write_bw message (azurehpc-health-checks azure_ib_write_bw_gdr.nhc)
IB_WRITE_BW_PORT = 18510  # the ports Azure's check uses, one per card from this one
# The node's private IP (what Azure ML's node list matches it by): eth0, the interface the launcher names
# for every collective (launcher/interconnect.py).
INTERFACE = "eth0"
# Hyper-V's key-value pool from the host (Azure writes PhysicalHostName there; Azure's kvp_client reads the
# same pool): what Azure support asks for when a node is reported. Absent in most containers.
KVP_POOL = pathlib.Path("/var/lib/hyperv/.kvp_pool_3")
# Conv models of payloads/pytorch/models.py (channels_last only changes conv layers); the torchvision ones
# are built the way the payload builds them, so torchvision's import is checked too.
MODELS = ("resnet18", "resnet34", "resnet50", "mobilenet_v3_small", "mobilenet_v3_large", "tiny_cnn")
NUM_CLASSES = 10
PARTS = ("import", "step", "agreement")
# What horovod.torch raises on a rank whose broadcast meets a rank that has joined (hvd.join after its failure).
JOINED = "is not supported with Join"


def _floor(text: str | None, source: str) -> float | None:
    if text in (None, ""):
        return None
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if value <= 0:
        raise ConfigError(f"{source} {text!r}: a bus bandwidth floor in GB/s, a positive number like 20")
    return value


def parse_expected(text: str, source: str) -> dict[str, dict]:
    """{check: {value, unit, message_bytes, processes, source}} from "check=value[@bytes][/processes],..."."""
    out = {}
    for item in (x.strip() for x in text.split(",")):
        if not item:
            continue
        check, sep, rest = item.partition("=")
        figure, _, processes = rest.partition("/")
        value, _, size = figure.partition("@")
        try:
            entry = {
                "value": float(value),
                "unit": UNITS[check],
                "message_bytes": int(size) if size else None,
                "processes": int(processes) if processes else None,
                "source": source,
            }
        except (KeyError, ValueError):
            entry = None
        if not sep or entry is None or entry["value"] <= 0:
            raise ConfigError(
                f"{source}: {item!r} is not CHECK=VALUE[@MESSAGE_BYTES][/PROCESSES] with CHECK one of "
                f"{', '.join(NODE_CHECKS)} and VALUE in its unit (GB/s, Gb/s for ib_write_bw), e.g. "
                "allreduce_over_ib=18"
            )
        out[check] = entry
    return out


def parse(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--sizes-mb",
        default=None,
        help="comma-separated tensor sizes in MB (default: 8 MiB up to the message size Azure judges the VM "
        "size at, x4 apart; 8,32,128,256 where the catalog has none)",
    )
    ap.add_argument("--iterations", type=int, default=10, help="timed runs per size; figures are their median")
    ap.add_argument(
        "--min-busbw",
        default=None,
        metavar="GB_PER_SEC",
        help=f"fail below this bus bandwidth at the largest size (default: ${MIN_BUSBW}, set by "
        "the launcher from the VM-size catalog; none: reported, not judged)",
    )
    ap.add_argument(
        "--expect",
        action="append",
        default=[],
        metavar="CHECK=VALUE",
        help=f"a node check's expected figure ({', '.join(NODE_CHECKS)}; GB/s, Gb/s for ib_write_bw), over "
        f"${EXPECTED}, which the launcher sets from the VM-size catalog",
    )
    ap.add_argument(
        "--ib-repeats", type=int, default=3, help="ib_write_bw runs per InfiniBand card; the median is judged"
    )
    ap.add_argument("--output", type=pathlib.Path, default=None, help="rank 0 writes the JSON report here")
    t = ap.add_argument_group("training steps")
    t.add_argument("--train-steps", type=int, default=5, help="optimizer steps each rank takes")
    t.add_argument("--model", default="resnet18", help=f"one of {', '.join(MODELS)}")
    t.add_argument("--image-size", type=int, default=64)
    t.add_argument("--batch-size", type=int, default=8, help="per process")
    t.add_argument(
        "--amp",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="mixed precision (default: on with a GPU, as the PyTorch payload; --amp on a CPU runs bf16)",
    )
    t.add_argument(
        "--amp-dtype",
        default="auto",
        choices=("auto", "bf16", "fp16"),
        help="auto: fp16 with a loss scaler on GPUs, bf16 on CPUs (the training payload's choice)",
    )
    t.add_argument(
        "--channels-last",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="channels_last model and images (default: on with a GPU, as the PyTorch payload)",
    )
    args = ap.parse_args(argv)
    if args.sizes_mb is not None:
        try:
            args.sizes = [float(s) for s in args.sizes_mb.split(",")]
        except ValueError:
            raise ConfigError(f"--sizes-mb takes numbers like 8,32,128, got {args.sizes_mb!r}") from None
        if not args.sizes or min(args.sizes) <= 0:
            raise ConfigError(f"--sizes-mb takes positive sizes like 8,32,128, got {args.sizes_mb!r}")
    if args.iterations < 1:
        raise ConfigError(f"--iterations {args.iterations}: at least 1")
    if args.ib_repeats < 1:
        raise ConfigError(f"--ib-repeats {args.ib_repeats}: at least 1")
    vm = os.environ.get("TRAINING_VM_SIZE") or "this VM size"
    args.expected = parse_expected(os.environ.get(EXPECTED, ""), f"{EXPECTED} (the VM-size catalog's figures for {vm})")
    for item in args.expect:
        args.expected.update(parse_expected(item, "--expect"))
    args.sizes_bytes = message_sizes(args.sizes if args.sizes_mb is not None else None, args.expected)
    if args.train_steps < 1:
        raise ConfigError(f"--train-steps {args.train_steps}: at least 1 (the optimizer step is what is checked)")
    if args.model not in MODELS:
        raise ConfigError(f"--model {args.model!r}: choose one of {', '.join(MODELS)}")
    if args.image_size < 16:
        raise ConfigError(f"--image-size {args.image_size}: at least 16 pixels")
    if args.batch_size < 2:
        # batch norm in training mode needs 2 values per channel once a ResNet has pooled the image to 1x1
        raise ConfigError(f"--batch-size {args.batch_size}: at least 2 per process (batch norm needs 2 samples)")
    if args.min_busbw is not None:
        args.floor = _floor(args.min_busbw, "--min-busbw")
    else:
        args.floor = _floor(os.environ.get(MIN_BUSBW), MIN_BUSBW)
    return args


# Where a job writes on a node: the container's root and temporary folder (the decoded cache's default home),
# shared memory (the loaders' batches), and Azure's local NVMe or resource disk where the node has one.
DISK_PLACES = ("/", tempfile.gettempdir(), "/dev/shm", "/mnt", "/mnt/resource", "/mnt/nvme")


def disks(places=DISK_PLACES) -> list[dict]:
    """Free and total space of each place that exists, one entry per file system (the first place naming it)."""
    seen, found = set(), []
    for place in places:
        try:
            device = os.stat(place).st_dev
            usage = shutil.disk_usage(place)
        except OSError:
            continue
        if device in seen:
            continue
        seen.add(device)
        found.append(
            {"path": place, "free_gbytes": round(usage.free / 1e9, 1), "total_gbytes": round(usage.total / 1e9, 1)}
        )
    return found


def disks_line(entries: list[dict]) -> str:
    return ", ".join(f"{d['path']} {d['free_gbytes']:g} of {d['total_gbytes']:g} GB free" for d in entries) or "none"


def node_facts(torch) -> dict:
    """What this process sees of its node: versions ('none' where absent), InfiniBand devices and disks."""
    gpu = torch.cuda.is_available()
    nccl = "none"
    if gpu:
        v = torch.cuda.nccl.version()
        nccl = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
    ib = pathlib.Path("/sys/class/infiniband")
    # The CUDA torch was built for, against the host's driver (whether or not torch sees a GPU with it).
    driver = devices.driver_version()
    problem = devices.mismatch(driver, torch.version.cuda, os.environ.get(devices.FORWARD_COMPAT) or None)
    return {
        "host": socket.gethostname(),
        "private_ip": private_ip(),
        "physical_host": physical_host(),
        "driver": driver or "none",
        "driver_mismatch": problem,
        "cuda": (torch.version.cuda or "none") if gpu else "none",
        "nccl": nccl,
        "gpus_visible": torch.cuda.device_count() if gpu else 0,
        "infiniband_devices": sorted(p.name for p in ib.iterdir()) if ib.is_dir() else [],
        "disks": disks(),
    }


def private_ip(interface: str = INTERFACE) -> str | None:
    """The node's address on `interface` (SIOCGIFADDR), else the source address of its default route; None
    if neither answers."""
    import fcntl

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            packed = fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", interface.encode()[:15]))  # SIOCGIFADDR
            return socket.inet_ntoa(packed[20:24])
        except OSError:
            pass
        try:
            s.connect(("168.63.129.16", 80))  # Azure's host address; a UDP connect sends nothing
            return s.getsockname()[0]
        except OSError:
            return None


def physical_host(pool: pathlib.Path = KVP_POOL) -> str | None:
    """PhysicalHostName from Hyper-V's key-value pool (records of a 512-byte key and a 2048-byte value)."""
    try:
        data = pool.read_bytes()
    except OSError:
        return None
    for offset in range(0, len(data) - 2559, 2560):
        key = data[offset : offset + 512].split(b"\0", 1)[0]
        if key == b"PhysicalHostName":
            return data[offset + 512 : offset + 2560].split(b"\0", 1)[0].decode(errors="replace") or None
    return None


def message_sizes(sizes_mb: list[float] | None, expected: dict) -> list[int]:
    """Message sizes in bytes: --sizes-mb as given; else 8 MiB, x4, up to the largest size Azure judges this VM
    size's all-reduces at (where NCCL reaches full speed); else 8, 32, 128 and 256 MB."""
    if sizes_mb is not None:
        return [int(mb * 1e6) for mb in sizes_mb]
    top = max((e["message_bytes"] or 0 for c, e in expected.items() if c != IB_WRITE), default=0)
    if not top:
        return [int(mb * 1e6) for mb in (8, 32, 128, 256)]
    sizes, size = [], 8 * 2**20
    while size < top:
        sizes.append(size)
        size *= 4
    return sizes + [top]


def size_text(nbytes: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20)):
        if nbytes >= scale and nbytes % scale == 0:
            return f"{nbytes // scale} {unit}"
    return f"{nbytes / 1e6:g} MB"


def busbw(nbytes: int, processes: int, seconds: float) -> float:
    """NCCL-tests' bus bandwidth of an all-reduce, GB/s: bytes x 2(n-1)/n / time."""
    return nbytes * 2 * (processes - 1) / processes / seconds / 1e9 if processes > 1 and seconds > 0 else 0.0


def time_allreduce(hvd, torch, device, nbytes: int, iterations: int, name: str, members, process_set=None):
    """(seconds of each timed all-reduce, whether the sums were right) on this rank. Each rank contributes its
    rank + 1, so every element must come back as the sum of that over `members`."""
    kw = {} if process_set is None else {"process_set": process_set}
    t = torch.full((nbytes // 4,), float(hvd.rank() + 1), device=device)
    out = hvd.allreduce(t, op=hvd.Sum, name=f"{name}.warmup", **kw)  # first call negotiates and allocates
    times = []
    for _ in range(iterations):
        out = None  # the last result freed first: at 16 GiB, input and one result are 32 GiB of the GPU
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        out = hvd.allreduce(t, op=hvd.Sum, name=name, **kw)
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    expected = float(sum(r + 1 for r in members))
    return times, bool(torch.all(out == expected).item())


def measure(hvd, torch, device, sizes: list[int], iterations: int) -> list[dict]:
    """The all-reduce across every process of the job, per size; judged by `judge` against the floor."""
    n = hvd.size()
    results = []
    for nbytes in sizes:
        times, correct = time_allreduce(hvd, torch, device, nbytes, iterations, f"size{nbytes}", range(n))
        median = statistics.median(times)
        results.append(
            {
                "mbytes": nbytes / 1e6,
                "best_seconds": min(times),
                "median_seconds": median,
                "bus_gbytes_per_sec": busbw(nbytes, n, median),
                "correct": correct,
            }
        )
    return results


def judge(results: list[dict], processes: int, floor: float | None) -> tuple[dict, list[str]]:
    """(bandwidth verdict, failures). The largest size is judged (the closest to the link's peak), on the
    median of its timed runs."""
    failures = [f"wrong sum at {r['mbytes']:g} MB on some rank" for r in results if not r["correct"]]
    largest = max(results, key=lambda r: r["mbytes"])
    verdict = {
        "min_busbw_gbytes_per_sec": floor,
        "judged_mbytes": largest["mbytes"],
        "busbw_gbytes_per_sec": largest["bus_gbytes_per_sec"],
        "judged": False,
        "ok": None,
    }
    if floor is None or processes < 2:
        return verdict, failures
    verdict.update(judged=True, ok=largest["bus_gbytes_per_sec"] >= floor)
    if not verdict["ok"]:
        failures.append(
            f"bus bandwidth {largest['bus_gbytes_per_sec']:.2f} GB/s at {largest['mbytes']:g} MB is below the "
            f"floor of {floor:g} GB/s: the fabric is slower than this VM size delivers healthy. Likely: NCCL "
            "is not using InfiniBand (run with NCCL_DEBUG=INFO and look for 'NET/IB'), a degraded link or GPU "
            "on one node (the node verdicts above name it; docs/health-check.md#a-bad-node), or too small a "
            "--sizes-mb to reach the link's speed"
        )
    return verdict, failures


# ---- node checks: each node against its VM size's figures ----------------------------------------------------


def node_groups(hosts: list[str]) -> list[tuple[str, list[int]]]:
    """[(host, its ranks)] in the order of each host's first rank."""
    groups: dict[str, list[int]] = {}
    for rank, host in enumerate(hosts):
        groups.setdefault(host, []).append(rank)
    return list(groups.items())


def pair_rounds(nodes: int) -> list[list[tuple[int, int]]]:
    """The ring of nodes 0-1, 1-2, ..., (n-1)-0 as rounds of pairs no node is in twice, so that a round runs
    all its pairs at once. Every node is in two pairs (one with 2 nodes): a node whose every pair is slow is
    the slow one; a healthy node's other pair clears it."""
    edges = [(0, 1)] if nodes == 2 else [(i, (i + 1) % nodes) for i in range(nodes)] if nodes > 2 else []
    rounds: list[list[tuple[int, int]]] = []
    for a, b in edges:
        for r in rounds:
            if all(a not in e and b not in e for e in r):
                r.append((a, b))
                break
        else:
            rounds.append([(a, b)])
    return rounds


def _process_set(hvd, ranks: list[int]):
    """(process set, whether it was added here). Every rank must call this for every set, in the same order."""
    if sorted(ranks) == list(range(hvd.size())):
        return hvd.global_process_set, False  # Horovod refuses a duplicate of the global set
    return hvd.add_process_set(ranks), True


def _measure_sets(hvd, torch, device, sets: list[dict], sizes: list[int], iterations: int) -> list[dict]:
    """Register every set, measure the one(s) this rank is in (all sets at once), remove them again."""
    handles = [_process_set(hvd, s["ranks"]) for s in sets]
    records = []
    try:
        for s, (ps, _) in zip(sets, handles):
            if hvd.rank() not in s["ranks"]:
                continue
            for nbytes in sizes:
                name = f"{s['check']}.{'-'.join(map(str, s['ranks']))}.{nbytes}"
                times, correct = time_allreduce(hvd, torch, device, nbytes, iterations, name, s["ranks"], ps)
                records.append({**s, "bytes": nbytes, "seconds": times, "correct": correct})
    finally:
        for ps, added in handles:
            if added:
                hvd.remove_process_set(ps)
    return records


def allreduce_checks(hvd, torch, device, hosts: list[str], sizes: list[int], iterations: int) -> list[dict]:
    """This rank's timed all-reduces: in its node (every node with 2+ processes at once), then over
    InfiniBand in rounds of node pairs, where process i of one node is paired with process i of the other."""
    nodes = node_groups(hosts)
    in_node = [{"check": IN_NODE, "ranks": ranks, "node": host} for host, ranks in nodes if len(ranks) > 1]
    records = _measure_sets(hvd, torch, device, in_node, sizes, iterations)
    for pairs in pair_rounds(len(nodes)):
        sets = []
        for a, b in pairs:
            (ha, ra), (hb, rb) = nodes[a], nodes[b]
            sets += [
                {"check": OVER_IB, "ranks": [ra[i], rb[i]], "nodes": [ha, hb], "local_index": i}
                for i in range(min(len(ra), len(rb)))
            ]
        records += _measure_sets(hvd, torch, device, sets, sizes, iterations)
    return records


def ib_cards(sysfs: pathlib.Path = IB_SYSFS) -> list[str]:
    """InfiniBand devices whose port 1 runs the InfiniBand link layer, as Azure's checks pick them (an ND H200
    v5's mlx5_an0 is the Ethernet NIC and is left out)."""
    if not sysfs.is_dir():
        return []
    found = []
    for dev in sorted(p.name for p in sysfs.iterdir()):
        try:
            if (sysfs / dev / "ports" / "1" / "link_layer").read_text().strip() == "InfiniBand":
                found.append(dev)
        except OSError:
            continue
    return found


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
    cards = ib_cards(IB_SYSFS)
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


def _combined(records: list[dict]) -> dict:
    """{(check, ranks, bytes): (per-run seconds of the slowest rank, all sums right)}: a collective ends when
    its last rank does."""
    out: dict = {}
    for r in records:
        key = (r["check"], tuple(r["ranks"]), r["bytes"])
        seconds, correct = out.get(key, ([0.0] * len(r["seconds"]), True))
        out[key] = ([max(a, b) for a, b in zip(seconds, r["seconds"])], correct and r["correct"])
    return out


def _verdict(check: str, figure: float | None, expected: dict | None, why_not: str | None = None) -> dict:
    v = {"check": check, "figure": figure, "unit": UNITS[check], "expected": None, "source": None}
    if expected is not None:
        v.update(expected=expected["value"], source=expected["source"])
    if why_not:
        v.update(status=NOT_JUDGED, reason=why_not)
    elif expected is None:
        v.update(status=NOT_JUDGED, reason="no expected figure for this VM size")
    elif figure is None:
        v.update(status=FAIL, reason="nothing measured")
    else:
        v.update(status=PASS if figure >= expected["value"] else FAIL, reason=None)
    return v


def _at_largest(check, curve, expected, extra: str = "") -> dict:
    """Judge the largest size measured; Azure's figure holds only at the message size it was measured at."""
    top = max(curve, key=lambda c: c["bytes"])
    why = None
    if expected and expected.get("message_bytes") and top["bytes"] < expected["message_bytes"]:
        why = (
            f"measured up to {size_text(top['bytes'])}; the expected figure is at "
            f"{size_text(expected['message_bytes'])} (leave --sizes-mb out)"
        )
    v = _verdict(check, top["busbw"], expected, why)
    if not all(c["correct"] for c in curve):
        v.update(status=FAIL, reason="wrong sums: a GPU, its link or NCCL corrupts data")
    v.update(at_bytes=top["bytes"], sizes=curve)
    if extra and v["status"] == FAIL:
        v["reason"] = "; ".join(x for x in (v.get("reason"), extra) if x)
    return v


def judge_nodes(facts: list[dict], records: list[dict], cards: list[dict], expected: dict) -> list[dict]:
    """One verdict per node from every rank's facts and measurements (the same code on CPUs and GPUs):
    {host, private_ip, physical_host, ranks, checks: {check: {status, figure, unit, expected, source, reason,
    ...}}, verdict}. A figure is the median of the timed runs, each timed at its slowest rank."""
    hosts = [f["host"] for f in facts]
    nodes = node_groups(hosts)
    runs = _combined(records)
    figures = {k: (busbw(k[2], len(k[1]), statistics.median(sec)), ok) for k, (sec, ok) in runs.items()}
    by_host = {c["host"]: c for c in cards}
    out = []
    for host, ranks in nodes:
        checks = {}
        # in the node
        exp = expected.get(IN_NODE)
        mine = sorted((k[2], f, ok) for k, (f, ok) in figures.items() if k[0] == IN_NODE and list(k[1]) == ranks)
        if len(ranks) < 2:
            checks[IN_NODE] = _verdict(IN_NODE, None, exp, "one process on this node: nothing to all-reduce with")
        elif not mine:
            checks[IN_NODE] = _verdict(IN_NODE, None, exp, None)
        else:
            curve = [{"bytes": b, "busbw": f, "correct": ok} for b, f, ok in mine]
            v = _at_largest(IN_NODE, curve, exp)
            if exp and exp.get("processes") and exp["processes"] != len(ranks) and v["status"] != FAIL:
                v.update(
                    status=NOT_JUDGED,
                    reason=f"the expected figure is for {exp['processes']} processes (one per GPU); this node "
                    f"ran {len(ranks)}",
                )
            checks[IN_NODE] = v
        # over InfiniBand: each card (process index) by its best pair, the node by its weakest card
        exp = expected.get(OVER_IB)
        mine = [r for r in records if r["check"] == OVER_IB and host in r["nodes"]]
        if len(nodes) < 2:
            checks[OVER_IB] = _verdict(OVER_IB, None, exp, "one node: no other node to pair with")
        elif not mine:
            checks[OVER_IB] = _verdict(OVER_IB, None, exp, "no process of this node had a partner")
        else:
            curve = []
            for nbytes in sorted({r["bytes"] for r in mine}):
                best: dict[int, tuple[float, str]] = {}  # process index -> (its best pair's figure, partner)
                correct = True
                for r in (r for r in mine if r["bytes"] == nbytes):
                    f, ok = figures[(OVER_IB, tuple(r["ranks"]), nbytes)]
                    correct = correct and ok
                    if r["local_index"] not in best or f > best[r["local_index"]][0]:
                        best[r["local_index"]] = (f, next(n for n in r["nodes"] if n != host))
                index, (f, partner) = min(best.items(), key=lambda kv: kv[1][0])
                curve.append(
                    {"bytes": nbytes, "busbw": f, "correct": correct, "process_index": index, "best_partner": partner}
                )
            top = curve[-1]
            weakest = {"process_index": top["process_index"], "best_partner": top["best_partner"]}
            shared = (
                "with 2 nodes the one pair's figure is both nodes': a third node tells which is slow"
                if len(nodes) == 2
                else ""
            )
            v = _at_largest(OVER_IB, curve, exp, shared)
            v["weakest"] = weakest
            checks[OVER_IB] = v
        # ib_write_bw per card
        exp = expected.get(IB_WRITE)
        c = by_host.get(host, {"skipped": "not measured"})
        if c.get("skipped"):
            checks[IB_WRITE] = {**_verdict(IB_WRITE, None, exp, c["skipped"]), "status": SKIPPED}
        else:
            per_card = {d: statistics.median(r["gbits"]) if r["gbits"] else None for d, r in c["cards"].items()}
            errors = {d: r["error"] for d, r in c["cards"].items() if r["error"] and not r["gbits"]}
            measured = [f for f in per_card.values() if f is not None]
            low = min(per_card, key=lambda d: -1.0 if per_card[d] is None else per_card[d])
            v = _verdict(IB_WRITE, min(measured) if measured else None, exp, None)
            if errors:
                v.update(status=FAIL, reason="; ".join(f"{d}: {e}" for d, e in errors.items()))
            elif exp is None:
                v.update(status=NOT_JUDGED, reason="no expected figure for this VM size")
            v.update(cards=per_card, weakest_card=low, memory=c["memory"], at_bytes=IB_WRITE_BW_MESSAGE)
            checks[IB_WRITE] = v
        statuses = [v["status"] for v in checks.values()]
        verdict = FAIL if FAIL in statuses else PASS if PASS in statuses else NOT_JUDGED
        f0 = facts[ranks[0]]
        out.append(
            {
                "host": host,
                "private_ip": f0.get("private_ip"),
                "physical_host": f0.get("physical_host"),
                "ranks": ranks,
                "checks": checks,
                "verdict": verdict,
            }
        )
    return out


def _cell(v: dict) -> str:
    if v["figure"] is None:
        return v["status"].lower()
    figure = f"{v['figure']:.3g} {v['unit']}"
    if v["status"] in (PASS, FAIL):
        return f"{figure} {'>=' if v['status'] == PASS else '<'} {v['expected']:g} {v['status']}"
    return f"{figure} (not judged)"


def node_table(nodes: list[dict]) -> list[str]:
    """The verdict table rank 0 prints: one row per node, then why each FAIL or unjudged figure is so."""
    header = ["host", "private IP", *(TITLES[c] for c in NODE_CHECKS), "verdict"]
    rows = [
        [n["host"], n["private_ip"] or "?", *(_cell(n["checks"][c]) for c in NODE_CHECKS), n["verdict"]] for n in nodes
    ]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in [header, *rows]]
    for n in nodes:
        for c in NODE_CHECKS:
            v = n["checks"][c]
            if v["status"] == FAIL:
                lines.append(f"{n['host']}: {failure_line(v)}")
    notes = {}
    for n in nodes:
        for c in NODE_CHECKS:
            v = n["checks"][c]
            if v["status"] in (NOT_JUDGED, SKIPPED) and v.get("reason"):
                notes.setdefault((c, v["status"], v["reason"]), []).append(n["host"])
    for (c, status, reason), hosts in notes.items():
        lines.append(f"{TITLES[c]} {status.lower()} on {', '.join(hosts)}: {reason}")
    sources = {v["source"] for n in nodes for v in n["checks"].values() if v.get("source")}
    lines += [f"expected figures from {s}" for s in sorted(sources)]
    return lines


def failure_line(v: dict) -> str:
    """One check's FAIL, with its figure, the expected one and where that comes from."""
    what = TITLES[v["check"]]
    if v["figure"] is None:
        return f"{what} FAILED: {v['reason']}"
    where = f" at {size_text(v['at_bytes'])}" if v.get("at_bytes") else ""
    detail = ""
    if v["check"] == OVER_IB and v.get("weakest"):
        w = v["weakest"]
        detail = f" (process {w['process_index']}'s card, best with {w['best_partner']})"
    elif v["check"] == IB_WRITE and v.get("weakest_card"):
        detail = f" (card {v['weakest_card']})"
    line = f"{what} {v['figure']:.3g} {v['unit']}{where}{detail}"
    if v.get("expected") is not None:
        line += f", expected at least {v['expected']:g} {v['unit']} ({v['source']})"
    return line + (f"; {v['reason']}" if v.get("reason") else "")


def _error(e: BaseException) -> str:
    first = (str(e).strip().splitlines() or [""])[0]
    return f"{type(e).__name__}: {first}" if first else type(e).__name__


def train_steps(hvd, torch, device, args, channels_last: bool) -> dict:
    """This rank's attempt at what a training job does; never raises: the failed part and its error are returned
    (the traceback goes to stderr), so every rank reaches the exchange of results. The steps are the PyTorch
    payload's own (payloads/pytorch/loop.py: its set-up, fused SGD, loss scaler, memory format and step, on
    synthetic batches that differ per rank), stopped halfway by a mid-epoch checkpoint that a fresh run restores
    and trains on from, as a resumed job does. The parameters are digested at the save and at the end."""
    status = {
        "rank": hvd.rank(),
        "failed": None,
        "error": None,
        "losses": [],
        "seconds": None,
        "digest": None,
        "cpus": None,
    }
    try:
        # The payload imports torchvision to build these models; an image where that import breaks fails here.
        from .pytorch import models

        if args.model != "tiny_cnn":
            import torchvision.models  # noqa: F401
    except Exception as e:  # noqa: BLE001 - any failure is the finding: reported by part and rank, not raised
        traceback.print_exc()
        status.update(failed="import", error=_error(e))
        return status
    try:
        from .common.config import TrainConfig
        from .pytorch import affinity, backends, checkpoints, loop, runtime
        from .pytorch.classification import Classification

        class Losses:
            """A concern: each step's loss, read on the host (the check wants every one)."""

            def step_end(self, run) -> None:
                status["losses"].append(run.last.loss.item())

        class FirstSteps(Classification):
            """The payload's classification task, its epoch cut after `until` steps (None: to the end)."""

            def __init__(self, until: int | None):
                self.until = until

            def batches(self, run, epoch, skip):
                return itertools.islice(super().batches(run, epoch, skip), None, self.until and self.until - skip)

        backend = backends.Horovod(hvd)  # already initialised: the checks above ran on it
        half = args.train_steps // 2
        with tempfile.TemporaryDirectory(prefix="healthcheck-") as out:
            cfg = TrainConfig(
                model=args.model,
                image_size=args.image_size,
                num_classes=NUM_CLASSES,
                batch_size=args.batch_size,
                synthetic_samples=args.batch_size * hvd.size() * args.train_steps,
                epochs=1,
                base_lr=0.01 / hvd.size(),  # the payload scales it by the processes: 0.01 on any cluster
                warmup_epochs=0,
                lr_decay_epochs=(),
                seed=0,
                workers=0,
                output_dir=pathlib.Path(out),
                keep_checkpoints=1,
                amp=args.amp,
                amp_dtype=args.amp_dtype,
                channels_last=channels_last,
                progress=False,
                mlflow=False,
                stall_timeout=0,
                checkpoint_every_minutes=0,
            )
            resolved = runtime.resolve(cfg, backend)
            seconds, digests = 0.0, []
            # The first half and its save; a fresh run restores it and trains the rest (one step: no save).
            for until in (half, None) if half else (None,):
                run = loop.prepare(FirstSteps(until), cfg, backend, *resolved)
                run.concerns = [Losses()]
                if device.type == "cuda":
                    torch.cuda.synchronize()
                start = time.perf_counter()
                loop.train_epoch(run, 0, run.start.step)
                if device.type == "cuda":
                    torch.cuda.synchronize()
                seconds += time.perf_counter() - start  # the steps (and the epoch's sums), not the set-up
                digests.append(models.parameters_digest(run.model))
                if until is not None:
                    checkpoints.save(cfg, backend, 0, run.model, run.optimizer, run.scaler, half, run.steps)
                    checkpoints.finish_checkpoints(backend)
        status["seconds"] = seconds
        status["cpus"] = affinity.ranges(os.sched_getaffinity(0))  # as the payload's set-up bound this rank
        status["digest"], status["digest_at_save"] = digests[-1], digests[0]
    except Exception as e:  # noqa: BLE001 - any failure is the finding: reported by part and rank, not raised
        traceback.print_exc()
        status.update(failed="step", error=_error(e))
    return status


_HINTS = {
    "import": "the training stack does not import on this image; a training job fails the same way (traceback "
    "on the rank's stderr). Check the image's Python and torch/torchvision versions",
    "step": "a training job fails the same way (traceback on the rank's stderr). Known causes: a Python that "
    "breaks torch._dynamo, which torch's optimizer imports (a release candidate such as 3.11.0rc1); a "
    "Horovod that refuses channels_last tensors ('Tensor is required to be contiguous': build it with "
    "toolchain/patch_horovod.py); out of GPU memory (lower --batch-size)",
}


def judge_training(statuses: list[dict], steps: int) -> tuple[dict, list[str]]:
    """(training verdict, failures) from every rank's status, in rank order. A rank whose broadcast met a rank that
    had failed and joined (Horovod refuses broadcasts with a joined rank) failed because of it: only the ranks that
    failed on their own are named, when there are any."""
    failures = []
    failed = [s for s in statuses if s["failed"]]
    failed = [s for s in failed if JOINED not in (s["error"] or "")] or failed
    for part in PARTS:
        ranks = [s for s in failed if s["failed"] == part]
        if ranks:
            failures.append(
                f"training {part} failed on rank(s) {', '.join(str(s['rank']) for s in ranks)}: "
                f"{ranks[0]['error']}: {_HINTS[part]}"
            )
    verdict = {
        "failed_part": failed[0]["failed"] if failed else None,
        "loss": None,
        "seconds": None,
        "ranks_agree": None,
        "parameters_sha256": None,
        "errors": [{"rank": s["rank"], "part": s["failed"], "error": s["error"]} for s in failed],
    }
    if failed:
        return verdict, failures
    last = [s["losses"][-1] for s in statuses]
    verdict.update(
        loss=sum(last) / len(last), seconds=max(s["seconds"] for s in statuses), parameters_sha256=statuses[0]["digest"]
    )
    bad = [s for s in statuses if not all(math.isfinite(x) for x in s["losses"])]
    if bad:
        verdict["failed_part"] = "step"
        failures.append(
            f"training step failed on rank(s) {', '.join(str(s['rank']) for s in bad)}: the loss is "
            f"not finite ({bad[0]['losses']}): a training job would diverge the same way"
        )
    # At the mid-run save and at the end: the restore gives every rank rank 0's weights, so the end alone could miss
    # ranks that differed before it.
    differ = [
        s["rank"]
        for s in statuses
        if (s["digest"], s.get("digest_at_save")) != (statuses[0]["digest"], statuses[0].get("digest_at_save"))
    ]
    verdict["ranks_agree"] = not differ
    if differ:
        verdict["failed_part"] = verdict["failed_part"] or "agreement"
        failures.append(
            f"training agreement failed: after {steps} steps the parameters of rank(s) {', '.join(map(str, differ))} "
            "differ from rank 0's, so the ranks are training different models. Every rank should apply the same "
            "averaged gradients: look for a rank whose optimizer is not hvd.DistributedOptimizer, a faulty GPU "
            "(run nvidia-smi -q -d ECC,PAGE_RETIREMENT on its node), or mismatched software between nodes "
            "(the per-node versions above)"
        )
    return verdict, failures


def main(argv=None) -> int:
    try:
        args = parse(argv)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2

    import horovod.torch as hvd
    import torch

    from .pytorch import precision

    hvd.init(process_sets="dynamic")  # the node checks add process sets (each node, pairs of nodes) as they go
    try:
        devices.require_gpus(torch.cuda.device_count(), hvd.local_size(), "PyTorch", torch.version.cuda)
        device = torch.device("cuda", hvd.local_rank()) if torch.cuda.is_available() else torch.device("cpu")
        # The PyTorch payload's defaults on this device (pytorch/train.py): mixed precision and channels_last on GPUs.
        prec = precision.choose(device, args.amp, args.amp_dtype)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        return 2
    channels_last = device.type == "cuda" if args.channels_last is None else args.channels_last
    if device.type == "cuda":
        torch.cuda.set_device(device)
    else:  # as the payload: the node's cores shared by its processes, not each process taking them all
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // hvd.local_size()))
    n = hvd.size()
    facts = hvd.allgather_object(node_facts(torch), name="node_facts")
    results = measure(hvd, torch, device, args.sizes_bytes, args.iterations)
    bandwidth, failures = judge(results, n, args.floor)

    # Every node on its own: the all-reduces, then ib_write_bw on each node's first process; every rank judges
    # the same gathered figures, so every rank knows the verdict.
    hosts = [f["host"] for f in facts]
    records = allreduce_checks(hvd, torch, device, hosts, args.sizes_bytes, args.iterations)
    if device.type == "cuda":
        torch.cuda.empty_cache()  # the all-reduces' 8-16 GiB blocks, before ib_write_bw and the training steps
    card = None
    if hvd.rank() in [ranks[0] for _, ranks in node_groups(hosts)]:
        card = {**ib_card_check(args.ib_repeats, device.type == "cuda"), "host": hosts[hvd.rank()]}
    records = [r for mine in hvd.allgather_object(records, name="node_checks") for r in mine]
    cards = [c for c in hvd.allgather_object(card, name="ib_cards") if c]
    node_verdicts = judge_nodes(facts, records, cards, args.expected)
    failures += [
        f"node {v['host']} ({v['private_ip'] or 'IP unknown'}): {failure_line(c)}"
        for v in node_verdicts
        for c in v["checks"].values()
        if c["status"] == FAIL
    ]

    status = train_steps(hvd, torch, device, args, channels_last)
    # A rank that failed part-way joins: the others' pending gradient allreduces then complete instead of
    # waiting for it forever (Horovod's join; a broadcast with a joined rank fails, and is reported, instead).
    hvd.join(device.index if device.type == "cuda" else -1)
    statuses = hvd.allgather_object(status, name="train_status")
    training, train_failures = judge_training(statuses, args.train_steps)
    training = {
        "model": args.model,
        "image_size": args.image_size,
        "batch_per_process": args.batch_size,
        "steps": args.train_steps,
        "precision": prec.name,
        "memory_format": "channels_last" if channels_last else "contiguous",
        **training,
    }
    failures += train_failures

    all_ok = bool(hvd.allreduce(torch.tensor(0.0 if failures else 1.0), op=hvd.Min, name="verdict").item())
    if hvd.rank() == 0:
        nodes = {}
        for f in facts:  # one entry per host: what its first process saw
            nodes.setdefault(f["host"], f)
        for f in nodes.values():
            say(
                f"node {f['host']}: driver {f['driver']}, CUDA {f['cuda']}, NCCL {f['nccl']}, "
                f"{f['gpus_visible']} GPUs, InfiniBand devices: {', '.join(f['infiniband_devices']) or 'none'}"
                + (f"; MISMATCH: {f['driver_mismatch']}" if f.get("driver_mismatch") else "")
            )
            say(f"node {f['host']} disks: {disks_line(f['disks'])}")
        say(
            "CPU binding for training (the payload's own, runtime.resolve): "
            + "; ".join(f"rank {s['rank']} on {hosts[s['rank']]}: {s.get('cpus') or '?'}" for s in statuses)
        )
        for r in results:
            say(
                f"allreduce {r['mbytes']:>7.1f} MB: {r['median_seconds'] * 1e3:8.2f} ms (median), "
                f"bus bandwidth {r['bus_gbytes_per_sec']:.2f} GB/s, {'ok' if r['correct'] else 'WRONG SUM'}"
            )
        if bandwidth["judged"]:
            say(
                f"bus bandwidth {bandwidth['busbw_gbytes_per_sec']:.2f} GB/s at {bandwidth['judged_mbytes']:g} MB, "
                f"floor {bandwidth['min_busbw_gbytes_per_sec']:g} GB/s: {'ok' if bandwidth['ok'] else 'TOO LOW'}"
            )
        else:
            say(
                "bus bandwidth not judged: "
                + ("one process has no bus" if n < 2 else f"no floor for this VM size (set --min-busbw or {MIN_BUSBW})")
            )
        say(
            f"node verdicts (median of {args.iterations} runs at the largest size; all-reduce figures are bus "
            "bandwidth):",
            *node_table(node_verdicts),
        )
        say(training_line(training, n))
        report = {
            "processes": n,
            "nodes": len(nodes),
            "device": device.type,
            "vm_size": os.environ.get("TRAINING_VM_SIZE"),
            "node_facts": list(nodes.values()),
            "results": results,
            "bandwidth": bandwidth,
            "expected": args.expected,
            "node_verdicts": node_verdicts,
            "training": training,
            "cpu_binding": [{"rank": st["rank"], "host": hosts[st["rank"]], "cpus": st["cpus"]} for st in statuses],
            "failures": failures,
            "passed": all_ok,
        }
        if args.output:
            args.output.parent.mkdir(parents=True, exist_ok=True)
            args.output.write_text(json.dumps(report, indent=2) + "\n")
        if all_ok:
            say("healthcheck passed")
        else:
            say("healthcheck FAILED: " + ("; ".join(failures) or "another rank failed (see its output)"))
    return 0 if all_ok else 1


def training_line(t: dict, processes: int) -> str:
    what = (
        f"training {t['model']} {t['image_size']}px x {t['batch_per_process']} per process, {processes} "
        f"process(es), {t['precision']}, {t['memory_format']}"
    )
    if t["seconds"] is None:  # a rank did not get through its steps
        return f"{what}: {t['failed_part'].upper()} FAILED"
    agree = "ranks agree" if t["ranks_agree"] else "RANKS DIFFER"
    finite = "" if math.isfinite(t["loss"]) else " (LOSS NOT FINITE)"
    return f"{what}: {t['steps']} steps in {t['seconds']:.2f} s, last loss {t['loss']:.4f}{finite}, {agree}"


if __name__ == "__main__":
    from payloads.common import entry

    entry.finish(main())
