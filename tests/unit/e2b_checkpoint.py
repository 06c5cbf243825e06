"""Writes Gemma 4 E2B test checkpoints: the real config.json and safetensors headers, with sparse (free) data.

`write_checkpoint(dir, kind="bf16"|"qat")` writes config.json plus safetensors files whose headers carry the tensor
names and shapes of google/gemma-4-E2B-it (bf16) or google/gemma-4-E2B-it-qat-w4a16-ct (compressed-tensors W4A16).
Names, shapes and dtypes are what transformers would save for Gemma4ForConditionalGeneration built from
e2b_config(kind), and for QAT what compressed-tensors writes once QAT_QUANTIZATION_CONFIG is applied
(tests/oracle/checkpoint_names.py derives both on the meta device in the image; tests/image/test_checkpoint_names.py
compares). bf16 adds the k_proj/v_proj/k_norm tensors google/gemma-4-E2B-it still ships for the KV-shared layers
(15-34), which transformers ignores on load and vLLM 0.33 drops (`_gemma4_layer_weights_mapper`).

The QAT layout is INFERRED, not read: the hub is unreachable here, so its header was never seen. The evidence:
- a third-party deployment script in the public code index lists google/gemma-4-E2B-it's model.safetensors as
  10,246,621,918 B and the QAT build's as 8,316,306,646 B. The bf16 file written here is 10,246,563,638 B: the
  same tensors (10,246,357,062 B), its header 58,280 B shorter than the published one;
- "the bf16 layout with every text linear pack-quantized" would be 7,521,301,510 B of tensors, and vLLM 0.33 would
  allocate 2.51 GiB less for it than for bf16 (tests/oracle/weights_oracle.py), where the published T4 run saved
  1.78 GiB (published-t4-run.md);
- both gaps close if the QAT checkpoint ships an untied 16-bit lm_head ([262144, 1536], 805,306,368 B; llm-compressor
  keeps lm_head in the ignore list and saves it untied) and none of the KV-shared layers' K/V tensors (10,629,760 B
  quantized; saving a transformers model writes none, as that model has no such modules): 8,315,978,118 B of tensors,
  a file of 8,316,251,022 B here, 55,624 B short of the listed one (bf16: 58,280 B short, so header-sized), and vLLM
  then allocates 0.75 GiB more (a separate lm_head), saving 1.76 GiB against the published 1.78.
So the QAT config unties the embeddings (top-level `tie_word_embeddings`, which transformers' model reads, and the
text config's, which vLLM 0.33's Gemma 4 reads) and the checkpoint holds `lm_head.weight` in 16 bits.
With sparse=True the data region is a hole (header, then truncate to full size): a 10 GB checkpoint costs no disk.

`tokenizer=True` adds a word-level tokenizer over the full 262,144-id vocabulary: id K is the word `tK` (so a prompt
of N such words is N tokens), but for the specials at Gemma 4's own ids (`<pad>` 0, `<eos>` 1, `<bos>` 2, `<unk>` 3,
`<|turn>` 105, the image/audio/video tokens at the ids config.json names, 255999-258884), whose `tK` words are
unknown (still one token). `processor=True` adds the
processor files (image processor, audio feature extractor, video processor, chat template) that vLLM needs to serve
the full multimodal model: the files transformers 5.13.1 saved for Gemma4Processor, checked in under
tests/unit/data/gemma4_processor/ (`python tests/unit/e2b_checkpoint.py --processor-files DIR` regenerates them with
transformers; tests/unit/test_e2b_processor.py compares when transformers is installed).
"""

from __future__ import annotations

import copy
import json
import math
import shutil
import struct
from pathlib import Path
from typing import Any

FULL_LAYERS = (4, 9, 14, 19, 24, 29, 34)

