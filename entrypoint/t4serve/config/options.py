"""The click glue of the settings table: one option per row on the commands that take settings, and the number types
of every other option.

`@settings_options` adds the options (`--port`, each showing its environment variable in --help) and passes the
parsed `settings=` to the command; a flag overrides its variable and both go through the same parser. `IntText` and
`FloatText` are the click types of the other numeric options (`bench --repeats`, `roofline --context`, ...): the
same parsers as the settings (t4serve.untrusted: ASCII decimal only), where click's own INT and FLOAT would take
`1_0` as 10 and other scripts' digits as numbers.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import Any, TypeVar

import click

from t4serve.config.settings import VARIABLES, Settings
from t4serve.config.variables import Variable, file_path
from t4serve.untrusted import Untrusted, parse_float, parse_int

F = TypeVar("F", bound=Callable[..., Any])


def settings_options(func: F) -> F:
    """Add one click option per table row (`envvar=` shown in --help) and pass the parsed `settings=` to `func`.

    Values given on the command line override the environment; the environment itself is read by
    `Settings.from_environ`, so a flag and its variable are validated by the same parser.
    """

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        ctx = click.get_current_context()
        overrides: dict[str, str] = {}
        for var in VARIABLES:
            if var.option is None:
                continue
            value = kwargs.pop(var.param, None)
            if value is not None and ctx.get_parameter_source(var.param) is click.core.ParameterSource.COMMANDLINE:
                overrides[var.name] = value
        return func(*args, settings=Settings.from_environ(os.environ, overrides=overrides), **kwargs)

    decorated: Any = wrapper
    for var in reversed(VARIABLES):
        if var.option is None:
            continue
        decorated = click.option(
            var.option,
            var.param,
            envvar=var.name,
            show_envvar=True,
            default=None,
            metavar=_metavar(var),
            help=f"{var.doc} [default: {var.default_doc}]",
        )(decorated)
    return decorated  # type: ignore[no-any-return]


def _metavar(var: Variable) -> str:
    return {"model": "MODEL", "vllm_args": "FLAGS", "dtype": "DTYPE", "host": "ADDR", "telemetry_host": "ADDR"}.get(
        var.field, "PATH" if var.parse is file_path else "VALUE"
    )


class IntText(click.ParamType[int]):
    """An integer option in [lo, hi], parsed by t4serve.untrusted.parse_int (a bad value is click's usage error, 2)."""

    name = "integer"

    def __init__(self, lo: int, hi: int) -> None:
        self.lo, self.hi = lo, hi

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int) and not isinstance(value, bool) and self.lo <= value <= self.hi:
            return value  # a default given as a number
        try:
            return parse_int(str(value), self.lo, self.hi)
        except Untrusted as exc:
            self.fail(f"{str(value)[:40]!r} {exc.reason}", param, ctx)


class FloatText(click.ParamType[float]):
    """A finite decimal option in [lo, hi] (`lo_open`: above lo), parsed by t4serve.untrusted.parse_float."""

    name = "number"

    def __init__(self, lo: float, hi: float, *, lo_open: bool = False) -> None:
        self.lo, self.hi, self.lo_open = lo, hi, lo_open

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> float:
        if isinstance(value, float | int) and not isinstance(value, bool):
            value = repr(float(value))
        try:
            return parse_float(str(value), self.lo, self.hi, lo_open=self.lo_open)
        except Untrusted as exc:
            self.fail(f"{str(value)[:40]!r} {exc.reason}", param, ctx)
