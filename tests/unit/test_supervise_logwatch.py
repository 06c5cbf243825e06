"""logwatch: phases and figures from vLLM 0.33's own log lines (format and prefix as vllm/logger.py prints them) and
from 0.26's, as the GPU host printed them. That each pattern's format is in the image's vLLM source:
tests/image/test_log_formats.py."""

from __future__ import annotations

import pytest

from t4serve.supervise.logwatch import PhaseTracker, compare, format_comparison
from t4serve.supervise.state import Figure, Prediction


def line(msg: str, proc: str = "EngineCore_DP0 pid=812", where: str = "gpu_model_runner.py:5089") -> str:
    # vllm/logger.py _FORMAT: "(%(vllm_process_name)s pid=%(process)d) %(levelname)s %(asctime)s [file:line] msg"
    return f"({proc}) INFO 12-01 10:00:03 [{where}] {msg}"


# The published bf16 run's figures (published-t4-run.md), formatted as vLLM 0.33's log calls format them.
BF16_START = [
    line("Starting to load model google/gemma-4-E2B-it..."),
    line("Loading weights took 151.02 seconds", where="default_loader.py:507"),
    line("Model loading took 9.8 GiB memory and 157.180000 seconds"),
    line("torch.compile took 55.13 s in total", where="monitor.py:52"),
    line("Available KV cache memory: 2.83 GiB", where="gpu_worker.py:773"),
    line(
        "GPU KV cache size: 315,974 tokens, Maximum concurrency for 16,384 tokens per request: 19.29x",
        where="kv_cache_utils.py:1148",
    ),
    line("Graph capturing finished in 12 secs, took 0.41 GiB", where="gpu_model_runner.py:6517"),
    line(
        "init engine (profile, create kv cache, warmup model) took 93.85 s (compilation: 55.13 s)", where="core.py:396"
    ),
    line("Starting vLLM server on http://0.0.0.0:8000", proc="APIServer pid=1", where="entry.py:139"),
]


def test_phases_follow_vllm_order_with_times() -> None:
    tracker = PhaseTracker(now=0.0)
    for i, text in enumerate(BF16_START, start=1):
        tracker.feed(text, float(i))
    assert [(p, t) for p, t in tracker.phases] == [
        ("starting", 0.0),
        ("loading_weights", 1.0),
        ("profiling", 3.0),
        ("compiling", 6.0),
    ]


# vLLM 0.26.0 (the GPU host's) logs KV tokens and concurrency with two `logger.info_once` calls
# (v1/core/kv_cache_utils.py get_kv_cache_configs), 0.33 on one line: both give the same figures and phases.
V026_KV_LINES = [
    line("GPU KV cache size: 313,573 tokens", where="kv_cache_utils.py:2177"),
    line("Maximum concurrency for 16,384 tokens per request: 19.14x", where="kv_cache_utils.py:2178"),
]


def test_kv_figures_from_vllm_026s_two_lines() -> None:
    tracker = PhaseTracker(now=0.0)
    events = [tracker.feed(text, 1.0) for text in V026_KV_LINES]
    assert [e.pattern for e in events if e is not None] == ["kv_capacity", "kv_concurrency"]
    values = {name: f.value for name, f in tracker.figures.items()}
    assert values == {"kv_tokens": 313_573, "max_model_len": 16_384, "max_concurrency": 19.14}
    assert tracker.phase == "compiling"


def test_vllm_026s_v2_model_runner_lines_give_the_loading_phases_and_model_memory() -> None:
    """As the GPU host's vLLM 0.26.0 logged them (docs/verified/gpu-host-vllm-0.26.0)."""
    tracker = PhaseTracker(now=0.0)
    tracker.feed(line("Loading model from scratch...", where="model_runner.py:284"), 1.0)
    tracker.feed(line("Model loading took 9.8 GiB and 6.113730 seconds", where="model_runner.py:305"), 2.0)
    assert [p for p, _ in tracker.phases] == ["starting", "loading_weights", "profiling"]
    assert tracker.figures["model_memory_gib"].value == 9.8 and tracker.figures["model_load_seconds"].value == 6.11373


def test_one_line_with_two_patterns_counts_both() -> None:
    tracker = PhaseTracker(now=0.0)
    event = tracker.feed(BF16_START[5], 1.0)
    assert event is not None and event.pattern == "kv_capacity"
    assert {f.name for f in event.figures} == {"kv_tokens", "max_model_len", "max_concurrency"}
    assert tracker.seen >= {"kv_capacity", "kv_concurrency"}


