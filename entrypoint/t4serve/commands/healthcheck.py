"""`t4serve healthcheck`: exit 0 only when the server is ready and answers; 1 otherwise, one line on stderr why.
`--liveness` asks a narrower question for Kubernetes' livenessProbe: should this container be restarted? A server
that was ready and no longer answers /health (hung, or its engine dead) says yes, and so does a vLLM attempt that has
been loading for longer than the cold-start budget (a reload that hangs: download, load and compile all done within
it on a cold cache); a loading one within its budget never does.

Reads the state file the vLLM wrapper keeps (phase, canary) and probes /health and /v1/models; /v1/models carries the
API key (T4SERVE_API_KEY / T4SERVE_API_KEY_FILE, else VLLM_API_KEY) when one is set. `--timeout` is a wall-clock
deadline over the whole check, whatever the server does (t4serve.httpclient). During a long load it prints the phase,
how long it has lasted and the estimate to ready. It imports neither torch nor vLLM, and never exits with anything but
0 or 1 (Docker reserves other codes): a bad option, state file or key setting is "unhealthy" with its reason.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import click

from t4serve.config.secrets import client_api_key
from t4serve.errors import ConfigError
from t4serve.supervise.health import DEADLINE_S, check, check_liveness
from t4serve.supervise.readout import default_state_dir, state_dir_option
from t4serve.untrusted import Untrusted, parse_float

MAX_DEADLINE_S = 600.0


class _ZeroOrOneCommand(click.Command):
    """A command whose usage errors (a bad --timeout, an unknown option) are an "unhealthy" exit 1 with the reason,
    not click's exit 2: Docker reads a healthcheck's exit code as 0 healthy, 1 unhealthy, and reserves the rest."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        try:
            return super().parse_args(ctx, args)
        except click.UsageError as exc:
            ctx.meta["t4serve_usage_error"] = exc.format_message()
            ctx.params = {"state_dir": None, "timeout": str(DEADLINE_S), "liveness": False}
            return []

    def invoke(self, ctx: click.Context) -> Any:
        problem = ctx.meta.get("t4serve_usage_error")
        if problem is not None:
            print(f"t4serve healthcheck: unhealthy: {problem}", file=sys.stderr, flush=True)
            return 1
        return super().invoke(ctx)


@click.command("healthcheck", cls=_ZeroOrOneCommand)
@state_dir_option
@click.option(
    "--timeout",
    default=str(DEADLINE_S),
    show_default=True,
    help="Seconds the whole check may take (a wall-clock deadline), from 0.1 to 600.",
)
@click.option(
    "--liveness",
    is_flag=True,
    help="Answer whether the container should be restarted (Kubernetes livenessProbe): 1 only when a ready server "
    "stopped answering /health, or a vLLM attempt has been loading for longer than the cold-start budget; a loading "
    "one within it is alive.",
)
def command(state_dir: Path | None, timeout: str, liveness: bool) -> int:
    """Exit 0 when the server is ready and answers, 1 otherwise (for Docker's HEALTHCHECK)."""
    folder = state_dir or default_state_dir()
    try:
        deadline = parse_float(timeout, 0.1, MAX_DEADLINE_S)
        # Else the VLLM_API_KEY a user gave vLLM directly. Liveness sends no key (/health is open).
        api_key = None if liveness else client_api_key(os.environ, "VLLM_API_KEY")
    except Untrusted as exc:
        code, line = 1, f"unhealthy: --timeout {timeout[:40]!r} {exc.reason}"
    except ConfigError as exc:
        # Docker reads only 0 and 1 from a healthcheck: an unusable key setting is "unhealthy", with its reason.
        code, line = 1, f"cannot read the API key: {exc.message()}"
    else:
        code, line = check_liveness(folder, deadline) if liveness else check(folder, deadline, api_key=api_key)
    print(f"t4serve healthcheck: {line}", file=sys.stdout if code == 0 else sys.stderr, flush=True)
    return code
