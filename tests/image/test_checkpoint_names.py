"""tests/unit/e2b_checkpoint.py against its oracle: the image's transformers and compressed-tensors build the E2B model
on the meta device (tests/oracle/checkpoint_names.py) and say which tensors a save would write; the test checkpoint
must write exactly those (name, dtype, shape), plus, for bf16 only, the KV-shared layers' K/V tensors listed in
`shipped_kv_extras`. The QAT oracle model is built from the QAT config (untied embeddings: its own lm_head), so the QAT
checkpoint's lm_head and its lack of shared-layer K/V are the oracle's, not allowances; that the published QAT
checkpoint is laid out so is inferred from its file size (tests/unit/e2b_checkpoint.py), not read here."""

from __future__ import annotations

import json
import re
import subprocess
from typing import Any

import pytest

from .conftest import REPO, load_e2b_checkpoint

pytestmark = pytest.mark.image

# Importing torch and transformers and building the model twice takes about 15 s on two cores.
ORACLE_TIMEOUT_S = 300
TEXT_LAYERS = "model.language_model.layers."

Tensors = dict[str, tuple[str, list[int]]]


E2B = load_e2b_checkpoint()


@pytest.fixture(scope="module")
def oracle(docker_bin: str, image_ref: str) -> dict[str, Any]:
    done = subprocess.run(
        [
            docker_bin,
            "run",
            "--rm",
            "--network",
            "none",
            "-v",
            f"{REPO / 'tests'}:/t:ro",
            "--entrypoint",
            "python",
            image_ref,
            "/t/oracle/checkpoint_names.py",
        ],
        capture_output=True,
        text=True,
        timeout=ORACLE_TIMEOUT_S,
    )
    assert done.returncode == 0, f"the oracle failed in {image_ref}:\n{done.stderr}"
    data: dict[str, Any] = json.loads(done.stdout)
    print("oracle:", data["architecture"], data["versions"])
    return data


def written(kind: str) -> Tensors:
    tensors: Tensors = {name: (dtype, shape) for name, dtype, shape in E2B.checkpoint_tensors(kind)}
    return tensors


def shipped_kv_extras(oracle_tensors: Tensors) -> Tensors:
    """The only tensors the bf16 test checkpoint may add to the oracle's: google/gemma-4-E2B-it still ships k_proj,
    v_proj and k_norm for the KV-shared layers (15-34), which transformers' Gemma4TextAttention does not build (they
    reuse the K/V of the last owning layer of their type) and vLLM 0.33 drops at load. Each has the dtype and shape of
    the same tensor in that owning layer (13 for sliding, 14 for full attention). v_norm has no weight
    (with_scale=False), so nothing is shipped for it. The QAT checkpoint ships none (e2b_checkpoint's docstring: the
    published file's size leaves no room for them), so QAT is allowed no extras."""
    text = E2B.E2B_CONFIG["text_config"]
    layer_types: list[str] = text["layer_types"]
    first_shared = text["num_hidden_layers"] - text["num_kv_shared_layers"]
    extras: Tensors = {}
    for layer in range(first_shared, text["num_hidden_layers"]):
        owner = max(i for i in range(first_shared) if layer_types[i] == layer_types[layer])
        for module in ("k_proj", "v_proj", "k_norm"):
            owned = f"{TEXT_LAYERS}{owner}.self_attn.{module}."
            for name, dtype_shape in oracle_tensors.items():
                if name.startswith(owned):
                    extras[f"{TEXT_LAYERS}{layer}.self_attn.{module}.{name.removeprefix(owned)}"] = dtype_shape
    return extras


def oracle_tensors(oracle: dict[str, Any], kind: str) -> Tensors:
    return {name: (t["dtype"], t["shape"]) for name, t in oracle["checkpoints"][kind].items()}


def differences(got: Tensors, want: Tensors) -> list[str]:
    out = [f"missing from e2b_checkpoint: {n} {want[n]}" for n in sorted(want.keys() - got.keys())]
    out += [f"not in the oracle: {n} {got[n]}" for n in sorted(got.keys() - want.keys())]
    out += [
        f"{n}: e2b_checkpoint {got[n]}, oracle {want[n]}" for n in sorted(got.keys() & want.keys()) if got[n] != want[n]
    ]
    return out


@pytest.mark.parametrize("kind", ["bf16", "qat"])
def test_e2b_checkpoint_writes_what_transformers_would_save(oracle: dict[str, Any], kind: str) -> None:
    want = oracle_tensors(oracle, kind)
    extras = shipped_kv_extras(want) if kind == "bf16" else {}
    # bf16: 20 shared layers x (k_proj, v_proj, k_norm), one tensor each.
    assert len(extras) == (20 * 3 if kind == "bf16" else 0)
    assert not extras.keys() & want.keys(), "the oracle's model has K/V weights in shared layers: revisit the extras"
    diff = differences(written(kind), {**want, **extras})
    assert not diff, f"{len(diff)} differences ({kind}):\n" + "\n".join(diff[:40])


def test_only_qat_has_its_own_16_bit_lm_head(oracle: dict[str, Any]) -> None:
    """bf16's config ties lm_head to the embedding (a save writes it once, as the embedding); QAT's unties it, so
    transformers ties nothing and a save writes lm_head.weight, left 16-bit by the quantization's ignore list."""
    assert oracle["tied_weights"] == {"bf16": {"lm_head.weight": "model.language_model.embed_tokens.weight"},
                                      "qat": {}}
    text = E2B.E2B_CONFIG["text_config"]
    embedding = ("BF16", [text["vocab_size"], text["hidden_size"]])
    assert oracle_tensors(oracle, "qat")["lm_head.weight"] == embedding
    assert "lm_head.weight" not in oracle_tensors(oracle, "bf16")
    assert "lm_head" not in oracle["quantized_modules"]


def test_transformers_ignores_exactly_the_shipped_kv_extras_on_load(oracle: dict[str, Any]) -> None:
    """Transformers' own record that checkpoints carry these keys: from_pretrained drops them silently."""
    patterns = [re.compile(p) for p in oracle["ignored_on_load_unexpected"]]
    extras = shipped_kv_extras(oracle_tensors(oracle, "bf16"))
    unignored = sorted(name for name in extras if not any(p.search(name) for p in patterns))
    assert not unignored, f"transformers would report these as unexpected keys: {unignored}"
    # The patterns are unanchored ("layers.15.self_attn.k_proj"), so they also match vision layer 15's keys; harmless,
    # as they only filter keys the model does not expect. None may match a text-stack key the model does build.
    saved = {**oracle_tensors(oracle, "bf16"), **oracle_tensors(oracle, "qat")}
    assert not [n for n in saved if n.startswith("model.language_model.") and any(p.search(n) for p in patterns)]


def test_qat_quantizes_every_text_linear_and_nothing_the_config_ignores(oracle: dict[str, Any]) -> None:
    """compressed-tensors' matching of QAT_QUANTIZATION_CONFIG (targets Linear, minus `ignore`) on the real module
    tree: the 16-bit parts of the QAT build are the embeddings, lm_head (untied, ignored) and the vision and audio
    towers."""
    quantized: list[str] = oracle["quantized_modules"]
    assert quantized and all(name.startswith("model.language_model.") for name in quantized)
    text_linears = {
        name.removesuffix(".weight")
        for name, (_, shape) in oracle_tensors(oracle, "bf16").items()
        if name.startswith("model.language_model.") and len(shape) == 2 and "embed_tokens" not in name
    }
    assert set(quantized) == text_linears
