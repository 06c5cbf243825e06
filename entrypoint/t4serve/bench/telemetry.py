"""GPU telemetry while a cell runs: NVML power, SM clock and throttle reasons, sampled in a background thread.

Missing NVML (no GPU, no driver) is not an error for a benchmark: the sampler records why it has no samples.
"""

from __future__ import annotations

import contextlib
import threading
from types import TracebackType
from typing import Any

from t4serve.bench.results import Telemetry
from t4serve.gpus import clocks_event_reasons_query, throttle_labels


class Sampler:
    """`with Sampler(interval) as s: ...; s.result()`: samples device 0 every `interval` seconds."""

    def __init__(self, interval: float = 0.5, device_index: int = 0) -> None:
        self.interval = interval
        self.device_index = device_index
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._power: list[float] = []
        self._clock: list[float] = []
        self._reasons: set[str] = set()
        self._limit: float | None = None
        self._max_clock: float | None = None
        self._error: str | None = None
        self._nvml: Any = None
        self._handle: Any = None

    def __enter__(self) -> Sampler:
        try:
            import pynvml

            pynvml.nvmlInit()
            self._nvml = pynvml
            self._handle = pynvml.nvmlDeviceGetHandleByIndex(self.device_index)
            self._limit = pynvml.nvmlDeviceGetEnforcedPowerLimit(self._handle) / 1000
            self._max_clock = float(pynvml.nvmlDeviceGetMaxClockInfo(self._handle, pynvml.NVML_CLOCK_SM))
        except Exception as exc:  # ImportError, NVMLError_LibraryNotFound, NVMLError_DriverNotLoaded, ...
            self._error = f"NVML unavailable: {type(exc).__name__}: {exc}"
            return self
        self._thread = threading.Thread(target=self._loop, name="bench-telemetry", daemon=True)
        self._thread.start()
        return self

    def _loop(self) -> None:
        nvml, handle = self._nvml, self._handle
        while not self._stop.wait(self.interval):
            try:
                self._power.append(nvml.nvmlDeviceGetPowerUsage(handle) / 1000)
                self._clock.append(float(nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM)))
                self._reasons.update(throttle_labels(clocks_event_reasons_query(nvml)(handle)))
            except Exception as exc:  # a GPU lost mid-run: keep what was sampled, say why it stopped
                self._error = f"NVML sampling stopped: {type(exc).__name__}: {exc}"
                return

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self._nvml is not None:
            # Shutting NVML down cannot fail the benchmark.
            with contextlib.suppress(Exception):
                self._nvml.nvmlShutdown()

    def result(self) -> Telemetry:
        return Telemetry(
            samples=len(self._power),
            power_w_mean=sum(self._power) / len(self._power) if self._power else None,
            power_limit_w=self._limit,
            sm_clock_mhz_mean=sum(self._clock) / len(self._clock) if self._clock else None,
            sm_clock_max_mhz=self._max_clock,
            throttle_reasons=sorted(self._reasons - {"GPU idle"}),
            error=self._error,
        )
