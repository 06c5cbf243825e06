"""Facts for plan/preflight/pipeline/CLI tests: the published T4 host of published-t4-run.md, and variants of it.

The T4 host: Tesla T4 (7.5, 15360 MiB, 70 W), 2 vCPU, 7.8 GB RAM plus the 16 GB swapfile it needed to load; /tmp a
separate 3.9 GB filesystem, the model cache on a large separate volume. The image side is what docker/ builds:
torch 2.14.0 cu130 (arch list sm_75 .. sm_120), vLLM 0.33.0 with the clamp applied and proven.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from t4serve.config.aliases import BF16_REPO, QAT_REPO
from t4serve.facts import (
    BuildManifest,
    ClampProof,
    DiskFacts,
    Facts,
    GpuDevice,
    GpuFacts,
    HostFacts,
    ModelFacts,
    TuringAttentionProof,
)
from t4serve.probes.checkpoint import probe_model
from t4serve.units import GIB, MIB

T4 = GpuDevice(
    index=0,
    name="Tesla T4",
    uuid="GPU-00000000-0000-0000-0000-000000000000",
    compute_capability=(7, 5),
    memory_total_bytes=15360 * MIB,
    memory_free_bytes=14930 * MIB,
    shared_memory_per_block=65536,
    power_limit_w=70.0,
    power_max_limit_w=70.0,
    sm_clock_max_mhz=1590,
    memory_clock_max_mhz=5001,
)


def disks(tmp_free: int = 3_900_000_000, cache_free: int = 200 * GIB) -> list[DiskFacts]:
    """The model and compile caches share the big volume (filesystem 3); tmp and state share /tmp (filesystem 2)."""
    return [
        DiskFacts("hf_cache", "/cache/huggingface", "/cache", cache_free, 500 * GIB, True, 3),
        DiskFacts("compile_cache", "/cache/compile", "/cache", cache_free, 500 * GIB, True, 3),
        DiskFacts("tmp", "/tmp", "/tmp", tmp_free, 3_900_000_000, True, 2),
        DiskFacts("state", "/tmp/t4serve", "/tmp", tmp_free, 3_900_000_000, True, 2),
    ]


HOST = HostFacts(
    cpu_count=2,
    mem_total_bytes=7_800_000_000,
    mem_available_bytes=7_000_000_000,
    # The 16 GB swapfile that let the published run load (published-t4-run.md); tests take it away to see the finding.
    swap_total_bytes=16 * GIB,
    swap_free_bytes=16 * GIB,
    cgroup_version=2,
    cgroup_memory_limit_bytes=None,
    cgroup_swap_limit_bytes=None,
    shm_total_bytes=2 * GIB,
    shm_free_bytes=2 * GIB,
    disks=disks(),
    ports_in_use=[22],
)

MANIFEST = BuildManifest(
    path="/etc/t4serve/build-manifest.json",
    present=True,
    python_version="3.13.5",
    torch_version="2.14.0+cu130",
    torch_cuda_version="13.0",
    torch_arch_list=["sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120"],
    vllm_version="0.33.0",
    clamp=ClampProof(
        state="applied",
        vllm_version="0.33.0",
        target="vllm/v1/attention/ops/triton_unified_attention.py:_get_tile_size",
        source_sha256="0" * 64,
        shared_memory={"2d/prefill/head512/tile16": 65536, "2d/prefill/head256/tile32": 49152},
        unpatched_shared_memory=98304,
    ),
)


# What the image's turing-attention stage proves (`t4serve attention prove`: 16 launches, heads 64-512, two caches).
TURING_PROOF = TuringAttentionProof(
    path="/etc/t4serve/turing-attention-proof.json", present=True, vllm_version="0.33.0", launches=16,
    tensor_core_launches=16, padded_heads=[64, 128, 256, 512], kv_caches=["16-bit", "int8"],
    largest_shared_memory_bytes=65536, most_spill_bytes=0,
)


def model(name: str = QAT_REPO) -> ModelFacts:
    """The aliases' built-in facts (offline, empty HF cache): what a fresh machine plans with."""
    facts = probe_model(name, hf_home="/nonexistent-hf-home", offline=True)
    assert facts.source == "builtin", facts
    return facts


def t4(**changes: Any) -> Facts:
    """The published T4 host, with top-level fields replaced by `changes`."""
    base = Facts(
        schema=1,
        t4serve_version="0.1.0",
        recorded_at="2026-12-01T00:00:00Z",
        hostname="t4-vm",
        gpu=GpuFacts(True, None, "580.95.05", (13, 0), [T4], {"NVIDIA_VISIBLE_DEVICES": "all"}),
        host=HOST,
        manifest=MANIFEST,
        model=model(),
        provenance="constructed from published-t4-run.md (tests/unit/sample_facts.py)",
        turing_attention=TURING_PROOF,
    )
    return dataclasses.replace(base, **changes)


def no_gpu(**changes: Any) -> Facts:
    """This GPU-less machine's shape: no NVML library, no manifest (outside the image)."""
    return t4(
        gpu=GpuFacts(False, "NVML library not found (libnvidia-ml.so.1)", None, None, [], {}),
        manifest=BuildManifest(path="/etc/t4serve/build-manifest.json", present=False, error="no such file"),
        **changes,
    )


def with_gpu(facts: Facts, **changes: Any) -> Facts:
    return dataclasses.replace(facts, gpu=dataclasses.replace(facts.gpu, devices=[dataclasses.replace(T4, **changes)]))


def with_host(facts: Facts, **changes: Any) -> Facts:
    return dataclasses.replace(facts, host=dataclasses.replace(facts.host, **changes))


def with_manifest(facts: Facts, **changes: Any) -> Facts:
    return dataclasses.replace(facts, manifest=dataclasses.replace(facts.manifest, **changes))


__all__ = [
    "BF16_REPO",
    "GIB",
    "MIB",
    "QAT_REPO",
    "T4",
    "model",
    "no_gpu",
    "t4",
    "with_gpu",
    "with_host",
    "with_manifest",
]
