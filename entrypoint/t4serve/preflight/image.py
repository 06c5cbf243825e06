"""Preflight checks of the image: its build manifest, its torch's CUDA build and arch list, and the Turing clamp."""

from __future__ import annotations

from t4serve.facts import BuildManifest, GpuDevice
from t4serve.gpus import arch_supported
from t4serve.planning.plan import Plan
from t4serve.preflight.findings import Finding


def check_manifest(manifest: BuildManifest) -> Finding:
    required = "the build manifest the t4serve image writes (torch, CUDA, arch list, vLLM, clamp proof)"
    if not manifest.present or manifest.error:
        return Finding(
            "manifest",
            "fail",
            manifest.error
            if manifest.error and manifest.path in manifest.error
            else f"{manifest.path}: " + (manifest.error or "missing"),
            required,
            "run t4serve inside the t4serve image, or set T4SERVE_MANIFEST to the image's build manifest",
        )
    return Finding(
        "manifest",
        "ok",
        f"{manifest.path}: torch {manifest.torch_version}, vLLM {manifest.vllm_version}",
        required,
        "",
    )


def check_torch_cuda(manifest: BuildManifest) -> Finding:
    found = f"torch {manifest.torch_version}, CUDA {manifest.torch_cuda_version or 'none'}, arch list " + (
        " ".join(manifest.torch_arch_list) or "empty"
    )
    required = "a CUDA build of torch (torch.version.cuda set, a non-empty arch list)"
    if not manifest.torch_cuda_version or not manifest.torch_arch_list:
        return Finding(
            "torch-cuda",
            "fail",
            found + ": a CPU build of torch (vLLM's CUDA kernels then fail on libcudart.so.13)",
            required,
            "rebuild the image from docker/ (its lock pins PyPI's CUDA 13.0 torch); never install torch from the "
            "CPU index or with --no-deps",
        )
    return Finding("torch-cuda", "ok", found, required, "")


def check_torch_arch(manifest: BuildManifest, gpu: GpuDevice) -> Finding:
    cap = gpu.compute_capability
    found = f"torch arch list {' '.join(manifest.torch_arch_list) or '(empty)'}; GPU sm_{cap[0]}{cap[1]}"
    required = f"a kernel image for sm_{cap[0]}{cap[1]} (sm_{cap[0]}x with x <= {cap[1]}, or PTX at or below it)"
    if not arch_supported(manifest.torch_arch_list, cap):
        return Finding(
            "torch-arch",
            "fail",
            found,
            required,
            "rebuild the image with a torch compiled for this GPU (PyPI's torch 2.14.0 cu130 wheel covers sm_75 to "
            "sm_120)",
        )
    return Finding("torch-arch", "ok", found, required, "")


def check_clamp(manifest: BuildManifest, plan: Plan, gpu: GpuDevice) -> Finding:
    required = "the Turing clamp applied to vLLM's Triton attention where the device needs it"
    rebuild = (
        "rebuild the image (its build applies the clamp and proves it); never `pip install vllm` inside it: "
        "reinstalling vLLM silently removes the clamp"
    )
    if not plan.clamp_needed:
        return Finding("clamp", "ok", f"not needed: {plan.clamp_reason}", required, "")
    clamp = manifest.clamp
    needed = f"needed ({plan.clamp_reason})"
    if not manifest.present or clamp is None:
        return Finding("clamp", "fail", f"{needed}; the build manifest records no clamp", required, rebuild)
    if clamp.state not in ("applied", "not-needed"):
        return Finding(
            "clamp",
            "fail",
            f"{needed}; clamp state {clamp.state!r} (vLLM fails with 'Hardware limit: 65536')",
            required,
            rebuild,
        )
    if manifest.vllm_version and clamp.vllm_version != manifest.vllm_version:
        return Finding(
            "clamp",
            "fail",
            f"{needed}; clamp proven for vLLM {clamp.vllm_version} but vLLM {manifest.vllm_version} is installed",
            required,
            rebuild,
        )
    over = {k: v for k, v in clamp.shared_memory.items() if v > gpu.shared_memory_per_block}
    if over:
        worst = max(over, key=lambda k: over[k])
        return Finding(
            "clamp",
            "fail",
            f"{needed}; the proof's kernel {worst} needs {over[worst]:,} B > {gpu.shared_memory_per_block:,} B "
            "per block on this device: the clamp is not effective here",
            required,
            rebuild,
        )
    proof = f", kernels proven at {max(clamp.shared_memory.values()):,} B max" if clamp.shared_memory else ""
    return Finding("clamp", "ok", f"{needed}; state {clamp.state} for vLLM {clamp.vllm_version}{proof}", required, "")
