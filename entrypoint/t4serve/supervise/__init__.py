"""Supervision: what `serve` renders from the plan and everything that runs beside the server once it starts.

`render` (Plan -> the run spec and supervisord.conf), `pid1` (supervisord under a reaping init), `run_vllm` (the vLLM
wrapper: phases, canary, crash diagnosis, the compile ladder's `compilerecord`), `logwatch` (the phase tracker),
`state` (the files shared through the state folder), `health` and `readout` (what healthcheck and status read out of
it), `canary`, `diagnose`, `listener` (restarts), `history` and `startbudget` (how long starts take), `telemetry` (the
GPU /metrics sidecar). Nothing here imports torch or vLLM: these modules run beside the server and must start in a
fraction of a second.
"""
