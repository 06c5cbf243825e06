"""How a tool call of `t4serve mcp` runs: errors as tool errors, secrets redacted, blocking work in a worker thread with
progress and cancellation, the deployment's lock, and the settings a tool is given checked by t4serve's own parser.

`ToolGroup` is what a set of tools (t4serve.mcp.checktools, servertools, benchtools) derives from: one `ToolEnv` (the
engine, this process's environment, a host folder for results and locks). `guarded` wraps every tool: a failure a
user can meet becomes a tool error reading "what failed / found / required / fix" (never a traceback), a bug a tool
error saying so, and every result and error (structured fields included) has any secret this process knows replaced by
`<redacted>`, then escape sequences and control characters removed. To know them it reads the variables and the
secret files they name (known_secrets), for redaction only.
`blocking` runs work in a worker thread, reports progress (notifications/progress, when the client sent a progress
token) while it lasts, and on a cancellation (notifications/cancelled) stops the Docker clients it started
(t4serve.host.engine.cancelled_by). `ToolEnv.exclusive` holds the deployment's lock (t4serve.mcp.deploylock).
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import threading
import time
import traceback
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, ParamSpec, TypeVar, cast

import anyio
import anyio.to_thread
from mcp.server.mcpserver import Context
from mcp.server.mcpserver.exceptions import ToolError
from pydantic import AfterValidator, BaseModel, StringConstraints, WithJsonSchema

from t4serve.config.secrets import known_secrets
from t4serve.config.settings import VARIABLES_BY_NAME, Settings
from t4serve.errors import ConfigError, T4ServeError
from t4serve.host.engine import Cancelled, Engine, RedactedEngine, cancelled_by
from t4serve.host.hostcheck import MAX_COMPOSE_BYTES, compose_token_route
from t4serve.mcp.deploylock import Holder, hold, lock_file
from t4serve.mcp.models import StatusOut
from t4serve.probes.gpu import Nvml
from t4serve.untrusted import PATH_MAX_BYTES, Untrusted, plain_text, read_text_bounded, redact, shown

P = ParamSpec("P")
R = TypeVar("R")

# A blocking call reports progress this often; a cancelled one is given this long to stop its clients.
HEARTBEAT_S = 2.0
STOP_WAIT_S = 30.0
# Settings a tool may not pass: secrets, and the files that hold them (compose.yaml's secrets carry those).
REFUSED_SETTINGS = ("HF_TOKEN", "HF_TOKEN_FILE", "T4SERVE_API_KEY", "T4SERVE_API_KEY_FILE")

# The longest value a tool takes: a checkpoint (a repo id, or a folder path, at most PATH_MAX), a setting's text
# (T4SERVE_VLLM_ARGS, a line of vLLM flags, is the longest).
MAX_MODEL_CHARS = PATH_MAX_BYTES
# A first bound on any setting's text, far above every setting's own (Variable.max_chars, at most 8,192 for
# T4SERVE_VLLM_ARGS), so that the refusal names the setting's own limit.
MAX_SETTING_TEXT = 1 << 20
# The settings a tool may pass: every setting but the secrets and the checkpoint (the `model` argument).
TOOL_SETTINGS = tuple(name for name in VARIABLES_BY_NAME if name not in (*REFUSED_SETTINGS, "T4SERVE_MODEL"))

MODEL_HELP = (
    "checkpoint: qat (int4 weights, the default), bf16, a Hugging Face repo id org/name, or a folder on this host "
    "holding config.json (start_vllm_server mounts it read-only into the container)"
)
SETTINGS_HELP = (
    "container settings by variable name, values as text, e.g. {\"T4SERVE_MAX_MODEL_LEN\": \"8192\"}; names from "
    "`t4serve env`; secrets are refused"
)


# `settings` as tools take it: setting name -> its text (null: unset). Its published schema names every setting a tool
# may pass and no other (additionalProperties false, as the server refuses any other name), so a client that converts
# schemas to a strict form (every property named, none extra) can; validate_settings says why a name is refused.
def _within_limits(settings: dict[str, str | None]) -> dict[str, str | None]:
    """Each setting's text within that setting's own limit (the one `t4serve` itself refuses past)."""
    for name, value in settings.items():
        limit = VARIABLES_BY_NAME[name].max_chars if name in VARIABLES_BY_NAME else MAX_SETTING_TEXT
        if value is not None and len(value) > limit:
            raise ValueError(f"{name}: at most {limit:,} characters (found {len(value):,})")
    return settings


SettingsArgument = Annotated[
    dict[str, Annotated[str, StringConstraints(max_length=MAX_SETTING_TEXT)] | None],
    AfterValidator(_within_limits),
    WithJsonSchema({
        "type": "object",
        "properties": {name: {"anyOf": [{"type": "string", "maxLength": VARIABLES_BY_NAME[name].max_chars},
                                        {"type": "null"}]}
                       for name in TOOL_SETTINGS},
        "additionalProperties": False,
    }),
]  # fmt: skip
# `model` as tools take it.
ModelArgument = Annotated[str, StringConstraints(max_length=MAX_MODEL_CHARS)]


def given_settings(settings: Mapping[str, str | None] | None) -> dict[str, str]:
    """The settings a tool was given, a null value left out (unset)."""
    return {name: value for name, value in (settings or {}).items() if value is not None}


def not_ready(tool: str, status: StatusOut, required: str) -> ConfigError:
    """The one refusal of a tool that needs a ready server, naming the phase it found."""
    return ConfigError(
        f"{tool}: the server is not ready",
        found=f"phase {status.phase_label or status.container_state or 'no container'}",
        required=required,
        fix="call server_status until ready (start_vllm_server if none is running)",
    )


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
        secrets = owner.env.secrets() if isinstance(owner, ToolGroup) else []
        try:
            result = await fn(*args, **kwargs)
        except ToolError as exc:
            raise ToolError(tool_error(fn.__name__, str(exc), secrets)) from None
        except T4ServeError as exc:
            raise ToolError(tool_error(fn.__name__, exc.message(), secrets)) from None
        except Cancelled as exc:
            # Only reached when the engine stopped a client for a cancellation this call did not see itself.
            raise ToolError(tool_error(fn.__name__, f"cancelled ({exc})", secrets)) from None
        except Exception as exc:
            frames = traceback.extract_tb(exc.__traceback__)
            where = f" at {Path(frames[-1].filename).name}:{frames[-1].lineno}" if frames else ""
            said = shown(redact(str(exc), secrets), 500)
            raise ToolError(tool_error(fn.__name__, "internal error (a bug in t4serve; please report it with this "
                                       f"line)\n  found: {type(exc).__name__}: {said}{where}", secrets)) from None
        return clean_result(result, secrets)

    return wrapper


def tool_error(tool: str, message: str, secrets: Sequence[str]) -> str:
    """A tool error's text: secrets redacted, then cut (capped), control characters and escape sequences removed. It
    does not begin with the tool's name: the SDK puts "Error executing tool NAME: " before it."""
    text = capped(plain_text(redact(message, secrets)))
    return text.removeprefix(f"{tool}: ")


