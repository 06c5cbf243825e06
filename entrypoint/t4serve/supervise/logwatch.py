"""Follow vLLM's log to know its phase and the figures it reports, and compare those with the plan's predictions.

Pure: `PhaseTracker.feed(line, now)` takes one line of vLLM output and updates the phase and figures; nothing here
reads files or clocks. The lines it reads, the phase each starts and the figures each carries are the phase table's
(t4serve.supervise.phases: LOG_LINES, each with vLLM's own format string).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from t4serve.supervise.phases import LOG_LINES, PHASES
from t4serve.supervise.state import Figure, Prediction

# The order loading phases advance in (PHASES' ranks); a phase without a rank ends the start.
PHASE_RANK: dict[str, int] = {name: p.rank for name, p in PHASES.items() if p.rank is not None}

_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _num(text: str) -> float:
    return float(text.replace(",", ""))


@dataclass(frozen=True)
class LogEvent:
    pattern: str
    phase: str | None
    figures: tuple[Figure, ...]


class PhaseTracker:
    """The phase and figures seen so far; phases only move forward (by PHASE_RANK) until a terminal phase."""

    def __init__(self, now: float, on_phase: Callable[[str, float], None] | None = None) -> None:
        self.phase = "starting"
        self.phases: list[tuple[str, float]] = [("starting", now)]
        self.figures: dict[str, Figure] = {}
        self.seen: set[str] = set()
        self._on_phase = on_phase

    def feed(self, line: str, now: float) -> LogEvent | None:
        """Every pattern the line matches counts (0.33 puts two on one line); the event names the first."""
        text = _ANSI.sub("", line).rstrip("\r\n")
        event: LogEvent | None = None
        for line_kind, phase in LOG_LINES:
            match = line_kind.regex.search(text)
            if match is None:
                continue
            self.seen.add(line_kind.name)
            figures = tuple(
                Figure(name, _num(match.group(group)), unit, text.strip()) for name, group, unit in line_kind.figures
            )
            for figure in figures:
                self.figures[figure.name] = figure
            if phase is not None:
                self.advance(phase, now)
            if event is None:
                event = LogEvent(line_kind.name, phase, figures)
            else:
                event = LogEvent(event.pattern, event.phase or phase, event.figures + figures)
        return event

    def advance(self, phase: str, now: float) -> bool:
        """Move to `phase` if it is later than the current one (or terminal); returns whether the phase changed."""
        if phase == self.phase:
            return False
        # A loading phase never follows a terminal one, nor an earlier phase a later one.
        if phase in PHASE_RANK and (self.phase not in PHASE_RANK or PHASE_RANK[phase] < PHASE_RANK[self.phase]):
            return False
        self.phase = phase
        self.phases.append((phase, now))
        if self._on_phase is not None:
            self._on_phase(phase, now)
        return True

    def observe_download(self, active: bool, now: float) -> bool:
        """Report whether huggingface_hub is writing `*.incomplete` blobs: vLLM logs nothing when a download starts."""
        if active and self.phase in ("starting", "loading_weights") and "download_done" not in self.seen:
            # A download can only move "starting"/"loading_weights" sideways into "downloading".
            self.phase = "downloading"
            self.phases.append(("downloading", now))
            if self._on_phase is not None:
                self._on_phase("downloading", now)
            return True
        if not active and self.phase == "downloading":
            back = "loading_weights" if "load_start" in self.seen else "starting"
            self.phase = back
            self.phases.append((back, now))
            if self._on_phase is not None:
                self._on_phase(back, now)
            return True
        return False


@dataclass(frozen=True)
class Comparison:
    name: str
    measured: float
    predicted: float
    unit: str
    # (measured - predicted) / predicted, or None when the prediction is 0.
    deviation: float | None
    how: str


def compare(figures: dict[str, Figure], predictions: dict[str, Prediction]) -> list[Comparison]:
    """Each figure vLLM logged beside the plan's prediction of it, in the plan's order."""
    out = []
    for name, prediction in predictions.items():
        figure = figures.get(name)
        if figure is None:
            continue
        deviation = (figure.value - prediction.value) / prediction.value if prediction.value else None
        out.append(Comparison(name, figure.value, prediction.value, prediction.unit, deviation, prediction.how))
    return out


def format_comparison(c: Comparison) -> str:
    dev = "n/a" if c.deviation is None else f"{c.deviation * 100:+.1f}%"
    return f"{c.name}: measured {c.measured:,.2f} {c.unit}, predicted {c.predicted:,.2f} {c.unit} ({dev}; {c.how})"
