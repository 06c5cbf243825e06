"""Reading a checkpoint's config as vLLM does, and the fallback where vLLM's reader is not installed (this venv: no
vLLM, no transformers). The reader itself runs in the image: tests/image/test_kv_oracle_families.py plans every family
from configs it read, and test_hfconfig_image.py reads the published Gemma 3 config with it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from e2b_checkpoint import e2b_config, write_safetensors
from sample_facts import t4

from t4serve.config.settings import Settings
from t4serve.pipeline import ensure_model
from t4serve.planning import kvcache
from t4serve.planning.plan import plan
from t4serve.probes import hfconfig
from t4serve.probes.checkpoint import CONFIG_READ_BY, CONFIG_UNRESOLVED, probe_model

# A dense decoder's config.json that leaves the KV heads and head size to its class (Llama's shape, small).
SPARSE_LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 1024,
                "intermediate_size": 2816, "num_attention_heads": 16, "num_hidden_layers": 8, "vocab_size": 32000,
                "max_position_embeddings": 4096, "torch_dtype": "bfloat16"}


def checkpoint(directory: Path, config: dict[str, object]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config))
    write_safetensors(directory / "model.safetensors", [("model.embed_tokens.weight", "BF16", [32000, 1024])])
    return directory


def test_without_a_reader_the_resolution_says_why() -> None:
    assert hfconfig.reader_missing() is not None, "this test is for the venv without transformers"
    result = hfconfig.resolve(Path("/nonexistent"))
    assert result.text is None and result.why_not is not None and "transformers" in result.why_not


def test_the_reader_module_answers_in_json_even_without_vllm(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "t4serve.probes.hfconfig", str(tmp_path)], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0
    assert "error" in json.loads(done.stdout)
    usage = subprocess.run([sys.executable, "-m", "t4serve.probes.hfconfig"], capture_output=True, text=True,
                           timeout=60)
    assert usage.returncode == 2 and "usage" in usage.stderr


def test_fallback_names_the_fields_config_json_leaves_to_its_class(tmp_path: Path) -> None:
    facts = probe_model(str(checkpoint(tmp_path / "llama", SPARSE_LLAMA)), hf_home=str(tmp_path), offline=True)
    assert facts.source == "local-dir" and facts.config[CONFIG_READ_BY] is None
    unresolved = facts.config[CONFIG_UNRESOLVED]
    assert "transformers" in unresolved["why"]
    assert {"num_key_value_heads", "head_dim", "sliding_window", "layer_types"} <= set(unresolved["fields"])
    s = Settings.from_environ({"HF_HOME": str(tmp_path), "T4SERVE_MODEL": str(tmp_path / "llama")})
    p = plan(s, ensure_model(s, t4()))
    assert p.sizing is not None
    note = next(n for n in p.sizing.notes if n.startswith("model config: config.json as written"))
    assert "head_dim (hidden_size / num_attention_heads)" in note and "num_key_value_heads" in note


def test_a_config_too_sparse_to_plan_says_what_would_resolve_it(tmp_path: Path) -> None:
    """The published gemma-3-4b-it names no attention heads: transformers' Gemma3TextConfig supplies them; as written
    the checkpoint cannot be planned, and the fact says why and how to get it read."""
    gemma3 = {"architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3",
              "text_config": {"hidden_size": 2560, "intermediate_size": 10240, "model_type": "gemma3_text",
                              "num_hidden_layers": 34, "sliding_window": 1024}}
    facts = probe_model(str(checkpoint(tmp_path / "g3", gemma3)), hf_home=str(tmp_path), offline=True)
    assert facts.source == "invalid" and facts.error is not None
    assert "num_attention_heads must be set" in facts.error
    assert "vLLM's config class" in facts.error and "run t4serve in the image" in facts.error


def test_per_layer_values_give_the_same_heads_as_gemma4s_global_fields() -> None:
    """vLLM's reader hands Gemma 4's 512-wide global heads as per-layer values (transformers' per_layer_config); the
    config.json as written says them with global_head_dim. Both give the same layers."""
    text = e2b_config()["text_config"]
    written = kvcache.layer_heads(text)
    read = dict(text)
    del read["global_head_dim"]
    read[hfconfig.LAYER_OVERRIDES] = [{"head_dim": 512} if t == "full_attention" else {} for t in text["layer_types"]]
    assert kvcache.layer_heads(read) == written
    assert kvcache.head_sizes(read) == [256, 512]


def test_malformed_per_layer_values_are_refused(tmp_path: Path) -> None:
    bad = dict(SPARSE_LLAMA, layer_overrides=[{"head_dim": -1}] * 8)
    facts = probe_model(str(checkpoint(tmp_path / "bad", bad)), hf_home=str(tmp_path), offline=True)
    assert facts.source == "invalid" and facts.error is not None and "layer_overrides head_dim" in facts.error
    short = dict(SPARSE_LLAMA, layer_overrides=[{}])
    facts = probe_model(str(checkpoint(tmp_path / "short", short)), hf_home=str(tmp_path), offline=True)
    assert facts.source == "invalid" and facts.error is not None and "one object per layer (8)" in facts.error


def test_plain_copies_keep_json_values_and_drop_objects() -> None:
    assert hfconfig._plain({"a": 1, "b": [2.5, "x", True, None], "c": (1, 2)}) == {
        "a": 1, "b": [2.5, "x", True, None], "c": [1, 2]}
    assert hfconfig._plain(object()) is None
    assert hfconfig._plain({"a": object(), "b": [object(), 3]}) == {"a": None, "b": [None, 3]}
