"""t4serve.commands.telemetry: without NVML it says so once and exits 0 (supervisord then leaves it stopped); with
NVML (the recorded T4 of test_supervise_telemetry.py) it serves /metrics and logs a line per interval until
--duration."""

from __future__ import annotations

from typing import Any

import pytest
from test_supervise_telemetry import RecordedNvml

from t4serve.cli import main
from t4serve.supervise import telemetry


def test_without_nvml_exit_0_and_one_line(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(telemetry, "load_nvml", lambda: (None, "NVML could not start: driver not loaded"))
    assert main(["telemetry", "--host", "127.0.0.1", "--port", "0"]) == 0
    out = capsys.readouterr().out
    said = "no GPU telemetry: NVML could not start: driver not loaded; exiting cleanly (not restarted)"
    assert out == f"telemetry: {said}\n"


def test_with_nvml_serves_and_logs_for_the_duration(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    nvml: Any = RecordedNvml()
    monkeypatch.setattr(telemetry, "load_nvml", lambda: (nvml, None))
    assert main(["telemetry", "--host", "127.0.0.1", "--port", "0", "--duration", "0.3", "--log-every", "0.1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("telemetry: serving /metrics on 127.0.0.1:")
    assert len(lines) >= 3 and all("gpu0 Tesla T4: power 69.5/70 W" in line for line in lines[1:])


def test_a_port_out_of_range_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["telemetry", "--port", "70000"]) == 2
    assert "70000" in capsys.readouterr().err
