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

`read_answer` is the host's one reader of them: secrets redacted first, then JSON of bounded depth and numbers, then
every field's type, range, enum and pattern (t4serve.serde's marks on the classes below), so no value a container
prints reaches a traceback, and a name or path from it is checked as the same name from a client would be.
"""

from __future__ import annotations

import contextlib
import json
import re
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, TypeVar

from t4serve.errors import ConfigError, EngineError, T4ServeError
from t4serve.facts import BuildManifest
from t4serve.serde import Items, Matches, OneOf, Range, Text, from_dict, to_dict
from t4serve.supervise.phases import CONFIG_ERROR, PHASE_LABELS
from t4serve.supervise.state import (
    ConfigErrorRecord,
    ExitCode,
    ExitRequest,
    Message,
    Name,
    Phase,
    ServeState,
    Timestamp,
)
from t4serve.untrusted import Untrusted, loads_json, plain_text

# The contract's version: raised when a field is added, renamed or removed, or its meaning changes.
CONTRACT = 1
# How the host tells a user to bring the image up to its own contract.
UPGRADE_IMAGE_FIX = (
    "rebuild the image from this checkout (`scripts/build-image`, or the MCP tool apply_turing_patch), then restart "
    "the server (stop_vllm_server and start_vllm_server, or `docker compose up -d`)"
)
# A benchmark's run id, as `t4serve bench start` makes it and the benchmark_status tool takes it.
RUN_ID = re.compile(r"^[0-9]{8}-[0-9]{6}-[0-9a-f]{6}$")
# A path inside the container the host may name on a command line (`docker cp`): absolute, plain components of
# letters, digits, dot, dash and underscore, no `.` or `..`.
CONTAINER_PATH = re.compile(r"(?:/(?!\.{1,2}(?:/|$))[A-Za-z0-9._-]{1,255}){1,64}")
# A plot of a benchmark's result folder: a PNG directly in result/.
PLOT = re.compile(r"result/[A-Za-z0-9][A-Za-z0-9._-]{0,127}\.png")
# A benchmark's model name: one word without control characters (t4serve.bench.results.check_model_name).
MODEL_NAME = re.compile(r"[^\s\x00-\x1f\x7f-\x9f]{1,160}")
# The answers' largest texts: the log tail and report the container reads (jobs.LOG_TAIL_BYTES, REPORT_BYTES).
MAX_ANSWER_TEXT = 256 * 1024
Count = Annotated[int, Range(0, 10**12)]
Figure = Annotated[float, Range(0.0, 1e12)]
RunId = Annotated[str, Matches(RUN_ID, "a run id as `t4serve bench start` makes it (YYYYMMDD-HHMMSS-hex6)")]
ContainerPath = Annotated[str, Matches(CONTAINER_PATH, "an absolute path of plain names (letters, digits, ._-)")]


@dataclass(frozen=True)
class Failure:
    """A `--json` command that failed: its exit code and its message's parts. `failed` (the error class's name) is
    the key no answer has, so a reader tells a failure from an answer without reading any message."""

    failed: Annotated[str, Matches(re.compile(r"[A-Za-z][A-Za-z0-9]{0,63}"), "an error class's name")]
    exit_code: Annotated[int, Range(1, 255)]
    what: Message
    found: Message | None
    required: Message | None
    fix: Message | None
    contract: int = CONTRACT


@dataclass(frozen=True)
class StatusAnswer:
    """`t4serve status --json`: the phase (a row of t4serve.supervise.phases.PHASES, `config_error` included) and
    what goes with it: the state file while a vLLM runs, the configuration error `serve` stopped on, and the
    listener's exit request when it is ending the container."""

    phase: Phase
    label: Name
    state: ServeState | None
    config_error: ConfigErrorRecord | None
    ending: ExitRequest | None
    contract: int = CONTRACT


@dataclass(frozen=True)
class BenchProgress:
    """One benchmark started by `t4serve bench start`: where it is, how far it got (from its runs.json, rewritten after
    every run) and how it ended. `state`: running, done (exit 0) or failed (any other exit, or its process gone
    without one: the container restarted or it was killed)."""

    run_id: RunId
    folder: ContainerPath
    state: Annotated[str, OneOf(("running", "done", "failed"))]
    exit_code: ExitCode | None
    runs_done: Count
    runs_planned: Count | None
    started_at: Timestamp

    def check_read(self) -> None:
        if not self.folder.endswith("/" + self.run_id):
            raise Untrusted(f"the run's folder must be ROOT/{self.run_id}, found {self.folder[:200]!r}")


