"""The replica sentinel: data-parallel replicas must stay bitwise equal, and a rank whose numbers go wrong is named
before the next average spreads what it did, and the run rolls back to a checkpoint written while every rank
agreed (issue 44, items 5-7; docs/stuck-or-slow.md#a-replica-went-wrong).

Every --replica-check-every steps, and before every epoch's checkpoint, each rank reduces its parameters (not
BatchNorm's running statistics, which follow each rank's batches) to one integer per tensor: the wrapping sum of
the tensor's bits read as integers, so one flipped bit changes it. The ranks gather these with two flags in one
small collective. Between checks each rank notes on the device, without a sync, the first step at which its own
loss, or (without fp16's loss scaler, whose overflows are expected and skipped) its own gradients before the
average, held a value that is not finite; the backend hands over each bucket (DDP) or group (Horovod) of this
rank's gradients just before its exchange (backends.before_exchange), and one fused reduction checks it: a cost
per step that follows the gradients' bytes, not the number of parameters. One process exchanges nothing: a
gradient that is not finite shows in the next step's loss.

On a finding, one line names the ranks (the earliest non-finite one, else those whose parameters differ from the
others', with the first tensor that differs), with their hosts; the checkpoints written after the last check that
agreed are set aside (renamed *.suspect, at the rollback event), and every rank restores the newest one left
(loop.Run.restore, as a resumed run: weights, optimizer, loss scaler, random states, running statistics, the
concerns' state) and trains on from there. A
second finding within WINDOW steps of the first, or no checkpoint to go back to, ends the run with
errors.ReplicaFault (exit code 70, payloads/common/entry.py) and the report in <output>/replicas.json.
"""

from __future__ import annotations

import json
import logging
import socket
from collections import Counter

import torch

from ..common import checkpoint
from ..common.errors import ReplicaFault as Fault
from . import checkpoints

log = logging.getLogger("payloads.pytorch")
WINDOW = 1000  # steps after a rollback in which a second finding stops the run: the fault is not transient
_INTS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def fingerprint(model: torch.nn.Module) -> list[int]:
    """One integer per parameter tensor, in name order: the wrapping sum of its elements' bits read as integers
    of their size (logical order, whatever the memory format). Equal replicas give equal lists; one flipped bit
    changes its tensor's sum."""
    sums = [
        p.detach().contiguous().view(-1).view(_INTS[p.element_size()]).sum(dtype=torch.int64)
        for _, p in sorted(model.named_parameters())
    ]
    return torch.stack(sums).tolist() if sums else []


