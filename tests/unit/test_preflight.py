"""Preflight: each finding triggered by a fact that should trigger it, and cleared by the fact that fixes it."""

from __future__ import annotations

import dataclasses
import json

import pytest
from sample_facts import GIB, MIB, no_gpu, t4, with_gpu, with_host, with_manifest

from t4serve.config.settings import Settings
from t4serve.errors import ConfigError
from t4serve.facts import DiskFacts, Facts, GpuFacts
from t4serve.gpus import arch_supported
from t4serve.pipeline import ensure_model, prepare, with_known_gpu
from t4serve.planning.derived import format_bytes
from t4serve.preflight import (
    IMAGE_BYTES,
    Finding,
    format_table,
    has_failures,
    run_checks,
    to_json,
)

BASE_ENV = {"HF_HOME": "/nonexistent-hf-home", "HF_TOKEN": "hf_testtoken"}


def settings(**env: str) -> Settings:
    return Settings.from_environ({**BASE_ENV, **env})


def findings(facts: Facts, s: Settings | None = None) -> list[Finding]:
    s = s or settings()
    return prepare(s, ensure_model(s, facts))[1]


def only(found: list[Finding], check: str) -> Finding:
    matches = [f for f in found if f.check == check]
    assert len(matches) == 1, (check, matches)
    return matches[0]


def test_the_published_t4_passes_every_check() -> None:
    found = findings(t4())
    assert [f for f in found if f.level != "ok"] == []
    assert not has_failures(found)
    checks = {f.check for f in found}
    assert checks >= {"gpu", "driver", "capability", "dtype", "gpu-memory", "sizing", "manifest", "torch-cuda",
                      "torch-arch", "clamp", "shm", "host-memory", "disk", "model", "port"}  # fmt: skip


def test_no_gpu_fails_with_the_docker_fix_and_skips_gpu_checks() -> None:
    found = findings(no_gpu())
    gpu = only(found, "gpu")
    assert gpu.level == "fail"
    assert "NVML unavailable" in gpu.found
    for fix in ("docker run --gpus all", "deploy.resources.reservations.devices", "NVIDIA Container Toolkit"):
        assert fix in gpu.fix
    assert not {"driver", "capability", "clamp", "torch-arch", "sizing"} & {f.check for f in found}
    assert has_failures(found)


def test_nvml_without_devices_names_the_visible_devices_variables() -> None:
    facts = t4(gpu=GpuFacts(True, None, "580.95.05", (13, 0), [], {"NVIDIA_VISIBLE_DEVICES": "void"}))
    gpu = only(findings(facts), "gpu")
    assert gpu.level == "fail"
    assert "NVIDIA_VISIBLE_DEVICES=void" in gpu.found and "NVIDIA_VISIBLE_DEVICES" in gpu.fix


@pytest.mark.parametrize(
    ("driver", "cuda", "level"),
    [("570.124.06", (12, 8), "fail"), ("580.95.05", (13, 0), "ok"), ("590.1", (13, 1), "ok"), (None, None, "warn")],
)
def test_driver_too_old_for_cuda_13(driver: str | None, cuda: tuple[int, int] | None, level: str) -> None:
    facts = t4()
    facts = dataclasses.replace(
        facts, gpu=dataclasses.replace(facts.gpu, driver_version=driver, cuda_driver_version=cuda)
    )
    finding = only(findings(facts), "driver")
    assert finding.level == level
    assert "580" in finding.required
    if level == "fail":
        assert "580 or newer" in finding.fix


def test_capability_below_turing() -> None:
    finding = only(findings(with_gpu(t4(), name="Tesla V100", compute_capability=(7, 0))), "capability")
    assert finding.level == "fail" and "7.0" in finding.found and ">= 7.5" in finding.required


def test_bf16_on_turing_fails_and_float16_clears_it() -> None:
    finding = only(findings(t4(), settings(T4SERVE_DTYPE="bfloat16")), "dtype")
    assert finding.level == "fail" and "no bfloat16 datapath" in finding.required
    assert "T4SERVE_DTYPE=auto" in finding.fix
    assert only(findings(t4(), settings(T4SERVE_DTYPE="float16")), "dtype").level == "ok"
    a10g = with_known_gpu(t4(), "a10g")
    assert only(findings(a10g, settings(T4SERVE_DTYPE="bfloat16")), "dtype").level == "ok"


