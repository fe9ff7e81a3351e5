"""One rank stuck inside its data loader, for every Python process started with this folder on PYTHONPATH and
STALL_RANK set: the rank whose HOROVOD_RANK (horovodrun) or RANK (torchrun) equals it, or a process started alone
(neither set) when STALL_RANK is 0. Its STALL_AT-th batch (default 20) sleeps STALL_SECONDS (default 3600) where the
payload reads it; with STALL_EVERY set, every batch from the STALL_AT-th on sleeps STALL_SECONDS instead (a slow
rank, not a stuck one); with STALL_STOP=S instead, the first batch from the STALL_AT-th on that comes S seconds
after the first batch stops the whole process with SIGSTOP (a frozen rank, inside a step whatever the machine's
speed, its heartbeat written meanwhile); with STALL_WORKER=1 instead, the rank's shard-decode worker process
(payloads/pytorch/ring.py, --data shards --workers N) stops itself with SIGSTOP in its STALL_AT-th step, mid-epoch:
what a read stuck on a blob mount looks like to the rank, which waits for that batch. Where the payload reads: the PyTorch payload's synthetic batches, the
land-cover payload's patch batches (cut in a thread the training loop waits on), the TensorFlow and Keras payloads'
tf.data pipeline (a py_function in the training dataset). tests/test_watchdog.py shows with it that the stall
watchdog names the rank, and the straggler comparison the slow one."""

import os
import signal
import sys
import time

AT = int(os.environ.get("STALL_AT", "20"))
EVERY = bool(os.environ.get("STALL_EVERY"))
STOP = float(os.environ.get("STALL_STOP") or 0)
WORKER = os.environ.get("STALL_WORKER") == "1"
SECONDS = float(os.environ.get("STALL_SECONDS", "3600"))
CALLS = [0]
FIRST = [0.0]  # when the first batch was read; -1 once stopped


def _slow() -> None:
    CALLS[0] += 1
    if CALLS[0] == 1:
        FIRST[0] = time.monotonic()
    if EVERY and CALLS[0] >= AT:
        time.sleep(SECONDS)
    elif STOP:
        if CALLS[0] >= AT and FIRST[0] >= 0 and time.monotonic() - FIRST[0] >= STOP:
            FIRST[0] = -1.0
            sys.stderr.write(f"tests/stall: rank {_rank} stops itself (SIGSTOP) in its batch {CALLS[0]}\n")
            sys.stderr.flush()
            os.kill(os.getpid(), signal.SIGSTOP)
    elif CALLS[0] == AT:
        sys.stderr.write(f"tests/stall: rank {_rank} sleeps {SECONDS:.0f} s in its batch {AT}\n")
        sys.stderr.flush()
        time.sleep(SECONDS)


def _pytorch(data) -> None:
    real = data.SyntheticImages.batch

    def batch(self, indices):
        _slow()
        return real(self, indices)

    data.SyntheticImages.batch = batch


def _segmentation(data) -> None:
    real = data.batch

    def batch(*args, **kwargs):
        _slow()
        return real(*args, **kwargs)

    data.batch = batch


def _decode_worker(shards) -> None:
    real = shards.Decoder.run

    def run(self, epoch, step, slot, mode):
        import multiprocessing

        if multiprocessing.current_process().name.startswith("decode-"):  # in a worker (ring.Workers names them)
            CALLS[0] += 1
            if CALLS[0] == AT:
                sys.stderr.write(
                    f"tests/stall: rank {_rank}'s decode worker (pid {os.getpid()}) stops itself (SIGSTOP)\n"
                )
                sys.stderr.flush()
                os.kill(os.getpid(), signal.SIGSTOP)
        return real(self, epoch, step, slot, mode)

    shards.Decoder.run = run


def _tensorflow(data) -> None:
    real = data.build

    def build(*args, **kwargs):
        import tensorflow as tf

        found = real(*args, **kwargs)

        def slow(x, y):
            _slow()
            return x, y

        def mapped(x, y):
            x2, y2 = tf.py_function(slow, [x, y], [x.dtype, y.dtype])
            x2.set_shape(x.shape)
            y2.set_shape(y.shape)
            return x2, y2

        found.train = found.train.map(mapped)
        return found

    data.build = build


_rank = os.environ.get("HOROVOD_RANK", os.environ.get("RANK", "0"))
if os.environ.get("STALL_RANK") is not None and _rank == os.environ["STALL_RANK"]:
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/: import_hooks
    from import_hooks import after_import

    sys.path.pop(0)
    if WORKER:
        after_import("payloads.pytorch.shards", _decode_worker)
    else:
        after_import("payloads.pytorch.data", _pytorch)
        after_import("payloads.segmentation.data", _segmentation)
        after_import("payloads.tensorflow.data", _tensorflow)
