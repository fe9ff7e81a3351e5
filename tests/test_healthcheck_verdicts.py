"""The health check's per-node verdicts from recorded figures (the median run, a collective at its slowest rank,
Azure's figures where they apply, pairs across nodes), ib_write_bw per InfiniBand card, NCCL held to those cards and
read back from its log, and what identifies a node to Azure. The verdicts run for real: test_healthcheck.py."""

import pathlib
import subprocess

import pytest

from payloads.common import devices
from payloads.common.errors import ConfigError
from payloads.healthcheck import allreduce, infiniband, options, verdicts
from payloads.healthcheck import expected as node_figures
from payloads.healthcheck import facts as node_facts

# ---- per-node verdicts from recorded figures ---------------------------------------------------------------


def runs(check: str, ranks: list[int], seconds: list[float], nbytes: int = 2**30, **extra) -> list[dict]:
    """What each rank of one collective records: the same run times on every rank."""
    return [
        {"check": check, "ranks": ranks, "bytes": nbytes, "seconds": seconds, "correct": True, **extra} for _ in ranks
    ]


def facts(hosts: list[str]) -> list[dict]:
    return [
        {"host": h, "private_ip": f"10.0.0.{4 + sorted(set(hosts)).index(h)}", "physical_host": None} for h in hosts
    ]


def seconds_for(gbytes_per_sec: float, nbytes: int, n: int) -> float:
    """The run time that makes this bus bandwidth: nbytes x 2(n-1)/n / time (computed here, not by the code)."""
    return nbytes * 2 * (n - 1) / n / (gbytes_per_sec * 1e9)


def test_a_node_is_judged_on_the_median_so_one_slow_run_does_not_fail_it():
    """Healthy nodes vary (azurehpc-health-checks #690): one run of five at a tenth of the speed leaves the median."""
    good, slow = seconds_for(240, 2**30, 8), seconds_for(24, 2**30, 8)
    expected = node_figures.parse("allreduce_in_node=228", "test")
    one_bad_run = runs(node_figures.IN_NODE, list(range(8)), [good, good, slow, good, good])
    (v,) = verdicts.judge_nodes(facts(["n"] * 8), one_bad_run, [], expected)
    assert v["checks"]["allreduce_in_node"]["status"] == "PASS"
    assert v["checks"]["allreduce_in_node"]["figure"] == pytest.approx(240)
    mostly_bad = runs(node_figures.IN_NODE, list(range(8)), [good, slow, slow, good, slow])
    (v,) = verdicts.judge_nodes(facts(["n"] * 8), mostly_bad, [], expected)
    assert v["verdict"] == "FAIL" and v["checks"]["allreduce_in_node"]["figure"] == pytest.approx(24)


def test_a_collective_is_timed_at_its_slowest_rank():
    ranks = [{**r, "seconds": [seconds_for(240, 2**30, 2)] * 3} for r in runs(node_figures.IN_NODE, [0, 1], [])]
    ranks[1]["seconds"] = [seconds_for(100, 2**30, 2)] * 3
    (v,) = verdicts.judge_nodes(facts(["n", "n"]), ranks, [], {})
    assert v["checks"]["allreduce_in_node"]["figure"] == pytest.approx(100)
    assert v["checks"]["allreduce_in_node"]["status"] == "NOT JUDGED" and v["verdict"] == "NOT JUDGED"


def test_azures_in_node_figure_applies_to_one_process_per_gpu_at_its_message_size():
    """nd96isr_h100_v5.conf: check_nccl_allreduce 460.0 1 16G, with 8 processes. Two processes, or a smaller
    message, are not what Azure measured: reported, not judged (a slow figure that fails is still failed)."""
    expected = node_figures.parse(f"allreduce_in_node=460@{16 * 2**30}/8", "catalog")
    fast = seconds_for(470, 16 * 2**30, 2)
    (v,) = verdicts.judge_nodes(
        facts(["n"] * 2), runs(node_figures.IN_NODE, [0, 1], [fast] * 3, 16 * 2**30), [], expected
    )
    c = v["checks"]["allreduce_in_node"]
    assert c["status"] == "NOT JUDGED" and "figure is for 8 processes (one per GPU); this node ran 2" in c["reason"]
    small = runs(node_figures.IN_NODE, list(range(8)), [seconds_for(470, 2**30, 8)] * 3, 2**30)
    (v,) = verdicts.judge_nodes(facts(["n"] * 8), small, [], expected)
    c = v["checks"]["allreduce_in_node"]
    assert c["status"] == "NOT JUDGED" and c["reason"] == (
        "measured up to 1 GiB; the expected figure is at 16 GiB (leave --sizes-mb out)"
    )
    full = runs(node_figures.IN_NODE, list(range(8)), [seconds_for(430, 16 * 2**30, 8)] * 3, 16 * 2**30)
    (v,) = verdicts.judge_nodes(facts(["n"] * 8), full, [], expected)
    assert v["checks"]["allreduce_in_node"]["status"] == "FAIL" and v["checks"]["allreduce_in_node"][
        "figure"
    ] == pytest.approx(430)


