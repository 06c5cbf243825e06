"""Settings + Facts -> Plan: the exact `vllm serve` argv and the numbers behind each choice. Pure: reads nothing.

`plan(settings, facts)` never touches the machine or the environment; the same inputs give the same Plan, so a
recorded machine (`t4serve probe --json`) replays exactly. Every derived number is a `Derived` carrying its
arithmetic; `Plan.summary()` and `Plan.to_json()` show it. Whether the machine can run the plan is preflight's job.
"""

from __future__ import annotations

import json
import math
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from t4serve import apiguard
from t4serve.config.compilation import ladder_for
from t4serve.config.kvflags import PLAN_BLOCK_SIZE, kv_flags
from t4serve.config.settings import KV_PROFILE, Settings
from t4serve.errors import ConfigError, T4ServeError
from t4serve.facts import Facts, GpuDevice, ModelFacts, vllm_env_true
from t4serve.gpus import (
    BF16_MIN_CAPABILITY,
    KNOWN_GPU_UUID_PREFIX,
    KnownGpu,
    format_capability,
    known_gpu,
    match_known_gpu,
    sized_as_device,
)
from t4serve.patch.clamp import (
    MIN_CLAMPED_HEAD,
    SHARED_MEMORY_ENV,
    UNCLAMPED_TILE,
    padded_head_size,
    tile_shared_memory,
)
from t4serve.planning import kernelfit, kvcache, vllmchecks
from t4serve.planning.attention import AttentionChoice, choose_attention
from t4serve.planning.derived import Derived, format_bytes
from t4serve.planning.sizing import Sizing, SizingInputs, size, text_config
from t4serve.planning.speculative import Speculation, speculation
from t4serve.serde import to_dict
from t4serve.units import GIB

DTYPE_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4}


