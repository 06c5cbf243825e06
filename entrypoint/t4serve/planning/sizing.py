"""Sizing: GPU + model facts + settings -> max_model_len, max_num_seqs, KV pool, tokens, concurrency, RAM, ceiling.

`size(SizingInputs) -> Sizing` is the one entry `plan()` calls. Pure: every figure is a Derived carrying its
arithmetic. The KV accounting is vLLM 0.33's own (planning.kvcache); the pool is predicted as total x utilization -
weights in GPU memory - activation peak - non-torch/graph allowance, each term shown. A set value wins ("setting").
"""

from __future__ import annotations

from dataclasses import dataclass, field

from t4serve.config import kvflags
from t4serve.config.kvflags import KVFlags
from t4serve.config.settings import DEFAULT_MAX_MODEL_LEN
from t4serve.errors import ConfigError
from t4serve.facts import HostFacts, ModelFacts
from t4serve.gpus import BatchDefaults, vllm_batch_defaults
from t4serve.planning import hostmem, kvcache
from t4serve.planning.derived import Derived
from t4serve.planning.roofline import roofline
from t4serve.planning.speculative import DrafterGpu, Speculation, drafter_gpu, drafter_summary
from t4serve.planning.weights import weights_in_gpu
from t4serve.probes.checkpoint import CONFIG_READ_BY
from t4serve.units import GIB

# CUDA graph pools, cuBLAS/Triton workspaces and kernels loaded after vLLM's start snapshot: not derivable from the
# checkpoint. Calibrated once on the published bf16 T4 run (published-t4-run.md): 15 GiB x 0.9 = 13.5 GiB requested,
# pool 2.8321 GiB (30,934 blocks, the pool that gives its logged 315,974 tokens), weights + buffers 9.7292 GiB (weights
# from the headers 9.5075, rotary caches 0.1875, per-layer-input buffer 0.0342: what vLLM allocates, per
# tests/oracle/weights_oracle.py), activation peak 0.2676 GiB (below) -> 13.5 - 9.7292 - 0.2676 - 2.8321 = 0.6711 GiB.
# tests/unit/test_planning_sizing.py recomputes this from those inputs.
NON_TORCH_AND_GRAPHS_BYTES = int(0.6711 * GIB)


@dataclass(frozen=True)
class SizingInputs:
    gpu_memory_bytes: int
    gpu_memory_utilization: float
    compute_capability: tuple[int, int]
    bandwidth_bytes_per_s: float | None
    model: ModelFacts
    dtype_bytes: int
    max_model_len: int | None
    max_num_seqs: int | None
    kv_cache_memory_bytes: int | None
    host: HostFacts | None
    # T4SERVE_KV_CACHE_MEMORY_BYTES=profile: pass no --kv-cache-memory-bytes, vLLM measures the pool at start.
    kv_profile: bool = False
    # T4SERVE_MAX_NUM_BATCHED_TOKENS; None: vLLM's default for this GPU (its memory, name and capability).
    max_num_batched_tokens: int | None = None
    # The device name as vLLM's platform reports it: vLLM's batch defaults keep an A100 on the small tier by name.
    gpu_name: str = ""
    # What T4SERVE_VLLM_ARGS sets of vLLM's KV accounting (t4serve.config.kvflags).
    kv_flags: KVFlags = field(default_factory=KVFlags)
    # VLLM_ALLOW_LONG_MAX_MODEL_LEN in the server's environment: vLLM then accepts a max_model_len above the model's.
    allow_long_max_model_len: bool = False
    # vLLM's --kv-cache-dtype (planning.kvcache.KV_CACHE_DTYPE_LAYOUTS): "auto" is the model dtype.
    kv_cache_dtype: str = "auto"
    # T4SERVE_SPECULATIVE resolved (planning.speculative): the drafter's weights and activations take GPU memory, its
    # checkpoint host memory at load; its KV cache is the target's.
    speculation: Speculation | None = None


