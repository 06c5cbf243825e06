"""GPU telemetry through NVML: power vs limit, clocks vs max, utilisation, memory, temperature, throttle reasons.

`read_samples(nvml)` reads every visible GPU once; `render_prometheus(samples)` and `log_line(sample)` are pure.
prometheus_client writes the exposition (metric types, label escaping) and serves it: `run(...)` serves /metrics on
its own port and logs one line a minute. Without NVML (no driver, no GPU)
`main` says so once and returns 0, so supervisord (exitcodes=0, autorestart=unexpected) leaves it stopped.
"""

from __future__ import annotations

import threading
import time
import wsgiref.simple_server
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from types import ModuleType
from typing import Any, TextIO
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer
from wsgiref.types import StartResponse, WSGIEnvironment

from prometheus_client import generate_latest, make_wsgi_app
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.exposition import ThreadingWSGIServer
from prometheus_client.registry import Collector, CollectorRegistry

from t4serve.gpus import THROTTLE_REASONS, clocks_event_reasons_query, decode_throttle_reasons, throttle_labels
from t4serve.units import GIB

LOG_EVERY_S = 60.0


@dataclass(frozen=True)
class GpuSample:
    index: int
    name: str
    uuid: str
    power_w: float | None
    power_limit_w: float | None
    sm_clock_mhz: int | None
    sm_clock_max_mhz: int | None
    memory_clock_mhz: int | None
    memory_clock_max_mhz: int | None
    utilization_gpu_pct: int | None
    utilization_memory_pct: int | None
    memory_used_bytes: int | None
    memory_total_bytes: int | None
    temperature_c: int | None
    throttle_mask: int | None


def _try(nvml: ModuleType, fn: Callable[..., Any], *args: Any) -> Any:
    """One NVML query; a query the device does not support is an absent figure, not a crash."""
    try:
        return fn(*args)
    except nvml.NVMLError:
        return None


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def read_samples(nvml: ModuleType) -> list[GpuSample]:
    reasons_fn = clocks_event_reasons_query(nvml)
    samples = []
    for i in range(nvml.nvmlDeviceGetCount()):
        h = nvml.nvmlDeviceGetHandleByIndex(i)
        power_mw = _try(nvml, nvml.nvmlDeviceGetPowerUsage, h)
        limit_mw = _try(nvml, nvml.nvmlDeviceGetEnforcedPowerLimit, h)
        util = _try(nvml, nvml.nvmlDeviceGetUtilizationRates, h)
        mem = _try(nvml, nvml.nvmlDeviceGetMemoryInfo, h)
        samples.append(
            GpuSample(
                index=i,
                name=_text(nvml.nvmlDeviceGetName(h)),
                uuid=_text(nvml.nvmlDeviceGetUUID(h)),
                power_w=None if power_mw is None else power_mw / 1000.0,
                power_limit_w=None if limit_mw is None else limit_mw / 1000.0,
                sm_clock_mhz=_try(nvml, nvml.nvmlDeviceGetClockInfo, h, nvml.NVML_CLOCK_SM),
                sm_clock_max_mhz=_try(nvml, nvml.nvmlDeviceGetMaxClockInfo, h, nvml.NVML_CLOCK_SM),
                memory_clock_mhz=_try(nvml, nvml.nvmlDeviceGetClockInfo, h, nvml.NVML_CLOCK_MEM),
                memory_clock_max_mhz=_try(nvml, nvml.nvmlDeviceGetMaxClockInfo, h, nvml.NVML_CLOCK_MEM),
                utilization_gpu_pct=None if util is None else int(util.gpu),
                utilization_memory_pct=None if util is None else int(util.memory),
                memory_used_bytes=None if mem is None else int(mem.used),
                memory_total_bytes=None if mem is None else int(mem.total),
                temperature_c=_try(nvml, nvml.nvmlDeviceGetTemperature, h, nvml.NVML_TEMPERATURE_GPU),
                throttle_mask=_try(nvml, reasons_fn, h),
            )
        )
    return samples


