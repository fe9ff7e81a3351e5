"""The shard loader's decode workers and shared batch slots (payloads/pytorch/ring.py): what the training process
does per step, what it gets when a worker dies or /dev/shm is full, prefetch across epochs, two loaders on one
set of workers."""

import errno
import os
import pathlib
import signal
import time

import numpy as np
import psutil
import pytest
import torch
from conftest import write_tree
from helpers import alive

from datatools import prepare
from payloads.common.errors import ConfigError, InputFault
from payloads.pytorch import inputs, ring, shards, shardset


@pytest.fixture(scope="module")
def train(tmp_path_factory):
    root = tmp_path_factory.mktemp("ring")
    write_tree(root / "img", classes=[f"c{i}" for i in range(6)], per_class=4)
    prepare.run(root / "img", root / "out", shards=4, formats=["webdataset"], progress=False)
    return shards.open_set(root / "out" / "webdataset")[0]


def _loader(train, workers=2, shuffle=True, **kw):
    return shards.ShardLoader(
        train,
        shards.Reading(0, 1, 4, seed=5, shuffle=shuffle, workers=workers, **kw),
        shards.Transform(8, train=shuffle),
    )


def _epoch(loader, epoch, skip=0):
    loader.set_epoch(epoch, skip)
    return [(x.clone(), y.clone()) for x, y, _ in loader]


def _same(a, b) -> bool:
    return len(a) == len(b) and all(torch.equal(x1, x2) and torch.equal(y1, y2) for (x1, y1), (x2, y2) in zip(a, b))


def test_the_next_epoch_is_decoding_before_it_is_asked_for_and_a_wrong_guess_costs_nothing_but_time(train):
    """After an epoch's last batch the loader has already sent the next epoch's first steps to the workers (they
    decode during validation and the checkpoint); what it then hands out equals a fresh loader's, and a resume
    that asks for another epoch or step drops the guess and gets the right batches."""
    loader, fresh = _loader(train), _loader(train, workers=0)
    first = _epoch(loader, 0)
    assert [(e, s) for e, s, *_ in loader.sent] == [(1, s) for s in range(min(len(loader), loader.slot_count))]
    assert _same(_epoch(loader, 1), _epoch(fresh, 1))
    assert _same(_epoch(loader, 3, skip=2), _epoch(fresh, 3, skip=2))  # not epoch 2: the guess is dropped
    assert _same(_epoch(loader, 0), first) and len(first) == len(loader) == 6
    # The batch handed out is a view of its slot: the training process copied no pixels.
    loader.set_epoch(0)
    x, _, _ = next(iter(loader))
    slots = {v["images"].__array_interface__["data"][0] for v in loader.views}
    assert x.data_ptr() in slots
    # The validation loader starts its first pass when asked (inputs.build asks at start), before iterating.
    val = _loader(train, shuffle=False)
    val.prefetch()
    assert [(e, s) for e, s, *_ in val.sent][:2] == [(0, 0), (0, 1)]
    assert _same(_epoch(val, 0), _epoch(_loader(train, workers=0, shuffle=False), 0))


def test_a_training_and_a_validation_loader_share_the_workers_with_their_answers_kept_apart(train):
    """Both loaders keep steps in flight on the same workers; batches taken in turns are each loader's own."""
    a, b = _loader(train), _loader(train, shuffle=False)
    want_a, want_b = _epoch(_loader(train, workers=0), 0), _epoch(_loader(train, workers=0, shuffle=False), 0)
    assert a.group is None or a.group is b.group
    got_a, got_b = [], []
    for (xa, ya, _), (xb, yb, _) in zip(a, b):
        got_a.append((xa.clone(), ya.clone()))
        got_b.append((xb.clone(), yb.clone()))
    assert a.group is b.group is ring.workers(2)
    assert _same(got_a, want_a) and _same(got_b, want_b)


def test_a_worker_that_dies_ends_the_run_with_one_line_naming_it(train):
    loader = _loader(train, workers=3)
    it = iter(loader)
    next(it)
    victim = loader.group.pids[1]
    os.kill(victim, signal.SIGKILL)
    with pytest.raises(InputFault) as e:
        for _ in it:  # its steps may all be decoded already: the next epoch's need the dead worker
            pass
        _epoch(loader, 1)
    text = str(e.value)
    assert f"decode worker 1 (pid {victim}) was killed by SIGKILL" in text and "\n" not in text
    assert ring.workers(3).pids[1] != victim  # the next loader of this process gets a new set