@dataclass(frozen=True)
class Sizing:
    max_model_len: Derived
    max_num_batched_tokens: Derived
    # What vLLM's "Model loading took N GiB" counts: weights as loaded plus the buffers allocated at load.
    gpu_weights_bytes: Derived
    max_num_seqs: Derived
    kv_cache_memory_bytes: Derived | None
    kv_pool_bytes: Derived
    kv_tokens: Derived
    concurrency: Derived
    host_memory_need_bytes: Derived
    swap_to_add_bytes: Derived
    decode_ceiling_tokens_per_s: Derived | None
    notes: list[str] = field(default_factory=list)
    # The `--block-size` the KV figures are for (the plan passes it: t4serve.config.kvflags.PLAN_BLOCK_SIZE).
    block_size: int = kvflags.PLAN_BLOCK_SIZE


def text_config(model: ModelFacts) -> dict[str, object]:
    text = model.config.get("text")
    if not isinstance(text, dict) or "num_hidden_layers" not in text:
        raise ConfigError(
            "sizing needs the model's config.json",
            found=f"{model.requested}: source {model.source}; {model.error or 'no text config'}",
            required="a checkpoint with config.json (local, from the hub, or a built-in alias: qat, bf16)",
            fix="set T4SERVE_MODEL to a downloaded checkpoint directory or an alias",
        )
    return text


def rotary_buffers(text: dict[str, object], dtype_bytes: int) -> tuple[int, str]:
    """vLLM's `get_rope` cos/sin caches: one per distinct head size, [max_position_embeddings, head] in the dtype."""
    max_pos = int(str(text.get("max_position_embeddings", 0)))
    heads = set(kvcache.head_sizes(dict(text)))
    total = sum(max_pos * h * dtype_bytes for h in heads)
    sizes = " + ".join(map(str, sorted(heads)))
    return total, f"rotary cos/sin caches {max_pos:,} positions x ({sizes}) x {dtype_bytes} B"


def per_layer_input_buffer(text: dict[str, object], max_num_batched_tokens: int, dtype_bytes: int) -> tuple[int, str]:
    """Gemma 4's `per_layer_embeddings`: vLLM 0.33 `Gemma4ForConditionalGeneration.__init__` allocates it beside the
    weights (for CUDA graphs), [max_num_batched_tokens, layers, per-layer input size] in the dtype; 0 without PLE."""
    ple = int(str(text.get("hidden_size_per_layer_input") or 0))
    layers = int(str(text.get("num_hidden_layers") or 0))
    total = max_num_batched_tokens * layers * ple * dtype_bytes
    return total, f"per-layer-input buffer {max_num_batched_tokens} tokens x {layers} x {ple} x {dtype_bytes} B"


def buffers_in_gpu(text: dict[str, object], max_num_batched_tokens: int, dtype_bytes: int) -> tuple[int, str]:
    """Tensors vLLM allocates at load that no checkpoint holds: the rotary caches and the per-layer-input buffer."""
    rope, rope_how = rotary_buffers(text, dtype_bytes)
    ple, ple_how = per_layer_input_buffer(text, max_num_batched_tokens, dtype_bytes)
    if not ple:
        return rope, rope_how
    return rope + ple, f"{rope_how} + {ple_how}"


def activation_peak(text: dict[str, object], *, tokens: int, max_num_seqs: int, dtype_bytes: int) -> tuple[int, str]:
    """The profile run's largest live tensors: one forward of `tokens` tokens plus the dummy sampler over the seqs."""

    def i(key: str, default: int = 0) -> int:
        value = text.get(key)
        return int(str(value)) if value is not None else default

    hidden, layers = i("hidden_size"), i("num_hidden_layers")
    mlp = i("intermediate_size") * (2 if text.get("use_double_wide_mlp") else 1)
    head = max(kvcache.head_sizes(dict(text)) or [0])
    qkv = (i("num_attention_heads") + 2 * i("num_key_value_heads", 1)) * head
    ple = layers * i("hidden_size_per_layer_input")
    vocab = i("vocab_size")
    forward = tokens * dtype_bytes * (3 * mlp + 4 * hidden + qkv + 2 * ple)
    sampler = max_num_seqs * vocab * 4 * 2
    how = (f"forward of {tokens} tokens x {dtype_bytes} B x (3 x {mlp} MLP + 4 x {hidden} hidden + {qkv} qkv + 2 x "
           f"{ple} per-layer inputs) = {forward / GIB:.4f} GiB; sampler {max_num_seqs} seqs x {vocab:,} x fp32 logits"
           f" and probs = {sampler / GIB:.4f} GiB")
    return forward + sampler, how


