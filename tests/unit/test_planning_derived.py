"""t4serve.planning.derived: a figure with its arithmetic, and bytes in binary units."""

from __future__ import annotations

import pytest

from t4serve.planning.derived import Derived, format_bytes
from t4serve.units import GIB, KIB, MIB, TIB


@pytest.mark.parametrize(
    ("n", "text"),
    [(0, "0 B"), (1023, "1023 B"), (KIB, "1.000 KiB"), (1536 * KIB, "1.500 MiB"), (15360 * MIB, "15.000 GiB"),
     (3 * TIB, "3.000 TiB"), (-2 * GIB, "-2.000 GiB")],
)
def test_format_bytes(n: int, text: str) -> None:
    assert format_bytes(n) == text


def test_derived_shows_value_unit_and_how() -> None:
    assert str(Derived(2 * GIB, "B", "a x b")) == "2.000 GiB  (a x b)"
    assert str(Derived(315_974, "tokens", "pool / block")) == "315,974 tokens  (pool / block)"
    assert Derived(19.2900, "x", "").format_value() == "19.29"
    assert Derived(0.5, "x", "").format_value() == "0.5"
    assert Derived(1.0, "x", "", "setting").format_value() == "1" and Derived(1, "x", "").source == "derived"
