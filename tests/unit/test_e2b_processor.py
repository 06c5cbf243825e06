"""The tokenizer and Gemma 4 processor files e2b_checkpoint writes for serving the full multimodal E2B model.

Without transformers (the CI venv): the files parse, every named special token sits at the id config.json's token
fields resolve to, the checked-in processor parameters are the E2B vision/audio ones, and `tokenizers` turns N `tK`
words into N tokens and splits the image markers out of text. With transformers (5.13.1, as on the GPU host with
vLLM 0.26.0, plus torch and torchvision): the checked-in files are what transformers saves today, and AutoTokenizer /
AutoProcessor load the written checkpoint and expand an image into the config's image token. CI runs the whole module
in the image too (transformers 5.20.2), where nothing may skip: tests/image/test_e2b_processor_image.py.
"""

from __future__ import annotations

import importlib.util
import json
import random
from pathlib import Path
from typing import Any

import pytest
from e2b_checkpoint import (
    CONFIG_TOKEN_IDS,
    E2B_CONFIG,
    GENERATION_CONFIG,
    NAMED_TOKENS,
    PROCESSOR_DATA,
    PROCESSOR_FILES,
    SPECIAL_TOKENS,
    VOCAB_SIZE,
    generate_processor_files,
    tokenizer_json,
    write_checkpoint,
)

# transformers' Gemma4Config defaults for the token fields, as configuration_gemma4.py (transformers 5.13.1) declares
# them: config.json writes the same values out; test_config_defaults_match_transformers checks this copy where it can.
GEMMA4_CONFIG_DEFAULTS = {"boi_token_id": 255_999, "eoi_token_id": 258_882, "image_token_id": 258_880,
                          "video_token_id": 258_884, "boa_token_id": 256_000, "eoa_token_index": 258_883,
                          "audio_token_id": 258_881}


def _have(*modules: str) -> bool:
    return all(importlib.util.find_spec(m) is not None for m in modules)


needs_processor_stack = pytest.mark.skipif(
    not _have("transformers", "torch", "torchvision", "PIL"),
    reason="transformers' Gemma4Processor needs transformers, torch, torchvision and Pillow; the unit-test venv has "
           "none of them (the checked-in files are still checked by the tests above)")


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_checkpoint(tmp_path_factory.mktemp("e2b") / "qat", "qat", tokenizer=True, processor=True)


def _json(path: Path) -> Any:
    return json.loads(path.read_text())


def test_opt_in_files(tmp_path: Path, ckpt: Path) -> None:
    plain = write_checkpoint(tmp_path / "plain", "bf16")
    assert sorted(p.name for p in plain.iterdir()) == ["config.json", "model.safetensors"]
    tok = write_checkpoint(tmp_path / "tok", "bf16", tokenizer=True)
    assert sorted(p.name for p in tok.iterdir()) == [
        "config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"]
    assert sorted(p.name for p in ckpt.iterdir()) == sorted(
        ["config.json", "generation_config.json", "model.safetensors", "tokenizer.json", *PROCESSOR_FILES])
    # Sparse weights as before: the 8 GB QAT file costs almost no disk.
    assert (ckpt / "model.safetensors").stat().st_blocks * 512 < 64 * 1024**2


def test_vocabulary_covers_every_id_once(ckpt: Path) -> None:
    tok = _json(ckpt / "tokenizer.json")
    vocab = tok["model"]["vocab"]
    assert tok["model"]["type"] == "WordLevel" and tok["pre_tokenizer"] == {"type": "WhitespaceSplit"}
    assert len(vocab) == VOCAB_SIZE == E2B_CONFIG["text_config"]["vocab_size"]
    assert sorted(vocab.values()) == list(range(VOCAB_SIZE))
    assert vocab["t12345"] == 12345 and vocab[f"t{VOCAB_SIZE - 1}"] == VOCAB_SIZE - 1
    added = {a["content"]: a["id"] for a in tok["added_tokens"]}
    assert added == SPECIAL_TOKENS and all(vocab[t] == i for t, i in added.items())
    assert all(a["special"] for a in tok["added_tokens"])


def test_special_ids_agree_with_config_and_generation_config(ckpt: Path) -> None:
    config = _json(ckpt / "config.json")
    vocab = _json(ckpt / "tokenizer.json")["model"]["vocab"]
    for field, token in CONFIG_TOKEN_IDS.items():
        assert config[field] == GEMMA4_CONFIG_DEFAULTS[field] == vocab[token], field
    text = config["text_config"]
    gen = _json(ckpt / "generation_config.json")
    assert gen == GENERATION_CONFIG
    assert (gen["pad_token_id"], gen["eos_token_id"], gen["bos_token_id"]) == (
        text["pad_token_id"], text["eos_token_id"], text["bos_token_id"]) == (
        vocab["<pad>"], vocab["<eos>"], vocab["<bos>"])


