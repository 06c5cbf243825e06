"""`t4serve plan [--json] [--facts FILE] [--gpu KEY]`: the vLLM command line and the numbers behind it.

Settings come from the environment and the shared options; facts from this machine, or a recording (`--facts`), with
the GPU optionally replaced by a known card (`--gpu t4`), so a T4 plan can be read on any machine.
"""

from __future__ import annotations

import json

import click

from t4serve.commands._factsource import facts_options, read_facts
from t4serve.config.options import settings_options
from t4serve.config.settings import Settings
from t4serve.errors import ConfigError
from t4serve.pipeline import ensure_model
from t4serve.planning.plan import plan, refuse_unreadable_model


@click.command("plan")
@click.option("--json", "as_json", is_flag=True, help="Print settings and plan as JSON.")
@facts_options("Plan for")
@settings_options
def command(as_json: bool, facts_file: str | None, gpu: str | None, settings: Settings) -> int:
    """Print the answer in one line (fits or not, request length, streams, swap to add), then the exact `vllm serve`
    command t4serve would run with each derived number's arithmetic, then the settings."""
    facts = ensure_model(settings, read_facts(settings, facts_file, gpu))
    the_plan = plan(settings, facts)
    if as_json:
        click.echo(json.dumps({"settings": settings.to_dict(), "plan": the_plan.to_dict()}, indent=2))
    else:
        click.echo(f"answer: {the_plan.answer()}\n\nplan:\n{the_plan.summary()}\n\nsettings:\n{settings.summary()}")
    # The plan above is printed for what it can say; with no checkpoint to size it is no plan to run: exit 2 in both
    # forms, as every command refuses the same checkpoint.
    refuse_unreadable_model(settings, facts.model)
    if the_plan.sizing is None and the_plan.gpu is not None:
        # A GPU to size for and a checkpoint read, yet no sizing: settings vLLM refuses (batched tokens below the
        # sequences) or a model outside what t4serve sizes (an unknown layer type). serve refuses it, and roofline
        # the same checkpoint: exit 2 in both forms, the plan above printed for what it can say.
        raise ConfigError(
            "this plan cannot run: t4serve could not size it",
            found=the_plan.sizing_error or "sizing did not run",
            required="settings and a checkpoint that t4serve can size for this GPU",
            fix="change what the reason above names (`t4serve env` shows the settings in effect)",
        )
    return 0
