"""Planning: Settings + Facts -> Plan, the exact `vllm serve` command line and every number behind it. Pure.

`plan` (the Plan: dtype, clamp, argv, environment) calls `sizing` (max_model_len, max_num_seqs, the KV pool, RAM),
which rests on `kvcache` (vLLM 0.33's KV accounting), `hostmem` (host RAM to load a checkpoint) and `roofline` (the
decode ceiling); `derived` is the number-with-its-arithmetic every figure is. Nothing here reads the machine.
"""