class Replicas:
    """The sentinel as a concern of the loop (concerns.for_run): step_end and checkpoint check and raise
    checkpoints.Rollback; rollback sets aside what came after the last agreed check, and the loop restores."""

    def __init__(self, run):
        self.every = run.cfg.replica_check_every
        self.names = [name for name, _ in sorted(run.model.named_parameters())]
        self.hosts = run.backend.allgather_object(socket.gethostname(), "replica_hosts")
        self.steps = 0  # steps trained by this process (rollbacks do not rewind it)
        self.findings: list[dict] = []
        self._first_bad = torch.full((), -1, dtype=torch.int64, device=run.device)  # this rank's first bad step
        self._finite = torch.ones((), dtype=torch.bool, device=run.device)  # this step's gradients so far
        if self.every and run.scaler is None:  # with fp16's scaler, non-finite gradients are its overflows
            run.backend.before_exchange(run.optimizer, self._exchanging)

    def _exchanging(self, grads: list[torch.Tensor]) -> None:
        """This rank's own gradients of one bucket or group, before the backend averages them: their L2 norms in
        one fused call (NaN and inf carry through; one read of each tensor, 5x cheaper than an L1 norm or isfinite
        on a CPU), four small device ops whatever the tensors."""
        self._finite &= torch.stack(torch._foreach_norm(grads)).sum().isfinite()

    def run_start(self, run) -> None:
        self.verified = tuple(run.start)  # the position of the last check every rank passed

    def step_end(self, run) -> None:
        if not self.every:
            return
        finite = self._finite & torch.isfinite(run.last.loss.detach()).all()
        self._first_bad = torch.where((self._first_bad < 0) & ~finite, self.steps, self._first_bad)
        self._finite.fill_(True)
        self.steps += 1
        if self.steps % self.every == 0:
            done = run.step + 1
            self._check(run, (run.epoch + 1, 0) if done == run.steps else (run.epoch, done))

    def checkpoint(self, run) -> None:
        """Before the epoch's checkpoint (this concern is listed before Checkpoints): it is written agreed."""
        if self.every:
            self._check(run, (run.epoch + 1, 0))

    def _check(self, run, position: tuple[int, int]) -> None:
        """Every rank at the same step: gather the fingerprints and first bad steps; raise Rollback on a
        finding, else note `position` as agreed."""
        mine = {"fingerprint": fingerprint(run.model), "first_bad": int(self._first_bad)}
        every = run.backend.allgather_object(mine, "replica_check")
        finding = judge(every, self.names, self.hosts)
        if finding is None:
            self.verified = position
            return
        finding.update(epoch=run.epoch + 1, step=run.step + 1, steps_trained=self.steps)
        self.findings.append(finding)
        self._first_bad.fill_(-1)
        if run.root:
            log.error("replica check: %s", finding["line"])
        raise checkpoints.Rollback(finding["line"])

    def rollback(self, run) -> None:
        """After Rollback, before the loop restores: set aside the checkpoints written after the last agreed check
        (the newest one left is the one restored); Fault when that cannot help."""
        first = self.findings[0]["steps_trained"]
        again = len(self.findings) > 1 and self.steps - first <= WINDOW
        checkpoints.finish_checkpoints(run.backend)  # a write in flight is complete before the folder is read
        target = None
        if run.root and not again:
            target = _set_aside(run.cfg.checkpoint_dir, self.verified)
        target = run.backend.broadcast_object(target, name="replica_rollback")
        if again or target is None:
            why = (
                f"the replicas went wrong again {self.steps - first} steps after the first finding"
                if again
                else "no checkpoint was written while every rank agreed (none is left to go back to)"
            )
            self._report(run, why)
            raise Fault(
                f"replica check: {why}: {self.findings[-1]['line']}; run the health check on the named hosts "
                "(python -m payloads.healthcheck), then resume"
            )
        if run.root:
            log.warning("replica check: rolled back to %s; training goes on from there", target)
        self._report(run, None)

    def _report(self, run, stopped: str | None) -> None:
        if run.root:
            report = {"findings": self.findings, "stopped": stopped, "check_every": self.every}
            (run.cfg.output_dir / "replicas.json").write_text(json.dumps(report, indent=2) + "\n")


def judge(every: list[dict], names: list[str], hosts: list[str]) -> dict | None:
    """The finding in every rank's {fingerprint, first_bad}, or None when they agree: the ranks whose numbers were
    first not finite; else the ranks whose fingerprint differs from the most common one (from rank 0's on a tie),
    with the first tensor that differs."""
    bad = [(r, e["first_bad"]) for r, e in enumerate(every) if e["first_bad"] >= 0]
    if bad:
        first = min(step for _, step in bad)
        ranks = [r for r, step in bad if step == first]
        what = f"a value that is not finite in its loss or gradients, first in its step {first + 1} of this run"
        return _finding("not finite", ranks, hosts, what)
    prints = [tuple(e["fingerprint"]) for e in every]
    counts = Counter(prints)
    top = max(counts.values())
    common = prints[0] if counts[prints[0]] == top else next(p for p in prints if counts[p] == top)
    ranks = [r for r, p in enumerate(prints) if p != common]
    if not ranks:
        return None
    tensor = next(n for n, a, b in zip(names, prints[ranks[0]], common) if a != b)
    return _finding("parameters differ", ranks, hosts, f"parameters differ from the other ranks' (first: {tensor})")


def _finding(kind: str, ranks: list[int], hosts: list[str], what: str) -> dict:
    named = ", ".join(f"rank {r} on {hosts[r]}" for r in ranks)
    return {"kind": kind, "ranks": ranks, "hosts": [hosts[r] for r in ranks], "line": f"{named}: {what}"}


def _set_aside(folder, agreed: tuple[int, int]) -> str | None:
    """Rank 0: the checkpoints written after position `agreed` lose their completion marker and are renamed
    *.suspect (kept for a look, never resumed from); the name of the newest one left, or None."""
    kept = None
    for _, path in checkpoint.list_checkpoints(folder, checkpoints.SUFFIX):
        if checkpoint.position(path) <= agreed:
            kept = path.name
            continue
        checkpoint.marker_for(path).unlink(missing_ok=True)
        try:
            path.rename(path.with_name(path.name + ".suspect"))
        except OSError:  # an output mount without rename: unvouched, it is never resumed from
            pass
        log.warning("replica check: set aside %s (written after the last check every rank agreed on)", path.name)
    return kept