def clean_result(result: R, secrets: Sequence[str]) -> R:
    """A tool's result as a client may be shown it: in every string (structured fields and keys included) every
    secret redacted, then escape sequences and control characters removed (newlines and tabs kept); a model is
    rebuilt from its cleaned fields when any changed."""
    if not isinstance(result, BaseModel):
        return result
    dumped = result.model_dump(mode="json")
    cleaned = _cleaned(dumped, secrets)
    return result if cleaned == dumped else cast(R, type(result).model_validate(cleaned))


def _cleaned(value: Any, secrets: Sequence[str]) -> Any:
    if isinstance(value, str):
        return plain_text(redact(value, secrets))
    if isinstance(value, dict):
        return {_cleaned(k, secrets): _cleaned(v, secrets) for k, v in value.items()}
    if isinstance(value, list):
        return [_cleaned(v, secrets) for v in value]
    return value


def cap_lines(text: str, max_lines: int, max_bytes: int) -> tuple[list[str], bool, int]:
    """The last `max_lines` lines of `text` (another program's output: escape sequences and control characters
    removed) whose UTF-8 size fits `max_bytes` (newest kept), and whether any line was dropped for the byte cap."""
    lines = plain_text(text).splitlines()[-max_lines:]
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
    """The end of `text` (another program's output, escape sequences and control characters removed), at most
    `max_bytes` of UTF-8."""
    text = plain_text(text)
    data = text.encode("utf-8")
    return data[-max_bytes:].decode("utf-8", "ignore") if len(data) > max_bytes else text


