"""Name the cause of a vLLM death from its last log lines, its exit status and the phase it died in.

Pure: `diagnose(lines, returncode, phase)` returns one `Diagnosis` (what happened, the fix) or None when no known
cause matches; the wrapper prints it under vLLM's last lines. The texts matched are vLLM 0.33's, torch's, Triton's
and huggingface_hub's own messages; the first rule that matches wins, most specific first.
"""

from __future__ import annotations

import re
import signal
from collections.abc import Sequence
from dataclasses import dataclass

from t4serve.gpus import BF16_MIN_CAPABILITY, format_capability
from t4serve.supervise.phases import PHASES

_BF16 = format_capability(BF16_MIN_CAPABILITY)


@dataclass(frozen=True)
class Diagnosis:
    name: str
    summary: str
    fix: str
    # The log line that matched, or a description of the exit status.
    evidence: str

    def one_line(self) -> str:
        return f"diagnosis: {self.summary} (seen: {self.evidence}); fix: {self.fix}"


@dataclass(frozen=True)
class _Rule:
    name: str
    regex: re.Pattern[str]
    summary: str
    fix: str


# Top-level modules the image leaves out (docker/slim.json's distributions and excluded_from_lock; a unit test keeps
# them equal). A vLLM path that imports one was reached by a setting or flag a T4 serve does not need.
REMOVED_FROM_IMAGE = (
    "PyNvVideoCodec", "b12x", "cudnn", "cutile_cache", "cutlass", "fastsafetensors", "flashinfer", "humming",
    "instanttensor", "llvmlite", "nccl", "numba", "nvidia_cutlass_dsl", "quack", "tilelang", "tokenspeed_mla",
    "tokenspeed_triton", "z3",
)  # fmt: skip

