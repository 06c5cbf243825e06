"""docs/mcp.md's table of tools is the tools as published: every tool once, in TOOLS' order, each with its
parameters (`?` where it has a default), its title, its tool set and its hints as the @tool decorator gives them."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

from t4serve.mcp.registry import ToolSpec
from t4serve.mcp.server import TOOL_GROUPS, TOOLS

DOC = Path(__file__).resolve().parents[2] / "docs" / "mcp.md"
HEADER = "| tool | title | set | hints | what it does |"


def table_rows() -> list[list[str]]:
    text = DOC.read_text(encoding="utf-8")
    assert text.count(HEADER) == 1, f"docs/mcp.md needs one table headed {HEADER}"
    lines = text[text.index(HEADER):].splitlines()[2:]
    rows = []
    for line in lines:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip().strip("|").split(" | ")])
    return rows


def hints_text(spec: ToolSpec) -> str:
    """The hints column as docs/mcp.md words it."""
    a = spec.annotations
    words = [w for w, on in (("read-only", a.read_only_hint), ("destructive", a.destructive_hint),
                             ("idempotent", a.idempotent_hint), ("open world", a.open_world_hint)) if on]  # fmt: skip
    return ", ".join(words) or "not read-only"


def parameters(name: str) -> dict[str, bool]:
    """The tool's parameters (name -> has a default), as its method declares them."""
    method = next(getattr(cls, name) for cls in TOOL_GROUPS if hasattr(cls, name))
    params = inspect.signature(inspect.unwrap(method)).parameters.values()
    return {p.name: p.default is not inspect.Parameter.empty for p in params if p.name not in ("self", "ctx")}


def test_the_table_lists_every_tool_in_order_with_its_title_set_and_hints() -> None:
    rows = table_rows()
    names = [re.match(r"`(\w+)\(", row[0]).group(1) for row in rows]  # type: ignore[union-attr]
    assert names == list(TOOLS), "docs/mcp.md's tool table: one row per tool, in the order t4serve mcp lists them"
    for row, (name, spec) in zip(rows, TOOLS.items(), strict=True):
        assert len(row) == 5, row
        assert row[1] == spec.title, (name, row[1], spec.title)
        assert row[2] == spec.toolset, (name, row[2], spec.toolset)
        assert row[3] == hints_text(spec), (name, row[3], hints_text(spec))
        assert row[4], f"{name}: say what it does"


def test_the_table_names_each_tools_parameters() -> None:
    for row in table_rows():
        name, inside = re.fullmatch(r"`(\w+)\((.*)\)`", row[0]).groups()  # type: ignore[union-attr]
        declared = parameters(name)
        # "prompt or messages": two parameters of which one is given.
        written = [w.strip() for part in inside.split(",") if part.strip() for w in part.split(" or ")]
        assert {w.rstrip("?") for w in written} == set(declared), (name, written, declared)
        for word in written:
            alternatives = " or " in inside and word.rstrip("?") in inside.split(",")[0]
            if not alternatives:
                assert word.endswith("?") == declared[word.rstrip("?")], (name, word)
