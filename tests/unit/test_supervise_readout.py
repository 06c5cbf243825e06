"""t4serve.supervise.readout: the state folder healthcheck and status read, their one --state-dir option, and the
time left to ready."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import click
import pytest
from click.testing import CliRunner
from serve_states import state_at

from t4serve.supervise.readout import default_state_dir, state_dir_option, time_to_ready


def test_default_state_dir_follows_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("T4SERVE_STATE_DIR", "/srv/state")
    assert default_state_dir() == Path("/srv/state")
    monkeypatch.setenv("T4SERVE_STATE_DIR", "")  # empty counts as unset
    assert default_state_dir() == Path("/tmp/t4serve")
    monkeypatch.delenv("T4SERVE_STATE_DIR")
    assert default_state_dir() == Path("/tmp/t4serve")


def test_state_dir_option_gives_a_path_or_none() -> None:
    @click.command()
    @state_dir_option
    def show(state_dir: Path | None) -> None:
        click.echo(repr(state_dir))

    assert CliRunner().invoke(show, ["--state-dir", "/x/y"]).output.strip() == repr(Path("/x/y"))
    assert CliRunner().invoke(show, []).output.strip() == "None"


def test_time_to_ready_from_the_estimate() -> None:
    loading = state_at(1, "loading_weights")
    assert time_to_ready(loading, 1070.0) is None  # no past starts: no estimate
    est = replace(loading, estimate_seconds=200.0, estimate_phases={"loading_weights": 100.0})
    # 60 s into a 100 s phase, 70 s into the attempt: 40 s left.
    assert time_to_ready(est, 1070.0) == pytest.approx(40.0)
