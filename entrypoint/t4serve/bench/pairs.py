"""A cell's ratio pair by pair, and which cells of a sweep are complete.

Pure. A pair is one repeat of a cell measured for two models (or, for `bench compare`, in two folders): the same
seed, so the same prompts, and in an interleaved sweep the same minutes of the host's life. A cell's ratio is the
median of its pair ratios, with their lowest and highest (the spread): drift of the host between pairs moves both
sides of each pair and cancels, where a ratio of two medians taken at different times would carry it. A cell is
decided when every pair puts the same model ahead. A cell is complete when every model measured every repeat.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass

from t4serve.bench.results import Run, RunFigures, RunsFile

# The fewest pairs whose spread says anything: one pair has no spread.
MIN_PAIRS = 2


@dataclass(frozen=True)
class PairRatio:
    """The median of a cell's pair ratios, the lowest and highest of them, and how many pairs there were."""

    median: float
    low: float
    high: float
    pairs: int

    def text(self, unit: str = "x") -> str:
        if self.pairs == 1:
            return f"{self.median:.2f}{unit} (1 pair)"
        return f"{self.median:.2f}{unit} [{self.low:.2f} - {self.high:.2f}] ({self.pairs} pairs)"

    def change(self) -> str:
        """As a change in percent: median [lowest - highest]."""
        median, low, high = ((v - 1) * 100 for v in (self.median, self.low, self.high))
        if self.pairs == 1:
            return f"{median:+.1f} %"
        return f"{median:+.1f} % [{low:+.1f} - {high:+.1f}]"

    @property
    def decided(self) -> str:
        """"yes": at least MIN_PAIRS pairs, all on one side of 1 (beyond the spread); "no": some on each side or
        one at 1 (within it); "-": too few pairs to judge."""
        if self.pairs < MIN_PAIRS:
            return "-"
        return "yes" if self.low > 1 or self.high < 1 else "no"


def measured(runs: list[Run], model: str, input_len: int, concurrency: int) -> dict[int, RunFigures]:
    """A model's measured runs of a cell by repeat (failed runs and runs with no completed request left out)."""
    return {r.repeat: r.figures for r in runs
            if r.model == model and r.input_len == input_len and r.concurrency == concurrency
            and r.figures is not None and r.figures.completed > 0}


def pair_ratio(num: dict[int, RunFigures], den: dict[int, RunFigures],
               value: Callable[[RunFigures], float]) -> PairRatio | None:
    """value(num) / value(den) per repeat both measured (and den's value above 0); None with no such repeat."""
    ratios = [value(num[r]) / value(den[r]) for r in sorted(num.keys() & den.keys()) if value(den[r]) > 0]
    if not ratios:
        return None
    return PairRatio(statistics.median(ratios), min(ratios), max(ratios), len(ratios))


def throughput(f: RunFigures) -> float:
    return f.output_throughput


def tpot(f: RunFigures) -> float:
    return f.median_tpot_ms


def ttft(f: RunFigures) -> float:
    return f.median_ttft_ms


def per_stream(f: RunFigures) -> float:
    return 1000 / f.median_tpot_ms if f.median_tpot_ms > 0 else 0.0


@dataclass(frozen=True)
class CellVerdict:
    """A cell's winner over its runner-up, pair by pair: throughput ratio and TPOT ratio (above 1: the winner's
    streams are each that much slower)."""

    winner: str
    runner_up: str
    throughput: PairRatio
    tpot: PairRatio | None


def verdict(runs: list[Run], models: list[str], input_len: int, concurrency: int) -> CellVerdict | None:
    """The two models with the highest median throughput in the cell, the one ahead pair by pair first; None when
    fewer than two models have a pair in it."""
    by_model = {m: measured(runs, m, input_len, concurrency) for m in models}
    ranked = sorted((m for m in models if by_model[m]),
                    key=lambda m: statistics.median(f.output_throughput for f in by_model[m].values()), reverse=True)
    if len(ranked) < 2:
        return None
    a, b = ranked[0], ranked[1]
    ratio = pair_ratio(by_model[a], by_model[b], throughput)
    if ratio is None:
        return None
    if ratio.median < 1:
        a, b = b, a
        ratio = pair_ratio(by_model[a], by_model[b], throughput)
        assert ratio is not None
    return CellVerdict(a, b, ratio, pair_ratio(by_model[a], by_model[b], tpot))


@dataclass(frozen=True)
class CellState:
    """How many of a cell's planned pairs are complete (every model measured that repeat)."""

    input_len: int
    concurrency: int
    complete: int
    planned: int

    @property
    def label(self) -> str:
        return f"{self.input_len}/c{self.concurrency}"


def completeness(runs_file: RunsFile) -> list[CellState]:
    """Every cell of the grid, in grid order, with its complete pairs."""
    states = []
    for i in runs_file.inputs:
        for c in runs_file.concurrencies:
            done = [set(measured(runs_file.runs, m, i, c)) for m in runs_file.models]
            both = set.intersection(*done) if done else set()
            states.append(CellState(i, c, len(both & set(range(1, runs_file.repeats + 1))), runs_file.repeats))
    return states


def completeness_lines(runs_file: RunsFile) -> list[str]:
    """The report's paragraph on an incomplete sweep: which cells are complete, and how far each other one got."""
    states = completeness(runs_file)
    complete = [s.label for s in states if s.complete == s.planned]
    partly = [f"{s.label} ({s.complete} of {s.planned} pairs)" for s in states if 0 < s.complete < s.planned]
    none = [s.label for s in states if s.complete == 0]
    what = "pair" if len(runs_file.models) > 1 else "repeat"
    return [
        f"Complete cells (every model measured every repeat): {', '.join(complete) or 'none'}.",
        f"Incomplete: {', '.join(partly) or 'none'}. Without a complete {what}: {', '.join(none) or 'none'}.",
    ]
