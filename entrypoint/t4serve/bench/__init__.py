"""`t4serve bench`: the published T4 sweep as one command, split into pure parts and the runner.

`grid` (cells, seeds, prompt counts), `results` (raw `vllm bench serve` JSON -> runs -> per-cell summaries),
`report` (CSV, markdown, compare) and `plots` are pure and run on Python 3.11 without vLLM; `runner` runs
`vllm bench serve` per cell and repeat, starts servers and samples telemetry; `telemetry` reads NVML.
"""
