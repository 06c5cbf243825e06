"""`t4serve run-vllm --spec FILE`: the `vllm` program supervisord runs (see t4serve.supervise.run_vllm)."""

from __future__ import annotations

from pathlib import Path

import click

from t4serve.supervise.run_vllm import Wrapper
from t4serve.supervise.state import read_run_spec


@click.command("run-vllm")
@click.option(
    "--spec",
    "spec_path",
    required=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="run-spec.json written by `t4serve serve` (its folder is the state directory).",
)
def command(spec_path: Path) -> int:
    """Run vLLM as the plan says, follow its phases and health, and keep the state file current (internal)."""
    spec = read_run_spec(spec_path)
    return Wrapper(spec, spec_path.parent).run()
