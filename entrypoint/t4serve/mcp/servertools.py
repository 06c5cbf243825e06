"""The tools of the running server: start it (`compose up` of the t4serve service), stop it, its status and logs, and a
query to the model it serves.

`start_vllm_server` returns only once the container runs and t4serve has written its state, or with the container's
exit code and last log lines. The status is `t4serve status --json` in the container (typed: t4serve.contract); HTTP
to the served model goes through t4serve.httpclient, the project's one client, and the API key is sent only in a
request header.
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Annotated, Any

import anyio
from mcp.server.mcpserver import Context
from pydantic import Field

from t4serve.config.secrets import client_api_key
from t4serve.contract import ContainerFailure, StatusAnswer, read_answer
from t4serve.errors import ConfigError, EngineError, PatchError, PreflightError, T4ServeError
from t4serve.host.engine import API_PORT, Engine, Mount, ServiceContainer
from t4serve.httpclient import HttpFailure, fetch, local_url
from t4serve.mcp.calls import (
    MODEL_HELP,
    SETTINGS_HELP,
    ModelArgument,
    Progress,
    SettingsArgument,
    ToolEnv,
    ToolGroup,
    blocking,
    cap_lines,
    capped,
    given_settings,
    guarded,
    in_thread,
    not_ready,
    validate_settings,
)
from t4serve.mcp.models import MAX_PROMPT_CHARS, ChatMessage, FigureOut, LogsOut, QueryOut, StartOut, StatusOut, StopOut
from t4serve.mcp.registry import READ_ONLY, hints, tool
from t4serve.supervise.phases import CONFIG_ERROR, PHASE_LABELS, PHASES, UNHEALTHY

MAX_LOG_LINES = 500
MAX_LOG_BYTES = 64 * 1024
MAX_QUERY_TOKENS = 1024
QUERY_TIMEOUT_S = 120.0
# start_vllm_server follows the start at most this long when asked to wait, well inside the 60 s many clients allow.
MAX_WAIT_S = 50.0
# start_vllm_server waits this long for the container to run and t4serve to write its state (seconds, usually).
START_CONFIRM_S = 45.0
START_POLL_S = 0.5
# A container waiting after a configuration error holds no requests: its stop needs no drain time.
STOP_CONFIG_ERROR_S = 10
# The log lines a failed start returns.
START_LOG_LINES = 40
# Where start_vllm_server binds a model folder of this host into the container (read-only).
MODEL_MOUNT_ROOT = "/models"


class ServerTools(ToolGroup):
    """Start, stop, status, logs and a query."""

    # Creates a container; a second call while one runs is refused, not repeated.
    @tool("Start the server", "server", hints(read_only=False, destructive=False, idempotent=False, open_world=True))
    @guarded
    async def start_vllm_server(
        self,
        model: Annotated[ModelArgument, Field(description=MODEL_HELP)] = "qat",
        settings: Annotated[SettingsArgument | None, Field(description=SETTINGS_HELP)] = None,
        gpu_device: Annotated[
            str | None,
            Field(
                description="which GPU of this host serves: its index as nvidia-smi numbers them (0, 1, ...) or its "
                "UUID (GPU-...); default 0",
                pattern=r"^[A-Za-z0-9-]{1,64}$",
            ),
        ] = None,
        publish_port: Annotated[
            int | None,
            Field(description="port on 127.0.0.1 the API is published at (default 8000; 0: any free port)", ge=0,
                  le=65535),
        ] = None,
        wait_s: Annotated[
            float,
            Field(description=f"seconds to follow the start after it is under way (0 to {MAX_WAIT_S:g})", ge=0.0,
                  le=MAX_WAIT_S),
        ] = 0.0,
        ctx: Context | None = None,
    ) -> StartOut:
        """Start the server: `compose up` of the t4serve service with this model and settings.

        Returns once the container runs and t4serve has written its state (seconds), or, when the container exits
        at once (a bad setting: exit 2, a failed preflight: exit 3), a tool error with its exit code and last log
        lines. Loading takes minutes after that: poll server_status. A folder model is mounted read-only at
        /models/NAME, a folder drafter (T4SERVE_DRAFT_MODEL) at /models/drafter-NAME. Holds the deployment's lock: a
        concurrent start or stop is answered "busy"."""
        chosen = validate_settings(model, settings, self.env.base_env())
        given = given_settings(settings)
        for name, allowed in (("T4SERVE_PORT", ("8000",)), ("T4SERVE_HOST", ("0.0.0.0", "::"))):
            value = given.get(name)
            if value is not None and value.strip() not in allowed:
                raise ConfigError(
                    f"start_vllm_server: {name} cannot be changed here",
                    found=f"{name}={value}",
                    required=f"the API on container port {API_PORT}, all addresses: compose.yaml publishes that port",
                    fix="leave it out; `publish_port` chooses the port on this host",
                )
        environment = {"T4SERVE_MODEL": chosen.model.requested, **given}
        mounts: list[Mount] = []
        # A folder model, and a folder drafter (T4SERVE_DRAFT_MODEL), each mounted read-only under /models.
        for variable, choice, fallback in (("T4SERVE_MODEL", chosen.model, "model"),
                                           ("T4SERVE_DRAFT_MODEL", chosen.draft_model, "drafter")):
            if choice is None or choice.kind != "local":
                continue
            name = Path(choice.target).name
            safe = name if re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}", name) else fallback
            if variable == "T4SERVE_DRAFT_MODEL":
                safe = f"drafter-{safe}"
            mounts.append(Mount(source=choice.target, target=f"{MODEL_MOUNT_ROOT}/{safe}"))
            environment[variable] = f"{MODEL_MOUNT_ROOT}/{safe}"
        in_container = environment["T4SERVE_MODEL"] if chosen.model.kind == "local" else chosen.model.target
        compose_env: dict[str, str] = {}
        if gpu_device:
            compose_env["T4SERVE_GPU"] = gpu_device
        if publish_port is not None:
            compose_env["T4SERVE_PUBLISH_PORT"] = str(publish_port)
        progress = Progress(ctx)
        with self.env.exclusive("start_vllm_server", ctx):
            container = await blocking(progress, "looking for a running server", self.engine.service)
            if container is not None and container.state in ("running", "restarting"):
                raise EngineError(
                    "start_vllm_server: the server is already running",
                    found=f"container {container.name} ({container.id}) is {container.state}",
                    required="no running t4serve container in this compose project",
                    fix="call stop_vllm_server first, or server_status to follow the running one",
                )
            self._check_token()
            await progress.say(f"compose up: {chosen.model.target}")
            container = await blocking(progress, "compose up", lambda: self.engine.up(environment, compose_env, mounts))
            container, status = await self._confirm_start(progress, container)
        api_url = status.api_url if status is not None else None
        phase = status.phase if status is not None else None
        deadline = time.monotonic() + float(wait_s)
        while status is not None and time.monotonic() < deadline:
            if status.ready or not status.running or (phase in PHASES and PHASES[phase].readiness == UNHEALTHY):
                break
            await anyio.sleep(2.0)
            status = await blocking(progress, "following the start", lambda: read_status(self.env))
            phase = status.phase
            api_url = status.api_url or api_url
            await progress.say(f"{status.phase_label or status.container_state}")
        return StartOut(
            container=container.id,
            container_state=container.state,
            model=chosen.model.target,
            model_in_container=in_container,
            api_url=api_url,
            poll="server_status (and server_logs); ready when its `ready` is true",
            state_written=status is not None,
            phase=phase,
            note="a cold start downloads the checkpoint, loads it, compiles and runs the canary: minutes; "
            "server_status estimates the time left from past starts"
            if status is not None
            else f"the container runs, but t4serve wrote no state within {START_CONFIRM_S:g} s; server_logs shows "
            "what it is doing",
        )

    async def _confirm_start(
        self, progress: Progress, container: ServiceContainer
    ) -> tuple[ServiceContainer, StatusOut | None]:
        """Wait until the container runs and t4serve's state exists (its status, then), or raise with the container's
        exit code and last log lines when it exited (or Docker restarted it) first; None after START_CONFIRM_S."""
        deadline = time.monotonic() + START_CONFIRM_S
        while True:
            seen = await blocking(progress, "waiting for the container", self.engine.service)
            if seen is None:
                raise EngineError(
                    "start_vllm_server: the container is gone",
                    found=f"container {container.name} ({container.id}) was removed while starting",
                    required="the container compose created",
                    fix="another client may have stopped it; server_status, then start again",
                )
            container = seen
            if container.state in ("exited", "dead", "restarting") or container.restart_count > 0:
                raise await self._start_failure(container)
            if container.state == "running":
                status = await blocking(progress, "waiting for t4serve's state", lambda: read_status(self.env))
                if status.phase == CONFIG_ERROR:
                    # It waits for a stop (so compose's restart policy does not loop it): stop it, keep it, and
                    # answer as for a container that exited at once, with its exit code (2) and its log lines.
                    await blocking(progress, "stopping the container that stopped on a configuration error",
                                   lambda: self.engine.stop(STOP_CONFIG_ERROR_S))  # fmt: skip
                    raise await self._start_failure(self.engine.service() or container)
                if status.phase is not None:
                    await progress.say(f"under way: {status.phase_label}")
                    return container, status
            if time.monotonic() >= deadline:
                return container, None
            await progress.say(f"container {container.state}; waiting for t4serve's state")
            await anyio.sleep(START_POLL_S)

    async def _start_failure(self, container: ServiceContainer) -> T4ServeError:
        """The error of a start whose container exited at once: its exit code, its last log lines and the fix."""
        text = await in_thread(lambda: self.engine.logs(container.id, START_LOG_LINES, None))
        lines, _, _ = cap_lines(text, START_LOG_LINES, 8 * 1024)
        code = container.exit_code if container.state != "running" else None
        restarted = f", restarted {container.restart_count} time(s) by Docker" if container.restart_count else ""
        exit_text = f"exit {code}" if code is not None else "exit code not kept (Docker restarted it)"
        fixes = {
            2: "a setting is wrong: the lines above name it and its fix",
            3: "a preflight check failed: the lines above name it (check_host_capacity and verify_gpu_arch say "
            "more); T4SERVE_PREFLIGHT=warn in settings starts anyway",
            4: "the image's Turing clamp is missing: call apply_turing_patch",
        }
        fix = fixes.get(code or 0, "the lines above say why; server_logs has more")
        kind = {2: ConfigError, 3: PreflightError, 4: PatchError}.get(code or 0, EngineError)
        return kind(
            f"start_vllm_server: the container exited at once ({exit_text})",
            found=f"container {container.name} ({container.id}) is {container.state}{restarted}; its last "
            f"{len(lines)} log lines:\n" + "\n".join(f"    {line}" for line in lines),
            required="a container that runs until t4serve has written its state",
            fix=f"{fix}; then stop_vllm_server (it removes the failed container) and start again",
        )

    def _check_token(self) -> None:
        """The HF token where the compose file takes it from: HF_TOKEN in this process's environment, which compose
        inherits (compose.yaml), else the secret file (compose.token-file.yaml: docker-compose 1.29 refuses to start
        without it). Its content is not read here (known_secrets reads it, for redaction only)."""
        if self.env.token_route() == "environment":
            if not self.env.environ.get("HF_TOKEN", "").strip():
                state = "an empty HF_TOKEN" if "HF_TOKEN" in self.env.environ else "no HF_TOKEN"
                raise ConfigError(
                    "start_vllm_server: compose has no HF token to give the server",
                    found=f"{self.env.compose_file.name} reads the token from HF_TOKEN (its hf_token secret); t4serve "
                    f"mcp runs with {state} in its environment, which compose inherits",
                    required="HF_TOKEN in t4serve mcp's environment (compose copies it into the container as a file)",
                    fix="start t4serve mcp with HF_TOKEN=hf_... in its environment (the MCP client's `env`, "
                    "docs/mcp.md), or with --compose-file compose.token-file.yaml and that file's secret file (Gemma "
                    "is gated: accept its licence on huggingface.co)",
                )
            return
        path = self.env.token_file()
        if not path.is_file():
            raise ConfigError(
                "start_vllm_server: the HF token secret file is missing",
                found=f"{path}: no such file",
                required=f"the file {self.env.compose_file.name}'s hf_token secret names (HF_TOKEN_SECRET_FILE, else "
                "./secrets/hf_token)",
                fix=f'mkdir -p {path.parent} && (umask 077 && printf %s "${{HF_TOKEN:?}}" > {path}) && '
                f"chown 1000 {path} (sudo chown unless you are root or uid 1000; Gemma is gated: accept its "
                "licence on huggingface.co)",
            )

    @tool("Stop the server", "server", hints(read_only=False, destructive=True, idempotent=True, open_world=False))
    @guarded
    async def stop_vllm_server(
        self,
        timeout_s: Annotated[
            int, Field(description="seconds vLLM may drain in-flight requests before it is killed (1 to 600)", ge=1,
                       le=600)
        ] = 90,
        ctx: Context | None = None,
    ) -> StopOut:
        """Stop the server and remove its container and network; the cache volumes (downloads, compile caches) stay.

        vLLM drains in-flight requests first, for at most `timeout_s`. Holds the deployment's lock: a concurrent
        start or stop is answered "busy"."""
        progress = Progress(ctx)
        with self.env.exclusive("stop_vllm_server", ctx):
            await progress.say("compose stop")
            before = await blocking(progress, "stopping (vLLM drains first)", lambda: self.engine.down(int(timeout_s)))
        if before is None:
            return StopOut(stopped=False, container=None, was_state=None, note="no t4serve container was there")
        return StopOut(
            stopped=True,
            container=before.id,
            was_state=before.state,
            note="container and network removed; cache volumes kept",
        )

    @tool("Server status", "status", READ_ONLY)
    @guarded
    async def server_status(self, ctx: Context | None = None) -> StatusOut:
        """Where the server is: container state, phase and its duration, figures beside the plan, time to ready.

        Container state and health, vLLM's logged figures beside the plan's predictions, the canary, and the
        time-to-ready estimate from past starts (`t4serve status` in the container). Changes nothing."""
        return await blocking(Progress(ctx), "reading the server's state", lambda: read_status(self.env))

    @tool("Server logs", "status", READ_ONLY)
    @guarded
    async def server_logs(
        self,
        tail: Annotated[
            int, Field(description=f"lines to return, newest last (1 to {MAX_LOG_LINES})", ge=1, le=MAX_LOG_LINES)
        ] = 100,
        since: Annotated[
            str | None,
            Field(
                description="only lines since this time: a duration back (10m, 1h) or a timestamp "
                "(2026-12-03T10:00:00)",
                max_length=40,
                pattern=r"^[0-9A-Za-z:.+-]+$",
            ),
        ] = None,
        ctx: Context | None = None,
    ) -> LogsOut:
        """The server container's last log lines (at most 500 lines and 64 KiB), secrets redacted. Changes nothing."""
        progress = Progress(ctx)
        container = await blocking(progress, "looking for the container", self.engine.service)
        if container is None:
            raise ConfigError(
                "server_logs: no t4serve container",
                found="none in this compose project",
                required="a started server",
                fix="call start_vllm_server",
            )
        text = await blocking(progress, "reading the logs", lambda: self.engine.logs(container.id, int(tail), since))
        lines, truncated, size = cap_lines(text, int(tail), MAX_LOG_BYTES)
        return LogsOut(container=container.id, lines=lines, truncated=truncated, bytes=size)

    # A completion changes nothing on the host; its answer may differ from call to call (temperature).
    @tool("Query the model", "query", hints(read_only=True, destructive=False, idempotent=False, open_world=False))
    @guarded
    async def query(
        self,
        prompt: Annotated[
            str | None, Field(description="text to complete (/v1/completions); or give messages",
                              max_length=MAX_PROMPT_CHARS)
        ] = None,
        messages: Annotated[
            list[ChatMessage] | None, Field(description="a chat (/v1/chat/completions), at most 64 messages; or give "
                                            "prompt", max_length=64)
        ] = None,
        max_tokens: Annotated[
            int, Field(description=f"tokens to generate (1 to {MAX_QUERY_TOKENS})", ge=1, le=MAX_QUERY_TOKENS)
        ] = 64,
        temperature: Annotated[float, Field(description="sampling temperature (0: greedy, up to 2)", ge=0.0,
                                            le=2.0)] = 0.0,
        ctx: Context | None = None,
    ) -> QueryOut:
        """One completion from the served model, with its latency (at most 1,024 tokens, 120 s). Changes nothing.

        Give `prompt` (a plain completion) or `messages` (a chat). The API key, when the server has one, is sent
        only in the request's Authorization header."""
        if (prompt is None) == (messages is None):
            raise ConfigError(
                "query: give exactly one of prompt and messages",
                found="both" if prompt is not None else "neither",
                required="prompt (text) or messages (a chat)",
                fix='e.g. {"prompt": "17*23="}',
            )
        progress = Progress(ctx)
        status = await blocking(progress, "reading the server's state", lambda: read_status(self.env))
        if not status.ready:
            raise not_ready("query", status, "phase ready")
        if status.api_url is None:
            raise ConfigError(
                "query: the server's API is not published on this host",
                found=f"container port {status.api_port} has no published port",
                required="the API's container port published (compose.yaml publishes 8000 on 127.0.0.1)",
                fix="stop_vllm_server, then start_vllm_server (it publishes port 8000; publish_port picks the host's)",
            )
        api_key = client_api_key(self.env.environ, "VLLM_API_KEY")
        body: dict[str, Any] = {"model": status.served_model_name, "max_tokens": max_tokens, "temperature": temperature}
        if messages is not None:
            body["messages"] = [m.model_dump() for m in messages]
            path = "/v1/chat/completions"
        else:
            body["prompt"] = prompt
            path = "/v1/completions"
        url = status.api_url + path
        answer, latency = await blocking(progress, "waiting for the completion",
                                         lambda: post_json(url, body, api_key, QUERY_TIMEOUT_S))  # fmt: skip
        choice = (answer.get("choices") or [{}])[0]
        text = choice.get("text") if messages is None else (choice.get("message") or {}).get("content")
        usage = answer.get("usage") or {}
        return QueryOut(
            text=str(text or ""),
            finish_reason=choice.get("finish_reason"),
            latency_s=round(latency, 4),
            prompt_tokens=usage.get("prompt_tokens"),
            completion_tokens=usage.get("completion_tokens"),
            model=str(status.served_model_name),
        )


