"""Configuration: what the user asked for, parsed and validated before anything reads the machine.

`settings` (the one table of variables and the frozen `Settings`), `variables` (a row, its parsers, its error),
`secrets` (the token and the API key, their *_FILE pairs), `vllmflags` (the `vllm serve` flags t4serve owns or
refuses), `kvflags` (the flags that move vLLM's KV accounting), `compilation` (the compile ladder T4SERVE_COMPILE
chooses from), `aliases` (the built-in checkpoints) and `options` (the click glue of the table).
Nothing here reads the machine or imports a later stage.
"""
