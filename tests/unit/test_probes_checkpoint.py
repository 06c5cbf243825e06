"""probe_model on written E2B checkpoints: resolution, header parsing, grouping by part, bad files as facts."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
from e2b_checkpoint import (
    BUILTIN_FILES,
    builtin_data,
    checkpoint_tensors,
    tensor_bytes,
    write_checkpoint,
    write_hf_cache,
)

from t4serve.facts import ModelFacts
from t4serve.probes.checkpoint import (
    PART_KV_SHARED_DROPPED,
    PART_PER_LAYER_EMBEDDING,
    classify,
    probe_model,
    read_safetensors_header,
)

BF16_REPO = "google/gemma-4-E2B-it"
QAT_REPO = "google/gemma-4-E2B-it-qat-w4a16-ct"


def parts(facts: ModelFacts) -> dict[str, dict[str, int]]:
    return {g.part: g.bytes_by_dtype for g in facts.weights}


def test_local_bf16_directory(tmp_path: Path) -> None:
    d = write_checkpoint(tmp_path / "ckpt", "bf16")
    facts = probe_model(str(d), hf_home=str(tmp_path / "hf"), offline=True)
    assert facts.source == "local-dir" and facts.error is None
    assert facts.weight_bytes == sum(tensor_bytes(dt, s) for _, dt, s in checkpoint_tensors("bf16"))
    assert facts.quantization is None
    assert facts.config["text"]["num_kv_shared_layers"] == 20
    assert facts.config["text"]["global_head_dim"] == 512
    p = parts(facts)
    assert p[PART_PER_LAYER_EMBEDDING] == {"BF16": 262144 * 8960 * 2}
    # 16 sliding (2 x 256 x 1536 + 256) + 4 full (2 x 512 x 1536 + 512) K/V/k_norm, 2 bytes each.
    assert p[PART_KV_SHARED_DROPPED] == {"BF16": 2 * (16 * (2 * 256 * 1536 + 256) + 4 * (2 * 512 * 1536 + 512))}
    assert set(p) == {"text_decoder", "embedding", "per_layer_embedding", "per_layer_projection",
                      "kv_shared_dropped", "vision_tower", "audio_tower"}


def test_qat_detects_compressed_tensors_and_packed_int4(tmp_path: Path) -> None:
    d = write_checkpoint(tmp_path / "qat", "qat")
    facts = probe_model(str(d), hf_home=str(tmp_path), offline=True)
    assert facts.quantization == "compressed-tensors"
    text = parts(facts)["text_decoder"]
    assert set(text) == {"BF16", "I32", "I64"}
    # layer 0 q_proj: [2048, 1536] int4 -> 2048 x 192 int32 words.
    header = read_safetensors_header(d / "model.safetensors")
    assert header["model.language_model.layers.0.self_attn.q_proj.weight_packed"]["shape"] == [2048, 192]
    assert header["model.language_model.layers.0.self_attn.q_proj.weight_scale"]["shape"] == [2048, 48]
    # Inferred from the published file size (e2b_checkpoint's docstring): an untied 16-bit lm_head as the output layer,
    # no KV-shared layers' K/V, 8,315,978,118 B of tensors.
    assert facts.config["tie_word_embeddings"] is False and facts.config["text"]["tie_word_embeddings"] is False
    p = parts(facts)
    assert p["output_layer"] == {"BF16": 262144 * 1536 * 2} == p["embedding"]
    assert PART_KV_SHARED_DROPPED not in p
    assert facts.weight_bytes == 8_315_978_118


def test_hf_cache_layout_and_sharded_index(tmp_path: Path) -> None:
    write_hf_cache(tmp_path, BF16_REPO, "bf16", shards=3)
    facts = probe_model(BF16_REPO, hf_home=str(tmp_path), offline=True)
    assert facts.source == "hf-cache"
    assert facts.safetensors_files == 3
    assert facts.local_path is not None and facts.local_path.endswith("snapshots/" + "0" * 40)
    single = probe_model(str(write_checkpoint(tmp_path / "one", "bf16")), hf_home=str(tmp_path), offline=True)
    assert facts.weights == single.weights


def test_sparse_checkpoint_costs_no_disk(tmp_path: Path) -> None:
    d = write_checkpoint(tmp_path / "c", "bf16")
    f = d / "model.safetensors"
    assert f.stat().st_size > 10_000_000_000
    assert f.stat().st_blocks * 512 < 50_000_000


@pytest.mark.parametrize(
    ("damage", "expect"),
    [
        ("truncate", "truncated"),
        ("bad_json", "not valid JSON"),
        ("huge_length", "does not fit the file"),
        ("short", "too short"),
        ("bad_entry", "malformed entry"),
        ("no_config", "config.json: missing"),
    ],
)
def test_damaged_checkpoints_are_invalid_facts(tmp_path: Path, damage: str, expect: str) -> None:
    d = write_checkpoint(tmp_path / "c", "bf16")
    f = d / "model.safetensors"
    if damage == "truncate":
        with f.open("r+b") as fh:
            fh.truncate(f.stat().st_size - 1)
    elif damage == "bad_json":
        with f.open("r+b") as fh:
            fh.seek(8)
            fh.write(b"{{{{")
    elif damage == "huge_length":
        with f.open("r+b") as fh:
            fh.write(struct.pack("<Q", 1 << 40))
    elif damage == "short":
        f.write_bytes(b"\x01\x02")
    elif damage == "bad_entry":
        header = {"a": {"dtype": "BF16", "shape": [2], "data_offsets": [4, 0]}}
        blob = json.dumps(header).encode()
        f.write_bytes(struct.pack("<Q", len(blob)) + blob + b"\0" * 8)
    elif damage == "no_config":
        (d / "config.json").unlink()
    facts = probe_model(str(d), hf_home=str(tmp_path), offline=True)
    assert facts.source == "invalid"
    assert facts.error is not None and expect in facts.error
    assert str(d) in facts.error


def test_missing_shard_named_by_index(tmp_path: Path) -> None:
    d = write_checkpoint(tmp_path / "c", "bf16", shards=2)
    (d / "model-00002-of-00002.safetensors").unlink()
    facts = probe_model(str(d), hf_home=str(tmp_path), offline=True)
    assert facts.source == "invalid"
    assert facts.error is not None and "model-00002-of-00002.safetensors" in facts.error and "missing" in facts.error


def test_not_local_offline_falls_back_to_builtin_for_aliases(tmp_path: Path) -> None:
    facts = probe_model(QAT_REPO, hf_home=str(tmp_path), offline=True)
    assert facts.source == "builtin" and facts.requested == QAT_REPO
    assert "HF_HUB_OFFLINE=1" in facts.config["provenance"]
    other = probe_model("someone/model", hf_home=str(tmp_path), offline=True)
    assert other.source == "not-local" and other.weights == []
    assert other.error is not None and "HF_HUB_OFFLINE=1" in other.error


def test_hub_unreachable_is_a_clean_fact(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Online: huggingface_hub (when installed) fails to reach the hub here; without it the reason says so.
    monkeypatch.setenv("HF_HUB_ETAG_TIMEOUT", "2")
    facts = probe_model("someone/model", hf_home=str(tmp_path), offline=False)
    assert facts.source == "not-local"
    assert facts.error is not None and ("huggingface_hub" in facts.error or "hub failed" in facts.error)


def test_missing_local_directory(tmp_path: Path) -> None:
    facts = probe_model(str(tmp_path / "nope"), hf_home=str(tmp_path), offline=True)
    assert facts.source == "invalid" and facts.error is not None and "no such directory" in facts.error


def test_builtin_facts_match_the_derivation(tmp_path: Path) -> None:
    data = Path(__file__).parents[2] / "entrypoint" / "t4serve" / "data" / "models"
    for kind, name in BUILTIN_FILES.items():
        shipped = (data / name).read_text()
        # Regenerate with: python tests/unit/e2b_checkpoint.py entrypoint/t4serve/data/models. The text, key order
        # included: vLLM keys rotary caches on the rope parameters in order, and the drafter's sizing compares them.
        assert shipped == json.dumps(builtin_data(kind, tmp_path), indent=1) + "\n", name


def test_classify_kv_shared_only_from_first_shared_layer() -> None:
    text = {"num_hidden_layers": 35, "num_kv_shared_layers": 20}
    assert classify("model.language_model.layers.14.self_attn.k_proj.weight", text) == "text_decoder"
    assert classify("model.language_model.layers.15.self_attn.k_proj.weight", text) == PART_KV_SHARED_DROPPED
    assert classify("model.language_model.layers.15.self_attn.q_proj.weight", text) == "text_decoder"
    assert classify("model.language_model.layers.15.self_attn.k_proj.weight", {"num_hidden_layers": 35}) == (
        "text_decoder")
    assert classify("lm_head.weight", text) == "output_layer"
    assert classify("something.else", text) == "other"
