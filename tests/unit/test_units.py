"""t4serve.units: the byte constants and the one duration format."""

from __future__ import annotations

import pytest

from t4serve.units import GB, GIB, KIB, MIB, TIB, fmt_duration


def test_byte_units() -> None:
    assert (KIB, MIB, GIB, TIB) == (2**10, 2**20, 2**30, 2**40)
    assert GB == 10**9 and isinstance(GB, float)


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(-3, "0s"), (0, "0s"), (0.4, "0s"), (42, "42s"), (59.4, "59s"), (60, "1m00s"), (185, "3m05s"),
     (3599, "59m59s"), (3600, "1h00m"), (3720, "1h02m"), (90061, "25h01m")],
)
def test_fmt_duration(seconds: float, text: str) -> None:
    assert fmt_duration(seconds) == text
