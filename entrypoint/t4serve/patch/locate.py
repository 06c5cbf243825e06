"""Find the Turing clamp's target in vLLM's triton_unified_attention.py by its syntax tree, and refuse drift.

`locate(source, vllm_version)` returns where `_get_tile_size` and its two callers are, and whether t4serve's clamp
is already in; any shape the clamp was not written for (function missing, signature changed, callers moved, tiles
other than 16/32, vLLM clamping by shared memory itself) raises PatchError naming the version and what moved.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field

from t4serve.errors import PatchError
from t4serve.patch.clamp import (
    CLAMPED_TILE,
    TARGET_FUNCTION,
    UNCLAMPED_FUNCTION,
    UNCLAMPED_TILE,
    MarkedClamp,
    clamp_sha256,
    find_marked_clamp,
)

TARGET_PATH = "v1/attention/ops/triton_unified_attention.py"
EXPECTED_PARAMETERS = ("head_size", "sliding_window", "element_size", "is_prefill")
CALLER_FUNCTION = "unified_attention"
# Tile variables the caller assigns from `_get_tile_size`, and the `is_prefill` value each must pass.
TILE_VARIABLES = {"TILE_SIZE_PREFILL": True, "TILE_SIZE_DECODE": False}
MAIN_KERNEL = "kernel_unified_attention"
REDUCE_KERNEL = "reduce_segments"
# Words that mean vLLM's own tile choice already looks at the device's shared memory (upstream PR #39018 reads
# `shared_memory_per_block_optin`): t4serve's clamp must then be reviewed, not stacked on top.
_SHARED_MEMORY_WORDS = ("shared_mem", "smem", "get_device_properties", "max_shared", "sharedmem")
FIX_REINSTALL = "reinstall vLLM's pristine file: pip install --force-reinstall --no-deps vllm=={version}"
FIX_DRIFT = (
    "this vLLM's tile selection no longer has the shape the Turing clamp was written for (vLLM 0.33.0 and 0.34.0): "
    "review vLLM's _get_tile_size and its callers, then update t4serve/patch (clamp.py, locate.py) or pin the vLLM "
    "version the clamp was proven against (docker/requirements.in)"
)


@dataclass(frozen=True)
class TileSite:
    """Where the clamp goes: the function's lines, its callers' lines, and the patch state found."""

    vllm_version: str
    function_line: int
    function_end_line: int
    # "TILE_SIZE_PREFILL" / "TILE_SIZE_DECODE" -> line of the assignment in `unified_attention`.
    caller_lines: dict[str, int]
    # Tile sizes vLLM's body can return (constants found in its return statements).
    returned_tiles: tuple[int, ...]
    # "unpatched", or "patched" (t4serve's clamp is in, intact, at this t4serve's hash).
    state: str
    marker: MarkedClamp | None = None
    notes: list[str] = field(default_factory=list)


def _drift(version: str, moved: str, *, found: str, required: str) -> PatchError:
    return PatchError(
        f"the Turing clamp cannot be applied to vLLM {version}: {moved}",
        found=found,
        required=required,
        fix=FIX_DRIFT,
    )


def _module_function(tree: ast.Module, name: str) -> list[ast.FunctionDef | ast.AsyncFunctionDef]:
    return [n for n in tree.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) and n.name == name]


def _signature(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> str:
    return f"{fn.name}({ast.unparse(fn.args)})"


def _called_name(node: ast.Call) -> str | None:
    return node.func.id if isinstance(node.func, ast.Name) else None


def _launched_kernel(node: ast.Call) -> str | None:
    """`kernel[grid](...)` -> "kernel"."""
    func = node.func
    if isinstance(func, ast.Subscript) and isinstance(func.value, ast.Name):
        return func.value.id
    return None


def _is_prefill_argument(call: ast.Call) -> ast.expr | None:
    for keyword in call.keywords:
        if keyword.arg == "is_prefill":
            return keyword.value
    if len(call.args) >= 4:
        return call.args[3]
    return None


def _check_signature(fn: ast.FunctionDef | ast.AsyncFunctionDef, version: str) -> None:
    args = fn.args
    names = tuple(a.arg for a in args.posonlyargs + args.args)
    if (
        names != EXPECTED_PARAMETERS
        or args.vararg is not None
        or args.kwarg is not None
        or args.kwonlyargs
        or args.defaults
        or isinstance(fn, ast.AsyncFunctionDef)
        or fn.decorator_list
    ):
        raise _drift(
            version,
            f"the signature of {TARGET_FUNCTION} changed (line {fn.lineno})",
            found=_signature(fn),
            required=f"{TARGET_FUNCTION}({', '.join(EXPECTED_PARAMETERS)}), no defaults, no decorators",
        )


def _check_not_clamped_upstream(fn: ast.FunctionDef | ast.AsyncFunctionDef, version: str) -> None:
    for node in ast.walk(fn):
        words: list[str] = []
        if isinstance(node, ast.Name):
            words.append(node.id)
        elif isinstance(node, ast.Attribute):
            words.append(node.attr)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node is not _docstring_node(fn):
            words.append(node.value)
        for word in words:
            if any(w in word.lower() for w in _SHARED_MEMORY_WORDS):
                line = getattr(node, "lineno", fn.lineno)
                raise PatchError(
                    f"vLLM {version} already limits the attention tile by shared memory in {TARGET_FUNCTION} "
                    f"(line {line}: {word!r}); stacking t4serve's clamp on it is unproven",
                    found=f"{TARGET_FUNCTION} reads the device's shared memory itself (upstream PR #39018 landed?)",
                    required=f"vLLM's {TARGET_FUNCTION} without its own shared-memory clamp, as in vLLM 0.33.0 and "
                    "0.34.0",
                    fix="check that vLLM's own clamp gives tile 16 for head 512 at 65,536 B (sm_75), then drop "
                    "`t4serve patch apply` from docker/Dockerfile for this vLLM version",
                )


def _docstring_node(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> ast.expr | None:
    if fn.body and isinstance(fn.body[0], ast.Expr) and isinstance(fn.body[0].value, ast.Constant):
        return fn.body[0].value
    return None


def _returned_tiles(fn: ast.FunctionDef | ast.AsyncFunctionDef, version: str) -> tuple[int, ...]:
    """The constant tiles the body returns; a computed return means the tile logic changed shape."""
    tiles: set[int] = set()

    def constants(expr: ast.expr | None, line: int) -> None:
        if isinstance(expr, ast.Constant) and type(expr.value) is int:
            tiles.add(expr.value)
        elif isinstance(expr, ast.IfExp):
            constants(expr.body, line)
            constants(expr.orelse, line)
        else:
            raise _drift(
                version,
                f"{TARGET_FUNCTION} computes its tile instead of choosing a constant (line {line})",
                found=f"return {ast.unparse(expr) if expr is not None else ''}".rstrip(),
                required="every return is a constant tile or a conditional between constant tiles",
            )

    for node in ast.walk(fn):
        if isinstance(node, ast.Return):
            constants(node.value, node.lineno)
    if not tiles:
        raise _drift(
            version,
            f"{TARGET_FUNCTION} returns no tile",
            found="no return statement",
            required="return statements choosing tile 16 or 32",
        )
    unexpected = tiles - {CLAMPED_TILE, UNCLAMPED_TILE}
    if unexpected:
        raise _drift(
            version,
            f"{TARGET_FUNCTION} now chooses tiles the clamp was not written for",
            found=f"tiles {sorted(tiles)}",
            required=f"tiles among [{CLAMPED_TILE}, {UNCLAMPED_TILE}] (the clamp's shared-memory fit covers these)",
        )
    return tuple(sorted(tiles))


def _check_callers(tree: ast.Module, version: str) -> dict[str, int]:
    callers = _module_function(tree, CALLER_FUNCTION)
    if len(callers) != 1:
        raise _drift(
            version,
            f"the caller {CALLER_FUNCTION} moved",
            found=f"{len(callers)} module-level definitions of {CALLER_FUNCTION}",
            required=f"one module-level {CALLER_FUNCTION} computing TILE_SIZE_PREFILL and TILE_SIZE_DECODE",
        )
    caller = callers[0]
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and _called_name(n) == TARGET_FUNCTION]
    inside = {id(n) for n in ast.walk(caller)}
    outside = [n.lineno for n in calls if id(n) not in inside]
    found_assignments: dict[str, int] = {}
    for node in ast.walk(caller):
        if not (isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)):
            continue
        if _called_name(node.value) != TARGET_FUNCTION:
            continue
        targets = [t.id for t in node.targets if isinstance(t, ast.Name)]
        if len(targets) != 1 or len(node.targets) != 1 or targets[0] not in TILE_VARIABLES:
            raise _drift(
                version,
                f"a call of {TARGET_FUNCTION} assigns something other than the two tile variables (line {node.lineno})",
                found=ast.unparse(node),
                required="TILE_SIZE_PREFILL = _get_tile_size(...) and TILE_SIZE_DECODE = _get_tile_size(...)",
            )
        name = targets[0]
        flag = _is_prefill_argument(node.value)
        expected = TILE_VARIABLES[name]
        if not (isinstance(flag, ast.Constant) and flag.value is expected):
            raise _drift(
                version,
                f"{name} no longer passes is_prefill={expected} (line {node.lineno})",
                found=ast.unparse(node),
                required=f"{name} = {TARGET_FUNCTION}(..., is_prefill={expected})",
            )
        if name in found_assignments:
            raise _drift(
                version,
                f"{name} is computed by {TARGET_FUNCTION} more than once",
                found=f"lines {found_assignments[name]} and {node.lineno}",
                required="one call per tile",
            )
        found_assignments[name] = node.lineno
    missing = [v for v in TILE_VARIABLES if v not in found_assignments]
    if missing or outside or len(calls) != len(TILE_VARIABLES):
        raise _drift(
            version,
            f"the callers of {TARGET_FUNCTION} moved",
            found=f"calls at lines {sorted(n.lineno for n in calls)}; in {CALLER_FUNCTION}: "
            f"{found_assignments or 'none'}; elsewhere: {outside or 'none'}",
            required=f"exactly two calls, in {CALLER_FUNCTION}: TILE_SIZE_PREFILL (is_prefill=True) and "
            "TILE_SIZE_DECODE (is_prefill=False)",
        )
    _check_tile_flow(caller, version)
    return found_assignments


def _check_tile_flow(caller: ast.FunctionDef | ast.AsyncFunctionDef, version: str) -> None:
    """Both kernels must take their TILE_SIZE from the two clamped variables: the reduce kernel recomputes its
    segment split from the decode tile, so a tile from anywhere else would desynchronise the two."""
    tile_aliases = set(TILE_VARIABLES)
    for node in ast.walk(caller):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Name) and node.value.id in TILE_VARIABLES:
            tile_aliases.update(t.id for t in node.targets if isinstance(t, ast.Name))
    launches: dict[str, list[str]] = {MAIN_KERNEL: [], REDUCE_KERNEL: []}
    for node in ast.walk(caller):
        if not isinstance(node, ast.Call):
            continue
        kernel = _launched_kernel(node)
        if kernel not in launches:
            continue
        tile = next((k.value for k in node.keywords if k.arg == "TILE_SIZE"), None)
        launches[kernel].append(ast.unparse(tile) if tile is not None else "<none>")
    for kernel, tiles in launches.items():
        required = "TILE_SIZE_DECODE" if kernel == REDUCE_KERNEL else "a tile variable"
        ok = bool(tiles) and all(
            t == "TILE_SIZE_DECODE" if kernel == REDUCE_KERNEL else t in tile_aliases for t in tiles
        )
        if not ok:
            raise _drift(
                version,
                f"{CALLER_FUNCTION} no longer launches {kernel} with the tile from {TARGET_FUNCTION}",
                found=f"{kernel}[...](TILE_SIZE=...) launches: {tiles or 'none'}",
                required=f"{kernel}[grid](..., TILE_SIZE={required}) (tile variables: {sorted(tile_aliases)})",
            )


def locate(source: str, vllm_version: str, *, filename: str = TARGET_PATH) -> TileSite:
    """Check the shape of vLLM's tile selection and return where the clamp goes (or that it is in)."""
    try:
        tree = ast.parse(source, filename=filename)
    except SyntaxError as exc:
        raise _drift(
            vllm_version,
            f"{filename} does not parse",
            found=f"{exc.msg} at line {exc.lineno}",
            required="valid Python",
        ) from exc
    for kernel in (MAIN_KERNEL, REDUCE_KERNEL):
        if not _module_function(tree, kernel):
            raise _drift(
                vllm_version,
                f"the kernel {kernel} is gone from {filename}",
                found=f"no module-level def {kernel}",
                required=f"def {kernel} (the clamp's proof compiles it)",
            )
    targets = _module_function(tree, TARGET_FUNCTION)
    originals = _module_function(tree, UNCLAMPED_FUNCTION)
    marker = find_marked_clamp(source)
    if not targets:
        raise _drift(
            vllm_version,
            f"{TARGET_FUNCTION} is missing from {filename}",
            found=f"module-level functions: {sorted(n.name for n in tree.body if isinstance(n, ast.FunctionDef))}",
            required=f"def {TARGET_FUNCTION}({', '.join(EXPECTED_PARAMETERS)})",
        )
    if len(targets) > 1:
        raise _drift(
            vllm_version,
            f"{TARGET_FUNCTION} is defined {len(targets)} times",
            found=f"lines {[t.lineno for t in targets]}",
            required="one definition",
        )
    if originals or marker is not None:
        return _patched_site(tree, targets[0], originals, marker, vllm_version, filename)
    target = targets[0]
    _check_signature(target, vllm_version)
    _check_not_clamped_upstream(target, vllm_version)
    tiles = _returned_tiles(target, vllm_version)
    callers = _check_callers(tree, vllm_version)
    assert target.end_lineno is not None
    return TileSite(vllm_version, target.lineno, target.end_lineno, callers, tiles, "unpatched")


