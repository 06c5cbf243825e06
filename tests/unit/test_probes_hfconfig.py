"""Reading a checkpoint's config as vLLM does where vLLM's reader is not installed (this venv: no vLLM, no
transformers): transformers' defaults and rules from t4serve's table for the families it holds, a refusal by name for
the others. In the image tests/image/test_hfconfig_image.py checks the table against vLLM's reader family by family."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path
from typing import ClassVar

from e2b_checkpoint import e2b_config, write_safetensors
from family_checkpoints import STARCODER2_3B
from sample_facts import t4

from t4serve.config.settings import Settings
from t4serve.pipeline import ensure_model
from t4serve.planning import kvcache
from t4serve.planning.plan import plan
from t4serve.probes import configdefaults, hfconfig
from t4serve.probes.checkpoint import CONFIG_READ_BY, probe_model

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


def test_a_family_in_the_table_gets_its_class_defaults(tmp_path: Path) -> None:
    facts = probe_model(str(checkpoint(tmp_path / "llama", SPARSE_LLAMA)), hf_home=str(tmp_path), offline=True)
    assert facts.source == "local-dir"
    assert "transformers" in facts.config[CONFIG_READ_BY] and "(llama)" in facts.config[CONFIG_READ_BY]
    text = facts.config["text"]
    # LlamaConfig.__post_init__: KV heads default to the attention heads, head_dim to hidden / heads.
    assert (text["num_key_value_heads"], text["head_dim"]) == (16, 64)
    s = Settings.from_environ({"HF_HOME": str(tmp_path), "T4SERVE_MODEL": str(tmp_path / "llama")})
    p = plan(s, ensure_model(s, t4()))
    assert p.sizing is not None
    assert any(n.startswith("model config read as vLLM reads it: t4serve's table") for n in p.sizing.notes)


def test_gemma3_4b_is_filled_with_gemma3_text_defaults(tmp_path: Path) -> None:
    """The published gemma-3-4b-it names no attention heads, head size, layer types or vocabulary."""
    gemma3 = {"architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3",
              "text_config": {"hidden_size": 2560, "intermediate_size": 10240, "model_type": "gemma3_text",
                              "num_hidden_layers": 34, "sliding_window": 1024}}
    facts = probe_model(str(checkpoint(tmp_path / "g3", gemma3)), hf_home=str(tmp_path), offline=True)
    text = facts.config["text"]
    assert (text["num_attention_heads"], text["num_key_value_heads"], text["head_dim"]) == (8, 4, 256)
    assert [i for i, t in enumerate(text["layer_types"]) if t == "full_attention"] == [5, 11, 17, 23, 29]
    assert text["vocab_size"] == 262208


def test_gemma3_1b_slides_five_layers_in_six_not_all(tmp_path: Path) -> None:
    """google/gemma-3-1b-it: model-level sliding_window 512, sliding_window_pattern 6 and no layer_types. As written
    every layer would slide (the model-level window); Gemma3TextConfig makes every sixth layer full."""
    gemma3_1b = {"architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text", "head_dim": 256,
                 "hidden_size": 1152, "intermediate_size": 6912, "max_position_embeddings": 32768,
                 "num_attention_heads": 4, "num_hidden_layers": 26, "num_key_value_heads": 1, "sliding_window": 512,
                 "sliding_window_pattern": 6, "vocab_size": 262144, "torch_dtype": "bfloat16"}
    facts = probe_model(str(checkpoint(tmp_path / "g1", gemma3_1b)), hf_home=str(tmp_path), offline=True)
    specs = kvcache.kv_cache_specs(facts.config["text"], 2)
    assert [s.layer for s in specs if s.kind == "full"] == [5, 11, 17, 23]
    assert len([s for s in specs if s.kind == "sliding"]) == 22


def test_qwen25s_disabled_window_is_not_applied(tmp_path: Path) -> None:
    """Qwen2.5 sets sliding_window with use_sliding_window false: Qwen2Config drops the window."""
    qwen25 = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 1536,
              "intermediate_size": 8960, "max_position_embeddings": 32768, "max_window_layers": 21,
              "num_attention_heads": 12, "num_hidden_layers": 28, "num_key_value_heads": 2, "sliding_window": 32768,
              "use_sliding_window": False, "vocab_size": 151936, "torch_dtype": "bfloat16"}
    facts = probe_model(str(checkpoint(tmp_path / "q", qwen25)), hf_home=str(tmp_path), offline=True)
    assert "sliding_window" not in facts.config["text"]
    assert {s.kind for s in kvcache.kv_cache_specs(facts.config["text"], 2)} == {"full"}
    windowed = dict(qwen25, use_sliding_window=True)
    facts = probe_model(str(checkpoint(tmp_path / "qw", windowed)), hf_home=str(tmp_path), offline=True)
    kinds = [s.kind for s in kvcache.kv_cache_specs(facts.config["text"], 2)]
    assert kinds == ["full"] * 21 + ["sliding"] * 7


def test_a_family_outside_the_table_is_refused_by_name_without_a_reader(tmp_path: Path) -> None:
    other = dict(SPARSE_LLAMA, model_type="jetmoe", architectures=["JetMoeForCausalLM"])
    assert "jetmoe" not in configdefaults.table()["probed"]  # no generic rule reads its class as vLLM does
    facts = probe_model(str(checkpoint(tmp_path / "x", other)), hf_home=str(tmp_path), offline=True)
    assert facts.source == "invalid" and facts.error is not None
    assert "model type jetmoe is not among the families" in facts.error and "gemma3_text" in facts.error
    assert "other model types whose rule it probed against vLLM's reader" in facts.error
    assert "run `t4serve plan` in the image" in facts.error


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


def test_a_config_its_class_rules_cannot_use_is_refused_with_the_reason(tmp_path: Path) -> None:
    bad = dict(SPARSE_LLAMA, model_type="qwen2", num_hidden_layers=None, use_sliding_window=True, sliding_window=64)
    facts = probe_model(str(checkpoint(tmp_path / "bad", bad)), hf_home=str(tmp_path), offline=True)
    assert facts.source == "invalid" and facts.error is not None
    assert "model type qwen2: its config class cannot be built from config.json" in facts.error


# --- families outside the table: their rule probed against vLLM's reader ---------------------------------------------
# The reader below stands for vLLM's get_config + get_hf_text_config on a config.json (the image runs the real one:
# `python -m t4serve.probes.configdefaults --check`, tests/image/test_hfconfig_image.py); each builds a class that
# derives the fields its own way.


@dataclasses.dataclass
class LlamaLike:
    """A config class with the defaults and derivations of transformers' LlamaConfig (head size and KV heads)."""

    vocab_size: int = 32000
    hidden_size: int = 4096
    intermediate_size: int = 11008
    num_hidden_layers: int = 32
    num_attention_heads: int = 32
    num_key_value_heads: int | None = None
    head_dim: int | None = None
    max_position_embeddings: int = 2048


