"""`t4serve env [--markdown]`: every setting with its value, default and origin; or the README's variable table.

Without `--markdown` the current environment (and any flags) is parsed exactly as `serve` parses it, so a bad value
fails here with the same message and exit code 2. Secrets are redacted.
"""

from __future__ import annotations

import click

from t4serve.config.options import settings_options
from t4serve.config.settings import Settings, markdown_table


@click.command("env")
@click.option("--markdown", is_flag=True, help="Print the table of variables as Markdown (the README's table).")
@settings_options
def command(markdown: bool, settings: Settings) -> int:
    """Show every setting beside its default (secrets redacted)."""
    click.echo(markdown_table() if markdown else settings.summary(), nl=not markdown)
    return 0