def test_float16_for_a_model_vllm_refuses_it_fails_in_vllms_words() -> None:
    s = settings(T4SERVE_DTYPE="float16")
    facts = ensure_model(s, t4())
    assert facts.model is not None
    gemma3 = dataclasses.replace(facts, model=dataclasses.replace(
        facts.model, config={**facts.model.config, "model_type": "gemma3_text"}))
    finding = only(findings(gemma3, s), "dtype")
    assert finding.level == "fail" and "gemma3_text" in finding.found
    assert "The model type 'gemma3_text' does not support float16. Reason: Numerical instability" in finding.required
    assert "T4SERVE_DTYPE=auto" in finding.fix and "float32" in finding.fix
    assert only(findings(facts, s), "dtype").level == "ok"


def test_gpu_memory_taken_by_another_process() -> None:
    busy = with_gpu(t4(), memory_free_bytes=10 * GIB)
    finding = only(findings(busy), "gpu-memory")
    assert finding.level == "fail"
    assert "T4SERVE_GPU_MEMORY_UTILIZATION=0.66" in finding.fix
    assert only(findings(busy, settings(T4SERVE_GPU_MEMORY_UTILIZATION="0.6")), "gpu-memory").level == "ok"


def test_manifest_missing() -> None:
    found = findings(with_manifest(t4(), present=False, error="no such file"))
    manifest = only(found, "manifest")
    assert manifest.level == "fail" and "T4SERVE_MANIFEST" in manifest.fix
    # Without the manifest nothing is known about torch; the clamp cannot be confirmed either.
    assert "torch-cuda" not in {f.check for f in found}
    assert only(found, "clamp").level == "fail"


def test_cpu_build_of_torch() -> None:
    found = findings(with_manifest(t4(), torch_cuda_version=None, torch_arch_list=[]))
    finding = only(found, "torch-cuda")
    assert finding.level == "fail" and "CPU build of torch" in finding.found and "libcudart.so.13" in finding.found
    assert "rebuild the image" in finding.fix
    # One failure for one cause: the empty arch list is not reported again as a missing sm_75.
    assert "torch-arch" not in {f.check for f in found}


def test_capability_missing_from_the_arch_list() -> None:
    finding = only(findings(with_manifest(t4(), torch_arch_list=["sm_80", "sm_90"])), "torch-arch")
    assert finding.level == "fail" and "sm_75" in finding.required


@pytest.mark.parametrize(
    ("arch", "capability", "supported"),
    [
        (["sm_75"], (7, 5), True),
        (["sm_80"], (8, 6), True),
        (["sm_86"], (8, 0), False),
        (["sm_80", "sm_90"], (7, 5), False),
        (["compute_70"], (7, 5), True),
        (["compute_80"], (7, 5), False),
        (["sm_90a"], (9, 0), True),
        (["sm_120"], (12, 0), True),
    ],
)
def test_arch_supported(arch: list[str], capability: tuple[int, int], supported: bool) -> None:
    assert arch_supported(arch, capability) is supported


def test_clamp_missing_stale_or_ineffective_on_t4() -> None:
    clamp = t4().manifest.clamp
    assert clamp is not None
    cases = {
        "records no clamp": with_manifest(t4(), clamp=None),
        "clamp state 'absent'": with_manifest(t4(), clamp=dataclasses.replace(clamp, state="absent")),
        "proven for vLLM 0.29.0": with_manifest(t4(), clamp=dataclasses.replace(clamp, vllm_version="0.29.0")),
        "not effective": with_manifest(
            t4(), clamp=dataclasses.replace(clamp, shared_memory={"2d/prefill/head512/tile32": 98304})
        ),
    }
    for expected, facts in cases.items():
        finding = only(findings(facts), "clamp")
        assert finding.level == "fail", expected
        assert expected in finding.found
        assert "needed (tile 32 at head 512 needs" in finding.found
        assert "reinstalling vLLM silently removes the clamp" in finding.fix


def test_clamp_not_needed_where_shared_memory_suffices() -> None:
    facts = with_known_gpu(with_manifest(t4(), clamp=None), "h100")
    finding = only(findings(facts), "clamp")
    assert finding.level == "ok" and finding.found.startswith("not needed")


@pytest.mark.parametrize(
    ("total", "free", "level"),
    [(2 * GIB, 2 * GIB, "ok"), (64 * MIB, 64 * MIB, "warn"), (64 * MIB, 10 * MIB, "fail"), (None, None, "warn")],
)
def test_shm(total: int | None, free: int | None, level: str) -> None:
    finding = only(findings(with_host(t4(), shm_total_bytes=total, shm_free_bytes=free)), "shm")
    assert finding.level == level
    if level != "ok":
        assert "--shm-size 2g" in finding.fix and "ipc: host" in finding.fix