def drafter_in_gpu(inputs: SizingInputs, text: dict[str, object], batched_tokens: int) -> DrafterGpu | None:
    """The drafter's bytes on the GPU (planning.speculative), for the rotary caches' length at the longest the model
    allows; None without a drafter."""
    spec = inputs.speculation
    if spec is None or spec.drafter is None:
        return None
    longest = inputs.max_model_len or derived_max_model_len(text)[0] or VLLM_DEFAULT_MAX_LEN
    return drafter_gpu(spec.drafter, dict(text), max_model_len=longest, batched_tokens=batched_tokens,
                       dtype_bytes=inputs.dtype_bytes)


def predict_pool(inputs: SizingInputs, text: dict[str, object], max_num_seqs: int,
                 batched_tokens: int) -> tuple[int, str]:
    requested = int(inputs.gpu_memory_bytes * inputs.gpu_memory_utilization)
    weights, weights_how = weights_in_gpu(inputs.model, inputs.dtype_bytes)
    rope, rope_how = buffers_in_gpu(text, batched_tokens, inputs.dtype_bytes)
    act, act_how = activation_peak(text, tokens=batched_tokens, max_num_seqs=max_num_seqs,
                                   dtype_bytes=inputs.dtype_bytes)
    drafter = drafter_in_gpu(inputs, text, batched_tokens)
    draft = drafter.loaded + drafter.activation if drafter is not None else 0
    pool = requested - weights - rope - act - draft - NON_TORCH_AND_GRAPHS_BYTES
    how = (f"{inputs.gpu_memory_bytes / GIB:.4f} GiB x {inputs.gpu_memory_utilization} = {requested / GIB:.4f} GiB"
           f" - weights {weights / GIB:.4f} GiB ({weights_how}) - buffers {rope / GIB:.4f} GiB ({rope_how})"
           f" - activation {act / GIB:.4f} GiB ({act_how})"
           + (f" - drafter {drafter_summary(drafter)}" if drafter is not None else "")
           + f" - non-torch and CUDA graphs {NON_TORCH_AND_GRAPHS_BYTES / GIB:.4f} GiB (calibrated on the published "
           "T4 run" + ("; the drafter's CUDA graphs are not in it" if drafter is not None else "") + ")")
    return pool, how


# vLLM 0.33 `ModelArchConfigConvertorBase.derive_max_model_len_and_key`: the smallest of these in the text config;
# a `model_max_length` (Command-R) then overrides.
MAX_LEN_KEYS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length", "model_max_length",
                "max_target_positions", "max_sequence_length", "max_seq_length", "seq_len")
# `_get_and_verify_max_len`: RoPE types whose max_position_embeddings is already the scaled length (no `factor`).
UNSCALED_ROPE_TYPES = ("su", "longrope", "llama3", "yarn", "deepseek_yarn", "deepseek_llama_scaling")
# `is_rope_parameters_nested`: rope parameters keyed by layer type (Gemma 3/4) or by DeepSeek-V4's rope kinds.
ROPE_NESTING_KEYS = ("full_attention", "sliding_attention", "chunked_attention", "linear_attention", "main",
                     "compress")
# `_get_and_verify_max_len` when no key names a length and max_model_len is unset.
VLLM_DEFAULT_MAX_LEN = 2048


def _rope_parameters(text: dict[str, object]) -> list[dict[str, object]]:
    """vLLM's `iter_rope_parameters` over `rope_parameters` (transformers 5; `rope_scaling` in older configs, with
    `type` for `rope_type`, as vLLM's `patch_rope_parameters` reads them)."""
    params = text.get("rope_parameters") or text.get("rope_scaling")
    if not isinstance(params, dict) or not params:
        return []
    if set(params) <= set(ROPE_NESTING_KEYS):
        return [p for p in params.values() if isinstance(p, dict) and p]
    return [params]


