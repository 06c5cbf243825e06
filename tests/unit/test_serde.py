"""t4serve.serde: dataclasses to JSON-compatible dicts and back, strictly (unknown or missing keys fail loudly)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import pytest

from t4serve.errors import ConfigError
from t4serve.serde import from_dict, to_dict


@dataclass(frozen=True)
class Inner:
    name: str
    size: int | None = None


@dataclass(frozen=True)
class Outer:
    pair: tuple[int, int]
    ratio: float
    inners: list[Inner]
    by_name: dict[str, Inner]
    optional: Inner | None
    anything: Any = None
    many: tuple[str, ...] = ()
    tags: list[str] = field(default_factory=list)


SAMPLE = Outer((7, 5), 0.5, [Inner("a", 1), Inner("b")], {"c": Inner("c", 3)}, None, {"free": [1, "x"]}, ("p", "q"))


def test_round_trip_through_json() -> None:
    data = to_dict(SAMPLE)
    assert data["pair"] == [7, 5] and data["many"] == ["p", "q"]  # tuples become lists
    assert from_dict(Outer, json.loads(json.dumps(data))) == SAMPLE


def test_an_int_is_a_float_where_a_float_is_declared() -> None:
    value = from_dict(Outer, {**to_dict(SAMPLE), "ratio": 1})
    assert value.ratio == 1.0 and isinstance(value.ratio, float)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"extra": 1}, r"\$: unknown keys \['extra'\] for Outer"),
        ({"pair": [7]}, r"\$.pair: expected 2 items, found 1"),
        ({"pair": "7.5"}, r"\$.pair: expected a list"),
        ({"inners": [{"name": 3}]}, r"\$.inners\[0\].name: expected str"),
        ({"by_name": []}, r"\$.by_name: expected an object"),
        ({"ratio": True}, r"\$.ratio: expected float"),
        ({"optional": {"size": 1}}, "missing key 'name' for Inner"),
    ],
)
def test_bad_input_names_where(change: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        from_dict(Outer, {**to_dict(SAMPLE), **change})


def test_a_bool_is_not_an_int() -> None:
    with pytest.raises(ConfigError, match="expected int"):
        from_dict(Inner, {"name": "a", "size": True})
    assert from_dict(Inner, {"name": "a"}) == Inner("a")  # a field with a default may be absent
