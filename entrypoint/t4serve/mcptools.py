"""The MCP tools of `t4serve mcp`: thin wrappers over the functions the CLI commands call, with typed results.

Each tool calls what its command calls (hostcheck for `host-check`, pipeline + plan for `plan`, the preflight checks,
`t4serve status --json` / `patch verify` / `bench` in the container) and returns the result as a pydantic model, so
the SDK publishes an output schema and structured content. The Docker side is `t4serve.engine.Engine`, the one
adapter to the engine. A failure a user can meet becomes a tool error reading "what failed / found / required / fix"
(never a traceback); a bug becomes a tool error saying so. Secrets never leave: the HF token is not read, the API key
is sent to the server only in a request header, and every text that comes back from the container (logs, completions,
the bench log) has any secret this process knows replaced by `<redacted>`.

Blocking engine and HTTP calls run in worker threads, so one slow call does not stall other requests.
"""

from __future__ import annotations

import functools
import json
import os
import re
import time
import traceback
import urllib.error
import urllib.request
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, ParamSpec, TypeVar

import anyio
import anyio.to_thread
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ToolAnnotations
from pydantic import BaseModel, Field

from t4serve import __version__
from t4serve.engine import API_PORT, MANIFEST_PATH, Engine, ServiceContainer
from t4serve.errors import ConfigError, EngineError, T4ServeError
from t4serve.facts import Facts
from t4serve.httpclient import local_url
from t4serve.preflight import Finding, check_clamp, has_failures
from t4serve.probes.gpu import Nvml
from t4serve.secrets import client_api_key
from t4serve.serde import from_dict
from t4serve.settings import VARIABLES_BY_NAME, Settings
from t4serve.untrusted import REDACTED

P = ParamSpec("P")
R = TypeVar("R")

MAX_LOG_LINES = 500
MAX_LOG_BYTES = 64 * 1024
MAX_QUERY_TOKENS = 1024
MAX_PROMPT_CHARS = 32_000
QUERY_TIMEOUT_S = 120.0
VERIFY_TIMEOUT_S = 1200.0
BENCH_TEXT_BYTES = 32 * 1024
# start_vllm_server follows the start at most this long when asked to wait, well inside the 60 s many clients allow.
MAX_WAIT_S = 50.0
RUN_ID = re.compile(r"^[0-9]{8}-[0-9]{6}-[0-9a-f]{6}$")
BENCH_ROOT = "/cache/t4serve/bench"
# Settings a tool may not pass: secrets, and the files that hold them (compose.yaml's secrets carry those).
REFUSED_SETTINGS = ("HF_TOKEN", "HF_TOKEN_FILE", "T4SERVE_API_KEY", "T4SERVE_API_KEY_FILE")

READ_ONLY = ToolAnnotations(read_only_hint=True, destructive_hint=False, idempotent_hint=True, open_world_hint=False)


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
    model: str
    api_url: str | None
    poll: str = Field(description="what to call to follow the start")
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
    api_url: str | None
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


class BenchStatus(BaseModel):
    run_id: str
    state: Literal["running", "done", "failed"]
    exit_code: int | None
    log_tail: str
    report_md: str | None
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


def tool_error(exc: T4ServeError) -> ToolError:
    return ToolError(exc.message())


def guarded(fn: Callable[P, Awaitable[R]]) -> Callable[P, Awaitable[R]]:
    """Errors as tool errors: t4serve's own with found / required / fix; anything else as a bug, one line."""

    @functools.wraps(fn)
    async def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return await fn(*args, **kwargs)
        except ToolError:
            raise
        except T4ServeError as exc:
            raise tool_error(exc) from None
        except Exception as exc:
            frames = traceback.extract_tb(exc.__traceback__)
            where = f" at {Path(frames[-1].filename).name}:{frames[-1].lineno}" if frames else ""
            raise ToolError(
                f"{fn.__name__} failed: internal error (a bug in t4serve; please report it with this line)\n"
                f"  found: {type(exc).__name__}: {exc}{where}"
            ) from None

    return wrapper


