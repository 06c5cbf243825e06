"""A ballast: a process that holds all of the device's free memory but `leave_bytes`, so a bigger card offers vLLM
what a T4 offers (15,360 MiB) and an out-of-memory on a cold start is real, not absorbed.

The standard library only (the ballast process itself needs the host's torch): tests/gpu/realserve.py and
tests/gpu/image_session.py (on a host where nothing of t4serve's is installed) both use it.
"""

from __future__ import annotations

import os
import subprocess
import sys

T4_MEMORY_BYTES = 15360 * (1 << 20)

_BALLAST_CODE = r"""
import sys, time, torch
leave = int(sys.argv[1])
torch.cuda.init()
free, total = torch.cuda.mem_get_info()
hold = free - leave
x = torch.empty(max(hold, 0), dtype=torch.uint8, device="cuda") if hold > 0 else None
free2, _ = torch.cuda.mem_get_info()
print(f"ballast holds {max(hold, 0)} B; device free {free2} B of {total} B", flush=True)
while True:
    time.sleep(3600)
"""


class Ballast:
    """Holds all of the device's free memory but `leave_bytes` until closed."""

    def __init__(self, leave_bytes: int, python: str = sys.executable) -> None:
        self.leave_bytes = leave_bytes
        self.proc = subprocess.Popen(
            [python, "-c", _BALLAST_CODE, str(leave_bytes)],
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, "T4SERVE_GPU_PROBE_DIR": ""},
        )
        assert self.proc.stdout is not None
        self.line = self.proc.stdout.readline().strip()
        if not self.line.startswith("ballast holds"):
            self.close()
            raise RuntimeError(f"ballast did not start: {self.line!r} (exit {self.proc.poll()})")
        self.device_free = int(self.line.split("device free ")[1].split(" ")[0])

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()

    def __enter__(self) -> Ballast:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
