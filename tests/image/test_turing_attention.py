"""t4serve's Turing attention in the image: the proof its turing-attention stage wrote, the path installed by vLLM's
own plugin loader, and the table's prefill launches computing attention as the float32 reference does (interpreted
on the CPU; the tensor-core instructions themselves are the GPU host's to run: docs/turing-attention.md)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from t4serve.turing.launch import LAUNCHES, PREFILL

from .conftest import REPO, RunInImage

pytestmark = pytest.mark.image


@pytest.fixture(scope="module")
def proof(run_in_image: RunInImage) -> dict[str, Any]:
    done = run_in_image("/etc/t4serve/turing-attention-proof.json", entrypoint="cat")
    assert done.returncode == 0, done.stderr
    data: dict[str, Any] = json.loads(done.stdout)
    return data


def test_the_build_proved_every_row_of_the_table(proof: dict[str, Any]) -> None:
    rows = {(k["phase"], k["head_size"], k["kv_cache"]) for k in proof["kernels"]}
    assert rows == {(p, h, {0: "16-bit", 2: "int8"}[kv]) for p, h, kv in LAUNCHES}
    for k in proof["kernels"]:
        assert k["arch"] == "sm_75" and k["shared_memory_bytes"] <= 65_536 and k["spill_bytes"] == 0, k
        assert k["tensor_core_instructions"] > 0, k
    # Step 1: every FMA combination at E2B's heads was compiled; the spilling ones are what a T4 runs today.
    step1 = proof["step1"]
    assert {(r["phase"], r["head_size"], r["num_warps"]) for r in step1} >= {
        (p, h, w) for p in ("prefill", "decode") for h in (256, 512) for w in (2, 4, 8)}
    assert any(r["spill_bytes"] > 3000 and r["registers"] == 64 for r in step1), "vLLM's own launch at head 512"


def test_preflight_reads_the_images_proof(run_in_image: RunInImage, tmp_path: Path) -> None:
    # The image's own probe (its proof file included), on the published T4's GPU facts (no GPU here).
    probed = run_in_image("probe", "--json")
    assert probed.returncode == 0, probed.stderr
    facts = json.loads(probed.stdout)
    assert facts["turing_attention"]["present"] and facts["turing_attention"]["tensor_core_launches"] > 0, facts
    published = json.loads((REPO / "entrypoint/t4serve/data/facts/t4-published.json").read_text())
    facts["gpu"] = published["gpu"]
    (tmp_path / "facts.json").write_text(json.dumps(facts))
    tmp_path.chmod(0o755)
    (tmp_path / "facts.json").chmod(0o644)
    done = run_in_image("preflight", "--facts", "/f/facts.json", "--json", extra=("-v", f"{tmp_path}:/f:ro"))
    findings = {f["check"]: f for f in json.loads(done.stdout)}
    attention = findings["attention"]
    assert attention["level"] == "ok", attention
    assert "turing-mma" in attention["found"] and "launches for sm_75" in attention["found"], attention


def test_the_plugin_installs_the_path_and_its_launches_compute_attention(run_in_image: RunInImage) -> None:
    done = run_in_image("/t/gpu/turing_interpret.py", "--json", entrypoint="python", timeout=1200,
                        env={"CUDA_VISIBLE_DEVICES": "", "TRITON_INTERPRET": "1", "T4SERVE_ATTENTION": "turing-mma"},
                        extra=("--network", "none", "-v", f"{REPO}/tests:/t:ro"))
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["installed"] and result["hook"]
    for case in result["cases"]:
        launch = LAUNCHES[(PREFILL, case["head"], 0)]
        assert case["launches"] and all(x["launch"] == launch.describe() for x in case["launches"]), case
        if launch.block_m is not None:
            assert {x["BLOCK_M"] for x in case["launches"]} == {launch.block_m}, case
        assert case["max_abs_error"] < 5e-3, case


def test_the_images_kernel_is_the_one_the_gpu_host_timed(run_in_image: RunInImage) -> None:
    # docs/verified/turing-attention/gpu-host/ timed vLLM 0.33.0's kernel; the figures hold for the image's vLLM only
    # while its kernel source is the same text.
    recorded = json.loads((REPO / "docs/verified/turing-attention/gpu-host/kernel-source.json").read_text())["sha256"]
    script = (
        "import ast, hashlib, json, vllm.v1.attention.ops as ops, pathlib\n"
        "d = pathlib.Path(ops.__file__).parent\n"
        "src = (d / 'triton_unified_attention.py').read_text()\n"
        "out = {n.name: hashlib.sha256(ast.get_source_segment(src, n).encode()).hexdigest()\n"
        "       for n in ast.parse(src).body if isinstance(n, ast.FunctionDef)\n"
        "       and n.name in ('kernel_unified_attention', 'reduce_segments')}\n"
        "out['triton_attention_helpers.py'] = hashlib.sha256((d / 'triton_attention_helpers.py').read_bytes())"
        ".hexdigest()\n"
        "print(json.dumps(out))\n"
    )
    done = run_in_image("-c", script, entrypoint="python", env={"CUDA_VISIBLE_DEVICES": ""})
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == recorded
