"""The slimmed image against docker/slim.json: every removal holds, the vLLM switches are in the image's environment
and vLLM reads them, the build's import proof ran over the serving path and recorded it, and every library torch
links still resolves (only the driver's libcuda.so.1, which the container toolkit injects, may be missing here)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from .conftest import REPO, RunInImage

pytestmark = pytest.mark.image

SPEC: dict[str, Any] = json.loads((REPO / "docker" / "slim.json").read_text())
SITE = "/opt/venv/lib/python3.13/site-packages"
# What the proof must have imported: one module per step of serving after the engine starts.
PROVEN = (
    "vllm.v1.worker.gpu.model_runner",
    "vllm.v1.worker.gpu.sample.sampler",
    "vllm.v1.worker.gpu.spec_decode.gemma4.speculator",
    "vllm.model_executor.models.gemma4_mtp",
    "vllm.v1.structured_output.backend_xgrammar",
    "vllm.v1.structured_output.backend_guidance",
    "xgrammar",
    "llguidance",
    "vllm.tokenizers.hf",
    "transformers.models.gemma4.processing_gemma4",
    "vllm.entrypoints.openai.chat_completion.serving",
    "vllm.entrypoints.launchers.app",
    "vllm.model_executor.models.gemma4_mm",
    "vllm.v1.attention.backends.triton_attn",
)


def test_removed_distributions_paths_and_modules_are_gone(run_in_image: RunInImage) -> None:
    code = (
        "import importlib.metadata as md, importlib.util as u, json, os\n"
        f"spec = json.loads({json.dumps(SPEC)!r})\n"
        "def installed(n):\n"
        "    try:\n"
        "        md.distribution(n)\n"
        "    except md.PackageNotFoundError:\n"
        "        return False\n"
        "    return True\n"
        "print(json.dumps({\n"
        "    'distributions': [d['name'] for d in spec['distributions'] if installed(d['name'])],\n"
        f"    'paths': [p['path'] for p in spec['paths'] if os.path.lexists({SITE!r} + '/' + p['path'])],\n"
        "    'modules': sorted({m for d in spec['distributions'] for m in d['modules'] if u.find_spec(m)}),\n"
        "}))"
    )
    out = run_in_image("-c", code, entrypoint="python3")
    assert out.returncode == 0, out.stderr[-4000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == {"distributions": [], "paths": [], "modules": []}


def test_switches_are_in_the_image_environment(image_config: dict[str, Any]) -> None:
    env = dict(item.split("=", 1) for item in image_config["Env"])
    assert {name: env.get(name) for name in SPEC["switches"]} == {
        name: switch["value"] for name, switch in SPEC["switches"].items()
    }
    assert env["VLLM_USE_FLASHINFER_SAMPLER"] == "0"


def test_vllm_reads_the_switches(run_in_image: RunInImage) -> None:
    names = sorted(SPEC["switches"])
    code = f"import json, vllm.envs as e; print(json.dumps({{n: str(getattr(e, n)) for n in {names!r}}}))"
    out = run_in_image("-c", code, entrypoint="python3", timeout=600)
    assert out.returncode == 0, out.stderr[-4000:]
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen["VLLM_USE_FLASHINFER_SAMPLER"] == "False"
    assert seen["VLLM_USE_DEEP_GEMM"] == "False"
    assert seen["VLLM_VIDEO_LOADER_BACKEND"] == "opencv"


def test_the_build_import_proof_ran_over_the_serving_path(run_in_image: RunInImage) -> None:
    out = run_in_image("/etc/t4serve/import-proof.json", entrypoint="cat")
    assert out.returncode == 0, f"no import proof in the image: {out.stderr}"
    proof = json.loads(out.stdout)
    assert proof["vllm_version"] == "0.34.0"
    assert set(PROVEN) <= set(proof["modules"])
    assert {"/v1/chat/completions", "/v1/completions", "/v1/models", "/health"} <= set(proof["routes"])
    assert proof["decisions_on_t4"] == {
        "flashinfer_sampler": False,
        "has_flashinfer": False,
        "deep_gemm": False,
        "w4a16_kernel": "MarlinLinearKernel",
    }
    # vLLM's FlashAttention package imports without its libraries and refuses every version on the T4 stand-in.
    assert {k: v for k, v in proof["flash_attention_on_t4"].items() if k != "fa2_refused_because"} == {
        "package_imported": True,
        "fa2_available": False,
        "fa3_available": False,
        "versions_supported": [],
    }
    assert "FA2 is unavailable" in proof["flash_attention_on_t4"]["fa2_refused_because"]
    # What the build removed and what the lock never installed (excluded_from_lock): the image has neither.
    removed = {m for d in [*SPEC["distributions"], *SPEC["excluded_from_lock"]] for m in d["modules"]}
    assert proof["removed_modules"] == sorted(removed)
    assert not removed & set(proof["top_level_imported"])
    assert {"vllm", "torch", "triton", "xgrammar", "llguidance", "fastapi"} <= set(proof["top_level_imported"])
    # vLLM's warm-up (after the KV cache is allocated, before serving) imported what it imports on a T4, and skipped
    # MiniMax M3's MSA warm-up, whose modules need the CuTe DSL the image leaves out: on the GPU host every 0.34.0
    # server failed there before slim.json's guard (docs/verified/gpu-host-vllm-0.34.0/).
    warmup = proof["warmup_imports_on_t4"]["vllm.model_executor.warmup.kernel_warmup.kernel_warmup"]
    assert "vllm.model_executor.warmup.step5_dsa_warmup" in warmup["imported"]
    skipped = {"module": "vllm.model_executor.warmup.minimax_m3_msa_warmup",
               "condition": "current_platform.is_cuda() and find_spec('cutlass') is not None is False"}
    assert skipped in warmup["skipped"]
    # And every function and method of the engine's modules (core, executor, worker, model runner, CUDA graphs,
    # sampler, Gemma 4 and its drafter, the Triton backend): each import in a body imported, but the two named.
    engine = proof["engine_imports_on_t4"]
    assert engine["functions"] > 300 and "vllm.v1.worker.gpu.model_runner" in engine["modules"]
    assert set(engine["absent_here"]) == {"vllm.device_allocator.cumem", "ray"}
    assert not set(engine["absent_here"]) & set(engine["imported"])


def test_the_rewrites_are_in_effect_and_byte_compiled(run_in_image: RunInImage) -> None:
    """Each rewrite replaced its statement, and the .pyc matches the rewritten source (the runtime user cannot write
    __pycache__, so a stale one would be recompiled in memory at every start)."""
    code = (
        "import importlib.util, json, os, struct\n"
        f"site = {SITE!r}\n"
        f"for r in json.loads({json.dumps(json.dumps(SPEC['rewrites']))}):\n"
        "    path = os.path.join(site, r['path'])\n"
        "    text = open(path).read()\n"
        "    pyc = open(importlib.util.cache_from_source(path), 'rb').read(16)\n"
        "    flags, mtime, size = struct.unpack('<III', pyc[4:16])\n"
        "    st = os.stat(path)\n"
        "    print(r['path'], r['old'] in text, r['new'] in text, flags == 0 and mtime == int(st.st_mtime) & 0xFFFFFFFF"
        " and size == st.st_size & 0xFFFFFFFF)\n"
    )
    out = run_in_image("-c", code, entrypoint="python3")
    assert out.returncode == 0, out.stderr[-4000:]
    assert out.stdout.splitlines() == [f"{r['path']} False True True" for r in SPEC["rewrites"]]


def test_no_library_links_a_removed_one(run_in_image: RunInImage) -> None:
    """readelf -d over every shared library left in the venv: none needs (DT_NEEDED) a library docker/slim.json
    removed, so the removal can break a load only through a dlopen of a feature the T4 path never uses."""
    removed = sorted({Path(p["path"]).name for p in SPEC["paths"] if ".so" in Path(p["path"]).name})
    assert "libnvperf_host.so" in removed and "_moe_C_stable_libtorch.abi3.so" in removed
    script = (
        f"cd {SITE} && find . -type f \\( -name '*.so' -o -name '*.so.*' \\) -print0 "
        "| xargs -0 -n 50 readelf -d 2>/dev/null | sed -n 's/.*Shared library: \\[\\(.*\\)\\]/\\1/p' | sort -u"
    )
    out = run_in_image("-c", script, entrypoint="sh", timeout=600)
    assert out.returncode == 0, out.stderr[-4000:]
    needed = set(out.stdout.split())
    assert {"libcudart.so.13", "libtorch_cuda.so", "libcupti.so.13"} <= needed  # the scan saw the libraries
    assert not needed & set(removed), sorted(needed & set(removed))


def test_every_library_torch_links_resolves(run_in_image: RunInImage) -> None:
    """ldd over torch's own libraries (their RUNPATH reaches the NVIDIA wheels' folders): nothing the slim step
    deleted may be among what they need, transitively."""
    script = f'for f in {SITE}/torch/lib/*.so*; do ldd "$f" | sed "s|^|$(basename "$f"): |"; done'
    out = run_in_image("-c", script, entrypoint="bash")
    assert out.returncode == 0, out.stderr[-4000:]
    missing = sorted(
        {line.split(":")[0] + ": " + line.split()[1] for line in out.stdout.splitlines() if "not found" in line}
    )
    assert missing == ["libcaffe2_nvrtc.so: libcuda.so.1"], missing
    resolved = {
        Path(line.split("=>")[1].split()[0]).name
        for line in out.stdout.splitlines()
        if "=>" in line and "not found" not in line
    }
    assert {
        "libcudart.so.13",
        "libcublasLt.so.13",
        "libcudnn.so.9",
        "libnccl.so.2",
        "libcusolver.so.12",
        "libnvrtc.so.13",
        "libcusparseLt.so.0",
        "libnvshmem_host.so.3",
    } <= resolved
