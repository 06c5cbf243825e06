"""docs/reference.md is the page `t4serve env --reference` generates: the environment table from the settings table
and the exit-code table t4serve.errors.EXIT_CODES holds. The README links it and stays short."""

from __future__ import annotations

from pathlib import Path

from t4serve.commands.env import reference_page
from t4serve.config.settings import markdown_table
from t4serve.errors import exit_codes_markdown

REPO = Path(__file__).resolve().parents[2]
REFERENCE = REPO / "docs" / "reference.md"
README = REPO / "README.md"
MAX_README_LINES = 150


def test_reference_page_holds_the_env_table_of_the_settings() -> None:
    text = REFERENCE.read_text(encoding="utf-8")
    assert markdown_table() in text, (
        "docs/reference.md's environment table is out of date: `t4serve env --reference > docs/reference.md`"
    )


def test_reference_page_holds_the_exit_code_table_of_errors() -> None:
    assert exit_codes_markdown() in REFERENCE.read_text(encoding="utf-8"), (
        "docs/reference.md's exit-code table is out of date: `t4serve env --reference > docs/reference.md`"
    )


def test_reference_page_is_what_the_command_generates() -> None:
    assert REFERENCE.read_text(encoding="utf-8") == reference_page(), (
        "docs/reference.md is out of date: regenerate it with `t4serve env --reference > docs/reference.md`"
    )


def test_readme_is_short_and_links_the_reference() -> None:
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= MAX_README_LINES, "README.md is the front door: keep it to a page"
    assert "(docs/reference.md)" in text
    assert "| `T4SERVE_MODEL` |" not in text and "| 70 |" not in text, "the tables live in docs/reference.md only"
