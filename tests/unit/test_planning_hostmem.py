"""Host RAM peak for loading, compared with MemAvailable + swap and the cgroup limit; the swap to add."""

from __future__ import annotations

from t4serve.config.aliases import BF16_REPO, QAT_REPO
from t4serve.facts import HostFacts, ModelFacts, TensorGroup
from t4serve.planning import hostmem
from t4serve.probes.checkpoint import probe_model
from t4serve.units import GIB, MIB


def model(total: int, files: int = 1) -> ModelFacts:
    return ModelFacts("a/b", None, "local-dir", config={}, safetensors_files=files,
                      weights=[TensorGroup("text_decoder", 1, {"BF16": total})])


def host(avail: int, swap_free: int = 0, limit: int | None = None, swap_limit: int | None = None) -> HostFacts:
    return HostFacts(cpu_count=2, mem_total_bytes=int(7.8e9), mem_available_bytes=avail, swap_total_bytes=swap_free,
                     swap_free_bytes=swap_free, cgroup_version=2, cgroup_memory_limit_bytes=limit,
                     cgroup_swap_limit_bytes=swap_limit, shm_total_bytes=None, shm_free_bytes=None)


def test_reproduces_both_published_peaks_for_the_built_in_facts() -> None:
    """The fit's checkpoint sizes are the aliases' built-in facts, so `plan` gives each its published peak."""
    bf16 = hostmem.estimate(probe_model(BF16_REPO, hf_home="/nonexistent", offline=True), None).need_bytes.value
    qat = hostmem.estimate(probe_model(QAT_REPO, hf_home="/nonexistent", offline=True), None).need_bytes.value
    assert abs(bf16 - (7.8e9 + 6761 * MIB)) < 1e6
    assert abs(qat - (7.8e9 + 4770 * MIB)) < 1e6


def test_swap_to_add_is_the_shortfall_in_whole_gib() -> None:
    m = model(10_246_357_062)
    need = hostmem.estimate(m, None).need_bytes.value
    h = hostmem.estimate(m, host(7 * GIB))
    assert h.swap_to_add_bytes.value == -(-(need - 7 * GIB) // GIB) * GIB
    assert "scripts/setup-swap" in h.swap_to_add_bytes.how
    assert hostmem.estimate(m, host(7 * GIB, swap_free=16 * GIB)).swap_to_add_bytes.value == 0


def test_cgroup_limit_caps_usable_and_says_swap_does_not_help() -> None:
    h = hostmem.estimate(model(10_246_357_062), host(30 * GIB, swap_free=16 * GIB, limit=8 * GIB))
    assert h.available_bytes is not None and h.available_bytes.value == 8 * GIB
    assert any("memory limit" in n and "--memory" in n for n in h.notes)


def test_eager_loading_costs_two_files_more() -> None:
    h = hostmem.estimate(model(4 * GIB, files=2), None)
    assert h.eager_need_bytes.value - h.need_bytes.value == 2 * 2 * GIB
    assert "lazy" in h.eager_need_bytes.how
