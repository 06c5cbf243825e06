"""A measuring hook for the GPU tests, loaded into every Python process of a vLLM server through PYTHONPATH.

Active only where T4SERVE_GPU_PROBE_DIR names a folder. Then a daemon thread in each process that has initialised
CUDA writes, every 0.25 s, `mem-<pid>.json`: torch's peak reserved and allocated bytes (the caching allocator's own
high-water marks, which an out-of-memory inside torch.compile reaches), the device's free memory (its lowest, when,
and a timeline of its moves), and the process's command line;
and `modules-<pid>.txt`: the sorted top-level packages in sys.modules (what serving really imports,
the evidence a smaller image rests on). Nothing here changes what vLLM does.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time

_DIR = os.environ.get("T4SERVE_GPU_PROBE_DIR", "")


def _write(path: str, text: str) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)


def _sample() -> None:
    pid = os.getpid()
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmdline = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        cmdline = ""
    record: dict[str, object] = {"pid": pid, "ppid": os.getppid(), "cmdline": cmdline[:500]}
    timeline: list[list[float]] = []
    lowest: int | None = None
    first_cuda = None
    while True:
        time.sleep(0.25)
        torch = sys.modules.get("torch")
        try:
            if torch is not None and torch.cuda.is_initialized():
                if first_cuda is None:
                    first_cuda = time.time()
                free, total = torch.cuda.mem_get_info()
                record.update(
                    cuda_since=first_cuda,
                    at=time.time(),
                    max_reserved=int(torch.cuda.max_memory_reserved()),
                    max_allocated=int(torch.cuda.max_memory_allocated()),
                    reserved=int(torch.cuda.memory_reserved()),
                    device_free=int(free),
                    device_total=int(total),
                )
                if lowest is None or free < lowest:
                    lowest = int(free)
                    record.update(min_device_free=lowest, min_device_free_at=time.time())
                # The device's free memory over time, a point whenever it moved by 64 MiB or more (at most 2,000):
                # when a low came, set beside the server's phases, says which step of the start took the memory.
                if not timeline or (abs(free - timeline[-1][1]) >= 64 << 20 and len(timeline) < 2000):
                    timeline.append([round(time.time(), 2), int(free)])
                    record["free_timeline"] = timeline
                _write(os.path.join(_DIR, f"mem-{pid}.json"), json.dumps(record))
            mods = sorted({name.split(".", 1)[0] for name in list(sys.modules)})
            _write(os.path.join(_DIR, f"modules-{pid}.txt"), "\n".join(mods) + "\n")
        except Exception as exc:  # the hook must never take a server down
            record["hook_error"] = repr(exc)[:300]


if _DIR and os.path.isdir(_DIR):
    threading.Thread(target=_sample, name="t4serve-gpu-probe", daemon=True).start()
