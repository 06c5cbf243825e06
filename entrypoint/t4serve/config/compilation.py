"""The compile ladder: how much vLLM compiles, as rungs from fastest-to-run to cheapest-to-start (T4SERVE_COMPILE).

A first start on an empty compile cache can need more GPU memory than later ones: on the GPU host made a T4 in memory, a
hand-run of vLLM 0.26 (text-only model, pool profiled) died of an out-of-memory inside torch.compile, where a warm start
fitted. t4serve's own plan with the full model started cold on rung `full` there, 0.02 to 0.18 GiB above its warm peak
and within a T4's budget (docs/verification.md), so `auto` begins at `full`; the ladder is the way out for a card or
vLLM version where that does not hold. T4SERVE_COMPILE picks a rung, or `auto` climbs down the ladder: the wrapper
starts the rung the cache volume records as working for this server (else the first), and after an out-of-memory inside
torch.compile it records the next rung (t4serve.supervise.compilerecord), so the restart supervisord makes uses it and
later starts skip the failure. Pure: the rungs, the modes the setting takes, and which rungs a server may use.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

from t4serve.config.vllmargv import read_vllm_args

AUTO = "auto"


@dataclass(frozen=True)
class Rung:
    name: str
    flags: tuple[str, ...]
    what: str


_NO_COMBO = json.dumps({"inductor_compile_config": {"combo_kernels": False, "benchmark_combo_kernel": False}})

# Most to least compiled. vLLM's own flags only (0.26 and 0.33 take each of them).
LADDER: tuple[Rung, ...] = (
    Rung("full", (), "vLLM's default: torch.compile (Inductor) and full and piecewise CUDA graphs"),
    Rung("lean", ("--compilation-config", _NO_COMBO),
         "torch.compile without Inductor's combo kernels and their benchmarking, CUDA graphs as by default"),
    Rung("o1", ("-O1",), "vLLM's -O1: torch.compile with piecewise CUDA graphs only"),
    Rung("eager", ("--enforce-eager",), "no torch.compile and no CUDA graphs (slowest to run, cheapest to start)"),
)
RUNGS_BY_NAME = {r.name: r for r in LADDER}
MODES = (AUTO, *RUNGS_BY_NAME)


# vLLM's dests that set compilation: `--enforce-eager` (and `--no-enforce-eager`), `--compilation-config` (`-cc`, its
# dotted keys), `--optimization-level` (`-O3`).
COMPILATION_DESTS = frozenset({"enforce_eager", "compilation_config", "optimization_level"})


def compilation_flags(vllm_args: Sequence[str]) -> list[str]:
    """The flags of T4SERVE_VLLM_ARGS that set compilation, as written, in any spelling vLLM's parser reads
    (t4serve.config.vllmargv)."""
    return [o.written for o in read_vllm_args(vllm_args).occurrences if o.action.dest in COMPILATION_DESTS]


def user_controls_compilation(vllm_args: Sequence[str]) -> bool:
    """Whether T4SERVE_VLLM_ARGS sets compilation itself: then t4serve adds no compile flags."""
    return bool(compilation_flags(vllm_args))


def ladder_for(mode: str, vllm_args: Sequence[str]) -> tuple[Rung, ...]:
    """The rungs a server may use: all of them for `auto`, the one named otherwise, none where the user set flags."""
    if user_controls_compilation(vllm_args):
        return ()
    if mode == AUTO:
        return LADDER
    return (RUNGS_BY_NAME[mode],)
