"""The family test checkpoints: their headers read as t4serve reads any checkpoint, and what t4serve plans from each
config.json as written (this venv has no vLLM reader; tests/image/test_kv_oracle_families.py plans them as read by
vLLM's and compares every figure with vLLM's planner)."""

from __future__ import annotations

from pathlib import Path

import pytest
from family_checkpoints import FAMILIES, REPOS, tensors, write_family
from sample_facts import t4

from t4serve.config.settings import Settings
from t4serve.facts import ModelFacts
from t4serve.pipeline import ensure_model, with_known_gpu
from t4serve.planning.plan import plan
from t4serve.probes.checkpoint import probe_model

# Parameter counts of the published checkpoints (their model cards), which the headers written here must reproduce.
PARAMETERS = {
    "qwen3": 4.02e9,
    "llama3": 3.21e9,
    "phi4mini": 3.84e9,
    "gemma3": 4.30e9,
    "mistral": 7.24e9,
    "smollm3": 3.08e9,
}


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> dict[str, ModelFacts]:
    root = tmp_path_factory.mktemp("families")
    return {f: probe_model(str(write_family(root / f, f)), hf_home=str(root), offline=True) for f in FAMILIES}


@pytest.mark.parametrize("family", sorted(PARAMETERS))
def test_headers_hold_the_published_parameter_count(family: str) -> None:
    count = 0
    for _name, _dtype, shape in tensors(family):
        n = 1
        for d in shape:
            n *= d
        count += n
    assert abs(count / PARAMETERS[family] - 1) < 0.01, (family, count)


def test_the_awq_checkpoint_is_autoawqs_gemm_layout() -> None:
    names = {name: (dtype, shape) for name, dtype, shape in tensors("llama31awq")}
    assert names["model.layers.0.self_attn.q_proj.qweight"] == ("I32", [4096, 512])
    assert names["model.layers.0.self_attn.q_proj.qzeros"] == ("I32", [32, 512])
    assert names["model.layers.0.self_attn.q_proj.scales"] == ("F16", [32, 4096])
    assert names["model.layers.0.mlp.down_proj.qweight"] == ("I32", [14336, 512])
    assert names["lm_head.weight"] == ("F16", [128256, 4096])


@pytest.mark.parametrize("family", FAMILIES)
def test_every_family_is_read_as_a_checkpoint(written: dict[str, ModelFacts], family: str) -> None:
    facts = written[family]
    # Every family is in t4serve's table of transformers' defaults: read without vLLM's reader (Gemma 3's config.json
    # leaves its heads to Gemma3TextConfig).
    assert facts.source == "local-dir", facts.error
    assert "transformers" in str(facts.config["config_read_by"])
    assert facts.weight_bytes == sum(tensor_bytes for tensor_bytes in _bytes(family))
    assert REPOS[family]


def _bytes(family: str) -> list[int]:
    bits = {"BF16": 16, "F16": 16, "I32": 32}
    out = []
    for _name, dtype, shape in tensors(family):
        n = bits[dtype]
        for d in shape:
            n *= d
        out.append(n // 8)
    return out


def test_phi4_mini_slides_on_every_layer_and_says_how_its_config_was_read(tmp_path: Path) -> None:
    write_family(tmp_path / "phi", "phi4mini")
    s = Settings.from_environ({"HF_HOME": str(tmp_path), "T4SERVE_MODEL": str(tmp_path / "phi")})
    p = plan(s, ensure_model(s, t4()))
    assert p.sizing is not None, p.sizing_error
    how = p.sizing.concurrency.how
    assert "sliding layers [0, 1, 2" in how and "+1" in how and "full layers" not in how
    assert any("transformers" in n and "(phi3)" in n for n in p.sizing.notes)


def test_mistral_does_not_fit_a_t4_and_fits_an_a10g(tmp_path: Path) -> None:
    write_family(tmp_path / "m", "mistral")
    s = Settings.from_environ({"HF_HOME": str(tmp_path), "T4SERVE_MODEL": str(tmp_path / "m")})
    on_t4 = plan(s, ensure_model(s, t4()))
    assert on_t4.sizing is None and on_t4.sizing_error is not None and "no GPU memory is left" in on_t4.sizing_error
    on_a10g = plan(s, ensure_model(s, with_known_gpu(t4(), "a10g")))
    assert on_a10g.sizing is not None and on_a10g.dtype == "bfloat16"
