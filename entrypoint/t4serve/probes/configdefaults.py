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
import os
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


def _defaults_only(text: dict[str, Any], written: dict[str, Any]) -> None:
    """A class that derives none of FIELDS: what config.json writes, else the class default."""


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


def _window_gated(text: dict[str, Any], written: dict[str, Any]) -> None:
    """Qwen2MoeConfig, Qwen3MoeConfig and the like: the window only with use_sliding_window, layer types untouched."""
    text["sliding_window"] = text.get("sliding_window") if text.get("use_sliding_window") else None


def _slides_from_max_window_layers(text: dict[str, Any], written: dict[str, Any]) -> None:
    """Qwen's layer types without its window gate: with a window, layers from max_window_layers on slide."""
    if text.get("layer_types") is None:
        window, first = text.get("sliding_window"), int(text.get("max_window_layers") or 0)
        text["layer_types"] = ["sliding_attention" if window is not None and i >= first else "full_attention"
                               for i in range(int(text["num_hidden_layers"]))]


def _all_full(text: dict[str, Any], written: dict[str, Any]) -> None:
    """Every layer attends fully unless layer_types says otherwise."""
    if text.get("layer_types") is None:
        text["layer_types"] = ["full_attention"] * int(text["num_hidden_layers"])


def _periodic(period: int) -> Rule:
    """Layer types in a repeating pattern: `period - 1` sliding layers, then a full one (Cohere2Config, Olmo3Config,
    Exaone4Config: the period is the class's, or config.json's `sliding_window_pattern`)."""

    def rule(text: dict[str, Any], written: dict[str, Any]) -> None:
        if text.get("layer_types") is None:
            pattern = int(written.get("sliding_window_pattern") or period)
            text["layer_types"] = ["sliding_attention" if (i + 1) % pattern else "full_attention"
                                   for i in range(int(text["num_hidden_layers"]))]

    return rule


# The rules a family outside FAMILY_RULES may be found to follow (`probed` in the data file), simplest first: vLLM's
# reader, run on PROBES for each of transformers' model types, must agree with one of them, as the planner reads the
# fields (as_planned), on every probe. "periodic" carries its period in the entry.
GENERIC_RULES: dict[str, Rule] = {
    "defaults": _defaults_only,
    "window-gated": _window_gated,
    "qwen": _qwen,
    "slides-from-max-window-layers": _slides_from_max_window_layers,
    "all-full": _all_full,
}


def generic_rule(entry: dict[str, Any]) -> Rule:
    """The rule of a `probed` entry of the data file."""
    if entry["rule"] == "periodic":
        return _periodic(int(entry["period"]))
    return GENERIC_RULES[entry["rule"]]


