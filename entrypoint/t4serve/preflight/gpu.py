"""Preflight checks of the GPU: visible, its driver, its compute capability, the dtype it computes in, its free
memory, a card sized as another (T4SERVE_SIZE_AS), and the plan's sizing on it."""

from __future__ import annotations

import math
import re

from t4serve.config.settings import Settings
from t4serve.facts import Facts, GpuDevice, ModelFacts
from t4serve.gpus import BF16_MIN_CAPABILITY, MIN_CAPABILITY, format_capability
from t4serve.planning.derived import format_bytes
from t4serve.planning.plan import Plan, float16_refusal, model_type
from t4serve.preflight.findings import Finding
from t4serve.units import GIB

# The image's torch is the CUDA 13.0 build (published-t4-run.md); CUDA 13 needs driver 580 or newer.
DEFAULT_TORCH_CUDA = (13, 0)
MIN_DRIVER_FOR_CUDA = {13: 580, 12: 525, 11: 450}
NO_GPU_FIX = (
    "start the container with a GPU: `docker run --gpus all ...`, or in compose.yaml "
    "`deploy.resources.reservations.devices: [{driver: nvidia, device_ids: ['0'], capabilities: [gpu]}]`; "
    'if Docker answers `could not select device driver "nvidia"`, install the NVIDIA Container Toolkit on the host '
    "and run `sudo nvidia-ctk runtime configure --runtime=docker && sudo systemctl restart docker`"
)


def check_gpu_visible(facts: Facts) -> Finding:
    gpu = facts.gpu
    visible = ", ".join(f"{k}={v}" for k, v in sorted(gpu.visible_devices_env.items())) or (
        "NVIDIA_VISIBLE_DEVICES and CUDA_VISIBLE_DEVICES not set"
    )
    required = "one NVIDIA GPU visible in the container through NVML"
    if not gpu.nvml_available:
        return Finding("gpu", "fail", f"NVML unavailable: {gpu.error or 'no reason given'} ({visible})", required,
                       NO_GPU_FIX)  # fmt: skip
    if not gpu.devices:
        why = f": {gpu.error}" if gpu.error else ""
        return Finding(
            "gpu",
            "fail",
            f"NVML loaded (driver {gpu.driver_version}) but no device is visible{why} ({visible})",
            required,
            NO_GPU_FIX + "; check that NVIDIA_VISIBLE_DEVICES / CUDA_VISIBLE_DEVICES name an existing GPU",
        )
    first = gpu.devices[0]
    more = f" (device 0 of {len(gpu.devices)})" if len(gpu.devices) > 1 else ""
    return Finding("gpu", "ok", f"{first.name}{more}", required, "")


def _version_tuple(text: str | None) -> tuple[int, ...] | None:
    if not text:
        return None
    parts = re.findall(r"\d+", text)
    return tuple(int(p) for p in parts[:2]) if parts else None


def check_driver(facts: Facts) -> Finding:
    torch_cuda = _version_tuple(facts.manifest.torch_cuda_version) or DEFAULT_TORCH_CUDA
    need_cuda = f"{torch_cuda[0]}.{torch_cuda[1] if len(torch_cuda) > 1 else 0}"
    min_driver = MIN_DRIVER_FOR_CUDA.get(torch_cuda[0], MIN_DRIVER_FOR_CUDA[13])
    required = f"driver >= {min_driver} (torch is built for CUDA {need_cuda})"
    driver = facts.gpu.driver_version
    cuda = facts.gpu.cuda_driver_version
    found = f"driver {driver or 'unknown'}" + (f", supports CUDA up to {cuda[0]}.{cuda[1]}" if cuda else "")
    fix = f"upgrade the host's NVIDIA driver to {min_driver} or newer (`nvidia-smi` shows the running one)"
    major = _version_tuple(driver)
    if major is None and cuda is None:
        return Finding("driver", "warn", found, required, "check `nvidia-smi` on the host")
    too_old = (major is not None and major[0] < min_driver) or (cuda is not None and cuda < torch_cuda[:2])
    return Finding("driver", "fail" if too_old else "ok", found, required, fix if too_old else "")


def check_capability(gpu: GpuDevice) -> Finding:
    found = f"{gpu.name}: compute capability {format_capability(gpu.compute_capability)}"
    required = f"compute capability >= {format_capability(MIN_CAPABILITY)} (Turing or newer)"
    if gpu.compute_capability < MIN_CAPABILITY:
        return Finding(
            "capability",
            "fail",
            found,
            required,
            "use a Turing or newer GPU (T4, RTX 20xx, Quadro RTX, A10G, L4, ...): torch's CUDA 13 build and vLLM's "
            "kernels start at sm_75",
        )
    return Finding("capability", "ok", found, required, "")


