"""Two real Horovod processes train on WebDataset shards: each rank reads its own part, gradients are
averaged (ranks end identical), every image is trained on once per epoch."""

import re

import pytest
from helpers import TINY, learnable_tree, max_diff, metrics, train

from datatools import prepare

pytestmark = pytest.mark.launches  # starts training processes: serial under xdist (tests/conftest.py)


def _small_mounts(tmp_path, shm_kib: int, cache_kib: int) -> list[str]:
    """A command prefix: a private mount namespace in which /dev/shm is a tmpfs of shm_kib KiB and
    tmp_path/small a tmpfs of cache_kib KiB, as a container's shm_size or a small local disk would be."""
    import shutil
    import subprocess

    (tmp_path / "small").mkdir(parents=True)
    script = (
        'mount -t tmpfs -o size="$1"k tmpfs /dev/shm && mount -t tmpfs -o size="$2"k tmpfs "$3" && shift 3 && exec "$@"'
    )
    prefix = ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "mounts"]
    prefix += [str(shm_kib), str(cache_kib), str(tmp_path / "small")]
    probe = (
        subprocess.run([*prefix, "df", "-k", "/dev/shm"], capture_output=True, text=True)
        if shutil.which("unshare")
        else None
    )
    if probe is None or probe.returncode != 0:
        pytest.skip(f"no private mounts here (unshare and mount need root): {probe.stderr if probe else 'no unshare'}")
    return prefix


def test_two_processes_train_on_shards_with_identical_weights(tmp_path):
    """Under a /dev/shm of 256 KiB (Horovod's launcher needs some), smaller than one rank's decoded images (24
    images of 60-90 px, about 400 KB): the cache lives in --cache-dir (TMPDIR here), not in shared memory, where
    writing past the tmpfs's size was a SIGBUS at the end of epoch 1."""
    learnable_tree(tmp_path / "img", sizes=(60, 90))
    prepare.run(tmp_path / "img", tmp_path / "shards", shards=4, formats=["webdataset"], progress=False)
    out = tmp_path / "run"
    args = [a for a in TINY if a != "--synthetic-samples" and a != "128"]
    proc = train(
        2,
        args
        + [
            "--data",
            "shards",
            "--data-dir",
            str(tmp_path / "shards" / "webdataset"),
            "--epochs",
            "3",
            "--batch-size",
            "6",
            "--base-lr",
            "0.01",
            "--cache-decoded",
            "--shuffle-buffer",
            "8",
            "--output-dir",
            str(out),
        ],
        prefix=_small_mounts(tmp_path, shm_kib=256, cache_kib=4),
    )
    m = metrics(out)
    assert m["run"]["world"]["processes"] == 2
    assert m["summary"]["ranks_identical"] is True  # digests gathered from both ranks
    assert [e["images"] for e in m["epochs"]] == [48, 48, 48]  # every image once per epoch, over both ranks
    kept = re.search(r"kept 24 decoded images of rank 0 in \S+ \(([\d.]+) MB\)", proc.stdout + proc.stderr)
    assert kept and float(kept.group(1)) * 1e6 > 256 * 1024, proc.stdout[-2000:]  # more than /dev/shm holds
    assert "bus error" not in (proc.stdout + proc.stderr).lower()

    # The same job with --cache-dir on a 4 KiB tmpfs: refused before epoch 1, naming the flag, the figure, the fix.
    small = tmp_path / "second" / "small"
    refused = train(
        2,
        args
        + ["--data", "shards", "--data-dir", str(tmp_path / "shards" / "webdataset"), "--epochs", "3"]
        + ["--batch-size", "6", "--cache-decoded", "--cache-dir", str(small), "--output-dir", str(tmp_path / "r")],
        check=False,
        prefix=_small_mounts(tmp_path / "second", shm_kib=1024, cache_kib=4),
    )
    text = refused.stdout + refused.stderr
    assert refused.returncode != 0 and "error: --cache-decoded: the decoded images need " in text, text[-3000:]
    assert "x 2 process(es) on this node" in text and "pass --cache-dir on a local disk" in text
    assert not (tmp_path / "r" / "checkpoints").exists() or not any((tmp_path / "r" / "checkpoints").iterdir())
    losses = [e["train_loss"] for e in m["epochs"]]
    assert losses[-1] < losses[0], losses


