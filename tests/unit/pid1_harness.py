"""Run t4serve.supervise.pid1.run in a process of its own, for test_pid1 (run() installs signal handlers).

    python pid1_harness.py STATE_DIR REPORT [--subreaper] [--signal-before-spawn N] [--env-json JSON] -- ARGV...

Exits with run()'s return value. REPORT receives JSON: this process's pid, what run() returned, and the children of
this process still in /proc after run() returned, each with its state letter ("Z" is a zombie nobody reaped).
--subreaper makes this process the child subreaper (prctl PR_SET_CHILD_SUBREAPER), as PID 1 is in a container, so
orphans of run()'s child reparent here. --signal-before-spawn sends signal N to this process after run() installed
its handlers and before it starts the child: a stop that arrives while the child does not exist yet.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from t4serve.supervise import pid1

PR_SET_CHILD_SUBREAPER = 36


def children_in_proc(parent: int) -> list[dict[str, Any]]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # "pid (comm) state ppid ...": comm may hold spaces and parentheses, so split after the last ")".
        fields = stat[stat.rindex(")") + 2 :].split()
        if int(fields[1]) == parent:
            found.append({"pid": int(entry.name), "state": fields[0]})
    return found


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("state_dir", type=Path)
    parser.add_argument("report", type=Path)
    parser.add_argument("--subreaper", action="store_true")
    parser.add_argument("--signal-before-spawn", type=int)
    parser.add_argument("--env-json")
    parser.add_argument("argv", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    argv = args.argv[1:] if args.argv[:1] == ["--"] else args.argv

    if args.subreaper:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER) failed")

    if args.signal_before_spawn is not None:
        real_popen = subprocess.Popen
        signum = args.signal_before_spawn

        def popen_after_signal(*a: Any, **kw: Any) -> Any:
            # run()'s handler runs at the next bytecode after os.kill returns, so the child does not exist yet.
            os.kill(os.getpid(), signum)
            return real_popen(*a, **kw)

        # pid1 calls subprocess.Popen through the module, so this is the Popen its run() uses.
        subprocess.Popen = popen_after_signal  # type: ignore[misc, assignment]

    env = json.loads(args.env_json) if args.env_json else None
    code = pid1.run(argv, args.state_dir, env)
    report = {"pid": os.getpid(), "code": code, "children": children_in_proc(os.getpid())}
    args.report.write_text(json.dumps(report))
    return code


if __name__ == "__main__":
    sys.exit(main())
