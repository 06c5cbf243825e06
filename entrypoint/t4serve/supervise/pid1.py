"""Run supervisord under a minimal init that reaps orphans and exits with the listener's exit code.

Why not exec supervisord as PID 1: supervisord's main() always returns (exit 0) after a shutdown, whatever caused
it (supervisor 4.3 supervisord.py), so a container whose vLLM keeps dying would exit 0 and look like a clean stop.
`run(argv, state_dir)` starts supervisord as its only direct child, forwards the stop signals to it, reaps every
child (orphans reparent to PID 1), and exits with the code in the listener's exit request, else supervisord's own.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from types import FrameType

from t4serve.supervise.state import read_exit_request

FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGQUIT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)


def run(argv: Sequence[str], state_dir: Path, env: dict[str, str] | None = None) -> int:
    child: subprocess.Popen[bytes] | None = None
    pending: list[int] = []

    def forward(signum: int, _frame: FrameType | None) -> None:
        if child is None:
            pending.append(signum)
        else:
            os.kill(child.pid, signum)

    for sig in FORWARDED:
        signal.signal(sig, forward)
    child = subprocess.Popen(list(argv), env=env)
    for signum in pending:
        os.kill(child.pid, signum)

    code = 0
    while True:
        try:
            pid, status = os.wait()
        except ChildProcessError:
            break
        except InterruptedError:  # pragma: no cover - PEP 475 retries, kept for clarity on old interpreters
            continue
        if pid == child.pid:
            code = os.waitstatus_to_exitcode(status)
            code = 128 - code if code < 0 else code
            break
    # Whatever supervisord left behind is reaped now, without blocking on a process that ignores its stop.
    try:
        while os.waitpid(-1, os.WNOHANG)[0] > 0:
            pass
    except ChildProcessError:
        pass

    request = read_exit_request(state_dir)
    if request is not None:
        print(f"t4serve: exiting {request.code}: {request.reason}", file=sys.stderr, flush=True)
        return request.code
    return code
