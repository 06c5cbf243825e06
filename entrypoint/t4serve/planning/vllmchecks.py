"""What vLLM 0.33 refuses on a card before it plans: the KV cache dtype and the checkpoint's quantization method.

`VLLM_KV_CACHE_DTYPES` maps T4SERVE_KV_CACHE_DTYPE (auto, int8, int4, fp8) to vLLM's `--kv-cache-dtype`;
`check_kv_cache_dtype` and `check_quantization` raise where vLLM would refuse the cache dtype or the checkpoint's
quantization method on the card.
Each refusal quotes vLLM's own message (the file it comes from is named beside it). Pure: strings and tuples in.
"""

from __future__ import annotations

from t4serve.errors import ConfigError
from t4serve.facts import ModelFacts
from t4serve.gpus import format_capability

# vLLM's `--kv-cache-dtype` for each setting. int8 and int4 are the per-token-head modes (vllm/config/cache.py
# `CacheDType`): dynamic scales per token and head, computed at run time, so no checkpoint scales are needed; only
# the Triton backend runs them (vllm/v1/attention/backends/triton_attn.py `supported_kv_cache_dtypes`), and vLLM's
# backend selection skips the others for them.
VLLM_KV_CACHE_DTYPES: dict[str, str] = {
    "auto": "auto",
    "int8": "int8_per_token_head",
    "int4": "int4_per_token_head",
    "fp8": "fp8",
}
# `TritonAttentionImpl.__init__` and `CudaPlatform.supports_fp8`: FP8 KV caches need native fp8 (SM 8.9).
FP8_MIN_CAPABILITY = (8, 9)


def fp8_refusal(gpu_name: str, capability: tuple[int, int]) -> str:
    """vLLM's own message (vllm/v1/attention/backends/triton_attn.py) for an FP8 KV cache below capability 8.9."""
    suggested = "float16" if capability < (8, 0) else "bfloat16"
    return (f"FP8 KV cache is not supported by the Triton attention backend on {gpu_name} (compute capability "
            f"{format_capability(capability)}); native FP8 (fp8e4nv) requires SM89+. Re-run with --kv-cache-dtype "
            f"{suggested}.")


def kv_cache_dtype_reason(setting: str) -> str:
    """What the KV cache dtype stores, in words, for the plan."""
    if setting == "auto":
        return "auto: K and V in the model dtype"
    if setting == "fp8":
        return "fp8: one byte per K and V element, per-tensor scale 1.0 (no checkpoint scales)"
    bits = "8" if setting == "int8" else "4"
    return (f"{setting}: {bits}-bit K and V with a float32 scale per token and head, computed at run time (vLLM's "
            "Triton attention backend)")


def check_kv_cache_dtype(setting: str, gpu_name: str, capability: tuple[int, int], *, int4_runs: bool = True) -> None:
    """A ConfigError where the card cannot run the KV cache dtype (fp8 below capability 8.9, in vLLM's words).
    `int4_runs`: whether int4's kernel fits this card for the model (t4serve.planning.kernelfit), so fp8's fix names it
    only then. (A quantized cache always runs on vLLM's Triton backend: t4serve.planning.attention passes it.)"""
    if setting == "fp8" and capability < FP8_MIN_CAPABILITY:
        raise ConfigError(
            f"T4SERVE_KV_CACHE_DTYPE=fp8 cannot run on capability {format_capability(capability)}",
            found=f"{gpu_name}, compute capability {format_capability(capability)}",
            required=f"capability {format_capability(FP8_MIN_CAPABILITY)} or newer for an FP8 KV cache: "
                     f"{fp8_refusal(gpu_name, capability)} (vLLM's words)",
            fix="set T4SERVE_KV_CACHE_DTYPE=int8 (about half the 16-bit bytes, with per-token-head scales)"
                + (" or int4, which vLLM's Triton backend runs on this card" if int4_runs else
                   ", which vLLM's Triton backend runs on this card (int4's kernel needs more shared memory than it "
                   "has for this model)")
                + ", or auto",
        )


# vLLM 0.33's quantization configs (vllm/model_executor/layers/quantization/): quant_method as config.json names it ->
# (`get_min_capability()`, `get_supported_act_dtypes()`), checked by `VllmConfig._get_quantization_config`.
_HALF = ("float16", "bfloat16")
QUANTIZATION_LIMITS: dict[str, tuple[int, tuple[str, ...]]] = {
    "awq": (75, _HALF),
    "awq_marlin": (75, _HALF),
    "auto_awq": (75, _HALF),
    "gptq": (60, _HALF),
    "gptq_marlin": (60, _HALF),
    "auto_gptq": (60, _HALF),
    "fp8": (75, _HALF),
    "fbgemm_fp8": (80, _HALF),
    "modelopt": (80, _HALF),
    "compressed-tensors": (70, ("float32", "float16", "bfloat16")),
    "experts_int8": (80, _HALF),
    "moe_wna16": (70, _HALF),
    "mxfp4": (80, ("bfloat16",)),
    "gpt_oss_mxfp4": (80, ("bfloat16",)),
    "fp_quant": (100, ("bfloat16",)),
    "torchao": (75, ("float32", "float16", "bfloat16")),
    "humming": (75, _HALF),
}


def quantization_method(model: ModelFacts | None) -> str | None:
    """The method vLLM runs the checkpoint with: config.json's quant_method, which `GptOssMxfp4Config.
    override_quantization_method` turns into gpt_oss_mxfp4 for a gpt_oss model."""
    if model is None or model.quantization is None:
        return None
    method = model.quantization.lower()
    if method == "mxfp4" and model.config.get("model_type") == "gpt_oss":
        return "gpt_oss_mxfp4"
    return method


def quantization_refusal(model: ModelFacts | None, dtype: str, capability: tuple[int, int]) -> str | None:
    """vLLM's own refusal of this checkpoint's quantization on the card (capability, then the compute dtype), or None.
    A method not in QUANTIZATION_LIMITS is left to vLLM."""
    method = quantization_method(model)
    if method is None or method not in QUANTIZATION_LIMITS:
        return None
    minimum, act_dtypes = QUANTIZATION_LIMITS[method]
    current = capability[0] * 10 + capability[1]
    if current < minimum:
        return (f"The quantization method {method} is not supported for the current GPU. Minimum capability: "
                f"{minimum}. Current capability: {current}.")
    if dtype != "auto" and dtype not in act_dtypes:
        listed = ", ".join(f"torch.{d}" for d in act_dtypes)
        return f"torch.{dtype} is not supported for quantization method {method}. Supported dtypes: [{listed}]"
    return None


def check_quantization(model: ModelFacts | None, dtype: str, gpu_name: str, capability: tuple[int, int]) -> None:
    """A ConfigError carrying `quantization_refusal` where vLLM would refuse the checkpoint on this card."""
    refusal = quantization_refusal(model, dtype, capability)
    if refusal is None:
        return
    raise ConfigError(
        f"vLLM cannot run this checkpoint's quantization on {gpu_name}",
        found=f"{model.requested if model else 'the model'}: quantization {quantization_method(model)}, --dtype "
              f"{dtype}, compute capability {format_capability(capability)}",
        required=f"{refusal} (vLLM's words)",
        fix="use a checkpoint quantized for this card (AWQ, GPTQ or compressed-tensors int4 run from capability "
            "7.5), or a GPU of the capability vLLM names",
    )
