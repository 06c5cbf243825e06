"""telemetry: throttle reasons decoded by name, Prometheus text, the log line, /metrics over HTTP, and the no-NVML
exit. The GPU itself cannot run here: `RecordedNvml` replays the T4 in decode as published-t4-run.md has it (70 W cap,
1590 MHz max, SW power cap holding the SM clock at 1290 MHz, 100 % utilisation); tests/gpu runs the real NVML."""

from __future__ import annotations

import io
import threading
import urllib.request
from types import SimpleNamespace
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from t4serve.supervise import telemetry
from t4serve.supervise.telemetry import GpuSample, decode_throttle_reasons, log_line, read_samples, render_prometheus

SW_POWER_CAP = 0x4
HW_SLOWDOWN = 0x8
SW_THERMAL = 0x20


class RecordedNvml:
    """The pynvml calls telemetry makes, answering with one recorded T4 reading (memory clock 5001 MHz as on T4s)."""

    NVML_CLOCK_SM = 1
    NVML_CLOCK_MEM = 2
    NVML_TEMPERATURE_GPU = 0

    class NVMLError(Exception):
        pass

    def nvmlDeviceGetCount(self) -> int:
        return 1

    def nvmlDeviceGetHandleByIndex(self, i: int) -> str:
        return f"handle{i}"

    def nvmlDeviceGetName(self, h: str) -> bytes:
        return b"Tesla T4"

    def nvmlDeviceGetUUID(self, h: str) -> str:
        return "GPU-0e5f8a2c-recorded"

    def nvmlDeviceGetPowerUsage(self, h: str) -> int:
        return 69_480

    def nvmlDeviceGetEnforcedPowerLimit(self, h: str) -> int:
        return 70_000

    def nvmlDeviceGetClockInfo(self, h: str, kind: int) -> int:
        return 1290 if kind == self.NVML_CLOCK_SM else 5000

    def nvmlDeviceGetMaxClockInfo(self, h: str, kind: int) -> int:
        return 1590 if kind == self.NVML_CLOCK_SM else 5001

    def nvmlDeviceGetUtilizationRates(self, h: str) -> Any:
        return SimpleNamespace(gpu=100, memory=71)

    def nvmlDeviceGetMemoryInfo(self, h: str) -> Any:
        return SimpleNamespace(used=14_280 * 2**20, total=15_360 * 2**20)

    def nvmlDeviceGetTemperature(self, h: str, sensor: int) -> int:
        return 63

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: str) -> int:
        return SW_POWER_CAP

    def nvmlDeviceGetPowerManagementLimit(self, h: str) -> int:
        raise self.NVMLError("Not Supported")


def test_decode_throttle_reasons_by_name() -> None:
    assert decode_throttle_reasons(0) == []
    assert decode_throttle_reasons(SW_POWER_CAP) == ["sw_power_cap"]
    assert decode_throttle_reasons(SW_POWER_CAP | HW_SLOWDOWN | SW_THERMAL) == [
        "sw_power_cap",
        "hw_slowdown",
        "sw_thermal_slowdown",
    ]
    assert decode_throttle_reasons(0x10000 | 0x1) == ["gpu_idle", "unknown_0x10000"]


def test_read_samples_from_nvml() -> None:
    [s] = read_samples(RecordedNvml())  # type: ignore[arg-type]
    assert s.name == "Tesla T4" and s.power_w == pytest.approx(69.48) and s.power_limit_w == 70.0
    assert (s.sm_clock_mhz, s.sm_clock_max_mhz, s.throttle_mask) == (1290, 1590, SW_POWER_CAP)


def test_unsupported_query_is_absent_not_zero() -> None:
    class NoPower(RecordedNvml):
        def nvmlDeviceGetPowerUsage(self, h: str) -> int:
            raise self.NVMLError("Not Supported")

    [s] = read_samples(NoPower())  # type: ignore[arg-type]
    assert s.power_w is None
    text = render_prometheus([s])
    assert "t4serve_gpu_power_watts{" not in text and "t4serve_gpu_power_limit_watts{" in text
    assert "power ?/70 W" in log_line(s)