@dataclass(frozen=True)
class Plan:
    """What `serve` will run and why. `argv` is complete: `vllm serve MODEL ...`, user flags last."""

    # What `vllm serve` gets: the local checkpoint directory when found, else the repo id it downloads.
    model: str
    model_source: str
    served_model_name: str
    host: str
    port: int
    dtype: str
    dtype_reason: str
    # vLLM's --kv-cache-dtype (T4SERVE_KV_CACHE_DTYPE mapped by planning.vllmchecks) and what it stores.
    kv_cache_dtype: str
    kv_cache_dtype_reason: str
    # The device planned for (devices[0]: t4serve serves one GPU), None when no GPU is visible. With T4SERVE_SIZE_AS
    # it is that card as the known table has it (memory, capability, shared memory) on the real device's identity.
    gpu: GpuDevice | None
    # "probed" (this machine or a recorded one) or "known:<key>" (`plan --gpu`).
    gpu_origin: str
    argv: tuple[str, ...]
    # Extra environment for the vLLM process. Never a secret: `serve` adds HF_TOKEN to the child's environment itself.
    env: dict[str, str]
    sizing: Sizing | None
    # Why sizing could not run (no GPU, model facts missing, or sizing's own error), else None.
    sizing_error: str | None
    clamp_needed: bool
    clamp_reason: str
    # T4SERVE_ATTENTION resolved (t4serve.planning.attention): the path vLLM runs (None: vLLM's own choice of backend),
    # the `--attention-backend` t4serve passes (None: none) and why.
    attention: AttentionChoice
    # What `--gpu-memory-utilization` gets: the setting, scaled by T4SERVE_SIZE_AS to the named card's budget.
    gpu_memory_utilization: float
    # The known GPU's key under T4SERVE_SIZE_AS, else None.
    sized_as: str | None
    # T4SERVE_COMPILE in words: the rung the first start uses and what happens after a compile out-of-memory.
    compile_summary: str
    # T4SERVE_SPECULATIVE in words: off, or the method, the drafter and how it was chosen, the tokens per step.
    speculative: str
    # Where the GPU telemetry program serves /metrics (T4SERVE_TELEMETRY_HOST, _PORT); port 0: no telemetry program.
    telemetry_host: str
    telemetry_port: int
    notes: tuple[str, ...]

    def command_line(self) -> str:
        return shlex.join(self.argv)

    def telemetry_summary(self) -> str:
        if not self.telemetry_port:
            return "off (T4SERVE_TELEMETRY_PORT=0)"
        return f"/metrics on {self.telemetry_host}:{self.telemetry_port}"

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = to_dict(self)
        data["command_line"] = self.command_line()
        return data

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2) + "\n"

    def answer(self) -> str:
        """The plan in one line: whether the model fits the card, its request length and streams, and the swap the
        host must add to load it (`t4serve plan` prints it first)."""
        reason = (self.sizing_error or "sizing did not run").splitlines()[0]
        if self.gpu is None:
            return f"no answer: {reason}"
        card = f"{self.gpu.name} ({format_bytes(self.gpu.memory_total_bytes)})"
        if self.sizing is None:
            return f"cannot plan for a {card}: {reason}"
        sizing = self.sizing
        # Sizing rounds the swap to add up to whole GiB, as scripts/setup-swap takes it.
        swap_gib = -(-int(sizing.swap_to_add_bytes.value) // GIB)
        load = (
            f"loading needs {swap_gib} GiB more swap on this host (sudo scripts/setup-swap {swap_gib}G)"
            if swap_gib > 0
            else "loading fits this host's RAM + swap"
        )
        return (
            f"fits a {card}: {int(sizing.max_model_len.value):,}-token requests, {int(sizing.max_num_seqs.value)} at "
            f"once ({int(sizing.kv_tokens.value):,} KV tokens); {load}"
        )

    def summary(self) -> str:
        lines = [f"command: {self.command_line()}", ""]
        gpu = (
            f"{self.gpu.name}, capability {format_capability(self.gpu.compute_capability)}, "
            f"{format_bytes(self.gpu.memory_total_bytes)} ({self.gpu_origin})"
            if self.gpu
            else "none visible"
        )
        lines += [
            f"model:             {self.model} ({self.model_source})",
            f"served as:         {self.served_model_name} on {self.host}:{self.port}",
            f"telemetry:         {self.telemetry_summary()}",
            f"gpu:               {gpu}",
            f"dtype:             {self.dtype}  ({self.dtype_reason})",
            f"kv cache dtype:    {self.kv_cache_dtype}  ({self.kv_cache_dtype_reason})",
            f"turing clamp:      {'needed' if self.clamp_needed else 'not needed'}  ({self.clamp_reason})",
            f"attention:         {self.attention.label}  ({self.attention.reason})",
            f"compile:           {self.compile_summary}",
            f"speculative:       {self.speculative}",
        ]
        if self.sizing is not None:
            lines += ["", "sizing:"]
            for name, value in _sizing_items(self.sizing):
                lines.append(f"  {name:<28} {value}")
            lines += [f"  note: {n}" for n in self.sizing.notes]
        else:
            lines += ["", f"sizing: not computed: {self.sizing_error}"]
        if self.env:
            lines += ["", "environment for vLLM: " + " ".join(f"{k}={v}" for k, v in sorted(self.env.items()))]
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)


def _sizing_items(sizing: Sizing) -> list[tuple[str, Derived]]:
    items = []
    for name in (
        "max_model_len",
        "max_num_batched_tokens",
        "gpu_weights_bytes",
        "max_num_seqs",
        "kv_cache_memory_bytes",
        "kv_pool_bytes",
        "kv_tokens",
        "concurrency",
        "host_memory_need_bytes",
        "swap_to_add_bytes",
        "decode_ceiling_tokens_per_s",
    ):
        value = getattr(sizing, name, None)
        if isinstance(value, Derived):
            items.append((name, value))
    return items


def head_sizes(model: ModelFacts | None) -> list[int]:
    """The attention head sizes of the model's layers (Gemma 4: 256 on sliding layers, 512 on full ones)."""
    if model is None:
        return []
    text = model.config.get("text")
    return kvcache.head_sizes(text) if isinstance(text, dict) else []


