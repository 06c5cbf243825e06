"""The `t4serve` command line: a click group whose subcommands live one per module in `t4serve.commands`.

Subcommands are discovered by module name and imported only when run, so `t4serve healthcheck` never pays for the
imports of `t4serve bench`. Each module exposes `command` (a click command or group). `main()` maps t4serve's
error classes to their fixed exit codes and prints the found/required/fix message without a traceback.
"""

from __future__ import annotations

import importlib
import pkgutil
import sys
import traceback
from collections.abc import Sequence
from typing import Any

import click

from t4serve import __version__
from t4serve.errors import T4ServeError

COMMANDS_PACKAGE = "t4serve.commands"


def _command_modules() -> dict[str, str]:
    package = importlib.import_module(COMMANDS_PACKAGE)
    return {
        info.name.replace("_", "-"): f"{COMMANDS_PACKAGE}.{info.name}"
        for info in pkgutil.iter_modules(package.__path__)
        if not info.name.startswith("_")
    }


class LazyGroup(click.Group):
    """A group that imports a subcommand's module only when that subcommand is used or listed in help."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(_command_modules())

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        module_name = _command_modules().get(cmd_name)
        if module_name is None:
            return None
        command = importlib.import_module(module_name).command
        if not isinstance(command, click.Command):
            raise TypeError(f"{module_name}.command is not a click command")
        return command


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 120})
@click.version_option(__version__, prog_name="t4serve")
def cli() -> None:
    """Serve Gemma 4 E2B with vLLM on a Tesla T4 (or any Turing-or-newer NVIDIA GPU).

    Every option is also an environment variable; `t4serve plan` shows each beside its default.
    """


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        result: Any = cli.main(args=args, prog_name="t4serve", standalone_mode=False)
    except T4ServeError as exc:
        click.echo(f"t4serve: {exc.message()}", err=True)
        return exc.exit_code
    except click.exceptions.Abort:
        click.echo("t4serve: aborted", err=True)
        return 130
    except click.ClickException as exc:
        exc.show()
        return exc.exit_code
    except click.exceptions.Exit as exc:
        return int(exc.exit_code)
    except Exception:  # a bug: say so, keep the traceback, use the internal-error code
        click.echo("t4serve: internal error (a bug in t4serve; please report it with this trace):", err=True)
        traceback.print_exc()
        return 70
    return result if isinstance(result, int) else 0


if __name__ == "__main__":
    raise SystemExit(main())