def llama_reader(written: dict[str, object]) -> dict[str, object]:
    text = {f.name: written.get(f.name, f.default) for f in dataclasses.fields(LlamaLike)}
    text.update({k: v for k, v in written.items() if k not in text})
    if text["num_key_value_heads"] is None:
        text["num_key_value_heads"] = text["num_attention_heads"]
    if text["head_dim"] is None:
        text["head_dim"] = int(text["hidden_size"]) // int(text["num_attention_heads"])  # type: ignore[call-overload]
    return text


def rule_of(model_type: str, reader: object) -> str | None:
    entry = configdefaults._probe(model_type, LlamaLike, reader)  # type: ignore[arg-type]
    if entry is None:
        return None
    assert entry["defaults"] == configdefaults._class_defaults(LlamaLike)
    return f"{entry['rule']} {entry['period']}" if "period" in entry else str(entry["rule"])


def test_head_size_and_kv_heads_derived_or_not_read_the_same_as_the_planner_reads_them() -> None:
    """LlamaConfig derives them; a class that leaves them out gets the same from the planner (hidden / heads, the
    attention heads): both follow the defaults rule."""
    def leaves_them_out(written: dict[str, object]) -> dict[str, object]:
        return {**{f.name: f.default for f in dataclasses.fields(LlamaLike)}, **written}

    assert rule_of("llamalike", llama_reader) == "defaults"
    assert rule_of("plain", leaves_them_out) == "defaults"