def clamp_decision(gpu: GpuDevice | None, model: ModelFacts | None) -> tuple[bool, str]:
    """Whether vLLM's Triton attention needs the Turing clamp here, and why (same rule as t4serve.patch.clamp)."""
    if gpu is None:
        return False, "no GPU to plan for"
    heads = head_sizes(model)
    if not heads:
        # Unknown heads: judge by Gemma 4's widest (512), so a device that would need the clamp is not waved through.
        heads = [MIN_CLAMPED_HEAD]
        unknown = " (model head sizes unknown; assumed 512 as in Gemma 4)"
    else:
        unknown = ""
    padded = padded_head_size(max(heads))
    need = tile_shared_memory(padded, UNCLAMPED_TILE)
    have = gpu.shared_memory_per_block
    if padded < MIN_CLAMPED_HEAD:
        return False, f"widest head {max(heads)} pads to {padded} < {MIN_CLAMPED_HEAD}{unknown}"
    if have >= need:
        return False, f"tile {UNCLAMPED_TILE} at head {padded} needs {need:,} B <= {have:,} B per block{unknown}"
    return True, (
        f"tile {UNCLAMPED_TILE} at head {padded} needs 2 x {padded} x (2 x {UNCLAMPED_TILE} + 2 x 16) = {need:,} B "
        f"of shared memory per block; capability {format_capability(gpu.compute_capability)} allows {have:,} B{unknown}"
    )


# vLLM 0.33 `_FLOAT16_NOT_SUPPORTED_MODELS` (vllm/config/model.py): model types it refuses to run in float16, and why.
FLOAT16_UNSUPPORTED: dict[str, str] = {
    "gemma2": "Numerical instability. Please use bfloat16 or float32 instead.",
    "gemma3": "Numerical instability. Please use bfloat16 or float32 instead.",
    "gemma3_text": "Numerical instability. Please use bfloat16 or float32 instead.",
    "glm4": "Numerical instability. Please use bfloat16 or float32 instead.",
}
# safetensors dtypes of floating-point weights -> vLLM's dtype names (vLLM reads them when config.json names none).
_FLOAT_TENSOR_DTYPES = {"BF16": "bfloat16", "F16": "float16", "F32": "float32"}


def model_type(model: ModelFacts | None) -> str:
    """The top-level config.json `model_type`, which vLLM's dtype rules key on ("gemma3" for the multimodal Gemma 3,
    "gemma3_text" for the text-only one)."""
    value = model.config.get("model_type") if model is not None else None
    return value if isinstance(value, str) else ""


def float16_refusal(model: ModelFacts | None) -> str | None:
    """vLLM's own error for this model in float16 (`_check_valid_dtype`), or None where float16 is allowed."""
    kind = model_type(model)
    if kind not in FLOAT16_UNSUPPORTED:
        return None
    return f"The model type {kind!r} does not support float16. Reason: {FLOAT16_UNSUPPORTED[kind]}"


def choose_dtype(settings: Settings, gpu: GpuDevice | None, model: ModelFacts | None) -> tuple[str, str]:
    """The dtype to pass as --dtype and the reason; an explicit setting is kept even where preflight will refuse it.

    `auto` is vLLM's own `_resolve_auto_dtype`, so the plan passes what vLLM would pick: the platform's dtypes
    (bfloat16, float16, float32 from capability 8.0; float16, float32 below) less float16 for the model types vLLM
    refuses it for; the checkpoint's dtype when among them (a float32 checkpoint takes the first), else the first.
    """
    if settings.dtype != "auto":
        return settings.dtype, "set by T4SERVE_DTYPE"
    if gpu is None:
        return "auto", "no GPU to plan for: vLLM picks from the checkpoint"
    supported = ["bfloat16", "float16", "float32"] if gpu.compute_capability >= BF16_MIN_CAPABILITY else [
        "float16", "float32"]
    refusal = float16_refusal(model)
    if refusal is not None:
        supported.remove("float16")
    preferred = supported[0]
    checkpoint = _checkpoint_dtype(model)
    cap = format_capability(gpu.compute_capability)
    if checkpoint == "float32" or checkpoint is None:
        source = "a float32 checkpoint" if checkpoint == "float32" else "a checkpoint naming no dtype (float32)"
        return preferred, f"auto: {source} runs in {preferred}, vLLM's first dtype on capability {cap}"
    if checkpoint in supported:
        return checkpoint, f"auto: the checkpoint's dtype (config.json), capability {cap}"
    if gpu.compute_capability < BF16_MIN_CAPABILITY and refusal is None:
        return "float16", (f"auto: capability {cap} < {format_capability(BF16_MIN_CAPABILITY)} has no bfloat16 "
                           "datapath (Turing), so float16")
    if refusal is not None and preferred == "float32":
        return "float32", (
            f"auto: capability {cap} has no bfloat16 and vLLM refuses float16 here ({refusal}), so float32, as vLLM's "
            "own auto picks: weights and KV cache take twice the memory of 16 bits"
        )
    return preferred, f"auto: the checkpoint's {checkpoint} is not among capability {cap}'s dtypes; vLLM falls back"


