"""benchmarks.backends (Horovod allreduce, DDP over Gloo, a synchronous RPC parameter server) and the planner's
parameter-server model. No speed assertions: the figures live in the benchmark's output."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

import pytest
import torch

from benchmarks import _backend_common as common
from benchmarks import backends, planner
from tests.helpers import ROOT, env

pytestmark = pytest.mark.launches  # the quick benchmark and its refusals start horovodrun and torchrun


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    out = tmp_path_factory.mktemp("backends") / "backends.json"
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.backends", "--quick", "--max-np", "2", "--json", str(out)],
        cwd=ROOT,
        env=env(),
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout, json.loads(out.read_text())


# The quick run measured at 1.02 cores alone: one_core, with every test of its module-scoped fixture (a fixture
# is per xdist worker, so its tests stay on one).
@pytest.mark.one_core
def test_quick_run_reports_every_backend_with_its_process_count(quick):
    stdout, data = quick
    assert data["quick"] is True and data["config"]["model"] == "resnet18" and data["config"]["threads"] == 1
    assert set(data["results"]) == {"1", "2"}
    assert data["results"]["1"]["single"]["median"] > 0
    row = data["results"]["2"]
    assert set(row) == set(backends.BACKENDS)
    # the parameter server is a process of its own beside the 2 workers
    assert {b: (r["workers"], r["processes"]) for b, r in row.items()} == {
        "horovod": (2, 2),
        "ddp": (2, 2),
        "ps": (2, 3),
    }
    for b, r in row.items():
        assert r["median"] > 0 and len(r["runs"]) == 1
        assert b in stdout


@pytest.mark.one_core
@pytest.mark.parametrize("backend, ranks", [("horovod", [0, 1]), ("ddp", [0, 1]), ("ps", [0, 1, "ps"])])
def test_every_process_trained_and_holds_the_same_parameters(quick, backend, ranks):
    """Each rank trains on its own batch, so equal digests mean the gradients were averaged (allreduce) or the
    workers pulled the PS's parameters; moved > 0 means the steps changed them."""
    run = quick[1]["results"]["2"][backend]["runs"][0]
    assert sorted(map(str, (r["rank"] for r in run["ranks"]))) == sorted(map(str, ranks))
    assert len({r["digest"] for r in run["ranks"]}) == 1 and run["ranks_agree"]
    assert all(r["moved"] > 0 for r in run["ranks"]) and run["moved"]


def test_ranks_train_on_different_batches():
    """What makes the digest check able to fail: without averaging, ranks on these batches would diverge."""
    args = argparse.Namespace(batch_size=4, image_size=8, num_classes=10)
    (d0, _), (d1, _) = common.batch(args, 0), common.batch(args, 1)
    assert not torch.equal(d0, d1)
    assert torch.equal(d0, common.batch(args, 0)[0])


def test_parse_flags_ranks_that_disagree_or_did_not_move():
    line = lambda rank, digest, moved: common.MARK + json.dumps({"rank": rank, "digest": digest, "moved": moved})
    out = "\n".join([common.MARK + '{"images_per_sec": 10.0}', line(0, "a", 1.0), line(1, "b", 0.0)])
    parsed = backends.parse("ddp", out)
    assert parsed["images_per_sec"] == 10.0 and not parsed["ranks_agree"] and not parsed["moved"]
    with pytest.raises(RuntimeError, match="no rate"):
        backends.parse("ps", line(0, "a", 1.0))


@pytest.mark.one_core
def test_max_np_below_two_is_refused():
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.backends", "--max-np", "1"],
        cwd=ROOT,
        env=env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and "--max-np 1" in proc.stderr


# ---- the planner's parameter-server model ------------------------------------------------------------------
S, B = 100e6, 3.125  # 100 MB of gradients, 25 Gbit/s


def test_ps_bandwidth_term_by_hand():
    # PS side 2 * 128 * 1e8 / (16 * 3.125e9) = 0.512 s beats the worker side 2 * 4 * 1e8 / 3.125e9 = 0.256 s
    assert planner.ps_bandwidth_seconds(128, 4, S, 16, B) == pytest.approx(0.512)
    # at 8 GPUs the PS side is 0.032 s: the node's 4 workers sharing its NIC are the bottleneck
    assert planner.ps_bandwidth_seconds(8, 4, S, 16, B) == pytest.approx(0.256)


def test_ps_step_time_by_hand():
    t = planner.Transport("test", B, 10.0, 50e-6, 0.75, 0.005)
    # compute 64 / 200 = 0.32 s; comm 0.512 + 2 * 50e-6 = 0.5121 s; hidden 0.75 * 0.32 * 2/3 = 0.16 s;
    # overhead 0.005 * log2(128) = 0.035 s
    step = 0.32 + (0.5121 - 0.16) + 0.035
    assert planner.ps_step_time(128, 4, 64, 200.0, S, t, 16) == pytest.approx(step)
    assert planner.ps_efficiency(128, 4, 64, 200.0, S, t, 16) == pytest.approx(0.32 / step)
    with pytest.raises(ValueError, match="at least 1 PS shard"):
        planner.ps_step_time(8, 4, 64, 200.0, S, t, 0)


def test_ps_efficiency_falls_with_gpus_for_a_fixed_shard_count():
    table = planner.compare_ps()
    for p in planner.PS_SHARDS:
        row = [table[f"ps{p}"][n] for n in planner.PS_COUNTS]
        assert all(a > b for a, b in zip(row, row[1:])), (p, row)


def test_allreduce_bandwidth_term_is_flat_where_the_ps_term_grows_linearly():
    ring = [planner.ring_bandwidth_seconds(n, S, B) for n in planner.PS_COUNTS]
    assert max(ring) / min(ring) <= (2 * S / (B * 1e9)) / ring[0] <= 8 / 7 + 1e-12  # 2(n-1)/n in [7/4, 2)
    ps = [planner.ps_bandwidth_seconds(n, 4, S, 1, B) for n in planner.PS_COUNTS]
    assert ps[-1] / ps[0] == pytest.approx(512 / 8)


def test_seed_point_lies_between_one_shard_and_the_allreduce():
    """The seed's 50% at 128 GPUs: below the allreduce's prediction, above one shard's; shards_for finds the
    count where the model crosses it, and None where the workers' NICs cap the model below the target."""
    table = planner.compare_ps()
    assert table["ps1"][128] < 0.5 < table["hierarchical"][128]
    p = planner.shards_for(128, 0.5)
    c, t = planner.SOURCE_SETUP, planner.SOURCE_TRANSPORT
    eff = lambda shards: planner.ps_efficiency(128, c["per_node"], c["batch"], c["rate1"], c["grad_bytes"], t, shards)
    assert eff(p - 1) < 0.5 <= eff(p)
    assert planner.shards_for(128, 0.99) is None
