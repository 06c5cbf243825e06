"""Server states for the tests of the commands that read them (healthcheck, its liveness mode): a run spec on a port
and the state of a server in a given phase, as the vLLM wrapper writes it."""

from __future__ import annotations

from t4serve.supervise.state import RunSpec, ServeState, new_state


def spec(port: int) -> RunSpec:
    return RunSpec(["vllm", "serve", "m"], {}, "m", "gemma", "0.0.0.0", port, "float16", 30, True, "Tesla T4",
                   "/nonexistent/hub", "/nonexistent/cache")  # fmt: skip


def state_at(port: int, phase: str, t0: float = 1000.0) -> ServeState:
    state = new_state(spec(port), started_at=t0, now=t0)
    return state.with_phase(phase, t0 + 10.0) if phase != "starting" else state