def test_each_card_is_judged_by_its_best_pair_and_the_node_by_its_weakest_card():
    """Three nodes of 2 processes; process 1 of node c (its second card) is slow with every partner. Node c fails
    on card 1; nodes a and b, paired with c in one round each, keep their best pair and pass."""
    hosts = ["a", "a", "b", "b", "c", "c"]
    assert allreduce.pair_rounds(3) == [[(0, 1)], [(1, 2)], [(2, 0)]]
    good, slow = seconds_for(22, 2**30, 2), seconds_for(6, 2**30, 2)
    records = []
    for x, y in (("a", "b"), ("b", "c"), ("c", "a")):
        for i in (0, 1):
            pair = [hosts.index(x) + i, hosts.index(y) + i]
            late = "c" in (x, y) and i == 1
            records += runs(node_figures.OVER_IB, pair, [slow if late else good] * 3, nodes=[x, y], local_index=i)
    expected = node_figures.parse("allreduce_over_ib=18", "catalog")
    v = {n["host"]: n for n in verdicts.judge_nodes(facts(hosts), records, [], expected)}
    assert {h: v[h]["checks"]["allreduce_over_ib"]["status"] for h in v} == {"a": "PASS", "b": "PASS", "c": "FAIL"}
    c = v["c"]["checks"]["allreduce_over_ib"]
    assert c["figure"] == pytest.approx(6) and c["weakest"]["process_index"] == 1
    assert "process 1's card" in verdicts.failure_line(c)


def test_with_two_nodes_the_pair_is_both_nodes_figure_and_says_so():
    slow = seconds_for(6, 2**30, 2)
    records = runs(node_figures.OVER_IB, [0, 1], [slow] * 3, nodes=["a", "b"], local_index=0)
    expected = node_figures.parse("allreduce_over_ib=18", "catalog")
    judged = verdicts.judge_nodes(facts(["a", "b"]), records, [], expected)
    assert [n["verdict"] for n in judged] == ["FAIL", "FAIL"]
    assert "a third node tells which is slow" in judged[0]["checks"]["allreduce_over_ib"]["reason"]


@pytest.mark.parametrize("nodes", range(1, 10))
def test_pair_rounds_put_every_node_in_two_pairs_and_no_node_twice_in_a_round(nodes):
    rounds = allreduce.pair_rounds(nodes)
    pairs = [p for r in rounds for p in r]
    for r in rounds:
        members = [n for p in r for n in p]
        assert len(members) == len(set(members))
    assert all(sum(n in p for p in pairs) == (0 if nodes == 1 else 1 if nodes == 2 else 2) for n in range(nodes))
    assert len(rounds) <= 3


# ---- ib_write_bw per card, as Azure's check runs perftest -----------------------------------------------------

# What ib_write_bw --report_gbits prints (perftest's README layout); the fake prints it with each card's figure.
FAKE_IB_WRITE_BW = """#!/bin/sh
echo "$@" >> "$CALLS"
last=""; dev=""; prev=""
for a in "$@"; do [ "$prev" = "-d" ] && dev="$a"; prev="$a"; last="$a"; done
case "$last" in -*|mlx5_*) exit 0 ;; esac   # the server: no peer host after the options
figure=$(eval echo \\$BW_$dev)
echo "---------------------------------------------------------------------------------------"
echo " #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]"
echo " 8388608    1000             $figure              $figure                0.005"
echo "---------------------------------------------------------------------------------------"
"""


