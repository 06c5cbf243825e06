"""`t4serve plan` in the image reads a checkpoint's config the way vLLM does: the published google/gemma-3-4b-it
config.json names no attention heads, head size, layer types or vocabulary, and transformers' Gemma3TextConfig fills
them, here from t4serve's own table of its defaults (t4serve.probes.configdefaults, checked against the image's
transformers below and against vLLM's reader in test_kv_oracle_families.py); a model type outside the table is read by
vLLM's `get_config` itself. The checkpoint is tests/unit/family_checkpoints.py's (published config.json, true
headers, sparse data)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from .conftest import REPO

pytestmark = pytest.mark.image

sys.path.insert(0, str(REPO / "tests" / "unit"))
from e2b_checkpoint import write_safetensors  # noqa: E402
from family_checkpoints import GEMMA3_TEXT_DEFAULTS, write_family  # noqa: E402


@pytest.fixture(scope="module")
def gemma3(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("gemma3")
    write_family(root / "gemma3", "gemma3")
    for path in (root, *root.rglob("*")):
        path.chmod(0o755 if path.is_dir() else 0o644)
    return root


def run_plan(docker_bin: str, image_ref: str, root: Path, *args: str,
             model: str = "gemma3") -> subprocess.CompletedProcess[str]:
    cmd = [docker_bin, "run", "--rm", "--network", "none", "-v", f"{root}:/models:ro", image_ref, "plan",
           "--model", f"/models/{model}", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300)


def test_plan_reads_gemma3_through_vllms_config_class(docker_bin: str, image_ref: str, gemma3: Path) -> None:
    done = run_plan(docker_bin, image_ref, gemma3, "--gpu", "a10g", "--max-model-len", "8192", "--json")
    assert done.returncode == 0, done.stderr[-3000:]
    data: dict[str, Any] = json.loads(done.stdout)
    plan = data["plan"]
    sizing = plan["sizing"]
    assert sizing is not None, plan["sizing_error"]
    notes = sizing["notes"]
    assert any(n.startswith("model config read as vLLM reads it: t4serve's table of transformers 5.20.2") and
               "(gemma3_text)" in n for n in notes), notes
    # The defaults vLLM plans with: 4 KV heads of 256 on 34 layers, 5 sliding to 1 full, fp16 KV in bfloat16.
    assert plan["dtype"] == "bfloat16"
    assert GEMMA3_TEXT_DEFAULTS["head_dim"] == 256 and GEMMA3_TEXT_DEFAULTS["num_key_value_heads"] == 4
    how = sizing["concurrency"]["how"]
    assert "block = 327,680 B" in how, how  # 5 layers x 4 heads x 16 tokens x 2 x 256 x 2 B
    assert "full layers [5, 11, 17, 23, 29]" in how, how


def test_a_t4_plans_gemma3_in_float32_and_says_why(docker_bin: str, image_ref: str, gemma3: Path) -> None:
    done = run_plan(docker_bin, image_ref, gemma3, "--gpu", "t4", "--kv-cache-memory-bytes", "2GiB",
                    "--max-model-len", "4096", "--json")
    assert done.returncode == 0, done.stderr[-3000:]
    plan = json.loads(done.stdout)["plan"]
    assert plan["dtype"] == "float32"
    assert "does not support float16" in plan["dtype_reason"]
    argv = plan["argv"]
    assert argv[argv.index("--dtype") + 1] == "float32"


def test_the_table_is_the_images_transformers(docker_bin: str, image_ref: str) -> None:
    """data/config-defaults.json holds the image's transformers' class defaults: regenerated when it moves."""
    done = subprocess.run([docker_bin, "run", "--rm", "--network", "none", "--entrypoint", "python", image_ref, "-m",
                           "t4serve.probes.configdefaults", "--check"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1])["same"] is True


def test_a_model_type_outside_the_table_is_read_by_vllms_reader(docker_bin: str, image_ref: str,
                                                                   gemma3: Path) -> None:
    """EXAONE 4 is not in t4serve's table: vLLM's get_config reads it (heads and head size from its class)."""
    config = {"architectures": ["Exaone4ForCausalLM"], "model_type": "exaone4", "hidden_size": 1024,
              "intermediate_size": 2816, "num_attention_heads": 16, "num_key_value_heads": 4, "num_hidden_layers": 8,
              "vocab_size": 32000, "max_position_embeddings": 4096, "torch_dtype": "bfloat16"}
    other = gemma3 / "exaone4"
    other.mkdir(mode=0o755)
    (other / "config.json").write_text(json.dumps(config))
    write_safetensors(other / "model.safetensors", [("model.embed_tokens.weight", "BF16", [32000, 1024])])
    for path in (other, *other.iterdir()):
        path.chmod(0o755 if path.is_dir() else 0o644)
    done = run_plan(docker_bin, image_ref, gemma3, "--gpu", "t4", "--json", model="exaone4")
    assert done.returncode == 0, done.stderr[-3000:]
    notes = json.loads(done.stdout)["plan"]["sizing"]["notes"]
    assert any(n.startswith("model config read as vLLM reads it: vLLM 0.34.0 get_config") for n in notes), notes
