"""state: run spec and state round-trip through JSON, writes are atomic with the right mode, errors say the fix."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from t4serve.atomic import write_atomic
from t4serve.errors import ConfigError
from t4serve.supervise.state import (
    ExitRequest,
    Prediction,
    RunSpec,
    new_state,
    read_exit_request,
    read_run_spec,
    read_state,
    write_exit_request,
    write_run_spec,
    write_state,
)

SPEC = RunSpec(
    argv=["vllm", "serve", "google/gemma-4-E2B-it-qat-w4a16-ct", "--dtype", "float16"],
    env={"VLLM_NO_USAGE_STATS": "1"},
    model="google/gemma-4-E2B-it-qat-w4a16-ct",
    served_model_name="google/gemma-4-E2B-it-qat-w4a16-ct",
    host="0.0.0.0",
    port=8000,
    dtype="float16",
    shutdown_timeout=30,
    canary=True,
    gpu_name="Tesla T4",
    hf_hub_cache="/cache/huggingface/hub",
    cache_dir="/cache/t4serve",
    predictions={"kv_tokens": Prediction("kv_tokens", 315974.0, "tokens", "pool / block")},
)


def test_run_spec_round_trip_and_mode(tmp_path: Path) -> None:
    path = write_run_spec(tmp_path, SPEC)
    assert read_run_spec(path) == SPEC
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_state_round_trip_and_phase_marks(tmp_path: Path) -> None:
    state = new_state(SPEC, started_at=100.0, now=101.0)
    state = state.with_phase("loading_weights", 105.0).with_phase("loading_weights", 106.0)
    write_state(tmp_path, state)
    back = read_state(tmp_path)
    assert back == state
    assert [(m.phase, m.began_at) for m in back.phases] == [("starting", 101.0), ("loading_weights", 105.0)]
    assert back.phase_began_at() == 105.0
    with pytest.raises(ValueError):
        state.with_phase("warming up", 107.0)


def test_missing_and_corrupt_state_name_the_file_and_fix(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as missing:
        read_state(tmp_path)
    assert str(tmp_path / "state.json") in missing.value.message() and missing.value.fix
    (tmp_path / "state.json").write_text('{"schema": 1, "phase": "ready"')
    with pytest.raises(ConfigError) as corrupt:
        read_state(tmp_path)
    assert "unreadable" in corrupt.value.what


def test_atomic_write_leaves_no_temp_files_and_replaces(tmp_path: Path) -> None:
    target = tmp_path / "sub" / "f.json"
    write_atomic(target, "one")
    write_atomic(target, "two", mode=0o600)
    assert target.read_text() == "two"
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    assert os.listdir(target.parent) == ["f.json"]


def test_exit_request(tmp_path: Path) -> None:
    assert read_exit_request(tmp_path) is None
    write_exit_request(tmp_path, ExitRequest(1, "vLLM exited 4 times", 5.0))
    assert read_exit_request(tmp_path) == ExitRequest(1, "vLLM exited 4 times", 5.0)