def test_figures_parsed_exactly() -> None:
    tracker = PhaseTracker(now=0.0)
    for text in BF16_START:
        tracker.feed(text, 1.0)
    values = {name: (f.value, f.unit) for name, f in tracker.figures.items()}
    assert values == {
        "weights_load_seconds": (151.02, "s"),
        "model_memory_gib": (9.8, "GiB"),
        "model_load_seconds": (157.18, "s"),
        "torch_compile_seconds": (55.13, "s"),
        "kv_cache_memory_gib": (2.83, "GiB"),
        "kv_tokens": (315974.0, "tokens"),
        "max_model_len": (16384.0, "tokens"),
        "max_concurrency": (19.29, "x"),
        "cuda_graph_seconds": (12.0, "s"),
        "cuda_graph_gib": (0.41, "GiB"),
        "init_engine_seconds": (93.85, "s"),
    }
    assert "315,974 tokens" in tracker.figures["kv_tokens"].line


def test_colour_codes_are_ignored() -> None:
    tracker = PhaseTracker(now=0.0)
    tracker.feed("\x1b[32m" + line("Model loading took 8.02 GiB memory and 98.700000 seconds") + "\x1b[0m\n", 1.0)
    assert tracker.figures["model_load_seconds"].value == 98.7
    assert tracker.phase == "profiling"


def test_phases_never_go_back_and_terminal_phases_stick() -> None:
    tracker = PhaseTracker(now=0.0)
    tracker.feed(BF16_START[2], 1.0)  # profiling
    tracker.feed(BF16_START[0], 2.0)  # a late "Starting to load model" (another rank's log) must not rewind
    assert tracker.phase == "profiling"
    assert tracker.advance("failed", 3.0)
    assert not tracker.advance("compiling", 4.0)
    assert tracker.phase == "failed"


def test_download_is_seen_from_the_cache_and_ends_with_vllms_line() -> None:
    tracker = PhaseTracker(now=0.0)
    tracker.feed(BF16_START[0], 1.0)
    assert tracker.observe_download(True, 2.0)
    assert tracker.phase == "downloading"
    tracker.feed(line("Time spent downloading weights for google/gemma-4-E2B-it: 61.500000 seconds"), 63.0)
    assert tracker.phase == "loading_weights"
    assert tracker.figures["download_seconds"].value == 61.5
    # Once vLLM said the download is done, a stray .incomplete file does not send it back.
    assert not tracker.observe_download(True, 64.0)
    assert [p for p, _ in tracker.phases] == ["starting", "loading_weights", "downloading", "loading_weights"]


def test_download_that_stops_before_vllm_says_so_returns_to_the_previous_phase() -> None:
    tracker = PhaseTracker(now=0.0)
    assert tracker.observe_download(True, 1.0)
    assert tracker.observe_download(False, 2.0)
    assert tracker.phase == "starting"


def test_unrelated_lines_change_nothing() -> None:
    tracker = PhaseTracker(now=0.0)
    assert tracker.feed(line("Using TRITON_ATTN attention backend out of potential backends"), 1.0) is None
    assert tracker.phase == "starting" and tracker.figures == {}


def test_compare_with_predictions() -> None:
    figures = {"kv_tokens": Figure("kv_tokens", 315_974, "tokens", "...")}
    preds = {
        "kv_tokens": Prediction("kv_tokens", 300_000, "tokens", "pool / block"),
        "max_concurrency": Prediction("max_concurrency", 19.0, "x", "kv / len"),
    }
    [c] = compare(figures, preds)
    assert c.deviation == pytest.approx(15_974 / 300_000)
    assert "+5.3%" in format_comparison(c)


def test_a_download_that_stops_returns_to_loading_weights_after_vllm_034s_load_line() -> None:
    """vLLM 0.34's only model runner says "Loading model from scratch..." where 0.33's V1 runner said "Starting to
    load model": the tracker read the first as another line, so a download seen after it fell back to "starting"."""
    tracker = PhaseTracker(now=0.0)
    tracker.feed(line("Loading model from scratch...", where="model_runner.py:412"), 1.0)
    assert tracker.phase == "loading_weights"
    assert tracker.observe_download(True, 2.0)
    assert tracker.observe_download(False, 3.0)
    assert tracker.phase == "loading_weights"
