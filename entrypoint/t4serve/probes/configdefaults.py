"""transformers' config-class defaults for the families vLLM serves, applied to a config.json with no import.

vLLM plans from transformers' config class: the class's defaults fill what config.json leaves out, then the class's
`__post_init__` derives fields (Gemma 3's layer types from its 5:1 pattern, Qwen's window dropped unless
`use_sliding_window`). `fill(text)` does the same for the model types in FAMILY_RULES, from data/config-defaults.json
(the class defaults of FIELDS, written from transformers by `python -m t4serve.probes.configdefaults --write`) and the
rules below, each named after the class it mirrors. A model type outside the table gives None: the caller runs vLLM's
own reader where it is installed, or refuses by name. tests/image/test_hfconfig_image.py checks in the image that the
table is the image's transformers and that `fill` equals vLLM's reader on every field the sizing reads.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

DATA_FILE = "config-defaults.json"
# Fields whose class defaults the table records: what the sizing reads, and what the rules below derive from.
FIELDS = (
    "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
    "num_key_value_heads", "head_dim", "max_position_embeddings", "sliding_window", "layer_types",
    "use_sliding_window", "max_window_layers", "no_rope_layer_interval", "no_rope_layers",
    "use_bidirectional_attention", "hidden_size_per_layer_input", "num_kv_shared_layers", "attention_k_eq_v",
    "use_double_wide_mlp", "kv_lora_rank",
)
# A multimodal config whose text_config names no model_type: the text class transformers builds for it.
TEXT_MODEL_TYPES = {"gemma3": "gemma3_text", "gemma4": "gemma4_text", "mistral3": "mistral"}


def _kv_heads(text: dict[str, Any]) -> None:
    if text.get("num_key_value_heads") is None:
        text["num_key_value_heads"] = text.get("num_attention_heads")


def _head_dim(text: dict[str, Any]) -> None:
    if text.get("head_dim") is None and text.get("hidden_size") and text.get("num_attention_heads"):
        text["head_dim"] = int(text["hidden_size"]) // int(text["num_attention_heads"])


def _llama(text: dict[str, Any], written: dict[str, Any]) -> None:
    """LlamaConfig, MistralConfig, GptOssConfig (head_dim part): head_dim = hidden / heads; KV heads = heads."""
    _head_dim(text)
    _kv_heads(text)


def _kv_heads_only(text: dict[str, Any], written: dict[str, Any]) -> None:
    """Phi3Config, Olmo2Config, GraniteConfig: KV heads default to the attention heads."""
    _kv_heads(text)


def _qwen(text: dict[str, Any], written: dict[str, Any]) -> None:
    """Qwen2Config and Qwen3Config (not their MoE classes, whose rules differ): the window only with
    use_sliding_window, and then only from layer max_window_layers on."""
    text["sliding_window"] = text.get("sliding_window") if text.get("use_sliding_window") else None
    _kv_heads(text)
    if text.get("layer_types") is None:
        window, first = text["sliding_window"], int(text.get("max_window_layers") or 0)
        text["layer_types"] = ["sliding_attention" if window is not None and i >= first else "full_attention"
                               for i in range(int(text["num_hidden_layers"]))]


def _alternating(text: dict[str, Any], written: dict[str, Any]) -> None:
    """Gemma2Config and GptOssConfig: even layers (from 0) slide, odd ones attend fully."""
    if text.get("layer_types") is None:
        text["layer_types"] = ["sliding_attention" if (i + 1) % 2 else "full_attention"
                               for i in range(int(text["num_hidden_layers"]))]


def _gpt_oss(text: dict[str, Any], written: dict[str, Any]) -> None:
    _llama(text, written)
    _alternating(text, written)


def _gemma3(text: dict[str, Any], written: dict[str, Any]) -> None:
    """Gemma3TextConfig: a bidirectional model halves its window; layer types from `sliding_window_pattern` (6)."""
    if text.get("use_bidirectional_attention"):
        text["sliding_window"] = int(text["sliding_window"]) // 2 + 1
    pattern = int(written.get("sliding_window_pattern") or 6)
    if text.get("layer_types") is None:
        text["layer_types"] = ["sliding_attention" if (i + 1) % pattern else "full_attention"
                               for i in range(int(text["num_hidden_layers"]))]


def _gemma4(text: dict[str, Any], written: dict[str, Any]) -> None:
    """Gemma4TextConfig: as Gemma 3 with the pattern fixed at 6, the last layer forced to full attention, and the
    full layers' head size `global_head_dim` (512 unless set)."""
    if text.get("use_bidirectional_attention") == "all":
        text["sliding_window"] = int(text["sliding_window"]) // 2 + 1
    if text.get("layer_types") is None:
        text["layer_types"] = ["sliding_attention" if (i + 1) % 6 else "full_attention"
                               for i in range(int(text["num_hidden_layers"]))]
    if text["layer_types"]:
        text["layer_types"] = [*text["layer_types"][:-1], "full_attention"]
    text.setdefault("global_head_dim", 512)