def derived_max_model_len(text: dict[str, object]) -> tuple[int | None, str]:
    """vLLM's derived maximum max_model_len for a text config and how it was reached; None where no key names one
    (vLLM then takes any set length and defaults to 2048). `_get_and_verify_max_len` less the parts t4serve refuses
    (--disable-sliding-window) or that apply to pooling models only (the tokenizer's model_max_length)."""
    derived: float = float("inf")
    key = None
    for name in MAX_LEN_KEYS:
        value = text.get(name)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value < derived:
            derived, key = value, name
    override = text.get("model_max_length")
    if isinstance(override, (int, float)) and not isinstance(override, bool) and override:
        derived, key = override, "model_max_length"
    if derived == float("inf"):
        return None, "no max_position_embeddings or similar key in config.json"
    how = f"{key}={int(derived):,}"
    factor = 1.0
    if "gemma3" not in str(text.get("model_type") or ""):
        for params in _rope_parameters(text):
            rope_type = params.get("rope_type") or params.get("type")
            raw = params.get("factor")
            if rope_type not in UNSCALED_ROPE_TYPES and isinstance(raw, (int, float)) and not isinstance(raw, bool):
                factor = float(raw)
    if factor != 1.0:
        how += f" x RoPE factor {factor:g}"
    return int(derived * factor), how


def check_max_model_len_within_the_model(text: dict[str, object], max_model_len: int, allow_long: bool) -> str | None:
    """vLLM's check of a set max_model_len against the model's derived maximum, in its words; a note when
    VLLM_ALLOW_LONG_MAX_MODEL_LEN lets it pass, None when within."""
    derived, how = derived_max_model_len(text)
    if derived is None or max_model_len <= derived:
        return None
    model_max_length = text.get("model_max_length")
    if isinstance(model_max_length, int) and max_model_len <= model_max_length:
        return None
    said = (f"User-specified max_model_len ({max_model_len}) is greater than the derived max_model_len ({how} or "
            f"model_max_length={model_max_length} in model's config.json).")
    if allow_long:
        return (f"T4SERVE_MAX_MODEL_LEN={max_model_len} is above the model's {how}; VLLM_ALLOW_LONG_MAX_MODEL_LEN "
                "is set, so vLLM accepts it with a warning (positions past the model's maximum may give NaN)")
    raise ConfigError(
        "vLLM would refuse T4SERVE_MAX_MODEL_LEN above the model's maximum",
        found=f"T4SERVE_MAX_MODEL_LEN={max_model_len}; the model's {how}",
        required=f"{said} To allow overriding this maximum, set the env var VLLM_ALLOW_LONG_MAX_MODEL_LEN=1. "
                 "(vLLM's words)",
        fix=f"set T4SERVE_MAX_MODEL_LEN={derived} or lower (or auto), or set VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 in the "
            "container's environment if you accept positions past what the model was trained on",
    )


def config_reading_notes(model: ModelFacts) -> list[str]:
    """How the text config the figures rest on was read: transformers' defaults by t4serve's table, or vLLM's reader."""
    read_by = model.config.get(CONFIG_READ_BY)
    return [f"model config read as vLLM reads it: {read_by}"] if isinstance(read_by, str) else []


def check_seqs_within_batched(max_num_seqs: int | None, batched: int) -> None:
    """vLLM's `SchedulerConfig.verify_max_model_len`: max_num_batched_tokens >= max_num_seqs, in its words."""
    if max_num_seqs is not None and batched < max_num_seqs:
        raise ConfigError(
            "vLLM would refuse T4SERVE_MAX_NUM_SEQS above the batched tokens",
            found=f"T4SERVE_MAX_NUM_SEQS={max_num_seqs}, max_num_batched_tokens {batched}",
            required=f"max_num_batched_tokens ({batched}) must be greater than or equal to max_num_seqs "
                     f"({max_num_seqs}) (vLLM's words)",
            fix=f"set T4SERVE_MAX_NUM_SEQS={batched} or lower, or T4SERVE_MAX_NUM_BATCHED_TOKENS={max_num_seqs} or "
                "more",
        )