def test_a_stopped_worker_ends_with_its_forkserver():
    """A worker stopped (or blocked in a read) answers nothing, and once its forkserver is gone its rank no longer
    sees it as alive: torchrun's SIGTERM to a rank's process group ended the forkserver first, and the stopped worker
    was left for ever, holding the job's pipes. Each input worker dies with its parent (watchdog.die_with_parent):
    the shard loader's and the DataLoader's (--data imagefolder --workers N), children of the same forkserver. The
    next set of workers starts a new forkserver (multiprocessing restarts one that ended)."""
    group = ring.Workers(2)
    assert group.call(len, [("ab",), ("c",)]) == [2, 1]  # both running their loop
    loader = torch.utils.data.DataLoader(
        range(8), batch_size=2, num_workers=2, multiprocessing_context="forkserver",
        worker_init_fn=inputs._ignore_sigterm, persistent_workers=True,
    )  # fmt: skip
    batches = iter(loader)
    assert [next(batches).tolist() for _ in range(2)] == [[0, 1], [2, 3]]  # one from each worker: both started
    workers = group.pids + [w.pid for w in batches._workers]
    servers = {psutil.Process(pid).ppid() for pid in workers}
    assert len(servers) == 1 and os.getpid() not in servers, servers
    for pid in workers:
        os.kill(pid, signal.SIGSTOP)
    os.kill(servers.pop(), signal.SIGTERM)
    deadline = time.monotonic() + 30
    while (left := alive(workers)) and time.monotonic() < deadline:
        time.sleep(0.1)
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert left == [], f"their forkserver ended; the stopped workers {left} of {workers} were left"
    assert ring.workers(2).call(len, [("ab",)]) == [2]  # a new set, from a new forkserver


class _Unreadable:
    """Pickles here; unpickling it raises (int("unreadable")), as a message a worker cannot read would."""

    def __reduce__(self):
        return int, ("unreadable",)


def test_a_message_a_worker_cannot_read_is_named_with_its_traceback_not_as_a_closed_pipe():
    """Unpickling happens in the worker's recv, outside its per-message handling: it used to end the worker
    with a bare closed pipe ("exited (None)" while its exit was still being reported)."""
    group = ring.workers(2)
    victim = group.procs[0]
    group.send(0, ("call", "call", _Unreadable()))
    with pytest.raises(InputFault) as e:
        group.recv(0, "call")
    text = str(e.value)
    assert f"decode worker 0 (pid {victim.pid}) could not read a message" in text and "ValueError" in text, text
    victim.join(timeout=30)
    assert victim.exitcode == 0 and ring.workers(2).pids[0] != victim.pid  # it ended; the next loader gets a new set


def test_the_rehearsal_finds_a_training_processs_decode_workers_and_only_them():
    """`rehearse --faults "decode worker died"` kills one of the last rank's input workers, found from outside the
    rank: the children of its forkserver, not the forkserver itself nor its resource tracker; a job that decodes
    nothing in workers is not rehearsed for it (its command line, as argparse reads it)."""
    import multiprocessing.forkserver
    import multiprocessing.resource_tracker

    from launcher.simcluster import rehearse

    group = ring.workers(2)
    found = rehearse.input_workers(os.getpid())
    assert set(group.pids) <= set(found), (group.pids, found)
    others = {
        multiprocessing.forkserver._forkserver._forkserver_pid,
        multiprocessing.resource_tracker._resource_tracker._pid,
    }
    assert not others & set(found) and os.getpid() not in found
    decodes = rehearse.decodes_in_workers
    assert decodes("python -m payloads.pytorch.train --data synthetic --workers 2 --data shards")
    assert not decodes("python -m payloads.pytorch.train --data shards --workers 2 --workers 0")
    assert not decodes("python -m payloads.pytorch.train --data shards --data=synthetic") and not decodes("train")


def test_a_full_dev_shm_is_refused_at_start_with_the_figure_and_the_fix(train, monkeypatch):
    def full(fd, offset, length):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(ring.os, "posix_fallocate", full)
    with pytest.raises(ConfigError) as e:
        next(iter(_loader(train)))
    text = str(e.value)
    assert "shared batch slots need" in text and "MiB free" in text and "shm_size" in text
    assert not [f for f in os.listdir(ring.shm_folder()) if f.startswith(f"batches-{os.getpid()}-")]


def test_the_order_is_the_shard_stream_through_the_shuffle_buffer(train):
    """The workers derive each step from (seed, epoch, rank, step) (shardset.epoch_order); against the stream the
    order is defined on, read with read_shard: the plan's files in the epoch's order, then the buffer."""
    for rank, size in ((0, 1), (1, 3)):  # whole files, and every size-th record (4 files, 3 ranks)
        rank_plan = shards.plan(train.counts, rank, size, 2)
        stream = [s for f in train.files for s in shardset.read_shard(f)]
        starts = np.concatenate([[0], np.cumsum(train.counts)])
        for epoch in (0, 1):
            files = list(rank_plan.files)
            if not rank_plan.stride:
                files = [files[i] for i in np.random.default_rng([9, epoch, rank]).permutation(len(files))]
            mine = [
                stream[i]
                for f in files
                for i in range(starts[f], starts[f + 1])
                if not rank_plan.stride or i % size == rank
            ]
            want = [s.key for s in shardset.shuffled(iter(mine), 3, np.random.default_rng([9, epoch, rank, 1]))]
            loader = shards.ShardLoader(
                train, shards.Reading(rank, size, 2, shuffle_buffer=3, workers=0, seed=9), shards.Transform(8, True)
            )
            index = loader._index()
            got = shardset.epoch_order(index, rank_plan, 9, epoch, rank, True, 3)
            assert [index.keys[p] for p in got] == want