def published_url(engine: Engine, container: ServiceContainer, port: int) -> str | None:
    """The URL this host reaches the container's `port` at (its published port), or None when it is not published."""
    published = engine.published_port(container.id, port)
    if published is None:
        return None
    return local_url(*published)


# What server_status runs in the container (t4serve.contract.StatusAnswer).
STATUS_ARGV = ("t4serve", "status", "--json")


def read_status(env: ToolEnv) -> StatusOut:
    """The server as `server_status` reports it: the container, and `t4serve status --json` run in it."""
    from t4serve.supervise.logwatch import compare
    from t4serve.supervise.readout import render_config_error, render_status, time_to_ready

    container = env.engine.service()
    empty: dict[str, Any] = {
        "phase": None,
        "phase_label": None,
        "phase_seconds": None,
        "model": None,
        "served_model_name": None,
        "api_port": None,
        "estimate_to_ready_s": None,
        "figures": [],
        "canary_ok": None,
        "reason": None,
        "diagnosis": None,
        "fix": None,
    }
    if container is None:
        return StatusOut(
            running=False,
            ready=False,
            container=None,
            container_state=None,
            health=None,
            exit_code=None,
            api_url=None,
            text="no t4serve container in this compose project; start_vllm_server starts one",
            **empty,
        )
    running = container.state == "running"
    base: dict[str, Any] = {
        "container": container.id,
        "container_state": container.state,
        "health": container.health,
        "exit_code": None if running else container.exit_code,
    }
    if not running:
        text = (
            f"container {container.name} is {container.state} (exit {container.exit_code}); server_logs shows why"
        )
        return StatusOut(running=False, ready=False, api_url=None, text=text, **base, **empty)
    done = env.engine.exec(container.id, list(STATUS_ARGV))
    now = env.clock()
    try:
        answer = read_answer(StatusAnswer, STATUS_ARGV, done.returncode, done.stdout, done.stderr,
                             container.image or env.engine.image_ref)  # fmt: skip
    except ContainerFailure as exc:
        if exc.container_exit_code != ConfigError.exit_code:
            raise
        # The container's t4serve has no readable state yet (serve writes it within seconds of the start).
        api_url = published_url(env.engine, container, API_PORT)
        text = f"the server has no state yet: {exc.what}" + (f" ({exc.found})" if exc.found else "")
        return StatusOut(running=True, ready=False, api_url=api_url, text=capped(text), **base, **empty)
    stopped = answer.config_error
    if stopped is not None or answer.state is None:
        # compose.yaml's T4SERVE_ON_CONFIG_ERROR=wait: serve printed the error and waits instead of exiting.
        api_url = published_url(env.engine, container, API_PORT)
        fields = {**empty, "phase": answer.phase, "phase_label": PHASE_LABELS[answer.phase]}
        if stopped is not None:
            fields.update(phase_seconds=max(0.0, now - stopped.stopped_at) if stopped.stopped_at > 0 else None,
                          reason=capped(stopped.what), diagnosis=stopped.found and capped(stopped.found),
                          fix=stopped.fix and capped(stopped.fix))  # fmt: skip
        text = render_config_error(stopped, now) if stopped is not None else f"phase {PHASE_LABELS[answer.phase]}"
        return StatusOut(running=True, ready=False, api_url=api_url, text=capped(text), **base, **fields)
    state = answer.state
    api_url = published_url(env.engine, container, state.port)
    figures = [
        FigureOut(
            name=c.name, logged=c.measured, predicted=c.predicted, unit=c.unit, deviation=c.deviation, how=c.how
        )
        for c in compare(state.figures, state.predictions)
    ]
    compared = {f.name for f in figures}
    figures += [
        FigureOut(name=f.name, logged=f.value, predicted=None, unit=f.unit, deviation=None, how="")
        for f in state.figures.values()
        if f.name not in compared
    ]
    figures += [
        FigureOut(name=p.name, logged=None, predicted=p.value, unit=p.unit, deviation=None, how=p.how)
        for name, p in state.predictions.items()
        if name not in state.figures
    ]
    return StatusOut(
        running=True,
        ready=state.phase == "ready",
        api_url=api_url,
        api_port=state.port,
        phase=state.phase,
        phase_label=PHASE_LABELS[state.phase],
        phase_seconds=max(0.0, now - state.phase_began_at()),
        model=state.model,
        served_model_name=state.served_model_name,
        estimate_to_ready_s=time_to_ready(state, now),
        figures=figures,
        canary_ok=state.canary.ok if state.canary is not None else None,
        reason=state.reason,
        diagnosis=state.diagnosis,
        fix=state.fix,
        text=render_status(state, now),
        **base,
    )