def _patched_site(
    tree: ast.Module,
    target: ast.FunctionDef | ast.AsyncFunctionDef,
    originals: list[ast.FunctionDef | ast.AsyncFunctionDef],
    marker: MarkedClamp | None,
    version: str,
    filename: str,
) -> TileSite:
    """The file already carries a clamp: accept it only if it is this t4serve's clamp, intact, on vLLM's shape."""
    fix = FIX_REINSTALL.format(version=version) + ", then run `t4serve patch apply` again"
    if marker is None or len(originals) != 1:
        raise PatchError(
            f"{filename} of vLLM {version} is half patched",
            found=f"{len(originals)} definition(s) of {UNCLAMPED_FUNCTION}; clamp marker "
            f"{'present' if marker else 'missing'}",
            required=f"either vLLM's pristine file or one {UNCLAMPED_FUNCTION} inside t4serve's marked clamp",
            fix=fix,
        )
    if not marker.intact:
        raise PatchError(
            f"the Turing clamp in {filename} of vLLM {version} was edited after it was applied",
            found=f"marker states sha256 {marker.stated_sha256}, text between the markers hashes to "
            f"{marker.actual_sha256 or '(no end marker)'}",
            required="the clamp text exactly as t4serve wrote it",
            fix=fix,
        )
    if marker.stated_sha256 != clamp_sha256():
        raise PatchError(
            f"{filename} of vLLM {version} carries a different Turing clamp (another t4serve version applied it)",
            found=f"clamp sha256 {marker.stated_sha256}",
            required=f"clamp sha256 {clamp_sha256()} (this t4serve)",
            fix=fix,
        )
    original = originals[0]
    _check_signature(original, version)
    tiles = _returned_tiles(original, version)
    callers = _check_callers(tree, version)
    if not marker.begin_line <= target.lineno <= marker.end_line:
        raise PatchError(
            f"{filename} of vLLM {version} defines {TARGET_FUNCTION} outside t4serve's clamp",
            found=f"{TARGET_FUNCTION} at line {target.lineno}, clamp at lines {marker.begin_line}-{marker.end_line}",
            required=f"{TARGET_FUNCTION} defined by the clamp",
            fix=fix,
        )
    assert original.end_lineno is not None
    return TileSite(version, original.lineno, original.end_lineno, callers, tiles, "patched", marker)
