"""When each run was made, and where a sweep's client time went: its start-up against the time measured.

A run's `RunTiming` (runs.json): its start and end (UTC, ISO 8601), its wall time in the client, and the client
start-up paid before it. `split` adds them up over a sweep: how many times the client started and what that cost,
against each run's own time: vLLM's measured `duration` and the client's set-up around it (the prompts drawn and
checked against the server's tokenizer, the test request, the warm-up requests, the result file).
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable
from dataclasses import dataclass

from t4serve.untrusted import Untrusted, check_finite, check_text

# A run's time in seconds: a week is beyond any.
MAX_SECONDS = 7 * 24 * 3600.0


@dataclass(frozen=True)
class RunTiming:
    started: str  # UTC, ISO 8601 to the millisecond: the request to the client
    ended: str  # its answer
    wall_s: float  # the run in the client: set-up, measured time, result file
    # Start-up paid before this run (the client's process and vLLM's import): 0.0 when the sweep's client was up
    # already; None with a client process per run, whose start-up is inside wall_s and cannot be told apart.
    client_start_s: float | None = None


def now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="milliseconds")


def check_timing(t: RunTiming, where: str) -> None:
    """A RunTiming read from a file: its times text, its seconds finite and within a week (Untrusted otherwise)."""
    for text in (t.started, t.ended):
        check_text(text, f"{where}: a time")
        if len(text) > 40:
            raise Untrusted(f"{where}: a time longer than 40 characters")
    for name, value in (("wall_s", t.wall_s), ("client_start_s", t.client_start_s)):
        if value is not None:
            check_finite(value, f"{where}: {name}", 0.0, MAX_SECONDS)


@dataclass(frozen=True)
class Split:
    """A sweep's client time: start-ups (None: a process per run, not separable), and per run its wall time,
    vLLM's measured duration and the rest (the client's set-up; with a process per run, its start-up too)."""

    runs: int
    starts: int | None
    start_up_s: float | None
    wall_s: float
    measured_s: float

    @property
    def set_up_s(self) -> float:
        return max(self.wall_s - self.measured_s, 0.0)

    @property
    def start_up_share_pct(self) -> float | None:
        """Start-up per run (spread over the sweep's runs) as a share of a run's whole wall time."""
        if self.start_up_s is None or not self.runs:
            return None
        per_run = self.start_up_s / self.runs
        whole = per_run + self.wall_s / self.runs
        return per_run / whole * 100 if whole > 0 else None


def split(timings: Iterable[tuple[RunTiming, float | None]]) -> Split | None:
    """The split over (timing, measured duration) pairs of the runs that have both; None where none has."""
    pairs = [(t, d) for t, d in timings if d is not None]
    if not pairs:
        return None
    per_run = all(t.client_start_s is None for t, _ in pairs)
    starts = [t.client_start_s for t, _ in pairs if t.client_start_s]
    return Split(runs=len(pairs), starts=None if per_run else len(starts),
                 start_up_s=None if per_run else sum(s for s in starts if s is not None),
                 wall_s=sum(t.wall_s for t, _ in pairs), measured_s=sum(d for _, d in pairs if d is not None))


def describe(s: Split) -> str:
    """One line: the split as `bench` prints it and the report states it."""
    n = s.runs
    runs = (f"{n} run(s): {s.wall_s:.1f} s in the client, {s.measured_s:.1f} s of it measured (vLLM's duration), "
            f"{s.set_up_s:.1f} s set-up around it; a run {s.wall_s / n:.1f} s, measured {s.measured_s / n:.1f} s")
    if s.start_up_s is None:
        return (f"client: one process per run, its start-up inside each run's set-up (not separable); {runs}")
    share = s.start_up_share_pct
    return (f"client start-up: {s.starts} start(s), {s.start_up_s:.1f} s in all, "
            f"{s.start_up_s / n:.2f} s a run spread over the sweep ({share or 0.0:.1f} % of a run's wall time); "
            f"{runs}")
