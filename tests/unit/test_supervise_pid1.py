"""pid1.run: the child's exit code (128+N for a signal death) unless the listener asked for another, stop signals
forwarded (even one that arrives before the child exists), and orphans reaped.

run() installs signal handlers, so each test runs it in a process of its own (pid1_harness.py) with real child
processes; every wait is bounded and a test's processes are ended by their process group when it is done.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from t4serve.supervise.pid1 import FORWARDED

HARNESS = Path(__file__).with_name("pid1_harness.py")
WAIT_S = 15.0


@dataclass
class Finished:
    code: int
    stderr: str
    report: dict[str, Any]


class Harness:
    """One harness process; `tmp` is its state dir and the folder its child scripts write to."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.report = tmp / "report.json"
        self.proc: subprocess.Popen[str] | None = None

    def start(self, child_code: str, *options: str) -> subprocess.Popen[str]:
        argv = [sys.executable, str(HARNESS), *options, str(self.tmp), str(self.report)]
        argv += ["--", sys.executable, "-c", child_code, str(self.tmp)]
        # A session of its own, so cleanup can end the harness and all it started by one process group id.
        self.proc = subprocess.Popen(argv, stderr=subprocess.PIPE, text=True, start_new_session=True)
        return self.proc

    def finish(self, timeout: float = WAIT_S) -> Finished:
        assert self.proc is not None
        _, stderr = self.proc.communicate(timeout=timeout)
        report = json.loads(self.report.read_text()) if self.report.exists() else {}
        return Finished(self.proc.returncode, stderr, report)

    def run(self, child_code: str, *options: str, timeout: float = WAIT_S) -> Finished:
        self.start(child_code, *options)
        return self.finish(timeout)

    def cleanup(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=5)


@pytest.fixture
def harness(tmp_path: Path) -> Iterator[Harness]:
    h = Harness(tmp_path)
    try:
        yield h
    finally:
        h.cleanup()


def wait_for_file(path: Path, timeout: float = WAIT_S) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and path.read_text():
            return path.read_text()
        time.sleep(0.01)
    raise AssertionError(f"{path} not written within {timeout} s")


@pytest.mark.parametrize("code", [0, 7])
def test_child_exit_code_is_returned_and_env_reaches_the_child(harness: Harness, code: int) -> None:
    # The env given to run() is the child's whole environment: without it the child would exit 1 (KeyError).
    child = "import os, sys; sys.exit(int(os.environ['T4_TEST_EXIT']))"
    done = harness.run(child, "--env-json", json.dumps({"T4_TEST_EXIT": str(code)}))
    assert done.code == code, done.stderr
    assert done.report["code"] == code


@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGTERM])
def test_signal_death_is_128_plus_the_signal(harness: Harness, signum: int) -> None:
    done = harness.run(f"import os; os.kill(os.getpid(), {int(signum)})")
    assert done.code == 128 + signum, done.stderr


def test_the_listeners_exit_request_wins_over_the_childs_code(harness: Harness) -> None:
    # The child plays the listener: it writes the request while run() waits on it, then exits 1 itself.
    child = (
        "import sys, time\n"
        "from pathlib import Path\n"
        "from t4serve.supervise.state import ExitRequest, write_exit_request\n"
        "write_exit_request(Path(sys.argv[1]), ExitRequest(3, 'vLLM restarted too often', time.time()))\n"
        "sys.exit(1)\n"
    )
    done = harness.run(child)
    assert done.code == 3, done.stderr
    assert "t4serve: exiting 3: vLLM restarted too often" in done.stderr


# The child records the first signal it gets and exits 100+N, so the harness's exit code names the signal it passed.
SIGNAL_CHILD = """
import os, signal, sys, time
from pathlib import Path
folder = Path(sys.argv[1])
def on(signum, frame):
    (folder / "child-got").write_text(str(signum))
    os._exit(100 + signum)
for s in (signal.SIGTERM, signal.SIGINT, signal.SIGQUIT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2):
    signal.signal(s, on)
(folder / "child-ready").write_text(str(os.getpid()))
time.sleep(30)
sys.exit(0)
"""


@pytest.mark.parametrize("signum", FORWARDED, ids=lambda s: signal.Signals(s).name)
def test_stop_signals_sent_to_pid1_reach_the_child(harness: Harness, signum: int) -> None:
    proc = harness.start(SIGNAL_CHILD)
    wait_for_file(harness.tmp / "child-ready")
    os.kill(proc.pid, signum)
    done = harness.finish()
    assert done.code == 100 + signum, done.stderr
    assert (harness.tmp / "child-got").read_text() == str(int(signum))


