"""A number together with how it was derived, so every figure the plan prints can show its arithmetic."""

from __future__ import annotations

from dataclasses import dataclass

from t4serve.units import GIB, KIB, MIB, TIB


@dataclass(frozen=True)
class Derived:
    """`value` in `unit`, with `how`: the arithmetic or source, in words a user can check by hand.

    `source` says where the figure comes from: "setting" (the user set it), "derived" (computed here),
    "measured" (read off the machine), "published" (published-t4-run.md) or "default".
    """

    value: float
    unit: str
    how: str
    source: str = "derived"

    def __str__(self) -> str:
        unit = "" if self.unit in ("B", "bytes") else f" {self.unit}"
        return f"{self.format_value()}{unit}  ({self.how})"

    def format_value(self) -> str:
        if self.unit in ("B", "bytes"):
            return format_bytes(int(self.value))
        if float(self.value).is_integer():
            return f"{int(self.value):,}"
        return f"{self.value:,.3f}".rstrip("0").rstrip(".")


def format_bytes(n: int) -> str:
    """Binary units, as vLLM logs them (GiB), with the exact byte count for large values."""
    if abs(n) < KIB:
        return f"{n} B"
    for unit, size in (("TiB", TIB), ("GiB", GIB), ("MiB", MIB), ("KiB", KIB)):
        if abs(n) >= size:
            return f"{n / size:.3f} {unit}"
    return f"{n} B"