def check_batched_covers_max_model_len(flags: KVFlags, batched_setting: int | None, max_model_len: int) -> None:
    """vLLM's `SchedulerConfig.verify_max_model_len`: with chunked prefill off, max_num_batched_tokens must hold a
    whole max_model_len. An auto batched size is raised to it (as vLLM's own default is); a set one is refused."""
    if flags.chunked_prefill or batched_setting is None or batched_setting >= max_model_len:
        return
    raise ConfigError(
        "vLLM would refuse these batched tokens with chunked prefill off",
        found=f"--no-enable-chunked-prefill in T4SERVE_VLLM_ARGS, T4SERVE_MAX_NUM_BATCHED_TOKENS={batched_setting}, "
              f"max_model_len {max_model_len}",
        required=f"max_num_batched_tokens ({batched_setting}) is smaller than max_model_len ({max_model_len}). This "
                 "effectively limits the maximum sequence length to max_num_batched_tokens and makes vLLM reject "
                 "longer sequences. Please increase max_num_batched_tokens or decrease max_model_len. (vLLM's words)",
        fix=f"set T4SERVE_MAX_NUM_BATCHED_TOKENS={max_model_len} or more (or auto), lower T4SERVE_MAX_MODEL_LEN, or "
            "drop --no-enable-chunked-prefill from T4SERVE_VLLM_ARGS",
    )


@dataclass(frozen=True)
class _Shape:
    """What every step of `size` reads: the inputs, the text config, the KV flags and vLLM's batch defaults for the GPU,
    and the two functions of a max_model_len the steps share."""

    inputs: SizingInputs
    text: dict[str, object]
    flags: KVFlags
    defaults: BatchDefaults

    def batched_for(self, length: int) -> int:
        """The batched tokens for a max_model_len: the setting, else vLLM's default, which vLLM itself raises to
        max_model_len when chunked prefill is off (`_set_default_max_num_seqs_and_batched_tokens_args`)."""
        if self.inputs.max_num_batched_tokens is not None:
            return self.inputs.max_num_batched_tokens
        if self.flags.chunked_prefill:
            return self.defaults.max_num_batched_tokens
        return max(self.defaults.max_num_batched_tokens, length)

    def layout(self, length: int) -> kvcache.KVLayout:
        return kvcache.kv_layout(self.text, dtype_bytes=self.inputs.dtype_bytes, max_model_len=length,
                                 max_num_batched_tokens=self.batched_for(length),
                                 async_scheduling=self.flags.async_scheduling,
                                 block_size=self.flags.planned_block_size,
                                 hybrid_kv_cache_manager=self.flags.hybrid_kv_cache_manager,
                                 cache_dtype=self.inputs.kv_cache_dtype)

    def seqs_cap(self, batched: int) -> int:
        """vLLM refuses max_num_seqs above max_num_batched_tokens (SchedulerConfig.verify_max_model_len)."""
        return min(self.defaults.max_num_seqs, batched)


@dataclass(frozen=True)
class _Target:
    """The max_model_len to aim for before the pool is known, and what bounds it."""

    length: int
    # The model's maximum (or the set length, where VLLM_ALLOW_LONG_MAX_MODEL_LEN lets it past), and how it was read.
    model_max: int
    model_how: str
    # Without chunked prefill an auto length stops at the set batched tokens.
    capped_by_batched: bool


def _target(shape: _Shape, notes: list[str]) -> _Target:
    """The setting, else DEFAULT_MAX_MODEL_LEN within the model's maximum (and the set batched tokens when chunked
    prefill is off); a set length above the model's is vLLM's refusal, or a note where vLLM would accept it."""
    inputs = shape.inputs
    derived_max, derived_how = derived_max_model_len(shape.text)
    model_max = derived_max or VLLM_DEFAULT_MAX_LEN
    if inputs.max_model_len is not None:
        long_note = check_max_model_len_within_the_model(shape.text, inputs.max_model_len,
                                                         inputs.allow_long_max_model_len)
        if long_note is not None:
            notes.append(long_note)
            model_max = inputs.max_model_len
    target = inputs.max_model_len or min(DEFAULT_MAX_MODEL_LEN, model_max)
    capped = (inputs.max_model_len is None and not shape.flags.chunked_prefill
              and inputs.max_num_batched_tokens is not None and inputs.max_num_batched_tokens < target)
    if capped and inputs.max_num_batched_tokens is not None:
        # Without chunked prefill vLLM takes no request longer than the batched tokens: the auto length stops there.
        target = inputs.max_num_batched_tokens
    return _Target(target, model_max, derived_how, capped)


