"""The longest start t4serve plans for: a cold cache (download, load, compile), phase by phase, before any history.

`cold_start_budget(weight_bytes)` is pure: seconds per loading phase (the phases `t4serve status` shows) for a
checkpoint of that many safetensors bytes, with how each was reached. Where past starts exist, `history.estimate` is
the better guess for a typical start; this budget is the bound a supervisor's patience must cover (Kubernetes'
startupProbe, compose's start_period), so it takes the slow end of every phase.
"""

from __future__ import annotations

from dataclasses import dataclass

from t4serve.supervise import canary
from t4serve.units import GB

# preflight's probes (NVML, /proc, disks, the checkpoint's headers from the hub with their own timeouts), the plan and
# supervisord's start: seconds on the published host; a minute covers a slow hub answer.
STARTING_S = 60.0
# The slowest download the budget covers: 25 MB/s (200 Mbit/s). Cloud VMs usually fetch from the hub faster; a first
# start behind a slower link needs a pre-filled cache (HF_HUB_OFFLINE=1) or a longer budget.
MIN_DOWNLOAD_BYTES_PER_S = 25 * 1e6
# t4-run.md's published T4 loads: (checkpoint bytes as the built-in facts count them, vLLM's "Model loading took ...
# seconds"): bf16 157.18 s, QAT about 98.7 s. The budget loads at the slower of the two rates (65 MB/s, bf16).
PUBLISHED_LOADS = ((10_246_357_062, 157.18), (8_315_978_118, 98.7))
# Memory profiling with torch.compile's Dynamo/Inductor pass, then the remaining compiles and CUDA graph capture, on an
# empty compile cache. Not published for a T4: an allowance of several times what a warm cache takes, stated as such.
PROFILING_S = 120.0
COMPILING_S = 180.0


@dataclass(frozen=True)
class StartBudget:
    phases: dict[str, float]
    how: dict[str, str]

    @property
    def total_seconds(self) -> float:
        return sum(self.phases.values())

    def summary(self) -> str:
        parts = ", ".join(f"{phase} {self.phases[phase]:.0f} s" for phase in self.phases)
        return f"{self.total_seconds:.0f} s ({parts})"


def slowest_load_bytes_per_s() -> float:
    return min(size / seconds for size, seconds in PUBLISHED_LOADS)


def cold_start_budget(weight_bytes: int) -> StartBudget:
    """Seconds per loading phase (`state.LOADING_PHASES`, in order) for a cold start of a checkpoint of
    `weight_bytes` safetensors bytes."""
    load_rate = slowest_load_bytes_per_s()
    phases = {
        "starting": STARTING_S,
        "downloading": weight_bytes / MIN_DOWNLOAD_BYTES_PER_S,
        "loading_weights": weight_bytes / load_rate,
        "profiling": PROFILING_S,
        "compiling": COMPILING_S,
        # The canary's own request timeout bounds it.
        "canary": canary.TIMEOUT_S,
    }
    how = {
        "starting": "preflight, plan and supervisord, with room for a slow hub answer",
        "downloading": f"{weight_bytes / GB:.3f} GB at {MIN_DOWNLOAD_BYTES_PER_S / 1e6:.0f} MB/s, the slowest link "
        "budgeted",
        "loading_weights": f"{weight_bytes / GB:.3f} GB at {load_rate / 1e6:.1f} MB/s, the slower published T4 load "
        "(bf16, 157.18 s)",
        "profiling": "allowance for the profile run with torch.compile on an empty compile cache (not published)",
        "compiling": "allowance for compiling and CUDA graph capture on an empty compile cache (not published)",
        "canary": "the canary request's timeout",
    }
    return StartBudget(phases, how)
