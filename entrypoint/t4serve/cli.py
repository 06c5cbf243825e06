"""The `t4serve` command line: a click group whose subcommands live one per module in `t4serve.commands`.

The subcommands are listed here, in COMMANDS (shown by `t4serve --help`) and INTERNAL_COMMANDS (the programs the image
and supervisord run themselves: they work, `--help` included, but the command list leaves them out). A module is
imported only when its command runs or is listed in help, so `t4serve healthcheck` never pays for the imports of
`t4serve bench`. Each module exposes `command` (a click command or group). `main()` maps t4serve's error classes to
their fixed exit codes and prints the found/required/fix message without a traceback.

The entrypoint rule: the image's ENTRYPOINT is `t4serve`, so `docker run IMAGE ARG...` runs `t4serve ARG...`. A first
argument that is neither a t4serve command nor an option (`-...`) is a program: `main()` execs it with the remaining
arguments, so `docker run IMAGE echo hi` prints hi and `docker run -it IMAGE bash` gives a shell (the docker-library
convention, checked by its `override-cmd` test). A name that is neither a command, nor a program on PATH, nor a model
(below) is a usage error, exit 2.

The model rule: a first argument that is no command and no program but a model T4SERVE_MODEL would take (`qat`,
`org/name`, a directory holding config.json) is `t4serve serve MODEL ...`, so `docker run IMAGE google/gemma-4-E2B-it`
serves it as `vllm serve MODEL` and vLLM's image would; anything else that is none of the three says what each needs.

The server-flags rule: an argument list that starts with an option other than the group's own (`--help`, `-h`,
`--version`) is `t4serve serve` with those options, so `docker run IMAGE --max-model-len 4096` works as it does with
vLLM's and TGI's images (t4serve's serve options carry vLLM's flag names). An option `serve` does not know is a usage
error that says where vLLM's other flags go (`--vllm-args`), or why t4serve refuses that flag.

A configuration error of `serve` (exit 2) under T4SERVE_ON_CONFIG_ERROR=wait (compose.yaml sets it) prints the
error, leaves it in the state folder for `healthcheck` and `status`, and waits for a stop signal before exiting 2:
Docker's `restart: unless-stopped` restarts any exit, so exiting would rerun a setting that cannot work forever.
"""

from __future__ import annotations

import contextlib
import difflib
import importlib
import os
import shutil
import signal
import sys
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import click

from t4serve import __version__
from t4serve.errors import ConfigError, T4ServeError

COMMANDS_PACKAGE = "t4serve.commands"