def as_planned(text: dict[str, Any]) -> dict[str, Any]:
    """FIELDS as t4serve's planner reads them (planning.kvcache.layer_heads): a head size left out is hidden / heads,
    KV heads left out are the attention heads, and a null is the same as a field left out."""
    out = {k: text[k] for k in FIELDS if text.get(k) is not None}
    hidden, heads = out.get("hidden_size"), out.get("num_attention_heads")
    if isinstance(hidden, int) and isinstance(heads, int) and heads > 0:
        out.setdefault("head_dim", hidden // heads)
        out.setdefault("num_key_value_heads", heads)
    return out


# Configs that tell the rules apart: nothing written (the class defaults); sizes without KV heads or head size (are
# they derived?); explicit nulls (derived from a null too?); every field distinct and set, on more layers than
# max_window_layers' usual 28 (kept as written, or changed: a window dropped without use_sliding_window, layer types
# derived from the layer count); layer types written; and the window asked for with use_sliding_window (an unusual
# head size, 1320 / 12 = 110, so that a size the class computes otherwise does not match by chance). Then PROBE_RANDOM
# random configs per type (a seed of its own, not the cross-check's). A class that changes any of them other than by
# one rule is left to vLLM's reader.
PROBES: tuple[dict[str, Any], ...] = (
    {},
    {"hidden_size": 1320, "num_attention_heads": 12, "num_hidden_layers": 5, "intermediate_size": 4096},
    {"hidden_size": 1320, "num_attention_heads": 12, "num_hidden_layers": 5, "head_dim": None,
     "num_key_value_heads": None, "sliding_window": None, "layer_types": None},
    {"hidden_size": 1024, "intermediate_size": 2816, "num_hidden_layers": 41, "num_attention_heads": 16,
     "num_key_value_heads": 4, "head_dim": 80, "vocab_size": 32123, "max_position_embeddings": 5000,
     "sliding_window": 1000},
    {"hidden_size": 1024, "intermediate_size": 2816, "num_hidden_layers": 7, "num_attention_heads": 16,
     "num_key_value_heads": 4, "head_dim": 80, "vocab_size": 32123, "max_position_embeddings": 5000,
     "sliding_window": 1000, "layer_types": ["sliding_attention", "full_attention"] * 3 + ["full_attention"]},
    {"hidden_size": 1024, "intermediate_size": 2816, "num_hidden_layers": 41, "num_attention_heads": 16,
     "num_key_value_heads": 4, "head_dim": 80, "vocab_size": 32123, "max_position_embeddings": 5000,
     "sliding_window": 1000, "use_sliding_window": True},
)


PROBE_RANDOM = 8
PROBE_SEED = 1


@cache
def table() -> dict[str, Any]:
    """data/config-defaults.json: {"transformers": version, "families": {model_type: {field: default}}, "vllm":
    version, "probed": {model_type: {"rule": GENERIC_RULES key or "periodic", "period": n (periodic only),
    "defaults": {field: default}, "renames": {field: the class's own name} (where it has them)}}}."""
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
        probed = table().get("probed", {}).get(model_type)
        if probed is None:
            return None
        return _filled(written, probed["defaults"], generic_rule(probed), probed.get("renames", {}))
    return _filled(written, defaults, rule)


def _filled(written: dict[str, Any], defaults: dict[str, Any], rule: Rule, renames: dict[str, str] | None = None
            ) -> dict[str, Any]:
    """`written` with the standard names of fields it writes under the class's own (`renames`), the class defaults
    for the FIELDS still absent, then `rule`."""
    written = {**{standard: written[own] for standard, own in (renames or {}).items()
                  if standard not in written and own in written}, **written}
    text = dict(written)
    for name, value in defaults.items():
        if name not in text:
            text[name] = json.loads(json.dumps(value))
    rule(text, written)
    return text


def read_by(model_type: str = "") -> str:
    """How a filled config was read, for the plan's notes."""
    by = f"t4serve's table of transformers {table()['transformers']} config-class defaults and rules"
    if model_type not in FAMILY_RULES and model_type in table().get("probed", {}):
        by += f", this family's rule probed against vLLM {table()['vllm']}'s reader"
    return by


def covered() -> str:
    """The model types read from the table, for a refusal of any other."""
    return (f"the families whose transformers config defaults t4serve holds ({', '.join(sorted(FAMILY_RULES))}) or "
            f"the {len(table().get('probed', {}))} other model types whose rule it probed against vLLM's reader")


def _class_defaults(config_class: Any, renames: dict[str, str] | None = None) -> dict[str, Any]:
    """The class's dataclass defaults of FIELDS; with `renames`, also those it keeps under its own names (GPT-2's
    `n_embd`) where the standard name has none."""
    import dataclasses

    fields = {f.name: f for f in dataclasses.fields(config_class)}
    defaults = {}
    for name in FIELDS:
        for field in (name, (renames or {}).get(name)):
            if field in fields and fields[field].default is not dataclasses.MISSING:
                defaults[name] = fields[field].default
                break
    return defaults


def _renames(config_class: Any) -> dict[str, str]:
    """The standard names of FIELDS the class keeps under its own (`attribute_map`), standard name -> its name."""
    mapping = getattr(config_class, "attribute_map", None) or {}
    return {k: v for k, v in mapping.items() if k in FIELDS and isinstance(v, str) and v != k}


def _probe(model_type: str, config_class: Any, read: Callable[[dict[str, Any]], dict[str, Any] | None]
           ) -> dict[str, Any] | None:
    """The `probed` entry of the first rule (GENERIC_RULES, then a period the class's own layer types show) that
    predicts, on every probe, the fields vLLM's reader (`read`) gives as the planner reads them; None when none does,
    the reader refuses a probe, or the class is not a plain text config."""
    import dataclasses

    if not dataclasses.is_dataclass(config_class):
        return None
    renames = _renames(config_class)
    defaults = _class_defaults(config_class, renames)
    import random

    rng = random.Random(f"{PROBE_SEED}:{model_type}")
    outcomes = []
    # A class with names of its own is read from a config.json that writes them (GPT-2's n_embd), as its own are.
    own_names = [{renames.get(k, k): v for k, v in probe.items()} for probe in PROBES[1:]] if renames else []
    for index, probe in enumerate([*PROBES, *(_random_config(rng) for _ in range(PROBE_RANDOM)), *own_names]):
        written = {"model_type": model_type, **probe}
        try:
            got = read(written)
        except Exception:
            # The class refuses the probe (its own validation). Explicit nulls may be refused (vLLM would refuse such
            # a config at start, whatever t4serve plans), and so may a random config; any other refusal leaves the
            # family to vLLM's reader.
            if any(v is None for v in probe.values()) or index >= len(PROBES):
                continue
            return None
        if got is None:
            return None
        outcomes.append((written, as_planned(got)))
    candidates: list[dict[str, Any]] = [{"rule": name} for name in GENERIC_RULES]
    shown = outcomes[0][1].get("layer_types") if outcomes else None
    if isinstance(shown, list) and "full_attention" in shown and shown.index("full_attention") > 0:
        candidates.append({"rule": "periodic", "period": shown.index("full_attention") + 1})
    for entry in candidates:
        rule = generic_rule(entry)
        agree = True
        for written, got in outcomes:
            try:
                text = _filled(written, defaults, rule, renames)
            except (TypeError, ValueError, KeyError, ZeroDivisionError):
                agree = False
                break
            if as_planned(text) != got:
                agree = False
                break
        if agree:
            return {**entry, "defaults": defaults, **({"renames": renames} if renames else {})}
    return None


def _vllm_reader() -> tuple[str, Callable[[dict[str, Any]], dict[str, Any] | None], Callable[[], None]]:
    """vLLM's get_config on a config.json written to a scratch folder, as t4serve.probes.hfconfig runs it; None
    for a config whose text part is another object (a composite class) or has per-layer values."""
    import logging
    import shutil
    import tempfile

    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    import transformers  # type: ignore[import-not-found]
    import vllm
    from vllm.transformers_utils import config as vllm_config
    from vllm.transformers_utils.config import get_config, get_hf_text_config

    from t4serve.probes import hfconfig

    # One try: get_config retries a failed parse after a pause (a hub cache being refreshed); a probe's refusal is
    # final, and hundreds of classes refuse one.
    vllm_config.with_retry = lambda parse, *args, **kwargs: parse()
    transformers.logging.set_verbosity(transformers.logging.CRITICAL)
    logging.getLogger("vllm").setLevel(logging.ERROR)
    scratch = Path(tempfile.mkdtemp(prefix="t4serve-probe-"))

    def read(written: dict[str, Any]) -> dict[str, Any] | None:
        (scratch / "config.json").write_text(json.dumps(written))
        config = get_config(str(scratch), trust_remote_code=False)
        text = get_hf_text_config(config)
        if text is not config:
            return None
        attributes = hfconfig.config_attributes(text)
        return None if hfconfig._layer_overrides(text, attributes) else attributes

    return str(vllm.__version__), read, lambda: shutil.rmtree(scratch, ignore_errors=True)


def _from_transformers(version: str, read: Callable[[dict[str, Any]], dict[str, Any] | None]) -> dict[str, Any]:
    """The table as the installed transformers gives it (its config classes' dataclass defaults), and every other
    model type's rule as probed against the installed vLLM's reader (the image's venv: `--write` runs there)."""
    import transformers
    from transformers import CONFIG_MAPPING
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES  # type: ignore[import-not-found]
    from vllm.transformers_utils.config import _CONFIG_REGISTRY

    families = {model_type: _class_defaults(CONFIG_MAPPING[model_type]) for model_type in sorted(FAMILY_RULES)}
    probed = {}
    # vLLM's own config classes (its registry) are read by vLLM's reader, never from this table.
    for model_type in sorted(set(CONFIG_MAPPING_NAMES) - set(FAMILY_RULES) - set(_CONFIG_REGISTRY)):
        try:
            config_class = CONFIG_MAPPING[model_type]
        except Exception:  # a class transformers cannot import here (a missing optional dependency)
            continue
        entry = _probe(model_type, config_class, read)
        if entry is not None:
            probed[model_type] = entry
    return {"transformers": transformers.__version__, "families": families, "vllm": version, "probed": probed}


def _random_config(rng: Any) -> dict[str, Any]:
    """A config unlike the probes: sizes drawn at random, head size and KV heads written or left to the class."""
    heads = rng.choice((4, 8, 12, 16, 20, 32))
    head_size = rng.choice((48, 64, 96, 128))
    config: dict[str, Any] = {
        "hidden_size": heads * head_size, "num_attention_heads": heads, "num_hidden_layers": rng.randint(2, 40),
        "intermediate_size": rng.randint(1, 64) * 256, "vocab_size": rng.randint(1000, 300000),
        "max_position_embeddings": rng.choice((2048, 8192, 32768, 131072)),
    }
    if rng.random() < 0.5:
        config["num_key_value_heads"] = rng.choice([d for d in range(1, heads + 1) if heads % d == 0])
    if rng.random() < 0.5:
        config["head_dim"] = rng.choice((64, 128, 256))
    if rng.random() < 0.5:
        config["sliding_window"] = rng.choice((512, 1024, 4096))
        if rng.random() < 0.5:
            config["use_sliding_window"] = True
    return config


def _cross_check(read: Callable[[dict[str, Any]], dict[str, Any] | None], data: dict[str, Any], per_type: int = 3,
                 seed: int = 20261206) -> tuple[int, list[str]]:
    """Each probed model type's `fill` against vLLM's reader on `per_type` random configs (not the probes): how many
    the reader built, and every disagreement on FIELDS."""
    import random

    rng = random.Random(seed)
    compared, disagree = 0, []
    for model_type, entry in sorted(data.get("probed", {}).items()):
        renames = entry.get("renames", {})
        configs = [_random_config(rng) for _ in range(per_type)]
        # A class with names of its own: each config also as written with them.
        configs += [{renames.get(k, k): v for k, v in c.items()} for c in configs] if renames else []
        for config in configs:
            written = {"model_type": model_type, **config}
            try:
                got = read(written)
            except Exception:  # the class refuses this config: vLLM would refuse the model too
                continue
            if got is None:
                disagree.append(f"{model_type}: vLLM's reader no longer reads it as a plain text config")
                continue
            compared += 1
            try:
                filled = fill(model_type, written) or {}
            except (TypeError, ValueError, KeyError, ZeroDivisionError) as exc:
                disagree.append(f"{model_type} {json.dumps(written)}: the rule fails ({exc})")
                continue
            want, have = as_planned(got), as_planned(filled)
            if want != have:
                diff = sorted(k for k in set(want) | set(have) if want.get(k, "absent") != have.get(k, "absent"))
                disagree.append(f"{model_type} {json.dumps(written)}: differs in {', '.join(diff)}")
    return compared, disagree


def main(argv: list[str] | None = None) -> int:
    """`--write`: regenerate the data file from the installed transformers and vLLM (run it in the image); `--check`:
    exit 1 when the file differs from them, or when a probed family's rule disagrees with vLLM's reader on random
    configs."""
    args = sys.argv[1:] if argv is None else argv
    if args not in (["--write"], ["--check"]):
        print("usage: python -m t4serve.probes.configdefaults --write | --check", file=sys.stderr)
        return 2
    version, read, done = _vllm_reader()
    try:
        fresh = _from_transformers(version, read)
        if args == ["--check"]:
            same = fresh == table()
            compared, disagree = _cross_check(read, table())
            print(json.dumps({"same": same, "installed": fresh["transformers"], "table": table()["transformers"],
                              "probed": len(table().get("probed", {})), "cross_checked": compared,
                              "disagree": disagree}))
            return 0 if same and not disagree else 1
    finally:
        done()
    path = Path(str(resources.files("t4serve").joinpath("data", DATA_FILE)))
    path.write_text(json.dumps(fresh, indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
