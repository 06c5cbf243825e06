"""`t4serve host-check [--json]`: can this host run the t4serve container? Run on the host, not in the image.

The NVIDIA driver, the NVIDIA Container Toolkit configured for Docker, free space on Docker's data root for the
image and the cache volumes, RAM + swap against the checkpoint's load need, and compose's /dev/shm: the same
findings the MCP tool `check_host_capacity` returns (t4serve.host.hostcheck). Exit 3 on a failed check.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import click

from t4serve.config.settings import Settings
from t4serve.errors import PreflightError

compose_file_option = click.option(
    "--compose-file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="t4serve's compose.yaml (default: T4SERVE_COMPOSE_FILE, else ./compose.yaml).",
)
project_option = click.option(
    "--project", "-p", default=None, help="Compose project (default: T4SERVE_COMPOSE_PROJECT, else compose's own)."
)


@click.command("host-check")
@click.option("--json", "as_json", is_flag=True, help="Print the findings as JSON.")
@click.option(
    "--model",
    metavar="MODEL",
    default=None,
    help="The checkpoint whose download and load are counted: qat, bf16, an HF repo id or a directory "
    "(default: T4SERVE_MODEL, else qat).",
)
@compose_file_option
@project_option
def command(as_json: bool, model: str | None, compose_file: Path | None, project: str | None) -> int:
    """Check the host: NVIDIA driver, Container Toolkit, Docker disk, RAM + swap, shared memory; exit 3 on a failure.

    The first thing to run on a new host. Settings other than the model come from the environment, as the
    container's do (`t4serve env`)."""
    from t4serve.config.secrets import known_secrets
    from t4serve.host.docker import engine_from_environ
    from t4serve.host.engine import RedactedEngine
    from t4serve.host.hostcheck import check_host
    from t4serve.preflight import format_table, has_failures

    overrides = {"T4SERVE_MODEL": model} if model else {}
    settings = Settings.from_environ(os.environ, overrides=overrides)
    docker = engine_from_environ(os.environ, compose_file=compose_file, project=project)
    engine = RedactedEngine(docker, lambda: known_secrets(os.environ))
    findings = check_host(settings, os.environ, engine, docker.compose_file)
    if as_json:
        click.echo(json.dumps([dataclasses.asdict(f) for f in findings], indent=2))
    else:
        click.echo(format_table(findings))
    return PreflightError.exit_code if has_failures(findings) else 0