def series(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """The exposition's samples as Prometheus reads them: (name, labels) -> value (label order and the spelling of
    numbers, 1590 or 1590.0, are the writer's; prometheus_client writes floats as Go does and sorts label names)."""
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def test_prometheus_text() -> None:
    [s] = read_samples(RecordedNvml())  # type: ignore[arg-type]
    text = render_prometheus([s])
    got = series(text)
    labels = {("gpu", "0"), ("name", "Tesla T4"), ("uuid", "GPU-0e5f8a2c-recorded")}
    assert got[("t4serve_gpu_power_watts", frozenset(labels))] == 69.48
    assert got[("t4serve_gpu_sm_clock_max_mhz", frozenset(labels))] == 1590
    assert got[("t4serve_gpu_utilization_ratio", frozenset(labels))] == 1
    assert got[("t4serve_gpu_memory_used_bytes", frozenset(labels))] == 14_280 * 2**20
    assert got[("t4serve_gpu_clocks_event_reason", frozenset({*labels, ("reason", "sw_power_cap")}))] == 1
    assert got[("t4serve_gpu_clocks_event_reason", frozenset({*labels, ("reason", "hw_slowdown")}))] == 0
    assert "# TYPE t4serve_gpu_temperature_celsius gauge" in text
    for line in text.splitlines():
        assert line.startswith("#") or len(line.rsplit(" ", 1)) == 2
    # Every gauge of the table, and one clocks-event series per known reason, nothing else.
    names = {name for name, _labels in got}
    assert names == {metric for metric, _help, _attr, _scale in telemetry._GAUGES} | {"t4serve_gpu_clocks_event_reason"}
    assert sum(name == "t4serve_gpu_clocks_event_reason" for name, _labels in got) == 9


def test_label_values_are_escaped() -> None:
    s = GpuSample(0, 'odd "name"\\x', "u", 1.5, *([None] * 11))
    text = render_prometheus([s])
    assert 't4serve_gpu_power_watts{gpu="0",name="odd \\"name\\"\\\\x",uuid="u"} 1.5' in text
    labels = frozenset({("gpu", "0"), ("name", 'odd "name"\\x'), ("uuid", "u")})
    assert series(text) == {("t4serve_gpu_power_watts", labels): 1.5}


def test_log_line_reads_like_the_write_up() -> None:
    [s] = read_samples(RecordedNvml())  # type: ignore[arg-type]
    assert log_line(s) == (
        "gpu0 Tesla T4: power 69.5/70 W (99%), SM 1290/1590 MHz (81%), mem clock 5000/5001 MHz, util 100% "
        "(memory 71%), memory 13.95/15.00 GiB, 63 C, clocks held by: SW power cap"
    )


def test_metrics_endpoint_and_log_lines() -> None:
    out = io.StringIO()
    sampler = telemetry.Sampler(RecordedNvml())  # type: ignore[arg-type]
    server = telemetry.make_server(sampler, "127.0.0.1", 0)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        port = server.server_address[1]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            body = response.read().decode()
            assert response.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        assert series(body)[("t4serve_gpu_clocks_event_reason", frozenset({("gpu", "0"), ("name", "Tesla T4"),
                            ("uuid", "GPU-0e5f8a2c-recorded"), ("reason", "sw_power_cap")}))] == 1  # fmt: skip
        with pytest.raises(urllib.error.HTTPError):
            urllib.request.urlopen(f"http://127.0.0.1:{port}/other", timeout=5)
    finally:
        server.shutdown()
        server.server_close()
    nvml: Any = RecordedNvml()
    assert telemetry.run("127.0.0.1", 0, out, duration_s=0.2, log_every_s=0.1, nvml=nvml) == 0
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("telemetry: serving /metrics on 127.0.0.1:")
    assert sum("clocks held by: SW power cap" in ln for ln in lines) >= 2


def test_without_nvml_says_so_once_and_exits_zero() -> None:
    """On this machine for real: no NVIDIA driver, so pynvml cannot initialise."""
    nvml, reason = telemetry.load_nvml()
    if nvml is not None:
        pytest.skip("this machine has a working NVML; the GPU test covers it")
    out = io.StringIO()
    assert telemetry.run("127.0.0.1", 0, out) == 0
    text = out.getvalue()
    assert text.count("\n") == 1 and "no GPU telemetry" in text and "exiting cleanly" in text and reason in text
