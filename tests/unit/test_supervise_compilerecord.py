"""t4serve.supervise.compilerecord: the rung to start and the next one down, and the record of what worked, kept in
the cache folder (read as untrusted input, written under a lock)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from t4serve.config.compilation import LADDER, RUNGS_BY_NAME
from t4serve.supervise.compilerecord import (
    RECORD_FILE,
    choose_rung,
    load_record,
    next_rung,
    record_key,
    record_outcome,
)


def test_choose_and_climb_down() -> None:
    assert choose_rung((), None) is None
    assert choose_rung(LADDER, None) is LADDER[0]
    assert choose_rung(LADDER, {"rung": "o1"}) is RUNGS_BY_NAME["o1"]
    assert choose_rung(LADDER, {"rung": "gone"}) is LADDER[0]  # a rung no longer on the ladder: start at the top
    assert next_rung(LADDER, RUNGS_BY_NAME["full"]) is RUNGS_BY_NAME["lean"]
    assert next_rung(LADDER, RUNGS_BY_NAME["eager"]) is None
    assert next_rung((RUNGS_BY_NAME["o1"],), RUNGS_BY_NAME["full"]) is None


def test_record_key_depends_on_model_gpu_and_flags() -> None:
    key = record_key("m", "Tesla T4", ["vllm", "serve", "m"])
    assert len(key) == 16 and key == record_key("m", "Tesla T4", ["vllm", "serve", "m"])
    assert key != record_key("m", "NVIDIA L4", ["vllm", "serve", "m"])
    assert key != record_key("m", "Tesla T4", ["vllm", "serve", "m", "--seed", "1"])


def test_record_outcome_round_trip_and_failures_accumulate(tmp_path: Path) -> None:
    assert load_record(tmp_path, "k") == (None, None)  # no file yet: nothing recorded, nothing wrong
    record_outcome(tmp_path, "k", rung="lean", failed="full", model="m", gpu_name="Tesla T4")
    record_outcome(tmp_path, "k", rung="o1", failed="lean", model="m", gpu_name="Tesla T4")
    record_outcome(tmp_path, "other", rung="full", failed=None, model="n", gpu_name=None)
    entry, problem = load_record(tmp_path, "k")
    assert problem is None and entry is not None
    assert (entry["rung"], entry["failed"], entry["model"], entry["gpu"]) == ("o1", ["full", "lean"], "m", "Tesla T4")
    assert set(json.loads((tmp_path / RECORD_FILE).read_text())) == {"k", "other"}


@pytest.mark.parametrize("content", ["[1, 2]", "{not json", "x" * (2 << 20)])
def test_a_damaged_record_is_reported_not_trusted(tmp_path: Path, content: str) -> None:
    (tmp_path / RECORD_FILE).write_text(content)
    entry, problem = load_record(tmp_path, "k")
    assert entry is None and problem is not None
    # Recording over a damaged file starts it afresh.
    record_outcome(tmp_path, "k", rung="full", failed=None, model="m", gpu_name=None)
    assert load_record(tmp_path, "k")[0] is not None
