"""The `vllm serve` flags in T4SERVE_VLLM_ARGS that move vLLM's KV cache accounting: each is modelled or refused.

Modelled (t4serve.planning.sizing and t4serve.planning.plan compute with them, and tests/oracle/kv_oracle.py checks the
figures against vLLM 0.33's own planner): `--async-scheduling` / `--no-async-scheduling` (tokens in flight per sliding
window), `--block-size` 16, 32 or 64, `--disable-hybrid-kv-cache-manager` / `--enable-hybrid-kv-cache-manager`,
`--enable-chunked-prefill` / `--no-enable-chunked-prefill` (alias `--disable-chunked-prefill`), and speculative
decoding with method `ngram_gpu` (no draft model: the KV layout is the target's alone).
Refused, each with why and what owns it instead (`REFUSED_KV_FLAGS`, `refused_kv_flag`): every other speculative
method (a draft model adds KV layers, some switch async scheduling off), `--disable-sliding-window`, context
parallelism, KV connectors and offloading, and `--attention-config`.

vLLM's parser accepts `--flag=value`, underscores for dashes and unambiguous abbreviations; so do these checks
(t4serve.config.vllmflags.canonical_flag, names_flag). Pure: strings in, reasons and a KVFlags out.
"""

from __future__ import annotations

from dataclasses import dataclass

from t4serve import untrusted
from t4serve.config.vllmflags import canonical_flag, names_flag

# The block sizes t4serve models: every attention backend vLLM 0.33 picks on the GPUs t4serve plans for runs them
# unsplit (Triton and FlashAttention take multiples of 16, FlashInfer exactly 16, 32 or 64), so sliding-window layers,
# which choose their own kernel block (`_largest_kernel_block_within`), take the same size.
MODELLED_BLOCK_SIZES = (16, 32, 64)
# The block size the plan passes when T4SERVE_VLLM_ARGS names none: vLLM's CacheConfig.DEFAULT_BLOCK_SIZE, pinned so
# the KV figures do not hang on which backend vLLM picks (FlashAttention 4 would pick 128 for 256-wide heads on
# capability 10.x).
PLAN_BLOCK_SIZE = 16
# The speculative method whose KV accounting is the target model's own (checked against vLLM's planner).
MODELLED_SPECULATIVE_METHOD = "ngram_gpu"

# Switch flags: the option as vLLM names it (BooleanOptionalAction and its aliases) -> (field, value).
SWITCHES: dict[str, tuple[str, bool]] = {
    "--async-scheduling": ("async_scheduling", True),
    "--no-async-scheduling": ("async_scheduling", False),
    "--enable-chunked-prefill": ("chunked_prefill", True),
    "--no-enable-chunked-prefill": ("chunked_prefill", False),
    "--disable-chunked-prefill": ("chunked_prefill", False),
    "--disable-hybrid-kv-cache-manager": ("hybrid_kv_cache_manager", False),
    "--no-disable-hybrid-kv-cache-manager": ("hybrid_kv_cache_manager", True),
    "--enable-hybrid-kv-cache-manager": ("hybrid_kv_cache_manager", True),
}
BLOCK_SIZE_FLAG = "--block-size"
SPECULATIVE_FLAGS = ("--speculative-config", "--spec-method", "--spec-model")

# Flags that change vLLM's KV accounting in ways t4serve does not model: why, and what to do instead.
REFUSED_KV_FLAGS: dict[str, str] = {
    "--disable-sliding-window": "it turns every sliding-window layer into full attention and caps max_model_len at "
    "the window, which t4serve's KV sizing does not model; set T4SERVE_MAX_MODEL_LEN to bound requests instead",
    "--decode-context-parallel-size": "context parallelism shards the KV cache across GPUs; t4serve serves one GPU",
    "-dcp": "context parallelism shards the KV cache across GPUs; t4serve serves one GPU",
    "--prefill-context-parallel-size": "context parallelism shards the KV cache across GPUs; t4serve serves one GPU",
    "-pcp": "context parallelism shards the KV cache across GPUs; t4serve serves one GPU",
    "--dcp-kv-cache-interleave-size": "context parallelism shards the KV cache across GPUs; t4serve serves one GPU",
    "--cp-kv-cache-interleave-size": "context parallelism shards the KV cache across GPUs; t4serve serves one GPU",
    "--kv-transfer-config": "a KV connector can switch the hybrid KV cache manager off and moves KV blocks off the "
    "GPU, which t4serve's KV sizing does not model",
    "--kv-offloading-size": "KV offloading adds a host tier t4serve's KV sizing does not model",
    "--kv-offloading-backend": "KV offloading adds a host tier t4serve's KV sizing does not model",
    "--attention-config": "it can set the backend per layer kind, the FlashAttention version and sparse attention, "
    "which move the KV layout; set T4SERVE_ATTENTION instead",
    "-ac": "it can set the backend per layer kind, the FlashAttention version and sparse attention, which move the KV "
    "layout; set T4SERVE_ATTENTION instead",
}


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
    # The method of `--speculative-config` / `--spec-method` (only MODELLED_SPECULATIVE_METHOD passes).
    speculative_method: str | None = None

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
        if self.speculative_method is not None:
            words.append(f"speculative decoding {self.speculative_method}")
        return words


def block_size(value: str) -> int | None:
    """`--block-size`'s value as vLLM's int() reads it, through t4serve's one integer parser (ASCII digits, an optional
    sign, blanks around): the same number for the plan's sizing and for vLLM, or None when the two could differ
    ("3_2", other scripts' digits)."""
    try:
        return untrusted.parse_int(value, 1, 1 << 20)
    except untrusted.Untrusted:
        return None


