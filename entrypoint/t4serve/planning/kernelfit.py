"""Does vLLM's quantized-KV attention kernel fit the card's shared memory? vLLM's planner does not ask; Triton does, at
the first launch ("out of resource: shared memory, Required: N, Hardware limit: M"), so the plan asks first.

The figures are vLLM 0.33.0's `int4_per_token_head` kernel (`_attn_packed` in
vllm/v1/attention/ops/int4_per_token_head.py) compiled by the image's Triton 3.8 for sm_75, at the tile the clamped
`_get_tile_size` picks on a card of 65,536 B per block (`tests/gpu/kv_kernel_shared_memory.py` prints them from the
image; docs/verified/kv-kernel-shared-memory/). The larger of its prefill (2D) and decode (3D) launches, by head size
rounded up to a power of two, for full attention; sliding layers need less where measured (Gemma 4 E2B's 256-wide,
512-token window: 51,200 B), and elsewhere the full-attention figure bounds them. On sm_80 the same kernel needs
41,344 B at head 512 (Ampere's code keeps fewer tiles in shared memory), so the limit bites on Turing only. int8 needs
65,536 B at head 512 on sm_75, as the 16-bit cache does with the clamp: it fits a T4 exactly.
"""

from __future__ import annotations

from t4serve.errors import ConfigError
from t4serve.gpus import format_capability, shared_memory_per_block_optin
from t4serve.patch.clamp import padded_head_size
from t4serve.planning.kvcache import KVSpec

TURING = (7, 5)
# Padded head size -> shared memory per block (B) of the int4 kernel on sm_75, full attention.
INT4_TURING_FULL_ATTENTION = {64: 20_480, 128: 40_960, 256: 81_920, 512: 98_304}
# (padded head size, sliding window) -> the same, where a sliding layer was measured.
INT4_TURING_SLIDING = {(256, 512): 51_200}


def int4_need(spec: KVSpec) -> int | None:
    """Shared memory per block the int4 kernel needs for this layer on sm_75, or None above the largest head
    measured (a head below the smallest measured is bounded by it)."""
    head = max(padded_head_size(spec.head_size), min(INT4_TURING_FULL_ATTENTION))
    if spec.sliding_window is not None and (head, spec.sliding_window) in INT4_TURING_SLIDING:
        return INT4_TURING_SLIDING[(head, spec.sliding_window)]
    return INT4_TURING_FULL_ATTENTION.get(head)


def _int4_excess(specs: list[KVSpec], capability: tuple[int, int]) -> tuple[KVSpec, int | None] | None:
    """On Turing, the layer whose int4 kernel needs the most shared memory and that need (None: more than any head
    measured), where it exceeds the card; else None (other cards, or no layers to judge: nothing this table knows)."""
    if capability != TURING or not specs:
        return None
    worst = max(specs, key=lambda s: int4_need(s) or 1 << 30)
    need = int4_need(worst)
    return None if need is not None and need <= shared_memory_per_block_optin(capability) else (worst, need)


def int4_fits(specs: list[KVSpec], capability: tuple[int, int]) -> bool:
    """Whether vLLM's int4 kernel fits the card for these layers: below Turing's limit on Turing, and elsewhere (or
    with no layers to judge) as far as this table knows."""
    return _int4_excess(specs, capability) is None


def check_kv_kernel_fits(specs: list[KVSpec], cache_dtype: str, gpu_name: str, capability: tuple[int, int]) -> None:
    """A ConfigError where vLLM's int4 per-token-head attention kernel needs more shared memory per block than this
    Turing card has, for any layer of the model (the largest need named)."""
    excess = _int4_excess(specs, capability) if cache_dtype == "int4_per_token_head" else None
    if excess is None:
        return
    worst, need = excess
    limit = shared_memory_per_block_optin(capability)
    layer = "full-attention" if worst.sliding_window is None else f"{worst.sliding_window}-token sliding"
    needed = f"{need:,} B" if need is not None else "more than any head measured (512 needs 98,304 B)"
    raise ConfigError(
        f"T4SERVE_KV_CACHE_DTYPE=int4 cannot run on {gpu_name}: vLLM's int4 attention kernel needs {needed} of "
        f"shared memory per block at head {worst.head_size}",
        found=f"{gpu_name}, compute capability {format_capability(capability)}, {limit:,} B of shared memory per "
              f"block; the model's {layer} layers have head size {worst.head_size}",
        required=f"at most {limit:,} B: vLLM 0.33's int4_per_token_head kernel, compiled for sm_75 at the clamp's "
                 f"tile, needs {needed}, so Triton would stop its first launch (\"out of resource: shared memory, "
                 f"Required: {need or 'more'}, Hardware limit: {limit}\")",
        fix="set T4SERVE_KV_CACHE_DTYPE=int8 (its kernel fits this card: 65,536 B at head 512) or auto",
    )
