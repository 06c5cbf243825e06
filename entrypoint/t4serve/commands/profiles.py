"""`t4serve profiles [--json] [--gpu KEY] [--facts FILE] [--model M]`: what runs on this GPU and host, and why not.

Each checkpoint (qat, bf16, and the one --model or T4SERVE_MODEL names) at every KV cache dtype (auto, int8, int4,
fp8) and at 4k, 16k, 32k and the model's maximum length, planned by `t4serve plan`'s own code
(t4serve.planning.profiles): runnable or the plan's refusal, KV tokens, concurrency, weight memory, host memory and
swap needed, decode ceiling. The other settings apply to every profile as they apply to `plan`.
"""

from __future__ import annotations

import click

from t4serve.commands._factsource import facts_options, read_facts
from t4serve.config.options import settings_options
from t4serve.config.settings import Settings, with_model
from t4serve.pipeline import ensure_model
from t4serve.planning.profiles import profiles, summary, to_json

DEFAULT_CHECKPOINTS = ("qat", "bf16")


@click.command("profiles")
@click.option("--json", "as_json", is_flag=True, help="Print the profiles as JSON.")
@facts_options("Profiles for")
@settings_options
def command(as_json: bool, facts_file: str | None, gpu: str | None, settings: Settings) -> int:
    """What runs on this GPU and host, and what does not and why: each checkpoint x KV cache dtype x length."""
    facts = read_facts(settings, facts_file, gpu)
    checkpoints = list(dict.fromkeys((*DEFAULT_CHECKPOINTS, settings.model.requested)))
    cases = []
    for name in checkpoints:
        chosen = settings if name == settings.model.requested else with_model(settings, name)
        cases.append((chosen, ensure_model(chosen, facts)))
    rows = profiles(cases)
    device = facts.gpu.devices[0].name if facts.gpu.devices else "no GPU visible (use --gpu t4)"
    click.echo(to_json(rows, device) if as_json else summary(rows, device), nl=not as_json)
    return 0
