"""`t4serve telemetry`: GPU telemetry as Prometheus text on its own port, one log line a minute
(t4serve.supervise.telemetry)."""

from __future__ import annotations

import sys

import click

from t4serve.config.options import FloatText, IntText
from t4serve.config.settings import default_of
from t4serve.supervise.telemetry import LOG_EVERY_S, run


@click.command("telemetry")
@click.option("--host", default=default_of("T4SERVE_TELEMETRY_HOST"), show_default=True,
              help="Address /metrics binds (serve passes T4SERVE_TELEMETRY_HOST).")  # fmt: skip
@click.option(
    "--port",
    type=IntText(0, 65535),
    # Not read from T4SERVE_TELEMETRY_PORT: there 0 means "no telemetry program", here it means "any free port".
    default=int(default_of("T4SERVE_TELEMETRY_PORT")),
    show_default=True,
    help="Port of /metrics (0 picks a free one; serve passes T4SERVE_TELEMETRY_PORT).",
)
@click.option("--duration", type=FloatText(0.0, 1e9), default=None, help="Stop after this many seconds.")
@click.option("--log-every", type=FloatText(0.1, 86400.0), default=LOG_EVERY_S, show_default=True)
def command(host: str, port: int, duration: float | None, log_every: float) -> int:
    """Sample NVML; without NVML say so once and exit 0 (supervisord leaves it stopped)."""
    return run(host, port, sys.stdout, duration_s=duration, log_every_s=log_every)
