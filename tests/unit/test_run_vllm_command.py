"""t4serve.commands.run_vllm: the program supervisord runs refuses a missing or foreign run spec with exit 2 and the
fix, before anything starts (the wrapper itself is test_supervise_run_vllm.py's)."""

from __future__ import annotations

from pathlib import Path

import pytest

from t4serve.cli import main


def test_a_missing_spec_says_where_serve_writes_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run-vllm", "--spec", str(tmp_path / "run-spec.json")]) == 2
    err = capsys.readouterr().err
    assert "the run spec not found" in err and f"no file {tmp_path / 'run-spec.json'}" in err and "fix:" in err


def test_a_foreign_spec_is_refused_naming_the_key(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = tmp_path / "run-spec.json"
    spec.write_text('{"x": 1}')
    assert main(["run-vllm", "--spec", str(spec)]) == 2
    err = capsys.readouterr().err
    assert "the run spec is unreadable" in err and "unknown keys ['x'] for RunSpec" in err
    assert "Traceback" not in err