def test_a_class_refusing_explicit_nulls_is_still_probed_on_the_rest() -> None:
    def reader(written: dict[str, object]) -> dict[str, object]:
        if any(v is None for v in written.values()):
            raise TypeError("Field 'num_key_value_heads' expected int, got NoneType")
        return llama_reader(written)

    assert rule_of("strict", reader) == "defaults"


def test_layer_types_in_a_pattern_are_found_with_their_period() -> None:
    def every_fourth_full(written: dict[str, object]) -> dict[str, object]:
        text = llama_reader(written)
        if text.get("layer_types") is None:
            pattern = int(written.get("sliding_window_pattern") or 4)  # type: ignore[call-overload]
            text["layer_types"] = ["sliding_attention" if (i + 1) % pattern else "full_attention"
                                   for i in range(int(text["num_hidden_layers"]))]  # type: ignore[call-overload]
        return text

    def all_full(written: dict[str, object]) -> dict[str, object]:
        text = llama_reader(written)
        if text.get("layer_types") is None:
            text["layer_types"] = ["full_attention"] * int(text["num_hidden_layers"])  # type: ignore[call-overload]
        return text

    def window_gated(written: dict[str, object]) -> dict[str, object]:
        text = llama_reader(written)
        text["sliding_window"] = text.get("sliding_window") if written.get("use_sliding_window") else None
        return text

    assert rule_of("every-fourth", every_fourth_full) == "periodic 4"
    assert rule_of("all-full", all_full) == "all-full"
    assert rule_of("gated", window_gated) == "window-gated"


def test_a_class_with_its_own_derivation_is_left_to_vllms_reader() -> None:
    def drops_window(written: dict[str, object]) -> dict[str, object]:
        text = llama_reader(written)
        text["sliding_window"] = None  # even with use_sliding_window
        return text

    def layers_from_count(written: dict[str, object]) -> dict[str, object]:
        text = llama_reader(written)
        text["layer_types"] = ["full_attention"] + ["sliding_attention"] * (int(text["num_hidden_layers"]) - 1)  # type: ignore[call-overload]
        return text

    def refuses(written: dict[str, object]) -> dict[str, object]:
        if written.get("head_dim") == 80:
            raise ValueError("head_dim must be a power of two")
        return llama_reader(written)

    for reader in (drops_window, layers_from_count, refuses, lambda written: None):
        assert rule_of("own", reader) is None
    assert configdefaults._probe("not-a-dataclass", object, llama_reader) is None


def test_a_probed_family_is_filled_from_the_table_without_a_reader(tmp_path: Path) -> None:
    """StarCoder2 is outside FAMILY_RULES; the table holds its class defaults and its probed rule, so a host without
    vLLM or transformers plans it, and the notes say how it was read."""
    assert "starcoder2" not in configdefaults.FAMILY_RULES
    probed = configdefaults.table()["probed"]["starcoder2"]
    assert probed["rule"] == "defaults"
    published = dict(STARCODER2_3B)
    directory = checkpoint(tmp_path / "starcoder2", published)
    facts = probe_model(str(directory), hf_home=str(tmp_path), offline=True)
    assert facts.error is None, facts.error
    kept = facts.config
    assert kept[CONFIG_READ_BY].startswith("t4serve's table of transformers")
    assert "probed against vLLM" in kept[CONFIG_READ_BY] and kept[CONFIG_READ_BY].endswith("(starcoder2)")
    assert kept["text"]["num_key_value_heads"] == 2 and kept["text"]["sliding_window"] == 4096


