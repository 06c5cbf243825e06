"""t4serve.errors: one exit code per class, each documented in docs/reference.md, and the message shape."""

from __future__ import annotations

from pathlib import Path

import pytest

from t4serve import errors
from t4serve.cli import main
from t4serve.errors import BenchError, T4ServeError

REFERENCE = Path(__file__).resolve().parents[2] / "docs" / "reference.md"


def _classes() -> list[type[T4ServeError]]:
    found = [c for c in vars(errors).values() if isinstance(c, type) and issubclass(c, T4ServeError)]
    return [c for c in found if c is not T4ServeError]


def test_each_class_has_its_own_exit_code() -> None:
    codes = [c.exit_code for c in _classes()]
    assert len(codes) == len(set(codes)), {c.__name__: c.exit_code for c in _classes()}
    assert BenchError.exit_code == 6


def test_every_exit_code_is_in_the_table_and_the_module_doc() -> None:
    """EXIT_CODES is the one table (docs/reference.md's copy is checked by test_readme_env); every error class's code
    is in it."""
    assert {c.exit_code for c in _classes()} <= {int(code) for code, _, _ in errors.EXIT_CODES if code.isdigit()}
    assert "| 2 | bad configuration" in REFERENCE.read_text(encoding="utf-8")
    doc = errors.__doc__ or ""
    for c in _classes():
        assert f" {c.exit_code}" in doc, c.__name__


def test_message_has_found_required_fix_in_order() -> None:
    exc = BenchError("the server is not ready", found="HTTP 503", required="/health 200", fix="wait")
    assert exc.message() == "the server is not ready\n  found: HTTP 503\n  required: /health 200\n  fix: wait"
    assert str(exc) == exc.message()
    assert BenchError("bare").message() == "bare"


def test_main_exits_with_the_class_code_and_no_traceback(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from t4serve.bench import runner

    def never_ready(*_args: object, **_kwargs: object) -> None:
        """Stands for a sweep whose server never became ready."""
        raise BenchError("the vLLM server was not ready within 1 s", found="no answer", required="/health", fix="wait")

    monkeypatch.setattr(runner, "run_bench", never_ready)
    assert main(["bench", "--models", "qat", "--output", str(tmp_path / "out")]) == 6
    err = capsys.readouterr().err
    assert "t4serve: the vLLM server was not ready within 1 s" in err and "fix: wait" in err
    assert "Traceback" not in err
