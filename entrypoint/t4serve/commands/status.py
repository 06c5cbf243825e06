"""`t4serve status`: where the server is: phase, elapsed, the figures vLLM logged beside the plan's predictions,
the canary, and an estimate of time-to-ready from past starts. `--json` prints the state file as is."""

from __future__ import annotations

import json
import time
from pathlib import Path

import click

from t4serve.errors import ConfigError
from t4serve.serde import to_dict
from t4serve.supervise.readout import default_state_dir, render_status, state_dir_option
from t4serve.supervise.state import CONFIG_ERROR_WHAT, read_config_error, read_exit_request, read_state
from t4serve.untrusted import printable


@click.command("status")
@state_dir_option
@click.option("--json", "as_json", is_flag=True, help="Print the state file as JSON.")
def command(state_dir: Path | None, as_json: bool) -> int:
    """Print the server's phase, figures vs the plan's predictions, and time-to-ready."""
    folder = state_dir or default_state_dir()
    stopped = read_config_error(folder)
    if stopped is not None:
        raise ConfigError(
            CONFIG_ERROR_WHAT,
            found=stopped,
            required="settings that parse (the container's log has the whole message)",
            fix="fix the setting, then `docker compose up -d` (it recreates the container)",
        )
    # Both files are read before anything is printed, in both forms: an unreadable one is exit 2 with found /
    # required / fix whether the caller asked for text or JSON (JSON once printed the state and exited 0).
    state = read_state(folder)
    request = read_exit_request(folder)
    if as_json:
        click.echo(json.dumps(to_dict(state), indent=2))
        return 0
    click.echo(render_status(state, time.time()))
    if request is not None:
        click.echo(f"ending:   the container is exiting {request.code}: {printable(request.reason)}")
    return 0
