"""The package's layout, as docs/architecture.md states it: every import runs from a later stage to the ground or an
earlier stage, never back; at most 16 modules loose in entrypoint/t4serve; no module over 600 lines. Read from the
source (every import statement, those inside functions too), so a new module or import is held to it at once."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "entrypoint" / "t4serve"
GROUND = ("errors", "units", "untrusted", "atomic", "serde", "httpclient", "apiguard", "facts", "gpus")
# The stages in docs/architecture.md's order ("The import order"): a module may import the ground, its own stage, and
# any stage before its own.
STAGES = ("config", "patch", "turing", "probes", "planning", "preflight", "pipeline", "supervise", "contract", "host",
          "bench", "mcp", "commands", "cli", "__main__")  # fmt: skip
MAX_LOOSE_MODULES = 16
MAX_MODULE_LINES = 600


def modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def layer(dotted: str) -> int:
    """-1 for the package itself (its __version__) and the ground, else the stage's place in STAGES."""
    parts = dotted.split(".")
    if parts[0] != "t4serve":
        raise ValueError(dotted)
    if len(parts) == 1 or parts[1] in (*GROUND, "__version__"):
        return -1
    return STAGES.index(parts[1])


def imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) for every t4serve module `path` imports."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "t4serve":
                found += [(node.lineno, f"t4serve.{alias.name}") for alias in node.names]
            elif node.module.startswith("t4serve."):
                found.append((node.lineno, node.module))
        elif isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.startswith("t4serve.")]
    return found


def dotted(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    return ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)


def test_every_module_has_a_place_in_the_stages() -> None:
    for path in modules():
        layer(dotted(path))  # raises for a module of no stage


@pytest.mark.parametrize("path", modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_import_runs_back_to_a_later_stage(path: Path) -> None:
    own = layer(dotted(path))
    late = [f"line {line}: {name}" for line, name in imports(path) if layer(name) > own]
    assert not late, f"{dotted(path)} (stage {STAGES[own] if own >= 0 else 'ground'}) imports a later stage: {late}"


def test_the_ground_imports_no_stage() -> None:
    for name in GROUND:
        assert all(layer(m) == -1 for _, m in imports(PACKAGE / f"{name}.py")), name


def test_at_most_16_modules_loose_at_the_top() -> None:
    loose = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(loose) <= MAX_LOOSE_MODULES, loose
    assert {p.stem for p in PACKAGE.glob("*.py")} <= {*GROUND, *STAGES, "__init__"}


@pytest.mark.parametrize("path", modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_module_over_600_lines(path: Path) -> None:
    lines = len(path.read_text(encoding="utf-8").splitlines())
    assert lines <= MAX_MODULE_LINES, f"{path.relative_to(PACKAGE)}: {lines} lines; split it along its concerns"


def test_the_document_states_this_order() -> None:
    text = (PACKAGE.parents[1] / "docs" / "architecture.md").read_text(encoding="utf-8")
    order = text[text.index("### The import order"):text.index("## The phases of a start")]
    places = [order.index(f"`{stage}/`" if (PACKAGE / stage).is_dir() else f"`{stage}.py`") for stage in STAGES]
    assert places == sorted(places), "docs/architecture.md lists the stages in another order than this test"
    assert all(f"`{name}`" in order for name in GROUND)
