"""`t4serve roofline [MODEL] [--gpu t4] [--context N] [--json]`: bytes read per decode token and the decode ceiling.

MODEL is an alias (qat, bf16), a repo id or a local directory (default: T4SERVE_MODEL, else qat); headers come from the
local checkpoint, the hub when reachable, or the aliases' built-in facts. The ceiling is shown at the GPU's measured
and nominal bandwidth.
"""

from __future__ import annotations

import json
import os

import click

from t4serve.config.options import IntText
from t4serve.config.settings import Settings
from t4serve.errors import ConfigError
from t4serve.gpus import KNOWN_GPUS, known_gpu
from t4serve.pipeline import probe_settings_model
from t4serve.planning.derived import Derived
from t4serve.planning.roofline import roofline
from t4serve.serde import to_dict
from t4serve.untrusted import MAX_SETTING_INT


@click.command("roofline")
@click.argument("model", required=False)
@click.option("--gpu", "gpu_key", default="t4", show_default=True,
              type=click.Choice(sorted(KNOWN_GPUS), case_sensitive=False), help="Known GPU whose bandwidth to use.")
@click.option("--context", default=4096, show_default=True, type=IntText(0, MAX_SETTING_INT),
              help="Tokens already in the sequence, for the KV bytes each decode step reads.")
@click.option("--json", "as_json", is_flag=True, help="Print the figures as JSON.")
def command(model: str | None, gpu_key: str, context: int, as_json: bool) -> int:
    """Bytes read per decode token (from safetensors headers) and the bandwidth ceiling in tokens/s."""
    # MODEL, HF_HOME and HF_HUB_OFFLINE mean here what they mean to `serve`: parsed by the one settings table.
    settings = Settings.from_environ(
        os.environ,
        overrides={"T4SERVE_MODEL": model} if model else None,
        override_labels={"T4SERVE_MODEL": "the MODEL argument"},
    )
    facts = probe_settings_model(settings)
    if facts.source == "invalid":
        raise ConfigError(f"cannot read the checkpoint {settings.model.requested}", found=facts.error,
                          required="config.json and readable safetensors headers",
                          fix="re-download the checkpoint or point MODEL at a complete directory")
    gpu = known_gpu(gpu_key)
    assert gpu is not None  # click.Choice only lets known keys through
    figures: dict[str, Derived | None] = {}
    result = roofline(facts, context=context, dtype_bytes=2, bandwidth_bytes_per_s=gpu.bandwidth,
                      bandwidth_how=" measured" if gpu.bandwidth_measured else " nominal")
    figures.update(to_dict_fields(result))
    if gpu.bandwidth_measured:
        nominal = roofline(facts, context=context, dtype_bytes=2, bandwidth_bytes_per_s=gpu.bandwidth_nominal,
                           bandwidth_how=" nominal")
        figures["ceiling_nominal_tokens_per_s"] = nominal.ceiling_tokens_per_s
    header = {"model": facts.requested, "source": facts.source, "gpu": gpu.name, "context": context}
    if as_json:
        click.echo(json.dumps({**header, **{k: to_dict(v) for k, v in figures.items()}}, indent=2))
    else:
        click.echo(f"{facts.requested} ({facts.source}) on {gpu.name}, context {context:,}:")
        for name, value in figures.items():
            if value is not None:
                click.echo(f"  {name}: {value}")
    return 0


def to_dict_fields(result: object) -> dict[str, Derived | None]:
    return {k: v for k, v in vars(result).items() if v is None or isinstance(v, Derived)}
