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
from family_checkpoints import GEMMA3_TEXT_DEFAULTS, STARCODER2_3B, write_family  # noqa: E402


@pytest.fixture(scope="module")
def gemma3(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("gemma3")
    write_family(root / "gemma3", "gemma3")
    for path in (root, *root.rglob("*")):
        path.chmod(0o755 if path.is_dir() else 0o644)
    return root


def config_checkpoint(root: Path, name: str, config: dict[str, Any], tensor: tuple[str, str, list[int]]) -> Path:
    """`root/name`: config.json and one tensor's true header, readable by the container's user (uid 1000)."""
    directory = root / name
    directory.mkdir(mode=0o755)
    (directory / "config.json").write_text(json.dumps(config))
    write_safetensors(directory / "model.safetensors", [tensor])
    for path in (root, directory, *directory.iterdir()):
        path.chmod(0o755 if path.is_dir() else 0o644)
    return directory


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
    """data/config-defaults.json holds the image's transformers' class defaults and, for every other model type that
    follows one of the generic rules, the rule found by probing the image's vLLM reader: regenerated when either
    moves. Each probed family is then read both ways on random configs unlike the probes, and must agree."""
    done = subprocess.run([docker_bin, "run", "--rm", "--network", "none", "--entrypoint", "python", image_ref, "-m",
                           "t4serve.probes.configdefaults", "--check"], capture_output=True, text=True, timeout=600)
    result = json.loads(done.stdout.strip().splitlines()[-1])
    print(f"\nconfig table: {result['probed']} probed model types, {result['cross_checked']} random configs read "
          f"both ways, {len(result['disagree'])} disagreements")
    assert done.returncode == 0, json.dumps(result)[:3000] + done.stderr[-3000:]
    assert result["same"] is True and result["disagree"] == []
    assert result["probed"] > 100 and result["cross_checked"] >= result["probed"]


def test_a_probed_family_plans_from_the_table_as_vllms_reader_reads_it(docker_bin: str, image_ref: str,
                                                                         tmp_path: Path) -> None:
    """StarCoder2 is outside t4serve's hand-written rules: `plan` reads it from the table (no vLLM import), with
    every field the sizing reads equal to what vLLM's reader gives for the published config; printed: how long a
    fresh `t4serve plan` takes and its peak memory (the issue's goal: at most 1 s; vLLM's reader took 6.9 s)."""
    config_checkpoint(tmp_path, "starcoder2", STARCODER2_3B, ("model.embed_tokens.weight", "F32", [49152, 3072]))
    script = """
import json, os, statistics, subprocess, sys, time
from t4serve.probes import configdefaults, hfconfig
from t4serve.probes.checkpoint import CONFIG_READ_BY, probe_model
facts = probe_model("/models/starcoder2", hf_home="/tmp", offline=True)
reader = hfconfig.resolve(__import__("pathlib").Path("/models/starcoder2"))
fields = configdefaults.FIELDS
table = {k: facts.config["text"].get(k) for k in fields if facts.config["text"].get(k) is not None}
vllm = {k: reader.text.get(k) for k in fields if reader.text.get(k) is not None}
walls, peak = [], 0
for _ in range(5):
    start = time.perf_counter()
    proc = subprocess.Popen(["t4serve", "plan", "--gpu", "t4", "--model", "/models/starcoder2", "--json"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    walls.append(time.perf_counter() - start)
    peak = max(peak, usage.ru_maxrss)
    assert os.waitstatus_to_exitcode(status) == 0
print(json.dumps({"by": facts.config[CONFIG_READ_BY], "reader_by": reader.by, "table": table, "vllm": vllm,
                  "median_s": statistics.median(walls), "peak_mib": peak / 1024}))
"""
    done = subprocess.run([docker_bin, "run", "--rm", "--network", "none", "-v", f"{tmp_path}:/models:ro",
                           "--entrypoint", "python", image_ref, "-c", script],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    print(f"\nt4serve plan, StarCoder2 from the table: median {result['median_s']:.2f} s of 5 fresh processes, "
          f"peak {result['peak_mib']:.0f} MiB")
    assert "probed against vLLM 0.34.0's reader" in result["by"] and result["by"].endswith("(starcoder2)")
    assert result["reader_by"].startswith("vLLM 0.34.0 get_config")
    assert result["table"] == result["vllm"]
    assert result["table"]["sliding_window"] == 4096 and result["table"]["num_key_value_heads"] == 2


def test_a_model_type_outside_the_table_is_read_by_vllms_reader(docker_bin: str, image_ref: str,
                                                                   gemma3: Path) -> None:
    """JetMoE is neither in t4serve's rules nor probed (no generic rule reads its class as vLLM does): vLLM's
    get_config reads it in a child Python."""
    config = {"architectures": ["JetMoeForCausalLM"], "model_type": "jetmoe", "hidden_size": 1024,
              "intermediate_size": 2816, "num_attention_heads": 16, "num_key_value_heads": 4, "num_hidden_layers": 8,
              "vocab_size": 32000, "max_position_embeddings": 4096, "torch_dtype": "bfloat16"}
    config_checkpoint(gemma3, "jetmoe", config, ("model.embed_tokens.weight", "BF16", [32000, 1024]))
    done = run_plan(docker_bin, image_ref, gemma3, "--gpu", "t4", "--json", model="jetmoe")
    assert done.returncode == 0, done.stderr[-3000:]
    notes = json.loads(done.stdout)["plan"]["sizing"]["notes"]
    assert any(n.startswith("model config read as vLLM reads it: vLLM 0.34.0 get_config") for n in notes), notes


@pytest.mark.parametrize(("family", "config", "read_by", "block"), [
    # GPT-2 from the table: its entry maps n_embd, n_layer and n_head; 12 layers x 12 KV heads x 64 x 2 x 2 B x 16.
    ("gpt2", {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "n_embd": 768, "n_head": 12, "n_layer": 12,
              "n_positions": 1024, "vocab_size": 50257}, "t4serve's table", "block = 589,824 B"),
    # GPT-BigCode (SantaCoder's shape) through vLLM's reader: its class derives one KV head from multi_query, which
    # no generic rule holds; 24 layers x 1 x 128 x 2 x 2 B x 16.
    ("gpt_bigcode", {"architectures": ["GPTBigCodeForCausalLM"], "model_type": "gpt_bigcode", "n_embd": 2048,
                     "n_head": 16, "n_layer": 24, "n_positions": 2048, "n_inner": 8192, "multi_query": True,
                     "vocab_size": 49280}, "vLLM 0.34.0 get_config", "block = 196,608 B"),
])
def test_a_class_with_names_of_its_own_is_planned_by_the_standard_names(
        docker_bin: str, image_ref: str, tmp_path: Path, family: str, config: dict[str, Any], read_by: str,
        block: str) -> None:
    """A config.json that writes n_embd, n_layer and n_head (GPT-2, GPT-BigCode) is read by the names the planner
    reads, whichever reader reads it (before, the reader's copy lacked them and the plan refused the model)."""
    config_checkpoint(tmp_path, family, {**config, "torch_dtype": "float32"},
                      ("transformer.wte.weight", "F32", [config["vocab_size"], config["n_embd"]]))
    done = run_plan(docker_bin, image_ref, tmp_path, "--gpu", "t4", "--json", model=family)
    assert done.returncode == 0, done.stderr[-3000:]
    sizing = json.loads(done.stdout)["plan"]["sizing"]
    assert any(n.startswith(f"model config read as vLLM reads it: {read_by}") for n in sizing["notes"]), sizing["notes"]
    assert block in sizing["concurrency"]["how"], sizing["concurrency"]["how"]


def test_qwen15_moes_window_of_0_is_no_window(docker_bin: str, image_ref: str, tmp_path: Path) -> None:
    """Qwen/Qwen1.5-MoE-A2.7B's config.json (typed from the published file): vLLM's reader gives sliding_window 0
    (Qwen2MoeConfig without use_sliding_window), which vLLM's ModelConfig makes None; the plan reads it so, where it
    used to refuse the model as out of range. 24 layers x 16 KV heads x 128 x 2 x 2 B x 16 tokens a block."""
    config = {"architectures": ["Qwen2MoeForCausalLM"], "model_type": "qwen2_moe", "hidden_size": 2048,
              "intermediate_size": 5632, "moe_intermediate_size": 1408, "shared_expert_intermediate_size": 5632,
              "num_attention_heads": 16, "num_key_value_heads": 16, "num_hidden_layers": 24, "num_experts": 60,
              "num_experts_per_tok": 4, "vocab_size": 151936, "max_position_embeddings": 8192,
              "sliding_window": 32768, "use_sliding_window": False, "max_window_layers": 21,
              "torch_dtype": "bfloat16"}
    config_checkpoint(tmp_path, "qwen15moe", config, ("model.embed_tokens.weight", "BF16", [151936, 2048]))
    done = run_plan(docker_bin, image_ref, tmp_path, "--gpu", "t4", "--json", "--max-model-len", "4096",
                    model="qwen15moe")
    assert done.returncode == 0, done.stderr[-3000:]
    how = json.loads(done.stdout)["plan"]["sizing"]["concurrency"]["how"]
    assert "block = 3,145,728 B" in how and "sliding" not in how, how