def known_secrets(environ: Mapping[str, str]) -> list[str]:
    """Secrets this process can know, to redact from text that comes back: the API key and the HF token, from the
    variables and the files they name (compose's HF token secret file included)."""
    values = [environ.get(name, "") for name in ("HF_TOKEN", "T4SERVE_API_KEY", "VLLM_API_KEY", "OPENAI_API_KEY")]
    for name in ("HF_TOKEN_FILE", "T4SERVE_API_KEY_FILE", "HF_TOKEN_SECRET_FILE"):
        path = environ.get(name)
        if path:
            try:
                values.append(Path(path).read_text(encoding="utf-8").strip())
            except (OSError, UnicodeDecodeError):
                continue
    return [v for v in values if len(v) >= 8]


def redact(text: str, secrets: Sequence[str]) -> str:
    for secret in secrets:
        text = text.replace(secret, REDACTED)
    return text


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
        if name not in VARIABLES_BY_NAME:
            raise ConfigError(
                f"settings: {name} is not a t4serve setting",
                found=name,
                required="names from `t4serve env` (e.g. T4SERVE_MAX_MODEL_LEN, T4SERVE_DTYPE)",
                fix="run `t4serve env` for the table",
            )
    overrides = dict(settings)
    if model:
        overrides["T4SERVE_MODEL"] = model
    return Settings.from_environ(dict(base), overrides=overrides)


async def in_thread(fn: Callable[[], R]) -> R:
    return await anyio.to_thread.run_sync(fn)


async def with_heartbeat(ctx: Context | None, fn: Callable[[], R], describe: Callable[[], str]) -> R:
    """Run `fn` in a worker thread, reporting progress every second while it runs (a no-op unless the client asked
    for progress); its exception, if any, is raised as it is."""
    box: dict[str, Any] = {}

    def work() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:
            box["error"] = exc

    async with anyio.create_task_group() as group:
        group.start_soon(anyio.to_thread.run_sync, work)
        tick = 0
        while "value" not in box and "error" not in box:
            await anyio.sleep(1.0)
            tick += 1
            if ctx is not None and "value" not in box and "error" not in box:
                await ctx.report_progress(tick, None, describe())
    if "error" in box:
        raise box["error"]
    value: R = box["value"]
    return value


@dataclass
class ToolEnv:
    """What the tools work with: the engine, this process's environment, and a host folder for results."""

    engine: Engine
    environ: Mapping[str, str]
    data_dir: Path
    compose_file: Path
    clock: Callable[[], float] = time.time
    # The NVML module the host probes read (None: pynvml); tests give a double.
    nvml: Nvml | None = None

    def secrets(self) -> list[str]:
        return known_secrets(self.environ)

    def base_env(self) -> dict[str, str]:
        """Host-side settings that planning reads (where the HF cache is, whether to go online)."""
        return {k: v for k, v in self.environ.items() if k in ("HF_HOME", "HF_HUB_OFFLINE", "XDG_CACHE_HOME")}


# ----- the tools -----------------------------------------------------------------------------------------------