@dataclass(frozen=True)
class BenchCell:
    """One cell of the sweep (model, input length, concurrency) over its repeats, as report.md tabulates it."""

    model: Annotated[str, Matches(MODEL_NAME, "one word of at most 160 characters")]
    input_len: Annotated[int, Range(1, 1 << 24)]
    concurrency: Annotated[int, Range(1, 1 << 24)]
    repeats_ok: Count
    repeats_failed: Count
    completed_requests: Count
    failed_requests: Count
    throughput_tok_s: Figure | None
    per_stream_tok_s: Figure | None
    ttft_ms: Figure | None
    variation_pct: Figure | None
    errors: Annotated[list[Annotated[str, Text(1000)]], Items(0, 100)] = field(default_factory=list)


@dataclass(frozen=True)
class BenchStartAnswer:
    """`t4serve bench start --json`: the benchmark now running in the background."""

    run: BenchProgress
    contract: int = CONTRACT


@dataclass(frozen=True)
class BenchRunsAnswer:
    """`t4serve bench status --json`: every benchmark under the jobs folder, oldest first."""

    root: ContainerPath
    runs: Annotated[list[BenchProgress], Items(0, 100_000)]
    contract: int = CONTRACT


@dataclass(frozen=True)
class BenchResultAnswer:
    """`t4serve bench status --json RUN_ID`: one benchmark's progress, the tail of its log, and once it has ended its
    report, its figures per cell and its plots (paths inside its folder)."""

    run: BenchProgress
    log_tail: Annotated[str, Text(MAX_ANSWER_TEXT, lines=True)]
    report_md: Annotated[str, Text(MAX_ANSWER_TEXT, lines=True)] | None
    cells: Annotated[list[BenchCell], Items(0, 10_000)]
    plots: Annotated[list[Annotated[str, Matches(PLOT, "a PNG in result/ (result/NAME.png)")]], Items(0, 100)]
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


class ContainerFailure(EngineError):
    """A `--json` command that failed in the container, with the container's own words (what, found, required, fix).
    On the host it is an engine error (exit 5): the container's exit code (`container_exit_code`, a code of
    t4serve.errors.EXIT_CODES) is for callers that branch on which error it was, never the host's own exit code."""

    def __init__(self, failure: Failure) -> None:
        self.container_exit_code = failure.exit_code
        self.container_error = failure.failed
        super().__init__(failure.what, found=failure.found, required=failure.required, fix=failure.fix)


def read_answer(cls: type[A], argv: Sequence[str], returncode: int, stdout: str, stderr: str, image: str) -> A:
    """The answer of `argv` (a `t4serve ... --json` run in a container of `image`) as `cls`, its output already
    redacted (t4serve.host.engine.RedactedEngine). A Failure is raised as a ContainerFailure with the container's found
    / required / fix; an answer of another contract, or none, or of another shape (any field out of its type, range,
    enum or pattern) is an EngineError saying which side to upgrade."""
    command = plain_text(" ".join(argv[:4]), lines=False)[:200]
    text = stdout.strip().splitlines()[-1] if stdout.strip() else ""
    data: Any = None
    refused = None
    if text:
        try:
            data = loads_json(text, "the answer")
        except Untrusted as exc:
            refused = exc.reason
    seen = data.get("contract") if isinstance(data, dict) else None
    if not isinstance(seen, int) or isinstance(seen, bool) or seen < CONTRACT:
        said = (stderr.strip() or stdout.strip() or "no output").splitlines()[-1]
        raise EngineError(
            f"the image {image} is older than this t4serve: upgrade the image",
            found=f"`{command}` exited {returncode} "
            + (f"with contract {seen}" if isinstance(seen, int) else "without a typed answer")
            + f": {plain_text(refused or said, lines=False)[:300]}",
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
            found=plain_text(exc.what, lines=False)[:300],
            required=f"the {expected.__name__} this host's t4serve reads",
            fix=UPGRADE_IMAGE_FIX + "; if the image is this checkout's, this is a bug in t4serve: report it",
        ) from None
    if isinstance(answer, Failure):
        raise ContainerFailure(answer)
    return answer  # type: ignore[no-any-return]