def test_the_trainer_can_keep_cores_of_its_own_with_the_workers_on_the_rest(train, monkeypatch):
    """TRAINING_TRAINER_CPUS=n (a GPU benchmark row): the training process keeps its first n CPUs, the decode
    workers get the others, and a loader through them still gives the same batches."""
    from payloads.pytorch import affinity

    before = os.sched_getaffinity(0)
    if len(before) < 2:
        pytest.skip("one CPU: nothing to split")
    monkeypatch.setenv(ring.TRAINER_CPUS, "1")
    group = ring.Workers(2)
    try:
        first = min(before)
        assert os.sched_getaffinity(0) == {first}
        assert all(os.sched_getaffinity(pid) == before - {first} for pid in group.pids)
        assert ring.separate(group.pids, {ring.TRAINER_CPUS: str(len(before))}) is None  # none left: shared
        assert ring.separate(group.pids, {}) is None
    finally:
        group.kill()
        for tid in [0, *affinity.threads()]:
            try:
                os.sched_setaffinity(tid, before)
            except OSError:
                pass
    assert os.sched_getaffinity(0) == before


def test_with_the_cache_a_resumed_epoch_repeats_the_straight_one(train, tmp_path):
    """--cache-decoded: every epoch is a full shuffle in key order, whether its pixels come from the shards or the
    cache, so a resume mid-epoch (a new process, an empty cache) trains the straight run's remaining steps."""
    straight = _loader(train, cache=True, cache_dir=tmp_path)
    _epoch(straight, 0)  # fills the cache
    second = _epoch(straight, 1)  # read from it
    assert straight.cache.complete
    resumed = _loader(train, cache=True, cache_dir=tmp_path)
    assert _same(_epoch(resumed, 1, skip=2), second[2:]) and not resumed.cache.complete


def test_many_calls_with_large_answers_do_not_fill_the_pipes():
    """Indexing sends one call per tar file (1,024 for ImageNet on one GPU) and each answer is tens of KB: with every
    call sent before any answer was read, a worker blocked writing its answers and the training process blocked
    writing calls. At most two calls are in flight per worker."""
    group = ring.workers(2)
    answers = group.call(bytes, [(b"x" * 4000,)] * 300)  # 1.2 MB each way through two pipes of 64 KiB
    assert len(answers) == 300 and {len(a) for a in answers} == {4000}
    assert all(p.is_alive() for p in group.procs)


def test_a_slot_waits_for_its_fence_before_a_worker_writes_it_again(train, monkeypatch):
    """On a GPU, Prefetched and GpuDecoded fence the slot of each batch with a CUDA event recorded after its copy;
    here a stand-in event records when it is waited on. Every fenced slot is waited on before its next task."""
    loader, events = _loader(train), []

    class Fence:
        def __init__(self, slot):
            self.slot = slot

        def synchronize(self):
            events.append(("synced", self.slot))

    real_send = ring.Workers.send

    def send(self, w, msg):
        if msg[0] == "step" and msg[1] == loader.id:
            events.append(("sent", msg[4]))
        real_send(self, w, msg)

    monkeypatch.setattr(ring.Workers, "send", send)
    for epoch in (0, 1, 2):
        loader.set_epoch(epoch)
        for _ in loader:
            events.append(("fenced", loader.held))
            loader.fence(Fence(loader.held))
    reused = 0
    for slot in range(loader.slot_count):
        mine = [kind for kind, s in events if s == slot]
        for i, kind in enumerate(mine):
            if kind == "fenced" and "sent" in mine[i:]:
                reused += 1
                assert mine[i + 1 : mine.index("sent", i)] == ["synced"], (slot, mine)
    assert reused >= len(loader)  # slots were written again after being fenced, every time after the wait


class FakeRuntime:
    """libcudart at the boundary ring.py uses: a failed cudaHostRegister leaves its error pending, as CUDA's does, and
    the next kernel launch (PyTorch checks cudaGetLastError after each) fails with it while it is."""

    def __init__(self, fail: bool):
        self.fail, self.pending, self.registered = fail, 0, {}

    def cudaHostRegister(self, address, size, flags):
        if self.fail:
            self.pending = 1  # cudaErrorInvalidValue
            return 1
        self.registered[address] = size
        return 0

    def cudaGetLastError(self):
        err, self.pending = self.pending, 0
        return err

    def cudaHostUnregister(self, address):
        self.registered.pop(address)
        return 0

    def launch(self):
        if self.pending:
            raise RuntimeError(f"CUDA error {self.pending} at an unrelated kernel")