_RULES: tuple[_Rule, ...] = (
    _Rule(
        "removed_from_image",
        re.compile(r"No module named '(?:" + "|".join(map(re.escape, REMOVED_FROM_IMAGE)) + r")(?:'|\.)"),
        "vLLM imported a package the t4serve image leaves out (docker/slim.json): a setting or flag took a path a "
        "Gemma 4 serve on a T4 does not need",
        "remove what asked for it: VLLM_USE_FLASHINFER_SAMPLER=1 or VLLM_USE_DEEP_GEMM=1 in the environment, or a "
        "flag in T4SERVE_VLLM_ARGS (t4serve refuses the load formats it knows of); "
        "docs/image.md lists what the image leaves out and why",
    ),
    _Rule(
        "clamp_missing",
        # triton/runtime/errors.py OutOfResources: "out of resource: shared memory, Required: N, Hardware limit: 65536"
        re.compile(r"Hardware limit: 65536"),
        "vLLM's Triton attention asked for more shared memory than a Turing GPU has per block (65,536 B): "
        "the Turing attention clamp is missing from this vLLM",
        "run the t4serve image unmodified (its build applies and proves the clamp; reinstalling vLLM removes it); "
        "`t4serve probe --json` shows the build manifest's clamp state",
    ),
    _Rule(
        "bf16_on_turing",
        # vllm/platforms/cuda.py check_if_supports_dtype
        re.compile(r"Bfloat16 is only supported on GPUs with compute capability of at least 8\.0"),
        f"bfloat16 was requested on a GPU without bf16 (compute capability below {_BF16}, e.g. Turing)",
        f"remove --dtype bfloat16 from T4SERVE_VLLM_ARGS; t4serve picks --dtype float16 below capability {_BF16}",
    ),
    _Rule(
        "driver_too_old",
        re.compile(
            r"CUDA driver version is insufficient|driver on your system is too old|cudaErrorInsufficientDriver"
            r"|CUDA_ERROR_SYSTEM_DRIVER_MISMATCH"
        ),
        "the host's NVIDIA driver is too old for this image's CUDA 13 runtime",
        "install an NVIDIA driver >= 580 on the host (`nvidia-smi` shows the version), then restart the container",
    ),
    _Rule(
        "gated_model_no_token",
        re.compile(
            r"GatedRepoError|Cannot access gated repo|Access to model \S+ is restricted|401 Client Error"
            r"|You are trying to access a gated repo"
        ),
        "the model is gated on Hugging Face and no (or no accepted) token was given",
        "accept the model's license on huggingface.co, then give a token: put it in the compose secret file "
        "(HF_TOKEN_FILE=/run/secrets/hf_token) or set HF_TOKEN",
    ),
    _Rule(
        "compile_oom",
        # torch/_inductor/exc.py InductorError wraps the OutOfMemoryError raised while Inductor compiles (and
        # benchmarks) kernels: "torch._inductor.exc.InductorError: OutOfMemoryError: CUDA out of memory. ..."
        re.compile(r"InductorError: (?:torch\.)?OutOfMemoryError|_inductor\S*\.OutOfMemoryError"),
        "the GPU ran out of memory inside torch.compile (Inductor), before the KV cache was allocated: a first start "
        "on an empty compile cache needs several GiB more than later ones",
        "T4SERVE_COMPILE=auto (the default) retries with a cheaper compile setting and remembers what worked; "
        "T4SERVE_COMPILE=lean, o1 or eager chooses one; the QAT checkpoint (T4SERVE_MODEL=qat) leaves more room",
    ),
    _Rule(
        "kv_pool_empty",
        # vllm/v1/core/kv_cache_planning.py: only a profiled pool can come out at zero or less; an explicit
        # --kv-cache-memory-bytes (t4serve's default) is taken as given.
        re.compile(r"No available memory for the cache blocks"),
        "vLLM profiled the KV pool and found no memory left for it after the weights, activations and graphs "
        "(a first start on an empty compile cache counts its compile memory against a profiled pool)",
        "unset T4SERVE_KV_CACHE_MEMORY_BYTES, so t4serve passes its own explicit pool (the default), or raise "
        "T4SERVE_GPU_MEMORY_UTILIZATION; the QAT checkpoint (T4SERVE_MODEL=qat) leaves more room",
    ),
    _Rule(
        "cuda_oom",
        re.compile(
            r"CUDA out of memory|torch\.OutOfMemoryError|OutOfMemoryError: CUDA|not enough GPU memory"
            r"|larger than the available KV cache memory"
        ),
        "the GPU ran out of memory (weights + KV cache + CUDA graphs did not fit)",
        "lower T4SERVE_MAX_MODEL_LEN or T4SERVE_MAX_NUM_SEQS; if t4serve set the KV cache size (the default), "
        "T4SERVE_KV_CACHE_MEMORY_BYTES=profile lets vLLM measure what fits; use the QAT checkpoint "
        "(T4SERVE_MODEL=qat), and check that nothing else holds GPU memory (`nvidia-smi`)",
    ),
    _Rule(
        "gpu_memory_taken",
        # vllm/v1/worker/utils.py request_memory: other processes hold the memory vLLM's budget needs.
        re.compile(r"Free memory on device \S+ \([0-9.]+/[0-9.]+ GiB\) on startup is less than desired GPU memory"),
        "other processes hold the GPU memory vLLM's budget needs (total x --gpu-memory-utilization)",
        "stop them (`nvidia-smi` lists them; a vLLM engine core left by an earlier run is a common one) or lower "
        "T4SERVE_GPU_MEMORY_UTILIZATION",
    ),
    _Rule(
        "shm_too_small",
        re.compile(
            r"No space left on device.*(/dev/shm|shm)|(/dev/shm|shm).*No space left on device|Bus error"
            # torch's shared-memory tensor files live in /dev/shm as torch_<pid>_<n>_<i>.
            r"|unable to write to file </torch_|unable to allocate shared memory|NCCL WARN.*shm",
            re.IGNORECASE,
        ),
        "the container's /dev/shm is too small for vLLM's shared-memory queues",
        "give the container more shared memory: `docker run --shm-size 2g` or `shm_size`/`ipc: host` in compose.yaml",
    ),
)

# vLLM's multiproc executor and engine-core launcher report a SIGKILLed child as exit code -9
# ("Failed core proc(s): {'EngineCore_DP0': -9}", "died unexpectedly (exit code: -9)").
_KILLED = re.compile(r"exit code:? -9|': -9\}|Killed process|signal 9|SIGKILL")


def diagnose(lines: Sequence[str], returncode: int | None, phase: str) -> Diagnosis | None:
    """The first known cause found in `lines` (oldest first), else one read from the exit status and phase."""
    for rule in _RULES:
        for line in reversed(lines):
            if rule.regex.search(line):
                return Diagnosis(rule.name, rule.summary, rule.fix, line.strip()[:300])
    killed_line = next((ln for ln in reversed(lines) if _KILLED.search(ln)), None)
    sigkill = returncode is not None and returncode in (-signal.SIGKILL, 128 + signal.SIGKILL)
    if (sigkill or killed_line is not None) and phase in PHASES and PHASES[phase].before_weights_loaded:
        evidence = killed_line.strip()[:300] if killed_line else f"vLLM killed by SIGKILL while {phase}"
        return Diagnosis(
            "host_oom_during_load",
            "out of host memory while loading the weights: the kernel's OOM killer ended vLLM "
            "(the host log says `Out of memory: Killed process ... (VLLM::EngineCor)`)",
            "add swap on the host (`scripts/setup-swap 16G`) or more RAM, raise the container's memory limit, "
            "or use the QAT checkpoint (T4SERVE_MODEL=qat), which needs less host memory to load",
            evidence,
        )
    return None
