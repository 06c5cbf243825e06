"""`t4serve profiles`: every checkpoint x KV cache dtype x length, each figure the plan's own, refusals with the
plan's reasons (vLLM's words for fp8 below 8.9); text and JSON through t4serve.cli.main."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from family_checkpoints import write_family
from sample_facts import t4

from t4serve.cli import main
from t4serve.config.settings import Settings, with_model
from t4serve.errors import ConfigError
from t4serve.pipeline import ensure_model
from t4serve.planning.plan import plan
from t4serve.planning.profiles import PROFILE_LENGTHS, model_lengths, profiles


@pytest.fixture(autouse=True)
def clean_env(settings_free_env: None) -> None:
    """conftest's settings_free_env for every test here."""


def profiles_json(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, object]:
    assert main(["profiles", "--gpu", "t4", "--json", *args]) == 0
    data: dict[str, object] = json.loads(capsys.readouterr().out)
    return data


def test_every_checkpoint_dtype_and_length_with_the_plans_figures(capsys: pytest.CaptureFixture[str]) -> None:
    data = profiles_json(capsys)
    rows = data["profiles"]
    assert isinstance(rows, list) and data["gpu"] == "Tesla T4"
    assert {(r["checkpoint"], r["kv_cache_dtype"]) for r in rows} == {
        (c, d) for c in ("qat", "bf16") for d in ("auto", "int8", "int4", "fp8")}
    # E2B: 4k, 16k, 32k and its 131,072-token maximum.
    assert sorted({r["max_model_len"] for r in rows}) == [*PROFILE_LENGTHS, 131072]
    for row in rows:
        env = {"T4SERVE_KV_CACHE_DTYPE": row["kv_cache_dtype"], "T4SERVE_MAX_MODEL_LEN": str(row["max_model_len"])}
        settings = Settings.from_environ({"HF_HOME": "/nonexistent", "T4SERVE_MODEL": row["checkpoint"], **env})
        the_plan = plan(settings, ensure_model(settings, t4()))
        if the_plan.sizing is None:
            assert not row["runnable"] and row["reason"] == the_plan.sizing_error
            continue
        assert row["runnable"] and row["command_line"] == the_plan.command_line()
        assert row["kv_tokens"] == the_plan.sizing.kv_tokens.value
        assert row["concurrency"] == the_plan.sizing.concurrency.value
        assert row["gpu_weights_bytes"] == the_plan.sizing.gpu_weights_bytes.value


def test_fp8_is_not_runnable_on_a_t4_and_says_vllms_reason(capsys: pytest.CaptureFixture[str]) -> None:
    rows = profiles_json(capsys)["profiles"]
    assert isinstance(rows, list)
    fp8 = [r for r in rows if r["kv_cache_dtype"] == "fp8"]
    assert fp8 and not any(r["runnable"] for r in fp8)
    assert all("native FP8 (fp8e4nv) requires SM89+" in r["reason"] for r in fp8)
    int8 = [r for r in rows if r["kv_cache_dtype"] == "int8"]
    assert int8 and all(r["runnable"] for r in int8)
    # int4's attention kernel needs 98,304 B of shared memory at E2B's head 512 on sm_75; a T4 has 65,536.
    int4 = [r for r in rows if r["kv_cache_dtype"] == "int4"]
    assert int4 and not any(r["runnable"] for r in int4)
    assert all("98,304 B" in r["reason"] and "T4SERVE_KV_CACHE_DTYPE=int8" in r["reason"] for r in int4)


def test_fp8s_fix_offers_int4_only_where_its_kernel_fits(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    write_family(tmp_path / "qwen3", "qwen3")
    rows = profiles_json(capsys, "--model", str(tmp_path / "qwen3"))["profiles"]
    assert isinstance(rows, list)
    fp8 = {r["checkpoint"]: r["reason"] for r in rows if r["kv_cache_dtype"] == "fp8"}
    # E2B's head 512: int4 would be refused too, so fp8's fix names int8 alone; Qwen3's head 128 runs int4 on a T4.
    assert "or int4" not in fp8["qat"] and "int4's kernel needs more shared memory" in fp8["qat"]
    assert "or int4, which vLLM's Triton backend runs on this card" in fp8[str(tmp_path / "qwen3")]
    assert any(r["runnable"] for r in rows if r["kv_cache_dtype"] == "int4" and r["checkpoint"] != "qat")


def test_fp8_runs_on_an_l4(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["profiles", "--gpu", "l4", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["profiles"]
    assert all(r["runnable"] for r in rows if r["kv_cache_dtype"] == "fp8" and r["max_model_len"] == 4096)


def test_text_lists_the_refusals_once_with_their_reason(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["profiles", "--gpu", "t4"]) == 0
    out = capsys.readouterr().out
    assert "qat          int4" in out and "not runnable, and why:" in out
    assert out.count("native FP8 (fp8e4nv) requires SM89+") == 1


def test_a_model_adds_its_own_profiles_up_to_its_maximum(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    write_family(tmp_path / "qwen3", "qwen3")
    rows = profiles_json(capsys, "--model", str(tmp_path / "qwen3"))["profiles"]
    assert isinstance(rows, list)
    mine = [r for r in rows if r["checkpoint"] == str(tmp_path / "qwen3")]
    # Qwen3-4B's max_position_embeddings is 40,960.
    assert sorted({r["max_model_len"] for r in mine}) == [4096, 16384, 32768, 40960]


def test_a_bad_model_is_exit_2(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["profiles", "--gpu", "t4", "--model", str(tmp_path / "none")]) == 2
    with pytest.raises(ConfigError):
        with_model(Settings.from_environ({}), "not a model")


def test_lengths_without_a_model_maximum_are_the_defaults() -> None:
    facts = t4()
    assert model_lengths(facts)[-1] == 131072
    assert profiles([]) == []