def _pool(shape: _Shape, max_num_seqs: int, batched: int) -> tuple[int, Derived]:
    """The KV pool: a set --kv-cache-memory-bytes as is (vLLM skips profiling), else predicted for these seqs and
    batched tokens; a ConfigError when nothing is left for it."""
    inputs = shape.inputs
    if inputs.kv_cache_memory_bytes is not None:
        pool = inputs.kv_cache_memory_bytes
        pool_d = Derived(pool, "B", "T4SERVE_KV_CACHE_MEMORY_BYTES (vLLM skips memory profiling)", "setting")
    else:
        pool, how = predict_pool(inputs, shape.text, max_num_seqs, batched)
        pool_d = Derived(pool, "B", how)
    if pool <= 0:
        raise ConfigError(
            "no GPU memory is left for the KV cache",
            found=f"predicted pool {pool / GIB:.2f} GiB: {pool_d.how}",
            required="weights + activations below total x T4SERVE_GPU_MEMORY_UTILIZATION",
            fix="use a smaller or quantized checkpoint (for Gemma 4 E2B: T4SERVE_MODEL=qat), raise "
                "T4SERVE_GPU_MEMORY_UTILIZATION, or a larger GPU"
                + ("; the weights are held in float32 here, twice their 16 bits (the plan's dtype line says why)"
                   if inputs.dtype_bytes == 4 else ""),
        )
    return pool, pool_d


def _max_model_len(shape: _Shape, target: _Target, pool: int) -> Derived:
    """The setting, checked against the pool and the batched tokens; else the target cut to the largest length one
    request fits in the pool."""
    inputs = shape.inputs
    if inputs.max_model_len is not None:
        check_batched_covers_max_model_len(shape.flags, inputs.max_num_batched_tokens, inputs.max_model_len)
        if not kvcache.fits(shape.layout(inputs.max_model_len), pool):
            fit = kvcache.fit_max_model_len(shape.layout, pool, target.model_max)
            raise ConfigError(
                "T4SERVE_MAX_MODEL_LEN does not fit the KV cache pool",
                found=f"{inputs.max_model_len:,} tokens need "
                      f"{kvcache.min_pool_bytes(shape.layout(inputs.max_model_len)):,} B; the pool is {pool:,} B",
                required=f"at most {fit:,} tokens for this pool",
                fix=f"set T4SERVE_MAX_MODEL_LEN={fit} or lower, or use the QAT checkpoint",
            )
        return Derived(inputs.max_model_len, "tokens", "T4SERVE_MAX_MODEL_LEN", "setting")
    fit = kvcache.fit_max_model_len(shape.layout, pool, target.length)
    if fit == 0:
        raise ConfigError(
            "the KV cache pool cannot hold even one token",
            found=f"pool {pool:,} B", required=f"at least {shape.layout(1).bytes_per_block * 2:,} B",
            fix="use the QAT checkpoint or raise T4SERVE_GPU_MEMORY_UTILIZATION",
        )
    check_batched_covers_max_model_len(shape.flags, inputs.max_num_batched_tokens, fit)
    batched_cap = (f", T4SERVE_MAX_NUM_BATCHED_TOKENS {target.length:,} (chunked prefill off)"
                   if target.capped_by_batched else "")
    return Derived(fit, "tokens", f"min({DEFAULT_MAX_MODEL_LEN} as published, the model's {target.model_max:,} "
                                  f"({target.model_how}){batched_cap}, largest one request fits in the pool) = {fit:,}")


def _batched_tokens(shape: _Shape, batched: int, length: int) -> Derived:
    """The batched tokens with their reason: the setting, vLLM's default, or max_model_len (chunked prefill off)."""
    defaults = shape.defaults
    if shape.inputs.max_num_batched_tokens is not None:
        return Derived(batched, "tokens", "T4SERVE_MAX_NUM_BATCHED_TOKENS", "setting")
    if batched != defaults.max_num_batched_tokens:
        return Derived(batched, "tokens", f"max({defaults.max_num_batched_tokens} vLLM's default for "
                                          f"{defaults.tier}, max_model_len {length:,}): with chunked prefill off vLLM "
                                          "batches a whole request per step")
    return Derived(batched, "tokens", f"vLLM's default for `vllm serve` on {defaults.tier} "
                                      "(EngineArgs.get_batch_defaults); passed explicitly so vLLM batches what the KV "
                                      "groups and activations were sized for")


