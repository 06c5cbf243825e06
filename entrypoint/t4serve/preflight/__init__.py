"""Preflight: pure checks over Facts + Plan + Settings, each a Finding (ok / warn / fail) with the fix.

`run_checks(facts, plan, settings)` reads nothing but its arguments, so a recorded machine is checked exactly as the
live one. Every check names what it found, what is required and the command or variable that fixes it. Checks that
need a GPU are left out when none is visible: the no-GPU finding says everything there is to say.

The checks live by concern: `findings` (the Finding type, the table and JSON), `gpu` (the card, its driver, dtype,
memory and the plan's sizing on it), `image` (the build manifest, torch's CUDA build and arch list, the Turing clamp),
`host` (/dev/shm, RAM + swap, disks, ports, telemetry) and `model` (the checkpoint). This module runs them in order
and names each public one, so `from t4serve.preflight import check_disks` reads as it always has.
"""

from __future__ import annotations

from t4serve.config.settings import Settings
from t4serve.facts import Facts
from t4serve.planning.plan import Plan
from t4serve.preflight.findings import (
    LEVELS,
    Finding,
    format_table,
    has_failures,
    to_json,
)
from t4serve.preflight.gpu import (
    DEFAULT_TORCH_CUDA,
    MIN_DRIVER_FOR_CUDA,
    NO_GPU_FIX,
    PROFILE_RISK_MAX_BYTES,
    check_capability,
    check_driver,
    check_dtype,
    check_gpu_memory_free,
    check_gpu_visible,
    check_size_as,
    check_sizing,
)
from t4serve.preflight.host import (
    DATA_ROOT_FIX,
    DISK_NEED_BY_ROLE,
    HF_CACHE_HEADROOM,
    IMAGE_BYTES,
    PROC_FIX,
    SHM_FIX,
    SHM_MIN_FREE,
    SHM_RECOMMENDED,
    check_disks,
    check_host_memory,
    check_ports,
    check_shm,
    check_telemetry,
    disk_needs,
    unreadable_disk,
)
from t4serve.preflight.image import (
    check_attention,
    check_clamp,
    check_manifest,
    check_torch_arch,
    check_torch_cuda,
)
from t4serve.preflight.model import (
    NOT_LOCAL_SOURCES,
    check_drafter,
    check_model,
)

__all__ = [
    "DATA_ROOT_FIX",
    "DEFAULT_TORCH_CUDA",
    "DISK_NEED_BY_ROLE",
    "HF_CACHE_HEADROOM",
    "IMAGE_BYTES",
    "LEVELS",
    "MIN_DRIVER_FOR_CUDA",
    "NOT_LOCAL_SOURCES",
    "NO_GPU_FIX",
    "PROC_FIX",
    "PROFILE_RISK_MAX_BYTES",
    "SHM_FIX",
    "SHM_MIN_FREE",
    "SHM_RECOMMENDED",
    "Finding",
    "check_attention",
    "check_capability",
    "check_clamp",
    "check_disks",
    "check_drafter",
    "check_driver",
    "check_dtype",
    "check_gpu_memory_free",
    "check_gpu_visible",
    "check_host_memory",
    "check_manifest",
    "check_model",
    "check_ports",
    "check_shm",
    "check_size_as",
    "check_sizing",
    "check_telemetry",
    "check_torch_arch",
    "check_torch_cuda",
    "disk_needs",
    "format_table",
    "has_failures",
    "run_checks",
    "to_json",
    "unreadable_disk",
]


def run_checks(facts: Facts, plan: Plan, settings: Settings) -> list[Finding]:
    findings = [check_gpu_visible(facts)]
    gpu = plan.gpu
    if gpu is not None:
        findings += [
            check_driver(facts),
            check_capability(gpu),
            check_dtype(plan, gpu, facts.model),
            check_gpu_memory_free(gpu, settings),
            check_sizing(plan),
        ]
        if plan.sized_as is not None and facts.gpu.devices:
            findings.append(check_size_as(facts.gpu.devices[0], gpu, plan.sized_as))
    findings.append(check_manifest(facts.manifest))
    if facts.manifest.present:
        findings.append(check_torch_cuda(facts.manifest))
        # An empty arch list is a CPU build, which torch-cuda reports with its fix.
        if gpu is not None and facts.manifest.torch_arch_list:
            findings.append(check_torch_arch(facts.manifest, gpu))
    if gpu is not None:
        findings.append(check_clamp(facts.manifest, plan, gpu))
        findings.append(check_attention(plan, facts.manifest, facts.turing_attention, facts.model))
    findings += [
        check_shm(facts.host),
        check_host_memory(facts, settings),
        *check_disks(facts, plan),
        check_model(facts, settings),
        *([check_drafter(facts, settings)] if settings.speculative == "mtp" else []),
        *check_ports(facts.host, settings),
        check_telemetry(plan, facts.host),
    ]
    return findings
