"""The `vllm serve` flags in T4SERVE_VLLM_ARGS that move vLLM's KV cache accounting: each is modelled or refused.

Modelled (t4serve.planning.sizing and t4serve.planning.plan compute with them, and tests/oracle/kv_oracle.py checks the
figures against vLLM 0.34's own planner): `--async-scheduling` / `--no-async-scheduling` (tokens in flight per sliding
window), `--block-size` 16, 32 or 64, `--disable-hybrid-kv-cache-manager` / `--enable-hybrid-kv-cache-manager`,
and `--enable-chunked-prefill` / `--no-enable-chunked-prefill` (alias `--disable-chunked-prefill`).
Refused, each with why and what owns it instead (`REFUSED_KV_FLAGS`, `refused_kv_flag`): `--disable-sliding-window`,
context parallelism, KV connectors and offloading, `--attention-config`, and vLLM 0.34's
`--enable-extensible-kv-cache`. Speculative decoding is T4SERVE_SPECULATIVE's (t4serve.config.vllmflags owns its
flags).

The arguments are read as vLLM's parser reads them (t4serve.config.vllmargv: `--flag=value`, underscores, unambiguous
abbreviations, short aliases, dotted keys merged into one JSON value, the last of a flag winning), so each flag is
checked however it was written. Pure: strings in, reasons and a KVFlags out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from t4serve import untrusted
from t4serve.config.vllmargv import Occurrence, flag_table, read_vllm_args

# The block sizes t4serve models: every attention backend vLLM 0.34 picks on the GPUs t4serve plans for runs them
# unsplit (Triton and FlashAttention take multiples of 16, FlashInfer exactly 16, 32 or 64), so sliding-window layers,
# which choose their own kernel block (`_largest_kernel_block_within`), take the same size.
MODELLED_BLOCK_SIZES = (16, 32, 64)
# The block size the plan passes when T4SERVE_VLLM_ARGS names none, so the KV figures do not hang on vLLM's default
# (64 in vLLM 0.34, `CacheConfig.DEFAULT_BLOCK_SIZE`; 16 before) or on which backend it picks (FlashAttention 4 would
# pick 128 for 256-wide heads on capability 10.x). 16 holds more tokens than 64 for Gemma 4 E2B at every length
# (docs/sizing.md has the figures).
PLAN_BLOCK_SIZE = 16

# Switches, by vLLM's dest -> (KVFlags field, whether the switch on means the field off). Each dest's options (and
# those that set it false: `--no-x`, `--disable-x` of an `--enable-x`) come from vLLM's table.
SWITCHES: dict[str, tuple[str, bool]] = {
    "async_scheduling": ("async_scheduling", False),
    "enable_chunked_prefill": ("chunked_prefill", False),
    "disable_hybrid_kv_cache_manager": ("hybrid_kv_cache_manager", True),
}
BLOCK_SIZE_FLAG = "--block-size"

# Flags that change vLLM's KV accounting in ways t4serve does not model: why, and what to do instead.
REFUSED_KV_FLAGS: dict[str, str] = {
    "--disable-sliding-window": "it turns every sliding-window layer into full attention and caps max_model_len at "
    "the window, which t4serve's KV sizing does not model; set T4SERVE_MAX_MODEL_LEN to bound requests instead",
    "--decode-context-parallel-size": "context parallelism shards the KV cache across GPUs; t4serve serves one GPU",
    "--prefill-context-parallel-size": "context parallelism shards the KV cache across GPUs; t4serve serves one GPU",
    "--dcp-kv-cache-interleave-size": "context parallelism shards the KV cache across GPUs; t4serve serves one GPU",
    "--cp-kv-cache-interleave-size": "context parallelism shards the KV cache across GPUs; t4serve serves one GPU",
    "--kv-transfer-config": "a KV connector can switch the hybrid KV cache manager off and moves KV blocks off the "
    "GPU, which t4serve's KV sizing does not model",
    "--kv-offloading-size": "KV offloading adds a host tier t4serve's KV sizing does not model",
    "--kv-offloading-backend": "KV offloading adds a host tier t4serve's KV sizing does not model",
    "--attention-config": "it can set the backend per layer kind, the FlashAttention version and sparse attention, "
    "which move the KV layout; set T4SERVE_ATTENTION instead",
}
# vLLM 0.34's extensible KV cache (reserve the address range, size the cache from the memory left after CUDA graph
# capture): refused when switched on; its off switches (`--no-enable-`, `--disable-extensible-kv-cache`) change nothing
# beside the pool t4serve passes.
EXTENSIBLE_KV_CACHE = "--enable-extensible-kv-cache"
EXTENSIBLE_WHY = (
    "it sizes the KV cache from memory measured after CUDA graph capture, where t4serve passes the pool it sized "
    "(--kv-cache-memory-bytes, with which vLLM 0.34 refuses it); with T4SERVE_KV_CACHE_MEMORY_BYTES=profile vLLM turns "
    "it on by itself"
)


@dataclass(frozen=True)
class KVFlags:
    """What T4SERVE_VLLM_ARGS sets of vLLM's KV accounting; each default is vLLM's own for a single GPU."""

    # `--no-async-scheduling`: one batch in flight instead of two (VllmConfig.max_concurrent_batches).
    async_scheduling: bool = True
    # `--block-size`; None: the plan passes PLAN_BLOCK_SIZE.
    block_size: int | None = None
    # `--disable-hybrid-kv-cache-manager`: sliding layers allocated as full attention where both kinds mix.
    hybrid_kv_cache_manager: bool = True
    # `--no-enable-chunked-prefill`: vLLM refuses max_num_batched_tokens below max_model_len.
    chunked_prefill: bool = True

    @property
    def planned_block_size(self) -> int:
        return self.block_size or PLAN_BLOCK_SIZE

    def describe(self) -> list[str]:
        """The non-default settings in vLLM's flag words, for the plan's notes."""
        words = []
        if not self.async_scheduling:
            words.append("--no-async-scheduling (one batch in flight)")
        if self.block_size is not None:
            words.append(f"--block-size {self.block_size}")
        if not self.hybrid_kv_cache_manager:
            words.append("--disable-hybrid-kv-cache-manager (sliding layers allocated in full)")
        if not self.chunked_prefill:
            words.append("--no-enable-chunked-prefill (max_num_batched_tokens >= max_model_len)")
        return words


def block_size(value: str) -> int | None:
    """`--block-size`'s value as vLLM's int() reads it, through t4serve's one integer parser (ASCII digits, an optional
    sign, blanks around): the same number for the plan's sizing and for vLLM, or None when the two could differ
    ("3_2", other scripts' digits)."""
    try:
        return untrusted.parse_int(value, 1, 1 << 20)
    except untrusted.Untrusted:
        return None


def _is(occurrence: Occurrence, flag: str) -> bool:
    return occurrence.action is flag_table().action(flag)


def refused_kv_flag(occurrence: Occurrence) -> str | None:
    """Why the flag `occurrence` is refused for what it does to vLLM's KV accounting, or None."""
    written = occurrence.written.partition(".")[0]
    for flag, reason in REFUSED_KV_FLAGS.items():
        if _is(occurrence, flag):
            return f"must not contain {written}: {reason}"
    if _is(occurrence, EXTENSIBLE_KV_CACHE) and occurrence.switched_on:
        return f"must not contain {written}: {EXTENSIBLE_WHY}"
    if occurrence.missing is not None:
        return None  # no value to judge: vLLM's parser refuses it (t4serve.config.vllmflags.unread_argument)
    if not _is(occurrence, BLOCK_SIZE_FLAG):
        return None
    value = occurrence.value
    sizes = ", ".join(map(str, MODELLED_BLOCK_SIZES))
    size = block_size(value) if value is not None else None
    if size is None:
        return f"must give {written} a whole number of tokens in ASCII digits ({sizes})"
    if size not in MODELLED_BLOCK_SIZES:
        return (
            f"must not contain {written} {size}: t4serve sizes the KV cache for block sizes {sizes}, which every "
            "attention backend vLLM 0.34 picks on these GPUs runs unsplit (sliding-window layers then take the "
            "same block)"
        )
    return None


def refused_kv_flags(args: Sequence[str]) -> tuple[str, str] | None:
    """(why, the flag as written) for the first flag of `args` refused by `refused_kv_flag`, or None."""
    for occurrence in read_vllm_args(args).occurrences:
        why = refused_kv_flag(occurrence)
        if why is not None:
            return why, occurrence.written
    return None


def kv_flags(vllm_args: Sequence[str]) -> KVFlags:
    """The KV-relevant settings of T4SERVE_VLLM_ARGS, already checked by `refused_kv_flag`; the last flag of each
    wins, as in argparse."""
    values: dict[str, object] = {}
    for occurrence in read_vllm_args(vllm_args).occurrences:
        switch = SWITCHES.get(occurrence.action.dest)
        if switch is not None:
            field, inverted = switch
            values[field] = occurrence.switched_on != inverted
        elif (_is(occurrence, BLOCK_SIZE_FLAG) and occurrence.value is not None
              and (size := block_size(occurrence.value)) is not None):
            values["block_size"] = size
    return KVFlags(**values)  # type: ignore[arg-type]
