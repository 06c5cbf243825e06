"""Supervision of the running server: the vLLM wrapper, its log-following phase tracker, the readiness canary,
the shared state file, child-death diagnosis, the supervisord event listener, start history and the PID-1 reaper.

Nothing here imports torch or vLLM: these modules run beside the server and must start in a fraction of a second.
"""