def test_host_memory_for_bf16_without_swap_needs_swap_and_qat_needs_less() -> None:
    s = settings(T4SERVE_MODEL="bf16")
    facts = with_host(ensure_model(s, t4()), swap_total_bytes=0, swap_free_bytes=0)
    bf16 = only(findings(facts, s), "host-memory")
    assert bf16.level == "fail"
    assert "sudo scripts/setup-swap " in bf16.fix and "T4SERVE_MODEL=qat" in bf16.fix
    assert "MemAvailable" in bf16.found and "short" in bf16.found
    assert "scripts/setup-swap 8G" in bf16.fix  # 13.87 GiB to load bf16 - 6.52 GiB available, rounded up
    # QAT (11.92 GiB to load) needs swap on this host too (issue 45: the fix implied it needed none).
    assert "T4SERVE_MODEL=qat, which needs less but swap too (`sudo scripts/setup-swap 6G`)" in bf16.fix
    roomy = with_host(facts, mem_available_bytes=12 * GIB)
    assert "T4SERVE_MODEL=qat (its int4 weights load within this host's RAM + swap)" in only(
        findings(roomy, s), "host-memory").fix
    swapped = with_host(facts, swap_total_bytes=16 * GIB, swap_free_bytes=16 * GIB)
    assert only(findings(swapped, s), "host-memory").level == "ok"


def test_host_memory_cgroup_limit_needs_a_bigger_limit_not_swap() -> None:
    s = settings(T4SERVE_MODEL="bf16")
    facts = with_host(
        ensure_model(s, t4()),
        swap_total_bytes=16 * GIB,
        swap_free_bytes=16 * GIB,
        cgroup_memory_limit_bytes=2 * GIB,
        cgroup_swap_limit_bytes=0,
    )
    finding = only(findings(facts, s), "host-memory")
    assert finding.level == "fail"
    assert "capped by the cgroup limit" in finding.found and "short" in finding.found
    assert "memory limit" in finding.fix and "setup-swap" not in finding.fix
    assert "T4SERVE_MODEL=qat, which needs less but a limit of at least 12G too" in finding.fix


def test_disk_roles_on_one_filesystem_add_up_and_free_space_counts_once() -> None:
    # Everything on one small root filesystem (id 1): the download and the compile cache compete for it.
    # QAT's download needs 7.99 GiB with headroom: it fits 8.5 GiB alone, not beside the compile cache and scratch.
    small = int(8.5 * GIB)
    one_fs = [
        DiskFacts(role, path, "/", small, 10 * GIB, True, 1)
        for role, path in (("hf_cache", "/cache/huggingface"), ("compile_cache", "/cache/compile"), ("tmp", "/tmp"))
    ]
    disk = [f for f in findings(with_host(t4(), disks=one_fs)) if f.check == "disk"]
    assert len(disk) == 1
    assert disk[0].level == "fail"
    assert "hf_cache" in disk[0].required and "compile_cache" in disk[0].required and " + " in disk[0].required
    # The same roles each on a filesystem of their own fit.
    spread = [dataclasses.replace(d, filesystem_id=i) for i, d in enumerate(one_fs)]
    assert [f.level for f in findings(with_host(t4(), disks=spread)) if f.check == "disk"] == ["ok", "ok", "ok"]


def test_disk_failure_says_what_the_image_needs_on_docker_data_root_and_how_to_move_it() -> None:
    facts = with_host(t4(), disks=[DiskFacts("hf_cache", "/cache/huggingface", "/cache", 100 * MIB, GIB, True, 3)])
    finding = only(findings(facts), "disk")
    assert finding.level == "fail"
    assert "100.000 MiB free" in finding.found and "checkpoint" in finding.required
    assert f"image ({format_bytes(IMAGE_BYTES)})" in finding.fix
    assert '"data-root": "/new/path" in /etc/docker/daemon.json' in finding.fix
    assert "docker info -f '{{.DockerRootDir}}'" in finding.fix and "docs/operations.md" in finding.fix


def test_disk_hf_cache_needs_nothing_once_the_checkpoint_is_local() -> None:
    facts = with_host(t4(), disks=[DiskFacts("hf_cache", "/cache/huggingface", "/cache", 100 * MIB, GIB, True, 3)])
    assert only(findings(facts), "disk").level == "fail"
    model = facts.model
    assert model is not None
    local = dataclasses.replace(facts, model=dataclasses.replace(model, source="hf-cache", local_path="/cache/x"))
    assert only(findings(local), "disk").level == "ok"


def test_disk_not_writable() -> None:
    facts = with_host(t4(), disks=[DiskFacts("state", "/tmp/t4serve", "/tmp", GIB, GIB, False, 2)])
    finding = only(findings(facts), "disk")
    assert finding.level == "fail" and "not writable" in finding.found and "uid 1000" in finding.fix


