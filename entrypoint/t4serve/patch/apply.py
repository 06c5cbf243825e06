"""Write the Turing clamp into vLLM's triton_unified_attention.py: splice by syntax tree, write atomically, compile.

`patch_source(text, version)` is pure: it renames vLLM's `_get_tile_size` (by the def node's line) and inserts the
marked clamp right after it; the result is parsed and located again before anything is written. `apply_clamp(root)`
writes it with temp + rename (never a partial file) and byte-compiles it; on an already patched file it is a no-op.
"""

from __future__ import annotations

import ast
import importlib.util
import py_compile
from dataclasses import dataclass
from pathlib import Path

from t4serve.atomic import write_atomic
from t4serve.errors import PatchError
from t4serve.patch.clamp import TARGET_FUNCTION, UNCLAMPED_FUNCTION, clamp_sha256, marked_block
from t4serve.patch.locate import TARGET_PATH, TileSite, locate


@dataclass(frozen=True)
class ApplyResult:
    # The vllm package folder and the patched file inside it.
    root: Path
    path: Path
    vllm_version: str
    # "applied" (written now) or "already-applied" (this clamp was there, intact: nothing written).
    action: str
    site: TileSite


def find_vllm_root(vllm_root: str | Path | None = None) -> Path:
    """The vllm package folder (the one holding v1/): given, or found on sys.path without importing vllm.

    A folder that holds `vllm/` (site-packages, or a copied tree) is accepted too and resolved to `vllm/`.
    """
    if vllm_root is None:
        spec = importlib.util.find_spec("vllm")
        if spec is None or not spec.submodule_search_locations:
            raise PatchError(
                "vLLM is not installed in this Python environment",
                found="no importable `vllm` package",
                required="vLLM installed (the image's /opt/venv), or --vllm-root pointing at a vllm package folder",
                fix="run inside the image, or pass --vllm-root /path/to/site-packages/vllm",
            )
        return Path(next(iter(spec.submodule_search_locations)))
    root = Path(vllm_root)
    if (root / TARGET_PATH).is_file():
        return root
    if (root / "vllm" / TARGET_PATH).is_file():
        return root / "vllm"
    raise PatchError(
        f"no vLLM attention kernel under {root}",
        found=f"neither {root / TARGET_PATH} nor {root / 'vllm' / TARGET_PATH} exists",
        required=f"--vllm-root naming a vllm package folder that holds {TARGET_PATH}",
        fix="pass the folder of the installed package, e.g. --vllm-root /opt/venv/lib/python3.13/site-packages/vllm",
    )


def read_vllm_version(root: Path) -> str:
    """vLLM's version from its generated _version.py, read by syntax tree (importing vLLM costs seconds)."""
    version_file = root / "_version.py"
    try:
        tree = ast.parse(version_file.read_text(encoding="utf-8"))
    except (OSError, SyntaxError) as exc:
        raise PatchError(
            f"cannot read vLLM's version from {version_file}",
            found=str(exc),
            required="vllm/_version.py as the vLLM wheel ships it",
            fix="point --vllm-root at a complete vllm package folder",
        ) from exc
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Assign)
            and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str)
            and any(isinstance(t, ast.Name) and t.id in ("__version__", "version") for t in node.targets)
        ):
            return node.value.value
    raise PatchError(
        f"{version_file} names no version",
        found="no `__version__ = '...'` assignment",
        required="vllm/_version.py as the vLLM wheel ships it",
        fix="point --vllm-root at a complete vllm package folder",
    )


def patch_source(text: str, vllm_version: str) -> tuple[str, TileSite]:
    """The file's text with the clamp spliced in, and where it went. Raises PatchError on drift."""
    site = locate(text, vllm_version)
    if site.state == "patched":
        return text, site
    lines = text.splitlines(keepends=True)
    def_index = site.function_line - 1
    def_line = lines[def_index]
    head = f"def {TARGET_FUNCTION}("
    # The def node's line must hold exactly one `def _get_tile_size(` (locate() found the node there).
    if def_line.count(head) != 1:
        raise PatchError(
            f"the def line of {TARGET_FUNCTION} in vLLM {vllm_version} is not in the form the splice expects",
            found=f"line {site.function_line}: {def_line.rstrip()}",
            required=f"a line holding `{head}`",
            fix="update t4serve/patch/apply.py for this vLLM's formatting",
        )
    lines[def_index] = def_line.replace(head, f"def {UNCLAMPED_FUNCTION}(")
    insert_at = site.function_end_line
    block = "\n\n" + marked_block()
    if insert_at < len(lines) and lines[insert_at].strip():
        block += "\n\n"
    lines.insert(insert_at, block)
    patched = "".join(lines)
    after = locate(patched, vllm_version)
    if after.state != "patched" or after.marker is None or after.marker.stated_sha256 != clamp_sha256():
        raise PatchError(
            f"the clamp spliced into vLLM {vllm_version} does not read back as applied (a bug in t4serve)",
            found=f"state {after.state}",
            required="state patched with this t4serve's clamp hash",
        )
    return patched, after


def byte_compile(path: Path) -> None:
    """Compile the patched file so a read-only runtime never recompiles it (and so a syntax slip fails here)."""
    try:
        py_compile.compile(str(path), doraise=True)
    except py_compile.PyCompileError as exc:
        raise PatchError(
            f"the patched {path} does not byte-compile",
            found=exc.msg,
            required="a patched file Python can compile",
            fix="reinstall vLLM's pristine file and report this as a t4serve bug",
        ) from exc


def apply_clamp(vllm_root: str | Path | None = None) -> ApplyResult:
    root = find_vllm_root(vllm_root)
    version = read_vllm_version(root)
    path = root / TARGET_PATH
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise PatchError(
            f"cannot read {path}",
            found=str(exc),
            required="a readable vLLM attention kernel file",
            fix="run as the user that installed vLLM",
        ) from exc
    patched, site = patch_source(text, version)
    if site.state == "patched" and patched == text:
        return ApplyResult(root, path, version, "already-applied", site)
    try:
        write_atomic(path, patched)
    except OSError as exc:
        raise PatchError(
            f"cannot write the patched {path}",
            found=str(exc),
            required=f"write access to {path.parent}",
            fix="run `t4serve patch apply` as the user that installed vLLM (root in the image build)",
        ) from exc
    byte_compile(path)
    return ApplyResult(root, path, version, "applied", site)
