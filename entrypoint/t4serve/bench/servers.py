"""The servers `t4serve bench` starts: `t4serve serve` itself, one model at a time, as a user runs it, so the server
measured is the one users run: preflight, the compile ladder, the canary and supervision all apply.

Each server is `python -m t4serve serve` with its settings in its environment: this process's environment (the
settings a user gave, the API key and HF token as serve reads them), the model, T4SERVE_ON_CONFIG_ERROR=exit (a
setting that cannot work ends it instead of waiting) and a state folder of its own in the result folder
(`servers/MODEL/`: its state.json keeps vLLM's figures beside the plan's). Every model after the first also gets the
first model's sized flags as settings (t4serve.planning.plan.sized_settings), so only the checkpoint differs between
them; a note says where a model's own plan would have differed. A server is ready when t4serve's own readiness says so
(t4serve.supervise.health.check: the phase ready after the canary, /health and /v1/models answering); one that exits
first, fails its canary or does not get there in time is a BenchError with its log's tail. It is stopped as `docker
stop` stops the container: SIGTERM to `t4serve serve`, which drains vLLM; whatever outlives the grace is killed.
"""

from __future__ import annotations

import contextlib
import shlex
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from t4serve.bench.results import model_label
from t4serve.errors import BenchError, T4ServeError
from t4serve.httpclient import local_url
from t4serve.supervise.children import stop_child
from t4serve.supervise.health import check
from t4serve.supervise.render import STOP_MARGIN_S
from t4serve.supervise.state import RUN_SPEC_FILE, read_run_spec, read_state
from t4serve.untrusted import Untrusted, read_tail_bounded

LOG_TAIL_LINES = 15
# Seconds between two readiness checks while a server starts.
POLL_S = 1.0
# Beyond serve's own stop (vLLM's drain, then supervisord's STOP_MARGIN_S), seconds before what is left is killed.
KILL_MARGIN_S = 15.0


def tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    """The last lines of a log, read from its last 64 KiB only (a server's log may be gigabytes)."""
    try:
        text = read_tail_bounded(path, 64 * 1024, "the log").decode("utf-8", errors="replace")
    except (OSError, Untrusted):
        return ""
    return "\n".join(text.rstrip().splitlines()[-lines:])


@dataclass(frozen=True)
class BenchServer:
    """One model's `t4serve serve`: the settings bench gives it on top of its own environment (never a secret: serve
    reads those from the environment itself), its state folder, and how long its stop may take."""

    model: str
    settings: dict[str, str]
    state_dir: Path
    # The plan's --shutdown-timeout: vLLM drains this long on SIGTERM.
    shutdown_timeout: int

    def argv(self) -> list[str]:
        return [sys.executable, "-m", "t4serve", "serve"]

    def describe(self) -> str:
        return " ".join(f"{k}={shlex.quote(v)}" for k, v in self.settings.items()) + " t4serve serve"


def plan_servers(models: list[str], environ: Mapping[str, str],
                 folder: Path) -> tuple[dict[str, BenchServer], list[str]]:
    """Each model's server, every model after the first with the first one's sized flags as settings; and a note for
    each model whose own plan differs from those."""
    from t4serve.config.settings import Settings
    from t4serve.pipeline import gather_facts, prepare
    from t4serve.planning.plan import Plan, sized_settings, without_option

    servers: dict[str, BenchServer] = {}
    notes: list[str] = []
    reference: Plan | None = None
    for model in models:
        settings = Settings.from_environ(environ, overrides={"T4SERVE_MODEL": model})
        own, _findings = prepare(settings, gather_facts(settings, environ))
        pinned: dict[str, str] = {}
        if reference is None:
            reference = own
        else:
            pinned = sized_settings(reference)
            mine = without_option(own.argv[3:], "--served-model-name")
            if mine != without_option(reference.argv[3:], "--served-model-name"):
                notes.append(f"{model}: its own plan's flags differ ({shlex.join(mine)}); it ran with {models[0]}'s "
                             f"sized settings ({', '.join(f'{k}={v}' for k, v in pinned.items())}) so that only the "
                             "checkpoint differs")
        state_dir = folder / "servers" / model_label(model)
        servers[model] = BenchServer(
            model=model,
            settings={"T4SERVE_MODEL": model, "T4SERVE_STATE_DIR": str(state_dir), "T4SERVE_ON_CONFIG_ERROR": "exit",
                      **pinned},
            state_dir=state_dir,
            shutdown_timeout=settings.shutdown_timeout,
        )
    return servers, notes


@dataclass(frozen=True)
class Started:
    """A server that is ready: where it answers, and the checkpoint it serves (its tokenizer by default)."""

    url: str
    checkpoint: str


@contextlib.contextmanager
def running_server(server: BenchServer, log: Path, ready_timeout: float, environ: Mapping[str, str],
                   api_key: str | None = None) -> Iterator[Started]:
    """`t4serve serve` for `server`, ready, and stopped (SIGTERM, as `docker stop` does) when the block ends."""
    env = {**environ, **server.settings}
    server.state_dir.mkdir(parents=True, exist_ok=True)
    with log.open("wb") as out:
        proc = subprocess.Popen(server.argv(), stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        try:
            yield wait_ready(server, proc, ready_timeout, log, api_key)
        finally:
            stop_server(proc, server.shutdown_timeout + STOP_MARGIN_S + KILL_MARGIN_S)


def wait_ready(server: BenchServer, proc: subprocess.Popen[bytes], timeout: float, log: Path,
               api_key: str | None) -> Started:
    """Until t4serve's readiness answers 0; `serve` exiting, the canary failing or the timeout is a BenchError with the
    log's tail."""
    deadline = time.monotonic() + timeout
    line = "not started"
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise BenchError(
                f"t4serve serve exited with code {proc.returncode} before it was ready",
                found=f"last lines of {log}:\n{tail(log)}",
                required="a server that passes preflight, loads, answers /health and passes the canary",
                fix="read the log above (exit 2: a setting, 3: a preflight check); `t4serve preflight` with the same "
                "settings names the checks",
            )
        code, line = check(server.state_dir, api_key=api_key)
        if code == 0:
            state = read_state(server.state_dir)
            spec = read_run_spec(server.state_dir / RUN_SPEC_FILE)
            return Started(local_url(state.host, state.port), spec.model)
        if phase_of(server.state_dir) == "canary_failed":
            raise BenchError(
                "the server's canary failed: it answers, but wrongly",
                found=line,
                required="the canary's fixed greedy completion answered correctly",
                fix=f"read {log}; `t4serve status --state-dir {server.state_dir}` shows the canary's answer",
            )
        time.sleep(POLL_S)
    raise BenchError(
        f"t4serve serve was not ready within {timeout:.0f} s",
        found=f"{line}; last lines of {log}:\n{tail(log)}",
        required="t4serve's healthcheck answering ready",
        fix="raise --ready-timeout for a cold start, or read the log",
    )


def phase_of(state_dir: Path) -> str | None:
    """The phase the state folder holds, or None before serve has written a readable state."""
    try:
        return read_state(state_dir).phase
    except T4ServeError:
        return None


def stop_server(proc: subprocess.Popen[bytes], grace: float) -> None:
    """SIGTERM to `t4serve serve` (it forwards it to supervisord, which drains vLLM), a bounded wait, then SIGKILL to
    it and every process below it (vLLM's engine core must not outlive its server)."""
    stop_child(proc, grace)
