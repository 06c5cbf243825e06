"""T4SERVE_SPECULATIVE against vLLM 0.34's own planner and loader, in the image, without a GPU.

tests/oracle/plan_oracle.py plans each case with t4serve (Gemma 4 E2B with its drafter, google/gemma-4-E2B-it-assistant
written from its published config.json, at several lengths and GPUs; n-gram) and hands the plan's argv, its
`--speculative-config` included, to vLLM: its parser, its engine config, the target and the drafter built as vLLM's
Gemma 4 speculator builds and wires it, its planner. Every KV figure must be equal, the drafter must own no KV cache
and read the target's layers 13 and 14. tests/oracle/weights_oracle.py --mtp counts the bytes vLLM allocates for the
drafter beside the target, which must be t4serve's drafter weights (its rotary caches the target's)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from t4serve.planning.speculative import drafter_gpu
from t4serve.probes.checkpoint import ROLE_DRAFTER, probe_model

from .conftest import REPO, load_e2b_checkpoint
from .test_kv_oracle_families import assert_plan_equals_vllm
from .test_weights_oracle import NON_CHECKPOINT_SLACK

pytestmark = pytest.mark.image

ORACLE_TIMEOUT_S = 900
DRAFTER = "/fam/assistant"
MTP = {"T4SERVE_SPECULATIVE": "mtp", "T4SERVE_DRAFT_MODEL": DRAFTER}


def cases() -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []

    def case(kind: str, gpu: str, name: str, **env: str) -> None:
        out.append({"id": f"{kind}/{gpu}/{name}", "model": f"/fam/{kind}", "gpu": gpu, "env": env})

    for kind in ("qat", "bf16"):
        case(kind, "t4", "mtp", **MTP)
        for length in ("4096", "32768", "131072"):
            case(kind, "t4", f"mtp-len{length}", **MTP, T4SERVE_MAX_MODEL_LEN=length)
    for gpu in ("l4", "a100", "h100"):
        case("qat", gpu, "mtp", **MTP)
    case("qat", "t4", "mtp-tokens4", **MTP, T4SERVE_NUM_SPECULATIVE_TOKENS="4")
    case("qat", "t4", "mtp-kv-int8", **MTP, T4SERVE_KV_CACHE_DTYPE="int8")
    case("qat", "t4", "mtp-no-async", **MTP, T4SERVE_VLLM_ARGS="--no-async-scheduling")
    case("qat", "t4", "mtp-pool-too-small", **MTP, T4SERVE_MAX_MODEL_LEN="131072",
         T4SERVE_KV_CACHE_MEMORY_BYTES=str(256 * 1024**2))
    case("qat", "t4", "ngram", T4SERVE_SPECULATIVE="ngram")
    case("bf16", "h100", "ngram", T4SERVE_SPECULATIVE="ngram", T4SERVE_NUM_SPECULATIVE_TOKENS="4")
    return out


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    e2b = load_e2b_checkpoint()
    root: Path = tmp_path_factory.mktemp("speculative")
    for kind in ("qat", "bf16"):
        e2b.write_checkpoint(root / kind, kind=kind)
    e2b.write_assistant_checkpoint(root / "assistant")
    # The image runs as its own user: the checkpoints it reads must be readable by others.
    for path in (root, *root.rglob("*")):
        path.chmod(0o755 if path.is_dir() else 0o644)
    return root


def docker(docker_bin: str, image: str, root: Path, *args: str) -> dict[str, Any]:
    cmd = [docker_bin, "run", "--rm", "--network", "none", "-e", "CUDA_VISIBLE_DEVICES=",
           "-v", f"{REPO / 'tests'}:/t:ro", "-v", f"{root}:/fam:ro", "--entrypoint", "python", image, *args]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=ORACLE_TIMEOUT_S)
    assert done.returncode == 0, f"the oracle failed in {image}:\n{done.stderr[-6000:]}"
    data: dict[str, Any] = json.loads(done.stdout)
    assert data["vllm_version"] == "0.34.0", data["vllm_version"]
    return data


@pytest.fixture(scope="module")
def oracle(docker_bin: str, image_ref: str, root: Path) -> dict[str, dict[str, Any]]:
    (root / "cases.json").write_text(json.dumps({"cases": cases()}))
    (root / "cases.json").chmod(0o644)
    data = docker(docker_bin, image_ref, root, "/t/oracle/plan_oracle.py", "/fam/cases.json")
    return {entry["id"]: entry for entry in data["cases"]}


@pytest.mark.parametrize("case_id", [c["id"] for c in cases()])
def test_plan_equals_vllm(oracle: dict[str, dict[str, Any]], case_id: str) -> None:
    assert_plan_equals_vllm(oracle[case_id], case_id)


@pytest.mark.parametrize("case_id", [c["id"] for c in cases() if "/mtp" in c["id"]])
def test_vllm_drafts_with_the_assistant_on_the_targets_cache(oracle: dict[str, dict[str, Any]], case_id: str) -> None:
    """vLLM read the plan's --speculative-config as t4serve wrote it: method mtp, the drafter named, its 4 layers
    built and wired to the target's last owning sliding (13) and full (14) layers, none owning a KV cache."""
    entry = oracle[case_id]
    theirs, ours = entry["vllm"], entry["t4serve"]
    if theirs.get("refused"):
        return  # assert_plan_equals_vllm checked that t4serve refuses it too
    env = next(c["env"] for c in cases() if c["id"] == case_id)
    tokens = int(env.get("T4SERVE_NUM_SPECULATIVE_TOKENS", "2"))
    assert (theirs["speculative_method"], theirs["num_speculative_tokens"]) == ("mtp", tokens)
    assert theirs["drafter_layers"] == 4 and theirs["drafter_layers_owning_kv"] == []
    assert [name.split(".")[-3] for name in theirs["drafter_shares_kv_with"]] == ["13", "14"]
    assert ours["speculative"].startswith(f"mtp: {DRAFTER}")


