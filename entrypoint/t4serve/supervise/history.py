"""Durations of past starts, kept in the cache volume, and the time-to-ready estimate drawn from them.

`append(cache_dir, record)` adds one finished start (atomic rewrite, newest `MAX_RECORDS` kept, under a lock: the
servers of a multi-GPU host share the cache volume and may finish starting at the same moment);
`estimate(records, model, gpu)` takes the median of matching starts, per phase and in total; `remaining()` turns
that into seconds left from the current phase. A missing or unreadable history only means "no estimate".
"""

from __future__ import annotations

import json
import statistics
import threading
from dataclasses import dataclass, field
from pathlib import Path

from t4serve.atomic import locked, write_atomic
from t4serve.errors import ConfigError
from t4serve.serde import from_dict, to_dict
from t4serve.supervise.phases import LOADING_PHASES
from t4serve.untrusted import Untrusted, load_json_file

HISTORY_FILE = "start-history.json"
LOCK_FILE = "start-history.lock"
MAX_RECORDS = 50
# 50 records of a few hundred bytes each; far more is not a file this module wrote.
MAX_HISTORY_BYTES = 1 << 20


@dataclass(frozen=True)
class StartRecord:
    model: str
    gpu_name: str | None
    finished_at: float
    # Seconds from the wrapper's start to "ready".
    total_seconds: float
    # Seconds spent in each phase (a phase entered twice is summed).
    phases: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Estimate:
    total_seconds: float
    phases: dict[str, float]
    starts: int


def phase_durations(marks: list[tuple[str, float]], end: float) -> dict[str, float]:
    """Seconds per phase from (phase, began_at) marks, each phase ending where the next begins."""
    out: dict[str, float] = {}
    for (phase, began), nxt in zip(marks, [*marks[1:], ("", end)], strict=True):
        out[phase] = round(out.get(phase, 0.0) + max(0.0, nxt[1] - began), 3)
    return out


def load(cache_dir: Path) -> tuple[list[StartRecord], str | None]:
    """The records, and why they could not be read (None when fine or simply absent)."""
    path = cache_dir / HISTORY_FILE
    try:
        # The cache volume is shared and writable by whatever runs there: bounded, non-blocking, untrusted JSON.
        data = load_json_file(path, MAX_HISTORY_BYTES, "the start history")
    except FileNotFoundError:
        return [], None
    except Untrusted as exc:
        return [], exc.reason
    try:
        return from_dict(list[StartRecord], data), None
    except ConfigError as exc:
        return [], f"{path}: {exc.what}"


def append(cache_dir: Path, record: StartRecord, stop: threading.Event | None = None) -> None:
    """Add `record`. OSError when the folder cannot be written, LockError when the lock is not a regular file or
    stays held past atomic.LOCK_TIMEOUT_S (or `stop` is set): the caller loses the estimate, never its start."""
    cache_dir.mkdir(parents=True, exist_ok=True)
    # Read-modify-write under an exclusive lock, so two servers finishing together do not drop each other's record.
    with locked(cache_dir / LOCK_FILE, stop=stop):
        records, _ = load(cache_dir)
        kept = [*records, record][-MAX_RECORDS:]
        write_atomic(cache_dir / HISTORY_FILE, json.dumps(to_dict(kept), indent=1) + "\n")


def estimate(records: list[StartRecord], model: str, gpu_name: str | None) -> Estimate | None:
    """Median of past starts of this model on this GPU; None when there are none."""
    matching = [r for r in records if r.model == model and r.gpu_name == gpu_name]
    if not matching:
        return None
    phases = {
        phase: statistics.median(r.phases.get(phase, 0.0) for r in matching)
        for phase in LOADING_PHASES
        if any(phase in r.phases for r in matching)
    }
    return Estimate(statistics.median(r.total_seconds for r in matching), phases, len(matching))


def remaining(est: Estimate, phase: str, in_phase_s: float, elapsed_s: float) -> float:
    """Seconds left to ready: what is left of the current phase plus the later phases' medians.

    Outside the loading phases (or when history lacks the phase) it falls back to total minus elapsed.
    """
    if phase not in LOADING_PHASES or phase not in est.phases:
        return max(0.0, est.total_seconds - elapsed_s)
    later = LOADING_PHASES[LOADING_PHASES.index(phase) + 1 :]
    left = max(0.0, est.phases[phase] - in_phase_s) + sum(est.phases.get(p, 0.0) for p in later)
    return left
