"""The `t4serve` command line: a click group whose subcommands live one per module in `t4serve.commands`.

The subcommands are listed here, in COMMANDS (shown by `t4serve --help`) and INTERNAL_COMMANDS (the programs the image
and supervisord run themselves: they work, `--help` included, but the command list leaves them out). A module is
imported only when its command runs or is listed in help, so `t4serve healthcheck` never pays for the imports of
`t4serve bench`. Each module exposes `command` (a click command or group). `main()` maps t4serve's error classes to
their fixed exit codes and prints the found/required/fix message without a traceback.

The entrypoint rule: the image's ENTRYPOINT is `t4serve`, so `docker run IMAGE ARG...` runs `t4serve ARG...`. A first
argument that is neither a t4serve command nor an option (`-...`) is a program: `main()` execs it with the remaining
arguments, so `docker run IMAGE echo hi` prints hi and `docker run -it IMAGE bash` gives a shell (the docker-library
convention, checked by its `override-cmd` test). A name that is neither a command nor a program on PATH is the usage
error click gave before, exit 2.
"""

from __future__ import annotations

import difflib
import importlib
import os
import shutil
import sys
import traceback
from collections.abc import Sequence
from typing import Any

import click

from t4serve import __version__
from t4serve.errors import ConfigError, T4ServeError

COMMANDS_PACKAGE = "t4serve.commands"

# Command name -> module under t4serve.commands. A new command module is added here (a unit test checks that every
# module of the package is listed once).
COMMANDS: dict[str, str] = {
    "bench": "bench",
    "env": "env",
    "healthcheck": "healthcheck",
    "host-check": "host_check",
    "mcp": "mcp",
    "patch": "patch",
    "plan": "plan",
    "preflight": "preflight",
    "probe": "probe",
    "roofline": "roofline",
    "serve": "serve",
    "status": "status",
}
# Run by the image's build (build-manifest) or by supervisord under `serve` (run-vllm, listener, telemetry).
INTERNAL_COMMANDS: dict[str, str] = {
    "build-manifest": "build_manifest",
    "listener": "listener",
    "run-vllm": "run_vllm",
    "telemetry": "telemetry",
}


def is_command(name: str) -> bool:
    """`name` is a t4serve subcommand, shown in help or internal."""
    return name in COMMANDS or name in INTERNAL_COMMANDS


class LazyGroup(click.Group):
    """A group that imports a subcommand's module only when that subcommand is used or listed in help."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        module = COMMANDS.get(cmd_name) or INTERNAL_COMMANDS.get(cmd_name)
        if module is None:
            return None
        module_name = f"{COMMANDS_PACKAGE}.{module}"
        command = importlib.import_module(module_name).command
        if not isinstance(command, click.Command):
            raise TypeError(f"{module_name}.command is not a click command")
        return command


@click.group(
    cls=LazyGroup,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 120},
    epilog="Internal commands, run by the image and its supervisor: " + ", ".join(sorted(INTERNAL_COMMANDS)) + ". "
    "In the image, `docker run IMAGE PROGRAM ARGS...` runs a program that is not a t4serve command (e.g. bash).",
)
@click.version_option(__version__, prog_name="t4serve")
def cli() -> None:
    """Serve Gemma 4 E2B with vLLM on a Tesla T4 (or any Turing-or-newer NVIDIA GPU).

    Every option is also an environment variable; `t4serve plan` shows each beside its default.
    """


def exec_program(args: Sequence[str]) -> None:
    """Replace this process with the program `args[0]` names (the entrypoint rule); returns only by raising.

    A ConfigError (exit 2) when it is not on PATH or cannot be executed, naming the t4serve commands that were meant.
    """
    name = args[0]
    path = shutil.which(name)
    commands = ", ".join(sorted(COMMANDS))
    if path is None:
        close = difflib.get_close_matches(name, [*COMMANDS, *INTERNAL_COMMANDS], n=1)
        hint = f" (did you mean `t4serve {close[0]}`?)" if close else ""
        raise ConfigError(
            f"No such command {name!r}{hint}",
            found=f"{name!r} is neither a t4serve command nor a program on PATH",
            required=f"a t4serve command ({commands}) or a program to run",
            fix="`t4serve --help` lists the commands; give a program by its path or put it on PATH",
        )
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execv(path, list(args))
    except OSError as exc:
        raise ConfigError(
            f"cannot run {name!r}",
            found=f"{path}: {exc.strerror or exc}",
            required="an executable program (or a t4serve command)",
            fix=f"check that {path} is executable by uid {os.getuid()} (`ls -l {path}`)",
        ) from None


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        if args and not args[0].startswith("-") and not is_command(args[0]):
            exec_program(args)
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
