"""Preflight checks of the image: its build manifest, its torch's CUDA build and arch list, the Turing clamp, and the
proof of the attention path the plan chose."""

from __future__ import annotations

from t4serve.facts import BuildManifest, GpuDevice, ModelFacts, TuringAttentionProof
from t4serve.gpus import arch_supported
from t4serve.patch.clamp import padded_head_size
from t4serve.planning.plan import Plan, head_sizes
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


def check_attention(plan: Plan, manifest: BuildManifest, proof: TuringAttentionProof | None,
                    model: ModelFacts | None) -> Finding:
    """The attention path the plan chose (T4SERVE_ATTENTION), and for turing-mma the image's proof of its launches:
    present, for the installed vLLM, covering the model's heads and the KV cache, within a T4's shared memory, no
    spills."""
    choice = plan.attention
    required = "for turing-mma: the image's proof that its launches compile for sm_75 with tensor cores"
    if choice.path != "turing-mma":
        return Finding("attention", "ok", f"{choice.label} ({choice.reason})", required, "")
    fix = ("rebuild the image (its turing-attention stage proves the launches), or set T4SERVE_ATTENTION=triton "
           "(vLLM's own launch)")
    if proof is None:
        # A record made before t4serve probed the proof (`probe --json` of an older t4serve, a constructed file).
        return Finding("attention", "warn", "turing-mma; this record holds no Turing attention proof (recorded before "
                       "t4serve probed it)", required, "record the machine again in the image: t4serve probe --json")
    if not proof.present:
        return Finding("attention", "fail", f"turing-mma; {proof.error}", required, fix)
    if manifest.vllm_version and proof.vllm_version != manifest.vllm_version:
        return Finding("attention", "fail", f"turing-mma; proven for vLLM {proof.vllm_version} but vLLM "
                       f"{manifest.vllm_version} is installed", required, fix)
    heads = sorted({padded_head_size(h) for h in head_sizes(model)})
    kv = "int8" if plan.kv_cache_dtype.startswith("int8") else "16-bit"
    missing = [h for h in heads if h not in proof.padded_heads]
    if missing or kv not in proof.kv_caches:
        return Finding("attention", "fail", f"turing-mma; the proof covers heads {proof.padded_heads} with "
                       f"{proof.kv_caches} caches, not heads {heads} with a {kv} cache", required, fix)
    return Finding(
        "attention", "ok",
        f"turing-mma ({choice.reason}); the image proved {proof.launches} launches for sm_75, "
        f"{proof.tensor_core_launches} on tensor cores, within {proof.largest_shared_memory_bytes:,} B of shared "
        f"memory, {proof.most_spill_bytes} B of spills at most", required, "")
