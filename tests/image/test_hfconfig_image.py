"""`t4serve plan` in the image reads a checkpoint's config the way vLLM does: the published google/gemma-3-4b-it
config.json names no attention heads, head size, layer types or vocabulary, and transformers' Gemma3TextConfig (through
vLLM's `get_config`) fills them; outside the image the same checkpoint is refused with the reason
(test_probes_hfconfig.py). The checkpoint is tests/unit/family_checkpoints.py's (published config.json, true headers,
sparse data)."""

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
from family_checkpoints import GEMMA3_TEXT_DEFAULTS, write_family  # noqa: E402


@pytest.fixture(scope="module")
def gemma3(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("gemma3")
    write_family(root / "gemma3", "gemma3")
    for path in (root, *root.rglob("*")):
        path.chmod(0o755 if path.is_dir() else 0o644)
    return root


def run_plan(docker_bin: str, image_ref: str, root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [docker_bin, "run", "--rm", "--network", "none", "-v", f"{root}:/models:ro", image_ref, "plan",
           "--model", "/models/gemma3", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300)


def test_plan_reads_gemma3_through_vllms_config_class(docker_bin: str, image_ref: str, gemma3: Path) -> None:
    done = run_plan(docker_bin, image_ref, gemma3, "--gpu", "a10g", "--max-model-len", "8192", "--json")
    assert done.returncode == 0, done.stderr[-3000:]
    data: dict[str, Any] = json.loads(done.stdout)
    plan = data["plan"]
    sizing = plan["sizing"]
    assert sizing is not None, plan["sizing_error"]
    notes = sizing["notes"]
    assert any(n.startswith("model config read as vLLM reads it: vLLM 0.33.0 get_config") and "Gemma3TextConfig" in n
               for n in notes), notes
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
