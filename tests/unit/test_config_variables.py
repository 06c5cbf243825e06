"""t4serve.config.variables: the one switch parser every on/off setting shares, and the rows of the split settings
table."""

from __future__ import annotations

from pathlib import Path

import pytest

from t4serve.config import secrets
from t4serve.config.settings import VARIABLES, Settings
from t4serve.config.variables import FALSE_WORDS, TRUE_WORDS, Context, Invalid, boolean

SWITCHES = {"HF_HUB_OFFLINE": "hf_hub_offline", "T4SERVE_CANARY": "canary"}


@pytest.mark.parametrize("name", sorted(SWITCHES))
@pytest.mark.parametrize("word", sorted(TRUE_WORDS | FALSE_WORDS))
def test_every_switch_reads_the_same_words(name: str, word: str) -> None:
    for spelling in (word, word.upper(), f" {word} "):
        value = getattr(Settings.from_environ({name: spelling}, cwd="/"), SWITCHES[name])
        assert value is (word in TRUE_WORDS)


def test_the_switch_rows_are_the_only_boolean_fields() -> None:
    parsed = Settings.from_environ({}, cwd="/")
    assert {v.name for v in VARIABLES if isinstance(getattr(parsed, v.field), bool)} == set(SWITCHES)


def test_a_refusal_lists_the_words_of_its_variable() -> None:
    with pytest.raises(Invalid) as info:
        boolean("on or off", "on")("maybe", Context({}, Path("/")))
    assert (info.value.reason, info.value.example) == ("must be on or off", "on")
    assert not TRUE_WORDS & FALSE_WORDS


def test_the_secret_rows_sit_in_the_table_once_each() -> None:
    rows = [secrets.API_KEY, secrets.API_KEY_FILE, secrets.HF_TOKEN, secrets.HF_TOKEN_FILE]
    assert all(sum(v is row for v in VARIABLES) == 1 for row in rows)
    assert {(p.var.name, p.file_var.name) for p in secrets.SECRET_PAIRS} == {
        ("HF_TOKEN", "HF_TOKEN_FILE"),
        ("T4SERVE_API_KEY", "T4SERVE_API_KEY_FILE"),
    }
    assert [v.name for v in VARIABLES if v.secret] == ["T4SERVE_API_KEY", "HF_TOKEN"]


def test_a_switch_is_written_back_in_the_words_of_its_default() -> None:
    from t4serve.config.settings import VARIABLES_BY_NAME, Settings
    from t4serve.config.variables import switch_text

    assert (switch_text(True, "on"), switch_text(False, "On")) == ("on", "off")
    assert (switch_text(True, "0"), switch_text(False, "0")) == ("1", "0")
    assert (switch_text(True, "no"), switch_text(False, None)) == ("yes", "0")
    s = Settings.from_environ({"T4SERVE_CANARY": "false", "HF_HUB_OFFLINE": "yes"})
    assert s.value_text(VARIABLES_BY_NAME["T4SERVE_CANARY"]) == "off"
    assert s.value_text(VARIABLES_BY_NAME["HF_HUB_OFFLINE"]) == "1"
