"""Session-finish summary of the hardening tests: inputs tried per area and what went wrong (all zero when the
promises hold), printed by every run that ran them (docs/verification-hardening.md records one)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from hardening import StdioServer, Tally

from t4serve.config.settings import VARIABLES


@pytest.fixture
def settings_free_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No setting leaks in from the machine; the hub is never contacted; no manifest (outside the image)."""
    for var in VARIABLES:
        monkeypatch.delenv(var.name, raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("T4SERVE_MANIFEST", str(tmp_path / "no-manifest.json"))


@pytest.fixture
def stdio_server(tmp_path: Path) -> Iterator[StdioServer]:
    """`t4serve mcp` over stdio (hardening.StdioServer), killed at the end of the test if still running."""
    server = StdioServer(tmp_path)
    try:
        yield server
    finally:
        if server.proc.poll() is None:
            server.proc.kill()
            server.proc.wait(timeout=10)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not Tally.areas:
        return
    write = terminalreporter.write_line
    terminalreporter.section("hardening figures")
    columns = ("inputs", "runs", "tracebacks", "leaks", "over deadline", "bad exit")
    write(f"{'area':<24} " + " ".join(f"{c:>{max(len(c), 6)}}" for c in columns))
    totals = [0] * len(columns)
    for name, f in [*sorted(Tally.areas.items()), ("total", None)]:
        row = totals if f is None else [f.inputs, f.runs, f.tracebacks, f.leaks, f.over_deadline, f.bad_exit_codes]
        if f is not None:
            totals = [a + b for a, b in zip(totals, row, strict=True)]
        write(f"{name:<24} " + " ".join(f"{v:>{max(len(c), 6)}}" for c, v in zip(columns, row, strict=True)))
    for name, f in sorted(Tally.areas.items()):
        if f.worst_overshoot is not None:
            write(f"  {name}: the slowest timed check ended {f.worst_overshoot:+.3f} s from its deadline")
    for name, f in sorted(Tally.areas.items()):
        for example in f.examples[:3]:
            write(f"  {name}: {example}")
