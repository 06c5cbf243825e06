"""t4serve.bench.telemetry: the sampler that runs beside each benchmark cell. `RecordedPynvml` stands for the pynvml
module on a T4 held by its power cap (published-t4-run.md: ~70 W of 70 W, SM 1290 of 1590 MHz, SW power cap); without
NVML the sampler records why it has no samples instead of failing the cell."""

from __future__ import annotations

import sys
import time
import types

import pytest

from t4serve.bench.telemetry import Sampler


class RecordedPynvml(types.ModuleType):
    NVML_CLOCK_SM = 1

    class NVMLError(Exception):
        pass

    def __init__(self, lose_after: int | None = None) -> None:
        super().__init__("pynvml")
        self.calls = 0
        self.lose_after = lose_after
        self.shut_down = False

    def nvmlInit(self) -> None:
        return None

    def nvmlShutdown(self) -> None:
        self.shut_down = True

    def nvmlDeviceGetHandleByIndex(self, index: int) -> str:
        return f"gpu{index}"

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: str) -> int:
        return 70_000

    def nvmlDeviceGetMaxClockInfo(self, handle: str, kind: int) -> int:
        return 1590

    def nvmlDeviceGetPowerUsage(self, handle: str) -> int:
        self.calls += 1
        if self.lose_after is not None and self.calls > self.lose_after:
            raise self.NVMLError("GPU is lost")
        return 69_500

    def nvmlDeviceGetClockInfo(self, handle: str, kind: int) -> int:
        return 1290

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: str) -> int:
        return 0x1 | 0x4  # idle between requests, and the power cap


def test_samples_power_clock_and_reasons(monkeypatch: pytest.MonkeyPatch) -> None:
    nvml = RecordedPynvml()
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    with Sampler(interval=0.01) as sampler:
        time.sleep(0.2)
    t = sampler.result()
    assert t.error is None and t.samples >= 3 and nvml.shut_down
    assert t.power_w_mean == pytest.approx(69.5) and t.power_limit_w == 70.0
    assert t.sm_clock_mhz_mean == 1290 and t.sm_clock_max_mhz == 1590
    assert t.throttle_reasons == ["SW power cap"]  # "GPU idle" between requests is not a throttle


def test_a_gpu_lost_mid_run_keeps_what_was_sampled(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", RecordedPynvml(lose_after=2))
    with Sampler(interval=0.01) as sampler:
        time.sleep(0.2)
    t = sampler.result()
    assert t.samples == 2 and t.error is not None and "NVML sampling stopped" in t.error and "GPU is lost" in t.error


def test_without_nvml_the_cell_still_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # stands for a Python without nvidia-ml-py
    with Sampler(interval=0.01) as sampler:
        pass
    t = sampler.result()
    assert t.samples == 0 and t.power_w_mean is None and t.error is not None and "NVML unavailable" in t.error
