"""Host RAM needed to load a checkpoint with vLLM 0.33, against what the host offers, and the swap to add.

vLLM 0.33 reads safetensors lazily by default (`safetensors_weights_iterator`: `safe_open` memory-maps each file and
copies one tensor at a time), which is its lowest-memory path; `--safetensors-load-strategy eager` reads each whole
file first (`load(f.read())`). The peak is an empirical line through published-t4-run.md's two peaks, stated as such.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from t4serve.facts import HostFacts, ModelFacts
from t4serve.planning.derived import Derived
from t4serve.units import GB, GIB, MIB

# published-t4-run.md: on a 7.8 GB host with no swap the engine was OOM-killed while loading; with swap, swap use peaked
# at 6,761 MiB (bf16) and 4,770 MiB (QAT). RAM was full at the peak, so the peak demand was about 7.8 GB + swap:
# 14.889 GB and 12.802 GB. Checkpoint sizes are the built-in facts' tensor bytes (t4serve/data/models/, so `plan`
# reproduces both peaks for the aliases): bf16 10.246 GB; QAT 8.316 GB, a layout inferred from a listed file size, not
# read from its header (tests/unit/e2b_checkpoint.py). A line through the two points; its slope (1.08 B of peak per
# checkpoint byte, 0.77 when QAT was modelled at 7.521 GB) is a fit, not a property of vLLM's loader.
PUBLISHED_HOST_RAM = 7.8 * GB
PUBLISHED_PEAKS = ((10_246_357_062, PUBLISHED_HOST_RAM + 6761 * MIB), (8_315_978_118, PUBLISHED_HOST_RAM + 4770 * MIB))
_SLOPE = (PUBLISHED_PEAKS[0][1] - PUBLISHED_PEAKS[1][1]) / (PUBLISHED_PEAKS[0][0] - PUBLISHED_PEAKS[1][0])
_BASE = PUBLISHED_PEAKS[0][1] - _SLOPE * PUBLISHED_PEAKS[0][0]


@dataclass(frozen=True)
class HostMemory:
    need_bytes: Derived
    available_bytes: Derived | None
    swap_to_add_bytes: Derived
    eager_need_bytes: Derived
    notes: list[str]


def largest_file_bytes(model: ModelFacts) -> int:
    """An upper bound on one safetensors file: the whole checkpoint over the file count, rounded up."""
    return math.ceil(model.weight_bytes / max(model.safetensors_files, 1))


def estimate(model: ModelFacts, host: HostFacts | None, drafter: ModelFacts | None = None) -> HostMemory:
    """The peak of one load: the line through the published peaks at the checkpoint's bytes, and a drafter's
    (T4SERVE_SPECULATIVE=mtp: vLLM loads it in the same step, through the same loader) counted as more of them."""
    ckpt = model.weight_bytes + (drafter.weight_bytes if drafter is not None else 0)
    need = int(_BASE + _SLOPE * ckpt)
    what = (f"{ckpt / GB:.3f} GB of safetensors (the model's {model.weight_bytes / GB:.3f} + the drafter's "
            f"{drafter.weight_bytes / GB:.3f})" if drafter is not None else f"{ckpt / GB:.3f} GB of safetensors")
    how = (f"{_BASE / GB:.3f} GB + {_SLOPE:.3f} x {what}; a line through "
           "published-t4-run.md's load peaks (bf16 7.8 GB RAM + 6,761 MiB swap, QAT + 4,770 MiB), not a model of "
           "vLLM's loader")
    per_file = max(largest_file_bytes(model), largest_file_bytes(drafter) if drafter is not None else 0)
    eager = need + 2 * per_file
    eager_d = Derived(
        eager, "B",
        f"{need / GB:.3f} GB + 2 x {per_file / GB:.3f} GB (--safetensors-load-strategy eager holds a file's bytes and "
        "its tensors at once); the default lazy (mmap) path is vLLM's lowest-memory one",
    )
    notes: list[str] = []
    if host is None:
        return HostMemory(Derived(need, "B", how), None,
                          Derived(0, "B", "host not probed: nothing to compare", "default"), eager_d, notes)
    if host.mem_available_bytes is None or host.swap_free_bytes is None:
        unread = f"host memory not read ({host.meminfo_unreadable or 'no figures'}): nothing to compare"
        return HostMemory(Derived(need, "B", how), None, Derived(0, "B", unread, "default"), eager_d, notes)
    usable = host.mem_available_bytes + host.swap_free_bytes
    usable_how = (f"MemAvailable {host.mem_available_bytes / GIB:.2f} GiB + free swap "
                  f"{host.swap_free_bytes / GIB:.2f} GiB")
    limit = host.cgroup_memory_limit_bytes
    if limit is not None:
        cgroup_total = limit + (host.cgroup_swap_limit_bytes or 0)
        if cgroup_total < usable:
            usable = cgroup_total
            swap_limit = host.cgroup_swap_limit_bytes or 0
            usable_how += f", capped by the cgroup limit {limit / GIB:.2f} GiB + {swap_limit / GIB:.2f} GiB swap"
        if limit + (host.cgroup_swap_limit_bytes or 0) < need:
            notes.append(
                f"the container's memory limit ({limit / GIB:.2f} GiB RAM + "
                f"{(host.cgroup_swap_limit_bytes or 0) / GIB:.2f} GiB swap) is below the {need / GIB:.2f} GiB loading "
                "needs: swap on the host does not help; raise the limit (docker run --memory/--memory-swap, compose "
                "mem_limit/memswap_limit) or use the QAT checkpoint"
            )
    short = need - usable
    if short <= 0:
        add = Derived(0, "B", f"need {need / GIB:.2f} GiB <= usable {usable / GIB:.2f} GiB: none")
    else:
        whole = math.ceil(short / GIB)
        add = Derived(
            whole * GIB, "B",
            f"need {need / GIB:.2f} GiB - usable {usable / GIB:.2f} GiB = {short / GIB:.2f} GiB short, rounded up "
            f"to whole GiB: scripts/setup-swap {whole}G on the host",
        )
    return HostMemory(Derived(need, "B", how), Derived(usable, "B", usable_how), add, eager_d, notes)