# published-t4-run.md "Gemma 4 E2B architecture"; vision and audio sub-configs are transformers 5.x's defaults, which
# its docs give as the google/gemma-4-e2b-it configuration.
E2B_CONFIG: dict[str, Any] = {
    "architectures": ["Gemma4ForConditionalGeneration"],
    "model_type": "gemma4",
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
    # Multimodal token ids (transformers' Gemma4Config defaults, written out as google/gemma-4-E2B-it's config does);
    # the tokenizer puts these tokens at these ids (SPECIAL_TOKENS).
    "boi_token_id": 255999, "eoi_token_id": 258882, "image_token_id": 258880, "video_token_id": 258884,
    "boa_token_id": 256000, "eoa_token_index": 258883, "audio_token_id": 258881,
    "text_config": {
        "model_type": "gemma4_text",
        "vocab_size": 262144,
        "hidden_size": 1536,
        "intermediate_size": 6144,
        "num_hidden_layers": 35,
        "num_attention_heads": 8,
        "num_key_value_heads": 1,
        "head_dim": 256,
        "global_head_dim": 512,
        "hidden_activation": "gelu_pytorch_tanh",
        "max_position_embeddings": 131072,
        "rms_norm_eps": 1e-06,
        "tie_word_embeddings": True,
        "sliding_window": 512,
        "layer_types": ["full_attention" if i in FULL_LAYERS else "sliding_attention" for i in range(35)],
        "final_logit_softcapping": 30.0,
        "vocab_size_per_layer_input": 262144,
        "hidden_size_per_layer_input": 256,
        "num_kv_shared_layers": 20,
        "use_double_wide_mlp": True,
        "attention_k_eq_v": False,
        "enable_moe_block": False,
        "rope_parameters": {
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1000000.0},
        },
        "pad_token_id": 0,
        "eos_token_id": 1,
        "bos_token_id": 2,
        "torch_dtype": "bfloat16",
    },
    "vision_config": {"model_type": "gemma4_vision", "hidden_size": 768, "intermediate_size": 3072,
                      "num_hidden_layers": 16, "num_attention_heads": 12, "head_dim": 64,
                      "position_embedding_size": 10240, "patch_size": 16,
                      # vLLM 0.26.0's Gemma 4 reads `vision_config.default_output_length` (soft tokens per image)
                      # for every multimodal start; transformers 5.13.1's Gemma4VisionConfig has no such field, so
                      # it must be in config.json. 3x3 pooling of 16-pixel patches, 280 tokens: the processor's.
                      "pooling_kernel_size": 3, "default_output_length": 280},
    "audio_config": {"model_type": "gemma4_audio", "hidden_size": 1024, "num_hidden_layers": 12,
                     "num_attention_heads": 8, "output_proj_dims": 1536, "conv_kernel_size": 5,
                     "subsampling_conv_channels": [128, 32]},
}

# compressed-tensors W4A16: int4 symmetric, group 32, pack-quantized; embeddings, lm_head, vision and audio kept 16-bit.
# With per_layer_model_projection quantized too, bf16 / QAT bytes read per token is 4.597 GB / 1.862 GB = 2.47x as
# published (QAT's output layer is its own 16-bit lm_head, the same size as the tied embedding bf16 reads).
QAT_QUANTIZATION_CONFIG: dict[str, Any] = {
    "quant_method": "compressed-tensors",
    "format": "pack-quantized",
    "config_groups": {
        "group_0": {
            "targets": ["Linear"],
            "weights": {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "group", "group_size": 32},
            "input_activations": None,
        }
    },
    "ignore": ["lm_head", "re:.*vision_tower.*", "re:.*audio_tower.*", "re:.*embed_vision.*", "re:.*embed_audio.*"],
}

DTYPE_BYTES = {"BF16": 2, "F16": 2, "F32": 4, "I32": 4, "I64": 8}


def e2b_config(kind: str = "bf16") -> dict[str, Any]:
    config = copy.deepcopy(E2B_CONFIG)
    if kind == "qat":
        config["quantization_config"] = copy.deepcopy(QAT_QUANTIZATION_CONFIG)
        # Untied (inferred, see the module docstring): transformers 5.20's Gemma4ForConditionalGeneration ties by the
        # top-level flag (`get_expanded_tied_weights_keys` reads self.config), vLLM 0.33's Gemma4ForCausalLM by the
        # text config's (`if config.tie_word_embeddings` on `_get_text_config(hf_config)`).
        config["tie_word_embeddings"] = False
        config["text_config"]["tie_word_embeddings"] = False
    elif kind != "bf16":
        raise ValueError(f"kind must be 'bf16' or 'qat', not {kind!r}")
    return config