def fake_sysfs(root: pathlib.Path, cards: dict[str, str]) -> pathlib.Path:
    for dev, layer in cards.items():
        (root / dev / "ports" / "1").mkdir(parents=True)
        (root / dev / "ports" / "1" / "link_layer").write_text(layer + "\n")
    return root


def test_nccl_is_held_to_the_infiniband_cards_on_an_infiniband_size_only(tmp_path):
    """Issue 43, item 3: NCCL_IB_HCA names the node's InfiniBand cards exactly, the Ethernet NIC left out, with Azure's
    names (mlx5_ib*, mlx5_an*) or the kernel's (mlx5_0, ...), on the sizes whose job environment enables NCCL's IB
    transport (launcher/interconnect.py); a job file's own value and the other sizes are left alone."""
    from launcher import interconnect
    from trainingplatform import vm_sizes

    azure = fake_sysfs(tmp_path / "azure", {"mlx5_an0": "Ethernet", **{f"mlx5_ib{i}": "InfiniBand" for i in range(8)}})
    kernel = fake_sysfs(tmp_path / "kernel", {"mlx5_0": "InfiniBand", "mlx5_1": "Ethernet", "mlx5_2": "InfiniBand"})
    ib_size = vm_sizes.CATALOG["Standard_ND96isr_H100_v5"]
    cluster = {"vm_size": ib_size.name, "gpus_per_node": ib_size.gpus, "infiniband": ib_size.infiniband}
    env = dict(interconnect.environment(cluster, 8))
    assert devices.pin_nccl_to_infiniband(env, azure) == "=" + ",".join(f"mlx5_ib{i}" for i in range(8))
    assert env["NCCL_IB_HCA"].startswith("=mlx5_ib0,") and "mlx5_an0" not in env["NCCL_IB_HCA"]
    env = dict(interconnect.environment(cluster, 8))
    assert devices.pin_nccl_to_infiniband(env, kernel) == "=mlx5_0,mlx5_2"
    own = {**interconnect.environment(cluster, 8), "NCCL_IB_HCA": "mlx5_ib0"}
    assert devices.pin_nccl_to_infiniband(own, azure) is None and own["NCCL_IB_HCA"] == "mlx5_ib0"
    tcp = vm_sizes.CATALOG["Standard_NC24ads_A100_v4"]
    env = dict(interconnect.environment({"vm_size": tcp.name, "gpus_per_node": 1, "infiniband": None}, 1))
    assert devices.pin_nccl_to_infiniband(env, azure) is None and "NCCL_IB_HCA" not in env
    assert devices.pin_nccl_to_infiniband({"NCCL_IB_DISABLE": "0"}, tmp_path / "none") is None


def test_ib_write_bw_runs_each_card_as_azure_does_and_fails_the_weak_card(tmp_path, monkeypatch):
    binary = tmp_path / "ib_write_bw"
    binary.write_text(FAKE_IB_WRITE_BW)
    binary.chmod(0o755)
    calls = tmp_path / "calls"
    monkeypatch.setenv("CALLS", str(calls))
    monkeypatch.setenv("BW_mlx5_ib0", "181.2")
    monkeypatch.setenv("BW_mlx5_ib1", "97.4")
    cards = devices.infiniband_cards(
        fake_sysfs(tmp_path / "ib", {"mlx5_an0": "Ethernet", "mlx5_ib0": "InfiniBand", "mlx5_ib1": "InfiniBand"})
    )
    assert cards == ["mlx5_ib0", "mlx5_ib1"]  # the Ethernet NIC (ND H200 v5's mlx5_an0) is not an IB card
    measured = infiniband.ib_write_bw(cards, str(binary), repeats=3, host="peer-host", wait=0.05)
    assert measured == {
        "mlx5_ib0": {"gbits": [181.2] * 3, "error": None},
        "mlx5_ib1": {"gbits": [97.4] * 3, "error": None},
    }
    lines = calls.read_text().splitlines()
    common = "-s 8388608 -x 0 -F --report_gbits --perform_warm_up -d"
    assert sorted(lines) == sorted(
        [f"-p {18510 + i} {common} {d}" for i, d in enumerate(cards)] * 3
        + [f"-p {18510 + i} {common} {d} peer-host" for i, d in enumerate(cards)] * 3
    )
    expected = node_figures.parse("ib_write_bw=180", "catalog")
    card = {"check": "ib_write_bw", "host": "n", "memory": "host", "cards": measured}
    (v,) = verdicts.judge_nodes(facts(["n"]), [], [card], expected)
    c = v["checks"]["ib_write_bw"]
    assert v["verdict"] == "FAIL" and c["figure"] == 97.4 and c["weakest_card"] == "mlx5_ib1"
    assert c["cards"] == {"mlx5_ib0": 181.2, "mlx5_ib1": 97.4}
    assert verdicts.failure_line(c).startswith("ib_write_bw per InfiniBand card 97.4 Gb/s at 8 MiB (card mlx5_ib1)")


