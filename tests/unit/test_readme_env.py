"""README's environment table is the one `t4serve env --markdown` generates from the settings table."""

from __future__ import annotations

from pathlib import Path

from t4serve.settings import markdown_table

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
