"""The click glue of the settings table: one option per row on the commands that take settings.

`@settings_options` adds the options (`--port`, each showing its environment variable in --help) and passes the
parsed `settings=` to the command; a flag overrides its variable and both go through the same parser.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import Any, TypeVar

import click

from t4serve.settings import VARIABLES, Settings
from t4serve.variables import Variable, file_path

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