def _switch(name: str) -> tuple[str, tuple[str, bool]] | None:
    for flag, setting in SWITCHES.items():
        if names_flag(name, flag):
            return flag, setting
    return None


def _names(name: str, flag: str) -> bool:
    # Short options take their value glued on (-dcp2): compare by prefix.
    return name.startswith(flag) if not flag.startswith("--") else names_flag(name, flag)


def _speculative_method(name: str, value: str) -> tuple[str | None, str | None]:
    """(the method this argument names or None, a reason to refuse it or None) for one speculative argument."""
    if name == "-sc" or names_flag(name, "--speculative-config"):
        not_json = ("its value is not a JSON object, which vLLM reads it as (quote it for the shell: "
                    f"'{{\"method\": \"{MODELLED_SPECULATIVE_METHOD}\", \"num_speculative_tokens\": 3}}')")
        try:
            config = untrusted.loads_json(value, "--speculative-config")
        except untrusted.Untrusted:
            return None, not_json
        if not isinstance(config, dict):
            return None, not_json
        method = config.get("method")
        if method is None and config.get("model") is not None:
            return None, "its --speculative-config names a draft model, whose KV cache layers t4serve does not size"
        if method is not None and not isinstance(method, str):
            return None, f"its method must be a JSON string (found a {type(method).__name__})"
        return method, None
    base, dot, key = name.partition(".")
    if dot and names_flag(base, "--speculative-config"):
        if key == "method":
            return value.strip(), None
        if key == "model":
            return None, "its --speculative-config names a draft model, whose KV cache layers t4serve does not size"
        return None, None
    if names_flag(name, "--spec-method"):
        return value.strip(), None
    if names_flag(name, "--spec-model"):
        return None, "--spec-model names a draft model, whose KV cache layers t4serve does not size"
    return None, None


def _refused_method(method: str) -> str:
    return (
        f"must not use speculative method {method}: t4serve sizes speculative decoding only with method "
        f"{MODELLED_SPECULATIVE_METHOD} (no draft model, so the KV cache is the target's alone; checked against "
        f"vLLM's planner); {method} adds a draft model's KV cache layers or switches async scheduling off, which "
        "t4serve's KV sizing does not model"
    )


def refused_kv_flag(arg: str, following: str | None) -> str | None:
    """Why `arg` (with its value glued on by `=`, or the next argument) is refused for what it does to vLLM's KV
    accounting, or None."""
    if not arg.startswith("-") or arg in ("-", "--"):
        return None
    raw, eq, glued = arg.partition("=")
    name = canonical_flag(raw)
    value = glued if eq else following
    for flag, reason in REFUSED_KV_FLAGS.items():
        if _names(name, flag) or (flag.startswith("--") and name.startswith(flag + ".")):
            return f"must not contain {raw}: {reason}"
    if names_flag(name, BLOCK_SIZE_FLAG):
        if value is None:
            return f"must give {raw} a value (one of {', '.join(map(str, MODELLED_BLOCK_SIZES))}): it ends the flags"
        size = block_size(value)
        if size is None:
            sizes = ", ".join(map(str, MODELLED_BLOCK_SIZES))
            return f"must give {raw} a whole number of tokens in ASCII digits ({sizes})"
        if size not in MODELLED_BLOCK_SIZES:
            return (
                f"must not contain {raw} {size}: t4serve sizes the KV cache for block sizes "
                f"{', '.join(map(str, MODELLED_BLOCK_SIZES))}, which every attention backend vLLM 0.33 picks on "
                "these GPUs runs unsplit (sliding-window layers then take the same block)"
            )
        return None
    if eq and _switch(name) is not None:
        return f"must not give the switch {raw} a value (vLLM's parser refuses `{raw}={glued[:20]}`); write {raw} alone"
    if value is not None and (name == "-sc" or any(names_flag(name.partition(".")[0], f) for f in SPECULATIVE_FLAGS)):
        method, refusal = _speculative_method(name, value)
        if refusal is not None:
            return f"must not contain {raw}: {refusal}"
        if method is not None and method != MODELLED_SPECULATIVE_METHOD:
            return _refused_method(method)
    return None


def kv_flags(vllm_args: tuple[str, ...]) -> KVFlags:
    """The KV-relevant settings of T4SERVE_VLLM_ARGS, already checked by `refused_kv_flag` (a later flag wins, as in
    argparse)."""
    values: dict[str, object] = {}
    for i, arg in enumerate(vllm_args):
        if not arg.startswith("-"):
            continue
        raw, eq, glued = arg.partition("=")
        name = canonical_flag(raw)
        following = vllm_args[i + 1] if i + 1 < len(vllm_args) else None
        value: str | None = glued if eq else following
        switch = _switch(name)
        if switch is not None and not eq:
            field, setting = switch[1]
            values[field] = setting
        elif names_flag(name, BLOCK_SIZE_FLAG) and value is not None and (size := block_size(value)) is not None:
            values["block_size"] = size
        elif value is not None and (name == "-sc" or any(names_flag(name.partition(".")[0], f)
                                                        for f in SPECULATIVE_FLAGS)):
            method, _why = _speculative_method(name, value)
            if method is not None:
                values["speculative_method"] = method
    return KVFlags(**values)  # type: ignore[arg-type]
