"""Issue 21's classes of hostile input, a named test (with a case chosen here) for each: numbers and hosts that read
as something else, files that are not what they claim, the compile ladder's record and lock, programs that are not
programs, bench result folders, settings that contradict the card, exit codes that lie, pass-through vLLM flags that
break supervision, and the MCP server's echo and bearer check. Each run is counted in the hardening figures."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hardening import SENTINEL, SENTINEL_TOKEN, Outcome, base_environ, record, run_cli, tried

AREA = "issue 21 regressions"


def _check(outcome: Outcome, allowed: set[int], label: str, **kwargs: Any) -> Outcome:
    tried(AREA)
    record(AREA, outcome, allowed, secrets=(SENTINEL, SENTINEL_TOKEN), label=label, **kwargs)
    return outcome


# Values that look valid to Python but not to a person: ASCII decimal only, one parser for numbers and one for hosts.


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("T4SERVE_PORT", "1_0"),
        ("T4SERVE_PORT", "\u0663"),
        ("T4SERVE_KV_CACHE_MEMORY_BYTES", "\u0663"),
        ("T4SERVE_KV_CACHE_MEMORY_BYTES", "\u0662.\u0665GiB"),
        ("T4SERVE_GPU_MEMORY_UTILIZATION", "\u0660.\u0669"),
        ("T4SERVE_GPU_MEMORY_UTILIZATION", "0.9_0"),
        ("T4SERVE_MAX_NUM_SEQS", "\uff18"),
        ("T4SERVE_HOST", "0x10"),
        ("T4SERVE_HOST", "0x7f000001"),
        ("T4SERVE_TELEMETRY_HOST", "017.1"),
    ],
)
def test_numbers_and_hosts_are_ascii_decimal_only(tmp_path: Path, name: str, value: str) -> None:
    outcome = _check(run_cli(["plan", "--gpu", "t4"], {**base_environ(tmp_path), name: value}), {2}, f"{name}={value}")
    assert f"{name}=" in outcome.err and "must be" in outcome.err


@pytest.mark.parametrize(
    "args",
    [
        ["mcp", "--http", "127.0.0.1:\u0663"],
        ["mcp", "--http", "127.0.0.1:1_0"],
        ["mcp", "--http", "0x10:8765"],
        ["bench", "--repeats", "\u0661", "--base-url", "http://127.0.0.1:1", "--models", "m"],
        ["bench", "--num-prompts", "1_0", "--base-url", "http://127.0.0.1:1", "--models", "m"],
        ["roofline", "--context", "\u0664\u0660\u0669\u0666"],
    ],
)
def test_options_take_ascii_decimal_only(tmp_path: Path, args: list[str]) -> None:
    outcome = _check(run_cli(args, base_environ(tmp_path)), {2}, " ".join(args))
    assert "must be" in outcome.err or "not HOST:PORT" in outcome.err
    assert not any(tmp_path.glob("bench-*")), "a usage error left an output folder behind"
