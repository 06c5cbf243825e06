"""The files `serve` and the supervised programs share in the state directory, and how they are written.

`RunSpec` (run-spec.json) is written once by `serve`: what the vLLM wrapper runs and what the plan predicted.
`ServeState` (state.json) is rewritten by the wrapper as phases change; healthcheck and status only read it.
`ExitRequest` (exit-request.json) is written by the listener when it ends supervisord, for PID 1 to exit with.
Every write is atomic (temp file in the same folder, fsync, rename), so a reader never sees half a file. Every read
treats the file as untrusted (t4serve.untrusted: a bounded regular file, bounded JSON, finite numbers), and a state
is checked for what its readers rely on (known phases, a host and port to reach) before anyone uses it.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TypeVar

from t4serve.atomic import write_atomic
from t4serve.errors import ConfigError
from t4serve.serde import from_dict, to_dict
from t4serve.supervise.phases import PHASES
from t4serve.untrusted import (
    Untrusted,
    check_host,
    check_int,
    check_text,
    load_json_file,
    printable,
)

STATE_SCHEMA = 1
# state.json holds 40 log lines and a few figures: some KB. A run spec holds the argv. Anything past this is not ours.
MAX_STATE_BYTES = 1 << 20
STATE_FILE = "state.json"
RUN_SPEC_FILE = "run-spec.json"
EXIT_REQUEST_FILE = "exit-request.json"
SUPERVISORD_CONF_FILE = "supervisord.conf"
# Written by `serve` when it stopped on a configuration error and waits (T4SERVE_ON_CONFIG_ERROR=wait): a
# ConfigErrorRecord. `t4serve status` reports it as the phase config_error; healthcheck answers from it.
CONFIG_ERROR_FILE = "config-error.json"

@dataclass(frozen=True)
class PhaseMark:
    phase: str
    began_at: float


@dataclass(frozen=True)
class Figure:
    """A number vLLM logged, with the log line it came from so a user can check it."""

    name: str
    value: float
    unit: str
    line: str


@dataclass(frozen=True)
class Prediction:
    """What the plan expected for a figure vLLM will log, with the plan's arithmetic."""

    name: str
    value: float
    unit: str
    how: str


@dataclass(frozen=True)
class CanaryRecord:
    ok: bool
    prompt: str
    text: str | None
    reason: str | None
    hint: str | None
    seconds: float


@dataclass(frozen=True)
class RunSpec:
    """What the vLLM wrapper runs and checks. Holds no secret: HF_TOKEN and VLLM_API_KEY travel only in the inherited
    environment (`env` here is the plan's, never a secret)."""

    argv: list[str]
    env: dict[str, str]
    model: str
    served_model_name: str
    host: str
    port: int
    dtype: str | None
    shutdown_timeout: int
    canary: bool
    gpu_name: str | None
    # Where huggingface_hub writes while downloading (HF_HOME/hub), watched for `*.incomplete` blobs.
    hf_hub_cache: str
    cache_dir: str
    predictions: dict[str, Prediction] = field(default_factory=dict)
    # The compile rungs the wrapper may use, in order, each [name, *vLLM flags] (t4serve.config.compilation); empty
    # where T4SERVE_VLLM_ARGS sets compilation itself.
    compile_ladder: list[list[str]] = field(default_factory=list)


@dataclass(frozen=True)
class ServeState:
    schema: int
    phase: str
    # When `serve` began (container start), and when this vLLM attempt began.
    started_at: float
    attempt_started_at: float
    updated_at: float
    # 1 for the first vLLM start in this container, +1 for each restart by supervisord.
    attempt: int
    model: str
    served_model_name: str
    host: str
    port: int
    gpu_name: str | None
    phases: list[PhaseMark] = field(default_factory=list)
    figures: dict[str, Figure] = field(default_factory=dict)
    predictions: dict[str, Prediction] = field(default_factory=dict)
    # Why the phase is canary_failed or failed, the hint or diagnosis that goes with it, and vLLM's exit code.
    reason: str | None = None
    diagnosis: str | None = None
    fix: str | None = None
    exit_code: int | None = None
    canary: CanaryRecord | None = None
    last_lines: list[str] = field(default_factory=list)
    # Time-to-ready estimate from past starts (t4serve.supervise.history), printed at start.
    estimate_seconds: float | None = None
    estimate_phases: dict[str, float] = field(default_factory=dict)
    wrapper_pid: int | None = None

    def phase_began_at(self) -> float:
        return self.phases[-1].began_at if self.phases else self.attempt_started_at

    def with_phase(self, phase: str, now: float) -> ServeState:
        if phase not in PHASES:
            raise ValueError(f"unknown phase {phase!r}")
        if phase == self.phase and self.phases:
            return self
        return replace(self, phase=phase, phases=[*self.phases, PhaseMark(phase, now)], updated_at=now)


def new_state(spec: RunSpec, *, started_at: float, attempt: int = 1, now: float | None = None) -> ServeState:
    t = time.time() if now is None else now
    return ServeState(
        schema=STATE_SCHEMA,
        phase="starting",
        started_at=started_at,
        attempt_started_at=t,
        updated_at=t,
        attempt=attempt,
        model=spec.model,
        served_model_name=spec.served_model_name,
        host=spec.host,
        port=spec.port,
        gpu_name=spec.gpu_name,
        phases=[PhaseMark("starting", t)],
        predictions=dict(spec.predictions),
    )