def post_json(url: str, body: dict[str, Any], api_key: str | None, timeout: float) -> tuple[dict[str, Any], float]:
    """POST `body` as JSON through t4serve's HTTP client (no redirects followed, no proxy, bounded in time and size);
    (the JSON answer, seconds it took). The key goes only in the Authorization header."""
    began = time.monotonic()
    try:
        answer = fetch("POST", url, deadline_s=timeout, api_key=api_key, json_body=body)
    except HttpFailure as exc:
        raise ConfigError(
            f"query: no answer from {url}",
            found=exc.reason,
            required=f"an answer within {timeout:g} s",
            fix="server_status, then server_logs",
        ) from None
    latency = time.monotonic() - began
    if answer.status != 200:
        if answer.status == 401:
            fix = "give t4serve mcp the server's key: T4SERVE_API_KEY_FILE (or T4SERVE_API_KEY) in its environment"
        elif answer.redirect:
            fix = f"the server redirects to {answer.location}; redirects are not followed (the key would go along)"
        else:
            fix = "server_logs shows the server's side"
        raise ConfigError(
            f"query: the server answered HTTP {answer.status}", found=answer.text(), required="HTTP 200", fix=fix
        )
    try:
        data = answer.json("the server's answer")
    except HttpFailure as exc:
        raise ConfigError(
            "query: the answer is not JSON",
            found=f"{exc.reason}: {answer.text(200)}",
            required="an OpenAI-style JSON answer",
            fix="server_logs shows the server's side",
        ) from None
    if not isinstance(data, dict):
        raise ConfigError(
            "query: unexpected answer",
            found=str(data)[:200],
            required="a JSON object",
            fix="server_logs shows the server's side",
        )
    return data, latency