def test_a_card_whose_ib_write_bw_fails_fails_the_node(tmp_path):
    binary = tmp_path / "ib_write_bw"
    binary.write_text("#!/bin/sh\necho \" Couldn't connect to peer-host:18510\" >&2\nexit 1\n")
    binary.chmod(0o755)
    measured = infiniband.ib_write_bw(["mlx5_ib0"], str(binary), repeats=1, host="peer-host", wait=0.01)
    assert measured == {"mlx5_ib0": {"gbits": [], "error": "ib_write_bw exited 1: Couldn't connect to peer-host:18510"}}
    card = {"check": "ib_write_bw", "host": "n", "memory": "host", "cards": measured}
    (v,) = verdicts.judge_nodes(facts(["n"]), [], [card], node_figures.parse("ib_write_bw=180", "c"))
    assert v["verdict"] == "FAIL" and "mlx5_ib0: ib_write_bw exited 1" in v["checks"]["ib_write_bw"]["reason"]


def test_without_perftest_the_card_check_is_skipped_and_says_why(tmp_path, monkeypatch):
    monkeypatch.setattr(infiniband, "IB_SYSFS", fake_sysfs(tmp_path / "ib", {"mlx5_ib0": "InfiniBand"}))
    monkeypatch.setenv("PATH", str(tmp_path))  # no ib_write_bw anywhere
    skipped = infiniband.ib_card_check(3, gpu=False)
    assert skipped == {
        "check": "ib_write_bw",
        "skipped": "the image has no ib_write_bw (perftest; Ubuntu's package perftest)",
        "cards": ["mlx5_ib0"],
    }
    (v,) = verdicts.judge_nodes(facts(["n"]), [], [{**skipped, "host": "n"}], {})
    assert v["checks"]["ib_write_bw"]["status"] == "SKIPPED" and v["verdict"] == "NOT JUDGED"


# ---- what identifies a node to Azure ----------------------------------------------------------------------


def test_the_private_ip_is_eth0s_address():
    ip = subprocess.run(["ip", "-4", "-o", "addr", "show", "eth0"], capture_output=True, text=True)
    if ip.returncode != 0 or "inet " not in ip.stdout:
        pytest.skip("no eth0 with an IPv4 address here")
    assert node_facts.private_ip("eth0") == ip.stdout.split("inet ", 1)[1].split("/", 1)[0]


def test_the_physical_host_name_is_read_from_hyper_vs_key_value_pool(tmp_path):
    def record(key: str, value: str) -> bytes:
        return key.encode().ljust(512, b"\0") + value.encode().ljust(2048, b"\0")

    pool = tmp_path / ".kvp_pool_3"
    pool.write_bytes(record("VirtualMachineName", "vm-1") + record("PhysicalHostName", "BL2AAP0123456789"))
    assert node_facts.physical_host(pool) == "BL2AAP0123456789"
    assert node_facts.physical_host(tmp_path / "absent") is None


@pytest.mark.parametrize(
    "text",
    ["allreduce_in_node", "nvlink=460", "allreduce_in_node=fast", "allreduce_in_node=-1", "ib_write_bw=380@x"],
)
def test_a_bad_expected_figure_is_refused(text):
    with pytest.raises(ConfigError, match="is not CHECK=VALUE"):
        node_figures.parse(text, "--expect")


