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

# From serve's start to vLLM's first loading line: preflight's probes, the plan, supervisord, then vLLM's imports, its
# engine process and Gemma 4's multimodal processor. Measured on the GPU host (16 cores, vLLM 0.26.0), two sessions:
# 67 to 87 s cold, 48 to 58 s warm (docs/verified/gpu-host-vllm-0.26.0). Budgeted at about twice the slowest cold
# figure for a T4 VM's 4 to 8 vCPUs and a slow hub answer.
STARTING_S = 180.0
# The slowest download the budget covers: 25 MB/s (200 Mbit/s). Cloud VMs usually fetch from the hub faster; a first
# start behind a slower link needs a pre-filled cache (HF_HUB_OFFLINE=1) or a longer budget.
MIN_DOWNLOAD_BYTES_PER_S = 25 * 1e6
# published-t4-run.md's published T4 loads: (checkpoint bytes as the built-in facts count them, vLLM's "Model loading
# took ... seconds"): bf16 157.18 s, QAT about 98.7 s. The budget loads at the slower of the two rates (65 MB/s, bf16).
PUBLISHED_LOADS = ((10_246_357_062, 157.18), (8_315_978_118, 98.7))
# Memory profiling with torch.compile's Dynamo/Inductor pass, then the remaining compiles and CUDA graph capture, on an
# empty compile cache. Not published for a T4. Measured on the GPU host, sized as a T4 (compiling is CPU work, so the
# 16 cores there are faster than a T4 VM's): profiling 66 s (bf16) and 115 s (QAT), compiling 41 s and 46 s. Budgeted
# at about twice the slower profiling and four times the slower compiling.
PROFILING_S = 240.0
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
    """Seconds per loading phase (`phases.LOADING_PHASES`, in order) for a cold start of a checkpoint of
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
        "starting": "preflight, plan, supervisord, vLLM's imports and engine start: twice the GPU host's 87 s",
        "downloading": f"{weight_bytes / GB:.3f} GB at {MIN_DOWNLOAD_BYTES_PER_S / 1e6:.0f} MB/s, the slowest link "
        "budgeted",
        "loading_weights": f"{weight_bytes / GB:.3f} GB at {load_rate / 1e6:.1f} MB/s, the slower published T4 load "
        "(bf16, 157.18 s)",
        "profiling": "the profile run with torch.compile on an empty compile cache: twice the GPU host's 115 s",
        "compiling": "compiling and CUDA graph capture on an empty compile cache: four times the GPU host's 46 s",
        "canary": "the canary request's timeout",
    }
    return StartBudget(phases, how)
