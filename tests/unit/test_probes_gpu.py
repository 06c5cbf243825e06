"""t4serve.probes.gpu against a test double of NVML (FakeNvml stands for pynvml + libnvidia-ml.so.1, which need a
GPU), and for real on this machine: without a GPU the probe must record why, never raise."""

from __future__ import annotations

import ctypes
import sys
from dataclasses import dataclass, field
from typing import ClassVar

import pytest

from t4serve.probes import gpu as gpu_probe
from t4serve.probes.gpu import cuda_version_tuple, probe_gpu
from t4serve.units import MIB


class FakeNvmlError(Exception):
    """pynvml.NVMLError's shape: the nvmlReturn_t code in `.value`, NVML's own text as the message."""

    TEXT: ClassVar[dict[int, str]] = {
        3: "Not Supported",
        4: "Insufficient Permissions",
        9: "Driver Not Loaded",
        12: "NVML Shared Library Not Found",
        13: "Function Not Found",
        15: "GPU is lost",
        18: "RM has detected an NVML/RM version mismatch.",
        999: "Unknown Error",
    }

    def __init__(self, value: int) -> None:
        self.value = value
        super().__init__(self.TEXT.get(value, f"NVML error {value}"))


@dataclass
class FakeDevice:
    name: str | bytes = "Tesla T4"
    uuid: str | bytes = "GPU-3b1f9e2a-5d0c-4b7e-9a61-0c2d4e6f8a10"
    capability: tuple[int, int] = (7, 5)
    total: int = 15360 * MIB
    free: int = 15095 * MIB
    power_limit_mw: int = 70000
    power_max_mw: int = 70000
    sm_clock: int = 1590
    memory_clock: int = 5001
    bus_id: bytes = b"00000000:00:04.0"
    # NVML function name -> nvmlReturn_t code it fails with for this device.
    failing: dict[str, int] = field(default_factory=dict)


@dataclass
class _Memory:
    total: int
    free: int


@dataclass
class _PciInfo:
    busId: bytes  # pynvml's field name


