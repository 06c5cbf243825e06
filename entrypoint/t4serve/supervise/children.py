"""Stopping a child process t4serve started, in one routine: the vLLM wrapper's vLLM (t4serve.supervise.run_vllm),
bench's `t4serve serve` (t4serve.bench.servers) and the host's docker and compose clients (t4serve.host.docker).

`stop_child` asks first (SIGTERM, to the child alone or to its whole process group), waits a grace, then kills: the
child, its process group when it leads one (a child started with start_new_session), and every process below it as
/proc shows them, read before the child dies (an orphan leaves the tree). vLLM's engine core holds the GPU, and a
docker client's build its own children: none may outlive the child that started it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from pathlib import Path
from typing import Any

# Seconds to wait for a killed child to be reaped.
REAP_S = 10.0


def descendants(pid: int, proc: Path = Path("/proc")) -> list[int]:
    """Every process below `pid` (children first), read from /proc/*/stat; [] where /proc cannot say."""
    children: dict[int, list[int]] = {}
    for stat in proc.glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
            # "pid (comm) state ppid ...": comm may hold spaces and parentheses, so split after the last ")".
            ppid = int(text[text.rindex(")") + 2 :].split()[1])
            children.setdefault(ppid, []).append(int(stat.parent.name))
        except (OSError, ValueError, IndexError):
            continue
    found: list[int] = []
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.append(child)
                todo.append(child)
    return found


def kill_tree(pid: int) -> None:
    """SIGKILL `pid` and everything below it."""
    for target in [pid, *descendants(pid)]:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(target, signal.SIGKILL)


def _leads_group(pid: int) -> bool:
    try:
        return os.getpgid(pid) == pid
    except (ProcessLookupError, PermissionError):
        return False


def stop_child(proc: subprocess.Popen[Any], grace: float, *, group: bool = False, reap_s: float = REAP_S) -> bool:
    """Stop `proc`: SIGTERM (to its whole process group with `group`), up to `grace` seconds for it to end, then
    SIGKILL to it, its group when it leads one, and everything below it; reaped within `reap_s`. True when it ended
    on the SIGTERM."""
    if proc.poll() is not None:  # ended and reaped: its pid may be another process's by now
        return True
    leads = _leads_group(proc.pid)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        if group and leads:
            os.killpg(proc.pid, signal.SIGTERM)
        else:
            os.kill(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=grace)
        return True
    except subprocess.TimeoutExpired:
        pass
    if leads:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
    kill_tree(proc.pid)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=reap_s)
    return False
