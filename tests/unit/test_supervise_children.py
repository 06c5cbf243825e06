"""t4serve.supervise.children: the one routine that stops a child t4serve started (vLLM under the wrapper, bench's
`t4serve serve`, the host's docker clients), on real processes: asked first, then killed with all it started."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from t4serve.supervise.children import descendants, stop_child

# A child that ignores SIGTERM and starts a grandchild that does too, printing the grandchild's pid.
STUBBORN = """
import signal, subprocess, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
code = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)"
child = subprocess.Popen([sys.executable, "-c", code])
print(child.pid, flush=True)
time.sleep(60)
"""


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie has ended
        return f.read().split(")")[-1].split()[0] != "Z"


def stubborn(**popen: object) -> tuple[subprocess.Popen[str], int]:
    proc = subprocess.Popen([sys.executable, "-c", STUBBORN], stdout=subprocess.PIPE, text=True, **popen)  # type: ignore[call-overload]
    assert proc.stdout is not None
    return proc, int(proc.stdout.readline())


def test_a_child_that_ends_on_sigterm_is_only_asked() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    began = time.monotonic()
    assert stop_child(proc, 10.0) is True
    assert proc.returncode == -signal.SIGTERM and time.monotonic() - began < 5


def test_a_stubborn_child_is_killed_with_what_it_started() -> None:
    proc, grandchild = stubborn()
    assert stop_child(proc, 0.5) is False
    assert proc.returncode == -signal.SIGKILL
    deadline = time.monotonic() + 5
    while alive(grandchild) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(grandchild)


def test_a_group_is_asked_and_killed_whole() -> None:
    proc, grandchild = stubborn(start_new_session=True)
    assert stop_child(proc, 0.5, group=True) is False
    deadline = time.monotonic() + 5
    while alive(grandchild) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert proc.returncode == -signal.SIGKILL and not alive(grandchild)


def test_descendants_reads_the_process_tree_from_proc(tmp_path: Path) -> None:
    def stat(pid: int, comm: str, ppid: int) -> None:
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "stat").write_text(f"{pid} ({comm}) S {ppid} {pid} 0 0\n")

    stat(10, "python3", 1)
    stat(11, "VLLM::EngineCore", 10)
    stat(12, "a (weird) name", 11)
    stat(13, "other", 1)
    (tmp_path / "14").mkdir()  # a process that ended between the listing and the read
    assert descendants(10, proc=tmp_path) == [11, 12]
    assert descendants(13, proc=tmp_path) == []