class Tools:
    """One method per tool; `build_server(env, read_only)` publishes them."""

    def __init__(self, env: ToolEnv) -> None:
        self.env = env
        self.engine = env.engine

    # --- host and image checks
    @guarded
    async def check_host_capacity(self, model: str | None = None) -> HostCapacity:
        """Check this host: NVIDIA driver, NVIDIA Container Toolkit configured for Docker, free space on Docker's
        data root for the image and cache volumes, RAM + swap (and compose's memory limit) against the checkpoint's
        load need, compose's /dev/shm. Same checks as `t4serve host-check`."""
        from t4serve.hostcheck import check_host

        settings = validate_settings(model, {}, self.env.base_env())
        findings = await in_thread(
            lambda: check_host(settings, self.env.environ, self.engine, self.env.compose_file, nvml=self.env.nvml)
        )
        return HostCapacity(
            compose_file=str(self.env.compose_file), image=self.engine.image_ref, **checks_fields(findings)
        )

    def _facts(self, settings: Settings) -> Facts:
        from t4serve.hostcheck import host_facts

        info = self.engine.info()
        return host_facts(
            settings, self.env.environ, self.engine, info=info, image=self.engine.image(), nvml=self.env.nvml
        )

    @guarded
    async def verify_gpu_arch(self) -> GpuArch:
        """Read the host's GPUs with NVML and the image's build manifest: each GPU's compute capability is in the
        image torch's arch list, and the driver is new enough for the image's CUDA 13 build."""
        from t4serve.hostcheck import arch_findings

        settings = validate_settings(None, {}, self.env.base_env())
        facts = await in_thread(lambda: self._facts(settings))
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
    async def verify_turing_patch(self, skip_interpreter: bool = False, ctx: Context | None = None) -> TuringPatch:
        """Check the Turing attention clamp baked into the image: the proof in its build manifest, and
        `t4serve patch verify` run again in a throwaway container of the image (minutes; progress is reported)."""
        from t4serve.plan import plan as make_plan

        settings = validate_settings(None, {}, self.env.base_env())
        facts = await in_thread(lambda: self._facts(settings))
        manifest = facts.manifest
        if not manifest.present:
            raise EngineError(
                "verify_turing_patch: the image has no build manifest",
                found=manifest.error or "missing",
                required=f"the t4serve image {self.engine.image_ref}",
                fix="call apply_turing_patch (it builds the image), or run scripts/build-image",
            )
        args = ["patch", "verify", *(["--skip-interpreter"] if skip_interpreter else [])]
        started = time.monotonic()
        done = await with_heartbeat(
            ctx,
            lambda: self.engine.run_in_image(args, VERIFY_TIMEOUT_S),
            lambda: f"t4serve patch verify in {self.engine.image_ref}: {time.monotonic() - started:.0f} s",
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
        """Build the image (scripts/build-image): the clamp is applied and proven while the image builds, so this is
        how it is (re)applied. Minutes on a warm cache; progress carries the build's latest line. Returns the new
        image's build manifest."""
        lines: list[str] = []
        done = await with_heartbeat(
            ctx,
            lambda: self.engine.build_image(lines.append),
            lambda: lines[-1][:200] if lines else "starting scripts/build-image",
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
            manifest=json.loads(text),
        )

    @guarded
    async def plan(
        self, model: str | None = None, gpu: str | None = None, settings: dict[str, str] | None = None
    ) -> PlanOut:
        """The vLLM command line and the numbers behind it, for this host's GPU or a known one (`gpu`: t4, l4,
        a10g, ...), for `model` (qat, bf16, a repo id) and optional container settings (T4SERVE_* names)."""
        from t4serve.pipeline import ensure_model, prepare, with_known_gpu

        chosen = validate_settings(model, settings or {}, self.env.base_env())
        facts = await in_thread(lambda: self._facts(chosen))
        facts = ensure_model(chosen, facts)
        if gpu:
            facts = with_known_gpu(facts, gpu.lower())
        the_plan, findings = prepare(chosen, facts)
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

    def _api_url(self, container: ServiceContainer) -> str | None:
        published = self.engine.published_port(container.id, API_PORT)
        if published is None:
            return None
        return local_url(*published)

    @guarded
    async def start_vllm_server(
        self,
        model: str = "qat",
        settings: dict[str, str] | None = None,
        gpu: Annotated[str | None, Field(pattern=r"^[A-Za-z0-9-]{1,64}$")] = None,
        publish_port: Annotated[int | None, Field(ge=0, le=65535)] = None,
        wait_s: Annotated[float, Field(ge=0.0, le=MAX_WAIT_S)] = 0.0,
        ctx: Context | None = None,
    ) -> StartOut:
        """Bring the compose service up with `model` (qat, bf16, a repo id) and optional container settings
        (T4SERVE_* names, e.g. T4SERVE_MAX_MODEL_LEN) on GPU `gpu` (index or UUID; default compose's 0), the API
        published on 127.0.0.1:`publish_port` (default 8000). Returns at once: a cold start takes minutes, so poll
        server_status. With `wait_s` it follows the start that long first, reporting each phase as progress."""
        chosen = validate_settings(model, settings or {}, self.env.base_env())
        container = await in_thread(self._service)
        if container is not None and container.state in ("running", "restarting"):
            raise EngineError(
                "start_vllm_server: the server is already running",
                found=f"container {container.name} ({container.id}) is {container.state}",
                required="no running t4serve container in this compose project",
                fix="call stop_vllm_server first, or server_status to follow the running one",
            )
        self._check_secret_file()
        environment = {"T4SERVE_MODEL": chosen.model.requested, **(settings or {})}
        compose_env: dict[str, str] = {}
        if gpu:
            compose_env["T4SERVE_GPU"] = gpu
        if publish_port is not None:
            compose_env["T4SERVE_PUBLISH_PORT"] = str(publish_port)
        if ctx is not None:
            await ctx.report_progress(0, None, f"compose up: {chosen.model.target}")
        container = await in_thread(lambda: self.engine.up(environment, compose_env))
        api_url = await in_thread(lambda: self._api_url(container))
        phase = None
        deadline = time.monotonic() + float(wait_s)
        step = 0
        while time.monotonic() < deadline:
            status = await in_thread(lambda: self._status())
            phase = status.phase
            step += 1
            if ctx is not None:
                await ctx.report_progress(step, None, f"{status.phase_label or status.container_state}")
            if status.ready or not status.running or phase in ("failed", "canary_failed"):
                break
            await anyio.sleep(2.0)
        return StartOut(
            container=container.id,
            container_state=container.state,
            model=chosen.model.target,
            api_url=api_url,
            poll="server_status (and server_logs); ready when its `ready` is true",
            phase=phase,
            note="a cold start downloads the checkpoint, loads it, compiles and runs the canary: "
            "minutes; server_status estimates the time left from past starts",
        )

    def _check_secret_file(self) -> None:
        """compose.yaml's hf_token secret must exist (docker-compose 1.29 refuses to start without it); its content
        is never read here."""
        raw = self.env.environ.get("HF_TOKEN_SECRET_FILE") or "./secrets/hf_token"
        path = Path(raw) if Path(raw).is_absolute() else self.engine.project_directory / raw
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
        from t4serve.commands.status import render_status
        from t4serve.supervise.logwatch import compare
        from t4serve.supervise.readout import time_to_ready
        from t4serve.supervise.state import PHASE_LABELS, ServeState

        container = self.engine.service()
        empty: dict[str, Any] = {
            "phase": None,
            "phase_label": None,
            "phase_seconds": None,
            "model": None,
            "served_model_name": None,
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
        api_url = self._api_url(container)
        if done.returncode != 0:
            text = f"the server has no state yet: {(done.stderr.strip() or 'no output').splitlines()[-1]}"
            return StatusOut(running=True, ready=False, api_url=api_url, text=text, **base, **empty)
        state = from_dict(ServeState, json.loads(done.stdout), where="t4serve status --json")
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
            text=redact(render_status(state, now), self.env.secrets()),
            **base,
        )

    @guarded
    async def server_status(self) -> StatusOut:
        """Where the server is: container state and health, phase and how long it has lasted, vLLM's logged
        figures beside the plan's predictions, the canary, and the time-to-ready estimate from past starts."""
        return await in_thread(self._status)

    @guarded
    async def server_logs(
        self,
        tail: Annotated[int, Field(ge=1, le=MAX_LOG_LINES)] = 100,
        since: Annotated[str | None, Field(max_length=40, pattern=r"^[0-9A-Za-z:.+-]+$")] = None,
    ) -> LogsOut:
        """The container's last `tail` log lines (at most 500 and 64 KiB), optionally only those `since` a time
        (e.g. 10m, 2026-12-03T10:00:00)."""
        container = await in_thread(self._service)
        if container is None:
            raise ConfigError(
                "server_logs: no t4serve container",
                found="none in this compose project",
                required="a started server",
                fix="call start_vllm_server",
            )
        text = await in_thread(lambda: self.engine.logs(container.id, int(tail), since))
        lines, truncated, size = cap_lines(redact(text, self.env.secrets()), int(tail), MAX_LOG_BYTES)
        return LogsOut(container=container.id, lines=lines, truncated=truncated, bytes=size)

    @guarded
    async def stop_vllm_server(self, timeout_s: Annotated[int, Field(ge=1, le=600)] = 90) -> StopOut:
        """Stop the server (vLLM drains in-flight requests first) and remove its container and network. The cache
        volumes (download, compile caches, start history) stay."""
        before = await in_thread(lambda: self.engine.down(int(timeout_s)))
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
        prompt: Annotated[str | None, Field(max_length=MAX_PROMPT_CHARS)] = None,
        messages: Annotated[list[ChatMessage] | None, Field(max_length=64)] = None,
        max_tokens: Annotated[int, Field(ge=1, le=MAX_QUERY_TOKENS)] = 64,
        temperature: Annotated[float, Field(ge=0.0, le=2.0)] = 0.0,
    ) -> QueryOut:
        """One completion from the served model, with its latency: `prompt` (a plain completion) or `messages`
        (a chat), at most 1024 tokens."""
        if (prompt is None) == (messages is None):
            raise ConfigError(
                "query: give exactly one of prompt and messages",
                found="both" if prompt is not None else "neither",
                required="prompt (text) or messages (a chat)",
                fix='e.g. {"prompt": "17*23="}',
            )
        status = await in_thread(self._status)
        if not status.ready or status.api_url is None:
            raise _not_ready("query", status, "phase ready, with the API published on the host")
        api_key = client_api_key(self.env.environ, "VLLM_API_KEY")
        body: dict[str, Any] = {"model": status.served_model_name, "max_tokens": max_tokens, "temperature": temperature}
        if messages is not None:
            body["messages"] = [m.model_dump() for m in messages]
            path = "/v1/chat/completions"
        else:
            body["prompt"] = prompt
            path = "/v1/completions"
        url = status.api_url + path
        answer, latency = await in_thread(lambda: post_json(url, body, api_key, QUERY_TIMEOUT_S))
        choice = (answer.get("choices") or [{}])[0]
        text = choice.get("text") if messages is None else (choice.get("message") or {}).get("content")
        usage = answer.get("usage") or {}
        return QueryOut(
            text=redact(str(text or ""), self.env.secrets()),
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
        inputs: Annotated[list[int] | None, Field(min_length=1, max_length=4)] = None,
        concurrency: Annotated[list[int] | None, Field(min_length=1, max_length=6)] = None,
        repeats: Annotated[int, Field(ge=1, le=5)] = 1,
        output_len: Annotated[int, Field(ge=1, le=2048)] = 128,
        num_prompts: Annotated[int | None, Field(ge=1, le=1000)] = None,
    ) -> BenchStart:
        """Start `t4serve bench` against the running server, in its container, in the background; returns a run id
        for benchmark_status. Inputs are prompt lengths in tokens, concurrency the streams per cell."""
        inputs = inputs or [512]
        concurrency = concurrency or [1, 4]
        status = await in_thread(self._status)
        if not status.ready or status.container is None:
            raise _not_ready("run_benchmark", status, "a ready server in a container")
        for name, values in (("inputs", inputs), ("concurrency", concurrency)):
            if any(v < 1 or v > 32768 for v in values):
                raise ConfigError(
                    f"run_benchmark: {name} out of range",
                    found=str(values),
                    required="whole numbers from 1 to 32768",
                    fix=f"{name}=[512]",
                )
        stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime(self.env.clock()))
        run_id = f"{stamp}-{uuid.uuid4().hex[:6]}"
        folder = f"{BENCH_ROOT}/{run_id}"
        args = [
            "--models",
            str(status.model),
            "--base-url",
            "http://127.0.0.1:8000",
            "--output",
            folder,
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
        script = 'd=$1; shift; mkdir -p "$d" && t4serve bench "$@" >"$d/bench.log" 2>&1; echo $? >"$d/exit-code"'
        container = status.container
        done = await in_thread(
            lambda: self.engine.exec(container, ["sh", "-c", script, "sh", folder, *args], detach=True)
        )
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

    @guarded
    async def benchmark_status(self, run_id: Annotated[str, Field(pattern=RUN_ID.pattern)]) -> BenchStatus:
        """A benchmark's progress (its log's last lines) and, when done, its tables (report.md) and plots, copied to
        this host."""
        container = await in_thread(self._service)
        if container is None or container.state != "running":
            raise ConfigError(
                "benchmark_status: no running t4serve container",
                found=container.state if container else "none",
                required="the container the benchmark runs in",
                fix="the results stay in the t4serve-cache volume under bench/; start the server again to read them",
            )
        folder = f"{BENCH_ROOT}/{run_id}"
        done = await in_thread(lambda: self.engine.exec(container.id, ["python3", "-c", READ_BENCH, folder]))
        if done.returncode != 0:
            raise ConfigError(
                f"benchmark_status: no benchmark {run_id}",
                found=done.stderr.strip()[-300:],
                required="a run id from run_benchmark",
                fix="call run_benchmark",
            )
        seen = json.loads(done.stdout)
        secrets = self.env.secrets()
        code = seen["exit_code"]
        state: Literal["running", "done", "failed"] = "running" if code is None else ("done" if code == 0 else "failed")
        host_folder = None
        plots: list[str] = []
        if code is not None and seen["report"] is not None:
            target = self.env.data_dir / "bench" / run_id
            if not target.exists():
                await in_thread(lambda: self.engine.copy_out(container.id, folder, target))
            host_folder = str(target)
            plots = [str(target / name) for name in seen["plots"]]
        return BenchStatus(
            run_id=run_id,
            state=state,
            exit_code=code,
            log_tail=redact(tail_text(seen["log"], 8 * 1024), secrets),
            report_md=redact(tail_text(seen["report"], BENCH_TEXT_BYTES), secrets)
            if seen["report"] is not None
            else None,
            host_folder=host_folder,
            plots=plots,
        )


# Runs in the container (its Python): a benchmark folder's exit code, log tail, report and plot names, as JSON.
READ_BENCH = """
import json, os, sys
d = sys.argv[1]
if not os.path.isdir(d):
    sys.exit(f"no such folder {d}")
def read(name, limit):
    try:
        with open(os.path.join(d, name), "rb") as f:
            f.seek(0, 2); size = f.tell(); f.seek(max(0, size - limit))
            return f.read().decode("utf-8", "replace")
    except OSError:
        return None
code = read("exit-code", 32)
print(json.dumps({"exit_code": int(code) if code and code.strip().lstrip("-").isdigit() else None,
                  "log": read("bench.log", 16384) or "", "report": read("report.md", 65536),
                  "plots": sorted(n for n in os.listdir(d) if n.endswith(".png"))}))
"""


def post_json(url: str, body: dict[str, Any], api_key: str | None, timeout: float) -> tuple[dict[str, Any], float]:
    """POST `body` as JSON; (the JSON answer, seconds it took). The key goes only in the Authorization header."""
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    request = urllib.request.Request(url, data=json.dumps(body).encode("utf-8"), headers=headers, method="POST")
    began = time.monotonic()
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            data = response.read()
    except urllib.error.HTTPError as exc:
        detail = exc.read()[:300].decode("utf-8", "replace")
        fix = (
            "give t4serve mcp the server's key: T4SERVE_API_KEY_FILE (or T4SERVE_API_KEY) in its environment"
            if exc.code == 401
            else "server_logs shows the server's side"
        )
        raise ConfigError(
            f"query: the server answered HTTP {exc.code}", found=detail, required="HTTP 200", fix=fix
        ) from None
    except (urllib.error.URLError, TimeoutError, OSError) as exc:
        raise ConfigError(
            f"query: no answer from {url}",
            found=str(getattr(exc, "reason", exc)),
            required=f"an answer within {timeout:g} s",
            fix="server_status, then server_logs",
        ) from None
    latency = time.monotonic() - began
    try:
        answer = json.loads(data)
    except json.JSONDecodeError:
        raise ConfigError(
            "query: the answer is not JSON",
            found=data[:200].decode("utf-8", "replace"),
            required="an OpenAI-style JSON answer",
            fix="server_logs shows the server's side",
        ) from None
    if not isinstance(answer, dict):
        raise ConfigError(
            "query: unexpected answer",
            found=str(answer)[:200],
            required="a JSON object",
            fix="server_logs shows the server's side",
        )
    return answer, latency


# name -> (annotations, read-only?)
TOOL_ANNOTATIONS: dict[str, ToolAnnotations] = {
    "check_host_capacity": READ_ONLY,
    "verify_gpu_arch": READ_ONLY,
    "verify_turing_patch": READ_ONLY,
    "plan": READ_ONLY,
    "server_status": READ_ONLY,
    "server_logs": READ_ONLY,
    "benchmark_status": ToolAnnotations(
        read_only_hint=True, destructive_hint=False, idempotent_hint=True, open_world_hint=False
    ),
    # A completion changes nothing on the host; its answer may differ from call to call (temperature).
    "query": ToolAnnotations(read_only_hint=True, destructive_hint=False, idempotent_hint=False, open_world_hint=False),
    # Replaces the image tag with a new build (the old image is pruned); building the same tree again is the same.
    "apply_turing_patch": ToolAnnotations(
        read_only_hint=False, destructive_hint=True, idempotent_hint=True, open_world_hint=True
    ),
    "start_vllm_server": ToolAnnotations(
        read_only_hint=False, destructive_hint=False, idempotent_hint=False, open_world_hint=True
    ),
    "stop_vllm_server": ToolAnnotations(
        read_only_hint=False, destructive_hint=True, idempotent_hint=True, open_world_hint=False
    ),
    "run_benchmark": ToolAnnotations(
        read_only_hint=False, destructive_hint=False, idempotent_hint=False, open_world_hint=False
    ),
}


def build_server(env: ToolEnv, read_only: bool = False) -> MCPServer:
    """The MCP server with every tool, or only the read-only ones."""
    server: MCPServer = MCPServer(
        name="t4serve",
        version=__version__,
        instructions=(
            "Serve Gemma 4 E2B with vLLM on a Tesla T4 (or any Turing-or-newer NVIDIA GPU) through Docker compose. "
            "In order: check_host_capacity, verify_gpu_arch, apply_turing_patch (only when the image is missing or "
            "verify_turing_patch fails), plan, start_vllm_server, then server_status until ready; query, "
            "run_benchmark / benchmark_status; stop_vllm_server."
        ),
    )
    tools = Tools(env)
    for name, hints in TOOL_ANNOTATIONS.items():
        if read_only and not hints.read_only_hint:
            continue
        fn = getattr(tools, name)
        server.add_tool(fn, name=name, annotations=hints, structured_output=True)
    return server


def default_data_dir(environ: Mapping[str, str]) -> Path:
    raw = environ.get("T4SERVE_MCP_DATA_DIR")
    if raw:
        return Path(raw)
    cache = environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "t4serve-mcp"
