"""`t4serve build-manifest`: run once in the image's build stage to write /etc/t4serve/build-manifest.json.

Reads what is installed (torch's CUDA version and compiled arch list included), folds in the clamp proof, checks the
image's claims (sm_75, CUDA 13, labels equal to what is installed) and fails the build when one does not hold.
"""

from __future__ import annotations

from pathlib import Path

import click

from t4serve.probes import buildinfo


@click.command("build-manifest")
@click.option(
    "--out",
    "out",
    type=click.Path(dir_okay=False, path_type=Path),
    default=Path("/etc/t4serve/build-manifest.json"),
    show_default=True,
    help="Where to write the manifest (the image's T4SERVE_MANIFEST).",
)
@click.option("--base-image", default="", help="The image the build started from (the Dockerfile's BASE_IMAGE).")
@click.option(
    "--clamp-proof",
    "clamp_proof",
    type=click.Path(dir_okay=False, path_type=Path),
    required=True,
    help="The proof JSON written by `t4serve patch apply --proof-out FILE`.",
)
@click.option(
    "--expect",
    "expect",
    multiple=True,
    metavar="NAME=VERSION",
    help="A version the image is labelled with; the build fails when the installed one differs. Empty VERSION: skip.",
)
def command(out: Path, base_image: str, clamp_proof: Path, expect: tuple[str, ...]) -> None:
    """Write the build manifest and check its claims (build time only: imports torch)."""
    expected = buildinfo.parse_expectations(list(expect))
    clamp = buildinfo.read_clamp_proof(clamp_proof)
    manifest = buildinfo.collect(path=str(out), base_image=base_image, clamp=clamp)
    buildinfo.check_claims(manifest)
    buildinfo.check_expectations(manifest, expected)
    buildinfo.write_manifest(manifest, out)
    click.echo(buildinfo.manifest_json(manifest), nl=False)
    if not expected:
        click.echo("build-manifest: no --expect values given; labels were not checked against the install", err=True)
