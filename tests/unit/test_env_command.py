"""t4serve.commands.env: the settings in effect with their origins, secrets redacted, a bad value refused as serve
refuses it (exit 2), and `--markdown` as docs/reference.md's table."""

from __future__ import annotations

import pytest

from t4serve.cli import main
from t4serve.config.settings import VARIABLES, markdown_table


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """No setting leaks in from the machine."""
    for var in VARIABLES:
        monkeypatch.delenv(var.name, raising=False)


def test_values_origins_and_redaction(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("T4SERVE_API_KEY", "sk-envcommandnotreal1")
    monkeypatch.setenv("T4SERVE_PORT", "8123")
    assert main(["env", "--model", "bf16"]) == 0
    out = capsys.readouterr().out
    assert "sk-envcommandnotreal1" not in out
    lines = {line.split()[0]: line for line in out.splitlines() if line.strip()}
    assert "<redacted>" in lines["T4SERVE_API_KEY"] and "[set by env]" in lines["T4SERVE_API_KEY"]
    assert " 8123 " in lines["T4SERVE_PORT"]
    assert "google/gemma-4-E2B-it" in lines["T4SERVE_MODEL"]


def test_a_bad_value_exits_2(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("T4SERVE_PORT", "eighty")
    assert main(["env"]) == 2
    assert "T4SERVE_PORT" in capsys.readouterr().err


def test_markdown_is_the_readme_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["env", "--markdown"]) == 0
    assert capsys.readouterr().out == markdown_table()