def test_the_cross_check_names_each_disagreement() -> None:
    data = {"probed": {"llamalike": {"rule": "defaults", "defaults": {}}}}

    def disagreeing(written: dict[str, object]) -> dict[str, object]:
        return {**llama_reader(written), "num_hidden_layers": 1}

    original = configdefaults.table
    configdefaults.table.cache_clear()
    try:
        configdefaults.table = lambda: {**original(), **data}  # type: ignore[assignment]
        compared, disagree = configdefaults._cross_check(disagreeing, data, per_type=4)
    finally:
        configdefaults.table = original  # type: ignore[assignment]
    assert compared == 4 and len(disagree) == 4
    assert all(d.startswith("llamalike {") and "num_hidden_layers" in d for d in disagree)


class NamesOfItsOwn:
    """Stands for a transformers config class with `attribute_map` (GPT2Config): standard names read through to its
    own."""

    attribute_map: ClassVar[dict[str, str]] = {"hidden_size": "n_embd", "num_hidden_layers": "n_layer",
                                               "num_attention_heads": "n_head"}

    def __init__(self) -> None:
        self.n_embd, self.n_layer, self.n_head, self.vocab_size = 768, 12, 12, 50257

    def __getattr__(self, name: str) -> object:
        if name in type(self).attribute_map:
            return getattr(self, type(self).attribute_map[name])
        raise AttributeError(name)


def test_the_readers_attributes_carry_the_standard_names_a_class_maps() -> None:
    attributes = hfconfig.config_attributes(NamesOfItsOwn())
    assert attributes["hidden_size"] == 768 and attributes["num_hidden_layers"] == 12
    assert attributes["num_attention_heads"] == 12 and attributes["n_embd"] == 768


def test_a_probed_family_with_names_of_its_own_is_read_from_them(tmp_path: Path) -> None:
    """GPT-2's config.json writes n_embd, n_layer, n_head: the table's entry maps them to the planner's names."""
    assert configdefaults.table()["probed"]["gpt2"]["renames"]["hidden_size"] == "n_embd"
    gpt2 = {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "n_embd": 768, "n_head": 12, "n_layer": 12,
            "n_positions": 1024, "vocab_size": 50257}
    facts = probe_model(str(checkpoint(tmp_path / "gpt2", gpt2)), hf_home=str(tmp_path), offline=True)
    assert facts.error is None, facts.error
    text = facts.config["text"]
    assert (text["hidden_size"], text["num_hidden_layers"], text["num_attention_heads"]) == (768, 12, 12)
    assert text["max_position_embeddings"] == 1024


def test_a_window_of_0_is_no_window_as_vllm_reads_it(tmp_path: Path) -> None:
    """vLLM's ModelConfig turns sliding_window 0 into None (transformers' Qwen2MoeConfig and some checkpoints write
    0): the probe reads it as no window rather than refuse it as out of range, and every layer is full."""
    zero = dict(SPARSE_LLAMA, model_type="mistral", architectures=["MistralForCausalLM"], sliding_window=0)
    facts = probe_model(str(checkpoint(tmp_path / "zero", zero)), hf_home=str(tmp_path), offline=True)
    assert facts.error is None, facts.error
    assert "sliding_window" not in facts.config["text"]
    assert [s.kind for s in kvcache.kv_cache_specs(facts.config["text"], 2)] == ["full"] * 8
    # A negative window is still refused, by name.
    negative = dict(zero, sliding_window=-1)
    facts = probe_model(str(checkpoint(tmp_path / "negative", negative)), hf_home=str(tmp_path), offline=True)
    assert facts.source == "invalid" and facts.error is not None and "sliding_window" in facts.error
