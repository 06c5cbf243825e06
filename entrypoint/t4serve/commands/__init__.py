"""One module per `t4serve` subcommand; each exposes `command`. Listed in t4serve.cli (COMMANDS, INTERNAL_COMMANDS)."""