def _checkpoint_dtype(model: ModelFacts | None) -> str | None:
    """vLLM's `get_torch_dtype`: config.json's dtype (top level, then the text config), else the weights' floating
    dtype, else None (vLLM then assumes float32)."""
    if model is None:
        return None
    for config in (model.config, model.config.get("text")):
        if isinstance(config, dict):
            for key in ("dtype", "torch_dtype"):
                value = config.get(key)
                if isinstance(value, str):
                    return value.removeprefix("torch.")
    floats = {_FLOAT_TENSOR_DTYPES[d] for g in model.weights for d in g.bytes_by_dtype if d in _FLOAT_TENSOR_DTYPES}
    if len(floats) == 1:
        return floats.pop()
    if floats:
        # `common_broadcastable_dtype`: torch promotes any two of bfloat16, float16 and float32 to float32.
        return "float32"
    return None


def refuse_unreadable_model(settings: Settings, model: ModelFacts | None) -> None:
    """A ConfigError (exit 2) for a checkpoint the probe could not read (a config number out of range or of the wrong
    type, a broken header): `plan`, `profiles`, `preflight` and `serve` refuse it alike, as `roofline` does."""
    if model is not None and model.source == "invalid":
        raise ConfigError(
            f"cannot read the checkpoint {settings.model.requested}",
            found=model.error or "the probe could not read it",
            required="config.json and readable safetensors headers",
            fix="re-download the checkpoint, or point T4SERVE_MODEL at a complete checkpoint directory",
        )


def scaled_utilization(utilization: float, card_bytes: int, real_bytes: int) -> float:
    """The `--gpu-memory-utilization` that gives vLLM on `real_bytes` the budget `utilization` gives on `card_bytes`:
    rounded down at 6 decimals, so vLLM's budget never exceeds the card's."""
    return math.floor(utilization * card_bytes / real_bytes * 1e6) / 1e6


@dataclass(frozen=True)
class _Card:
    """The GPU planned for: the device (the real one, or it as the T4SERVE_SIZE_AS card), the known card it is sized
    as, the --gpu-memory-utilization that gives vLLM that card's budget, vLLM's extra environment and the notes."""

    gpu: GpuDevice | None
    sized_as: KnownGpu | None
    utilization: float
    env: dict[str, str]
    notes: list[str]


def _card(settings: Settings, facts: Facts) -> _Card:
    """Device 0 of the facts, sized as T4SERVE_SIZE_AS's card where it is set (never a card larger than it)."""
    real = facts.gpu.devices[0] if facts.gpu.devices else None
    card = known_gpu(settings.size_as) if settings.size_as else None
    if real is None or card is None:
        gpu, utilization, env, notes = real, settings.gpu_memory_utilization, {}, []
    else:
        if card.memory_bytes > real.memory_total_bytes:
            # Sizing as a bigger card would ask vLLM for more than this one holds (--gpu-memory-utilization above 1).
            raise ConfigError(
                f"T4SERVE_SIZE_AS={card.key}: {card.name} is larger than the card present",
                found=f"{card.name} ({format_bytes(card.memory_bytes)}) on {real.name} "
                f"({format_bytes(real.memory_total_bytes)})",
                required="a known card no larger than the one present: T4SERVE_SIZE_AS shrinks a card, it cannot "
                "grow one",
                fix="unset T4SERVE_SIZE_AS, or name a card no larger than this one (e.g. t4)",
            )
        gpu = sized_as_device(real, card)
        utilization = scaled_utilization(settings.gpu_memory_utilization, card.memory_bytes, real.memory_total_bytes)
        env = {SHARED_MEMORY_ENV: str(card.shared_memory_per_block)}
        notes = [
            f"T4SERVE_SIZE_AS={card.key}: sized as {card.name} ({format_bytes(card.memory_bytes)}, capability "
            f"{format_capability(card.compute_capability)}) on {real.name} ({format_bytes(real.memory_total_bytes)}):"
            f" --gpu-memory-utilization {settings.gpu_memory_utilization} x {card.memory_bytes:,} / "
            f"{real.memory_total_bytes:,} = {utilization}; the clamp assumes {card.shared_memory_per_block:,} B of "
            f"shared memory per block ({SHARED_MEMORY_ENV})"
        ]
    if gpu is not None and len(facts.gpu.devices) > 1:
        notes.append(f"{len(facts.gpu.devices)} GPUs visible; t4serve serves one (device 0: {gpu.name})")
    return _Card(gpu, card, utilization, env, notes)


