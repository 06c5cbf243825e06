"""Writes test checkpoints of model families other than Gemma 4: published config.json files, safetensors headers
true to the checkpoint's tensors (names, dtypes, shapes), data left sparse.

Each family is one published checkpoint, its config.json as the hub serves it (a few fields per family that no
sizing reads, such as a longrope factor table, are recorded where public copies of the file give them). Tensor names
and shapes are what transformers saves for that architecture built from the config (AutoAWQ's GEMM layout for the
AWQ checkpoint): the header of each shard is one file here (the hub's shard split is not reproduced, the bytes per
tensor are). The families, and what each exercises in vLLM's KV planning:

- qwen3: Qwen/Qwen3-4B: explicit head_dim 128 (not hidden / heads), `use_sliding_window: false`;
- llama3: meta-llama/Llama-3.2-3B-Instruct: dense full attention, `llama3` RoPE scaling (max length unscaled);
- phi4mini: microsoft/Phi-4-mini-instruct: a model-level `sliding_window` of 262,144 and no `layer_types`, so vLLM
  makes every layer a sliding-window spec; fused qkv and gate_up projections; longrope;
- gemma3: google/gemma-3-4b-it: a config.json that names few text fields and relies on transformers' Gemma3TextConfig
  defaults (heads, head size 256, sliding pattern 5:1, vocabulary), a SigLIP vision tower, float16 refused by vLLM;
- mistral: mistralai/Mistral-7B-Instruct-v0.1: a real model-level window of 4,096 on every layer;
- smollm3: HuggingFaceTB/SmolLM3-3B: vLLM serves it through its Transformers backend; NoPE layers;
- llama31awq: hugging-quants/Meta-Llama-3.1-8B-Instruct-AWQ-INT4: AWQ int4 (GEMM, group 128) in float16.
- gemma3_1b: google/gemma-3-1b-it: text-only Gemma 3 with a model-level window, `sliding_window_pattern` 6 and no
  `layer_types` (as written every layer would slide; Gemma3TextConfig makes every sixth one full);
- qwen25: Qwen/Qwen2.5-1.5B-Instruct: a `sliding_window` with `use_sliding_window: false` (Qwen2Config drops it).
The last two are typed from the published files' fields (not downloaded here); the tests read no field they leave out.

    python tests/unit/family_checkpoints.py DIR [FAMILY ...]   # write them (all by default) under DIR/FAMILY
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from e2b_checkpoint import write_safetensors

Tensor = tuple[str, str, list[int]]

PHI4_LONG_FACTOR = [
    1, 1.118320672, 1.250641126, 1.398617824, 1.564103225, 1.74916897, 1.956131817, 2.187582649, 2.446418898,
    2.735880826, 3.059592084, 3.421605075, 3.826451687, 4.279200023, 4.785517845, 5.351743533, 5.984965424,
    6.693110555, 7.485043894, 8.370679318, 9.36110372, 10.4687158, 11.70738129, 13.09260651, 14.64173252,
    16.37415215, 18.31155283, 20.47818807, 22.90118105, 25.61086418, 28.64115884, 32.03, 32.1, 32.13, 32.23, 32.6,
    32.61, 32.64, 32.66, 32.7, 32.71, 32.93, 32.97, 33.28, 33.49, 33.5, 44.16, 47.77,
]

CONFIGS: dict[str, dict[str, Any]] = {
    "qwen3": {
        "architectures": ["Qwen3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
        "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu", "hidden_size": 2560,
        "initializer_range": 0.02, "intermediate_size": 9728, "max_position_embeddings": 40960,
        "max_window_layers": 36, "model_type": "qwen3", "num_attention_heads": 32, "num_hidden_layers": 36,
        "num_key_value_heads": 8, "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 1000000,
        "sliding_window": None, "tie_word_embeddings": True, "torch_dtype": "bfloat16",
        "transformers_version": "4.51.0", "use_cache": True, "use_sliding_window": False, "vocab_size": 151936,
    },
    "llama3": {
        "architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
        "bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009], "head_dim": 128, "hidden_act": "silu",
        "hidden_size": 3072, "initializer_range": 0.02, "intermediate_size": 8192, "max_position_embeddings": 131072,
        "mlp_bias": False, "model_type": "llama", "num_attention_heads": 24, "num_hidden_layers": 28,
        "num_key_value_heads": 8, "pretraining_tp": 1, "rms_norm_eps": 1e-05,
        "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                         "original_max_position_embeddings": 8192, "rope_type": "llama3"},
        "rope_theta": 500000.0, "tie_word_embeddings": True, "torch_dtype": "bfloat16",
        "transformers_version": "4.45.0.dev0", "use_cache": True, "vocab_size": 128256,
    },
    "phi4mini": {
        "_name_or_path": "Phi-4-mini-instruct", "architectures": ["Phi3ForCausalLM"], "attention_bias": False,
        "attention_dropout": 0.0,
        "auto_map": {"AutoConfig": "configuration_phi3.Phi3Config",
                     "AutoModelForCausalLM": "modeling_phi3.Phi3ForCausalLM", "AutoTokenizer": "Xenova/gpt-4o"},
        "bos_token_id": 199999, "embd_pdrop": 0.0, "eos_token_id": 199999, "full_attn_mod": 1, "hidden_act": "silu",
        "hidden_size": 3072, "initializer_range": 0.02, "intermediate_size": 8192, "interpolate_factor": 1,
        "lm_head_bias": False, "max_position_embeddings": 131072, "mlp_bias": False, "model_type": "phi3",
        "num_attention_heads": 24, "num_hidden_layers": 32, "num_key_value_heads": 8,
        "original_max_position_embeddings": 4096, "pad_token_id": 199999, "partial_rotary_factor": 0.75,
        "resid_pdrop": 0.0, "rms_norm_eps": 1e-05,
        "rope_scaling": {"long_factor": PHI4_LONG_FACTOR, "short_factor": [1.0] * 48, "type": "longrope"},
        "rope_theta": 10000.0, "sliding_window": 262144, "tie_word_embeddings": True, "torch_dtype": "bfloat16",
        "transformers_version": "4.45.0", "use_cache": True, "vocab_size": 200064,
    },
    "gemma3": {
        "architectures": ["Gemma3ForConditionalGeneration"], "boi_token_index": 255999, "eoi_token_index": 256000,
        "eos_token_id": [1, 106], "image_token_index": 262144, "initializer_range": 0.02,
        "mm_tokens_per_image": 256, "model_type": "gemma3",
        "text_config": {"hidden_size": 2560, "intermediate_size": 10240, "model_type": "gemma3_text",
                        "num_hidden_layers": 34, "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
                        "sliding_window": 1024},
        "torch_dtype": "bfloat16", "transformers_version": "4.50.0.dev0",
        "vision_config": {"hidden_size": 1152, "image_size": 896, "intermediate_size": 4304,
                          "model_type": "siglip_vision_model", "num_attention_heads": 16, "num_hidden_layers": 27,
                          "patch_size": 14, "vision_use_head": False},
    },
    "mistral": {
        "architectures": ["MistralForCausalLM"], "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu",
        "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 14336, "max_position_embeddings": 32768,
        "model_type": "mistral", "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
        "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "sliding_window": 4096, "tie_word_embeddings": False,
        "torch_dtype": "bfloat16", "transformers_version": "4.34.0.dev0", "use_cache": True, "vocab_size": 32000,
    },
    "smollm3": {
        "architectures": ["SmolLM3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
        "bos_token_id": 128000, "eos_token_id": 128012, "hidden_act": "silu", "hidden_size": 2048,
        "initializer_range": 0.02, "intermediate_size": 11008, "max_position_embeddings": 65536, "mlp_bias": False,
        "model_type": "smollm3", "no_rope_layer_interval": 4, "no_rope_layers": [1, 1, 1, 0] * 9,
        "num_attention_heads": 16, "num_hidden_layers": 36, "num_key_value_heads": 4, "pad_token_id": 128004,
        "pretraining_tp": 2, "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 5000000.0,
        "sliding_window": None, "tie_word_embeddings": True, "torch_dtype": "bfloat16",
        "transformers_version": "4.54.0.dev0", "use_cache": False, "use_sliding_window": False, "vocab_size": 128256,
    },
    "llama31awq": {
        "architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
        "bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009], "hidden_act": "silu", "hidden_size": 4096,
        "initializer_range": 0.02, "intermediate_size": 14336, "max_position_embeddings": 131072, "mlp_bias": False,
        "model_type": "llama", "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
        "pretraining_tp": 1,
        "quantization_config": {"bits": 4, "group_size": 128, "modules_to_not_convert": None, "quant_method": "awq",
                                "version": "gemm", "zero_point": True},
        "rms_norm_eps": 1e-05,
        "rope_scaling": {"factor": 8.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                         "original_max_position_embeddings": 8192, "rope_type": "llama3"},
        "rope_theta": 500000.0, "tie_word_embeddings": False, "torch_dtype": "float16",
        "transformers_version": "4.44.0", "use_cache": True, "vocab_size": 128256,
    },
    "gemma3_1b": {
        "architectures": ["Gemma3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
        "attn_logit_softcapping": None, "bos_token_id": 2, "cache_implementation": "hybrid", "eos_token_id": [1, 106],
        "final_logit_softcapping": None, "head_dim": 256, "hidden_activation": "gelu_pytorch_tanh",
        "hidden_size": 1152, "initializer_range": 0.02, "intermediate_size": 6912, "max_position_embeddings": 32768,
        "model_type": "gemma3_text", "num_attention_heads": 4, "num_hidden_layers": 26, "num_key_value_heads": 1,
        "pad_token_id": 0, "query_pre_attn_scalar": 256, "rms_norm_eps": 1e-06, "rope_local_base_freq": 10000,
        "rope_scaling": None, "rope_theta": 1000000, "sliding_window": 512, "sliding_window_pattern": 6,
        "torch_dtype": "bfloat16", "transformers_version": "4.50.0.dev0", "use_cache": True, "vocab_size": 262144,
    },
    "qwen25": {
        "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
        "eos_token_id": 151645, "hidden_act": "silu", "hidden_size": 1536, "initializer_range": 0.02,
        "intermediate_size": 8960, "max_position_embeddings": 32768, "max_window_layers": 21, "model_type": "qwen2",
        "num_attention_heads": 12, "num_hidden_layers": 28, "num_key_value_heads": 2, "rms_norm_eps": 1e-06,
        "rope_theta": 1000000.0, "sliding_window": 32768, "tie_word_embeddings": True, "torch_dtype": "bfloat16",
        "transformers_version": "4.43.1", "use_cache": True, "use_sliding_window": False, "vocab_size": 151936,
    },
}
REPOS = {
    "qwen3": "Qwen/Qwen3-4B",
    "llama3": "meta-llama/Llama-3.2-3B-Instruct",
    "phi4mini": "microsoft/Phi-4-mini-instruct",
    "gemma3": "google/gemma-3-4b-it",
    "mistral": "mistralai/Mistral-7B-Instruct-v0.1",
    "smollm3": "HuggingFaceTB/SmolLM3-3B",
    "llama31awq": "hugging-quants/Meta-Llama-3.1-8B-Instruct-AWQ-INT4",
    "gemma3_1b": "google/gemma-3-1b-it",
    "qwen25": "Qwen/Qwen2.5-1.5B-Instruct",
}
FAMILIES = tuple(CONFIGS)
# A family outside t4serve.probes.configdefaults.FAMILY_RULES, read through its probed rule (config.json only: no
# tensors are written for it): bigcode/starcoder2-3b's config.json, typed from the published file (not downloaded here).
STARCODER2_3B = {"architectures": ["Starcoder2ForCausalLM"], "attention_dropout": 0.1, "bos_token_id": 0,
                 "embedding_dropout": 0.1, "eos_token_id": 0, "hidden_act": "gelu_pytorch_tanh", "hidden_size": 3072,
                 "initializer_range": 0.018042, "intermediate_size": 12288, "layer_norm_epsilon": 1e-05,
                 "max_position_embeddings": 16384, "mlp_type": "default", "model_type": "starcoder2",
                 "norm_epsilon": 1e-05, "norm_type": "layer_norm", "num_attention_heads": 24, "num_hidden_layers": 30,
                 "num_key_value_heads": 2, "residual_dropout": 0.1, "rope_theta": 999999.4420358813,
                 "sliding_window": 4096, "torch_dtype": "float32", "transformers_version": "4.37.0.dev0",
                 "use_bias": True, "use_cache": True, "vocab_size": 49152}
# transformers' Gemma3TextConfig defaults the published gemma-3-4b-it leaves to it (heads, head size, vocabulary).
GEMMA3_TEXT_DEFAULTS = {"num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256, "vocab_size": 262208}


def config(family: str) -> dict[str, Any]:
    """The published config.json of `family`, as a fresh dict."""
    data: dict[str, Any] = json.loads(json.dumps(CONFIGS[family]))
    return data


def _dims(text: dict[str, Any]) -> tuple[int, int, int, int, int, int, int]:
    hidden = text["hidden_size"]
    heads = text["num_attention_heads"]
    kv = text.get("num_key_value_heads") or heads
    head = text.get("head_dim") or hidden // heads
    return hidden, heads, kv, head, text["intermediate_size"], text["num_hidden_layers"], text["vocab_size"]


def _linear(name: str, out: int, inp: int, dtype: str) -> list[Tensor]:
    return [(f"{name}.weight", dtype, [out, inp])]


def _awq_linear(name: str, out: int, inp: int, group: int) -> list[Tensor]:
    """AutoAWQ's GEMM layout: int32 words of eight 4-bit values along the output, per-group zeros and 16-bit scales."""
    return [(f"{name}.qweight", "I32", [inp, out // 8]), (f"{name}.qzeros", "I32", [inp // group, out // 8]),
            (f"{name}.scales", "F16", [inp // group, out])]


def _decoder(text: dict[str, Any], prefix: str, dtype: str, *, qk_norm: bool = False, fused: bool = False,
             gemma_norms: bool = False, awq_group: int | None = None) -> list[Tensor]:
    """A Llama-style decoder's tensors: embedding, each layer's attention, MLP and norms, the final norm."""
    hidden, heads, kv, head, inter, layers, vocab = _dims(text)

    def linear(name: str, out: int, inp: int) -> list[Tensor]:
        return _awq_linear(name, out, inp, awq_group) if awq_group else _linear(name, out, inp, dtype)

    out: list[Tensor] = [(f"{prefix}.embed_tokens.weight", dtype, [vocab, hidden])]
    for i in range(layers):
        p = f"{prefix}.layers.{i}"
        if fused:
            out += linear(f"{p}.self_attn.qkv_proj", (heads + 2 * kv) * head, hidden)
        else:
            out += linear(f"{p}.self_attn.q_proj", heads * head, hidden)
            out += linear(f"{p}.self_attn.k_proj", kv * head, hidden)
            out += linear(f"{p}.self_attn.v_proj", kv * head, hidden)
        out += linear(f"{p}.self_attn.o_proj", hidden, heads * head)
        if qk_norm:
            out += [(f"{p}.self_attn.q_norm.weight", dtype, [head]), (f"{p}.self_attn.k_norm.weight", dtype, [head])]
        if fused:
            out += linear(f"{p}.mlp.gate_up_proj", 2 * inter, hidden)
        else:
            out += linear(f"{p}.mlp.gate_proj", inter, hidden)
            out += linear(f"{p}.mlp.up_proj", inter, hidden)
        out += linear(f"{p}.mlp.down_proj", hidden, inter)
        norms = ["input_layernorm", "post_attention_layernorm"]
        if gemma_norms:
            norms += ["pre_feedforward_layernorm", "post_feedforward_layernorm"]
        out += [(f"{p}.{n}.weight", dtype, [hidden]) for n in norms]
    out.append((f"{prefix}.norm.weight", dtype, [hidden]))
    return out


def _lm_head(text: dict[str, Any], dtype: str) -> list[Tensor]:
    hidden, *_, vocab = _dims(text)
    return [] if text.get("tie_word_embeddings", True) else [("lm_head.weight", dtype, [vocab, hidden])]


def _siglip(vision: dict[str, Any], text_hidden: int, dtype: str) -> list[Tensor]:
    """Gemma 3's SigLIP tower (transformers 4.50 names) and its multimodal projector."""
    width, inter, layers = vision["hidden_size"], vision["intermediate_size"], vision["num_hidden_layers"]
    patches = (vision["image_size"] // vision["patch_size"]) ** 2
    v = "vision_tower.vision_model"
    out: list[Tensor] = [
        (f"{v}.embeddings.patch_embedding.weight", dtype, [width, 3, vision["patch_size"], vision["patch_size"]]),
        (f"{v}.embeddings.patch_embedding.bias", dtype, [width]),
        (f"{v}.embeddings.position_embedding.weight", dtype, [patches, width]),
    ]
    for i in range(layers):
        p = f"{v}.encoder.layers.{i}"
        for proj in ("q_proj", "k_proj", "v_proj", "out_proj"):
            out += [(f"{p}.self_attn.{proj}.weight", dtype, [width, width]),
                    (f"{p}.self_attn.{proj}.bias", dtype, [width])]
        out += [(f"{p}.mlp.fc1.weight", dtype, [inter, width]), (f"{p}.mlp.fc1.bias", dtype, [inter]),
                (f"{p}.mlp.fc2.weight", dtype, [width, inter]), (f"{p}.mlp.fc2.bias", dtype, [width])]
        for norm in ("layer_norm1", "layer_norm2"):
            out += [(f"{p}.{norm}.weight", dtype, [width]), (f"{p}.{norm}.bias", dtype, [width])]
    out += [(f"{v}.post_layernorm.weight", dtype, [width]), (f"{v}.post_layernorm.bias", dtype, [width]),
            ("multi_modal_projector.mm_input_projection_weight", dtype, [width, text_hidden]),
            ("multi_modal_projector.mm_soft_emb_norm.weight", dtype, [width])]
    return out


def _gemma3(cfg: dict[str, Any]) -> list[Tensor]:
    text = {**GEMMA3_TEXT_DEFAULTS, **cfg["text_config"]}
    return (_decoder(text, "language_model.model", "BF16", qk_norm=True, gemma_norms=True)
            + _siglip(cfg["vision_config"], text["hidden_size"], "BF16"))


TENSORS: dict[str, Callable[[dict[str, Any]], list[Tensor]]] = {
    "gemma3_1b": lambda c: _decoder(c, "model", "BF16", qk_norm=True, gemma_norms=True),
    "qwen25": lambda c: _decoder(c, "model", "BF16") + _lm_head(c, "BF16"),
    "qwen3": lambda c: _decoder(c, "model", "BF16", qk_norm=True) + _lm_head(c, "BF16"),
    "llama3": lambda c: _decoder(c, "model", "BF16") + _lm_head(c, "BF16"),
    "phi4mini": lambda c: _decoder(c, "model", "BF16", fused=True) + _lm_head(c, "BF16"),
    "gemma3": _gemma3,
    "mistral": lambda c: _decoder(c, "model", "BF16") + _lm_head(c, "BF16"),
    "smollm3": lambda c: _decoder(c, "model", "BF16") + _lm_head(c, "BF16"),
    "llama31awq": lambda c: _decoder(c, "model", "F16", awq_group=c["quantization_config"]["group_size"])
    + _lm_head(c, "F16"),
}


@dataclass(frozen=True)
class Written:
    family: str
    repo: str
    directory: Path
    tensors: int
    bytes: int


def tensors(family: str) -> list[Tensor]:
    return TENSORS[family](config(family))


def write_family(directory: str | Path, family: str, sparse: bool = True) -> Path:
    """config.json and model.safetensors of `family` in `directory` (created); the data region is a hole when sparse."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(config(family), indent=2) + "\n")
    write_safetensors(out / "model.safetensors", tensors(family), sparse=sparse)
    return out


if __name__ == "__main__":
    root = Path(sys.argv[1])
    for name in sys.argv[2:] or FAMILIES:
        write_family(root / name, name)
        print(f"{root / name}: {REPOS[name]}")
