"""The GPU probe: what NVML (nvidia-ml-py's `pynvml`) reports about the driver and every visible device.

`probe_gpu(environ, nvml)` never raises for a machine without a usable GPU: no `pynvml` module, no libnvidia-ml.so.1,
an NVML initialisation error or zero devices each become `GpuFacts` with `nvml_available`/`error` saying what was
missing. It records, never decides: whether a device is good enough is the preflight's question.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from typing import Any, Protocol, TypeVar

from t4serve.facts import GpuDevice, GpuFacts
from t4serve.gpus import shared_memory_per_block_optin

# The variables that decide which GPUs a container and CUDA see; recorded so an empty device list can be explained.
VISIBLE_DEVICES_VARIABLES = ("NVIDIA_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES")

# nvmlReturn_t codes from nvml.h (stable across driver releases), so the probe can word what each one means.
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18
# nvmlClockType_t
NVML_CLOCK_SM = 1
NVML_CLOCK_MEM = 2

_INIT_ERRORS: dict[int, str] = {
    NVML_ERROR_LIBRARY_NOT_FOUND: (
        "libnvidia-ml.so.1 not found: the NVIDIA driver is not mounted into this container "
        "(or not installed on this host)"
    ),
    NVML_ERROR_DRIVER_NOT_LOADED: (
        "libnvidia-ml.so.1 loaded but the NVIDIA kernel driver is not loaded (no /dev/nvidia* devices it can open)"
    ),
    NVML_ERROR_NO_PERMISSION: "NVML was denied access to the GPU device files (/dev/nvidia*)",
    NVML_ERROR_LIB_RM_VERSION_MISMATCH: (
        "libnvidia-ml.so.1 and the loaded NVIDIA kernel module are different driver versions "
        "(typically a driver upgrade without a reboot)"
    ),
}

T = TypeVar("T")


class NvmlMemory(Protocol):
    total: int
    free: int


class Nvml(Protocol):
    """The part of `pynvml` the probe uses. Tests pass a double with the same shape (tests/unit/test_probes_gpu.py)."""

    NVMLError: type[Exception]

    def nvmlInit(self) -> None: ...
    def nvmlShutdown(self) -> None: ...
    def nvmlSystemGetDriverVersion(self) -> str | bytes: ...
    def nvmlSystemGetCudaDriverVersion(self) -> int: ...
    def nvmlDeviceGetCount(self) -> int: ...
    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any: ...
    def nvmlDeviceGetName(self, handle: Any) -> str | bytes: ...
    def nvmlDeviceGetUUID(self, handle: Any) -> str | bytes: ...
    def nvmlDeviceGetCudaComputeCapability(self, handle: Any) -> tuple[int, int]: ...
    def nvmlDeviceGetMemoryInfo(self, handle: Any) -> NvmlMemory: ...
    def nvmlDeviceGetEnforcedPowerLimit(self, handle: Any) -> int: ...
    def nvmlDeviceGetPowerManagementLimitConstraints(self, handle: Any) -> list[int]: ...
    def nvmlDeviceGetMaxClockInfo(self, handle: Any, clock_type: int) -> int: ...
    def nvmlDeviceGetPciInfo(self, handle: Any) -> Any: ...


def probe_gpu(environ: Mapping[str, str], nvml: Nvml | None = None, on_host: bool = False) -> GpuFacts:
    """Driver, CUDA driver version and every device NVML sees. `nvml=None` imports `pynvml` here (not at module level,
    so commands that never look at the GPU don't load it). `on_host`: the host side's probe (its errors name no
    container)."""
    visible = {name: environ[name] for name in VISIBLE_DEVICES_VARIABLES if name in environ}
    if nvml is None:
        try:
            import pynvml
        except ImportError as exc:
            return GpuFacts(
                nvml_available=False,
                error=f"the Python module pynvml (package nvidia-ml-py) is not installed: {exc}",
                driver_version=None,
                cuda_driver_version=None,
                visible_devices_env=visible,
            )
        nvml = pynvml
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as exc:
        return GpuFacts(
            nvml_available=False,
            error=describe_init_error(exc, on_host),
            driver_version=None,
            cuda_driver_version=None,
            visible_devices_env=visible,
        )
    try:
        return _probe_initialised(nvml, visible)
    finally:
        # Shutting down only releases NVML's handles; a failure there leaves the facts already read true.
        with contextlib.suppress(nvml.NVMLError):
            nvml.nvmlShutdown()


def _probe_initialised(nvml: Nvml, visible: dict[str, str]) -> GpuFacts:
    problems: list[str] = []
    driver_version: str | None = None
    try:
        driver_version = _text(nvml.nvmlSystemGetDriverVersion())
    except nvml.NVMLError as exc:
        problems.append(f"driver version unreadable: {_nvml_error_text(exc)}")
    cuda_driver_version: tuple[int, int] | None = None
    try:
        cuda_driver_version = cuda_version_tuple(nvml.nvmlSystemGetCudaDriverVersion())
    except nvml.NVMLError as exc:
        problems.append(f"CUDA driver version unreadable: {_nvml_error_text(exc)}")
    try:
        count = nvml.nvmlDeviceGetCount()
    except nvml.NVMLError as exc:
        problems.append(f"device count unreadable: {_nvml_error_text(exc)}")
        count = 0
    devices: list[GpuDevice] = []
    for index in range(count):
        try:
            devices.append(_probe_device(nvml, index))
        except nvml.NVMLError as exc:
            # A device whose identity or memory cannot be read cannot be planned for; say which and why.
            problems.append(f"device {index} unreadable: {_nvml_error_text(exc)}")
    if count == 0 and not problems:
        shown = ", ".join(f"{k}={v}" for k, v in sorted(visible.items())) or "neither is set"
        problems.append(
            f"NVML reports no GPU: no device is visible to this container "
            f"(NVIDIA_VISIBLE_DEVICES / CUDA_VISIBLE_DEVICES: {shown})"
        )
    return GpuFacts(
        nvml_available=True,
        error="; ".join(problems) or None,
        driver_version=driver_version,
        cuda_driver_version=cuda_driver_version,
        devices=devices,
        visible_devices_env=visible,
    )


def _probe_device(nvml: Nvml, index: int) -> GpuDevice:
    handle = nvml.nvmlDeviceGetHandleByIndex(index)
    major, minor = nvml.nvmlDeviceGetCudaComputeCapability(handle)
    capability = (int(major), int(minor))
    memory = nvml.nvmlDeviceGetMemoryInfo(handle)
    unreadable: dict[str, str] = {}

    def optional(name: str, read: Callable[[], T]) -> T | None:
        # Power and clock queries are "Not Supported" on some boards and under some virtualisation: a None with its
        # reason, not a lost device.
        try:
            return read()
        except nvml.NVMLError as exc:
            unreadable[name] = _nvml_error_text(exc)
            return None

    power_limit_mw = optional("power_limit_w", lambda: nvml.nvmlDeviceGetEnforcedPowerLimit(handle))
    power_max_mw = optional("power_max_limit_w", lambda: nvml.nvmlDeviceGetPowerManagementLimitConstraints(handle)[1])
    sm_clock = optional("sm_clock_max_mhz", lambda: nvml.nvmlDeviceGetMaxClockInfo(handle, NVML_CLOCK_SM))
    memory_clock = optional("memory_clock_max_mhz", lambda: nvml.nvmlDeviceGetMaxClockInfo(handle, NVML_CLOCK_MEM))
    pci_bus_id = optional("pci_bus_id", lambda: _text(nvml.nvmlDeviceGetPciInfo(handle).busId))
    return GpuDevice(
        index=index,
        name=_text(nvml.nvmlDeviceGetName(handle)),
        uuid=_text(nvml.nvmlDeviceGetUUID(handle)),
        compute_capability=capability,
        memory_total_bytes=int(memory.total),
        memory_free_bytes=int(memory.free),
        shared_memory_per_block=shared_memory_per_block_optin(capability),
        # NVML reports milliwatts.
        power_limit_w=None if power_limit_mw is None else power_limit_mw / 1000,
        power_max_limit_w=None if power_max_mw is None else power_max_mw / 1000,
        sm_clock_max_mhz=None if sm_clock is None else int(sm_clock),
        memory_clock_max_mhz=None if memory_clock is None else int(memory_clock),
        pci_bus_id=pci_bus_id,
        unreadable=unreadable,
    )


def cuda_version_tuple(encoded: int) -> tuple[int, int]:
    """NVML's CUDA driver version, encoded as 1000 * major + 10 * minor (13000 -> (13, 0), 12080 -> (12, 8))."""
    return encoded // 1000, (encoded % 1000) // 10


# On the host (t4serve host-check) no container is involved: the library is missing because the driver is.
_HOST_LIBRARY_NOT_FOUND = "libnvidia-ml.so.1 not found: the NVIDIA driver is not installed on this host"


def describe_init_error(exc: Exception, on_host: bool = False) -> str:
    """What a failed nvmlInit means, in words naming what is missing (`on_host`: as the host sees it, no container)."""
    code = getattr(exc, "value", None)
    if on_host and code == NVML_ERROR_LIBRARY_NOT_FOUND:
        return f"{_HOST_LIBRARY_NOT_FOUND} [NVML: {exc}]"
    if isinstance(code, int) and code in _INIT_ERRORS:
        return f"{_INIT_ERRORS[code]} [NVML: {exc}]"
    return f"NVML initialisation failed: {_nvml_error_text(exc)}"


def _nvml_error_text(exc: Exception) -> str:
    code = getattr(exc, "value", None)
    return f"{exc} (NVML error {code})" if isinstance(code, int) else str(exc)


def _text(value: str | bytes) -> str:
    # pynvml returns str or bytes depending on its version and the call.
    return value.decode("utf-8", errors="replace") if isinstance(value, bytes) else str(value)