def _sized_flags(settings: Settings, sizing: Sizing | None) -> list[str]:
    """The flags the sizing decides (the settings' values where sizing could not run)."""
    max_model_len = int(sizing.max_model_len.value) if sizing else settings.max_model_len
    max_num_seqs = int(sizing.max_num_seqs.value) if sizing else settings.max_num_seqs
    batched = int(sizing.max_num_batched_tokens.value) if sizing else settings.max_num_batched_tokens
    kv_bytes = kv_size if isinstance(kv_size := settings.kv_cache_memory_bytes, int) else None
    if sizing is not None:
        kv_bytes = int(sizing.kv_cache_memory_bytes.value) if sizing.kv_cache_memory_bytes is not None else None
    argv: list[str] = []
    if max_model_len is not None:
        argv += ["--max-model-len", str(max_model_len)]
    if max_num_seqs is not None:
        argv += ["--max-num-seqs", str(max_num_seqs)]
    if batched is not None:
        argv += ["--max-num-batched-tokens", str(batched)]
    if kv_bytes is not None:
        argv += ["--kv-cache-memory-bytes", str(kv_bytes)]
    return argv


def plan(settings: Settings, facts: Facts) -> Plan:
    """The Plan for these settings on this (probed, recorded or known) machine: the card, the dtype, the clamp, the
    sizing, then the `vllm serve` command line and the environment vLLM runs in."""
    card = _card(settings, facts)
    gpu, model = card.gpu, facts.model
    dtype, dtype_reason = choose_dtype(settings, gpu, model)
    clamp_needed, clamp_reason = clamp_decision(gpu, model)
    try:
        attention = choose_attention(settings.attention, gpu.compute_capability if gpu is not None else None, dtype,
                                     settings.kv_cache_dtype, head_sizes(model))
        attention_error = None
    except ConfigError as exc:
        # A named path that cannot run here: no plan to serve, the refusal where sizing's would be.
        attention, attention_error = AttentionChoice(None, None, exc.what), exc.message()
    try:
        spec, spec_error = speculation(settings, facts), None
    except ConfigError as exc:
        # A model without a drafter, or a drafter that cannot draft for it: refused where sizing's refusal would be.
        spec, spec_error = None, exc.message()
    refused = attention_error or spec_error
    sizing, sizing_error = (None, refused) if refused else _size(settings, facts, gpu, dtype, card.sized_as,
                                                                 attention, spec)
    model_arg = model.local_path if model is not None and model.local_path else settings.model.target

    argv: list[str] = ["vllm", "serve", model_arg]
    argv += ["--host", settings.host, "--port", str(settings.port)]
    argv += ["--served-model-name", settings.served_model_name]
    argv += ["--dtype", dtype]
    # The KV figures are sized for this cache dtype, and t4serve serves a single GPU.
    argv += ["--kv-cache-dtype", vllmchecks.VLLM_KV_CACHE_DTYPES[settings.kv_cache_dtype]]
    argv += ["--tensor-parallel-size", "1"]
    argv += ["--gpu-memory-utilization", _float(card.utilization)]
    argv += _sized_flags(settings, sizing)
    argv += ["--shutdown-timeout", str(settings.shutdown_timeout)]
    # The API key on every route but health, metrics and the version: vLLM's own guard covers /v1 and a few other
    # prefixes only (t4serve.apiguard says which routes it leaves open). A no-op while no key is set.
    argv += ["--middleware", apiguard.MIDDLEWARE]
    if kv_flags(settings.vllm_args).block_size is None:
        # Pinned, so the KV figures hold whichever attention backend vLLM picks: at 16 tokens every backend vLLM 0.33
        # accepts on these GPUs lays the cache out alike (tests/image/test_kv_oracle_families.py), where FlashAttention
        # 4 would pick 128 for 256-wide heads on capability 10.x.
        argv += ["--block-size", str(sizing.block_size if sizing else PLAN_BLOCK_SIZE)]
    if attention.backend is not None:
        argv += ["--attention-backend", attention.backend]
    if spec is not None:
        argv += spec.argv()
    argv += list(settings.vllm_args)

    env = {
        "HF_HOME": settings.hf_home,
        "HF_HUB_OFFLINE": "1" if settings.hf_hub_offline else "0",
        # vLLM's own logger follows t4serve's level, so one variable quiets or opens both.
        "VLLM_LOGGING_LEVEL": settings.log_level.upper(),
        **card.env,
    }
    if attention.path is not None:
        # What t4serve's vLLM plugin reads in every vLLM process (t4serve.turing.plugin): the resolved path, never
        # `auto`.
        env["T4SERVE_ATTENTION"] = attention.path
    return Plan(
        model=model_arg,
        model_source=model.source if model is not None else "not probed",
        served_model_name=settings.served_model_name,
        host=settings.host,
        port=settings.port,
        dtype=dtype,
        dtype_reason=dtype_reason,
        kv_cache_dtype=vllmchecks.VLLM_KV_CACHE_DTYPES[settings.kv_cache_dtype],
        kv_cache_dtype_reason=vllmchecks.kv_cache_dtype_reason(settings.kv_cache_dtype),
        gpu=gpu,
        gpu_origin=gpu.uuid if gpu is not None and gpu.uuid.startswith(KNOWN_GPU_UUID_PREFIX) else "probed",
        argv=tuple(argv),
        env=env,
        sizing=sizing,
        sizing_error=sizing_error,
        clamp_needed=clamp_needed,
        clamp_reason=clamp_reason,
        attention=attention,
        gpu_memory_utilization=card.utilization,
        sized_as=card.sized_as.key if card.sized_as is not None else None,
        compile_summary=compile_summary(settings),
        speculative=spec.describe() if spec is not None else settings.speculative,
        telemetry_host=settings.telemetry_host,
        telemetry_port=settings.telemetry_port,
        notes=tuple(card.notes),
    )


