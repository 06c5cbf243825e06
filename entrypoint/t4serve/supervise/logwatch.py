"""Follow vLLM's log to know its phase and the figures it reports, and compare those with the plan's predictions.

Pure: `PhaseTracker.feed(line, now)` takes one line of vLLM output and updates the phase and figures; nothing here
reads files or clocks. Every pattern is copied from vLLM's own log calls (file named beside each) in 0.33.0, the
image's, and 0.26.0, the GPU host's: where they differ both are matched, so a changed message in another release
shows up as a missing figure, not a wrong one.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from t4serve.supervise.state import Figure, Prediction

# The order phases advance in; "downloading" and "loading_weights" share a rank because vLLM logs "Starting to load
# model" before it downloads (the download happens inside the loader), so the two can alternate.
PHASE_RANK: dict[str, int] = {
    "starting": 0,
    "downloading": 1,
    "loading_weights": 1,
    "profiling": 2,
    "compiling": 3,
    "canary": 4,
    "ready": 5,
}

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_NUM = r"([0-9][0-9,]*(?:\.[0-9]+)?)"


def _num(text: str) -> float:
    return float(text.replace(",", ""))


@dataclass(frozen=True)
class LogPattern:
    name: str
    regex: re.Pattern[str]
    # The phase this line starts, if any.
    phase: str | None
    # Figure name -> (match group, unit).
    figures: tuple[tuple[str, int, str], ...]
    # The vLLM source the message comes from, for whoever updates the pin.
    source: str


LOG_PATTERNS: tuple[LogPattern, ...] = (
    LogPattern(
        "load_start",
        re.compile(r"Starting to load model (\S+?)\.\.\."),
        "loading_weights",
        (),
        "v1/worker/gpu_model_runner.py load_model",
    ),
    LogPattern(
        "load_start_v2",
        # vLLM 0.26's V2 model runner (v1/worker/gpu/model_runner.py) logs this instead of "Starting to load model".
        re.compile(r"Loading model from scratch\.\.\."),
        "loading_weights",
        (),
        "v1/worker/gpu/model_runner.py load_model (0.26)",
    ),
    LogPattern(
        "download_done",
        re.compile(rf"Time spent downloading weights for (\S+): {_NUM} seconds"),
        "loading_weights",
        (("download_seconds", 2, "s"),),
        "model_executor/model_loader/weight_utils.py download_weights_from_hf",
    ),
    LogPattern(
        "weights_loaded",
        re.compile(rf"Loading weights took {_NUM} seconds"),
        None,
        (("weights_load_seconds", 1, "s"),),
        "model_executor/model_loader/default_loader.py",
    ),
    LogPattern(
        "model_loaded",
        # 0.33: "Model loading took N GiB memory and S seconds"; 0.26's V2 runner: "... N GiB and S seconds".
        re.compile(rf"Model loading took {_NUM} GiB (?:memory )?and {_NUM} seconds"),
        "profiling",
        (("model_memory_gib", 1, "GiB"), ("model_load_seconds", 2, "s")),
        "v1/worker/gpu_model_runner.py load_model",
    ),
    LogPattern(
        "torch_compile",
        re.compile(rf"torch\.compile took {_NUM} s in total"),
        None,
        (("torch_compile_seconds", 1, "s"),),
        "compilation/monitor.py monitor_torch_compile",
    ),
    LogPattern(
        "kv_memory",
        re.compile(rf"Available KV cache memory: {_NUM} GiB"),
        None,
        (("kv_cache_memory_gib", 1, "GiB"),),
        "v1/worker/gpu_worker.py determine_available_memory",
    ),
    LogPattern(
        "kv_memory_set",
        re.compile(rf"reserved {_NUM} GiB memory for KV Cache as specified by kv_cache_memory_bytes"),
        None,
        (("kv_cache_memory_gib", 1, "GiB"),),
        "v1/worker/gpu_worker.py determine_available_memory (a set --kv-cache-memory-bytes)",
    ),
    # 0.33 logs tokens and concurrency on one line ("GPU KV cache size: N tokens, Maximum concurrency for ..."),
    # 0.26 on two (`logger.info_once` each, in get_kv_cache_configs): one pattern for each half matches both.
    LogPattern(
        "kv_capacity",
        re.compile(rf"KV cache size: {_NUM} tokens"),
        "compiling",
        (("kv_tokens", 1, "tokens"),),
        "v1/core/kv_cache_utils.py update_kv_cache_capacity (0.26: get_kv_cache_configs)",
    ),
    LogPattern(
        "kv_concurrency",
        re.compile(rf"Maximum concurrency for {_NUM} tokens per request: {_NUM}x"),
        "compiling",
        (("max_model_len", 1, "tokens"), ("max_concurrency", 2, "x")),
        "v1/core/kv_cache_utils.py update_kv_cache_capacity (0.26: get_kv_cache_configs)",
    ),
    LogPattern(
        "cuda_graphs",
        re.compile(rf"Graph capturing finished in {_NUM} secs, took {_NUM} GiB"),
        None,
        (("cuda_graph_seconds", 1, "s"), ("cuda_graph_gib", 2, "GiB")),
        "v1/worker/gpu_model_runner.py capture_model",
    ),
    LogPattern(
        "engine_ready",
        re.compile(rf"init engine \(profile, create kv cache, warmup model\) took {_NUM} s"),
        None,
        (("init_engine_seconds", 1, "s"),),
        "v1/engine/core.py _initialize_kv_caches",
    ),
    LogPattern(
        "server_start",
        re.compile(r"Starting vLLM server on (\S+)"),
        None,
        (),
        "entrypoints/launchers/api_server/entry.py",
    ),
)


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
        for pattern in LOG_PATTERNS:
            match = pattern.regex.search(text)
            if match is None:
                continue
            self.seen.add(pattern.name)
            figures = tuple(
                Figure(name, _num(match.group(group)), unit, text.strip()) for name, group, unit in pattern.figures
            )
            for figure in figures:
                self.figures[figure.name] = figure
            if pattern.phase is not None:
                self.advance(pattern.phase, now)
            if event is None:
                event = LogEvent(pattern.name, pattern.phase, figures)
            else:
                event = LogEvent(event.pattern, event.phase or pattern.phase, event.figures + figures)
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
