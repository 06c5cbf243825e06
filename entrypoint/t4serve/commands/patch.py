"""`t4serve patch apply|verify`: put the Turing attention clamp into vLLM and prove it (exit 4 on any failure).

The image build runs `t4serve patch apply --proof-out /etc/t4serve/clamp-proof.json`; `verify` re-proves an installed
clamp at any time. The work is in t4serve.patch; this module only maps options to it and prints.
"""

from __future__ import annotations

from pathlib import Path

import click

VLLM_ROOT_HELP = "the vllm package folder to patch (default: the vllm importable by this Python)"
PROOF_OUT_HELP = "write the proof (ClampProof JSON) here"


@click.group(name="patch")
def command() -> None:
    """Apply and prove the Turing attention clamp in vLLM's Triton attention."""


@command.command(name="apply")
@click.option("--vllm-root", type=click.Path(file_okay=False, path_type=Path), help=VLLM_ROOT_HELP)
@click.option("--proof-out", type=click.Path(dir_okay=False, path_type=Path), help=PROOF_OUT_HELP)
def apply_command(vllm_root: Path | None, proof_out: Path | None) -> int:
    """Clamp the attention tile to 16 where tile 32 cannot fit the GPU's shared memory, then prove it."""
    from t4serve.patch import apply_clamp, verify

    result = apply_clamp(vllm_root)
    if result.action == "applied":
        click.echo(f"clamp applied to {result.path} (vLLM {result.vllm_version}); byte-compiled")
    else:
        click.echo(f"clamp already applied to {result.path} (vLLM {result.vllm_version}): nothing written")
    verify(result.root, proof_out=proof_out, echo=click.echo)
    return 0


@command.command(name="verify")
@click.option("--vllm-root", type=click.Path(file_okay=False, path_type=Path), help=VLLM_ROOT_HELP)
@click.option("--proof-out", type=click.Path(dir_okay=False, path_type=Path), help=PROOF_OUT_HELP)
@click.option("--skip-interpreter", is_flag=True, help="skip step 3 (the Triton interpreter run, the slowest step)")
def verify_command(vllm_root: Path | None, proof_out: Path | None, skip_interpreter: bool) -> int:
    """Prove the installed clamp: locate it, compile vLLM's kernels for sm_75, run them against a reference."""
    from t4serve.patch import verify

    verify(vllm_root, proof_out=proof_out, skip_interpreter=skip_interpreter, echo=click.echo)
    return 0
