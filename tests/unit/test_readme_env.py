"""README's environment table is the one `t4serve env --markdown` generates from the settings table, and its
exit-code table the one t4serve.errors.EXIT_CODES holds."""

from __future__ import annotations

from pathlib import Path

from t4serve.config.settings import markdown_table

README = Path(__file__).resolve().parents[2] / "README.md"
START = "<!-- env-table:start -->\n"
END = "<!-- env-table:end -->"


def test_readme_env_table_matches_settings() -> None:
    text = README.read_text(encoding="utf-8")
    assert text.count(START) == 1 and text.count(END) == 1, "README needs exactly one env-table marker pair"
    block = text[text.index(START) + len(START) : text.index(END)]
    assert block == markdown_table(), (
        "README's environment table is out of date; regenerate the block between the env-table markers with "
        "`t4serve env --markdown`"
    )


EXIT_START = "<!-- exit-codes:start -->\n"
EXIT_END = "<!-- exit-codes:end -->"


def test_readme_exit_code_table_matches_errors() -> None:
    from t4serve.errors import exit_codes_markdown

    text = README.read_text(encoding="utf-8")
    assert text.count(EXIT_START) == 1 and text.count(EXIT_END) == 1, "README needs one exit-codes marker pair"
    block = text[text.index(EXIT_START) + len(EXIT_START) : text.index(EXIT_END)]
    assert block == exit_codes_markdown(), "README's exit-code table is out of date: regenerate it from t4serve.errors"
