"""vLLM's own view of a run: its Prometheus /metrics, scraped while the cell runs, in a background thread.

Why a cell came out as it did is in the server, not the client: how many requests ran at once, how many waited,
how full the KV cache got, how many engine steps the work took and how many tokens each carried, how long requests
queued before they were scheduled, and whether any were preempted. The sampler reads the same port the client talks
to (vLLM serves /metrics beside /v1; it needs no API key) every `interval` seconds:

- gauges (`vllm:num_requests_running`, `vllm:num_requests_waiting`, `vllm:kv_cache_usage_perc`) per sample: the
  mean of running over the samples where the server had work (running or waiting above 0), and the maxima;
- counters and histograms (`vllm:num_preemptions`, `vllm:iteration_tokens_total`, `vllm:request_queue_time_seconds`,
  `vllm:request_prefill_time_seconds`, `vllm:request_decode_time_seconds`) as the difference between the first and
  the last scrape.

The window is the whole `vllm bench serve` process, so its single test prompt and its warm-up requests count too: a
few requests beside the cell's 8 to 64. A server that does not serve /metrics (or a metric a vLLM version lacks)
leaves those figures None and says why; the benchmark goes on.
"""

from __future__ import annotations

import math
import threading
import time
from types import TracebackType

from t4serve.bench.results import ServerSide
from t4serve.httpclient import HttpFailure, fetch

# A vLLM /metrics page is tens of KB; past this it is not one.
MAX_METRICS_BYTES = 4 << 20

GAUGES = ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc")
COUNTERS = ("vllm:num_preemptions",)
HISTOGRAMS = (
    "vllm:iteration_tokens_total",
    "vllm:request_queue_time_seconds",
    "vllm:request_prefill_time_seconds",
    "vllm:request_decode_time_seconds",
)


def parse(text: str) -> dict[str, float]:
    """A Prometheus text page as {series: value}, every label set of a name summed (one engine, one model):
    counters under their `_total` name, histograms as NAME_sum and NAME_count. Malformed lines are skipped."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name_part, _, rest = line.partition(" ")
        if "{" in name_part or ("{" in line and "}" in line):
            name = line.split("{", 1)[0]
            rest = line.rsplit("}", 1)[1].strip()
        else:
            name = name_part
        fields = rest.split()
        if not name or not fields:
            continue
        try:
            value = float(fields[0])
        except ValueError:
            continue
        if not math.isfinite(value):
            continue
        out[name] = out.get(name, 0.0) + value
    return out


def _delta(first: dict[str, float], last: dict[str, float], name: str) -> float | None:
    if name not in first or name not in last:
        return None
    return max(last[name] - first[name], 0.0)


def _mean_ms(first: dict[str, float], last: dict[str, float], name: str) -> float | None:
    total, count = _delta(first, last, f"{name}_sum"), _delta(first, last, f"{name}_count")
    if total is None or not count:
        return None
    return total / count * 1000


def summarize(first: dict[str, float] | None, last: dict[str, float] | None,
              gauges: list[tuple[float, float, float]], error: str | None) -> ServerSide:
    """The run's figures from its first and last scrape and the (running, waiting, kv usage) samples between."""
    busy = [g for g in gauges if g[0] > 0 or g[1] > 0]
    if first is None or last is None:
        return ServerSide(samples=len(gauges), error=error or "no /metrics page was read")
    steps = _delta(first, last, "vllm:iteration_tokens_total_count")
    tokens = _delta(first, last, "vllm:iteration_tokens_total_sum")
    return ServerSide(
        samples=len(gauges),
        running_mean=sum(g[0] for g in busy) / len(busy) if busy else None,
        running_max=max(g[0] for g in gauges) if gauges else None,
        waiting_max=max(g[1] for g in gauges) if gauges else None,
        kv_usage_max_pct=max(g[2] for g in gauges) * 100 if gauges else None,
        preemptions=_delta(first, last, "vllm:num_preemptions_total"),
        steps=steps,
        tokens_per_step=tokens / steps if tokens is not None and steps else None,
        queue_ms_mean=_mean_ms(first, last, "vllm:request_queue_time_seconds"),
        prefill_ms_mean=_mean_ms(first, last, "vllm:request_prefill_time_seconds"),
        decode_ms_mean=_mean_ms(first, last, "vllm:request_decode_time_seconds"),
        error=error,
    )


class MetricsSampler:
    """`with MetricsSampler(url, interval) as s: ...; s.result()`: scrapes URL/metrics until the block ends."""

    def __init__(self, base_url: str, interval: float = 0.5) -> None:
        self.url = f"{base_url.rstrip('/')}/metrics"
        self.interval = interval
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._first: dict[str, float] | None = None
        self._last: dict[str, float] | None = None
        self._gauges: list[tuple[float, float, float]] = []
        self._error: str | None = None

    def _scrape(self) -> dict[str, float] | None:
        try:
            answer = fetch("GET", self.url, deadline_s=max(self.interval * 4, 2.0), max_bytes=MAX_METRICS_BYTES)
        except HttpFailure as exc:
            self._error = f"GET {self.url}: {exc.reason}"
            return None
        if answer.status != 200:
            self._error = f"GET {self.url}: HTTP {answer.status}"
            return None
        return parse(answer.text(MAX_METRICS_BYTES))

    def _record(self, page: dict[str, float] | None) -> None:
        if page is None:
            return
        if self._first is None:
            self._first = page
        self._last = page
        self._gauges.append(tuple(page.get(name, 0.0) for name in GAUGES))  # type: ignore[arg-type]

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self._record(self._scrape())

    def __enter__(self) -> MetricsSampler:
        self._record(self._scrape())
        self._thread = threading.Thread(target=self._loop, name="bench-server-metrics", daemon=True)
        self._thread.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        # The last scrape after the client has finished: the counters then hold every request of the run.
        deadline = time.monotonic() + 5
        page = self._scrape()
        while page is None and time.monotonic() < deadline and self._first is not None:
            time.sleep(0.2)
            page = self._scrape()
        self._record(page)

    def result(self) -> ServerSide:
        return summarize(self._first, self._last, self._gauges, self._error)
