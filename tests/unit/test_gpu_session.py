"""tests/gpu/session.sh, the queue of GPU-host steps that outlives the device tool's 10-minute calls, run for real
without a GPU: the steps are tests/gpu/gpu-host.sh itself, fed a stand-in PARTS folder whose install-stack.sh only
prints (or sleeps), in place of the image stack's 28 parts of wheels.

What it guards: on the GPU host a `wait` call that lands on a fresh machine (the device tool gave the machine running
the queue back between two calls) once spent its whole SECONDS waiting on nothing; it must say so at once.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

SESSION = Path(__file__).resolve().parents[1] / "gpu" / "session.sh"


def session(tmp_path: Path, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "T4SERVE_GPU_ROOT": str(tmp_path / "root"), "T4SERVE_GPU_SITE": str(tmp_path / "site")}
    return subprocess.run(["bash", str(SESSION), *args], capture_output=True, text=True, timeout=timeout, env=env,
                          check=False)


def stand_in_parts(tmp_path: Path, body: str) -> Path:
    parts = tmp_path / "parts"
    parts.mkdir()
    (parts / "install-stack.sh").write_text(f"#!/usr/bin/env bash\n{body}\n")
    return parts


def unpacked(out: Path, into: Path) -> Path:
    """The results a `wait` packed into OUT/results.tar.xz.NN, unpacked as the README says (cat | tar -xJ)."""
    pieces = sorted(out.glob("results.tar.xz.*"))
    assert pieces, sorted(p.name for p in out.iterdir())
    into.mkdir()
    whole = into / "results.tar.xz"
    whole.write_bytes(b"".join(p.read_bytes() for p in pieces))
    with tarfile.open(whole, "r:xz") as tar:
        tar.extractall(into, filter="data")
    return into / "results"


def test_wait_on_a_machine_without_a_queue_says_so_at_once(tmp_path: Path) -> None:
    began = time.monotonic()
    done = session(tmp_path, "wait", "300", str(tmp_path / "out"))
    assert done.returncode == 3
    assert "no queue on this machine" in done.stderr and "given back" in done.stderr
    assert time.monotonic() - began < 10


def test_a_queue_runs_its_steps_and_wait_packs_what_they_left(tmp_path: Path) -> None:
    parts = stand_in_parts(tmp_path, 'echo "stand-in parts: no wheels here" >&2; exit 1')
    started = session(tmp_path, "start", str(parts), "bench", "cold-bf16")
    assert started.returncode == 0, started.stderr
    assert "queue started (pid " in started.stdout
    waited = session(tmp_path, "wait", "50", str(tmp_path / "out"))
    assert waited.returncode == 0, waited.stderr
    assert "queue finished" in waited.stdout
    log = (tmp_path / "out" / "session.log").read_text()
    assert "=== bench ended" in log and "=== cold-bf16 ended" in log and log.count(", exit 1") == 2
    results = unpacked(tmp_path / "out", tmp_path / "back")
    assert "stand-in parts: no wheels here" in (results / "bench.log").read_text()


def test_a_queue_that_died_ends_the_wait(tmp_path: Path) -> None:
    parts = stand_in_parts(tmp_path, "sleep 120")
    started = session(tmp_path, "start", str(parts), "bench")
    assert started.returncode == 0, started.stderr
    pid = int((tmp_path / "root" / "results" / "session.pid").read_text())
    os.killpg(pid, signal.SIGKILL)  # the queue is its own session (setsid): its group goes with it
    began = time.monotonic()
    waited = session(tmp_path, "wait", "120", str(tmp_path / "out"))
    assert time.monotonic() - began < 30
    assert "ended without finishing its steps" in waited.stdout
    assert "queue not running, and not finished" in waited.stdout
    assert (tmp_path / "out" / "session.log").read_text().startswith("=== bench started")


@pytest.fixture(autouse=True)
def _no_stray_queue(tmp_path: Path) -> Iterator[None]:
    yield
    pid_file = tmp_path / "root" / "results" / "session.pid"
    if pid_file.is_file():
        with contextlib.suppress(ProcessLookupError, PermissionError, ValueError):
            os.killpg(int(pid_file.read_text()), signal.SIGKILL)