def _text_tensors(text: dict[str, Any], shared_kv: bool) -> list[tuple[str, list[int], bool]]:
    """(name, shape, is_quantizable_linear) for the text stack, in checkpoint order; `shared_kv`: with the KV-shared
    layers' k_proj, v_proj and k_norm (google/gemma-4-E2B-it ships them; the QAT build, by its size, does not)."""
    hidden = text["hidden_size"]
    ple = text["hidden_size_per_layer_input"]
    layers = text["num_hidden_layers"]
    first_shared = layers - text["num_kv_shared_layers"]
    out: list[tuple[str, list[int], bool]] = [
        ("model.language_model.embed_tokens.weight", [text["vocab_size"], hidden], False),
        ("model.language_model.embed_tokens_per_layer.weight",
         [text["vocab_size_per_layer_input"], layers * ple], False),
        ("model.language_model.per_layer_model_projection.weight", [layers * ple, hidden], True),
        ("model.language_model.per_layer_projection_norm.weight", [ple], False),
        ("model.language_model.norm.weight", [hidden], False),
    ]
    for i, layer_type in enumerate(text["layer_types"]):
        p = f"model.language_model.layers.{i}."
        head = text["global_head_dim"] if layer_type == "full_attention" else text["head_dim"]
        q = text["num_attention_heads"] * head
        kv = text["num_key_value_heads"] * head
        mlp = text["intermediate_size"] * (2 if text.get("use_double_wide_mlp") and i >= first_shared else 1)
        owns_kv = shared_kv or i < first_shared
        out += [(p + "layer_scalar", [1], False), (p + "self_attn.q_proj.weight", [q, hidden], True)]
        if owns_kv:
            out += [(p + "self_attn.k_proj.weight", [kv, hidden], True),
                    (p + "self_attn.v_proj.weight", [kv, hidden], True)]
        out += [(p + "self_attn.o_proj.weight", [hidden, q], True), (p + "self_attn.q_norm.weight", [head], False)]
        if owns_kv:
            out.append((p + "self_attn.k_norm.weight", [head], False))
        out += [
            (p + "mlp.gate_proj.weight", [mlp, hidden], True),
            (p + "mlp.up_proj.weight", [mlp, hidden], True),
            (p + "mlp.down_proj.weight", [hidden, mlp], True),
            (p + "per_layer_input_gate.weight", [ple, hidden], True),
            (p + "per_layer_projection.weight", [hidden, ple], True),
        ]
        out += [(p + n + ".weight", [hidden], False) for n in (
            "input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm", "post_feedforward_layernorm",
            "post_per_layer_input_norm")]
    return out


