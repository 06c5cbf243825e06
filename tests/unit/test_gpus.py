"""t4serve.gpus: the known-GPU table, opt-in shared memory per capability, and NVML's clocks-event reasons."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from t4serve.gpus import (
    KNOWN_GPUS,
    THROTTLE_REASONS,
    clocks_event_reasons_query,
    default_max_num_batched_tokens,
    known_gpu,
    match_known_gpu,
    shared_memory_per_block_optin,
    throttle_labels,
    vllm_batch_defaults,
)
from t4serve.units import GB, MIB


def test_turing_has_64_kib_and_unknown_capabilities_fall_back_safely() -> None:
    assert shared_memory_per_block_optin((7, 5)) == 64 * 1024
    assert shared_memory_per_block_optin((8, 0)) == 163 * 1024
    assert shared_memory_per_block_optin((8, 8)) == 99 * 1024  # an unlisted 8.x: its family's smallest
    assert shared_memory_per_block_optin((6, 1)) == 64 * 1024  # older than Volta: the most restrictive listed


def test_the_t4_entry_and_matching_nvml_names() -> None:
    t4 = known_gpu("t4")
    assert t4 is not None and t4 is KNOWN_GPUS["t4"]
    assert (t4.memory_bytes, t4.bandwidth, t4.shared_memory_per_block) == (15360 * MIB, 277.0 * GB, 64 * 1024)
    assert match_known_gpu("Tesla T4") is t4
    assert match_known_gpu("NVIDIA L4") is KNOWN_GPUS["l4"]
    assert match_known_gpu("Some Other Card") is None


def test_throttle_table_bits_are_distinct_single_bits() -> None:
    bits = [bit for bit, _key, _label in THROTTLE_REASONS]
    assert len(set(bits)) == len(bits) and all(bit & (bit - 1) == 0 for bit in bits)


def test_throttle_labels_in_nvidia_smi_words() -> None:
    assert throttle_labels(0) == []
    assert throttle_labels(0x4 | 0x40) == ["SW power cap", "HW thermal slowdown"]
    assert throttle_labels(0x1 | 0x10000) == ["GPU idle", "unknown_0x10000"]


def test_clocks_event_query_prefers_the_new_name() -> None:
    """The SimpleNamespaces stand for pynvml bindings, new (both names) and old (only the throttle name)."""

    def new(handle: object) -> int:
        return 4

    def old(handle: object) -> int:
        return 8

    both = SimpleNamespace(nvmlDeviceGetCurrentClocksEventReasons=new, nvmlDeviceGetCurrentClocksThrottleReasons=old)
    assert clocks_event_reasons_query(both)("h") == 4
    assert clocks_event_reasons_query(SimpleNamespace(nvmlDeviceGetCurrentClocksThrottleReasons=old))("h") == 8


def test_default_max_num_batched_tokens_by_memory() -> None:
    gib = 1024**3
    assert default_max_num_batched_tokens(15 * gib) == 2048
    assert default_max_num_batched_tokens(80 * gib, "NVIDIA A100-SXM4-80GB") == 2048
    assert default_max_num_batched_tokens(80 * gib, "NVIDIA H100 80GB HBM3") == 8192
    assert default_max_num_batched_tokens(180 * gib) == 16384


# vLLM 0.33 EngineArgs.get_batch_defaults, read for each card of the known table (name, memory, capability as the
# table has them); tests/image/test_kv_oracle_families.py asks vLLM's own function the same for every card.
KNOWN_GPU_BATCH_DEFAULTS = {
    "t4": (2048, 256),
    "rtx2080ti": (2048, 256),
    "a10g": (2048, 256),
    "l4": (2048, 256),
    "a100": (2048, 256),  # 80 GiB, but vLLM keeps A100s on the small tier by name
    "h100": (8192, 1024),
    "h200": (8192, 1024),
}


@pytest.mark.parametrize("key", sorted(KNOWN_GPUS))
def test_batch_defaults_of_every_known_gpu(key: str) -> None:
    gpu = KNOWN_GPUS[key]
    got = vllm_batch_defaults(gpu.memory_bytes, gpu.name, gpu.compute_capability)
    assert (got.max_num_batched_tokens, got.max_num_seqs) == KNOWN_GPU_BATCH_DEFAULTS[key]


def test_batch_defaults_tiers_by_memory_name_and_capability() -> None:
    gib = 1024**3
    assert (vllm_batch_defaults(180 * gib, "NVIDIA B200", (10, 0)).max_num_seqs) == 1024
    assert vllm_batch_defaults(180 * gib, "NVIDIA B200", (10, 0)).max_num_batched_tokens == 16384
    # The name check is vLLM's: lowercased substring, so any A100 of 70 GiB or more stays small.
    assert vllm_batch_defaults(80 * gib, "A100-PCIE-80GB", (8, 0)).max_num_seqs == 256
    # GB10 (DGX Spark) reports 119 GiB of unified memory but is kept on the small tier by its capability.
    gb10 = vllm_batch_defaults(119 * gib, "NVIDIA GB10", (12, 1))
    assert (gb10.max_num_batched_tokens, gb10.max_num_seqs) == (2048, 256)
    assert "GB10" in gb10.tier
    # Just under 70 GiB is the small tier whatever the name.
    assert vllm_batch_defaults(70 * gib - 1, "NVIDIA H100", (9, 0)).max_num_seqs == 256


def test_the_settings_docs_name_the_tiers_vllm_batches_by() -> None:
    from t4serve.config.settings import VARIABLES_BY_NAME

    assert "(2048 below 70 GiB and on an A100, 8192 from 70 GiB, 16384 from 160 GiB)" in \
        VARIABLES_BY_NAME["T4SERVE_MAX_NUM_BATCHED_TOKENS"].doc
    assert "(256; 1024 on 70 GiB or more but an A100)" in VARIABLES_BY_NAME["T4SERVE_MAX_NUM_SEQS"].doc