def compile_summary(settings: Settings) -> str:
    ladder = ladder_for(settings.compile, settings.vllm_args)
    if not ladder:
        return "as T4SERVE_VLLM_ARGS sets it (t4serve adds no compile flags)"
    first = ladder[0]
    text = f"{first.name}: {first.what}"
    if len(ladder) > 1:
        text += (f"; after an out-of-memory inside a cold torch.compile: {', then '.join(r.name for r in ladder[1:])}"
                 " (T4SERVE_COMPILE=auto; what worked is remembered in T4SERVE_CACHE_DIR)")
    return text


def _float(value: float) -> str:
    return repr(float(value))


def _size(
    settings: Settings, facts: Facts, gpu: GpuDevice | None, dtype: str, card: KnownGpu | None,
    attention: AttentionChoice, spec: Speculation | None,
) -> tuple[Sizing | None, str | None]:
    if gpu is None:
        return None, "no GPU visible (plan for a known card with --gpu t4)"
    model = facts.model
    if model is None:
        return None, "no model facts (the model probe did not run)"
    if model.source == "invalid":
        return None, f"the model could not be read: {model.error}"
    known = card or match_known_gpu(gpu.name)
    # What vLLM's platform reports as the device name: the card's own under T4SERVE_SIZE_AS (its batch defaults).
    gpu_name = card.name if card is not None else gpu.name
    try:
        # The int4 layout's layers, where int4 is asked for or may be offered in place of fp8 (on Turing its kernel
        # may not fit: t4serve.planning.kernelfit).
        int4_specs = (kvcache.kv_cache_specs(text_config(model), DTYPE_BYTES.get(dtype, 2),
                                             cache_dtype="int4_per_token_head")
                      if settings.kv_cache_dtype in ("int4", "fp8") and gpu.compute_capability == kernelfit.TURING
                      else [])
        # vLLM refuses these before it plans: the plan refuses them first, in vLLM's words.
        vllmchecks.check_kv_cache_dtype(settings.kv_cache_dtype, gpu_name, gpu.compute_capability,
                                         int4_runs=kernelfit.int4_fits(int4_specs, gpu.compute_capability))
        vllmchecks.check_quantization(model, dtype, gpu_name, gpu.compute_capability)
        # vLLM plans a cache whose attention kernel the card cannot launch: the plan refuses it first.
        kernelfit.check_kv_kernel_fits(int4_specs, vllmchecks.VLLM_KV_CACHE_DTYPES[settings.kv_cache_dtype],
                                       gpu_name, gpu.compute_capability)
    except T4ServeError as exc:
        return None, exc.message()
    inputs = SizingInputs(
        gpu_memory_bytes=gpu.memory_total_bytes,
        gpu_memory_utilization=settings.gpu_memory_utilization,
        compute_capability=gpu.compute_capability,
        bandwidth_bytes_per_s=known.bandwidth if known else None,
        model=model,
        # "auto" on 8.0+ resolves to the checkpoint's 16-bit dtype in vLLM for Gemma 4.
        dtype_bytes=DTYPE_BYTES.get(dtype, 2),
        max_model_len=settings.max_model_len,
        max_num_seqs=settings.max_num_seqs,
        kv_cache_memory_bytes=kv_size if isinstance(kv_size := settings.kv_cache_memory_bytes, int) else None,
        host=facts.host,
        kv_profile=settings.kv_cache_memory_bytes == KV_PROFILE,
        max_num_batched_tokens=settings.max_num_batched_tokens,
        kv_flags=kv_flags(settings.vllm_args),
        allow_long_max_model_len=vllm_env_true(facts.vllm_env.get("VLLM_ALLOW_LONG_MAX_MODEL_LEN")),
        gpu_name=gpu_name,
        kv_cache_dtype=vllmchecks.VLLM_KV_CACHE_DTYPES[settings.kv_cache_dtype],
        speculation=spec,
    )
    try:
        return size(inputs), None
    except T4ServeError as exc:
        return None, exc.message()


