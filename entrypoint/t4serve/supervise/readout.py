"""What the commands that read a running server's state folder share (`t4serve healthcheck`, `t4serve status`, the
MCP server_status tool): where the folder is, the one --state-dir option, and the time left to ready."""

from __future__ import annotations

import os
from pathlib import Path

import click

from t4serve.config.settings import VARIABLES_BY_NAME
from t4serve.supervise import history
from t4serve.supervise.state import ServeState


def default_state_dir() -> Path:
    return Path(os.environ.get("T4SERVE_STATE_DIR") or VARIABLES_BY_NAME["T4SERVE_STATE_DIR"].default or "")


# The one --state-dir option of the commands that read the server's state (healthcheck, status).
state_dir_option = click.option(
    "--state-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="State folder (default: T4SERVE_STATE_DIR, else /tmp/t4serve).",
)


def time_to_ready(state: ServeState, now: float) -> float | None:
    """Seconds until ready from the state's estimate (past starts of this model on this GPU); None without one."""
    if state.estimate_seconds is None:
        return None
    est = history.Estimate(state.estimate_seconds, dict(state.estimate_phases), 0)
    return history.remaining(est, state.phase, now - state.phase_began_at(), now - state.attempt_started_at)
