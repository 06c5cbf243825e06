"""What the Turing attention proof reads, gathered so the image's proof stage reruns only when that changes.

The proof (`t4serve.turing.proof`, run in the image's `turing-attention` stage) depends on three things: the locked
venv (vLLM, Triton), the clamped vLLM attention file, and the t4serve modules it imports. The build stage gathers the
last two into one folder (`t4serve attention inputs --out /turing-inputs`), laid out at their installed paths; the
proof stage starts from the locked venv and copies that folder in. BuildKit keys a copy by the content of what it
copies, so a code change anywhere else in the package leaves the proof stage, and the image layer holding its record,
cached: a code-only rebuild takes seconds, not the proof's minute and a half. The modules are found by reading the
import statements (nested ones included) of the proof's two entry modules, transitively; a module that one of them
imports but the folder lacks fails the proof stage with an ImportError, so the set cannot silently fall short.
"""

from __future__ import annotations

import ast
import os
import shutil
from pathlib import Path

from t4serve.errors import PatchError
from t4serve.patch.apply import find_vllm_root
from t4serve.patch.locate import TARGET_PATH

# The proof's parent process and the worker it starts (`python -m t4serve.turing`).
PROOF_ENTRY_MODULES = ("t4serve.turing.proof", "t4serve.turing.__main__")
PACKAGE = "t4serve"


def _module_file(package_parent: Path, module: str) -> Path | None:
    base = package_parent.joinpath(*module.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _imported(tree: ast.AST, module: str, is_package: bool) -> set[str]:
    """Every t4serve module name an import statement in `tree` may load (a `from X import Y` may load X.Y)."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                anchor = module.split(".")
                anchor = anchor[: len(anchor) - node.level + (1 if is_package else 0)]
                base = ".".join(anchor + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return {n for n in names if n == PACKAGE or n.startswith(PACKAGE + ".")}


def module_closure(package_parent: Path, entries: tuple[str, ...] = PROOF_ENTRY_MODULES) -> list[Path]:
    """The source files of `entries` and every t4serve module they import, transitively (parent packages included),
    relative to `package_parent` (the folder holding the `t4serve` package), sorted."""
    todo = list(entries)
    found: dict[str, Path] = {}
    while todo:
        module = todo.pop()
        if module in found:
            continue
        path = _module_file(package_parent, module)
        if path is None:
            continue  # `from X import name` where name is not a module
        found[module] = path
        parts = module.split(".")
        todo.extend(".".join(parts[:i]) for i in range(1, len(parts)))
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        todo.extend(_imported(tree, module, path.name == "__init__.py"))
    missing = [m for m in entries if m not in found]
    if missing:
        raise PatchError("the Turing attention proof's modules are not installed",
                         found=f"no source for {', '.join(missing)} under {package_parent}",
                         required="the t4serve package installed with its sources (.py files)",
                         fix="reinstall t4serve (pip install --no-deps /src)")
    return sorted(p.relative_to(package_parent) for p in found.values())


def gather(out: str | Path, *, vllm_root: str | Path | None = None, package_parent: Path | None = None) -> list[Path]:
    """Copy the proof's t4serve modules and vLLM's attention file into `out`, each at its absolute installed path
    below `out` (so `COPY --from=build <out>/ /` puts them back in place); return the copied paths. File contents
    only: modes are fixed (0644) and nothing else is carried, so the same sources gather to the same bytes."""
    parent = package_parent or Path(__file__).resolve().parents[2]
    root = find_vllm_root(vllm_root)
    sources = [parent / rel for rel in module_closure(parent)] + [root / TARGET_PATH]
    destination = Path(out)
    if destination.exists() and (not destination.is_dir() or any(destination.iterdir())):
        raise PatchError("the folder for the Turing attention proof's inputs is not empty",
                         found=f"{destination} already exists with content",
                         required="a new or empty folder",
                         fix=f"remove {destination} or pass another --out")
    copied = []
    try:
        for source in sources:
            absolute = source.resolve()
            target = destination / absolute.relative_to(absolute.anchor)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(absolute, target)
            os.chmod(target, 0o644)
            copied.append(target)
    except OSError as exc:
        raise PatchError(f"cannot gather the Turing attention proof's inputs into {destination}", found=str(exc),
                         required=f"read access to the installed sources and write access to {destination}",
                         fix="pass --out to a writable folder") from exc
    return copied
