"""The MCP tools of `t4serve mcp`: thin wrappers over the functions the CLI commands call, with typed results.

Each tool calls what its command calls (hostcheck for `host-check`, pipeline + plan for `plan`, the preflight checks,
`t4serve status --json` / `patch verify` / `bench` in the container) and returns the result as a pydantic model, so
the SDK publishes an output schema and structured content. The Docker side is `t4serve.host.engine.Engine`, the one
adapter to the engine; HTTP to the served model goes through `t4serve.httpclient`, the project's one client. A failure
a user can meet becomes a tool error reading "what failed / found / required / fix" (never a traceback); a bug
becomes a tool error saying so.

Under a real client: every blocking call runs in a worker thread and reports progress (notifications/progress, when
the client sent a progress token) while it lasts; a cancelled call (notifications/cancelled) stops the Docker clients
it started, a throwaway container with them (t4serve.host.engine.cancelled_by). The tools that change the deployment
(start, stop, the image build, a benchmark's start) hold its lock (t4serve.mcp.deploylock), so a second such call is
told who is busy instead of racing. `start_vllm_server` returns only once the container runs and t4serve has written its
state, or with the container's exit code and last log lines.

Secrets never leave: the HF token is not passed anywhere, the API key is sent to the server only in a request header,
and every result and error (structured fields included) has any secret this process knows replaced by `<redacted>`.
To know them it reads the variables and the secret files they name (known_secrets), for redaction only.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import shutil
import threading
import time
import traceback
import uuid
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal, ParamSpec, TypeVar, cast

import anyio
import anyio.to_thread
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ToolAnnotations
from pydantic import BaseModel, ConfigDict, Field

from t4serve import __version__
from t4serve.config.secrets import client_api_key
from t4serve.config.settings import VARIABLES_BY_NAME, Settings
from t4serve.errors import ConfigError, EngineError, PatchError, PreflightError, T4ServeError
from t4serve.facts import Facts
from t4serve.host.engine import (
    API_PORT,
    MANIFEST_PATH,
    Cancelled,
    Engine,
    Mount,
    ServiceContainer,
    cancelled_by,
    client_json,
)
from t4serve.httpclient import HttpFailure, fetch, local_url
from t4serve.mcp.deploylock import Holder, hold, lock_file
from t4serve.preflight import Finding, check_clamp, has_failures
from t4serve.probes.gpu import Nvml
from t4serve.serde import from_dict
from t4serve.untrusted import REDACTED, Untrusted, printable, read_text_bounded, shown

P = ParamSpec("P")
R = TypeVar("R")

MAX_LOG_LINES = 500
MAX_LOG_BYTES = 64 * 1024
MAX_QUERY_TOKENS = 1024
MAX_PROMPT_CHARS = 32_000
QUERY_TIMEOUT_S = 120.0
VERIFY_TIMEOUT_S = 1200.0
BENCH_TEXT_BYTES = 32 * 1024
# A secret file holds one token; a larger file is not one (t4serve.config.secrets reads them with the same cap).
SECRET_FILE_MAX_BYTES = 64 * 1024
# start_vllm_server follows the start at most this long when asked to wait, well inside the 60 s many clients allow.
MAX_WAIT_S = 50.0
# start_vllm_server waits this long for the container to run and t4serve to write its state (seconds, usually).
START_CONFIRM_S = 45.0
START_POLL_S = 0.5
# The log lines a failed start returns.
START_LOG_LINES = 40
# A blocking call reports progress this often; a cancelled one is given this long to stop its clients.
HEARTBEAT_S = 2.0
STOP_WAIT_S = 30.0
RUN_ID = re.compile(r"^[0-9]{8}-[0-9]{6}-[0-9a-f]{6}$")
BENCH_ROOT = "/cache/t4serve/bench"
# Where start_vllm_server binds a model folder of this host into the container (read-only).
MODEL_MOUNT_ROOT = "/models"
# Settings a tool may not pass: secrets, and the files that hold them (compose.yaml's secrets carry those).
REFUSED_SETTINGS = ("HF_TOKEN", "HF_TOKEN_FILE", "T4SERVE_API_KEY", "T4SERVE_API_KEY_FILE")
# A bench progress line ("[####......] 3/8 qat in=512 c=1 r=1: ..."): runs done and planned.
BENCH_PROGRESS = re.compile(r"^\[[#.]+\] ([0-9]+)/([0-9]+) ", re.MULTILINE)

MODEL_HELP = (
    "checkpoint: qat (int4 weights, the default), bf16, a Hugging Face repo id org/name, or a folder on this host "
    "holding config.json (start_vllm_server mounts it read-only into the container)"
)
SETTINGS_HELP = (
    "container settings by variable name, values as text, e.g. {\"T4SERVE_MAX_MODEL_LEN\": \"8192\"}; names from "
    "`t4serve env`; secrets are refused"
)

# ----- results -------------------------------------------------------------------------------------------------


class FindingOut(BaseModel):
    """One check: level ok / warn / fail, what was found, what is required, and the fix (empty when ok)."""

    check: str
    level: Literal["ok", "warn", "fail"]
    found: str
    required: str
    fix: str


class Checks(BaseModel):
    ok: bool = Field(description="no check failed")
    failed: int
    warnings: int
    findings: list[FindingOut]


class HostCapacity(Checks):
    compose_file: str
    image: str


class GpuOut(BaseModel):
    index: int
    name: str
    compute_capability: str
    memory_total_bytes: int


class GpuArch(Checks):
    driver_version: str | None
    cuda_driver_version: str | None
    gpus: list[GpuOut]
    image: str
    torch_version: str | None
    torch_cuda_version: str | None
    torch_arch_list: list[str]


class ClampOut(BaseModel):
    state: str
    vllm_version: str
    shared_memory: dict[str, int]
    unpatched_shared_memory: int | None
    interpreter_max_abs_error: float | None


class TuringPatch(BaseModel):
    ok: bool = Field(description="the proof in the manifest holds and `t4serve patch verify` passed in the image")
    image: str
    clamp: ClampOut | None
    verify_exit_code: int
    verify_output: str = Field(description="the last lines of `t4serve patch verify`")
    findings: list[FindingOut]


class ManifestOut(BaseModel):
    image: str
    image_id: str
    size_bytes: int
    build_exit_code: int
    build_output: str = Field(description="the last lines of scripts/build-image")
    manifest: dict[str, Any]


class PlanOut(BaseModel):
    command_line: str
    summary: str
    plan: dict[str, Any]
    settings: dict[str, Any]
    findings: list[FindingOut]


class StartOut(BaseModel):
    container: str
    container_state: str
    model: str = Field(description="the checkpoint: a repo id, or the folder on this host")
    model_in_container: str = Field(description="what the container serves (a host folder: where it is mounted)")
    api_url: str | None
    poll: str = Field(description="what to call to follow the start")
    state_written: bool = Field(description="t4serve in the container has written its state (it is under way)")
    phase: str | None
    note: str


class FigureOut(BaseModel):
    name: str
    logged: float | None
    predicted: float | None
    unit: str
    deviation: float | None = Field(description="(logged - predicted) / predicted")
    how: str


class StatusOut(BaseModel):
    running: bool
    ready: bool
    container: str | None
    container_state: str | None
    health: str | None
    exit_code: int | None
    phase: str | None
    phase_label: str | None
    phase_seconds: float | None
    model: str | None
    served_model_name: str | None
    api_port: int | None = Field(description="the API's port inside the container")
    api_url: str | None = Field(description="the API as this host reaches it (its published port)")
    estimate_to_ready_s: float | None
    figures: list[FigureOut]
    canary_ok: bool | None
    reason: str | None
    diagnosis: str | None
    fix: str | None
    text: str


class LogsOut(BaseModel):
    container: str
    lines: list[str]
    truncated: bool = Field(description="older lines were dropped to stay within the byte cap")
    bytes: int


class StopOut(BaseModel):
    stopped: bool
    container: str | None
    was_state: str | None
    note: str


class QueryOut(BaseModel):
    text: str
    finish_reason: str | None
    latency_s: float
    prompt_tokens: int | None
    completion_tokens: int | None
    model: str


class BenchStart(BaseModel):
    run_id: str
    container: str
    output_dir: str
    poll: str


class BenchCell(BaseModel):
    """One cell of the sweep (model, input length, concurrency) over its repeats, as report.md tabulates it."""

    model: str
    input_len: int = Field(description="prompt tokens")
    concurrency: int = Field(description="concurrent streams")
    repeats_ok: int
    repeats_failed: int
    completed_requests: int
    failed_requests: int
    throughput_tok_s: float | None = Field(description="generated tokens per second, all streams (median of repeats)")
    per_stream_tok_s: float | None = Field(description="1000 / median time per output token")
    ttft_ms: float | None = Field(description="median time to first token")
    variation_pct: float | None = Field(description="(max - min) / median throughput over repeats")
    errors: list[str]


class BenchStatus(BaseModel):
    run_id: str
    state: Literal["running", "done", "failed"]
    exit_code: int | None
    runs_done: int | None = Field(description="runs finished so far (from the log)")
    runs_planned: int | None
    log_tail: str
    report_md: str | None
    cells: list[BenchCell] = Field(description="the report's figures, once the benchmark has ended")
    host_folder: str | None = Field(description="the result folder copied to this host when done")
    plots: list[str]


class ChatMessage(BaseModel):
    role: Literal["system", "user", "assistant"]
    content: str = Field(max_length=MAX_PROMPT_CHARS)


# ----- helpers -------------------------------------------------------------------------------------------------


def _not_ready(tool: str, status: StatusOut, required: str) -> ConfigError:
    """The one refusal of a tool that needs a ready server, naming the phase it found."""
    return ConfigError(
        f"{tool}: the server is not ready",
        found=f"phase {status.phase_label or status.container_state or 'no container'}",
        required=required,
        fix="call server_status until ready (start_vllm_server if none is running)",
    )


def finding_out(f: Finding) -> FindingOut:
    return FindingOut(check=f.check, level=f.level, found=f.found, required=f.required, fix=f.fix)  # type: ignore[arg-type]


def checks_fields(findings: Sequence[Finding]) -> dict[str, Any]:
    return {
        "ok": not has_failures(findings),
        "failed": sum(f.level == "fail" for f in findings),
        "warnings": sum(f.level == "warn" for f in findings),
        "findings": [finding_out(f) for f in findings],
    }


# What a tool error may hold: the SDK sends it to the client and logs it, so an argument of megabytes quoted back in a
# message must be cut (untrusted.shown cuts each quoted value; this bounds the whole).
MAX_ERROR_CHARS = 4000


def capped(message: str) -> str:
    """A message as a tool error carries it: at most MAX_ERROR_CHARS, said where cut."""
    if len(message) <= MAX_ERROR_CHARS:
        return message
    return message[:MAX_ERROR_CHARS] + f"... (cut: {len(message):,} characters in all)"


def guarded(fn: Callable[P, Awaitable[R]]) -> Callable[P, Awaitable[R]]:
    """Errors as tool errors: t4serve's own with found / required / fix; anything else as a bug, one line. The result
    and the error text have every secret this process knows redacted, structured fields included."""

    @functools.wraps(fn)
    async def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        owner = args[0] if args else None
        secrets = owner.env.secrets() if isinstance(owner, Tools) else []
        try:
            result = await fn(*args, **kwargs)
        except ToolError as exc:
            raise ToolError(capped(redact(str(exc), secrets))) from None
        except T4ServeError as exc:
            raise ToolError(capped(redact(exc.message(), secrets))) from None
        except Cancelled as exc:
            # Only reached when the engine stopped a client for a cancellation this call did not see itself.
            raise ToolError(f"{fn.__name__}: cancelled ({exc})") from None
        except Exception as exc:
            frames = traceback.extract_tb(exc.__traceback__)
            where = f" at {Path(frames[-1].filename).name}:{frames[-1].lineno}" if frames else ""
            raise ToolError(
                redact(
                    f"{fn.__name__} failed: internal error (a bug in t4serve; please report it with this line)\n"
                    f"  found: {type(exc).__name__}: {shown(str(exc), 500)}{where}",
                    secrets,
                )
            ) from None
        return redact_result(result, secrets)

    return wrapper


def known_secrets(environ: Mapping[str, str], files: Sequence[Path] = ()) -> list[str]:
    """Secrets this process can know, to redact from text that comes back: the API key and the HF token, from the
    variables, the files they name, and `files` (compose's HF token secret file, where compose finds it)."""
    values = [environ.get(name, "") for name in ("HF_TOKEN", "T4SERVE_API_KEY", "VLLM_API_KEY", "OPENAI_API_KEY")]
    names = ("HF_TOKEN_FILE", "T4SERVE_API_KEY_FILE", "HF_TOKEN_SECRET_FILE")
    for path in [*(environ.get(name) for name in names), *map(str, files)]:
        if path:
            try:
                # Bounded and non-blocking: a FIFO or /dev/zero named here must not hold or fill this process.
                values.append(read_text_bounded(Path(path), SECRET_FILE_MAX_BYTES, "the secret file").strip())
            except (OSError, Untrusted):
                continue
    return [v for v in values if len(v) >= 8]


def redact(text: str, secrets: Sequence[str]) -> str:
    for secret in secrets:
        text = text.replace(secret, REDACTED)
    return text


def redact_value(value: Any, secrets: Sequence[str]) -> Any:
    """`value` (JSON-like: dicts, lists, text) with every secret replaced in every string, keys included."""
    if isinstance(value, str):
        return redact(value, secrets)
    if isinstance(value, dict):
        return {redact_value(k, secrets): redact_value(v, secrets) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [redact_value(v, secrets) for v in value]
    return value


def redact_result(result: R, secrets: Sequence[str]) -> R:
    """A tool's result with every secret redacted: a model is rebuilt from its redacted fields when any holds one."""
    if not secrets or not isinstance(result, BaseModel):
        return result
    if not any(secret in result.model_dump_json() for secret in secrets):
        return result
    return cast(R, type(result).model_validate(redact_value(result.model_dump(mode="json"), secrets)))


def cap_lines(text: str, max_lines: int, max_bytes: int) -> tuple[list[str], bool, int]:
    """The last `max_lines` lines of `text` whose UTF-8 size fits `max_bytes` (newest kept), and whether any line
    was dropped for the byte cap."""
    lines = text.splitlines()[-max_lines:]
    kept: list[str] = []
    size = 0
    for line in reversed(lines):
        encoded = len(line.encode("utf-8")) + 1
        if encoded > max_bytes:
            line = line.encode("utf-8")[: max(0, max_bytes - size - 1)].decode("utf-8", "ignore")
            encoded = len(line.encode("utf-8")) + 1
        if size + encoded > max_bytes:
            return list(reversed(kept)), True, size
        kept.append(line)
        size += encoded
    return list(reversed(kept)), False, size


def tail_text(text: str, max_bytes: int) -> str:
    data = text.encode("utf-8")
    return data[-max_bytes:].decode("utf-8", "ignore") if len(data) > max_bytes else text


def validate_settings(model: str | None, settings: Mapping[str, str], base: Mapping[str, str]) -> Settings:
    """The container's settings a tool was given, checked by t4serve's own parser (every bad value in one error)."""
    for name in settings:
        if name in REFUSED_SETTINGS:
            raise ConfigError(
                f"settings: {name} cannot be passed through a tool",
                found=f"{name} in the settings",
                required="no secrets in tool arguments (they would pass through the assistant)",
                fix="the HF token goes in compose.yaml's hf_token secret file; the API key as docs/operations.md's "
                "'Exposing the port' describes",
            )
        if name == "T4SERVE_MODEL":
            raise ConfigError(
                "settings: T4SERVE_MODEL is the tool's `model` argument",
                found="T4SERVE_MODEL in the settings",
                required="the checkpoint in `model`",
                fix='e.g. {"model": "bf16"}',
            )
        if name not in VARIABLES_BY_NAME:
            raise ConfigError(
                f"settings: {shown(name, 80)} is not a t4serve setting",
                found=shown(name),
                required="names from `t4serve env` (e.g. T4SERVE_MAX_MODEL_LEN, T4SERVE_DTYPE)",
                fix="run `t4serve env` for the table",
            )
    overrides = dict(settings)
    if model:
        overrides["T4SERVE_MODEL"] = model
    return Settings.from_environ(dict(base), overrides=overrides)


class Progress:
    """The progress notifications of one tool call: each says what the call is doing; its value is the seconds since
    the call began (always rising, as the protocol requires). Sent only when the client asked (a progress token)."""

    def __init__(self, ctx: Context | None) -> None:
        self.ctx = ctx
        self.began = time.monotonic()
        self.last = -1.0
        self.doing = ""

    def elapsed(self) -> float:
        return time.monotonic() - self.began

    async def say(self, message: str) -> None:
        self.doing = message
        if self.ctx is None:
            return
        value = max(round(self.elapsed(), 3), round(self.last + 0.001, 3))
        self.last = value
        try:
            await self.ctx.report_progress(value, None, message[:300])
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, ValueError):
            # The client went away (or this is no request): the work goes on; its end decides what happens.
            self.ctx = None


async def blocking(progress: Progress | None, doing: str | Callable[[], str] | None, fn: Callable[[], R]) -> R:
    """Run `fn` in a worker thread: progress every HEARTBEAT_S while it runs (`doing` says what; a callable is asked
    each time), and when the call is cancelled (notifications/cancelled), every Docker client `fn` started is stopped
    (t4serve.host.engine.cancelled_by) before the cancellation goes on. `fn`'s exception, if any, is raised as it is."""
    cancel = threading.Event()
    finished = threading.Event()
    box: dict[str, Any] = {}

    def work() -> None:
        try:
            with cancelled_by(cancel):
                box["value"] = fn()
        except BaseException as exc:
            box["error"] = exc
        finally:
            finished.set()

    async def heartbeat() -> None:
        assert progress is not None
        while True:
            await anyio.sleep(HEARTBEAT_S)
            text = doing() if callable(doing) else (doing or progress.doing)
            await progress.say(f"{text} ({progress.elapsed():.0f} s)")

    try:
        async with anyio.create_task_group() as group:
            if progress is not None and progress.ctx is not None:
                group.start_soon(heartbeat)
            await anyio.to_thread.run_sync(work, abandon_on_cancel=True)
            group.cancel_scope.cancel()
    except anyio.get_cancelled_exc_class():
        cancel.set()
        with anyio.CancelScope(shield=True), anyio.move_on_after(STOP_WAIT_S):
            while not finished.is_set():
                await anyio.sleep(0.05)
        raise
    if "error" in box:
        raise box["error"]
    value: R = box["value"]
    return value


async def in_thread(fn: Callable[[], R]) -> R:
    """A short blocking call (an engine query, a file read), cancellable like any other."""
    return await blocking(None, None, fn)


def client_name(ctx: Context | None) -> str:
    """The MCP client as it named itself in `initialize` (name and version), for the lock's holder record."""
    try:
        params = ctx.session.client_params if ctx is not None else None
        info = params.client_info if params is not None else None
    except (AttributeError, ValueError):
        info = None
    if info is None:
        return "unnamed client"
    return f"{info.name} {info.version}".strip()[:80]


@dataclass
class ToolEnv:
    """What the tools work with: the engine, this process's environment, and a host folder for results and locks."""

    engine: Engine
    environ: Mapping[str, str]
    data_dir: Path
    compose_file: Path
    clock: Callable[[], float] = time.time
    # The NVML module the host probes read (None: pynvml); tests give a double.
    nvml: Nvml | None = None

    def secrets(self) -> list[str]:
        return known_secrets(self.environ, [self.token_file()])

    def token_file(self) -> Path:
        """compose.yaml's hf_token secret file as compose finds it: HF_TOKEN_SECRET_FILE, else ./secrets/hf_token,
        a relative path from the compose project's folder."""
        raw = self.environ.get("HF_TOKEN_SECRET_FILE") or "./secrets/hf_token"
        return Path(raw) if Path(raw).is_absolute() else self.engine.project_directory / raw

    def base_env(self) -> dict[str, str]:
        """Host-side settings that planning reads (where the HF cache is, whether to go online)."""
        return {k: v for k, v in self.environ.items() if k in ("HF_HOME", "HF_HUB_OFFLINE", "XDG_CACHE_HOME")}

    def deployment(self) -> str:
        """The deployment as Docker sees it: the compose project (compose's default: the folder's name, as compose
        normalises it) on this engine (DOCKER_HOST, else the local one)."""
        project = self.engine.project or re.sub(r"[^-_a-z0-9]", "", self.engine.project_directory.name.lower())
        return f"{project}@{self.environ.get('DOCKER_HOST') or 'local'}"

    @contextlib.contextmanager
    def exclusive(self, tool: str, ctx: Context | None) -> Iterator[None]:
        """Hold the deployment's lock for a state-changing tool, or fail at once saying who holds it."""
        holder = Holder(tool=tool, pid=os.getpid(), client=client_name(ctx), since=self.clock())
        with hold(lock_file(self.data_dir, self.deployment()), holder):
            yield


# ----- the tools -----------------------------------------------------------------------------------------------


class Tools:
    """One method per tool; `build_server(env, modes)` publishes them. A tool's docstring is its description: the
    first line its purpose, then how it behaves."""

    def __init__(self, env: ToolEnv) -> None:
        self.env = env
        self.engine = env.engine

    # --- host and image checks
    @guarded
    async def check_host_capacity(
        self, model: Annotated[str | None, Field(description=MODEL_HELP)] = None, ctx: Context | None = None
    ) -> HostCapacity:
        """Check this host can run the server: driver, container toolkit, disk, memory, /dev/shm.

        NVIDIA driver, NVIDIA Container Toolkit configured for Docker, free space on Docker's data root for the image
        and cache volumes, RAM + swap (and compose's memory limit) against the checkpoint's load need, compose's
        /dev/shm. Same checks as `t4serve host-check`; changes nothing."""
        from t4serve.host.hostcheck import check_host

        settings = validate_settings(model, {}, self.env.base_env())
        findings = await blocking(
            Progress(ctx),
            "checking the host",
            lambda: check_host(settings, self.env.environ, self.engine, self.env.compose_file, nvml=self.env.nvml),
        )
        return HostCapacity(
            compose_file=str(self.env.compose_file), image=self.engine.image_ref, **checks_fields(findings)
        )

    def _facts(self, settings: Settings) -> Facts:
        from t4serve.host.hostcheck import host_facts

        info = self.engine.info()
        return host_facts(
            settings, self.env.environ, self.engine, info=info, image=self.engine.image(), nvml=self.env.nvml
        )

    @guarded
    async def verify_gpu_arch(self, ctx: Context | None = None) -> GpuArch:
        """Check each GPU of this host against the image: compute capability in torch's arch list, driver new enough.

        Reads the GPUs with NVML and the image's build manifest (in a throwaway container); the driver must carry
        the image's CUDA 13 build. Changes nothing."""
        from t4serve.host.hostcheck import arch_findings

        settings = validate_settings(None, {}, self.env.base_env())
        facts = await blocking(Progress(ctx), "reading the GPUs and the manifest", lambda: self._facts(settings))
        gpu, manifest = facts.gpu, facts.manifest
        cuda = f"{gpu.cuda_driver_version[0]}.{gpu.cuda_driver_version[1]}" if gpu.cuda_driver_version else None
        return GpuArch(
            driver_version=gpu.driver_version,
            cuda_driver_version=cuda,
            gpus=[
                GpuOut(
                    index=d.index,
                    name=d.name,
                    compute_capability=f"{d.compute_capability[0]}.{d.compute_capability[1]}",
                    memory_total_bytes=d.memory_total_bytes,
                )
                for d in gpu.devices
            ],
            image=self.engine.image_ref,
            torch_version=manifest.torch_version,
            torch_cuda_version=manifest.torch_cuda_version,
            torch_arch_list=list(manifest.torch_arch_list),
            **checks_fields(arch_findings(facts)),
        )

    @guarded
    async def verify_turing_patch(
        self,
        skip_interpreter: Annotated[
            bool, Field(description="skip the Triton-interpreter check of the clamp (about a minute less)")
        ] = False,
        ctx: Context | None = None,
    ) -> TuringPatch:
        """Check the Turing attention clamp baked into the image: its manifest proof, and `patch verify` run again.

        `t4serve patch verify` runs in a throwaway container of the image (up to 20 minutes; progress is reported;
        a cancellation removes the container). Changes nothing."""
        from t4serve.planning.plan import plan as make_plan

        progress = Progress(ctx)
        settings = validate_settings(None, {}, self.env.base_env())
        facts = await blocking(progress, "reading the image's manifest", lambda: self._facts(settings))
        manifest = facts.manifest
        if not manifest.present:
            raise EngineError(
                "verify_turing_patch: the image has no build manifest",
                found=manifest.error or "missing",
                required=f"the t4serve image {self.engine.image_ref}",
                fix="call apply_turing_patch (it builds the image), or run scripts/build-image",
            )
        args = ["patch", "verify", *(["--skip-interpreter"] if skip_interpreter else [])]
        done = await blocking(
            progress,
            f"t4serve patch verify in {self.engine.image_ref}",
            lambda: self.engine.run_in_image(args, VERIFY_TIMEOUT_S),
        )
        findings: list[Finding] = []
        gpu = facts.gpu.devices[0] if facts.gpu.devices else None
        if gpu is not None:
            findings.append(check_clamp(manifest, make_plan(settings, facts), gpu))
        code = done.returncode
        findings.append(
            Finding(
                "patch-verify",
                "ok" if code == 0 else "fail",
                f"`t4serve patch verify` exited {code}",
                "exit 0: the installed clamp located, compiled for sm_75 and checked against a reference",
                "" if code == 0 else "rebuild the image with apply_turing_patch; the output says which step failed",
            )
        )
        clamp = manifest.clamp
        output = tail_text((done.stdout + done.stderr).strip(), 8 * 1024)
        return TuringPatch(
            ok=not has_failures(findings) and clamp is not None and clamp.state in ("applied", "not-needed"),
            image=self.engine.image_ref,
            clamp=None
            if clamp is None
            else ClampOut(
                state=clamp.state,
                vllm_version=clamp.vllm_version,
                shared_memory=dict(clamp.shared_memory),
                unpatched_shared_memory=clamp.unpatched_shared_memory,
                interpreter_max_abs_error=clamp.interpreter_max_abs_error,
            ),
            verify_exit_code=code,
            verify_output=output,
            findings=[finding_out(f) for f in findings],
        )

    @guarded
    async def apply_turing_patch(self, ctx: Context | None = None) -> ManifestOut:
        """Build the image (scripts/build-image), which applies and proves the Turing clamp; returns its manifest.

        The clamp is applied while the image builds, so this is how it is (re)applied; the image tag is replaced.
        Minutes on a warm cache, up to an hour cold; progress carries the build's latest line, and a cancellation
        stops the build. Holds the deployment's lock."""
        progress = Progress(ctx)
        lines: list[str] = []
        with self.env.exclusive("apply_turing_patch", ctx):
            await progress.say("starting scripts/build-image")
            done = await blocking(
                progress,
                lambda: lines[-1][:200] if lines else "starting scripts/build-image",
                lambda: self.engine.build_image(lines.append),
            )
        output = tail_text("\n".join(lines[-60:]), 8 * 1024)
        if done.returncode != 0:
            raise EngineError(
                "apply_turing_patch: scripts/build-image failed",
                found=f"exit {done.returncode}; last lines:\n{output[-2000:]}",
                required="a successful build (it applies and proves the clamp)",
                fix="read the output above; `scripts/build-image` by hand shows all of it",
            )
        image = await in_thread(self.engine.image)
        text = await in_thread(lambda: self.engine.read_image_file(MANIFEST_PATH))
        if image is None or text is None:
            raise EngineError(
                "apply_turing_patch: the build finished but the image or its manifest is missing",
                found=f"image {self.engine.image_ref}: {'present' if image else 'absent'}",
                required=f"{self.engine.image_ref} with {MANIFEST_PATH}",
                fix="run scripts/build-image by hand and read its output",
            )
        return ManifestOut(
            image=image.ref,
            image_id=image.id,
            size_bytes=image.size_bytes,
            build_exit_code=done.returncode,
            build_output=output,
            manifest=client_json(text, "the image's build manifest", ["cat", MANIFEST_PATH]),
        )

    @guarded
    async def plan(
        self,
        model: Annotated[str | None, Field(description=MODEL_HELP)] = None,
        gpu_model: Annotated[
            str | None,
            Field(
                description="plan for this known GPU model instead of this host's GPU: t4, l4, a10g, ... (a name, "
                "not a device index)",
                max_length=64,
            ),
        ] = None,
        settings: Annotated[dict[str, str] | None, Field(description=SETTINGS_HELP)] = None,
        ctx: Context | None = None,
    ) -> PlanOut:
        """The `vllm serve` command line t4serve would run, and the numbers behind it (KV cache, concurrency, memory).

        For this host's GPU, or a known GPU model (`gpu_model`), for `model` and optional container settings; the
        same as `t4serve plan`. Changes nothing."""
        from t4serve.pipeline import ensure_model, prepare, with_known_gpu

        chosen = validate_settings(model, settings or {}, self.env.base_env())

        def work() -> tuple[Any, list[Finding]]:
            facts = ensure_model(chosen, self._facts(chosen))
            if gpu_model:
                facts = with_known_gpu(facts, gpu_model.lower())
            return prepare(chosen, facts)

        the_plan, findings = await blocking(Progress(ctx), "planning", work)
        # The container's own checks that mean something for a plan read on the host.
        kept = [f for f in findings if f.check in ("gpu", "capability", "dtype", "sizing", "clamp", "model")]
        return PlanOut(
            command_line=the_plan.command_line(),
            summary=the_plan.summary(),
            plan=the_plan.to_dict(),
            settings=chosen.to_dict(),
            findings=[finding_out(f) for f in kept],
        )

    # --- the server
    def _service(self) -> ServiceContainer | None:
        return self.engine.service()

    def _api_url(self, container: ServiceContainer, port: int) -> str | None:
        published = self.engine.published_port(container.id, port)
        if published is None:
            return None
        return local_url(*published)

    @guarded
    async def start_vllm_server(
        self,
        model: Annotated[str, Field(description=MODEL_HELP)] = "qat",
        settings: Annotated[dict[str, str] | None, Field(description=SETTINGS_HELP)] = None,
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
        /models/NAME. Holds the deployment's lock: a concurrent start or stop is answered "busy"."""
        chosen = validate_settings(model, settings or {}, self.env.base_env())
        for name, allowed in (("T4SERVE_PORT", ("8000",)), ("T4SERVE_HOST", ("0.0.0.0", "::"))):
            value = (settings or {}).get(name)
            if value is not None and value.strip() not in allowed:
                raise ConfigError(
                    f"start_vllm_server: {name} cannot be changed here",
                    found=f"{name}={value}",
                    required=f"the API on container port {API_PORT}, all addresses: compose.yaml publishes that port",
                    fix="leave it out; `publish_port` chooses the port on this host",
                )
        environment = {"T4SERVE_MODEL": chosen.model.requested, **(settings or {})}
        mounts: list[Mount] = []
        in_container = chosen.model.target
        if chosen.model.kind == "local":
            name = Path(chosen.model.target).name
            safe = name if re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}", name) else "model"
            in_container = f"{MODEL_MOUNT_ROOT}/{safe}"
            mounts.append(Mount(source=chosen.model.target, target=in_container))
            environment["T4SERVE_MODEL"] = in_container
        compose_env: dict[str, str] = {}
        if gpu_device:
            compose_env["T4SERVE_GPU"] = gpu_device
        if publish_port is not None:
            compose_env["T4SERVE_PUBLISH_PORT"] = str(publish_port)
        progress = Progress(ctx)
        with self.env.exclusive("start_vllm_server", ctx):
            container = await blocking(progress, "looking for a running server", self._service)
            if container is not None and container.state in ("running", "restarting"):
                raise EngineError(
                    "start_vllm_server: the server is already running",
                    found=f"container {container.name} ({container.id}) is {container.state}",
                    required="no running t4serve container in this compose project",
                    fix="call stop_vllm_server first, or server_status to follow the running one",
                )
            self._check_secret_file()
            await progress.say(f"compose up: {chosen.model.target}")
            container = await blocking(progress, "compose up", lambda: self.engine.up(environment, compose_env, mounts))
            container, status = await self._confirm_start(progress, container)
        api_url = status.api_url if status is not None else None
        phase = status.phase if status is not None else None
        deadline = time.monotonic() + float(wait_s)
        while status is not None and time.monotonic() < deadline:
            if status.ready or not status.running or phase in ("failed", "canary_failed"):
                break
            await anyio.sleep(2.0)
            status = await blocking(progress, "following the start", self._status)
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
            seen = await blocking(progress, "waiting for the container", self._service)
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
                status = await blocking(progress, "waiting for t4serve's state", self._status)
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
        lines, _, _ = cap_lines(redact(text, self.env.secrets()), START_LOG_LINES, 8 * 1024)
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

    def _check_secret_file(self) -> None:
        """compose.yaml's hf_token secret must exist (docker-compose 1.29 refuses to start without it); its content
        is not read here (known_secrets reads it, for redaction only)."""
        path = self.env.token_file()
        if not path.is_file():
            raise ConfigError(
                "start_vllm_server: the HF token secret file is missing",
                found=f"{path}: no such file",
                required="the file compose.yaml's hf_token secret names (HF_TOKEN_SECRET_FILE, else "
                "./secrets/hf_token)",
                fix=f'mkdir -p {path.parent} && (umask 077 && printf %s "${{HF_TOKEN:?}}" > {path}) && '
                f"chown 1000 {path} (sudo chown unless you are root or uid 1000; Gemma is gated: accept its "
                "licence on huggingface.co)",
            )

    def _status(self) -> StatusOut:
        from t4serve.supervise.logwatch import compare
        from t4serve.supervise.readout import render_status, time_to_ready
        from t4serve.supervise.state import PHASE_LABELS, ServeState

        container = self.engine.service()
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
        done = self.engine.exec(container.id, ["t4serve", "status", "--json"])
        if done.returncode != 0:
            api_url = self._api_url(container, API_PORT)
            text = f"the server has no state yet: {(done.stderr.strip() or 'no output').splitlines()[-1]}"
            return StatusOut(running=True, ready=False, api_url=api_url, text=text, **base, **empty)
        state = from_dict(ServeState, client_json(done.stdout, "server_status", ["t4serve", "status", "--json"]),
                          where="t4serve status --json")
        api_url = self._api_url(container, state.port)
        now = self.env.clock()
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
            phase_label=PHASE_LABELS.get(state.phase, state.phase),
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

    @guarded
    async def server_status(self, ctx: Context | None = None) -> StatusOut:
        """Where the server is: container state, phase and its duration, figures beside the plan, time to ready.

        Container state and health, vLLM's logged figures beside the plan's predictions, the canary, and the
        time-to-ready estimate from past starts (`t4serve status` in the container). Changes nothing."""
        return await blocking(Progress(ctx), "reading the server's state", self._status)

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
        container = await blocking(progress, "looking for the container", self._service)
        if container is None:
            raise ConfigError(
                "server_logs: no t4serve container",
                found="none in this compose project",
                required="a started server",
                fix="call start_vllm_server",
            )
        text = await blocking(progress, "reading the logs", lambda: self.engine.logs(container.id, int(tail), since))
        lines, truncated, size = cap_lines(redact(text, self.env.secrets()), int(tail), MAX_LOG_BYTES)
        return LogsOut(container=container.id, lines=lines, truncated=truncated, bytes=size)

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
        status = await blocking(progress, "reading the server's state", self._status)
        if not status.ready:
            raise _not_ready("query", status, "phase ready")
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

    # --- benchmarks
    @guarded
    async def run_benchmark(
        self,
        inputs: Annotated[
            list[Annotated[int, Field(ge=1, le=32768)]] | None,
            Field(description="prompt lengths in tokens, 1 to 4 of them, each 1 to 32768 (default [512])",
                  min_length=1, max_length=4),
        ] = None,
        concurrency: Annotated[
            list[Annotated[int, Field(ge=1, le=32768)]] | None,
            Field(description="concurrent streams per cell, 1 to 6 values (default [1, 4])", min_length=1,
                  max_length=6),
        ] = None,
        repeats: Annotated[int, Field(description="runs per cell, each with its own seed (1 to 5)", ge=1, le=5)] = 1,
        output_len: Annotated[int, Field(description="tokens generated per request (1 to 2048)", ge=1, le=2048)] = 128,
        num_prompts: Annotated[
            int | None, Field(description="requests per run (1 to 1000; default max(4 x concurrency, 8))", ge=1,
                              le=1000)
        ] = None,
        ctx: Context | None = None,
    ) -> BenchStart:
        """Start `t4serve bench` against the running server, in its container, in the background; returns a run id.

        The sweep (vLLM's own `vllm bench serve` per input length, concurrency and repeat) runs on after this call;
        follow it with benchmark_status. One benchmark at a time; holds the deployment's lock while starting it."""
        inputs = inputs or [512]
        concurrency = concurrency or [1, 4]
        progress = Progress(ctx)
        with self.env.exclusive("run_benchmark", ctx):
            status = await blocking(progress, "reading the server's state", self._status)
            if not status.ready or status.container is None:
                raise _not_ready("run_benchmark", status, "a ready server in a container")
            container = status.container
            running = await blocking(progress, "looking for a running benchmark",
                                     lambda: self._read_bench(container, "running", BENCH_ROOT))  # fmt: skip
            if running["running"]:
                raise EngineError(
                    "run_benchmark: busy: a benchmark is running",
                    found=f"run {running['running'][0]} has not finished",
                    required="one benchmark at a time (two would share the GPU and skew both)",
                    fix=f"benchmark_status(run_id={running['running'][0]!r}) until it is done",
                )
            stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime(self.env.clock()))
            run_id = f"{stamp}-{uuid.uuid4().hex[:6]}"
            folder = f"{BENCH_ROOT}/{run_id}"
            args = [
                "--models",
                str(status.model),
                "--base-url",
                f"http://127.0.0.1:{status.api_port or API_PORT}",
                "--inputs",
                ",".join(map(str, inputs)),
                "--concurrency",
                ",".join(map(str, concurrency)),
                "--repeats",
                str(repeats),
                "--output-len",
                str(output_len),
            ]
            if num_prompts is not None:
                args += ["--num-prompts", str(num_prompts)]
            done = await blocking(progress, "starting t4serve bench",
                                  lambda: self.engine.exec(container, ["sh", "-c", BENCH_SCRIPT, "sh", folder, *args],
                                                           detach=True))  # fmt: skip
        if done.returncode != 0:
            raise EngineError(
                "run_benchmark: docker exec failed",
                found=done.stderr.strip() or "no output",
                required="the running container to accept the command",
                fix="server_status, then try again",
            )
        return BenchStart(
            run_id=run_id, container=container, output_dir=folder, poll=f"benchmark_status(run_id={run_id!r})"
        )

    def _read_bench(self, container: str, mode: str, folder: str) -> dict[str, Any]:
        done = self.engine.exec(container, ["python3", "-c", READ_BENCH, mode, folder])
        if done.returncode != 0:
            raise ConfigError(
                f"benchmark_status: no benchmark {Path(folder).name}",
                found=done.stderr.strip()[-300:] or "no output",
                required="a run id from run_benchmark",
                fix="call run_benchmark",
            )
        seen = client_json(done.stdout, "benchmark_status", ["python3", "-c", "READ_BENCH"])
        keys = {"running"} if mode == "running" else {"exit_code", "alive", "log", "report", "plots"}
        if not isinstance(seen, dict) or not keys <= set(seen):
            raise EngineError(
                "benchmark_status: the container's answer is not a benchmark's state",
                found=printable(done.stdout.strip()[:200]),
                required=f"READ_BENCH's JSON: {', '.join(sorted(keys))}",
                fix="check that the container runs this version of t4serve (rebuild the image)",
            )
        return seen

    @guarded
    async def benchmark_status(
        self,
        run_id: Annotated[str, Field(description="the id run_benchmark returned", pattern=RUN_ID.pattern)],
        ctx: Context | None = None,
    ) -> BenchStatus:
        """A benchmark's progress, and once it has ended its figures per cell, its report (report.md) and plots.

        When done, the result folder is copied to this host (T4SERVE_MCP_DATA_DIR/bench/RUN_ID) and read from there,
        so a finished run stays readable after the server stops. Changes nothing on the deployment."""
        progress = Progress(ctx)
        target = self.env.data_dir / "bench" / run_id
        if not target.is_dir():
            container = await blocking(progress, "looking for the container", self._service)
            if container is None or container.state != "running":
                raise ConfigError(
                    "benchmark_status: no running t4serve container",
                    found=container.state if container else "none",
                    required="the container the benchmark runs in",
                    fix="the results stay in the t4serve-cache volume under bench/; start the server again to read "
                    "them",
                )
            folder = f"{BENCH_ROOT}/{run_id}"
            seen = await blocking(progress, "reading the benchmark", lambda: self._read_bench(container.id, "read",
                                                                                             folder))  # fmt: skip
            if seen["exit_code"] is None:
                return self._bench_status(run_id, seen, None)
            await blocking(progress, "copying the results to this host",
                           lambda: copy_in(self.engine, container.id, folder, target))  # fmt: skip
        return await in_thread(lambda: self._bench_status(run_id, read_host_bench(target), target))

    def _bench_status(self, run_id: str, seen: dict[str, Any], target: Path | None) -> BenchStatus:
        """The status from what was read (in the container while running, from the host copy once ended)."""
        from t4serve.bench.results import read_runs, summarize

        code = seen["exit_code"]
        gone = code is None and not seen["alive"]
        state: Literal["running", "done", "failed"] = (
            "failed" if gone or (code is not None and code != 0) else "running" if code is None else "done"
        )
        log = seen["log"]
        if gone:
            log += "\n(the benchmark's process is gone without an exit code: the container restarted or it was killed)"
        progress = BENCH_PROGRESS.findall(log)
        cells: list[BenchCell] = []
        plots: list[str] = []
        if target is not None:
            result = target / "result"
            if (result / "runs.json").is_file():
                try:
                    summaries = summarize(read_runs(result).runs)
                except T4ServeError:
                    summaries = []
                cells = [
                    BenchCell(model=c.model, input_len=c.input_len, concurrency=c.concurrency,
                              repeats_ok=c.repeats_ok, repeats_failed=c.repeats_failed,
                              completed_requests=c.completed, failed_requests=c.failed_requests,
                              throughput_tok_s=c.throughput, per_stream_tok_s=c.per_stream, ttft_ms=c.ttft_ms,
                              variation_pct=c.variation_pct, errors=[e[:300] for e in c.errors[:5]])
                    for c in summaries
                ]  # fmt: skip
            plots = [str(result / name) for name in seen["plots"]]
        return BenchStatus(
            run_id=run_id,
            state=state,
            exit_code=code,
            runs_done=int(progress[-1][0]) if progress else None,
            runs_planned=int(progress[-1][1]) if progress else None,
            log_tail=redact(tail_text(log, 8 * 1024), self.env.secrets()),
            report_md=tail_text(seen["report"], BENCH_TEXT_BYTES) if seen["report"] is not None else None,
            cells=cells,
            host_folder=str(target) if target is not None else None,
            plots=plots,
        )


