"""The probes on a real NVIDIA GPU: NVML answers with real values, and `t4serve probe --json` / `t4serve preflight`
read the same device. Run with `-s` to see the facts and the commands' output (the issue note quotes them)."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import tempfile

import pytest

from t4serve.facts import Facts, GpuFacts
from t4serve.gpus import shared_memory_per_block_optin
from t4serve.probes import collect_facts

pytestmark = pytest.mark.gpu

# The CUDA 13 wheels need a driver of this branch or newer (published-t4-run.md).
CUDA13_DRIVER_MAJOR = 580


def test_nvml_reads_real_values(gpu_facts: GpuFacts) -> None:
    assert gpu_facts.error is None, gpu_facts.error
    driver = gpu_facts.driver_version
    assert driver is not None and re.fullmatch(r"\d+\.\d+(\.\d+)?", driver), driver
    assert gpu_facts.cuda_driver_version is not None
    if int(driver.split(".")[0]) >= CUDA13_DRIVER_MAJOR:
        assert gpu_facts.cuda_driver_version >= (13, 0), (driver, gpu_facts.cuda_driver_version)
    for device in gpu_facts.devices:
        assert device.name and device.uuid.startswith(("GPU-", "MIG-")), device
        assert device.compute_capability >= (7, 5), device
        assert 0 < device.memory_free_bytes <= device.memory_total_bytes, device
        assert device.shared_memory_per_block == shared_memory_per_block_optin(device.compute_capability)
        if device.power_limit_w is not None:
            assert device.power_limit_w > 0
            assert device.power_max_limit_w is None or device.power_max_limit_w >= device.power_limit_w
        if device.sm_clock_max_mhz is not None:
            assert device.sm_clock_max_mhz > 0
        assert device.pci_bus_id is None or re.fullmatch(
            r"[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.\d", device.pci_bus_id
        )


def test_collect_facts_on_this_machine(gpu_facts: GpuFacts) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        facts = collect_facts(
            environ=os.environ,
            disk_paths={"tmp": tmp},
            ports=[],
            manifest_path=os.environ.get("T4SERVE_MANIFEST", "/etc/t4serve/build-manifest.json"),
            model=None,
        )
    print(facts.to_json())
    assert [d.uuid for d in facts.gpu.devices] == [d.uuid for d in gpu_facts.devices]
    assert Facts.from_json(facts.to_json()) == facts


def _command_exists(name: str) -> bool:
    return importlib.util.find_spec(f"t4serve.commands.{name}") is not None


def _run_t4serve(*args: str) -> subprocess.CompletedProcess[str]:
    # Offline: the device machines reach no network, and these tests are about the GPU, not downloads.
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    result = subprocess.run(
        [sys.executable, "-m", "t4serve", *args], capture_output=True, text=True, env=env, timeout=300, check=False
    )
    print(f"$ t4serve {' '.join(args)}  (exit {result.returncode})")
    print(result.stdout)
    print(result.stderr, file=sys.stderr)
    return result


def test_probe_command_reads_the_gpu(gpu_facts: GpuFacts) -> None:
    # A missing command is a broken tree, not a machine without a GPU: it fails, it is not skipped.
    assert _command_exists("probe"), "t4serve has no `probe` command in this tree"
    result = _run_t4serve("probe", "--json")
    assert result.returncode == 0, result.stderr
    facts = Facts.from_json(result.stdout)
    assert facts.gpu.nvml_available
    assert [d.uuid for d in facts.gpu.devices] == [d.uuid for d in gpu_facts.devices]
    assert facts.gpu.driver_version == gpu_facts.driver_version


def test_preflight_command_finds_the_gpu(gpu_facts: GpuFacts) -> None:
    assert _command_exists("preflight"), "t4serve has no `preflight` command in this tree"
    result = _run_t4serve("preflight")
    # 0: all checks pass; 3: some fail (outside the image the build manifest is missing). Either way it ran.
    assert result.returncode in (0, 3), result.stderr
    output = result.stdout + result.stderr
    assert "NVML unavailable" not in output
    assert gpu_facts.devices[0].name in output
