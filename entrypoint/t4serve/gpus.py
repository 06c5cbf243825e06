"""What t4serve knows about GPUs that NVML does not report: capabilities, known cards, per-card defaults.

Compute capabilities: what t4serve needs (`MIN_CAPABILITY`, Turing), where bfloat16 and vLLM's FlashAttention begin,
and which compiled kernels run on a card (`arch_supported`). `shared_memory_per_block_optin` is the CUDA programming
guide's "maximum shared memory per thread block" (opt-in) per compute capability: NVML cannot read it, and it decides
whether vLLM's Triton attention needs the Turing clamp. `KNOWN_GPUS` lets `t4serve plan --gpu t4` plan for a card on any
machine (`known_device`) and T4SERVE_SIZE_AS serve as one (`sized_as_device`). `vllm_batch_defaults` is how vLLM
batches on a card when told nothing. NVML's clocks-event reasons are named as nvidia-smi names them.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import Any, cast

from t4serve.facts import GpuDevice
from t4serve.units import GB, GIB, MIB

# Turing (T4, RTX 20xx, Quadro RTX): the card t4serve is for, and the oldest torch's CUDA 13 build and vLLM's kernels
# run on (sm_75).
TURING = (7, 5)
MIN_CAPABILITY = TURING
# Turing (7.5) and older have no bfloat16 datapath; Ampere (8.0) is the first with one.
BF16_MIN_CAPABILITY = (8, 0)
# vLLM's FlashAttention and FlashInfer backends need capability 8.0; below it vLLM runs its Triton attention.
FLASH_ATTENTION_MIN_CAPABILITY = (8, 0)


def format_capability(capability: tuple[int, int]) -> str:
    """`7.5`, as NVIDIA writes a compute capability."""
    return f"{capability[0]}.{capability[1]}"


def arch_supported(arch_list: Iterable[str], capability: tuple[int, int]) -> bool:
    """Whether kernels compiled for `arch_list` (torch's, e.g. sm_75 ... compute_120) run on `capability`.

    A cubin sm_XY runs on capability X.Z with Z >= Y (same major); PTX compute_XY is JIT-compiled for anything newer.
    """
    for arch in arch_list:
        match = re.fullmatch(r"(sm|compute)_(\d+)(\d)[a-z]?", arch.strip())
        if not match:
            continue
        kind, major, minor = match.group(1), int(match.group(2)), int(match.group(3))
        if kind == "sm" and major == capability[0] and minor <= capability[1]:
            return True
        if kind == "compute" and (major, minor) <= capability:
            return True
    return False


# CUDA C++ Programming Guide, "Technical Specifications per Compute Capability": max opt-in shared memory per block.
_SHARED_MEMORY_OPTIN: dict[tuple[int, int], int] = {
    (7, 0): 96 * 1024,
    (7, 2): 96 * 1024,
    (7, 5): 64 * 1024,
    (8, 0): 163 * 1024,
    (8, 6): 99 * 1024,
    (8, 7): 163 * 1024,
    (8, 9): 99 * 1024,
    (9, 0): 227 * 1024,
    (10, 0): 227 * 1024,
    (10, 3): 227 * 1024,
    (12, 0): 99 * 1024,
    (12, 1): 99 * 1024,
}


def shared_memory_per_block_optin(capability: tuple[int, int]) -> int:
    """Opt-in shared memory per block in bytes; an unknown newer capability gets its major family's smallest value."""
    if capability in _SHARED_MEMORY_OPTIN:
        return _SHARED_MEMORY_OPTIN[capability]
    same_major = [v for (major, _), v in _SHARED_MEMORY_OPTIN.items() if major == capability[0]]
    if same_major:
        return min(same_major)
    # Older than Volta or newer than anything listed: assume the most restrictive known value.
    return min(_SHARED_MEMORY_OPTIN.values())


@dataclass(frozen=True)
class KnownGpu:
    key: str
    name: str
    compute_capability: tuple[int, int]
    memory_bytes: int
    # Nominal peak memory bandwidth from the vendor's datasheet, bytes/s.
    bandwidth_nominal: float
    # A measured streaming-read bandwidth where one is published (published-t4-run.md for the T4), else None.
    bandwidth_measured: float | None
    power_limit_w: float
    sm_clock_max_mhz: int

    @property
    def shared_memory_per_block(self) -> int:
        return shared_memory_per_block_optin(self.compute_capability)

    @property
    def bandwidth(self) -> float:
        """The figure to plan with: measured when known, else nominal."""
        return self.bandwidth_measured or self.bandwidth_nominal


KNOWN_GPUS: dict[str, KnownGpu] = {
    g.key: g
    for g in (
        # published-t4-run.md: 15360 MiB, 70 W cap, 1590 MHz, 277.0 GB/s measured streaming read, 320 GB/s nominal.
        KnownGpu("t4", "Tesla T4", (7, 5), 15360 * MIB, 320 * GB, 277.0 * GB, 70.0, 1590),
        KnownGpu("rtx2080ti", "NVIDIA GeForce RTX 2080 Ti", (7, 5), 11264 * MIB, 616 * GB, None, 250.0, 1545),
        KnownGpu("a10g", "NVIDIA A10G", (8, 6), 23028 * MIB, 600 * GB, None, 300.0, 1710),
        KnownGpu("l4", "NVIDIA L4", (8, 9), 23034 * MIB, 300 * GB, None, 72.0, 2040),
        KnownGpu("a100", "NVIDIA A100-SXM4-80GB", (8, 0), 81920 * MIB, 2039 * GB, None, 400.0, 1410),
        KnownGpu("h100", "NVIDIA H100 80GB HBM3", (9, 0), 81559 * MIB, 3350 * GB, None, 700.0, 1980),
        KnownGpu("h200", "NVIDIA H200", (9, 0), 143771 * MIB, 4800 * GB, None, 700.0, 1980),
    )
}


def known_gpu(key: str) -> KnownGpu | None:
    return KNOWN_GPUS.get(key.lower().replace("-", "").replace("_", "").replace(" ", ""))


# A device taken from the known-GPU table (`plan --gpu t4`) carries this uuid prefix instead of a real uuid.
KNOWN_GPU_UUID_PREFIX = "known:"


def known_device(gpu: KnownGpu) -> GpuDevice:
    """The known card as a probed device would describe it: device 0, its whole memory free, the uuid `known:<key>`
    so a plan says where its GPU came from."""
    return GpuDevice(
        index=0,
        name=gpu.name,
        uuid=f"{KNOWN_GPU_UUID_PREFIX}{gpu.key}",
        compute_capability=gpu.compute_capability,
        memory_total_bytes=gpu.memory_bytes,
        memory_free_bytes=gpu.memory_bytes,
        shared_memory_per_block=gpu.shared_memory_per_block,
        power_limit_w=gpu.power_limit_w,
        power_max_limit_w=gpu.power_limit_w,
        sm_clock_max_mhz=gpu.sm_clock_max_mhz,
        memory_clock_max_mhz=None,
    )


def sized_as_device(real: GpuDevice, card: KnownGpu) -> GpuDevice:
    """`real` as the known `card`: its memory, capability and shared memory per block, the real device's identity,
    free memory and clocks (T4SERVE_SIZE_AS)."""
    return replace(
        real,
        name=f"{real.name} sized as {card.name}",
        compute_capability=card.compute_capability,
        memory_total_bytes=card.memory_bytes,
        shared_memory_per_block=card.shared_memory_per_block,
    )


def match_known_gpu(name: str) -> KnownGpu | None:
    """The table entry whose name an NVML device name matches, for bandwidth figures NVML cannot give."""
    lowered = name.lower()
    for gpu in KNOWN_GPUS.values():
        if gpu.name.lower() == lowered:
            return gpu
    for gpu in KNOWN_GPUS.values():
        if gpu.key in lowered.replace(" ", "").replace("-", ""):
            return gpu
    return None


@dataclass(frozen=True)
class BatchDefaults:
    """vLLM's defaults for `vllm serve` on one GPU: what it batches per step and how many requests it decodes."""

    max_num_batched_tokens: int
    max_num_seqs: int
    # Which of vLLM's tiers the card falls in, in words, for the plan's arithmetic.
    tier: str


# vLLM 0.33 `EngineArgs.get_batch_defaults` for `vllm serve` (vllm/engine/arg_utils.py, UsageContext.OPENAI_API_SERVER):
# (batched tokens, seqs) per tier of the device's total memory. GB10 (DGX Spark, capability 12.1) has the memory of a
# large card but is kept on the small tier; the device name check keeps A100s on it too (vLLM PR #17885).
SMALL_TIER = (2048, 256)
LARGE_TIER_GIB, LARGE_TIER = 70, (8192, 1024)
HUGE_TIER_GIB, HUGE_TIER = 160, (16384, 1024)
GB10_CAPABILITY = (12, 1)
# The tiers in words, for the settings' docs.
BATCHED_TOKENS_TIERS_DOC = (f"{SMALL_TIER[0]} below {LARGE_TIER_GIB} GiB and on an A100, {LARGE_TIER[0]} from "
                            f"{LARGE_TIER_GIB} GiB, {HUGE_TIER[0]} from {HUGE_TIER_GIB} GiB")
MAX_NUM_SEQS_TIERS_DOC = f"{SMALL_TIER[1]}; {LARGE_TIER[1]} on {LARGE_TIER_GIB} GiB or more but an A100"


def vllm_batch_defaults(gpu_memory_bytes: int, gpu_name: str, capability: tuple[int, int]) -> BatchDefaults:
    """vLLM's batch defaults for `vllm serve` on this GPU (the tiers above). The memory is the device's total as the
    platform reports it, the name is compared lowercased."""
    gib = gpu_memory_bytes / GIB
    if gpu_memory_bytes >= HUGE_TIER_GIB * GIB:
        return BatchDefaults(*HUGE_TIER, f"{gib:.1f} GiB >= {HUGE_TIER_GIB} GiB")
    small_by = ("an A100 by name" if "a100" in gpu_name.lower()
                else f"GB10 (capability {format_capability(GB10_CAPABILITY)})"
                if tuple(capability) == GB10_CAPABILITY else None)  # fmt: skip
    if gpu_memory_bytes >= LARGE_TIER_GIB * GIB and small_by is None:
        return BatchDefaults(*LARGE_TIER, f"{gib:.1f} GiB >= {LARGE_TIER_GIB} GiB, not an A100 or GB10")
    if gpu_memory_bytes >= LARGE_TIER_GIB * GIB:
        return BatchDefaults(*SMALL_TIER, f"{gib:.1f} GiB but {small_by}: vLLM keeps it on the small tier")
    return BatchDefaults(*SMALL_TIER, f"{gib:.1f} GiB < {LARGE_TIER_GIB} GiB")


def default_max_num_batched_tokens(gpu_memory_bytes: int, gpu_name: str = "",
                                   capability: tuple[int, int] = (0, 0)) -> int:
    """vLLM's default `--max-num-batched-tokens` for `vllm serve` on this GPU (`vllm_batch_defaults`)."""
    return vllm_batch_defaults(gpu_memory_bytes, gpu_name, capability).max_num_batched_tokens


# NVML's clocks-event (throttle) reason bits (nvml.h nvmlClocksEventReason*), named as nvidia-smi names them.
THROTTLE_REASONS: tuple[tuple[int, str, str], ...] = (
    (0x0001, "gpu_idle", "GPU idle"),
    (0x0002, "applications_clocks_setting", "applications clocks setting"),
    (0x0004, "sw_power_cap", "SW power cap"),
    (0x0008, "hw_slowdown", "HW slowdown"),
    (0x0010, "sync_boost", "sync boost"),
    (0x0020, "sw_thermal_slowdown", "SW thermal slowdown"),
    (0x0040, "hw_thermal_slowdown", "HW thermal slowdown"),
    (0x0080, "hw_power_brake_slowdown", "HW power brake slowdown"),
    (0x0100, "display_clock_setting", "display clock setting"),
)


def decode_throttle_reasons(mask: int) -> list[str]:
    """The reason keys set in an NVML clocks-event mask; unknown bits are named by their value."""
    names = [key for bit, key, _label in THROTTLE_REASONS if mask & bit]
    known = 0
    for bit, _key, _label in THROTTLE_REASONS:
        known |= bit
    unknown = mask & ~known
    if unknown:
        names.append(f"unknown_0x{unknown:x}")
    return names


def throttle_labels(mask: int) -> list[str]:
    """The reasons set in an NVML clocks-event mask in nvidia-smi's words; unknown bits are named by their value."""
    labels = {key: label for _bit, key, label in THROTTLE_REASONS}
    return [labels.get(key, key) for key in decode_throttle_reasons(mask)]


def clocks_event_reasons_query(nvml: Any) -> Callable[[Any], int]:
    """NVML's query for the clocks-event mask: "ClocksEvent" replaced "ClocksThrottle" in newer NVML; older bindings
    only have the old name."""
    query = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
    if query is None:
        query = nvml.nvmlDeviceGetCurrentClocksThrottleReasons
    return cast(Callable[[Any], int], query)