class FakeNvml:
    """The pynvml functions the probe calls, answering from FakeDevice records as the real library would."""

    NVMLError = FakeNvmlError

    def __init__(
        self,
        devices: list[FakeDevice],
        *,
        driver: str | bytes = "580.95.05",
        cuda: int = 13000,
        init_error: int | None = None,
        failing: dict[str, int] | None = None,
    ) -> None:
        self.devices = devices
        self.driver = driver
        self.cuda = cuda
        self.init_error = init_error
        self.failing = failing or {}
        self.initialised = False
        self.shutdowns = 0

    def _check(self, function: str, device: FakeDevice | None = None) -> None:
        if not self.initialised:
            raise FakeNvmlError(1)  # NVML_ERROR_UNINITIALIZED: the probe must init first
        code = (device.failing if device else self.failing).get(function)
        if code is not None:
            raise FakeNvmlError(code)

    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise FakeNvmlError(self.init_error)
        self.initialised = True

    def nvmlShutdown(self) -> None:
        self._check("nvmlShutdown")
        self.shutdowns += 1
        self.initialised = False

    def nvmlSystemGetDriverVersion(self) -> str | bytes:
        self._check("nvmlSystemGetDriverVersion")
        return self.driver

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        self._check("nvmlSystemGetCudaDriverVersion")
        return self.cuda

    def nvmlDeviceGetCount(self) -> int:
        self._check("nvmlDeviceGetCount")
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeDevice:
        self._check("nvmlDeviceGetHandleByIndex")
        return self.devices[index]

    def nvmlDeviceGetName(self, handle: FakeDevice) -> str | bytes:
        self._check("nvmlDeviceGetName", handle)
        return handle.name

    def nvmlDeviceGetUUID(self, handle: FakeDevice) -> str | bytes:
        self._check("nvmlDeviceGetUUID", handle)
        return handle.uuid

    def nvmlDeviceGetCudaComputeCapability(self, handle: FakeDevice) -> tuple[int, int]:
        self._check("nvmlDeviceGetCudaComputeCapability", handle)
        return handle.capability

    def nvmlDeviceGetMemoryInfo(self, handle: FakeDevice) -> _Memory:
        self._check("nvmlDeviceGetMemoryInfo", handle)
        return _Memory(handle.total, handle.free)

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: FakeDevice) -> int:
        self._check("nvmlDeviceGetEnforcedPowerLimit", handle)
        return handle.power_limit_mw

    def nvmlDeviceGetPowerManagementLimitConstraints(self, handle: FakeDevice) -> list[int]:
        self._check("nvmlDeviceGetPowerManagementLimitConstraints", handle)
        return [handle.power_limit_mw // 2, handle.power_max_mw]

    def nvmlDeviceGetMaxClockInfo(self, handle: FakeDevice, clock_type: int) -> int:
        self._check("nvmlDeviceGetMaxClockInfo", handle)
        return {1: handle.sm_clock, 2: handle.memory_clock}[clock_type]

    def nvmlDeviceGetPciInfo(self, handle: FakeDevice) -> _PciInfo:
        self._check("nvmlDeviceGetPciInfo", handle)
        return _PciInfo(handle.bus_id)


ENV = {"NVIDIA_VISIBLE_DEVICES": "all", "CUDA_VISIBLE_DEVICES": "0", "HOME": "/home/t4serve"}


def test_t4_is_read_field_by_field() -> None:
    nvml = FakeNvml([FakeDevice()])
    facts = probe_gpu(ENV, nvml)
    assert facts.nvml_available and facts.error is None
    assert facts.driver_version == "580.95.05"
    assert facts.cuda_driver_version == (13, 0)
    assert facts.visible_devices_env == {"NVIDIA_VISIBLE_DEVICES": "all", "CUDA_VISIBLE_DEVICES": "0"}
    [t4] = facts.devices
    assert (t4.index, t4.name, t4.compute_capability) == (0, "Tesla T4", (7, 5))
    assert t4.uuid == "GPU-3b1f9e2a-5d0c-4b7e-9a61-0c2d4e6f8a10"
    assert (t4.memory_total_bytes, t4.memory_free_bytes) == (15360 * MIB, 15095 * MIB)
    assert t4.shared_memory_per_block == 65536  # the Turing opt-in limit the clamp is about
    assert (t4.power_limit_w, t4.power_max_limit_w) == (70.0, 70.0)  # NVML's milliwatts -> watts
    assert (t4.sm_clock_max_mhz, t4.memory_clock_max_mhz) == (1590, 5001)
    assert t4.pci_bus_id == "00000000:00:04.0"
    assert t4.unreadable == {}
    assert nvml.shutdowns == 1


def test_bytes_from_older_pynvml_are_decoded_and_devices_keep_their_order() -> None:
    devices = [
        FakeDevice(name=b"Tesla T4", uuid=b"GPU-aaaa"),
        FakeDevice(name="NVIDIA H200", uuid="GPU-bbbb", capability=(9, 0), total=143771 * MIB, power_limit_mw=700000),
    ]
    facts = probe_gpu({}, FakeNvml(devices, driver=b"580.95.05"))
    assert facts.driver_version == "580.95.05"
    assert [(d.index, d.name, d.uuid) for d in facts.devices] == [
        (0, "Tesla T4", "GPU-aaaa"),
        (1, "NVIDIA H200", "GPU-bbbb"),
    ]
    assert facts.devices[1].shared_memory_per_block == 227 * 1024
    assert facts.devices[1].power_limit_w == 700.0
    assert facts.visible_devices_env == {}


@pytest.mark.parametrize(
    ("encoded", "expected"), [(13000, (13, 0)), (12080, (12, 8)), (11040, (11, 4)), (13010, (13, 1))]
)
def test_cuda_driver_version_decoding(encoded: int, expected: tuple[int, int]) -> None:
    assert cuda_version_tuple(encoded) == expected


@pytest.mark.parametrize(
    ("code", "words"),
    [
        (12, "libnvidia-ml.so.1 not found: the NVIDIA driver is not mounted into this container"),
        (9, "the NVIDIA kernel driver is not loaded"),
        (4, "denied access to the GPU device files"),
        (18, "different driver versions"),
        (999, "NVML initialisation failed: Unknown Error (NVML error 999)"),
    ],
)
def test_init_failure_is_a_fact_naming_what_is_missing(code: int, words: str) -> None:
    nvml = FakeNvml([FakeDevice()], init_error=code)
    facts = probe_gpu({"NVIDIA_VISIBLE_DEVICES": "void"}, nvml)
    assert not facts.nvml_available
    assert facts.error is not None and words in facts.error
    assert (facts.driver_version, facts.cuda_driver_version, facts.devices) == (None, None, [])
    assert facts.visible_devices_env == {"NVIDIA_VISIBLE_DEVICES": "void"}
    assert nvml.shutdowns == 0  # nothing to shut down after a failed init


def test_zero_devices_says_none_is_visible_and_shows_the_variables() -> None:
    facts = probe_gpu({"NVIDIA_VISIBLE_DEVICES": "none"}, FakeNvml([]))
    assert facts.nvml_available and facts.devices == []
    assert facts.driver_version == "580.95.05"
    assert facts.error is not None
    assert "NVML reports no GPU" in facts.error and "NVIDIA_VISIBLE_DEVICES=none" in facts.error


def test_unsupported_power_and_clock_queries_leave_none_with_the_reason() -> None:
    device = FakeDevice(
        failing={
            "nvmlDeviceGetEnforcedPowerLimit": 3,
            "nvmlDeviceGetPowerManagementLimitConstraints": 3,
            "nvmlDeviceGetMaxClockInfo": 4,
            "nvmlDeviceGetPciInfo": 3,
        }
    )
    facts = probe_gpu({}, FakeNvml([device]))
    [dev] = facts.devices
    assert facts.error is None
    assert (dev.power_limit_w, dev.power_max_limit_w, dev.sm_clock_max_mhz, dev.memory_clock_max_mhz) == (None,) * 4
    assert dev.pci_bus_id is None
    assert dev.unreadable == {
        "power_limit_w": "Not Supported (NVML error 3)",
        "power_max_limit_w": "Not Supported (NVML error 3)",
        "sm_clock_max_mhz": "Insufficient Permissions (NVML error 4)",
        "memory_clock_max_mhz": "Insufficient Permissions (NVML error 4)",
        "pci_bus_id": "Not Supported (NVML error 3)",
    }
    assert dev.memory_total_bytes == 15360 * MIB  # the device itself is still usable


def test_a_lost_device_is_named_and_the_others_are_kept() -> None:
    lost = FakeDevice(uuid="GPU-lost", failing={"nvmlDeviceGetMemoryInfo": 15})
    facts = probe_gpu({}, FakeNvml([lost, FakeDevice(uuid="GPU-ok")]))
    assert [d.uuid for d in facts.devices] == ["GPU-ok"]
    assert facts.devices[0].index == 1
    assert facts.error == "device 0 unreadable: GPU is lost (NVML error 15)"


def test_an_old_driver_without_the_cuda_version_query_still_lists_devices() -> None:
    nvml = FakeNvml([FakeDevice()], failing={"nvmlSystemGetCudaDriverVersion": 13})
    facts = probe_gpu({}, nvml)
    assert facts.cuda_driver_version is None
    assert facts.error == "CUDA driver version unreadable: Function Not Found (NVML error 13)"
    assert len(facts.devices) == 1


def test_a_failing_shutdown_does_not_lose_the_facts() -> None:
    facts = probe_gpu({}, FakeNvml([FakeDevice()], failing={"nvmlShutdown": 999}))
    assert facts.nvml_available and len(facts.devices) == 1


def test_no_pynvml_module_is_a_fact(monkeypatch: pytest.MonkeyPatch) -> None:
    # None in sys.modules makes `import pynvml` raise ImportError, as when nvidia-ml-py is not installed.
    monkeypatch.setitem(sys.modules, "pynvml", None)
    facts = probe_gpu({"NVIDIA_VISIBLE_DEVICES": "all"})
    assert not facts.nvml_available
    assert facts.error is not None and "pynvml (package nvidia-ml-py) is not installed" in facts.error
    assert facts.visible_devices_env == {"NVIDIA_VISIBLE_DEVICES": "all"}


def _nvml_library_loads() -> bool:
    try:
        ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return False
    return True


@pytest.mark.skipif(_nvml_library_loads(), reason="this machine has libnvidia-ml.so.1: tests/gpu probes it for real")
def test_real_probe_on_this_gpu_less_machine() -> None:
    facts = probe_gpu({"NVIDIA_VISIBLE_DEVICES": "all"})
    assert not facts.nvml_available
    assert facts.error is not None
    assert facts.error.startswith("libnvidia-ml.so.1 not found: the NVIDIA driver is not mounted into this container")
    assert facts.devices == []


def test_the_double_and_the_real_pynvml_have_every_function_the_probe_calls() -> None:
    # The double must not drift from the protocol the probe is typed against, nor the protocol from pynvml itself,
    # or these tests prove nothing about the real library.
    import pynvml

    wanted = {name for name in vars(gpu_probe.Nvml) if name.startswith("nvml")}
    assert len(wanted) == 14
    for implementation in (FakeNvml, pynvml):
        missing = sorted(name for name in wanted if not callable(getattr(implementation, name, None)))
        assert missing == [], implementation
    assert issubclass(pynvml.NVMLError, Exception)
    assert (pynvml.NVML_CLOCK_SM, pynvml.NVML_CLOCK_MEM) == (gpu_probe.NVML_CLOCK_SM, gpu_probe.NVML_CLOCK_MEM)
    assert pynvml.NVML_ERROR_LIBRARY_NOT_FOUND == gpu_probe.NVML_ERROR_LIBRARY_NOT_FOUND
    assert pynvml.NVML_ERROR_DRIVER_NOT_LOADED == gpu_probe.NVML_ERROR_DRIVER_NOT_LOADED
    assert pynvml.NVML_ERROR_NO_PERMISSION == gpu_probe.NVML_ERROR_NO_PERMISSION
    assert pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH == gpu_probe.NVML_ERROR_LIB_RM_VERSION_MISMATCH