def test_default_message_sizes_reach_azures_size():
    expected = node_figures.parse(f"allreduce_in_node=460@{16 * 2**30}/8,ib_write_bw=380@8388608", "c")
    assert options.message_sizes(None, expected) == [8 * 2**20 * 4**k for k in range(6)] + [16 * 2**30]
    assert options.message_sizes(None, {}) == [8_000_000, 32_000_000, 128_000_000, 256_000_000]
    assert options.message_sizes([1, 2.5], expected) == [1_000_000, 2_500_000]


# What NCCL 2.2x writes at NCCL_DEBUG=INFO on an ND H100 v5 node (the line shapes of its init.cc and net_ib.cc; the
# cards named as Azure's HPC images name them).
NCCL_LOG = """\
node-a:4012:4100 [0] NCCL INFO NCCL_IB_HCA set to =mlx5_ib0,mlx5_ib1,mlx5_ib2,mlx5_ib3,mlx5_ib4,mlx5_ib5,mlx5_ib6,mlx5_ib7
node-a:4012:4100 [0] NCCL INFO NET/IB : Using [0]mlx5_ib0:1/IB [1]mlx5_ib1:1/IB [2]mlx5_ib2:1/IB [3]mlx5_ib3:1/IB \
[4]mlx5_ib4:1/IB [5]mlx5_ib5:1/IB [6]mlx5_ib6:1/IB [7]mlx5_ib7:1/IB [RO]; OOB eth0:10.0.0.4<0>
node-a:4012:4100 [0] NCCL INFO Using network IB
node-a:4012:4100 [0] NCCL INFO Channel 00/0 : 0[0] -> 8[0] [send] via NET/IB/0/GDRDMA
node-a:4012:4100 [0] NCCL INFO Channel 01/0 : 8[0] -> 0[0] [receive] via NET/IB/0/GDRDMA
node-a:4012:4100 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/IPC
"""


def test_what_nccl_chose_is_read_from_its_log_and_judged_per_node(tmp_path):
    """Issue 43, item 3: NCCL on every InfiniBand card of the node, GPUDirect RDMA on every network channel; a card
    left out, a channel through host memory or a fall-back to sockets fails the node."""
    from payloads.healthcheck import nccl

    env = {"NCCL_IB_DISABLE": "0", "NCCL_DEBUG": "WARN"}
    assert nccl.log_to(tmp_path / "logs", env) and env["NCCL_DEBUG"] == "INFO"
    assert env["NCCL_DEBUG_FILE"] == str(tmp_path / "logs" / "nccl.%h.%p.log")
    assert not nccl.log_to(tmp_path / "other", {"NCCL_IB_DISABLE": "1"})  # not an InfiniBand size
    (tmp_path / "logs" / "nccl.node-a.4012.log").write_text(NCCL_LOG)
    mine = nccl.seen(tmp_path / "logs", pid=4012)
    cards = [f"mlx5_ib{i}" for i in range(8)]
    assert mine == {"cards": cards, "channels": 2, "gdr": 2, "socket": False}
    assert nccl.seen(tmp_path / "logs", pid=1) is None

    line, problem = nccl.judge("node-a", [mine, None], cards, across_nodes=True)
    assert problem is None and "uses 8 of its 8 InfiniBand cards" in line and "RDMA on 2 of 2" in line
    seven = nccl.read(
        NCCL_LOG.replace(" [7]mlx5_ib7:1/IB", "").replace(
            "/0/GDRDMA\nnode-a:4012:4100 [0] NCCL INFO Channel 01", "/0\nnode-a:4012:4100 [0] NCCL INFO Channel 01"
        )
    )
    _, problem = nccl.judge("node-a", [seven], cards, across_nodes=True)
    assert "NCCL does not use mlx5_ib7" in problem and "1 network channel(s) go through host memory" in problem
    sockets = nccl.read(
        "x NCCL INFO NET/Socket : Using [0]eth0:10.0.0.4<0>\nx NCCL INFO Channel 00/0 : 0[0] -> 8[0] [send] via NET/Socket/0\n"
    )
    _, problem = nccl.judge("node-a", [sockets], cards, across_nodes=True)
    assert problem.startswith("NCCL fell back to TCP sockets")
    assert (
        nccl.judge("node-a", [nccl.read(NCCL_LOG.split("Using network IB")[0])], cards, across_nodes=False)[1] is None
    )
