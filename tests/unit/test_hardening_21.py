"""Issue 21's classes of hostile input, a named test (with a case chosen here) for each: numbers and hosts that read
as something else, files that are not what they claim, the compile ladder's record and lock, programs that are not
programs, bench result folders, settings that contradict the card, exit codes that lie, pass-through vLLM flags that
break supervision, and the MCP server's echo and bearer check. Each run is counted in the hardening figures."""

from __future__ import annotations

import json
import os
import time
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


# Files that are not what they claim: one bounded, non-blocking reader (t4serve.untrusted.open_regular/read_bounded)
# for every file t4serve reads. Each kind below is refused at once, with the path named, by every door.

HOSTILE_FILES = ("fifo", "dev-zero", "directory", "sparse-1g", "not-utf8", "loop")


def hostile_file(path: Path, kind: str) -> Path:
    """`path` made into a file that is not what it claims to be."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "dev-zero":
        path.symlink_to("/dev/zero")
    elif kind == "directory":
        path.mkdir()
    elif kind == "sparse-1g":
        with path.open("wb") as handle:
            handle.truncate(1 << 30)
    elif kind == "not-utf8":
        path.write_bytes(b"\xff\xfe\x00token\x80")
    elif kind == "loop":
        path.symlink_to(path)
    return path


def _timed(args: list[str], env: dict[str, str]) -> tuple[Outcome, float]:
    began = time.monotonic()
    outcome = run_cli(args, env)
    return outcome, time.monotonic() - began


@pytest.mark.parametrize("kind", HOSTILE_FILES)
def test_the_mcp_token_file_is_read_bounded(tmp_path: Path, kind: str) -> None:
    token = hostile_file(tmp_path / "token", kind)
    env = {**base_environ(tmp_path), "T4SERVE_MCP_TOKEN_FILE": str(token)}
    outcome, took = _timed(["mcp", "--http", "127.0.0.1:9", "--compose-file", str(tmp_path / "compose.yaml")], env)
    _check(outcome, {2}, f"T4SERVE_MCP_TOKEN_FILE {kind}", seconds=took, deadline=5.0)
    assert "T4SERVE_MCP_TOKEN_FILE=" in outcome.err and str(token) in outcome.err
    assert kind == "not-utf8" or "cannot read it" in outcome.err


@pytest.mark.parametrize("kind", HOSTILE_FILES)
def test_facts_and_manifest_files_are_read_bounded(tmp_path: Path, kind: str) -> None:
    env = base_environ(tmp_path)
    facts = hostile_file(tmp_path / "facts.json", kind)
    outcome, took = _timed(["plan", "--facts", str(facts)], env)
    _check(outcome, {2}, f"plan --facts {kind}", seconds=took, deadline=5.0)
    assert str(facts) in outcome.err and "t4serve probe --json" in outcome.err
    env["T4SERVE_MANIFEST"] = str(hostile_file(tmp_path / "manifest.json", kind))
    outcome, took = _timed(["preflight", "--json"], env)
    _check(outcome, {3}, f"T4SERVE_MANIFEST {kind}", seconds=took, deadline=5.0)
    manifest = next(f for f in json.loads(outcome.out) if f["check"] == "manifest")
    assert manifest["level"] == "fail" and env["T4SERVE_MANIFEST"] in manifest["found"]


@pytest.mark.parametrize("kind", HOSTILE_FILES)
def test_cache_files_are_read_bounded(tmp_path: Path, kind: str) -> None:
    from t4serve import compilation
    from t4serve.supervise import history

    tried(AREA)
    cache = tmp_path / "cache"
    hostile_file(cache / history.HISTORY_FILE, kind)
    hostile_file(cache / compilation.RECORD_FILE, kind)
    began = time.monotonic()
    records, problem = history.load(cache)
    record_, record_problem = compilation.load_record(cache, "key")
    took = time.monotonic() - began
    record(AREA, Outcome(0, "", f"{problem}\n{record_problem}"), {0}, seconds=took, deadline=5.0,
           label=f"history and compile record {kind}")
    assert records == [] and problem is not None and str(cache / history.HISTORY_FILE) in problem
    assert record_ is None and record_problem is not None and str(cache / compilation.RECORD_FILE) in record_problem
