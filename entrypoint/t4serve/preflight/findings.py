"""A preflight finding (ok / warn / fail, with what was found, what is required and the fix), and a list of them
as a table or JSON."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass

LEVELS = ("ok", "warn", "fail")


@dataclass(frozen=True)
class Finding:
    check: str
    level: str
    found: str
    required: str
    fix: str

    def __post_init__(self) -> None:
        if self.level not in LEVELS:
            raise ValueError(f"level {self.level!r} is not one of {LEVELS}")


def has_failures(findings: Iterable[Finding]) -> bool:
    return any(f.level == "fail" for f in findings)


def format_table(findings: list[Finding]) -> str:
    """Human table: one line per finding; failures and warnings add what is required and the fix."""
    width = max((len(f.check) for f in findings), default=5)
    lines = []
    for f in findings:
        lines.append(f"{f.level.upper():<4}  {f.check:<{width}}  {f.found}")
        if f.level != "ok":
            pad = " " * (6 + width + 2)
            lines.append(f"{pad}required: {f.required}")
            if f.fix:
                lines.append(f"{pad}fix: {f.fix}")
    fails = sum(f.level == "fail" for f in findings)
    warns = sum(f.level == "warn" for f in findings)
    lines.append(f"{fails} failed, {warns} warnings, {len(findings) - fails - warns} ok")
    return "\n".join(lines)


def to_json(findings: list[Finding]) -> str:
    return json.dumps([asdict(f) for f in findings], indent=2) + "\n"
