"""Fixtures for tests that need a real NVIDIA GPU. Where NVML or a device is absent every test here is skipped with
the reason the GPU probe recorded (e.g. "libnvidia-ml.so.1 not found: ..."), so the skip says what is missing."""

from __future__ import annotations

import os

import pytest

from t4serve.facts import GpuFacts
from t4serve.probes.gpu import probe_gpu


@pytest.fixture(scope="session")
def gpu_facts() -> GpuFacts:
    facts = probe_gpu(os.environ)
    if not facts.nvml_available:
        pytest.skip(f"no NVIDIA GPU through NVML here: {facts.error}")
    if not facts.devices:
        pytest.skip(f"NVML loaded (driver {facts.driver_version}) but no GPU is visible: {facts.error}")
    return facts
