"""Is the server ready, and is it alive: the answers `t4serve healthcheck` gives, from the state folder and the server.

`check(state_dir)` is readiness: ready only when the state the vLLM wrapper keeps says so and /health and /v1/models
answer (with the API key when one is set). `check_liveness(state_dir)` asks a narrower question for Kubernetes'
livenessProbe: should this container be restarted? A server that was ready and no longer answers /health (hung, or
its engine dead) says yes, and so does a vLLM attempt that has been loading for longer than the cold-start budget (a
reload that hangs: download, load and compile all done within it on a cold cache); a loading one within its budget
never does. Each returns (exit code, the one line to print), the code 0 or 1 only; `timeout` is a wall-clock deadline
over the whole check, whatever the server does (t4serve.httpclient).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from t4serve.config.aliases import MODEL_ALIASES
from t4serve.errors import T4ServeError
from t4serve.httpclient import Answer, HttpFailure, fetch, local_url
from t4serve.probes.checkpoint import builtin_facts
from t4serve.supervise.phases import (
    ALIVE,
    ALIVE_WITHIN_BUDGET,
    NOT_READY_LOADING,
    NOT_READY_STOPPING,
    PHASES,
    UNHEALTHY,
)
from t4serve.supervise.readout import time_to_ready
from t4serve.supervise.startbudget import cold_start_budget
from t4serve.supervise.state import ServeState, read_config_error, read_state
from t4serve.units import GIB, fmt_duration

# What serve left when it stopped on a configuration error (T4SERVE_ON_CONFIG_ERROR=wait), before its first line.
WAITING = "t4serve serve stopped on a configuration error and waits (the log has it whole):"
# The whole check (state file, /health, /v1/models) ends within this many seconds; Docker's own timeout is 10 s.
DEADLINE_S = 6.0


def loading_bound_s(state: ServeState) -> float:
    """The longest one vLLM attempt may stay in the loading phases before liveness calls it wedged: the cold-start
    budget (t4serve.supervise.startbudget) of the largest checkpoint it could be loading: the built-in models (the
    bound Kubernetes' startupProbe is sized from), the served model when it is one of them, and the weights the plan
    predicted for any other."""
    sizes = [facts.weight_bytes for repo in sorted({*MODEL_ALIASES.values(), state.model})
             if (facts := builtin_facts(repo, "liveness bound")) is not None]  # fmt: skip
    predicted = state.predictions.get("model_memory_gib")
    if predicted is not None and predicted.unit == "GiB":
        sizes.append(int(predicted.value * GIB))
    return cold_start_budget(max(sizes)).total_seconds


def loading_line(state: ServeState, now: float) -> str:
    line = (
        f"{PHASES[state.phase].label} for {fmt_duration(now - state.phase_began_at())} "
        f"({fmt_duration(now - state.attempt_started_at)} since vLLM started, attempt {state.attempt})"
    )
    left = time_to_ready(state, now)
    if left is not None:
        line += f"; estimated {fmt_duration(left)} to ready"
    return line


def _get(url: str, deadline: float, api_key: str | None = None) -> Answer:
    return fetch("GET", url, deadline_s=deadline - time.monotonic(), api_key=api_key)


def probe(state: ServeState, timeout: float, api_key: str | None = None) -> str | None:
    """None when /health answers 200 and /v1/models lists the served model, both within `timeout` seconds in all;
    else why not."""
    deadline = time.monotonic() + timeout
    base = local_url(state.host, state.port)
    try:
        health = _get(f"{base}/health", deadline)
    except HttpFailure as exc:
        return f"{base}/health did not answer within {timeout:g} s ({exc.reason})"
    if health.status != 200:
        dead = " (vLLM's engine is dead or stopping)" if health.status >= 500 else ""
        return f"{base}/health answered HTTP {health.status}{_moved(health)}{dead}"
    try:
        models = _get(f"{base}/v1/models", deadline, api_key)
    except HttpFailure as exc:
        return f"{base}/v1/models did not answer within {timeout:g} s ({exc.reason})"
    if models.status == 401:
        sent = "a key that the server refuses" if api_key else "no API key"
        return (
            f"{base}/v1/models answered HTTP 401 Unauthorized to {sent}; give this command the server's key: "
            "T4SERVE_API_KEY_FILE (or T4SERVE_API_KEY) as the container has it"
        )
    if models.status != 200:
        return f"{base}/v1/models answered HTTP {models.status}{_moved(models)}"
    try:
        body: Any = models.json("the answer")
    except HttpFailure as exc:
        return f"{base}/v1/models answered something that is not a model list ({exc.reason})"
    data = body.get("data") if isinstance(body, dict) else None
    ids = [m.get("id") for m in data if isinstance(m, dict)] if isinstance(data, list) else []
    if state.served_model_name not in ids:
        listed = repr(ids) if len(repr(ids)) <= 200 else repr(ids)[:197] + "..."
        return f"{base}/v1/models does not list {state.served_model_name!r} (it lists {listed})"
    return None


def _moved(answer: Answer) -> str:
    if not answer.redirect:
        return ""
    return f", a redirect to {answer.location!r} that is not followed (it would carry the key)"


def check(
    state_dir: Path, timeout: float = DEADLINE_S, now: float | None = None, api_key: str | None = None
) -> tuple[int, str]:
    """(exit code, the one line to print)."""
    stopped = read_config_error(state_dir)
    if stopped is not None:
        return 1, f"unhealthy: {WAITING} {stopped.headline()}"
    try:
        state = read_state(state_dir)
    except T4ServeError as exc:
        return 1, f"not ready: {exc.what} ({exc.found})"
    t = time.time() if now is None else now
    readiness = PHASES[state.phase].readiness
    if readiness == NOT_READY_LOADING:
        return 1, f"not ready: {loading_line(state, t)}"
    if readiness == UNHEALTHY:
        # The canary's hint, or vLLM's death with its diagnosis and fix.
        if state.phase == "canary_failed":
            return 1, f"unhealthy: {state.reason}" + (f"; hint: {state.fix}" if state.fix else "")
        return 1, f"unhealthy: {state.reason}" + (f"; {state.diagnosis}; fix: {state.fix}" if state.diagnosis else "")
    if readiness == NOT_READY_STOPPING:
        return 1, f"not ready: stopping for {fmt_duration(t - state.phase_began_at())} (draining in-flight requests)"
    problem = probe(state, timeout, api_key)
    if problem is not None:
        return 1, f"unhealthy: ready since {fmt_duration(t - state.phase_began_at())} ago, but {problem}"
    return 0, f"ready: {state.served_model_name} answers on port {state.port}"


def check_liveness(state_dir: Path, timeout: float = DEADLINE_S, now: float | None = None) -> tuple[int, str]:
    """(exit code, the one line to print): 1 only where a restart of the container is the cure.

    Loading phases are alive until the attempt has loaded for longer than `loading_bound_s` (the startupProbe bounds
    the first start; a vLLM restart inside the container loads again and must not be killed for it, but a reload that
    hangs must not keep the container alive forever). So are `stopping` (draining), `failed` (supervisord
    restarts vLLM, and the listener ends the container when restarts run out) and `canary_failed` (a restart would
    load the same weights and answer the same way; readiness keeps it out of the Service and says why). `ready` is
    alive only while /health answers 200 within `timeout`: no answer is a hang, 503 a dead engine.
    """
    stopped = read_config_error(state_dir)
    if stopped is not None:
        # A restart would meet the same setting: alive, and readiness says why it takes no traffic.
        return 0, f"alive: {WAITING} {stopped.headline()}"
    try:
        state = read_state(state_dir)
    except T4ServeError as exc:
        return 1, f"not alive: {exc.what} ({exc.found})"
    t = time.time() if now is None else now
    liveness = PHASES[state.phase].liveness
    if liveness == ALIVE_WITHIN_BUDGET:
        bound = loading_bound_s(state)
        if t - state.attempt_started_at > bound:
            return 1, (
                f"not alive: {loading_line(state, t)}, beyond the {fmt_duration(bound)} a cold start (download, "
                "load, compile) is budgeted: wedged"
            )
        return 0, f"alive, loading: {loading_line(state, t)}"
    if liveness == ALIVE:
        return 0, f"alive: {PHASES[state.phase].label} for {fmt_duration(t - state.phase_began_at())}"
    base = local_url(state.host, state.port)
    try:
        health = _get(f"{base}/health", time.monotonic() + timeout)
    except HttpFailure as exc:
        return 1, f"not alive: ready, but {base}/health did not answer within {timeout:g} s ({exc.reason}): hung"
    if health.status != 200:
        dead = " (vLLM's engine is dead)" if health.status >= 500 else ""
        return 1, f"not alive: ready, but {base}/health answered HTTP {health.status}{_moved(health)}{dead}"
    return 0, f"alive: {base}/health answers"
