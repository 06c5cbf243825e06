"""Known GPUs and per-architecture limits that NVML does not report.

`KNOWN_GPUS` lets `t4serve plan --gpu t4` plan for a card on any machine. `shared_memory_per_block_optin` is the
CUDA programming guide's "maximum shared memory per thread block" (opt-in) per compute capability: NVML cannot read
it, and it decides whether vLLM's Triton attention needs the Turing clamp.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

from t4serve.units import GB, MIB

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
