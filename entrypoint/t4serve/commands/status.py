"""`t4serve status`: where the server is: phase, elapsed, the figures vLLM logged beside the plan's predictions,
the canary, and an estimate of time-to-ready from past starts. `--json` prints the state file as is."""

from __future__ import annotations

import json
import time
from pathlib import Path

import click

from t4serve.errors import ConfigError
from t4serve.probes.checkpoint import builtin_facts
from t4serve.serde import to_dict
from t4serve.supervise.logwatch import compare, format_comparison
from t4serve.supervise.readout import default_state_dir, state_dir_option, time_to_ready
from t4serve.supervise.startbudget import cold_start_budget
from t4serve.supervise.state import (
    LOADING_PHASES,
    PHASE_LABELS,
    ServeState,
    read_config_error,
    read_exit_request,
    read_state,
)
from t4serve.units import fmt_duration
from t4serve.untrusted import printable


def cold_budget_note(model: str) -> str:
    """"; a cold start ... takes at most ..." for a built-in model (its size is known without a download), else ""."""
    facts = builtin_facts(model, "status")
    if facts is None:
        return ""
    budget = cold_start_budget(facts.weight_bytes)
    return f"; a cold start (download, load, compile) is budgeted at up to {fmt_duration(budget.total_seconds)}"


def render_status(state: ServeState, now: float) -> str:
    lines = [
        f"phase:    {PHASE_LABELS[state.phase]} for {fmt_duration(now - state.phase_began_at())}",
        f"model:    {state.model} (served as {state.served_model_name} on port {state.port})",
        f"gpu:      {state.gpu_name or 'none recorded'}",
        f"started:  {fmt_duration(now - state.started_at)} ago; vLLM attempt {state.attempt} began "
        f"{fmt_duration(now - state.attempt_started_at)} ago",
    ]
    if state.phase in LOADING_PHASES:
        left = time_to_ready(state, now)
        median = fmt_duration(state.estimate_seconds or 0)
        lines.append(
            "estimate: no past starts of this model on this GPU yet" + cold_budget_note(state.model)
            if left is None
            else f"estimate: {fmt_duration(left)} to ready (past starts took {median}, median)"
        )
    lines.append("phases:")
    marks = state.phases
    for mark, nxt in zip(marks, [*marks[1:], None], strict=True):
        end = nxt.began_at if nxt is not None else now
        lines.append(f"  {PHASE_LABELS[mark.phase]:<52} {fmt_duration(end - mark.began_at):>7}")
    comparisons = {c.name: c for c in compare(state.figures, state.predictions)}
    if state.figures:
        lines.append("figures (vLLM's log):")
        for figure in state.figures.values():
            c = comparisons.get(figure.name)
            text = format_comparison(c) if c else f"{figure.name}: {figure.value:,.2f} {figure.unit}"
            lines.append(f"  {text}")
    missing = [p for name, p in state.predictions.items() if name not in state.figures]
    if missing:
        lines.append("predictions not yet logged by vLLM:")
        lines += [f"  {p.name}: {p.value:,.2f} {p.unit} ({p.how})" for p in missing]
    if state.canary is not None:
        canary = state.canary
        verdict = "passed" if canary.ok else f"FAILED: {canary.reason}"
        lines.append(f"canary:   {canary.prompt!r} -> {canary.text!r}: {verdict} ({canary.seconds:.2f} s)")
    if state.reason:
        lines.append(f"reason:   {state.reason}")
    if state.diagnosis:
        lines.append(f"diagnosis: {state.diagnosis}")
    if state.fix:
        lines.append(f"fix:      {state.fix}")
    if state.phase == "failed" and state.last_lines:
        lines.append("vLLM's last lines:")
        lines += [f"  | {ln}" for ln in state.last_lines]
    return "\n".join(lines)


@click.command("status")
@state_dir_option
@click.option("--json", "as_json", is_flag=True, help="Print the state file as JSON.")
def command(state_dir: Path | None, as_json: bool) -> int:
    """Print the server's phase, figures vs the plan's predictions, and time-to-ready."""
    folder = state_dir or default_state_dir()
    stopped = read_config_error(folder)
    if stopped is not None:
        raise ConfigError(
            "t4serve serve stopped on a configuration error and waits for a stop signal (T4SERVE_ON_CONFIG_ERROR=wait)",
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
