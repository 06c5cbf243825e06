"""Which imports inside a function's body run on a platform: docker/slim.py's proof reads vLLM's warm-up and engine
functions with it (their `import` statements sit in bodies, so importing their modules never executes them).

Pure: the standard library's ast and importlib.util only, imported where used so that slim.py's record of the
interpreter's start-up modules does not grow. tests/unit/test_slim_warmup.py reads functions written for it.
"""

from __future__ import annotations

import importlib.util
from typing import Any


def _functions(tree: Any) -> list[tuple[str, Any]]:
    """(qualified name, node) of every top-level function and every method of a top-level class in a parsed module."""
    import ast

    out = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            out.append((node.name, node))
        elif isinstance(node, ast.ClassDef):
            out += [(f"{node.name}.{m.name}", m) for m in node.body
                    if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef))]
    return out


def lazy_imports(source: str, function: str, decide: Any) -> tuple[list[str], list[dict[str, str]]]:
    """The modules `function` (`name` or `Class.method`) in `source` imports inside its body on this platform, and the
    imports it skips.

    Each `if` test is decided by `decide(expr)` (True, False, or None where it cannot say): a body whose test is False
    is skipped, an `else` whose test is True is skipped, everything else counts (an undecided test is taken, so an
    import the proof cannot rule out is imported). Nested functions and classes are left out (they run elsewhere).
    Pure: tests/unit/test_slim_warmup.py."""
    import ast

    node = next((n for name, n in _functions(ast.parse(source)) if name == function), None)  # the first of that name
    if node is None:
        raise LookupError(f"no function {function}")
    return _body_imports(node, decide)


def module_imports(source: str, decide: Any) -> list[tuple[str, list[str], list[dict[str, str]]]]:
    """(name, taken, skipped) of every top-level function and every method of a top-level class in `source` (named
    `name` or `Class.method`), in source order, the source parsed once; a name defined twice (a property's getter and
    setter, say) has each definition read."""
    import ast

    return [(name, *_body_imports(node, decide)) for name, node in _functions(ast.parse(source))]


def _body_imports(function: Any, decide: Any) -> tuple[list[str], list[dict[str, str]]]:
    import ast

    taken: list[str] = []
    skipped: list[dict[str, str]] = []

    def names(node: ast.stmt) -> list[str]:
        if isinstance(node, ast.ImportFrom):
            return [node.module or ""] if node.level == 0 else []
        if isinstance(node, ast.Import):
            return [a.name for a in node.names]
        return []

    def walk(statements: list[ast.stmt], skipping: str | None) -> None:
        for node in statements:
            for name in names(node):
                if skipping is None:
                    taken.append(name)
                else:
                    skipped.append({"module": name, "condition": skipping})
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                continue
            if isinstance(node, ast.If):
                verdict = decide(node.test)
                condition = ast.unparse(node.test)
                walk(node.body, skipping or (f"{condition} is False" if verdict is False else None))
                walk(node.orelse, skipping or (f"{condition} is True" if verdict is True else None))
                continue
            for field in ("body", "orelse", "finalbody"):
                walk(getattr(node, field, []) or [], skipping)
            for handler in getattr(node, "handlers", []) or []:
                walk(handler.body, skipping)

    walk(function.body, None)
    return taken, skipped


def decide_on_platform(platform: Any, expr: Any) -> bool | None:
    """An `if` test decided where it depends only on the platform's answers (`current_platform.is_cuda()`,
    `has_device_capability(90)`, ...), on find_spec of a literal module name and on `and`/`or`/`not` of those;
    None for anything else (the worker's configuration, environment switches)."""
    import ast

    if isinstance(expr, ast.BoolOp):
        verdicts = [decide_on_platform(platform, v) for v in expr.values]
        if isinstance(expr.op, ast.And):
            return False if False in verdicts else (True if all(v is True for v in verdicts) else None)
        return True if True in verdicts else (False if all(v is False for v in verdicts) else None)
    if isinstance(expr, ast.UnaryOp) and isinstance(expr.op, ast.Not):
        inner = decide_on_platform(platform, expr.operand)
        return None if inner is None else not inner
    if (isinstance(expr, ast.Compare) and len(expr.ops) == 1 and isinstance(expr.ops[0], (ast.Is, ast.IsNot))
            and isinstance(expr.comparators[0], ast.Constant) and expr.comparators[0].value is None
            and isinstance(expr.left, ast.Call)):
        call = expr.left
        name = call.func.attr if isinstance(call.func, ast.Attribute) else getattr(call.func, "id", "")
        if name == "find_spec" and len(call.args) == 1 and isinstance(call.args[0], ast.Constant):
            found = importlib.util.find_spec(str(call.args[0].value)) is not None
            return found if isinstance(expr.ops[0], ast.IsNot) else not found
        return None
    if (isinstance(expr, ast.Call) and isinstance(expr.func, ast.Attribute)
            and isinstance(expr.func.value, ast.Name) and expr.func.value.id == "current_platform"
            and all(isinstance(a, ast.Constant) for a in expr.args) and not expr.keywords):
        method = getattr(platform, expr.func.attr, None)
        if callable(method):
            return bool(method(*(a.value for a in expr.args)))
    return None
