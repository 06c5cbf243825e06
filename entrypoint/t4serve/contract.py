"""The host/container contract: what the host side (`t4serve mcp`, t4serve.host) reads from the container, typed.

Every answer the host needs from a container of the image comes from a `t4serve ... --json` command run in it
(`docker exec`, or `docker run` of the image), which prints one JSON object: one of the answer dataclasses below, or
a `Failure`. Both sides use these classes: the container writes one with `emit`, the host reads it back into the same
class with `read_answer` (t4serve.serde: unknown or missing keys are an error). No program or script text crosses,
and the host never reads the container's messages for meaning: a failure arrives as a `Failure`, whose exit code
(t4serve.errors.EXIT_CODES) says which error it is.

Every object carries `contract`, this module's `CONTRACT`. An image older than the host answers without it, with an
older one, or not at all (a command or option it lacks): `read_answer` turns each into an EngineError that says to
upgrade the image; an image newer than the host, into one that says to upgrade t4serve on the host.

The commands: `t4serve status --json` (StatusAnswer), `t4serve bench start --json`, `bench status --json [RUN_ID]`
(BenchStartAnswer, BenchRunsAnswer, BenchResultAnswer; made by t4serve.bench.jobs), `t4serve probe
--manifest-only --json` (ManifestAnswer). To add a field: docs/architecture.md, "Change the host/container contract".
"""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from t4serve.errors import (
    BenchError,
    ConfigError,
    EngineError,
    InternalError,
    PatchError,
    PreflightError,
    T4ServeError,
)
from t4serve.facts import BuildManifest
from t4serve.serde import from_dict, to_dict
from t4serve.supervise.phases import CONFIG_ERROR, PHASE_LABELS
from t4serve.supervise.state import ConfigErrorRecord, ExitRequest, ServeState
from t4serve.untrusted import printable

# The contract's version: raised when a field is added, renamed or removed, or its meaning changes.
CONTRACT = 1
# How the host tells a user to bring the image up to its own contract.
UPGRADE_IMAGE_FIX = (
    "rebuild the image from this checkout (`scripts/build-image`, or the MCP tool apply_turing_patch), then restart "
    "the server (stop_vllm_server and start_vllm_server, or `docker compose up -d`)"
)
# The error class a failure's exit code stands for (t4serve.errors.EXIT_CODES).
_ERRORS: dict[int, type[T4ServeError]] = {
    c.exit_code: c for c in (ConfigError, PreflightError, PatchError, EngineError, BenchError, InternalError)
}


@dataclass(frozen=True)
class Failure:
    """A `--json` command that failed: its exit code and its message's parts. `failed` (the error class's name) is
    the key no answer has, so a reader tells a failure from an answer without reading any message."""

    failed: str
    exit_code: int
    what: str
    found: str | None
    required: str | None
    fix: str | None
    contract: int = CONTRACT


@dataclass(frozen=True)
class StatusAnswer:
    """`t4serve status --json`: the phase (a row of t4serve.supervise.phases.PHASES, `config_error` included) and
    what goes with it: the state file while a vLLM runs, the configuration error `serve` stopped on, and the
    listener's exit request when it is ending the container."""

    phase: str
    label: str
    state: ServeState | None
    config_error: ConfigErrorRecord | None
    ending: ExitRequest | None
    contract: int = CONTRACT


@dataclass(frozen=True)
class BenchProgress:
    """One benchmark started by `t4serve bench start`: where it is, how far it got (from its runs.json, rewritten after
    every run) and how it ended. `state`: running, done (exit 0) or failed (any other exit, or its process gone
    without one: the container restarted or it was killed)."""

    run_id: str
    folder: str
    state: str
    exit_code: int | None
    runs_done: int
    runs_planned: int | None
    started_at: float


@dataclass(frozen=True)
class BenchCell:
    """One cell of the sweep (model, input length, concurrency) over its repeats, as report.md tabulates it."""

    model: str
    input_len: int
    concurrency: int
    repeats_ok: int
    repeats_failed: int
    completed_requests: int
    failed_requests: int
    throughput_tok_s: float | None
    per_stream_tok_s: float | None
    ttft_ms: float | None
    variation_pct: float | None
    errors: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class BenchStartAnswer:
    """`t4serve bench start --json`: the benchmark now running in the background."""

    run: BenchProgress
    contract: int = CONTRACT


@dataclass(frozen=True)
class BenchRunsAnswer:
    """`t4serve bench status --json`: every benchmark under the jobs folder, oldest first."""

    root: str
    runs: list[BenchProgress]
    contract: int = CONTRACT


