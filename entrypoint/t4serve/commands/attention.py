"""`t4serve attention prove`: prove t4serve's Turing attention (tensor cores on sm_75) against vLLM's real kernel.

The image build proves in a stage of its own (`python -m t4serve.turing.proof`, the same proof without the CLI), from
what `t4serve attention inputs` gathered in the build stage (t4serve.turing.inputs says why); the work is in
t4serve.turing.proof; this module maps options to it and prints (exit 4 on any failure).
"""

from __future__ import annotations

from pathlib import Path

import click


@click.group(name="attention")
def command() -> None:
    """t4serve's attention path on Turing (T4SERVE_ATTENTION=turing-mma): its proof."""


@command.command(name="prove")
@click.option("--vllm-root", type=click.Path(file_okay=False, path_type=Path),
              help="the vllm package folder (default: the vllm importable by this Python)")
@click.option("--proof-out", type=click.Path(dir_okay=False, path_type=Path), help="write the proof (JSON) here")
@click.option("--no-step1", "step1", flag_value=False, default=True,
              help="skip step 1's sweep of FMA launches (the table's own rows are always proven)")
def prove_command(vllm_root: Path | None, proof_out: Path | None, step1: bool) -> int:
    """Compile every launch of the Turing attention table for sm_75: shared memory, spills, tensor-core instructions."""
    from t4serve.turing.proof import prove

    prove(vllm_root, proof_out=proof_out, step1=step1, echo=click.echo)
    return 0


@command.command(name="inputs")
@click.option("--out", type=click.Path(path_type=Path), required=True,
              help="a new or empty folder; each input lands at its installed path below it")
@click.option("--vllm-root", type=click.Path(file_okay=False, path_type=Path),
              help="the vllm package folder (default: the vllm importable by this Python)")
def inputs_command(out: Path, vllm_root: Path | None) -> int:
    """Gather what the proof reads (its t4serve modules, vLLM's attention file) for the image's proof stage."""
    from t4serve.turing.inputs import gather

    copied = gather(out, vllm_root=vllm_root)
    click.echo(f"{len(copied)} files the Turing attention proof reads, gathered into {out}")
    return 0