# metric name, help, unit source (attribute), scale
_GAUGES: tuple[tuple[str, str, str, float], ...] = (
    ("t4serve_gpu_power_watts", "Power draw", "power_w", 1.0),
    ("t4serve_gpu_power_limit_watts", "Enforced power limit", "power_limit_w", 1.0),
    ("t4serve_gpu_sm_clock_mhz", "SM clock", "sm_clock_mhz", 1.0),
    ("t4serve_gpu_sm_clock_max_mhz", "Maximum SM clock", "sm_clock_max_mhz", 1.0),
    ("t4serve_gpu_memory_clock_mhz", "Memory clock", "memory_clock_mhz", 1.0),
    ("t4serve_gpu_memory_clock_max_mhz", "Maximum memory clock", "memory_clock_max_mhz", 1.0),
    ("t4serve_gpu_utilization_ratio", "Share of time a kernel ran (NVML utilization.gpu)", "utilization_gpu_pct", 0.01),
    (
        "t4serve_gpu_memory_utilization_ratio",
        "Share of time memory was read or written (NVML utilization.memory)",
        "utilization_memory_pct",
        0.01,
    ),
    ("t4serve_gpu_memory_used_bytes", "GPU memory used", "memory_used_bytes", 1.0),
    ("t4serve_gpu_memory_total_bytes", "GPU memory total", "memory_total_bytes", 1.0),
    ("t4serve_gpu_temperature_celsius", "GPU temperature", "temperature_c", 1.0),
)


# Every series carries these labels, in this order; the clocks-event series add `reason`.
LABELS = ("gpu", "name", "uuid")


def _label_values(s: GpuSample) -> list[str]:
    return [str(s.index), s.name, s.uuid]


def metric_families(samples: list[GpuSample]) -> list[Metric]:
    """The gauges of the samples; absent readings are left out rather than reported as 0."""
    families: list[Metric] = []
    for metric, help_text, attr, scale in _GAUGES:
        family = GaugeMetricFamily(metric, help_text, labels=LABELS)
        for s in samples:
            value = getattr(s, attr)
            if value is not None:
                family.add_metric(_label_values(s), value * scale)
        families.append(family)
    reasons = GaugeMetricFamily(
        "t4serve_gpu_clocks_event_reason",
        "Why the clocks are held below max (NVML clocks event reasons)",
        labels=[*LABELS, "reason"],
    )
    for s in samples:
        if s.throttle_mask is None:
            continue
        active = set(decode_throttle_reasons(s.throttle_mask))
        for _bit, key, _label in THROTTLE_REASONS:
            reasons.add_metric([*_label_values(s), key], 1 if key in active else 0)
    families.append(reasons)
    return families


class _Samples(Collector):
    """A collector over fixed samples, or over a Sampler read at every scrape."""

    def __init__(self, read: Callable[[], list[GpuSample]]) -> None:
        self.read = read

    def collect(self) -> Iterable[Metric]:
        return metric_families(self.read())


def _registry(read: Callable[[], list[GpuSample]]) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Samples(read))
    return registry


def render_prometheus(samples: list[GpuSample]) -> str:
    """Prometheus text exposition format 0.0.4, written by prometheus_client."""
    return generate_latest(_registry(lambda: samples)).decode()


def _pct(value: float | None, limit: float | None) -> str:
    if value is None or not limit:
        return ""
    return f" ({value / limit * 100:.0f}%)"


