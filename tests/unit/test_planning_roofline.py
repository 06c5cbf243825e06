"""Bytes per decode token from headers: published-t4-run.md's 4.56 / 4.597 GB for bf16, 2.47x less for QAT, KV."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from e2b_checkpoint import write_checkpoint

from t4serve.commands.roofline import command
from t4serve.errors import ConfigError
from t4serve.facts import ModelFacts
from t4serve.planning.roofline import roofline
from t4serve.probes.checkpoint import probe_model


def facts(tmp: Path, kind: str) -> ModelFacts:
    d = write_checkpoint(tmp / kind, kind)
    return probe_model(str(d), hf_home=str(tmp), offline=True)


def test_bf16_reads_4_56_gb_and_4_597_with_dropped_kv(tmp_path: Path) -> None:
    r = roofline(facts(tmp_path, "bf16"), context=0, dtype_bytes=2, bandwidth_bytes_per_s=277e9)
    assert round(r.weights_read_bytes.value / 1e9, 2) == 4.56
    assert round((r.weights_read_bytes.value + r.dropped_kv_weights_bytes.value) / 1e9, 3) == 4.597
    assert round(r.dropped_kv_weights_bytes.value / 1e6, 1) == 37.8
    assert r.ceiling_tokens_per_s is not None
    # published-t4-run.md: 60.3 tok/s at 277 GB/s counting the dropped weights.
    assert round(277e9 / (r.weights_read_bytes.value + r.dropped_kv_weights_bytes.value), 1) == 60.3


def test_qat_reads_2_47x_fewer(tmp_path: Path) -> None:
    b = roofline(facts(tmp_path, "bf16"), context=0, dtype_bytes=2, bandwidth_bytes_per_s=None)
    q = roofline(facts(tmp_path, "qat"), context=0, dtype_bytes=2, bandwidth_bytes_per_s=None)
    published_bf16 = b.weights_read_bytes.value + b.dropped_kv_weights_bytes.value
    assert round(published_bf16 / q.weights_read_bytes.value, 2) == 2.47
    assert q.ceiling_tokens_per_s is None
    # QAT's output layer is its untied lm_head; its embedding is then a row lookup, not read in full.
    assert "output_layer 0.805 GB" in q.weights_read_bytes.how and "embedding" not in q.weights_read_bytes.how
    assert "embedding 0.805 GB" in b.weights_read_bytes.how and "output_layer" not in b.weights_read_bytes.how
    assert "0.805 GB token embedding (untied" in q.not_read_bytes.how
    assert q.dropped_kv_weights_bytes.value == 0


def test_kv_read_per_step_follows_windows(tmp_path: Path) -> None:
    m = facts(tmp_path, "bf16")
    r = roofline(m, context=16384, dtype_bytes=2, bandwidth_bytes_per_s=None)
    assert r.kv_read_bytes.value == 12 * 512 * 1024 + 3 * 16384 * 2048
    short = roofline(m, context=100, dtype_bytes=2, bandwidth_bytes_per_s=None)
    assert short.kv_read_bytes.value == 12 * 100 * 1024 + 3 * 100 * 2048


def test_no_headers_is_explained() -> None:
    with pytest.raises(ConfigError, match="needs the checkpoint's safetensors headers"):
        roofline(ModelFacts("a/b", None, "not-local", "unreachable"), context=0, dtype_bytes=2,
                 bandwidth_bytes_per_s=None)


def test_command_json_on_a_local_checkpoint(tmp_path: Path) -> None:
    d = write_checkpoint(tmp_path / "c", "bf16")
    result = CliRunner().invoke(command, [str(d), "--context", "0", "--json"], env={"HF_HUB_OFFLINE": "1"})
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    assert out["source"] == "local-dir" and out["gpu"] == "Tesla T4"
    assert round(out["weights_read_bytes"]["value"] / 1e9, 2) == 4.56
    assert out["ceiling_tokens_per_s"]["value"] == pytest.approx(277e9 / out["bytes_per_token"]["value"])
    assert out["ceiling_nominal_tokens_per_s"]["value"] == pytest.approx(320e9 / out["bytes_per_token"]["value"])


def test_decode_ceiling_is_the_roofline_at_the_known_gpus_bandwidth(tmp_path: Path) -> None:
    from t4serve.gpus import known_gpu
    from t4serve.planning.roofline import decode_ceiling, roofline

    write_checkpoint(tmp_path, kind="bf16")
    facts = probe_model(str(tmp_path), hf_home=str(tmp_path / "hf"), offline=True)
    t4 = known_gpu("t4")
    assert t4 is not None
    ceiling = decode_ceiling(facts, t4)
    per_token = roofline(facts, context=0, dtype_bytes=2, bandwidth_bytes_per_s=None).bytes_per_token.value
    assert ceiling.value == pytest.approx(277.0e9 / per_token)
    # published-t4-run.md: 4.56 GB read per token without the dropped K/V weights -> about 60.7 tok/s at 277 GB/s.
    assert 60.0 < ceiling.value < 61.5
    assert "277.0 GB/s measured" in ceiling.how


def test_a_bad_model_argument_is_named_as_the_argument_not_a_flag(tmp_path: Path) -> None:
    # MODEL is positional here: the message must not send the user looking for a --model option.
    with pytest.raises(ConfigError) as err:
        command.main([str(tmp_path / "absent")], standalone_mode=False)
    text = str(err.value) + (err.value.fix or "")
    assert "(from the MODEL argument)" in text and "--model" not in text
    assert "give the MODEL argument as e.g." in (err.value.fix or "")


def test_a_bad_model_variable_is_named_as_the_variable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("T4SERVE_MODEL", str(tmp_path / "absent"))
    with pytest.raises(ConfigError) as err:
        command.main([], standalone_mode=False)
    assert "from the MODEL argument" not in str(err.value)
    assert (err.value.fix or "").startswith("set T4SERVE_MODEL=")