def test_a_signal_before_the_child_exists_is_delivered_once_it_does(harness: Harness) -> None:
    # The harness sends SIGTERM to itself after run() installed its handlers and just before the child is spawned.
    # The child, left alone, would sleep and exit 0; delivered, the SIGTERM kills it at once: 128+15.
    started = time.monotonic()
    done = harness.run("import time; time.sleep(5)", "--signal-before-spawn", str(int(signal.SIGTERM)))
    assert done.code == 128 + signal.SIGTERM, done.stderr
    assert time.monotonic() - started < 4.5


# The child starts an intermediate that starts the grandchild and exits at once: the grandchild is an orphan and
# reparents to the harness (the subreaper, as PID 1 would be). The grandchild waits for that, records its new parent
# and exits while the child still runs, so run() is waiting when the orphan dies.
GRANDCHILD = """
import json, os, sys, time
from pathlib import Path
intermediate = int(sys.argv[2])
deadline = time.monotonic() + 10
while os.getppid() == intermediate and time.monotonic() < deadline:
    time.sleep(0.005)
Path(sys.argv[1], "grandchild.json").write_text(json.dumps({"pid": os.getpid(), "ppid": os.getppid()}))
"""
INTERMEDIATE = f"""
import os, subprocess, sys
subprocess.Popen([sys.executable, "-c", {GRANDCHILD!r}, sys.argv[1], str(os.getpid())])
os._exit(0)
"""
ORPHANING_CHILD = f"""
import json, os, subprocess, sys, time
from pathlib import Path
subprocess.run([sys.executable, "-c", {INTERMEDIATE!r}, sys.argv[1]], check=True)
record = Path(sys.argv[1], "grandchild.json")
deadline = time.monotonic() + 10
while not record.exists() and time.monotonic() < deadline:
    time.sleep(0.01)
time.sleep(0.5)  # the grandchild exits right after writing its record; it is dead (a zombie, unless reaped) by now
# What the grandchild is now, while this child still runs: "gone" once its parent has reaped it, "Z" if not.
stat = Path("/proc", str(json.loads(record.read_text())["pid"]), "stat")
try:
    state = stat.read_text().rsplit(")", 1)[1].split()[0]
except FileNotFoundError:
    state = "gone"
Path(sys.argv[1], "grandchild-while-child-ran").write_text(state)
sys.exit(5)
"""


def test_an_orphan_reparented_to_pid1_is_reaped(harness: Harness) -> None:
    done = harness.run(ORPHANING_CHILD, "--subreaper")
    assert done.code == 5, done.stderr
    grandchild = json.loads((harness.tmp / "grandchild.json").read_text())
    # The orphan really was the harness's child, so reaping it was run()'s job ...
    assert grandchild["ppid"] == done.report["pid"]
    # ... and run() did it while the child still ran (supervisord runs for days: orphans must not pile up as
    # zombies until it exits) ...
    assert (harness.tmp / "grandchild-while-child-ran").read_text() == "gone"
    # ... and no child of the harness is left in /proc when run() returns, zombie or otherwise.
    assert done.report["children"] == []


def test_run_returns_without_waiting_for_an_orphan_that_outlives_the_child(harness: Harness) -> None:
    # The orphan sleeps 20 s after the child is gone; run() reaps what is dead and returns, it does not wait.
    lingering = (
        "import os, sys, time\n"
        "from pathlib import Path\n"
        "Path(sys.argv[1], 'orphan.pid').write_text(str(os.getpid()))\n"
        "time.sleep(20)\n"
    )
    intermediate = (
        "import os, subprocess, sys\n"
        # Its stdio is not the harness's stderr pipe, which the test reads to EOF.
        "quiet = subprocess.DEVNULL\n"
        f"subprocess.Popen([sys.executable, '-c', {lingering!r}, sys.argv[1]], stdout=quiet, stderr=quiet)\n"
        "os._exit(0)\n"
    )
    child = (
        "import subprocess, sys, time\n"
        "from pathlib import Path\n"
        f"subprocess.run([sys.executable, '-c', {intermediate!r}, sys.argv[1]], check=True)\n"
        "deadline = time.monotonic() + 10\n"
        "while not Path(sys.argv[1], 'orphan.pid').exists() and time.monotonic() < deadline:\n"
        "    time.sleep(0.01)\n"
    )
    started = time.monotonic()
    try:
        done = harness.run(child, "--subreaper", timeout=15)
        elapsed = time.monotonic() - started
        assert done.code == 0, done.stderr
        assert elapsed < 10
        orphan = int((harness.tmp / "orphan.pid").read_text())
        # Still running and still the harness's child: run() left it alone instead of blocking on it.
        assert orphan in [c["pid"] for c in done.report["children"]]
    finally:
        orphan_file = harness.tmp / "orphan.pid"
        if orphan_file.exists():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(orphan_file.read_text()), signal.SIGKILL)
