"""t4serve.gpus: the known-GPU table, opt-in shared memory per capability, and NVML's clocks-event reasons."""

from __future__ import annotations

from types import SimpleNamespace

from t4serve.gpus import (
    KNOWN_GPUS,
    THROTTLE_REASONS,
    clocks_event_reasons_query,
    known_gpu,
    match_known_gpu,
    shared_memory_per_block_optin,
    throttle_labels,
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