def _vision_tensors(vision: dict[str, Any], text_hidden: int) -> list[tuple[str, list[int]]]:
    h, m, hd = vision["hidden_size"], vision["intermediate_size"], vision["head_dim"]
    p = "model.vision_tower."
    out = [(p + "patch_embedder.position_embedding_table", [2, vision["position_embedding_size"], h]),
           (p + "patch_embedder.input_proj.weight", [h, 3 * vision["patch_size"] ** 2 // 1])]
    # input_proj maps a 16x16x3 patch (768 values) to hidden 768.
    for i in range(vision["num_hidden_layers"]):
        lp = f"{p}encoder.layers.{i}."
        out += [(lp + f"self_attn.{n}_proj.linear.weight", [h, h]) for n in ("q", "k", "v", "o")]
        out += [(lp + "self_attn.q_norm.weight", [hd]), (lp + "self_attn.k_norm.weight", [hd]),
                (lp + "mlp.gate_proj.linear.weight", [m, h]), (lp + "mlp.up_proj.linear.weight", [m, h]),
                (lp + "mlp.down_proj.linear.weight", [h, m])]
        out += [(lp + n + ".weight", [h]) for n in (
            "input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm", "post_feedforward_layernorm")]
    out.append(("model.embed_vision.embedding_projection.weight", [text_hidden, h]))
    return out


def _audio_tensors(audio: dict[str, Any], text_hidden: int) -> list[tuple[str, list[int]]]:
    h = audio["hidden_size"]
    c0, c1 = audio["subsampling_conv_channels"]
    p = "model.audio_tower."
    out = [(p + "subsample_conv_projection.layer0.conv.weight", [c0, 1, 3, 3]),
           (p + "subsample_conv_projection.layer0.norm.weight", [c0]),
           (p + "subsample_conv_projection.layer1.conv.weight", [c1, c0, 3, 3]),
           (p + "subsample_conv_projection.layer1.norm.weight", [c1]),
           (p + "subsample_conv_projection.input_proj_linear.weight", [h, h])]

    def clipped(name: str, shape: list[int]) -> list[tuple[str, list[int]]]:
        return [(name + ".linear.weight", shape)] + [(f"{name}.{b}", []) for b in
                                                       ("input_min", "input_max", "output_min", "output_max")]

    for i in range(audio["num_hidden_layers"]):
        lp = f"{p}layers.{i}."
        for ff in ("feed_forward1", "feed_forward2"):
            out += clipped(lp + ff + ".ffw_layer_1", [4 * h, h]) + clipped(lp + ff + ".ffw_layer_2", [h, 4 * h])
            out += [(lp + ff + ".pre_layer_norm.weight", [h]), (lp + ff + ".post_layer_norm.weight", [h])]
        out.append((lp + "self_attn.per_dim_scale", [h // audio["num_attention_heads"]]))
        for n in ("q_proj", "k_proj", "v_proj", "post"):
            out += clipped(lp + "self_attn." + n, [h, h])
        out.append((lp + "self_attn.relative_k_proj.weight", [h, h]))
        out += clipped(lp + "lconv1d.linear_start", [2 * h, h]) + clipped(lp + "lconv1d.linear_end", [h, h])
        out += [(lp + "lconv1d.depthwise_conv1d.weight", [h, 1, audio["conv_kernel_size"]]),
                (lp + "lconv1d.pre_layer_norm.weight", [h]), (lp + "lconv1d.conv_norm.weight", [h]),
                (lp + "norm_pre_attn.weight", [h]), (lp + "norm_post_attn.weight", [h]), (lp + "norm_out.weight", [h])]
    out += [(p + "output_proj.weight", [audio["output_proj_dims"], h]),
            (p + "output_proj.bias", [audio["output_proj_dims"]]),
            ("model.embed_audio.embedding_projection.weight", [text_hidden, text_hidden])]
    return out


def checkpoint_tensors(kind: str = "bf16") -> list[tuple[str, str, list[int]]]:
    """(name, safetensors dtype, shape) of every tensor in the checkpoint, in file order."""
    config = e2b_config(kind)
    text = config["text_config"]
    out: list[tuple[str, str, list[int]]] = []
    if not config["tie_word_embeddings"]:
        # An untied output layer, kept 16-bit by QAT_QUANTIZATION_CONFIG's ignore list.
        out.append(("lm_head.weight", "BF16", [text["vocab_size"], text["hidden_size"]]))
    for name, shape, linear in _text_tensors(text, shared_kv=kind == "bf16"):
        if kind == "qat" and linear:
            base = name.removesuffix(".weight")
            rows, cols = shape
            out += [(base + ".weight_packed", "I32", [rows, math.ceil(cols * 4 / 32)]),
                    (base + ".weight_scale", "BF16", [rows, cols // 32]),
                    (base + ".weight_shape", "I64", [2])]
        else:
            out.append((name, "BF16", shape))
    out += [(n, "BF16", s) for n, s in _vision_tensors(config["vision_config"], text["hidden_size"])]
    out += [(n, "BF16", s) for n, s in _audio_tensors(config["audio_config"], text["hidden_size"])]
    return out


def tensor_bytes(dtype: str, shape: list[int]) -> int:
    return DTYPE_BYTES[dtype] * math.prod(shape)


def write_safetensors(path: Path, tensors: list[tuple[str, str, list[int]]], *, sparse: bool = True,
                      metadata: dict[str, str] | None = None) -> int:
    """Write one safetensors file (header + data region); returns its size. Data is zeros (a hole when sparse)."""
    header: dict[str, Any] = {"__metadata__": metadata or {"format": "pt"}}
    offset = 0
    for name, dtype, shape in tensors:
        size = tensor_bytes(dtype, shape)
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)  # safetensors pads the header to 8-byte alignment with spaces
    with path.open("wb") as f:
        f.write(struct.pack("<Q", len(blob)))
        f.write(blob)
        if sparse:
            f.truncate(8 + len(blob) + offset)
        else:
            f.write(b"\0" * offset)
    return 8 + len(blob) + offset


VOCAB_SIZE = E2B_CONFIG["text_config"]["vocab_size"]

# Gemma 4's special tokens at its own ids. The multimodal ids are transformers' Gemma4Config defaults (boi 255999, boa
# 256000, image 258880, audio 258881, eoi 258882, eoa 258883, video 258884), which vLLM reads from the config
# (`config.boi_token_id`, ...) and the processor from the tokenizer (`tokenizer.image_token_id`, ...): both must agree.
# The text ones (mask, tool, think, channel and turn markers) are where google/gemma-4-E2B-it's vocabulary puts them,
# as public Gemma 4 tokenizer fixtures list them.
SPECIAL_TOKENS: dict[str, int] = {
    "<pad>": 0, "<eos>": 1, "<bos>": 2, "<unk>": 3, "<mask>": 4,
    "<|tool>": 46, "<tool|>": 47, "<|tool_call>": 48, "<tool_call|>": 49, "<|tool_response>": 50,
    "<tool_response|>": 51, '<|"|>': 52, "<|think|>": 98, "<|channel>": 100, "<channel|>": 101,
    "<|turn>": 105, "<turn|>": 106,
    "<|image>": 255999, "<|audio>": 256000, "<|image|>": 258880, "<|audio|>": 258881, "<image|>": 258882,
    "<audio|>": 258883, "<|video|>": 258884,
}
# tokenizer_config.json's named tokens, as google/gemma-4-E2B-it's names them; the processor reads image_token,
# boi_token, eoi_token, audio_token, boa_token, eoa_token as tokenizer attributes (and `<|video|>` by its text).
NAMED_TOKENS: dict[str, str] = {
    "bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>", "unk_token": "<unk>", "mask_token": "<mask>",
    "image_token": "<|image|>", "boi_token": "<|image>", "eoi_token": "<image|>",
    "audio_token": "<|audio|>", "boa_token": "<|audio>", "eoa_token": "<audio|>",
    "sot_token": "<|turn>", "eot_token": "<turn|>", "soc_token": "<|channel>", "eoc_token": "<channel|>",
    "think_token": "<|think|>", "escape_token": '<|"|>', "std_token": "<|tool>", "etd_token": "<tool|>",
    "stc_token": "<|tool_call>", "etc_token": "<tool_call|>", "str_token": "<|tool_response>",
    "etr_token": "<tool_response|>",
}
# config.json attribute -> the token at that id (the config's value is transformers' default, see above).
CONFIG_TOKEN_IDS: dict[str, str] = {
    "boi_token_id": "<|image>", "eoi_token_id": "<image|>", "image_token_id": "<|image|>",
    "boa_token_id": "<|audio>", "eoa_token_index": "<audio|>", "audio_token_id": "<|audio|>",
    "video_token_id": "<|video|>",
}
GENERATION_CONFIG: dict[str, Any] = {"bos_token_id": 2, "eos_token_id": 1, "pad_token_id": 0}
PROCESSOR_DATA = Path(__file__).resolve().parent / "data" / "gemma4_processor"
# What PROCESSOR_DATA holds (tokenizer.json is not among them: tokenizer_json() builds it).
PROCESSOR_FILES = ("processor_config.json", "chat_template.jinja", "tokenizer_config.json")

# A Gemma 4-shaped chat template (turn markers, one placeholder token per image/audio/video part) over the test
# vocabulary: role words are unknown tokens, text passes through.
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}<|turn>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'text' %}{{ part['text'] }}"
    "{% elif part['type'] == 'image' %}<|image|>{% elif part['type'] == 'audio' %}<|audio|>"
    "{% elif part['type'] == 'video' %}<|video|>{% endif %}{% endfor %}{% endif %}<turn|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|turn>model\n{% endif %}"
)


def tokenizer_vocab() -> dict[str, int]:
    """Word -> id over all VOCAB_SIZE ids: `tK` for id K, the special tokens at their own ids."""
    by_id = {i: t for t, i in SPECIAL_TOKENS.items()}
    return {by_id.get(i, f"t{i}"): i for i in range(VOCAB_SIZE)}


# transformers' save adds this post-processor: no BOS/EOS around a prompt (so N words stay N tokens).
_NO_SPECIALS: dict[str, Any] = {
    "type": "TemplateProcessing", "single": [{"Sequence": {"id": "A", "type_id": 0}}],
    "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}], "special_tokens": {}}


def tokenizer_json() -> dict[str, Any]:
    """tokenizer.json as transformers 5.13.1 saves a `tokenizers` WordLevel model with a WhitespaceSplit pre-tokenizer
    and every special token added (so `<|image>` etc. split out of text with no spaces around them)."""
    added = [{"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False, "normalized": False,
              "special": True} for t, i in sorted(SPECIAL_TOKENS.items(), key=lambda kv: kv[1])]
    return {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added, "normalizer": None,
            "pre_tokenizer": {"type": "WhitespaceSplit"}, "post_processor": _NO_SPECIALS, "decoder": None,
            "model": {"type": "WordLevel", "vocab": tokenizer_vocab(), "unk_token": "<unk>"}}


def tokenizer_config() -> dict[str, Any]:
    """The tokenizer_config.json the processor files are generated from (transformers rewrites it on save)."""
    return {"tokenizer_class": "PreTrainedTokenizerFast", **NAMED_TOKENS, "extra_special_tokens": ["<|video|>"],
            "padding_side": "left", "model_max_length": E2B_CONFIG["text_config"]["max_position_embeddings"],
            "chat_template": CHAT_TEMPLATE}


def write_tokenizer(directory: str | Path) -> Path:
    """tokenizer.json, tokenizer_config.json and generation_config.json into `directory`."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    (d / "tokenizer.json").write_text(json.dumps(tokenizer_json(), ensure_ascii=False))
    (d / "tokenizer_config.json").write_text(json.dumps(tokenizer_config(), indent=2) + "\n")
    (d / "generation_config.json").write_text(json.dumps(GENERATION_CONFIG, indent=2) + "\n")
    return d


def write_processor(directory: str | Path) -> Path:
    """The checked-in Gemma 4 processor files (and the tokenizer_config.json saved with them) into `directory`."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    for name in PROCESSOR_FILES:
        shutil.copyfile(PROCESSOR_DATA / name, d / name)
    return d


def generate_processor_files(out: str | Path) -> list[str]:
    """Save Gemma4Processor with transformers' own classes into `out` (needs transformers, torch, torchvision):
    Gemma4ImageProcessor, Gemma4AudioFeatureExtractor and Gemma4VideoProcessor with their defaults, which are the
    E2B values (vision patch 16, pooling 3, 280 soft tokens; 16 kHz, 128 mel bins), over this module's tokenizer.
    Returns the names of the files written."""
    import tempfile

    from transformers import AutoTokenizer
    from transformers.models.gemma4.feature_extraction_gemma4 import Gemma4AudioFeatureExtractor
    from transformers.models.gemma4.image_processing_gemma4 import Gemma4ImageProcessor
    from transformers.models.gemma4.processing_gemma4 import Gemma4Processor
    from transformers.models.gemma4.video_processing_gemma4 import Gemma4VideoProcessor

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        tok = AutoTokenizer.from_pretrained(write_tokenizer(tmp))
        processor = Gemma4Processor(feature_extractor=Gemma4AudioFeatureExtractor(),
                                    image_processor=Gemma4ImageProcessor(), tokenizer=tok,
                                    video_processor=Gemma4VideoProcessor(), chat_template=CHAT_TEMPLATE)
        processor.save_pretrained(str(out))
    return sorted(p.name for p in out.iterdir())


def write_checkpoint(directory: str | Path, kind: str = "bf16", sparse: bool = True, shards: int = 1,
                     config: dict[str, Any] | None = None, tokenizer: bool = False, processor: bool = False) -> Path:
    """Write config.json and the safetensors files of an E2B checkpoint into `directory` (created); `tokenizer`: also
    the word-level tokenizer and generation_config.json; `processor`: also the Gemma 4 processor files (implies
    `tokenizer`, whose config names the processor's special tokens)."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    # Keys sorted, as transformers saves config.json (`to_json_string`): vLLM caches rotary embeddings by their rope
    # parameters in order (`get_rope`), so the order decides whether the drafter shares the target's.
    (d / "config.json").write_text(json.dumps(config if config is not None else e2b_config(kind), indent=2,
                                              sort_keys=True))
    if tokenizer or processor:
        write_tokenizer(d)
    if processor:
        write_processor(d)
    tensors = checkpoint_tensors(kind)
    if shards == 1:
        write_safetensors(d / "model.safetensors", tensors, sparse=sparse)
        return d
    per = math.ceil(len(tensors) / shards)
    weight_map: dict[str, str] = {}
    total = 0
    for i in range(shards):
        part = tensors[i * per:(i + 1) * per]
        name = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        write_safetensors(d / name, part, sparse=sparse)
        total += sum(tensor_bytes(dt, s) for _, dt, s in part)
        weight_map.update({n: name for n, _, _ in part})
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (d / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    return d


def write_hf_cache(hf_home: str | Path, repo_id: str, kind: str = "bf16", revision: str = "0" * 40,
                   **kwargs: Any) -> Path:
    """Write the checkpoint in the HF cache layout: $HF_HOME/hub/models--org--name/snapshots/<rev>/, refs/main."""
    repo_dir = Path(hf_home) / "hub" / ("models--" + repo_id.replace("/", "--"))
    (repo_dir / "refs").mkdir(parents=True, exist_ok=True)
    (repo_dir / "refs" / "main").write_text(revision)
    return write_checkpoint(repo_dir / "snapshots" / revision, kind=kind, **kwargs)


# google/gemma-4-E2B-it-assistant's config.json, as its Hugging Face repository publishes it (revision 2d874ef7d29f,
# printed whole in a public log of a Hugging Face cache; the same fields appear in SGLang's and mlx ports' tests of it):
# Gemma 4 E2B's MTP drafter, 4 decoder layers of width 256 whose attention reads the target's KV cache (all four layers
# KV-shared: no K/V projections), a centroid-masked output head over the 262,144-token vocabulary, and projections from
# and to the target's width (backbone_hidden_size 1536).
ASSISTANT_REPO = "google/gemma-4-E2B-it-assistant"
ASSISTANT_CONFIG: dict[str, Any] = {
    "architectures": ["Gemma4AssistantForCausalLM"],
    "audio_token_id": 258881, "backbone_hidden_size": 1536, "boa_token_id": 256000, "boi_token_id": 255999,
    "centroid_intermediate_top_k": 32, "dtype": "bfloat16", "eoa_token_id": 258883, "eoi_token_id": 258882,
    "image_token_id": 258880, "model_type": "gemma4_assistant", "num_centroids": 2048,
    "text_config": {
        "attention_bias": False, "attention_dropout": 0.0, "attention_k_eq_v": False, "bos_token_id": 2,
        "dtype": "bfloat16", "enable_moe_block": False, "eos_token_id": 1, "final_logit_softcapping": None,
        "global_head_dim": 512, "head_dim": 256, "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 256,
        "hidden_size_per_layer_input": 0, "initializer_range": 0.02, "intermediate_size": 2048,
        "layer_types": ["sliding_attention", "sliding_attention", "sliding_attention", "full_attention"],
        "max_position_embeddings": 131072, "model_type": "gemma4_text", "moe_intermediate_size": None,
        "num_attention_heads": 4, "num_experts": None, "num_global_key_value_heads": None, "num_hidden_layers": 4,
        "num_key_value_heads": 1, "num_kv_shared_layers": 4, "pad_token_id": 0, "rms_norm_eps": 1e-06,
        "rope_parameters": {
            "full_attention": {"partial_rotary_factor": 0.25, "rope_theta": 1000000.0, "rope_type": "proportional"},
            "sliding_attention": {"rope_theta": 10000.0, "rope_type": "default"},
        },
        "sliding_window": 512, "tie_word_embeddings": True, "top_k_experts": None,
        "use_bidirectional_attention": None, "use_cache": True, "use_double_wide_mlp": False, "vocab_size": 262144,
        "vocab_size_per_layer_input": 0,
    },
    "tie_word_embeddings": True,
    "transformers_version": "5.7.0.dev0",
    "use_ordered_embeddings": True,
}


def assistant_tensors() -> list[tuple[str, str, list[int]]]:
    """(name, dtype, shape) of the assistant's model.safetensors: what transformers saves for
    Gemma4AssistantForCausalLM built from ASSISTANT_CONFIG (its text model's layers are all KV-shared, so they hold a
    query projection and norm but no K/V; the output head is tied to the embeddings and not saved; the centroid head's
    token ordering is an int64 buffer). tests/oracle/checkpoint_names.py derives the same on the meta device."""
    text = ASSISTANT_CONFIG["text_config"]
    hidden, mlp, heads = text["hidden_size"], text["intermediate_size"], text["num_attention_heads"]
    backbone = ASSISTANT_CONFIG["backbone_hidden_size"]
    out: list[tuple[str, str, list[int]]] = [
        ("masked_embedding.centroids.weight", "BF16", [ASSISTANT_CONFIG["num_centroids"], hidden]),
        ("masked_embedding.token_ordering", "I64", [text["vocab_size"]]),
        ("model.embed_tokens.weight", "BF16", [text["vocab_size"], hidden]),
    ]
    for i, layer_type in enumerate(text["layer_types"]):
        p = f"model.layers.{i}."
        head = text["global_head_dim"] if layer_type == "full_attention" else text["head_dim"]
        out += [
            (p + "input_layernorm.weight", "BF16", [hidden]),
            (p + "layer_scalar", "BF16", [1]),
            (p + "mlp.down_proj.weight", "BF16", [hidden, mlp]),
            (p + "mlp.gate_proj.weight", "BF16", [mlp, hidden]),
            (p + "mlp.up_proj.weight", "BF16", [mlp, hidden]),
            (p + "post_attention_layernorm.weight", "BF16", [hidden]),
            (p + "post_feedforward_layernorm.weight", "BF16", [hidden]),
            (p + "pre_feedforward_layernorm.weight", "BF16", [hidden]),
            (p + "self_attn.o_proj.weight", "BF16", [hidden, heads * head]),
            (p + "self_attn.q_norm.weight", "BF16", [head]),
            (p + "self_attn.q_proj.weight", "BF16", [heads * head, hidden]),
        ]
    out += [
        ("model.norm.weight", "BF16", [hidden]),
        ("post_projection.weight", "BF16", [backbone, hidden]),
        ("pre_projection.weight", "BF16", [hidden, 2 * backbone]),
    ]
    return out


def write_assistant_checkpoint(directory: str | Path, sparse: bool = True,
                               config: dict[str, Any] | None = None) -> Path:
    """Write the assistant's config.json and model.safetensors (data zeros, a hole when sparse) into `directory`."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps(config if config is not None else ASSISTANT_CONFIG, indent=2,
                                              sort_keys=True))
    write_safetensors(d / "model.safetensors", assistant_tensors(), sparse=sparse)
    return d


BUILTIN_PROVENANCE = {
    "bf16": "built-in facts for google/gemma-4-E2B-it: config.json per published-t4-run.md (E2B architecture), "
            "tensor names and shapes from transformers' Gemma 4 model on the meta device plus the shipped KV-shared "
            "K/V weights",
    "qat": "built-in facts for google/gemma-4-E2B-it-qat-w4a16-ct, inferred, not read from its header: every text "
           "linear pack-quantized (compressed-tensors W4A16, int4, group 32, bf16 scales); embeddings, vision, audio "
           "16-bit; an untied 16-bit lm_head and no KV-shared K/V weights (the layout whose size fits a third-party "
           "listing of its model.safetensors, 8,316,306,646 B, and whose vLLM weight memory is 1.76 GiB below bf16's "
           "against the published 1.78)",
    "assistant": f"built-in facts for {ASSISTANT_REPO}: its config.json as published (revision 2d874ef7d29f), "
                 "tensor names and shapes as transformers saves Gemma4AssistantForCausalLM built from it (no K/V "
                 "projections, the output head tied), not read from its header",
}
# The file of t4serve/data/models/ each kind's built-in facts ship in.
BUILTIN_FILES = {"bf16": "gemma-4-E2B-it.json", "qat": "gemma-4-E2B-it-qat-w4a16-ct.json",
                 "assistant": "gemma-4-E2B-it-assistant.json"}


def builtin_data(kind: str, scratch: str | Path) -> dict[str, Any]:
    """The JSON shipped in t4serve/data/models/ for an alias: probe_model's facts on a written checkpoint, its
    config.json with Gemma4TextConfig's defaults filled (t4serve.probes.configdefaults; how a local probe read it is
    left out, as the provenance says where the facts come from)."""
    from t4serve.probes.checkpoint import CONFIG_READ_BY, ROLE_DRAFTER, probe_local
    from t4serve.serde import to_dict

    if kind == "assistant":
        facts = probe_local("x", write_assistant_checkpoint(Path(scratch) / kind), "local-dir", ROLE_DRAFTER)
    else:
        facts = probe_local("x", write_checkpoint(Path(scratch) / kind, kind=kind), "local-dir")
    # config.json with Gemma4TextConfig's defaults and rules, from t4serve's own table (no reader involved).
    assert "t4serve's table" in str(facts.config.get(CONFIG_READ_BY))
    return {
        "provenance": BUILTIN_PROVENANCE[kind],
        "config": {k: v for k, v in facts.config.items() if k != CONFIG_READ_BY},
        "quantization": facts.quantization,
        "safetensors_files": facts.safetensors_files,
        "weights": to_dict(facts.weights),
    }


if __name__ == "__main__":
    # python tests/unit/e2b_checkpoint.py DATA_DIR: regenerate the built-in facts (entrypoint/t4serve/data/models);
    # python tests/unit/e2b_checkpoint.py --processor-files [DIR]: regenerate the processor files with transformers
    # (default DIR: tests/unit/data/gemma4_processor; tokenizer.json is left out, tokenizer_json() builds it).
    import sys
    import tempfile

    if sys.argv[1:2] == ["--processor-files"]:
        target = Path(sys.argv[2]) if len(sys.argv) > 2 else PROCESSOR_DATA
        with tempfile.TemporaryDirectory() as tmp:
            generate_processor_files(tmp)
            target.mkdir(parents=True, exist_ok=True)
            for name in PROCESSOR_FILES:
                shutil.copyfile(Path(tmp) / name, target / name)
        sys.exit(0)
    out = Path(sys.argv[1])
    with tempfile.TemporaryDirectory() as tmp:
        for kind, name in BUILTIN_FILES.items():
            (out / name).write_text(json.dumps(builtin_data(kind, tmp), indent=1) + "\n")