def test_tokenizer_config_names_tokens_in_the_vocabulary(ckpt: Path) -> None:
    cfg = _json(ckpt / "tokenizer_config.json")
    vocab = _json(ckpt / "tokenizer.json")["model"]["vocab"]
    for name, token in NAMED_TOKENS.items():
        assert cfg[name] == token and token in vocab, name
    # What Gemma4Processor.__init__ reads off the tokenizer, and the video token it adds by text.
    for name in ("image_token", "boi_token", "eoi_token", "audio_token", "boa_token", "eoa_token"):
        assert cfg[name] in SPECIAL_TOKENS
    assert "<|video|>" in cfg["extra_special_tokens"] and "<|video|>" in vocab
    assert cfg["processor_class"] == "Gemma4Processor"


def test_processor_parameters_are_e2b(ckpt: Path) -> None:
    proc = _json(ckpt / "processor_config.json")
    vision = E2B_CONFIG["vision_config"]
    image = proc["image_processor"]
    assert proc["processor_class"] == "Gemma4Processor"
    assert image["image_processor_type"] == "Gemma4ImageProcessor"
    assert image["patch_size"] == vision["patch_size"] == proc["video_processor"]["patch_size"]
    # vLLM sizes an image's placeholder from the vision config's pooling kernel and default output length; the
    # processor expands by its own: they must agree.
    assert (image["pooling_kernel_size"], image["max_soft_tokens"], proc["image_seq_length"]) == (
        vision["pooling_kernel_size"], vision["default_output_length"], vision["default_output_length"])
    audio = proc["feature_extractor"]
    assert audio["feature_extractor_type"] == "Gemma4AudioFeatureExtractor"
    assert (audio["sampling_rate"], audio["feature_size"], audio["frame_length"], audio["hop_length"]) == (
        16000, 128, 320, 160)
    assert proc["video_processor"]["video_processor_type"] == "Gemma4VideoProcessor"
    template = (ckpt / "chat_template.jinja").read_text()
    assert all(t in template for t in ("<|turn>", "<turn|>", "<|image|>", "<|audio|>", "<|video|>"))


def test_tokenizers_counts_words_and_splits_markers(ckpt: Path) -> None:
    tokenizers = pytest.importorskip("tokenizers", reason="the `tokenizers` package is not installed")
    tok = tokenizers.Tokenizer.from_file(str(ckpt / "tokenizer.json"))
    rng = random.Random(1)
    for n in (1, 100, 4096):
        prompt = " ".join(f"t{rng.randrange(10, 262_000)}" for _ in range(n))
        assert len(tok.encode(prompt).ids) == n
    ids = tok.encode("t7<|image><|image|><|image|><image|>t8 t255999").ids
    assert ids == [7, 255999, 258880, 258880, 258882, 8, 3]  # t255999 names a special's id: one unknown token


@needs_processor_stack
def test_checked_in_files_are_what_transformers_saves(tmp_path: Path) -> None:
    written = generate_processor_files(tmp_path)
    assert sorted(written) == sorted([*PROCESSOR_FILES, "tokenizer.json"])
    for name in PROCESSOR_FILES:
        assert (tmp_path / name).read_text() == (PROCESSOR_DATA / name).read_text(), name
    assert _json(tmp_path / "tokenizer.json") == tokenizer_json()


@needs_processor_stack
def test_config_defaults_match_transformers() -> None:
    from transformers import Gemma4Config

    defaults = Gemma4Config()
    assert {f: getattr(defaults, f) for f in GEMMA4_CONFIG_DEFAULTS} == GEMMA4_CONFIG_DEFAULTS
    # vLLM 0.26.0 reads vision_config.default_output_length, which transformers' config class may not declare: the
    # value must survive loading config.json.
    config = Gemma4Config.from_dict(E2B_CONFIG)
    assert (config.vision_config.pooling_kernel_size, config.vision_config.default_output_length) == (3, 280)


@needs_processor_stack
def test_transformers_loads_and_expands_an_image(ckpt: Path) -> None:
    import numpy as np
    from PIL import Image
    from transformers import AutoProcessor, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(ckpt)
    proc = AutoProcessor.from_pretrained(ckpt)
    assert type(proc).__name__ == "Gemma4Processor"
    assert len(tok(" ".join(f"t{i}" for i in range(1000, 1512)))["input_ids"]) == 512
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "t5 t6"}]}]
    text = proc.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    image = Image.fromarray(np.zeros((200, 300, 3), dtype=np.uint8))
    ids = proc(text=text, images=[image], return_tensors="np")["input_ids"][0].tolist()
    image_id = GEMMA4_CONFIG_DEFAULTS["image_token_id"]
    n = ids.count(image_id)
    assert n == proc._get_num_multimodal_tokens(image_sizes=[(200, 300)]).num_image_tokens[0] > 0
    boi = ids.index(GEMMA4_CONFIG_DEFAULTS["boi_token_id"])
    assert ids[boi + 1:boi + 1 + n] == [image_id] * n and ids[boi + 1 + n] == GEMMA4_CONFIG_DEFAULTS["eoi_token_id"]