def log_line(s: GpuSample) -> str:
    def show(v: float | None, fmt: str) -> str:
        return "?" if v is None else format(v, fmt)

    reasons = "?" if s.throttle_mask is None else ", ".join(throttle_labels(s.throttle_mask)) or "none"
    used = None if s.memory_used_bytes is None else s.memory_used_bytes / GIB
    total = None if s.memory_total_bytes is None else s.memory_total_bytes / GIB
    return (
        f"gpu{s.index} {s.name}: power {show(s.power_w, '.1f')}/{show(s.power_limit_w, '.0f')} W"
        f"{_pct(s.power_w, s.power_limit_w)}, SM {show(s.sm_clock_mhz, 'd')}/{show(s.sm_clock_max_mhz, 'd')} MHz"
        f"{_pct(s.sm_clock_mhz, s.sm_clock_max_mhz)}, mem clock {show(s.memory_clock_mhz, 'd')}/"
        f"{show(s.memory_clock_max_mhz, 'd')} MHz, util {show(s.utilization_gpu_pct, 'd')}% "
        f"(memory {show(s.utilization_memory_pct, 'd')}%), memory {show(used, '.2f')}/{show(total, '.2f')} GiB, "
        f"{show(s.temperature_c, 'd')} C, clocks held by: {reasons}"
    )


class Sampler:
    """Holds the latest samples; /metrics reads NVML at scrape time so a scrape is never stale."""

    def __init__(self, nvml: ModuleType) -> None:
        self.nvml = nvml
        self.lock = threading.Lock()

    def sample(self) -> list[GpuSample]:
        with self.lock:
            return read_samples(self.nvml)


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        # Prometheus scrapes every few seconds; logging each would drown vLLM's log.
        return


def make_server(sampler: Sampler, host: str, port: int) -> WSGIServer:
    """/metrics from prometheus_client's WSGI app over a registry that reads NVML at scrape time; any other path
    is a 404. Threaded, so a slow scrape does not hold the next."""
    metrics = make_wsgi_app(_registry(sampler.sample))

    def app(environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        if environ.get("PATH_INFO") != "/metrics":
            start_response("404 Not Found", [("Content-Type", "text/plain; charset=utf-8")])
            return [b"only /metrics is served here\n"]
        result: Iterable[bytes] = metrics(environ, start_response)
        return result

    return wsgiref.simple_server.make_server(host, port, app, ThreadingWSGIServer, _QuietHandler)


def load_nvml() -> tuple[ModuleType | None, str | None]:
    """pynvml initialised, or the reason it cannot be (no library, no driver, no device)."""
    try:
        import pynvml
    except ImportError as exc:
        return None, f"the nvidia-ml-py package is not installed ({exc})"
    try:
        pynvml.nvmlInit()
        count = pynvml.nvmlDeviceGetCount()
    except pynvml.NVMLError as exc:
        return None, f"NVML could not start: {exc} (no NVIDIA driver visible in this container)"
    if count == 0:
        return None, "NVML sees no GPU (NVIDIA_VISIBLE_DEVICES / CUDA_VISIBLE_DEVICES, or no --gpus request)"
    return pynvml, None


def run(
    host: str,
    port: int,
    out: TextIO,
    *,
    duration_s: float | None = None,
    log_every_s: float = LOG_EVERY_S,
    nvml: ModuleType | None = None,
) -> int:
    """Serve /metrics and log a line every `log_every_s`; runs until killed, or for `duration_s` when given."""
    if nvml is None:
        nvml, reason = load_nvml()
        if nvml is None:
            print(f"telemetry: no GPU telemetry: {reason}; exiting cleanly (not restarted)", file=out, flush=True)
            return 0
    sampler = Sampler(nvml)
    server = make_server(sampler, host, port)
    thread = threading.Thread(target=server.serve_forever, name="t4serve-metrics", daemon=True)
    thread.start()
    print(f"telemetry: serving /metrics on {host}:{server.server_address[1]}", file=out, flush=True)
    started = time.monotonic()
    try:
        while True:
            for s in sampler.sample():
                print(f"telemetry: {log_line(s)}", file=out, flush=True)
            left = None if duration_s is None else duration_s - (time.monotonic() - started)
            if left is not None and left <= 0:
                return 0
            time.sleep(log_every_s if left is None else min(log_every_s, left))
    finally:
        server.shutdown()
        server.server_close()
