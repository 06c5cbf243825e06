"""vLLM's /metrics per run: the parser on pages prometheus_client writes with vLLM's metric names and types, the
figures from two scrapes and the gauge samples, and the sampler against the stand-in server and against nothing."""

from __future__ import annotations

import json
import threading
import urllib.request

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from test_bench_runner import free_port, start_standin

from t4serve.bench.serverside import MetricsSampler, parse, summarize

LABELS = ["model_name", "engine"]


def vllm_page(running: float, waiting: float, kv: float, preemptions: float, steps: list[int],
              queue_s: list[float]) -> str:
    """A /metrics page as vLLM 0.33's PrometheusStatLogger writes it (vllm/v1/metrics/loggers.py: the same names,
    types and labels), through prometheus_client's own exposition."""
    registry = CollectorRegistry()
    labels = {"model_name": "t4serve", "engine": "0"}
    Gauge("vllm:num_requests_running", "", LABELS, registry=registry).labels(**labels).set(running)
    Gauge("vllm:num_requests_waiting", "", LABELS, registry=registry).labels(**labels).set(waiting)
    Gauge("vllm:kv_cache_usage_perc", "", LABELS, registry=registry).labels(**labels).set(kv)
    Counter("vllm:num_preemptions", "", LABELS, registry=registry).labels(**labels).inc(preemptions)
    tokens = Histogram("vllm:iteration_tokens_total", "", LABELS, registry=registry, buckets=[1, 8, 16, 2048])
    for n in steps:
        tokens.labels(**labels).observe(n)
    queue = Histogram("vllm:request_queue_time_seconds", "", LABELS, registry=registry)
    for s in queue_s:
        queue.labels(**labels).observe(s)
    return generate_latest(registry).decode()


def test_parse_reads_gauges_counters_and_histogram_sums() -> None:
    page = parse(vllm_page(3, 1, 0.25, 2, [2048, 16, 16], [0.5, 1.5]))
    assert page["vllm:num_requests_running"] == 3.0
    assert page["vllm:kv_cache_usage_perc"] == 0.25
    assert page["vllm:num_preemptions_total"] == 2.0
    assert page["vllm:iteration_tokens_total_count"] == 3.0
    assert page["vllm:iteration_tokens_total_sum"] == 2080.0
    assert page["vllm:request_queue_time_seconds_sum"] == 2.0
    # Label sets of one name add up; comments, blank and malformed lines are skipped; inf and nan are not figures.
    odd = 'a{x="1"} 2\na{x="2"} 3\n# HELP a\n\nb{x="}"} 1\nc nonsense\nd NaN\ne +Inf\n'
    assert parse(odd) == {"a": 5.0, "b": 1.0}


def test_summary_is_the_difference_of_two_scrapes_and_the_busy_samples() -> None:
    first = parse(vllm_page(0, 0, 0.0, 1, [5], [0.1]))
    last = parse(vllm_page(0, 0, 0.0, 4, [5, 2048, 16, 16, 16], [0.1, 0.3, 0.5]))
    gauges = [(0.0, 0.0, 0.0), (8.0, 4.0, 0.5), (6.0, 0.0, 0.75), (0.0, 0.0, 0.0)]
    s = summarize(first, last, gauges, None)
    assert s.samples == 4
    assert s.running_mean == 7.0  # over the two samples with work, not the idle ones
    assert (s.running_max, s.waiting_max, s.kv_usage_max_pct) == (8.0, 4.0, 75.0)
    assert s.preemptions == 3.0
    assert s.steps == 4.0
    assert s.tokens_per_step == pytest.approx((2048 + 16 * 3) / 4)
    assert s.queue_ms_mean == pytest.approx(400.0)  # (0.3 + 0.5) / 2 s
    assert s.prefill_ms_mean is None and s.decode_ms_mean is None  # absent from this page: not made up
    assert summarize(None, None, [], "GET x: refused").error == "GET x: refused"


def test_sampler_against_the_standin_sees_its_requests() -> None:
    url, proc = start_standin({"T4SERVE_STANDIN_TOKEN_DELAY": "0.02"})
    try:
        body = json.dumps({"model": "served-qat", "prompt": "one two three", "max_tokens": 20, "ignore_eos": True})

        def complete() -> None:
            request = urllib.request.Request(f"{url}/v1/completions", data=body.encode(),
                                             headers={"content-type": "application/json"})
            urllib.request.urlopen(request, timeout=30).read()

        with MetricsSampler(url, 0.05) as sampler:
            workers = [threading.Thread(target=complete) for _ in range(3)]
            for w in workers:
                w.start()
            for w in workers:
                w.join()
        s = sampler.result()
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    assert s.error is None, s
    assert s.samples >= 3
    assert s.running_max is not None and s.running_max >= 1
    assert s.preemptions == 0.0
    assert s.queue_ms_mean is not None and s.decode_ms_mean is not None and s.decode_ms_mean >= 19 * 20 * 0.9
    assert s.steps is None and s.tokens_per_step is None  # the stand-in has no engine steps: said, not invented


def test_sampler_without_a_server_says_why() -> None:
    with MetricsSampler(f"http://127.0.0.1:{free_port()}", 0.05) as sampler:
        pass
    s = sampler.result()
    assert s.samples == 0 and s.running_mean is None
    assert s.error is not None and "/metrics" in s.error