def sized_settings(plan: Plan) -> dict[str, str]:
    """The settings that give another checkpoint's plan this plan's sized flags: max_model_len, max_num_seqs, the
    batched tokens, the KV cache bytes and the dtype, as T4SERVE_* values, so that two servers a benchmark compares
    differ only in the checkpoint (same architecture, same KV layout: the set values fit as they fit here). Only the
    dtype where sizing could not run; the other settings are shared as they are."""
    shared: dict[str, str] = {} if plan.dtype == "auto" else {"T4SERVE_DTYPE": plan.dtype}
    sizing = plan.sizing
    if sizing is None:
        return shared
    shared["T4SERVE_MAX_MODEL_LEN"] = str(int(sizing.max_model_len.value))
    shared["T4SERVE_MAX_NUM_SEQS"] = str(int(sizing.max_num_seqs.value))
    shared["T4SERVE_MAX_NUM_BATCHED_TOKENS"] = str(int(sizing.max_num_batched_tokens.value))
    if sizing.kv_cache_memory_bytes is not None:
        shared["T4SERVE_KV_CACHE_MEMORY_BYTES"] = str(int(sizing.kv_cache_memory_bytes.value))
    return shared


def without_option(argv: Sequence[str], option: str) -> tuple[str, ...]:
    """`argv` less `option VALUE` and `option=VALUE`."""
    kept: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
        elif arg == option:
            skip = True
        elif not arg.startswith(option + "="):
            kept.append(arg)
    return tuple(kept)