def validate_settings(model: str | None, settings: Mapping[str, str | None] | None,
                      base: Mapping[str, str]) -> Settings:  # fmt: skip
    """The container's settings a tool was given, checked by t4serve's own parser (every bad value in one error)."""
    settings = given_settings(settings)
    for name in settings:
        if name in REFUSED_SETTINGS:
            raise ConfigError(
                f"settings: {name} cannot be passed through a tool",
                found=f"{name} in the settings",
                required="no secrets in tool arguments (they would pass through the assistant)",
                fix="the HF token goes in t4serve mcp's own environment (HF_TOKEN: compose.yaml's hf_token secret "
                "reads it) or compose.token-file.yaml's secret file; the API key as docs/operations.md's "
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


# The Docker engine's default socket, as DOCKER_HOST may spell it: the same engine as DOCKER_HOST unset.
LOCAL_ENGINE_ADDRESSES = ("unix:///var/run/docker.sock", "unix:///run/docker.sock", "unix://var/run/docker.sock")


def engine_address(docker_host: str) -> str:
    """DOCKER_HOST as a deployment's name holds it: "local" for unset or the default socket, else without a trailing
    slash."""
    address = docker_host.strip().rstrip("/")
    return "local" if not address or address in LOCAL_ENGINE_ADDRESSES else address


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

    def __post_init__(self) -> None:
        # Every answer of the engine has this process's secrets redacted before any tool reads it.
        if not isinstance(self.engine, RedactedEngine):
            self.engine = RedactedEngine(self.engine, self.secrets)

    def secrets(self) -> list[str]:
        return known_secrets(self.environ, [self.token_file()])

    def token_route(self) -> str | None:
        """How the compose file gives the HF token: "environment" (compose.yaml: HF_TOKEN in compose's environment,
        this process's), "file" (compose.token-file.yaml: token_file), None when unreadable or without that secret."""
        try:
            return compose_token_route(read_text_bounded(self.compose_file, MAX_COMPOSE_BYTES, "the compose file"))
        except (OSError, Untrusted):
            return None

    def token_file(self) -> Path:
        """compose.token-file.yaml's hf_token secret file as compose finds it: HF_TOKEN_SECRET_FILE, else
        ./secrets/hf_token, a relative path from the compose project's folder."""
        raw = self.environ.get("HF_TOKEN_SECRET_FILE") or "./secrets/hf_token"
        return Path(raw) if Path(raw).is_absolute() else self.engine.project_directory / raw

    def base_env(self) -> dict[str, str]:
        """Host-side settings that planning reads (where the HF cache is, whether to go online)."""
        return {k: v for k, v in self.environ.items() if k in ("HF_HOME", "HF_HUB_OFFLINE", "XDG_CACHE_HOME")}

    def deployment(self) -> str:
        """The deployment as compose and Docker see it, so two spellings of one deployment take one lock: the compose
        project as compose picks it (-p, else COMPOSE_PROJECT_NAME, else the folder's name; normalised as compose
        does) on this engine (DOCKER_HOST, where the default socket spelled out is the local engine too)."""
        raw = self.engine.project or self.environ.get("COMPOSE_PROJECT_NAME") or self.engine.project_directory.name
        project = re.sub(r"[^-_a-z0-9]", "", raw.lower())
        return f"{project}@{engine_address(self.environ.get('DOCKER_HOST', ''))}"

    @contextlib.contextmanager
    def exclusive(self, tool: str, ctx: Context | None) -> Iterator[None]:
        """Hold the deployment's lock for a state-changing tool, or fail at once saying who holds it."""
        holder = Holder(tool=tool, pid=os.getpid(), client=client_name(ctx), since=self.clock())
        with hold(lock_file(self.data_dir, self.deployment()), holder):
            yield


class ToolGroup:
    """A set of tools over one ToolEnv: each method marked with t4serve.mcp.registry.tool is one tool, its docstring
    the tool's description (the first line its purpose, then how it behaves)."""

    def __init__(self, env: ToolEnv) -> None:
        self.env = env
        self.engine = env.engine
