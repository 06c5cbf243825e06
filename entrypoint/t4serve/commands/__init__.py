"""One module per `t4serve` subcommand; each exposes `command`. Discovered by t4serve.cli without importing."""
