"""`t4serve listener`: supervisord's event listener that ends the container when vLLM keeps dying."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import click

from t4serve.config.options import IntText
from t4serve.supervise.listener import RestartPolicy, listen
from t4serve.supervise.state import ExitRequest, write_exit_request
from t4serve.untrusted import MAX_SETTING_INT

# The container's exit code when vLLM gave up: a plain failure, distinct from t4serve's own 2/3/4/70.
EXIT_SERVER_FAILED = 1


@click.command("listener")
@click.option("--state-dir", required=True, type=click.Path(file_okay=False, path_type=Path))
@click.option("--max-restarts", required=True, type=IntText(0, MAX_SETTING_INT), help="T4SERVE_MAX_RESTARTS")
@click.option("--restart-window", required=True, type=IntText(1, MAX_SETTING_INT),
              help="T4SERVE_RESTART_WINDOW (seconds)")
def command(state_dir: Path, max_restarts: int, restart_window: int) -> int:
    """Speak supervisord's event-listener protocol on stdin/stdout (internal; supervisord starts it)."""

    def give_up(reason: str) -> None:
        write_exit_request(state_dir, ExitRequest(EXIT_SERVER_FAILED, reason, time.time()))
        # The listener's parent is supervisord: SIGTERM makes it stop every program (vLLM drains) and exit.
        os.kill(os.getppid(), signal.SIGTERM)

    return listen(
        sys.stdin, sys.stdout, sys.stderr, RestartPolicy(max_restarts, float(restart_window)), give_up, time.time
    )