def _max_num_seqs(shape: _Shape, lay: kvcache.KVLayout, pool: int, pool_d: Derived, guess: int,
                  batched: int) -> tuple[Derived, int, Derived]:
    """The setting, else as many max-length requests as the pool holds at once (no preemption), capped at vLLM's
    default and the batched tokens. The sampler's share of the activation peak grows with max_num_seqs, so a predicted
    pool is predicted again for the choice until it is stable. Returns (max_num_seqs, the pool, its derivation)."""
    inputs = shape.inputs
    if inputs.max_num_seqs is not None:
        return Derived(inputs.max_num_seqs, "seqs", "T4SERVE_MAX_NUM_SEQS", "setting"), pool, pool_d
    seqs_cap = shape.seqs_cap(batched)
    seqs_cap_how = (f"vLLM's default {shape.defaults.max_num_seqs} for {shape.defaults.tier}"
                    if seqs_cap == shape.defaults.max_num_seqs
                    else f"max_num_batched_tokens {batched} (vLLM requires max_num_seqs <= it)")
    chosen = guess
    for _ in range(8):
        blocks = kvcache.capacity(lay, pool).num_blocks
        held = blocks // lay.blocks_per_request
        previous, chosen = chosen, max(1, min(seqs_cap, held))
        if inputs.kv_cache_memory_bytes is not None or chosen == previous:
            break
        pool, how = predict_pool(inputs, shape.text, chosen, batched)
        pool_d = Derived(pool, "B", how)
    length = lay.max_model_len
    seqs = Derived(chosen, "seqs", f"floor({blocks:,} blocks / {lay.blocks_per_request:,} per {length:,}-token "
                                   f"request) = {held}, capped at {seqs_cap_how}: every admitted request can reach "
                                   "max_model_len without preemption")
    return seqs, pool, pool_d


def _kv_cache_memory_bytes(shape: _Shape, lay: kvcache.KVLayout, pool: int, pool_d: Derived,
                           notes: list[str]) -> tuple[Derived | None, int, Derived]:
    """What --kv-cache-memory-bytes gets: the setting; none for `profile` (vLLM measures); else the predicted pool in
    whole blocks, so tokens and concurrency are exactly these. Returns (it, the pool, its derivation)."""
    if shape.inputs.kv_cache_memory_bytes is not None:
        return pool_d, pool, pool_d
    if shape.inputs.kv_profile:
        notes.append(
            "T4SERVE_KV_CACHE_MEMORY_BYTES=profile: vLLM measures the KV pool at start, so the KV figures here are "
            "predictions to compare with its log; on a card of a T4's size the measuring run can reach the card's "
            "limit and come out too large (vLLM 0.33.0 on the GPU host at 15 GiB: a 3.20 GiB pool against this "
            "plan's 2.81, 8 MB of the card left free; with memory to spare it measured 2.91 to 2.95 GiB). vLLM 0.34 "
            "turns its extensible KV cache on here (no --kv-cache-memory-bytes): it sizes the pool from the memory "
            "left within T4SERVE_GPU_MEMORY_UTILIZATION after CUDA graph capture, not from the profile run (not yet "
            "run on a GPU)"
        )
        measured = "; a prediction only: vLLM profiles and sizes the pool itself"
        return None, pool, Derived(pool, "B", pool_d.how + measured)
    whole = pool // lay.bytes_per_block * lay.bytes_per_block
    kv_bytes = Derived(whole, "B", f"predicted pool rounded down to whole {lay.bytes_per_block:,}-B blocks: vLLM "
                                   "skips profiling and logs exactly the tokens below")
    rounded = f"; rounded down to {whole // lay.bytes_per_block:,} blocks"
    return kv_bytes, whole, Derived(whole, "B", pool_d.how + rounded)


def _host_and_model_notes(inputs: SizingInputs, host: hostmem.HostMemory) -> list[str]:
    """What the plan adds about loading on this host and about how the model's facts were read."""
    model = inputs.model
    notes = list(host.notes)
    if inputs.host is not None and host.swap_to_add_bytes.value > 0:
        notes.append(f"loading needs {host.need_bytes.format_value()}; vLLM has no lower-memory load path than its "
                     f"default (eager loading would need {host.eager_need_bytes.format_value()})")
    if model.source == "builtin":
        notes.append(f"model facts are built in: {model.config.get('provenance')}")
    return notes + config_reading_notes(model)


