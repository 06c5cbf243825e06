"""t4serve.mcp.deploylock: one holder at a time, the second told who holds it, and a holder that dies frees the lock."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from t4serve.errors import EngineError
from t4serve.mcp.deploylock import DeploymentBusy, Holder, hold, lock_file, read_holder

HOLD_THEN_SLEEP = """
import os, sys, time
from pathlib import Path
from t4serve.mcp.deploylock import Holder, hold
with hold(Path(sys.argv[1]), Holder("start_vllm_server", os.getpid(), "claude-code 2.1", 1_790_000_000.0)):
    print("held", flush=True)
    time.sleep(120)
"""


def test_lock_files_are_per_deployment_and_safe_names(tmp_path: Path) -> None:
    a, b = lock_file(tmp_path, "t4serve@local"), lock_file(tmp_path, "t4serve@tcp://gpu-box:2375")
    assert a != b and a.parent == b.parent == tmp_path / "locks"
    assert a.name.startswith("t4serve-local-") and "/" not in b.name and ":" not in b.name
    assert lock_file(tmp_path, "../../etc").parent == tmp_path / "locks"


def test_a_second_holder_in_this_process_is_told_who_holds_it(tmp_path: Path) -> None:
    path = lock_file(tmp_path, "t4serve@local")
    first = Holder("start_vllm_server", os.getpid(), "claude-code 2.1", 1_790_000_000.0)
    with hold(path, first):
        assert read_holder(path) == first
        second = Holder("stop_vllm_server", os.getpid(), "inspector 0.1", time.time())
        with pytest.raises(DeploymentBusy) as info, hold(path, second):
            pytest.fail("two holders at once")
        message = info.value.message()
        assert message.startswith("stop_vllm_server: busy: start_vllm_server (pid ")
        assert "client claude-code 2.1) since 2026-09-21 14:13:20 UTC" in message and "fix:" in message
    assert read_holder(path) is None  # the record goes with the holder
    with hold(path, first):  # and the lock is free again
        pass


def test_a_holder_that_is_killed_frees_the_lock(tmp_path: Path) -> None:
    path = lock_file(tmp_path, "t4serve@local")
    child = subprocess.Popen([sys.executable, "-c", HOLD_THEN_SLEEP, str(path)], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "held"
        with pytest.raises(DeploymentBusy) as info, hold(path, Holder("stop_vllm_server", os.getpid(), "x", 0.0)):
            pass
        assert f"pid {child.pid}" in info.value.message()
    finally:
        child.kill()
        child.wait()
    # Its record is still in the file, but the kernel let go of its lock with the process.
    assert read_holder(path) is not None
    with hold(path, Holder("stop_vllm_server", os.getpid(), "x", time.time())):
        assert read_holder(path) is not None and read_holder(path).tool == "stop_vllm_server"  # type: ignore[union-attr]


def test_an_unwritable_data_folder_says_which_variable_moves_it(tmp_path: Path) -> None:
    (tmp_path / "locks").write_text("a file where the folder goes")
    holder = Holder("start_vllm_server", os.getpid(), "x", 0.0)
    with pytest.raises(EngineError) as info, hold(lock_file(tmp_path, "t4serve@local"), holder):
        pass
    assert "T4SERVE_MCP_DATA_DIR" in info.value.message() and not isinstance(info.value, DeploymentBusy)


def promptly(call: Callable[[], object], seconds: float = 5.0) -> object:
    """call() in a daemon thread, which must end within `seconds` (a FIFO once blocked these reads for good)."""
    box: list[object] = []
    worker = threading.Thread(target=lambda: box.append(call()), daemon=True)
    worker.start()
    worker.join(seconds)
    assert not worker.is_alive(), f"still blocked after {seconds} s"
    return box[0] if box else None


@pytest.mark.parametrize("kind", ["fifo", "folder"])
def test_a_lock_path_that_is_not_a_file_is_an_error_that_names_it(tmp_path: Path, kind: str) -> None:
    path = lock_file(tmp_path, "t4serve@local")
    path.parent.mkdir(parents=True)
    os.mkfifo(path) if kind == "fifo" else path.mkdir()
    holder = Holder("start_vllm_server", os.getpid(), "x", 0.0)

    def take() -> EngineError:
        with pytest.raises(EngineError) as info, hold(path, holder):
            pytest.fail("held a lock that is not a regular file")
        return info.value

    error = promptly(take)
    assert isinstance(error, EngineError) and not isinstance(error, DeploymentBusy)
    message = error.message()
    assert "must be a regular file (it is a " + ("FIFO" if kind == "fifo" else "directory") + ")" in message
    assert f"remove {path}" in message
    assert promptly(lambda: read_holder(path)) is None
