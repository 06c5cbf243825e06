"""`t4serve preflight [--json] [--facts FILE]`: can this machine run the plan? Exit 3 on any failed check.

The checks are the ones `serve` runs before starting vLLM. T4SERVE_PREFLIGHT=warn lets `serve` start anyway; it never
changes this command's exit code, so `preflight` stays an honest test of the machine.
"""

from __future__ import annotations

import click

from t4serve.commands._factsource import facts_options, read_facts
from t4serve.config.options import settings_options
from t4serve.config.settings import Settings
from t4serve.errors import PreflightError
from t4serve.pipeline import ensure_model, prepare
from t4serve.planning.plan import refuse_unreadable_model
from t4serve.preflight import format_table, has_failures, to_json


@click.command("preflight")
@click.option("--json", "as_json", is_flag=True, help="Print the findings as JSON.")
@facts_options("Check", gpu=False)
@settings_options
def command(as_json: bool, facts_file: str | None, settings: Settings) -> int:
    """Check GPU, driver, torch build, clamp, memory, shared memory, disks, model and ports; exit 3 on a failure."""
    facts = ensure_model(settings, read_facts(settings, facts_file))
    _plan, findings = prepare(settings, facts)
    click.echo(to_json(findings) if as_json else format_table(findings), nl=not as_json)
    # The findings are printed whole; a checkpoint that cannot be read is bad input, refused with exit 2 as by every
    # other command, before the machine's failures (exit 3).
    refuse_unreadable_model(settings, facts.model)
    return PreflightError.exit_code if has_failures(findings) else 0