@dataclass(frozen=True)
class ConfigErrorRecord:
    """The configuration error `serve` stopped on (T4SERVE_ON_CONFIG_ERROR=wait): its parts, as printed."""

    what: str
    found: str | None
    required: str | None
    fix: str | None
    stopped_at: float

    def headline(self) -> str:
        """Its first line (a message about several settings lists them on the lines after)."""
        return (self.what.splitlines() or ["(no message)"])[0]


@dataclass(frozen=True)
class ExitRequest:
    """The listener's decision to end the container, and the exit code PID 1 should use."""

    code: int
    reason: str
    requested_at: float


def _dump(obj: Any) -> str:
    return json.dumps(to_dict(obj), indent=2) + "\n"


T = TypeVar("T")


def _load(cls: type[T], path: Path, what: str) -> T:
    try:
        obj = from_dict(cls, load_json_file(path, MAX_STATE_BYTES, "the file"))
        if isinstance(obj, ServeState):
            check_state(obj)
        return obj
    except FileNotFoundError:
        raise ConfigError(
            f"{what} not found",
            found=f"no file {path}",
            required=f"`t4serve serve` writes it at start in T4SERVE_STATE_DIR ({path.parent})",
            fix="run this in the container started by `t4serve serve`, or point T4SERVE_STATE_DIR at its state folder",
        ) from None
    except (Untrusted, ConfigError) as exc:
        reason = exc.reason if isinstance(exc, Untrusted) else str(exc)
        raise ConfigError(
            f"{what} is unreadable",
            found=f"{path}: {reason}",
            required=f"a {cls.__name__} JSON file written by this t4serve version",
            fix="restart the container; `t4serve serve` rewrites it at start",
        ) from None


def check_state(state: ServeState) -> None:
    """What healthcheck and status rely on: known phases (at least one mark), a host and port to reach, one-word
    names; Untrusted otherwise."""
    if state.phase not in PHASES:
        raise Untrusted(f"phase must be one of {', '.join(PHASES)}, found {state.phase[:40]!r}")
    if not state.phases:
        raise Untrusted("phases must list at least the phase the server is in")
    for mark in state.phases:
        if mark.phase not in PHASES:
            raise Untrusted(f"phases must name known phases, found {mark.phase[:40]!r}")
    check_int(state.port, "port", 1, 65535)
    check_int(state.attempt, "attempt", 1, 1 << 31)
    try:
        check_host(state.host)
    except Untrusted as exc:
        raise Untrusted(f"host {exc.reason}, found {state.host[:80]!r}") from None
    for name, value in (("model", state.model), ("served_model_name", state.served_model_name)):
        check_text(value, name)


def write_state(state_dir: Path, state: ServeState) -> None:
    write_atomic(state_dir / STATE_FILE, _dump(state))


def read_state(state_dir: Path) -> ServeState:
    return _load(ServeState, state_dir / STATE_FILE, "the server state file")


def write_config_error(state_dir: Path, record: ConfigErrorRecord) -> None:
    write_atomic(state_dir / CONFIG_ERROR_FILE, _dump(record), mode=0o600)


def read_config_error(state_dir: Path) -> ConfigErrorRecord | None:
    """The configuration error `serve` stopped on and now waits after (CONFIG_ERROR_FILE), or None when it did not.
    A file that cannot be read is still such a stop: its record says why its message is missing."""
    path = state_dir / CONFIG_ERROR_FILE
    if not path.exists() and not path.is_symlink():  # none (or no state folder: read_state says so)
        return None
    try:
        record = from_dict(ConfigErrorRecord, load_json_file(path, MAX_STATE_BYTES, "the file"), where=path.name)
    except FileNotFoundError:
        return None
    except (Untrusted, ConfigError) as exc:
        reason = exc.reason if isinstance(exc, Untrusted) else exc.what
        return ConfigErrorRecord(f"(its message cannot be read: {printable(reason)[:300]})", None, None, None, 0.0)
    parts = (record.what, record.found, record.required, record.fix)
    # Lines kept (a message lists every bad setting), each line's control characters escaped.
    what, found, required, fix = (None if p is None else "\n".join(map(printable, p[:4000].splitlines()))
                                  for p in parts)  # fmt: skip
    return ConfigErrorRecord(what or "(no message)", found, required, fix, record.stopped_at)


def write_run_spec(state_dir: Path, spec: RunSpec) -> Path:
    path = state_dir / RUN_SPEC_FILE
    write_atomic(path, _dump(spec), mode=0o600)
    return path


def read_run_spec(path: Path) -> RunSpec:
    return _load(RunSpec, path, "the run spec")


def write_exit_request(state_dir: Path, request: ExitRequest) -> None:
    write_atomic(state_dir / EXIT_REQUEST_FILE, _dump(request))


def read_exit_request(state_dir: Path) -> ExitRequest | None:
    path = state_dir / EXIT_REQUEST_FILE
    if not path.exists():
        return None
    return _load(ExitRequest, path, "the listener's exit request")