def _linear_hybrid(text: dict[str, Any], written: dict[str, Any]) -> None:
    """GraniteMoeHybridConfig: every layer linear attention unless layer_types (`layers_block_type`) says otherwise;
    planning.kvcache refuses such a model by name."""
    _kv_heads(text)
    if text.get("layer_types") is None:
        text["layer_types"] = text.get("layers_block_type") or ["linear_attention"] * int(text["num_hidden_layers"])


def _smollm3(text: dict[str, Any], written: dict[str, Any]) -> None:
    """SmolLM3Config: layers without RoPE slide where use_sliding_window and a window are set."""
    _kv_heads(text)
    layers = int(text["num_hidden_layers"])
    interval = int(text.get("no_rope_layer_interval") or 4)
    no_rope = text.get("no_rope_layers") or [int((i + 1) % interval != 0) for i in range(layers)]
    text["no_rope_layers"] = no_rope
    if text.get("layer_types") is None:
        slides = bool(text.get("use_sliding_window")) and text.get("sliding_window") is not None
        text["layer_types"] = ["sliding_attention" if slides and not no_rope[i] else "full_attention"
                               for i in range(layers)]


Rule = Callable[[dict[str, Any], dict[str, Any]], None]
# The model types whose defaults and __post_init__ rules t4serve holds (transformers' class in the docstring).
FAMILY_RULES: dict[str, Rule] = {
    "llama": _llama,
    "mistral": _llama,
    "phi3": _kv_heads_only,
    "olmo2": _kv_heads_only,
    "olmoe": _kv_heads_only,
    "granite": _kv_heads_only,
    "granitemoe": _kv_heads_only,
    # Multi-head latent attention: planning.kvcache refuses it by name (kv_lora_rank).
    "deepseek_v2": _kv_heads_only,
    "granitemoehybrid": _linear_hybrid,
    "qwen2": _qwen,
    "qwen3": _qwen,
    "gemma2": _alternating,
    "gemma3_text": _gemma3,
    "gemma4_text": _gemma4,
    "gpt_oss": _gpt_oss,
    "smollm3": _smollm3,
}


@cache
def table() -> dict[str, Any]:
    """data/config-defaults.json: {"transformers": version, "families": {model_type: {field: default}}}."""
    data: dict[str, Any] = json.loads(resources.files("t4serve").joinpath("data", DATA_FILE).read_text())
    return data


def text_model_type(config: dict[str, Any], text: dict[str, Any]) -> str:
    """The model type of the text config: its own, else the text class of the top-level type, else the top level's."""
    own = text.get("model_type")
    if isinstance(own, str) and own:
        return own
    top = str(config.get("model_type") or "")
    return TEXT_MODEL_TYPES.get(top, top)


def fill(model_type: str, written: dict[str, Any]) -> dict[str, Any] | None:
    """The text config transformers' class would hold for `written` (the text part of config.json as written, nulls
    kept): class defaults for the absent FIELDS, then the class's rules. None for a model type not in the table."""
    rule = FAMILY_RULES.get(model_type)
    defaults = table()["families"].get(model_type)
    if rule is None or defaults is None:
        return None
    text = dict(written)
    for name, value in defaults.items():
        if name not in text:
            text[name] = json.loads(json.dumps(value))
    rule(text, written)
    return text


def read_by() -> str:
    """How a filled config was read, for the plan's notes."""
    return f"t4serve's table of transformers {table()['transformers']} config-class defaults and rules"


def _from_transformers() -> dict[str, Any]:
    """The table as the installed transformers gives it (its config classes' dataclass defaults)."""
    import dataclasses

    import transformers  # type: ignore[import-not-found]
    from transformers import CONFIG_MAPPING

    families = {}
    for model_type in sorted(FAMILY_RULES):
        fields = {f.name: f for f in dataclasses.fields(CONFIG_MAPPING[model_type])}
        families[model_type] = {name: fields[name].default for name in FIELDS
                                if name in fields and fields[name].default is not dataclasses.MISSING}
    return {"transformers": transformers.__version__, "families": families}


def main(argv: list[str] | None = None) -> int:
    """`--write`: regenerate the data file from the installed transformers; `--check`: exit 1 when it differs."""
    args = sys.argv[1:] if argv is None else argv
    if args not in (["--write"], ["--check"]):
        print("usage: python -m t4serve.probes.configdefaults --write | --check", file=sys.stderr)
        return 2
    fresh = _from_transformers()
    if args == ["--check"]:
        same = fresh == table()
        print(json.dumps({"same": same, "installed": fresh["transformers"], "table": table()["transformers"]}))
        return 0 if same else 1
    path = Path(str(resources.files("t4serve").joinpath("data", DATA_FILE)))
    path.write_text(json.dumps(fresh, indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