def size(inputs: SizingInputs) -> Sizing:
    """The figures of one server, step by step: the length to aim for, the batched tokens, the KV pool, max_model_len
    within it, max_num_seqs, the --kv-cache-memory-bytes to pass, then capacity, host memory and the decode
    ceiling."""
    model = inputs.model
    flags = inputs.kv_flags
    shape = _Shape(inputs, text_config(model), flags,
                   vllm_batch_defaults(inputs.gpu_memory_bytes, inputs.gpu_name, inputs.compute_capability))
    notes: list[str] = []
    target = _target(shape, notes)
    batched = shape.batched_for(target.length)
    check_seqs_within_batched(inputs.max_num_seqs, batched)
    # The activation term of the pool depends on max_num_seqs: predict with the setting (or vLLM's default) first.
    seqs_guess = inputs.max_num_seqs or shape.seqs_cap(batched)
    pool, pool_d = _pool(shape, seqs_guess, batched)
    max_len = _max_model_len(shape, target, pool)
    length = int(max_len.value)
    lay = shape.layout(length)
    if shape.batched_for(length) != batched:
        # Chunked prefill off: vLLM batches a whole max_model_len per step; the activations are sized for it.
        batched = shape.batched_for(length)
        if inputs.kv_cache_memory_bytes is None:
            pool, how = predict_pool(inputs, shape.text, inputs.max_num_seqs or shape.seqs_cap(batched), batched)
            pool_d = Derived(pool, "B", how)
    batched_d = _batched_tokens(shape, batched, length)
    notes += [f"T4SERVE_VLLM_ARGS: {word} (in the KV figures)" for word in flags.describe()]
    seqs, pool, pool_d = _max_num_seqs(shape, lay, pool, pool_d, seqs_guess, batched)
    kv_bytes, pool, pool_d = _kv_cache_memory_bytes(shape, lay, pool, pool_d, notes)
    cap = kvcache.capacity(lay, pool)
    if cap.concurrency < float(seqs.value):
        notes.append(f"the pool holds {cap.concurrency:.2f} max-length requests but max_num_seqs is {int(seqs.value)}:"
                     " long requests will be preempted")
    spec = inputs.speculation
    if spec is not None:
        notes.append(f"speculative decoding {spec.describe()}; the drafter reads the model's KV cache and owns none, "
                     "so the KV figures are the model's own (vLLM 0.34's Gemma 4 speculator)"
                     if spec.drafter is not None else f"speculative decoding {spec.describe()}: no draft model, so "
                     "the KV figures and memory are the model's own")
    host = hostmem.estimate(model, inputs.host, spec.drafter if spec is not None else None)
    ceiling = roofline(model, context=length, dtype_bytes=inputs.dtype_bytes,
                       bandwidth_bytes_per_s=inputs.bandwidth_bytes_per_s).ceiling_tokens_per_s
    notes += _host_and_model_notes(inputs, host)
    weights, weights_how = weights_in_gpu(model, inputs.dtype_bytes)
    buffers, buffers_how = buffers_in_gpu(shape.text, batched, inputs.dtype_bytes)
    drafter = drafter_in_gpu(inputs, shape.text, batched)
    loaded = weights + buffers + (drafter.loaded if drafter is not None else 0)
    drafter_how = (f" + the drafter's weights and rotary caches {drafter.loaded / GIB:.4f} GiB (vLLM loads it in the "
                   "same step)" if drafter is not None else "")
    return Sizing(
        max_model_len=max_len,
        max_num_batched_tokens=batched_d,
        gpu_weights_bytes=Derived(loaded, "B", f"weights ({weights_how}) + buffers ({buffers_how}){drafter_how}"),
        max_num_seqs=seqs,
        kv_cache_memory_bytes=kv_bytes,
        kv_pool_bytes=pool_d,
        kv_tokens=Derived(cap.tokens, "tokens",
                          f"int({cap.concurrency:.4f} x {length:,}) (vLLM's get_kv_cache_capacity)"),
        concurrency=Derived(round(cap.concurrency, 2), "x", f"{cap.num_blocks:,} blocks / {lay.describe()}"),
        host_memory_need_bytes=host.need_bytes,
        swap_to_add_bytes=host.swap_to_add_bytes,
        decode_ceiling_tokens_per_s=ceiling,
        notes=notes,
        block_size=flags.planned_block_size,
    )
