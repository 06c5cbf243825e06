"""`t4serve status`: where the server is: phase, elapsed, the figures vLLM logged beside the plan's predictions,
the canary, and an estimate of time-to-ready from past starts; or the configuration error `serve` stopped on (the
phase config_error). `--json` prints the same as t4serve.contract.StatusAnswer, what the host side reads."""

from __future__ import annotations

import time
from pathlib import Path

import click

from t4serve.contract import answering, emit, status_answer
from t4serve.supervise.readout import default_state_dir, render_config_error, render_status, state_dir_option
from t4serve.untrusted import printable


@click.command("status")
@state_dir_option
@click.option("--json", "as_json", is_flag=True, help="Print the status as JSON (the host/container contract).")
def command(state_dir: Path | None, as_json: bool) -> int:
    """Print the server's phase, figures vs the plan's predictions, and time-to-ready."""
    with answering(as_json):
        answer = status_answer(state_dir or default_state_dir())
    if as_json:
        emit(answer)
        return 0
    if answer.config_error is not None:
        click.echo(render_config_error(answer.config_error, time.time()))
        return 0
    assert answer.state is not None
    click.echo(render_status(answer.state, time.time()))
    if answer.ending is not None:
        click.echo(f"ending:   the container is exiting {answer.ending.code}: {printable(answer.ending.reason)}")
    return 0