@dataclass(frozen=True)
class BenchResultAnswer:
    """`t4serve bench status --json RUN_ID`: one benchmark's progress, the tail of its log, and once it has ended its
    report, its figures per cell and its plots (paths inside its folder)."""

    run: BenchProgress
    log_tail: str
    report_md: str | None
    cells: list[BenchCell]
    plots: list[str]
    contract: int = CONTRACT


@dataclass(frozen=True)
class ManifestAnswer:
    """`t4serve probe --manifest-only --json`: the image's build manifest, as the container's probe reads it."""

    manifest: BuildManifest
    contract: int = CONTRACT


A = TypeVar("A")


# ----- the container's side


def emit(answer: Any) -> None:
    """Print an answer (or a Failure) as the one JSON object on stdout."""
    sys.stdout.write(json.dumps(to_dict(answer)) + "\n")
    sys.stdout.flush()


def failure(exc: T4ServeError) -> Failure:
    return Failure(type(exc).__name__, exc.exit_code, exc.what, exc.found, exc.required, exc.fix)


@contextlib.contextmanager
def answering(as_json: bool) -> Iterator[None]:
    """Around a command's work: with `--json`, a t4serve error is also printed on stdout as a Failure, then raised
    as ever (the message on stderr, the exit code of its class)."""
    try:
        yield
    except T4ServeError as exc:
        if as_json:
            emit(failure(exc))
        raise


def status_answer(state_dir: Path) -> StatusAnswer:
    """The server's status from its state folder; a ConfigError when there is no readable state (not yet written,
    or not of this version)."""
    from t4serve.supervise.state import read_config_error, read_exit_request, read_state

    stopped = read_config_error(state_dir)
    if stopped is not None:
        return StatusAnswer(CONFIG_ERROR, PHASE_LABELS[CONFIG_ERROR], None, stopped, None)
    # Both files are read before anything is printed: an unreadable one is exit 2 in both forms.
    state = read_state(state_dir)
    return StatusAnswer(state.phase, PHASE_LABELS[state.phase], state, None, read_exit_request(state_dir))


# ----- the host's side


def read_answer(cls: type[A], argv: Sequence[str], returncode: int, stdout: str, stderr: str, image: str) -> A:
    """The answer of `argv` (a `t4serve ... --json` run in a container of `image`) as `cls`. A Failure is raised as
    the error its exit code stands for, with the container's found / required / fix; an answer of another contract,
    or none, is an EngineError saying which side to upgrade."""
    command = printable(" ".join(argv[:4]))[:200]
    text = stdout.strip().splitlines()[-1] if stdout.strip() else ""
    try:
        data = json.loads(text) if text else None
    except ValueError:
        data = None
    seen = data.get("contract") if isinstance(data, dict) else None
    if not isinstance(seen, int) or isinstance(seen, bool) or seen < CONTRACT:
        said = (stderr.strip() or stdout.strip() or "no output").splitlines()[-1]
        raise EngineError(
            f"the image {image} is older than this t4serve: upgrade the image",
            found=f"`{command}` exited {returncode} "
            + (f"with contract {seen}" if isinstance(seen, int) else "without a typed answer")
            + f": {printable(said)[:300]}",
            required=f"an image whose t4serve answers contract {CONTRACT} (the one this host's t4serve reads)",
            fix=UPGRADE_IMAGE_FIX,
        )
    if seen > CONTRACT:
        raise EngineError(
            f"the image {image} is newer than this t4serve: upgrade t4serve on this host",
            found=f"`{command}` answered contract {seen}",
            required=f"contract {CONTRACT}, the one this host's t4serve reads",
            fix="`pip install .` again from the checkout the image was built from (the host and the image from one "
            "version)",
        )
    assert isinstance(data, dict)
    expected: type[Any] = Failure if "failed" in data else cls
    try:
        answer = from_dict(expected, data, where=command)
    except ConfigError as exc:
        raise EngineError(
            f"the answer of `{command}` in {image} is not the {expected.__name__} of contract {CONTRACT}",
            found=printable(exc.what)[:300],
            required=f"the {expected.__name__} this host's t4serve reads",
            fix=UPGRADE_IMAGE_FIX + "; if the image is this checkout's, this is a bug in t4serve: report it",
        ) from None
    if isinstance(answer, Failure):
        kind = _ERRORS.get(answer.exit_code, EngineError)
        raise kind(answer.what, found=answer.found, required=answer.required, fix=answer.fix)
    return answer  # type: ignore[no-any-return]