# Command name -> module under t4serve.commands. A new command module is added here (a unit test checks that every
# module of the package is listed once).
COMMANDS: dict[str, str] = {
    "attention": "attention",
    "bench": "bench",
    "env": "env",
    "healthcheck": "healthcheck",
    "host-check": "host_check",
    "mcp": "mcp",
    "patch": "patch",
    "plan": "plan",
    "preflight": "preflight",
    "probe": "probe",
    "profiles": "profiles",
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


# The group's own options; any other option first means `serve` (the server-flags rule above).
GROUP_OPTIONS = ("-h", "--help", "--version")
# Commands run without the check of T4SERVE_* names: the healthcheck answers Docker, which reads only 0 and 1, and runs
# in a container whose `serve` made that check already.
UNCHECKED_COMMANDS = ("healthcheck",)


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


def model_problem(arg: str) -> str | None:
    """Why `arg` is no model `serve` can take (T4SERVE_MODEL's own parser: an alias, an HF repo id, a directory
    holding config.json), or None when it is one."""
    from t4serve.config.settings import VARIABLES_BY_NAME
    from t4serve.config.variables import Context, Invalid

    try:
        VARIABLES_BY_NAME["T4SERVE_MODEL"].parse(arg, Context(dict(os.environ), Path.cwd()))
    except Invalid as exc:
        return exc.reason
    return None


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
            found=f"{name!r} is neither a t4serve command, nor a program on PATH, nor a model: it "
            f"{model_problem(name)}",
            required=f"a t4serve command ({commands}), a program to run, or a model (`serve --model MODEL`)",
            fix="`t4serve --help` lists the commands; give a program by its path or put it on PATH; a model: "
            "`--model MODEL` (after the image name: `docker run ... IMAGE --model google/gemma-4-E2B-it`)",
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


def unknown_serve_option(exc: click.NoSuchOption, args: Sequence[str]) -> ConfigError:
    """The usage error for an option `t4serve serve` does not know: a flag t4serve refuses says why, anything else
    where vLLM's other flags go (--vllm-args). Never quotes a value (`--hf-token=...` shows as `--hf-token`)."""
    # Here, not at the top: the healthcheck, which runs every 30 s, never pays for it.
    from t4serve.config.vllmflags import CONTROLLED_FLAGS, canonical_flag, names_flag, vllm_flag_refusal

    option = exc.option_name
    close = f" (did you mean {' or '.join(sorted(exc.possibilities))}?)" if exc.possibilities else ""
    # click names a short option by its first letter (-t of -tp 2); the argument as given says which flag it was.
    token = next((a for a in args if a.startswith(option)), option).split("=", 1)[0]
    # A shortened serve option (--max-model-le) is a typo of t4serve's own, not a refused vLLM flag.
    own = [o for param in exc.ctx.command.params for o in param.opts] if exc.ctx is not None else []
    typo = any(names_flag(canonical_flag(token), o) for o in own if o in CONTROLLED_FLAGS)
    refusal = None if typo else vllm_flag_refusal(token)
    if refusal is not None:
        return ConfigError(
            f"t4serve serve has no option {token}{close}",
            found=f"{token}, a `vllm serve` flag t4serve refuses: {refusal}",
            required="t4serve serve's options (`t4serve serve --help`)",
            fix="leave the flag out (its reason is above); `t4serve serve --help` lists what can be set",
        )
    return ConfigError(
        f"t4serve serve has no option {option}{close}",
        found=f"{option} among the arguments of `t4serve serve` (arguments after the image name that start with an "
        "option are serve's)",
        required="t4serve serve's options (`t4serve serve --help`); vLLM's other flags go in --vllm-args",
        fix=f"if {option} is a `vllm serve` flag: --vllm-args '{option} ...' (or the variable T4SERVE_VLLM_ARGS); "
        "`t4serve serve --help` lists serve's own options",
    )


def check_variable_names(args: Sequence[str]) -> None:
    """Refuse a T4SERVE_* variable t4serve does not know (a typo would otherwise be ignored), for every command but
    those in UNCHECKED_COMMANDS and the internal ones, and not while only help is asked for."""
    if not args or args[0] not in COMMANDS or args[0] in UNCHECKED_COMMANDS or "-h" in args or "--help" in args:
        return
    from t4serve.config.names import unknown_variables

    problem = unknown_variables(os.environ)
    if problem is not None:
        raise problem


def config_error_waits(args: Sequence[str], environ: dict[str, str]) -> bool:
    """`serve`'s T4SERVE_ON_CONFIG_ERROR (its flag first) says `wait`; a value that does not parse means `exit` (its
    own error is among those printed)."""
    from t4serve.config.settings import VARIABLES_BY_NAME
    from t4serve.config.variables import Context, Invalid

    var = VARIABLES_BY_NAME["T4SERVE_ON_CONFIG_ERROR"]
    raw = environ.get(var.name, "")
    for i, arg in enumerate(args):
        if arg == var.option and i + 1 < len(args):
            raw = args[i + 1]
        elif var.option is not None and arg.startswith(var.option + "="):
            raw = arg.split("=", 1)[1]
    try:
        return bool(raw) and var.parse(raw, Context(environ, Path("/"))) == "wait"
    except Invalid:
        return False


STOP_SIGNALS = {signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT}


def wait_after_config_error(error: ConfigError) -> None:
    """Leave `error` in the state folder for healthcheck and status (the phase config_error), say why this process
    does not exit, and return when a stop signal arrives (`docker stop`, compose down, Ctrl-C)."""
    import time

    from t4serve.supervise.readout import RECREATE_AFTER_FIX, default_state_dir
    from t4serve.supervise.state import ConfigErrorRecord, write_config_error

    # Blocked first, so a stop signal sent while the file is written waits for sigwait instead of being lost.
    signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    record = ConfigErrorRecord(error.what, error.found, error.required, error.fix, time.time())
    with contextlib.suppress(OSError):  # a state folder that cannot be written only loses the healthcheck's line
        write_config_error(default_state_dir(), record)
    click.echo(
        "t4serve: T4SERVE_ON_CONFIG_ERROR=wait: waiting for a stop signal instead of exiting, so a restart policy "
        f"does not rerun a setting that cannot work; {RECREATE_AFTER_FIX}",
        err=True,
    )
    signal.sigwait(STOP_SIGNALS)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        if args and args[0].startswith("-") and args[0] not in GROUP_OPTIONS:
            args = ["serve", *args]
        elif args and not args[0].startswith("-") and not is_command(args[0]):
            if shutil.which(args[0]) is None and model_problem(args[0]) is None:
                args = ["serve", *args]  # the model rule: `docker run IMAGE MODEL [FLAGS]`, as vLLM's image takes it
            else:
                exec_program(args)
        check_variable_names(args)
        result: Any = cli.main(args=args, prog_name="t4serve", standalone_mode=False)
    except T4ServeError as exc:
        return _failed(exc, args)
    except click.exceptions.Abort:
        click.echo("t4serve: aborted", err=True)
        return 130
    except click.NoSuchOption as exc:
        if args[:1] != ["serve"] or exc.ctx is None or exc.ctx.info_name != "serve":
            exc.show()
            return exc.exit_code
        return _failed(unknown_serve_option(exc, args), args)
    except click.ClickException as exc:
        exc.show()
        if args[:1] == ["serve"] and exc.exit_code == ConfigError.exit_code:
            return _failed(ConfigError(exc.format_message()), args, shown=True)
        return exc.exit_code
    except click.exceptions.Exit as exc:
        return int(exc.exit_code)
    except Exception:  # a bug: say so, keep the traceback, use the internal-error code
        click.echo("t4serve: internal error (a bug in t4serve; please report it with this trace):", err=True)
        traceback.print_exc()
        return 70
    return result if isinstance(result, int) else 0


def _failed(error: T4ServeError, args: Sequence[str], shown: bool = False) -> int:
    """Print a failure (unless click has), then exit with its code; `serve`'s configuration error waits first when
    T4SERVE_ON_CONFIG_ERROR=wait."""
    if not shown:
        click.echo(f"t4serve: {error.message()}", err=True)
    if isinstance(error, ConfigError) and args[:1] == ["serve"] and config_error_waits(args, dict(os.environ)):
        wait_after_config_error(error)
    return error.exit_code


if __name__ == "__main__":
    raise SystemExit(main())