def test_a_resumed_run_on_shards_equals_a_straight_one(tmp_path):
    """File order, shuffle buffer and crops depend on (seed, epoch, rank, sample) only, so stopping after
    epoch 1 and resuming trains exactly what a straight run trains."""
    import torch
    from helpers import final_weights

    learnable_tree(tmp_path / "img", per_class=6)
    prepare.run(tmp_path / "img", tmp_path / "shards", shards=4, formats=["webdataset"], progress=False)
    args = [a for a in TINY if a not in ("--synthetic-samples", "128")] + [
        "--data",
        "shards",
        "--data-dir",
        str(tmp_path / "shards" / "webdataset"),
        "--batch-size",
        "4",
        "--base-lr",
        "0.01",
        "--shuffle-buffer",
        "5",
    ]
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    train(2, args + ["--epochs", "2", "--output-dir", str(straight)])
    train(2, args + ["--epochs", "1", "--output-dir", str(resumed)])
    proc = train(2, args + ["--epochs", "2", "--output-dir", str(resumed)])
    assert "resuming from" in proc.stdout
    a, b = final_weights(straight), final_weights(resumed)
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_shards_option_errors_name_the_fix(tmp_path):
    # In a process of its own, as users run it: the second error is met after hvd.init(), and Open MPI's
    # singleton start-up inside pytest's process would leave MPI variables to every later horovodrun.
    import subprocess

    from helpers import ROOT, env, python_m

    def run(*args):
        return subprocess.run(
            [*python_m("payloads.pytorch.train"), *args],
            cwd=ROOT,
            env=env(),
            capture_output=True,
            text=True,
            timeout=120,
        )

    missing = run("--data", "shards")
    assert missing.returncode == 2 and "--data-dir" in missing.stderr, missing.stderr
    # An output folder of its own: the default (outputs/, under the checkout) gets the watchdog's heartbeat, which
    # starts before the data is opened so that a hang there is named too.
    (tmp_path / "shards").mkdir()
    empty = run("--data", "shards", "--data-dir", str(tmp_path / "shards"), "--output-dir", str(tmp_path / "out"))
    assert empty.returncode == 2 and "error:" in empty.stderr and str(tmp_path / "shards") in empty.stderr, empty.stderr


def test_gpu_decode_runs_its_cpu_fallback_in_two_processes(tmp_path):
    """--gpu-decode (nvJPEG through torchvision on a GPU) runs torchvision's CPU decoder on the same path here:
    ranks agree, every image is trained on once per epoch, and the weights land near the CPU decoder's run
    (the two resize in different orders: up to one grey level apart), far nearer than a run on other data."""
    import torch
    from helpers import final_weights

    learnable_tree(tmp_path / "img")
    prepare.run(tmp_path / "img", tmp_path / "shards", shards=4, formats=["webdataset"], progress=False)
    args = [a for a in TINY if a != "--synthetic-samples" and a != "128"]
    common = args + [
        "--data",
        "shards",
        "--data-dir",
        str(tmp_path / "shards" / "webdataset"),
        "--epochs",
        "2",
        "--batch-size",
        "6",
        "--base-lr",
        "0.01",
        "--shuffle-buffer",
        "8",
    ]
    runs = {}
    for name, extra in (("gpu", ["--gpu-decode"]), ("cpu", ["--decoder", "torchvision"]), ("other", ["--seed", "7"])):
        out = tmp_path / name
        train(2, common + extra + ["--output-dir", str(out)])
        m = metrics(out)
        assert m["summary"]["ranks_identical"] is True
        assert [e["images"] for e in m["epochs"]] == [48, 48]
        runs[name] = final_weights(out)

    def diff(a, b):
        return max_diff(runs[a], runs[b])

    near, far = diff("gpu", "cpu"), diff("gpu", "other")
    print(f"--gpu-decode fallback vs CPU decoder: {near:.3g}; vs another seed: {far:.3g}")
    assert near < far / 5, (near, far)
    assert not torch.equal(runs["gpu"]["0.weight"], runs["other"]["0.weight"])
