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
import os
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Annotated, Any, TypeVar

from t4serve.atomic import write_atomic
from t4serve.errors import ConfigError
from t4serve.serde import Check, Items, OneOf, Range, Text, from_dict, to_dict
from t4serve.supervise.phases import PHASES
from t4serve.untrusted import (
    PATH_MAX_BYTES,
    Untrusted,
    check_host,
    check_path,
    load_json_file,
    printable,
    shown,
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

# The bounds of what these files hold, for the one typed reader (t4serve.serde): a time is seconds since the epoch up
# to the year 2242, a duration at most 31 years, a figure within 1e18 either way (KV tokens, GiB, seconds); a phase
# one of the table's; text shown without its control characters: a log line as the wrapper keeps it (MAX_LINE_CHARS:
# vLLM's longest, its engine config, is a few KB), a message of many lines.
MAX_TIMESTAMP = float(2**33)
MAX_SECONDS = 1e9
MAX_FIGURE = 1e18
MAX_LINE_CHARS = 16_384
Timestamp = Annotated[float, Range(0.0, MAX_TIMESTAMP)]
Seconds = Annotated[float, Range(0.0, MAX_SECONDS)]
FigureValue = Annotated[float, Range(-MAX_FIGURE, MAX_FIGURE)]
Phase = Annotated[str, OneOf(tuple(PHASES))]
Name = Annotated[str, Text(200)]
Line = Annotated[str, Text(MAX_LINE_CHARS)]
Message = Annotated[str, Text(64_000, lines=True)]
ExitCode = Annotated[int, Range(-255, 255)]


def _host(value: str) -> None:
    try:
        check_host(value)
    except Untrusted as exc:
        raise Untrusted(f"host {exc.reason}, found {value[:80]!r}") from None


@dataclass(frozen=True)
class PhaseMark:
    phase: Phase
    began_at: Timestamp


@dataclass(frozen=True)
class Figure:
    """A number vLLM logged, with the log line it came from so a user can check it."""

    name: Name
    value: FigureValue
    unit: Name
    line: Line


@dataclass(frozen=True)
class Prediction:
    """What the plan expected for a figure vLLM will log, with the plan's arithmetic."""

    name: Name
    value: FigureValue
    unit: Name
    how: Message


@dataclass(frozen=True)
class CanaryRecord:
    ok: bool
    prompt: Message
    text: Message | None
    reason: Message | None
    hint: Message | None
    seconds: Seconds


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
    # T4SERVE_SPECULATIVE: with `mtp` the canary also checks that the drafter drafted (vLLM's /metrics).
    speculative: Annotated[str, OneOf(("off", "mtp", "ngram"))] = "off"


@dataclass(frozen=True)
class ServeState:
    schema: Annotated[int, OneOf((STATE_SCHEMA,))]
    phase: Phase
    # When `serve` began (container start), and when this vLLM attempt began.
    started_at: Timestamp
    attempt_started_at: Timestamp
    updated_at: Timestamp
    # 1 for the first vLLM start in this container, +1 for each restart by supervisord.
    attempt: Annotated[int, Range(1, 1 << 31)]
    # One line each: a name or a path as T4SERVE_MODEL gave it, with no control character.
    model: Annotated[str, Text(PATH_MAX_BYTES, lines=False)]
    served_model_name: Annotated[str, Text(1 << 16, lines=False)]
    host: Annotated[str, Check(_host)]
    port: Annotated[int, Range(1, 65535)]
    gpu_name: Name | None
    # At least the mark of the phase the server is in.
    phases: Annotated[list[PhaseMark], Items(1, 10_000)] = field(default_factory=list)
    figures: Annotated[dict[Name, Figure], Items(0, 1000)] = field(default_factory=dict)
    predictions: Annotated[dict[Name, Prediction], Items(0, 1000)] = field(default_factory=dict)
    # Why the phase is canary_failed or failed, the hint or diagnosis that goes with it, and vLLM's exit code.
    reason: Message | None = None
    diagnosis: Message | None = None
    fix: Message | None = None
    exit_code: ExitCode | None = None
    canary: CanaryRecord | None = None
    last_lines: Annotated[list[Line], Items(0, 1000)] = field(default_factory=list)
    # Time-to-ready estimate from past starts (t4serve.supervise.history), printed at start.
    estimate_seconds: Seconds | None = None
    estimate_phases: Annotated[dict[Phase, Seconds], Items(0, len(PHASES))] = field(default_factory=dict)
    wrapper_pid: Annotated[int, Range(1, 1 << 31)] | None = None

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

    what: Message
    found: Message | None
    required: Message | None
    fix: Message | None
    stopped_at: Timestamp

    def headline(self) -> str:
        """Its first line (a message about several settings lists them on the lines after)."""
        return (self.what.splitlines() or ["(no message)"])[0]


@dataclass(frozen=True)
class ExitRequest:
    """The listener's decision to end the container, and the exit code PID 1 should use."""

    code: Annotated[int, Range(0, 255)]
    reason: Message
    requested_at: Timestamp


def _dump(obj: Any) -> str:
    return json.dumps(to_dict(obj), indent=2) + "\n"


T = TypeVar("T")


def state_file(state_dir: Path, name: str) -> Path:
    """The file `name` of the state folder, whose path is checked first: one no file system accepts (a component over
    255 bytes, a control character) is a ConfigError (exit 2; healthcheck's "not ready"), never an OSError."""
    path = state_dir / name
    try:
        check_path(str(path), "the state file's path")
    except Untrusted as exc:
        raise ConfigError(
            f"the state folder {shown(str(state_dir), 120)} cannot hold the server's state",
            found=exc.reason,
            required=f"a folder path whose components are at most 255 bytes, at most {PATH_MAX_BYTES} bytes in all, "
            "without control characters",
            fix="set T4SERVE_STATE_DIR (or --state-dir) to the server's state folder (default /tmp/t4serve)",
        ) from None
    return path


def _present(path: Path) -> bool:
    """Something is at `path` (a dangling link too); an error reaching it is for the reader to report."""
    try:
        os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return False
    except OSError:
        return True
    return True


def _load(cls: type[T], path: Path, what: str) -> T:
    try:
        return from_dict(cls, load_json_file(path, MAX_STATE_BYTES, "the file"))
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


def write_state(state_dir: Path, state: ServeState) -> None:
    write_atomic(state_dir / STATE_FILE, _dump(state))


def read_state(state_dir: Path) -> ServeState:
    return _load(ServeState, state_file(state_dir, STATE_FILE), "the server state file")


def write_config_error(state_dir: Path, record: ConfigErrorRecord) -> None:
    write_atomic(state_dir / CONFIG_ERROR_FILE, _dump(record), mode=0o600)


def read_config_error(state_dir: Path) -> ConfigErrorRecord | None:
    """The configuration error `serve` stopped on and now waits after (CONFIG_ERROR_FILE), or None when it did not.
    A file that cannot be read is still such a stop: its record says why its message is missing."""
    try:
        path = state_file(state_dir, CONFIG_ERROR_FILE)
    except ConfigError:  # read_state says why
        return None
    if not _present(path):  # none (or no state folder: read_state says so)
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
    return _load(RunSpec, state_file(path.parent, path.name), "the run spec")


def write_exit_request(state_dir: Path, request: ExitRequest) -> None:
    write_atomic(state_dir / EXIT_REQUEST_FILE, _dump(request))


def read_exit_request(state_dir: Path) -> ExitRequest | None:
    path = state_file(state_dir, EXIT_REQUEST_FILE)
    if not _present(path):
        return None
    return _load(ExitRequest, path, "the listener's exit request")
