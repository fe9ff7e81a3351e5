"""Every payload's entry point ends the same way: its log lines on stdout, a configuration or data error as one
line and exit code 2, a SIGTERM's stop (preemption.py) as its line and exit code 75, replicas that went wrong and
stayed wrong (payloads/pytorch/sentinel.py) as its line and exit code 70, a broken input pipeline (a decode
worker that died) as its line and exit code 74, a rank under which another rank's failure shut Horovod down as one
line and exit code 1 (the other rank's line says why), otherwise 0."""

from __future__ import annotations

import atexit
import logging
import os
import sys
import threading
from collections.abc import Callable
from typing import NoReturn

from . import devices, preemption, watchdog
from .errors import ConfigError, InputFault, ReplicaFault, say

CONFIG_ERROR = 2
REPLICA_FAULT = 70  # sysexits.h EX_SOFTWARE: a node's numbers went wrong; the health check before a resume
INPUT_FAULT = 74  # sysexits.h EX_IOERR: a decode worker died (killed for memory, a crash in a decoder)
# Set in every process mpirun starts. After a stop's checkpoint there, Horovod is not shut down: mpirun is ending the
# job (its daemons' SIGCONT is the stop) or will at this rank's exit, and MPI_Finalize's fence waits on daemons it no
# longer serves. On simulated nodes every rank hung there until mpirun's SIGKILL (docs/rehearse.md#a-stop-across-nodes).
UNDER_MPIRUN = "OMPI_COMM_WORLD_RANK"


def run_main(body: Callable[[], object]) -> int:
    """Run `body` (parse, then train) and turn its ending into the exit code, which the rank's last heartbeat
    records too (watchdog.ended)."""
    devices.pin_nccl_to_infiniband()  # before any NCCL communicator exists
    code = _ending(body)
    watchdog.ended(code)
    return code


def _ending(body: Callable[[], object]) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", stream=sys.stdout)
    try:
        body()
    except ConfigError as e:
        say(f"error: {e}")  # every rank says it: a data error may be met by one rank only
        return CONFIG_ERROR
    except preemption.Stopped as e:
        say(str(e))  # every rank says it: all stopped at the same step
        return preemption.EXIT_CODE
    except InputFault as e:
        say(f"error: {e} (exit {INPUT_FAULT})")
        return INPUT_FAULT
    except ReplicaFault as e:
        say(f"error: {e} (exit {REPLICA_FAULT})")  # every rank says it: all decided at the same check
        return REPLICA_FAULT
    except Exception as e:
        if type(e).__name__ != "HorovodInternalError" or PEER_FAILED not in str(e):
            raise
        # Another rank's error shut Horovod down under this one, in the middle of a collective: that rank's own
        # line says what happened; this one's traceback said nothing more (and buried it).
        say(f"error: {PEER_FAILED} by another rank's failure: its line above (or its node's log) says why; exit 1")
        return 1
    return 0


PEER_FAILED = "Horovod has been shut down"  # horovod/common/operations.cc: what a collective raises after it


def finish(code: int | None) -> NoReturn:
    """End the process with `code` the way Python ends it, without the module teardown after: threads joined,
    atexit's functions run (Horovod's shutdown and MPI_Finalize, logging's flush, multiprocessing's children, the
    decode workers), stdout and stderr flushed, then os._exit. Tearing down torch's and TensorFlow's modules cost
    seconds of every rank's exit and wrote nothing (docs/benchmarks.md#process-start-up-and-exit)."""
    # What the interpreter does first at exit, in its order: threading's own exit hooks (concurrent.futures tells
    # its pools' workers to stop there: inductor's compile pool would otherwise be joined for ever), then every
    # non-daemon thread joined.
    threading._shutdown()
    if code == preemption.EXIT_CODE and UNDER_MPIRUN in os.environ:
        _without_mpi_finalize()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(0 if code is None else int(code))


def _without_mpi_finalize() -> None:
    """Take Horovod's own shutdown (and with it MPI_Finalize) out of the exit functions of every framework loaded."""
    for name in ("horovod.torch.mpi_ops", "horovod.tensorflow.mpi_ops"):
        module = sys.modules.get(name)
        basics = getattr(module, "_basics", None)
        if basics is not None:
            atexit.unregister(basics.shutdown)