def test_a_failed_registration_leaves_no_error_pending_for_the_next_kernel(train, monkeypatch, caplog):
    """A ring that CUDA will not register is copied from pageable memory, and the error of the failed call is read
    off in the same runtime: otherwise the next kernel launch raises it as its own (vLLM #50070). A registered ring
    covers its whole mapping and is unregistered when its loader goes."""
    import gc

    for fail in (True, False):
        rt = FakeRuntime(fail)
        monkeypatch.setattr(ring, "cuda_runtime", lambda rt=rt: rt)
        loader = _loader(train, pin_memory=True)
        next(iter(loader))
        rt.launch()
        assert loader.slots.pinned is not fail
        if fail:
            assert "cudaHostRegister of" in caplog.text and "pageable memory" in caplog.text
        else:
            assert list(rt.registered.values()) == [len(loader.slots.map)]
            del loader
            gc.collect()
            assert rt.registered == {}


def test_the_runtime_is_the_one_torch_loaded():
    """libcudart's symbols looked up through torch's CUDA library (its dependency): the runtime whose error state
    PyTorch's kernel launches check. Without a GPU the call answers with an error code, and nothing else happens."""
    rt = ring.cuda_runtime()
    if rt is None:
        pytest.skip("this torch has no libtorch_cuda.so (a CPU build)")
    assert isinstance(rt.cudaGetLastError(), int)


def _mount_type(path) -> str:
    """The file system type of the mount holding `path`, from /proc/self/mounts (longest mount point that is a
    prefix): an account of the tmpfs rule that does not go through statfs."""
    path, best = os.path.realpath(path), ("", "")
    with open("/proc/self/mounts") as f:
        for line in f:
            _, point, kind = line.split()[:3]
            if (path == point or path.startswith(point.rstrip("/") + "/")) and len(point) > len(best[0]):
                best = (point, kind)
    return best[1]


def test_on_a_gpu_the_ring_must_be_on_a_tmpfs_and_a_disk_folder_is_refused_in_one_line(train, monkeypatch, tmp_path):
    """CUDA pins the ring's pages; a file on a disk file system (the /tmp fallback where /dev/shm is missing) is one
    the kernel tracks for writeback. statfs says which is which, as /proc/self/mounts does."""
    assert ring.on_tmpfs("/dev/shm") == (_mount_type("/dev/shm") == "tmpfs")
    assert ring.on_tmpfs(str(tmp_path)) == (_mount_type(tmp_path) == "tmpfs")
    disk = next((p for p in (tmp_path, pathlib.Path(__file__).parent) if _mount_type(p) != "tmpfs"), None)
    if disk is None:
        pytest.skip("no folder off tmpfs here")
    monkeypatch.setattr(ring, "shm_folder", lambda: str(disk))
    monkeypatch.setattr(ring, "cuda_runtime", lambda: FakeRuntime(False))
    with pytest.raises(ConfigError) as e:
        next(iter(_loader(train, pin_memory=True)))
    text = str(e.value)
    assert "\n" not in text and "/dev/shm" in text and "shm_size" in text and str(disk) in text
    next(iter(_loader(train)))  # not pinned (a CPU run): the folder is fine


def test_with_the_cache_the_filling_epoch_reads_as_an_uncached_one_each_step_front_to_back(
    train, tmp_path, monkeypatch
):
    """--cache-decoded's first epoch is the uncached epoch (the plan's files through the shuffle buffer), not a full
    shuffle across the rank's shards: the cache is laid out by key, so the order it is filled in does not matter to
    it. Each step reads its images in the files' order, each file front to back; the next epoch reads no file."""
    reads, ends = [], []
    real = shardset.read_at
    monkeypatch.setattr(shardset, "read_at", lambda f, at, n, path: reads.append((path, at)) or real(f, at, n, path))
    cached, plain = _loader(train, workers=0, cache=True, cache_dir=tmp_path), _loader(train, workers=0)
    cached.set_epoch(0)
    filled = []
    for x, y, _ in cached:
        filled.append((x.clone(), y.clone()))
        ends.append(len(reads))
    assert cached.cache.complete and _same(filled, _epoch(plain, 0))
    paths = list(cached.index.paths)
    for a, b in zip([0, *ends], ends):
        step = reads[a:b]
        assert step == sorted(step, key=lambda r: (paths.index(r[0]), r[1])), step
    del reads[:]
    _epoch(cached, 1)
    assert reads == []
