"""docker/lazyimports.py, docker/slim.py's reading of vLLM's warm-up: which imports inside a function's body run on a
platform, decided by the platform's own answers and find_spec, everything undecidable taken. The build runs it over
vLLM 0.34.0's kernel_warmup on the T4 stand-in (its record: tests/image/test_slim.py); here it reads a function
written for it."""

from __future__ import annotations

import ast
import importlib.util
import sys
from pathlib import Path

import pytest

LAZY = Path(__file__).resolve().parents[2] / "docker" / "lazyimports.py"
spec = importlib.util.spec_from_file_location("t4serve_docker_lazyimports", LAZY)
assert spec and spec.loader
slim = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = slim
spec.loader.exec_module(slim)

SOURCE = '''
def warm(worker):
    from pkg.always import a
    if current_platform.is_rocm():
        from pkg.rocm import b
    elif current_platform.has_device_capability(90):
        import pkg.hopper
    else:
        import pkg.older
    from importlib.util import find_spec

    if current_platform.is_cuda() and find_spec("no_such_module_t4serve") is not None:
        from pkg.needs_missing import c
    if current_platform.is_cuda() and find_spec("json") is not None:
        from pkg.needs_json import d
    if worker.config.flag:
        from pkg.flagged import e
    else:
        from pkg.unflagged import f
    if not current_platform.is_cuda() or worker.other:
        from pkg.maybe import g
    try:
        from pkg.tried import h
    except ImportError:
        from pkg.fallback import i
    for _ in range(2):
        with worker.ctx():
            from pkg.looped import j

    def inner():
        from pkg.inner import k

    from . import relative


def other():
    from pkg.other import z
'''


class Platform:
    def is_rocm(self) -> bool:
        return False

    def is_cuda(self) -> bool:
        return True

    def has_device_capability(self, capability: int) -> bool:
        return capability <= 75


def read(function: str = "warm") -> tuple[list[str], list[dict[str, str]]]:
    taken, skipped = slim.lazy_imports(SOURCE, function, lambda e: slim.decide_on_platform(Platform(), e))
    return taken, skipped


def test_imports_are_taken_as_the_platform_decides_and_undecided_ones_counted() -> None:
    taken, skipped = read()
    assert taken == ["pkg.always", "pkg.older", "importlib.util", "pkg.needs_json", "pkg.flagged", "pkg.unflagged",
                     "pkg.maybe", "pkg.tried", "pkg.fallback", "pkg.looped"]
    assert skipped == [
        {"module": "pkg.rocm", "condition": "current_platform.is_rocm() is False"},
        {"module": "pkg.hopper", "condition": "current_platform.has_device_capability(90) is False"},
        {"module": "pkg.needs_missing",
         "condition": "current_platform.is_cuda() and find_spec('no_such_module_t4serve') is not None is False"},
    ]
    assert read("other") == (["pkg.other"], [])


def test_decisions() -> None:
    def decide(text: str) -> bool | None:
        return slim.decide_on_platform(Platform(), ast.parse(text, mode="eval").body)

    assert decide("current_platform.is_cuda()") is True
    assert decide("not current_platform.is_cuda()") is False
    assert decide("current_platform.has_device_capability(90) or x") is None
    assert decide("current_platform.is_rocm() or current_platform.is_cuda()") is True
    assert decide("x and current_platform.is_rocm()") is False
    assert decide("find_spec('json') is None") is False
    assert decide("importlib.util.find_spec('no_such_module_t4serve') is None") is True
    assert decide("current_platform.no_such_method()") is None
    assert decide("current_platform.has_device_capability(cap)") is None


def test_a_missing_function_is_an_error() -> None:
    with pytest.raises(LookupError, match="no function absent"):
        slim.lazy_imports(SOURCE, "absent", lambda e: None)


def test_functions_and_methods_are_read_by_qualified_name() -> None:
    source = SOURCE + '''
class Runner:
    def step(self):
        if current_platform.is_rocm():
            import pkg.rocm_step
        from pkg.step import s

    async def later(self):
        import pkg.later
'''
    decide = lambda e: slim.decide_on_platform(Platform(), e)  # noqa: E731
    assert [name for name, _, _ in slim.module_imports(source, decide)] == ["warm", "other", "Runner.step",
                                                                            "Runner.later"]
    assert slim.lazy_imports(source, "Runner.step", decide) == (
        ["pkg.step"], [{"module": "pkg.rocm_step", "condition": "current_platform.is_rocm() is False"}])
    assert slim.lazy_imports(source, "Runner.later", decide) == (["pkg.later"], [])
    with pytest.raises(LookupError):
        slim.lazy_imports(source, "Absent.step", decide)


def test_module_imports_reads_every_function_as_lazy_imports_does() -> None:
    decide = lambda e: slim.decide_on_platform(Platform(), e)  # noqa: E731
    whole = slim.module_imports(SOURCE, decide)
    assert [name for name, _, _ in whole] == ["warm", "other"]
    assert whole == [(name, *slim.lazy_imports(SOURCE, name, decide)) for name, _, _ in whole]
    # A name defined twice (a property's getter and setter) is read twice; lazy_imports takes the first.
    twice = ("class C:\n    @property\n    def x(self):\n        import a\n"
             "    @x.setter\n    def x(self, v):\n        import b\n")
    assert slim.module_imports(twice, decide) == [("C.x", ["a"], []), ("C.x", ["b"], [])]
    assert slim.lazy_imports(twice, "C.x", decide) == (["a"], [])
