"""The recorded fact files shipped in the package (data/facts): they replay exactly, and say what they stand for.

t4-published.json is constructed from published-t4-run.md (the T4 host); no-gpu.json was probed on the GPU-less CI
machine. Plan and preflight tests replay them instead of mocking a machine.
"""

from __future__ import annotations

import json
from importlib import resources

import pytest

from t4serve.errors import ConfigError
from t4serve.facts import Facts
from t4serve.serde import to_dict
from t4serve.units import GIB, MIB

SHIPPED = ("t4-published.json", "no-gpu.json")


def shipped_text(name: str) -> str:
    # Through importlib.resources, as an installed package finds them (pyproject's package-data lists data/facts).
    return (resources.files("t4serve") / "data" / "facts" / name).read_text(encoding="utf-8")


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_facts_round_trip_exactly(name: str) -> None:
    text = shipped_text(name)
    facts = Facts.from_json(text)
    assert facts.to_json() == text
    # Every key in the file is a field (from_json refuses unknown keys), and every field is in the file.
    assert json.loads(text) == to_dict(facts)


def test_t4_published_matches_facts_md() -> None:
    facts = Facts.from_json(shipped_text("t4-published.json"))
    assert facts.provenance.startswith("constructed from published-t4-run.md, not probed")
    gpu = facts.gpu
    assert gpu.nvml_available and gpu.error is None
    assert gpu.driver_version is not None and gpu.driver_version.split(".")[0] == "580"
    assert gpu.cuda_driver_version == (13, 0)
    [t4] = gpu.devices
    assert (t4.name, t4.compute_capability, t4.memory_total_bytes) == ("Tesla T4", (7, 5), 15360 * MIB)
    assert (t4.power_limit_w, t4.power_max_limit_w, t4.sm_clock_max_mhz) == (70.0, 70.0, 1590)
    assert t4.shared_memory_per_block == 65536
    host = facts.host
    assert (host.cpu_count, round(host.mem_total_bytes / GIB, 1)) == (2, 7.8)
    assert (host.swap_total_bytes, host.swap_free_bytes) == (0, 0)
    disks = {d.role: d for d in host.disks}
    # Three filesystems: the small root disk, /tmp on its own, the model cache on a large volume.
    assert len({d.filesystem_id for d in host.disks}) == 3
    assert round(disks["compile_cache"].free_bytes / GIB, 1) == 8.7
    assert round(disks["tmp"].total_bytes / GIB, 1) == 3.9
    assert disks["state"].filesystem_id == disks["tmp"].filesystem_id
    assert disks["hf_cache"].free_bytes > 100 * GIB
    manifest = facts.manifest
    assert manifest.present and (manifest.torch_version, manifest.torch_cuda_version) == ("2.14.0", "13.0")
    assert "sm_75" in manifest.torch_arch_list and manifest.vllm_version == "0.33.0"
    assert manifest.clamp is not None and manifest.clamp.state == "applied"
    assert max(manifest.clamp.shared_memory.values()) == 65536
    assert manifest.clamp.unpatched_shared_memory == 98304


def test_no_gpu_was_probed_here_and_records_why() -> None:
    facts = Facts.from_json(shipped_text("no-gpu.json"))
    assert facts.provenance.startswith("probed on a GPU-less CI machine")
    assert not facts.gpu.nvml_available and facts.gpu.devices == []
    assert facts.gpu.error is not None and facts.gpu.error.startswith("libnvidia-ml.so.1 not found")
    assert not facts.manifest.present
    assert facts.manifest.error is not None and "not running in the t4serve image" in facts.manifest.error
    assert facts.host.mem_total_bytes > 0 and facts.host.cpu_count >= 1
    assert {d.role for d in facts.host.disks} == {
        "hf_cache",
        "compile_cache",
        "triton_cache",
        "inductor_cache",
        "tmp",
        "state",
    }


def test_a_file_from_another_version_fails_loudly() -> None:
    data = json.loads(shipped_text("no-gpu.json"))
    data["host"]["numa_nodes"] = 1
    with pytest.raises(ConfigError, match=r"unknown keys \['numa_nodes'\]"):
        Facts.from_json(json.dumps(data))