# Runs in the container (sh): the run folder holds bench.log and exit-code beside bench's own result/ folder (bench
# refuses an output folder that holds files). The folder is the wrapper's own argument, so its process is found by it.
BENCH_SCRIPT = (
    'd=$1; shift; mkdir -p "$d" && t4serve bench --output "$d/result" "$@" >"$d/bench.log" 2>&1; '
    'echo $? >"$d/exit-code"'
)


def copy_in(engine: Engine, container: str, folder: str, target: Path) -> None:
    """Copy a finished run folder out of the container to `target`: into a temporary sibling first, then renamed, so
    `target` is complete or absent (an interrupted copy leaves no half folder that would be read as the result)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = target.parent / f".{target.name}.copying-{uuid.uuid4().hex[:8]}"
    try:
        engine.copy_out(container, folder, staging)
        staging.rename(target)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)


def read_host_bench(target: Path) -> dict[str, Any]:
    """What READ_BENCH reads, from the copy on this host."""

    def read(path: Path, limit: int) -> str | None:
        try:
            with path.open("rb") as handle:
                handle.seek(0, 2)
                handle.seek(max(0, handle.tell() - limit))
                return handle.read().decode("utf-8", "replace")
        except OSError:
            return None

    code = (read(target / "exit-code", 32) or "").strip()
    result = target / "result"
    return {
        "exit_code": int(code) if code.lstrip("-").isdigit() else None,
        "alive": False,
        "log": read(target / "bench.log", 16384) or "",
        "report": read(result / "report.md", 65536),
        "plots": sorted(p.name for p in result.glob("*.png")) if result.is_dir() else [],
    }


# Runs in the container (its Python). `read FOLDER`: a run's exit code, whether its wrapper still runs, its log tail,
# report and plot names. `running ROOT`: the runs under ROOT whose wrapper still runs and that have no exit code.
READ_BENCH = """
import json, os, sys
mode, d = sys.argv[1], sys.argv[2]
def alive(folder):
    want, me = folder.rstrip("/").encode(), str(os.getpid())
    for pid in os.listdir("/proc"):
        if pid.isdigit() and pid != me:
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    if want in f.read().split(b"\\0"):
                        return True
            except OSError:
                pass
    return False