def test_the_drafter_takes_memory_and_no_kv_layout(oracle: dict[str, dict[str, Any]]) -> None:
    """With the drafter the plan's pool is smaller by its weights and activations; its KV layout is the target's."""
    plain = oracle["qat/t4/ngram"]["t4serve"]
    mtp = oracle["qat/t4/mtp"]["t4serve"]
    assert mtp["gpu_weights_bytes"] - plain["gpu_weights_bytes"] == 157_559_816
    assert mtp["kv_cache_memory_bytes"] < plain["kv_cache_memory_bytes"]
    blocks = {p: f["blocks_per_request_by_group"] for p, f in mtp["pools"].items() if f["fits"]}
    assert all(b == next(iter(blocks.values())) for b in blocks.values())
    ngram = oracle["qat/t4/ngram"]["vllm"]
    assert (ngram["speculative_method"], ngram["drafter_layers"]) == ("ngram_gpu", 0)


def test_vllm_allocates_the_drafter_weights_t4serve_plans(docker_bin: str, image_ref: str, root: Path) -> None:
    """The drafter's bytes once vLLM built it beside the target and shared the target's embeddings: its headers'
    bytes in float16, its rotary caches the target's (equal parameters, listed in the same order), and a few scalars
    no checkpoint holds (within the weights oracle's slack)."""
    data = docker(docker_bin, image_ref, root, "/t/oracle/weights_oracle.py", "--model", "/fam/qat", "--mtp")
    theirs = data["drafter"]["after_share_and_process"]
    assert data["drafter"]["model_class"] == "Gemma4MTP" and "rotary" not in theirs["by_part"]
    drafter = probe_model(str(root / "assistant"), hf_home=str(root), offline=True, role=ROLE_DRAFTER)
    target = probe_model(str(root / "qat"), hf_home=str(root), offline=True)
    ours = drafter_gpu(drafter, target.config["text"], max_model_len=16384, batched_tokens=2048, dtype_bytes=2)
    assert ours.rotary == 0
    assert 0 <= theirs["total_bytes"] - ours.loaded <= NON_CHECKPOINT_SLACK, (theirs["total_bytes"], ours.loaded)