def check_dtype(plan: Plan, gpu: GpuDevice, model: ModelFacts | None = None) -> Finding:
    found = f"--dtype {plan.dtype} ({plan.dtype_reason}) on capability {format_capability(gpu.compute_capability)}"
    required = f"bfloat16 only on capability >= {format_capability(BF16_MIN_CAPABILITY)}"
    if plan.dtype == "bfloat16" and gpu.compute_capability < BF16_MIN_CAPABILITY:
        return Finding(
            "dtype",
            "fail",
            found,
            required + f": {format_capability(gpu.compute_capability)} has no bfloat16 datapath",
            "set T4SERVE_DTYPE=auto (float16 on Turing) or T4SERVE_DTYPE=float16",
        )
    refusal = float16_refusal(model)
    if plan.dtype == "float16" and refusal is not None:
        return Finding(
            "dtype",
            "fail",
            found + f", model type {model_type(model)}",
            f"a dtype vLLM runs this model in: {refusal} (vLLM's words)",
            f"set T4SERVE_DTYPE=auto (bfloat16 from capability {format_capability(BF16_MIN_CAPABILITY)}, float32 "
            "below) or T4SERVE_DTYPE=float32",
        )
    return Finding("dtype", "ok", found, required, "")


def check_gpu_memory_free(gpu: GpuDevice, settings: Settings) -> Finding:
    # vLLM refuses to start when free memory is below total x utilization (vllm/v1/worker/utils.py).
    want = math.ceil(gpu.memory_total_bytes * settings.gpu_memory_utilization)
    found = f"{format_bytes(gpu.memory_free_bytes)} free of {format_bytes(gpu.memory_total_bytes)}"
    required = (
        f"free >= total x T4SERVE_GPU_MEMORY_UTILIZATION = {format_bytes(gpu.memory_total_bytes)} x "
        f"{settings.gpu_memory_utilization} = {format_bytes(want)}"
    )
    if gpu.memory_free_bytes < want:
        fits = math.floor(gpu.memory_free_bytes / gpu.memory_total_bytes * 100) / 100
        return Finding(
            "gpu-memory",
            "fail",
            found,
            required,
            f"stop the other processes on the GPU (`nvidia-smi` lists them), or set "
            f"T4SERVE_GPU_MEMORY_UTILIZATION={fits:.2f}",
        )
    return Finding("gpu-memory", "ok", found, required, "")


def check_size_as(real: GpuDevice, planned: GpuDevice, key: str) -> Finding:
    """T4SERVE_SIZE_AS shrinks a card to a smaller one; it cannot grow one."""
    found = f"T4SERVE_SIZE_AS={key}: {format_bytes(planned.memory_total_bytes)} on {real.name} with " \
            f"{format_bytes(real.memory_total_bytes)}"
    required = "the real card at least as large as the card it is sized as"
    if real.memory_total_bytes < planned.memory_total_bytes:
        return Finding("size-as", "fail", found, required,
                       "unset T4SERVE_SIZE_AS, or name a card no larger than this one (e.g. t4)")
    return Finding("size-as", "ok", found, required, "")


# Cards up to this size (a T4's 15 GiB, the 16 GiB class) are where vLLM's profile run itself reached the card's limit
# on the GPU host (docs/verification.md, "the profiled pool at a T4's memory").
PROFILE_RISK_MAX_BYTES = 16 * GIB


def check_sizing(plan: Plan) -> Finding:
    required = "weights, activations and a KV cache that holds one max-length request within the GPU budget"
    if plan.sizing is None:
        return Finding(
            "sizing",
            "fail",
            plan.sizing_error or "sizing did not run",
            required,
            "lower T4SERVE_MAX_MODEL_LEN, use T4SERVE_MODEL=qat, or raise T4SERVE_GPU_MEMORY_UTILIZATION",
        )
    s = plan.sizing
    memory = plan.gpu.memory_total_bytes if plan.gpu is not None else 0
    if s.kv_cache_memory_bytes is None and 0 < memory <= PROFILE_RISK_MAX_BYTES:
        return Finding(
            "sizing",
            "warn",
            f"T4SERVE_KV_CACHE_MEMORY_BYTES=profile on {memory / GIB:.1f} GiB: vLLM measures the pool during a "
            "profile run that can reach this card's limit, and then sizes the pool too large (GPU host, vLLM 0.33.0, "
            "a T4's 15 GiB: 271 allocator out-of-memory retries, a measured activation peak of 0.29 GiB against "
            "0.57 GiB with memory to spare, a pool of 3.20 GiB against t4serve's 2.81, and 8 MB of the card left "
            f"free); t4serve's own plan: {s.kv_tokens.format_value()} tokens",
            f"a KV pool that leaves the card headroom at its peak (t4serve's explicit pool left 1.1 GB on the same "
            f"card); on cards above {PROFILE_RISK_MAX_BYTES / GIB:.0f} GiB profiling is as safe as vLLM makes it",
            "unset T4SERVE_KV_CACHE_MEMORY_BYTES (t4serve passes its planned pool), or give an explicit size "
            "(e.g. 2.5GiB)",
        )
    return Finding(
        "sizing",
        "ok",
        f"KV cache {s.kv_tokens.format_value()} tokens, {s.concurrency.format_value()}x at "
        f"{s.max_model_len.format_value()} tokens",
        required,
        "",
    )