def read(path, limit):
    try:
        with open(path, "rb") as f:
            f.seek(0, 2); size = f.tell(); f.seek(max(0, size - limit))
            return f.read().decode("utf-8", "replace")
    except OSError:
        return None
def code(folder):
    text = (read(os.path.join(folder, "exit-code"), 32) or "").strip()
    return int(text) if text.lstrip("-").isdigit() else None
if mode == "running":
    names = sorted(os.listdir(d)) if os.path.isdir(d) else []
    print(json.dumps({"running": [n for n in names if code(os.path.join(d, n)) is None and alive(os.path.join(d, n))]}))
    sys.exit(0)
if not os.path.isdir(d):
    sys.exit(f"no such folder {d}")
up = alive(d)  # before the exit code: a wrapper that ends in between has written it
result = os.path.join(d, "result")
plots = sorted(n for n in os.listdir(result) if n.endswith(".png")) if os.path.isdir(result) else []
print(json.dumps({"exit_code": code(d), "alive": up, "log": read(os.path.join(d, "bench.log"), 16384) or "",
                  "report": read(os.path.join(result, "report.md"), 65536), "plots": plots}))
"""


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


# ----- publishing: titles, tool sets, modes ---------------------------------------------------------------------


@dataclass(frozen=True)
class ToolSpec:
    """How a tool is published: its title, its tool set, and hints that say what it does to the deployment."""

    title: str
    toolset: str
    annotations: ToolAnnotations


def _hints(*, read_only: bool, destructive: bool, idempotent: bool, open_world: bool) -> ToolAnnotations:
    return ToolAnnotations(read_only_hint=read_only, destructive_hint=destructive, idempotent_hint=idempotent,
                           open_world_hint=open_world)  # fmt: skip


READ_ONLY = _hints(read_only=True, destructive=False, idempotent=True, open_world=False)

# The order is the order a deployment goes through. open_world: the tool reaches outside this host (the HF hub for a
# checkpoint's files, the package indexes for a build).
TOOLS: dict[str, ToolSpec] = {
    "check_host_capacity": ToolSpec("Check host capacity", "host", READ_ONLY),
    "verify_gpu_arch": ToolSpec("Check GPUs against the image", "host", READ_ONLY),
    "verify_turing_patch": ToolSpec("Verify the Turing clamp", "image", READ_ONLY),
    # Replaces the image tag with a new build (the old image is pruned); building the same tree again is the same.
    "apply_turing_patch": ToolSpec("Build the image (applies the clamp)", "image",
                                   _hints(read_only=False, destructive=True, idempotent=True, open_world=True)),
    # Reads a checkpoint's config from the HF hub when it is not in the cache.
    "plan": ToolSpec("Plan the vLLM command line", "plan",
                     _hints(read_only=True, destructive=False, idempotent=True, open_world=True)),
    # Creates a container; a second call while one runs is refused, not repeated.
    "start_vllm_server": ToolSpec("Start the server", "server",
                                  _hints(read_only=False, destructive=False, idempotent=False, open_world=True)),
    "stop_vllm_server": ToolSpec("Stop the server", "server",
                                 _hints(read_only=False, destructive=True, idempotent=True, open_world=False)),
    "server_status": ToolSpec("Server status", "status", READ_ONLY),
    "server_logs": ToolSpec("Server logs", "status", READ_ONLY),
    # A completion changes nothing on the host; its answer may differ from call to call (temperature).
    "query": ToolSpec("Query the model", "query",
                      _hints(read_only=True, destructive=False, idempotent=False, open_world=False)),
    "run_benchmark": ToolSpec("Start a benchmark", "bench",
                              _hints(read_only=False, destructive=False, idempotent=False, open_world=False)),
    # Copies a finished run's folder to this host's data folder; changes nothing on the deployment.
    "benchmark_status": ToolSpec("Benchmark status and figures", "bench", READ_ONLY),
}  # fmt: skip
TOOLSETS = tuple(dict.fromkeys(spec.toolset for spec in TOOLS.values()))
TOOL_ANNOTATIONS: dict[str, ToolAnnotations] = {name: spec.annotations for name, spec in TOOLS.items()}


@dataclass(frozen=True)
class Modes:
    """What the operator lets an assistant do: only read-only tools; no destructive ones (stop, the image build);
    only some tool sets (None: all); not these tools."""

    read_only: bool = False
    disable_destructive: bool = False
    toolsets: frozenset[str] | None = None
    deny: frozenset[str] = field(default_factory=frozenset)

    def allows(self, name: str) -> bool:
        spec = TOOLS[name]
        hints = spec.annotations
        if self.read_only and not hints.read_only_hint:
            return False
        if self.disable_destructive and hints.destructive_hint:
            return False
        if self.toolsets is not None and spec.toolset not in self.toolsets:
            return False
        return name not in self.deny

    def published(self) -> list[str]:
        return [name for name in TOOLS if self.allows(name)]


def parse_modes(read_only: bool, disable_destructive: bool, toolsets: str | None, deny_tools: str | None) -> Modes:
    """Modes from the flags (or their variables): comma-separated tool sets and tool names, each checked."""

    def names(raw: str | None, known: Sequence[str], what: str, flag: str) -> frozenset[str]:
        given = [n.strip() for n in (raw or "").split(",") if n.strip()]
        unknown = [n for n in given if n not in known]
        if unknown:
            raise ConfigError(
                f"{flag}: {', '.join(unknown)} is not a {what}",
                found=raw or "",
                required=f"{what}s from: {', '.join(known)}",
                fix=f"{flag} {','.join(known[:3])}",
            )
        return frozenset(given)

    chosen = names(toolsets, TOOLSETS, "tool set", "--toolsets") if toolsets and toolsets.strip() else None
    modes = Modes(read_only, disable_destructive, chosen, names(deny_tools, list(TOOLS), "tool", "--deny-tools"))
    if not modes.published():
        raise ConfigError(
            "t4serve mcp: these modes leave no tool to publish",
            found=f"read-only {read_only}, disable-destructive {disable_destructive}, toolsets {toolsets or 'all'}, "
            f"denied {deny_tools or 'none'}",
            required="at least one tool",
            fix="widen --toolsets or shorten --deny-tools",
        )
    return modes


def build_server(env: ToolEnv, read_only: bool = False, modes: Modes | None = None) -> MCPServer:
    """The MCP server with the tools the modes allow (`read_only=True`: the read-only ones)."""
    modes = modes or Modes(read_only=read_only)
    server: MCPServer = MCPServer(
        name="t4serve",
        version=__version__,
        instructions=(
            "Serve Gemma 4 E2B with vLLM on a Tesla T4 (or any Turing-or-newer NVIDIA GPU) through Docker compose. "
            "In order: check_host_capacity, verify_gpu_arch, apply_turing_patch (only when the image is missing or "
            "verify_turing_patch fails), plan, start_vllm_server, then server_status until ready; query, "
            "run_benchmark / benchmark_status; stop_vllm_server. Tools that change the deployment answer 'busy' "
            "while another such call runs; long tools report progress and can be cancelled."
        ),
    )
    tools = Tools(env)
    for name in modes.published():
        spec = TOOLS[name]
        server.add_tool(getattr(tools, name), name=name, title=spec.title, annotations=spec.annotations,
                        structured_output=True)  # fmt: skip
    strict_arguments(server)
    return server


def strict_arguments(server: MCPServer) -> None:
    """Every tool's arguments taken as JSON gives them, without pydantic's lax coercion (it reads the string "1_0" as
    the integer 10, true as 1 and "nan" as a float): an integer must be a JSON integer, a string a string, as
    t4serve.untrusted takes numbers everywhere else. The published input schemas are unchanged (they already say so);
    the SDK has no public hook for this, so its tool manager is reached here (pinned mcp>=2.3,<3; the hardening tests
    fail if it moves)."""
    for tool in server._tool_manager.list_tools():
        lax = tool.fn_metadata.arg_model
        config = ConfigDict(arbitrary_types_allowed=True, strict=True)
        tool.fn_metadata.arg_model = type(lax.__name__, (lax,), {"model_config": config, "__module__": __name__})


def default_data_dir(environ: Mapping[str, str]) -> Path:
    raw = environ.get("T4SERVE_MCP_DATA_DIR")
    if raw:
        return Path(raw)
    cache = environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "t4serve-mcp"
