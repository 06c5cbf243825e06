"""What the commands that read a running server's state folder share (`t4serve healthcheck`, `t4serve status`, the
MCP server_status tool): where the folder is, the one --state-dir option, the time left to ready, and the state as
`t4serve status` prints it."""

from __future__ import annotations

import os
from pathlib import Path

import click

from t4serve.config.settings import default_of
from t4serve.probes.checkpoint import builtin_facts
from t4serve.supervise import history
from t4serve.supervise.logwatch import compare, format_comparison
from t4serve.supervise.phases import CONFIG_ERROR, LOADING_PHASES, PHASE_LABELS
from t4serve.supervise.startbudget import cold_start_budget
from t4serve.supervise.state import ConfigErrorRecord, ServeState
from t4serve.units import fmt_duration


def default_state_dir() -> Path:
    return Path(os.environ.get("T4SERVE_STATE_DIR") or default_of("T4SERVE_STATE_DIR"))


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


def cold_budget_note(model: str) -> str:
    """"; a cold start ... takes at most ..." for a built-in model (its size is known without a download), else ""."""
    facts = builtin_facts(model, "status")
    if facts is None:
        return ""
    budget = cold_start_budget(facts.weight_bytes)
    return f"; a cold start (download, load, compile) is budgeted at up to {fmt_duration(budget.total_seconds)}"


# What recreates a container after its setting is fixed, for each way t4serve's container is started.
RECREATE_AFTER_FIX = (
    "recreate the container with the setting fixed: `docker compose up -d` (docker-compose 1.29: `docker-compose -f "
    "compose.yaml up -d`; plain Docker: `docker rm -f` it and `docker run` again), or stop it (`docker compose down`)"
)


def render_config_error(record: ConfigErrorRecord, now: float) -> str:
    """`t4serve status` of a container whose `serve` stopped on a configuration error and waits (no vLLM runs)."""
    since = f" for {fmt_duration(now - record.stopped_at)}" if record.stopped_at > 0 else ""
    lines = [f"phase:    {PHASE_LABELS[CONFIG_ERROR]}{since}", f"error:    {record.what}"]
    lines += [f"{name + ':':<10}{value}" for name, value in (("found", record.found), ("required", record.required),
                                                             ("fix", record.fix)) if value is not None]
    lines.append(f"then:     {RECREATE_AFTER_FIX}")
    return "\n".join(lines)


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
