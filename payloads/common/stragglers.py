"""Stragglers: each rank's time per part of the step (input, compute, exchange), compared across ranks every
--straggler-every steps; a rank whose input or compute share stays an outlier is named with its host. It answers
(the lines to log, the epoch's per-rank totals); the payload's loop does the one small collective and logs.
The times come from the stall watchdog's marks (watchdog.py), which this module reads and never changes."""

from __future__ import annotations

import statistics

from .watchdog import Watchdog, says

# The parts of a step whose time is compared across ranks, and the two that make a rank slow: its input or its
# compute. A rank's exchange share is high when it waits for the others, so a high exchange is never named.
TIMED = ("input", "compute", "exchange")
NAMED = ("input", "compute")
# The activities each part sums: Keras' "step" (input, compute and exchange in one call) counts as compute.
SUMS = {"input": ("input",), "compute": ("compute", "step"), "exchange": ("exchange",)}
STRAGGLER_WINDOWS = 3  # windows in a row an outlier must stay one before it is named
STRAGGLER_EXCESS = 0.15  # its share of the step at least 15 points above the others' median...
STRAGGLER_RATIO = 2.0  # ...and at least twice it
RENAME_EVERY = 20  # windows between repeats of a name that stays


class Phases:
    """Each rank's time per part of the step (TIMED), summed over a window of `every` steps from the watchdog's
    marks (host clock: no device sync). The payload sums the ranks' rows in one small collective per window
    (a size x 3 matrix where each rank fills its own row), gives the matrix to add(), which names a rank whose
    input or compute share stays an outlier for STRAGGLER_WINDOWS windows, and keeps per-rank totals for the
    epoch's metrics record. On a GPU the host clock sees the time a rank waits for input exactly; a GPU that is
    slow shows as time waiting in the exchange on every rank alike (docs/stuck-or-slow.md#stragglers)."""

    def __init__(self, watch: Watchdog, hosts: list[str], every: int):
        self.watch, self.hosts, self.every = watch, hosts, every
        self.size = len(hosts)
        self._taken = dict(watch.spent)
        self._at = watch.steps
        self._window = 0  # steps in the window row() closed
        self._runs: dict[tuple[int, str], int] = {}
        self.epoch = [[0.0] * len(TIMED) for _ in hosts]
        self.named: list[str] = []  # this epoch's lines

    def due(self) -> bool:
        return self.every > 0 and self.watch.steps - self._at >= self.every

    def row(self) -> list[float]:
        """This rank's seconds per TIMED part since the last row (the current activity up to now included)."""
        now = dict(self.watch.spent)
        now[self.watch.what] = now.get(self.watch.what, 0.0) + self.watch.clock() - self.watch.since
        row = [sum(now[a] - self._taken[a] for a in SUMS[p]) for p in TIMED]
        self._taken, self._window, self._at = now, self.watch.steps - self._at, self.watch.steps
        return row

    def matrix(self) -> list[list[float]]:
        """The payload's collective sums these over ranks: zeros except this rank's row."""
        m = [[0.0] * len(TIMED) for _ in range(self.size)]
        m[self.watch.rank] = self.row()
        return m

    def add(self, rows: list[list[float]]) -> list[str]:
        """Every rank's row for the window just ended; returns the lines to log (every rank gets the same). A
        window shorter than `every` steps (an epoch's last) counts in the totals only."""
        for total, row in zip(self.epoch, rows):
            for i, v in enumerate(row):
                total[i] += v
        if self._window < self.every:
            return []
        lines = []
        for rank, phase, share, others in outliers(rows):
            key = (rank, phase)
            run = self._runs.get(key, 0) + 1
            self._runs[key] = run
            if run == STRAGGLER_WINDOWS or (run > STRAGGLER_WINDOWS and (run - STRAGGLER_WINDOWS) % RENAME_EVERY == 0):
                lines.append(
                    f"straggler: rank {rank} on {self.hosts[rank]}: {says(phase)} {share:.0%} of its step, others "
                    f"{others:.0%} ({run} windows of {self.every} steps in a row)"
                )
        current = {(r, p) for r, p, _, _ in outliers(rows)}
        self._runs = {k: v for k, v in self._runs.items() if k in current}
        self.named += lines
        return lines

    def epoch_record(self) -> dict:
        """Per-rank seconds per part of the step over the epoch, and the stragglers named in it; then reset."""
        record = {
            "phase_seconds": [
                {"rank": r, "host": h, **{p: round(v, 3) for p, v in zip(TIMED, row)}}
                for r, (h, row) in enumerate(zip(self.hosts, self.epoch))
            ],
            "stragglers": self.named,
        }
        self.epoch = [[0.0] * len(TIMED) for _ in self.hosts]
        self.named = []
        return record


def outliers(rows: list[list[float]]) -> list[tuple[int, str, float, float]]:
    """(rank, part, its share of its step, the others' median share) for each rank whose input or compute share
    is at least STRAGGLER_RATIO times the others' median and STRAGGLER_EXCESS above it."""
    shares = [[v / sum(row) if sum(row) > 0 else 0.0 for v in row] for row in rows]
    found = []
    for phase in NAMED:
        i = TIMED.index(phase)
        for rank, mine in enumerate(shares):
            others = [s[i] for r, s in enumerate(shares) if r != rank]
            if not others:
                continue
            median = statistics.median(others)
            if mine[i] >= STRAGGLER_RATIO * median and mine[i] - median >= STRAGGLER_EXCESS:
                found.append((rank, phase, mine[i], median))
    return found
