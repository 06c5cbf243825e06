"""T4SERVE_ATTENTION resolved for the planned card, model, dtype and KV cache: which attention path vLLM runs.

`turing-mma` (t4serve.turing: vLLM's Triton attention on Turing's tensor cores) runs on compute capability 7.5 with a
16-bit (float16) model, a 16-bit or int8 KV cache and head sizes the launch table covers; `triton` is vLLM's Triton
attention as vLLM launches it. `auto` takes turing-mma where it runs on a Turing card and says why where it does not;
on 8.0 and later it leaves the backend to vLLM (t4serve passes TRITON_ATTN only where its KV sizing needs that
layout). The image carries no other attention backend (FlashAttention and FlashInfer are left out: docs/image.md).
"""

from __future__ import annotations

from dataclasses import dataclass

from t4serve.errors import ConfigError
from t4serve.gpus import FLASH_ATTENTION_MIN_CAPABILITY, TURING, format_capability
from t4serve.patch.clamp import padded_head_size
from t4serve.turing.launch import TRITON, TURING_MMA, TURING_MMA_HEADS

AUTO = "auto"
SETTINGS = (AUTO, TURING_MMA, TRITON)
TRITON_BACKEND = "TRITON_ATTN"
# KV cache settings the turing-mma launches are built and proven for (t4serve.turing.launch.KV_MODES).
TURING_MMA_KV = ("auto", "int8")


@dataclass(frozen=True)
class AttentionChoice:
    """The path (None: vLLM's own choice of backend), the `--attention-backend` t4serve passes (None: none), why."""

    path: str | None
    backend: str | None
    reason: str

    @property
    def label(self) -> str:
        return self.path or "chosen by vLLM"


def turing_mma_blockers(capability: tuple[int, int] | None, dtype: str, kv_cache_dtype: str,
                        heads: list[int]) -> list[str]:
    """Why turing-mma cannot run here, one reason each (empty: it can)."""
    blockers = []
    if capability is None:
        blockers.append("no GPU to plan for")
    elif capability < TURING or capability >= FLASH_ATTENTION_MIN_CAPABILITY:
        blockers.append(
            f"compute capability {format_capability(capability)}: it is for {format_capability(TURING)} (Turing), "
            "where Triton compiles attention's dot products without tensor cores; from 8.0 vLLM's Triton kernel uses "
            "them already")
    if dtype != "float16":
        blockers.append(f"dtype {dtype}: Turing's tensor cores take float16 (T4SERVE_DTYPE=auto or float16)")
    if kv_cache_dtype not in TURING_MMA_KV:
        blockers.append(f"KV cache dtype {kv_cache_dtype}: its launches are built for the 16-bit and int8 caches")
    uncovered = sorted({h for h in heads if padded_head_size(h) not in TURING_MMA_HEADS})
    if uncovered:
        blockers.append(f"head size {', '.join(map(str, uncovered))}: its launches cover padded head sizes "
                        f"{', '.join(map(str, TURING_MMA_HEADS))}")
    return blockers


def choose_attention(setting: str, capability: tuple[int, int] | None, dtype: str, kv_cache_dtype: str,
                     heads: list[int]) -> AttentionChoice:
    """The attention path for T4SERVE_ATTENTION=`setting`; ConfigError where a named path cannot run here."""
    blockers = turing_mma_blockers(capability, dtype, kv_cache_dtype, heads)
    if setting == TURING_MMA:
        if blockers:
            raise ConfigError(
                "T4SERVE_ATTENTION=turing-mma cannot run here",
                found="; ".join(blockers),
                required="compute capability 7.5, dtype float16, KV cache auto or int8, padded head sizes "
                         + ", ".join(map(str, TURING_MMA_HEADS)),
                fix="T4SERVE_ATTENTION=auto (it takes turing-mma where it runs) or T4SERVE_ATTENTION=triton",
            )
        return AttentionChoice(TURING_MMA, TRITON_BACKEND, "set by T4SERVE_ATTENTION: vLLM's Triton attention on "
                                                           "Turing's tensor cores (t4serve.turing)")
    if setting == TRITON:
        return AttentionChoice(TRITON, TRITON_BACKEND, "set by T4SERVE_ATTENTION: vLLM's Triton attention as vLLM "
                                                       "launches it")
    if capability is not None and capability < FLASH_ATTENTION_MIN_CAPABILITY:
        if not blockers:
            return AttentionChoice(TURING_MMA, TRITON_BACKEND,
                                   f"auto: capability {format_capability(capability)}, float16, tensor cores through "
                                   "t4serve.turing (Triton's own code for Turing has none)")
        return AttentionChoice(TRITON, TRITON_BACKEND, "auto: turing-mma does not run here (" + "; ".join(blockers)
                               + "); vLLM's Triton attention, the only backend below 8.0")
    if kv_cache_dtype != "auto":
        # The quantized caches are sized as vLLM's Triton backend lays them out (the only one running the
        # per-token-head types; FlashAttention's fp8 picks its own blocks on 9.x).
        return AttentionChoice(TRITON, TRITON_BACKEND, f"auto: KV cache {kv_cache_dtype} is sized as vLLM's Triton "
                                                       "backend lays it out")
    return AttentionChoice(None, None, "auto: vLLM chooses on capability 8.0 and later")