def test_model_offline_and_not_local() -> None:
    finding = only(findings(t4(), settings(HF_HUB_OFFLINE="1")), "model")
    assert finding.level == "fail" and "HF_HUB_OFFLINE=1" in finding.found and "HF_HUB_OFFLINE=0" in finding.fix
    assert only(findings(t4(), settings(HF_HUB_OFFLINE="0")), "model").level == "ok"


def test_model_gated_without_token_warns() -> None:
    s = Settings.from_environ({"HF_HOME": "/nonexistent-hf-home"})
    finding = only(findings(t4(), s), "model")
    assert finding.level == "warn" and "HF_TOKEN_FILE" in finding.fix


def test_model_invalid() -> None:
    model = t4().model
    assert model is not None
    broken = dataclasses.replace(model, source="invalid", error="/m/config.json: missing")
    found = findings(dataclasses.replace(t4(), model=broken))
    assert only(found, "model").level == "fail" and "config.json: missing" in only(found, "model").found
    assert only(found, "sizing").level == "fail"


def test_port_in_use() -> None:
    busy = with_host(t4(), ports_in_use=[8000, 9400])
    ports = [f for f in findings(busy) if f.check == "port"]
    assert [f.level for f in ports] == ["fail", "fail"]
    assert "T4SERVE_PORT" in ports[0].fix and "T4SERVE_TELEMETRY_PORT" in ports[1].fix
    moved = findings(busy, settings(T4SERVE_PORT="8001", T4SERVE_TELEMETRY_PORT="0"))
    assert [f.level for f in moved if f.check == "port"] == ["ok"]


def test_host_memory_is_checked_without_a_gpu_too() -> None:
    finding = only(findings(with_host(no_gpu(), swap_total_bytes=0, swap_free_bytes=0)), "host-memory")
    assert finding.level == "fail" and "setup-swap" in finding.fix


def test_sizing_failure_is_a_finding() -> None:
    facts = with_gpu(t4(), memory_total_bytes=2 * GIB, memory_free_bytes=2 * GIB)
    finding = only(findings(facts), "sizing")
    assert finding.level == "fail" and finding.found


def test_run_checks_is_pure_and_table_and_json_render() -> None:
    s = settings()
    facts = ensure_model(s, no_gpu())
    plan, first = prepare(s, facts)
    assert run_checks(facts, plan, s) == first
    table = format_table(first)
    assert table.splitlines()[0].startswith("FAIL  gpu")
    assert table.splitlines()[-1].endswith("ok") and "failed" in table.splitlines()[-1]
    assert json.loads(to_json(first))[0]["check"] == "gpu"
    assert "hf_testtoken" not in table + to_json(first)


def test_finding_level_is_validated() -> None:
    with pytest.raises(ValueError):
        Finding("x", "maybe", "", "", "")


def test_size_as_a_card_larger_than_the_real_one_is_refused_by_the_plan() -> None:
    """Sizing a T4 as an A10G would give vLLM --gpu-memory-utilization above 1: the plan itself refuses it (exit 2),
    so `plan`, `preflight` and `serve` (T4SERVE_PREFLIGHT=warn included) all stop there."""
    with pytest.raises(ConfigError) as info:
        findings(t4(), settings(T4SERVE_SIZE_AS="a10g"))
    message = info.value.message()
    assert info.value.exit_code == 2 and "T4SERVE_SIZE_AS=a10g" in message and "unset T4SERVE_SIZE_AS" in message
    assert only(findings(t4(), settings(T4SERVE_SIZE_AS="t4")), "size-as").level == "ok"


def test_a_profiled_pool_on_a_t4_sized_card_is_a_warning_with_the_fix() -> None:
    """vLLM 0.33.0's profile run reached a 15 GiB card's limit on the GPU host and sized the pool too large
    (docs/verified/gpu-host-vllm-0.33.0/cold-start-t4-memory): preflight says so, and the explicit pool is the fix."""
    profiled = only(findings(t4(), settings(T4SERVE_KV_CACHE_MEMORY_BYTES="profile")), "sizing")
    assert profiled.level == "warn"
    assert "3.20 GiB" in profiled.found and "8 MB" in profiled.found
    assert "unset T4SERVE_KV_CACHE_MEMORY_BYTES" in profiled.fix
    assert only(findings(t4()), "sizing").level == "ok"  # the explicit pool, t4serve's default
    big = with_gpu(t4(), memory_total_bytes=24 * GIB, memory_free_bytes=24 * GIB)
    assert only(findings(big, settings(T4SERVE_KV_CACHE_MEMORY_BYTES="profile")), "sizing").level == "ok"
