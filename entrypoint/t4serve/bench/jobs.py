"""Benchmarks run in the background in the server's container (the MCP tool run_benchmark): `t4serve bench start`
starts one, `t4serve bench status` reads its progress and result, each answering typed with `--json`
(t4serve.contract), so the host names no file of this layout and sends no script.

A job is a folder ROOT/RUN_ID, ROOT being T4SERVE_CACHE_DIR/bench (the cache volume, in the image): job.json (a
`JobRecord`: its id, the sweep's arguments, when it began, its watcher's pid), bench.log (the sweep's output),
exit-code once it has ended, and result/, the sweep's own --output folder (bench refuses an output folder that holds
files, so the log lives beside it). `start` makes the folder and starts the watcher, `t4serve bench job FOLDER --
ARGS`, in a session of its own with its output in bench.log, so the caller (`docker exec`) returns at once; the
watcher runs the sweep, `t4serve bench --output FOLDER/result ARGS`, passes a stop signal on to it (the sweep then
writes its partial report) and writes its exit code. Progress (runs done and planned) is the sweep's runs.json,
which it rewrites after every run. A job whose watcher is gone without an exit code (the container restarted, a
kill) has failed, not "running" forever.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

from t4serve.atomic import write_atomic
from t4serve.contract import RUN_ID, BenchCell, BenchProgress, BenchResultAnswer, BenchRunsAnswer, BenchStartAnswer
from t4serve.errors import ConfigError, T4ServeError
from t4serve.serde import from_dict, to_dict
from t4serve.untrusted import Untrusted, load_json_file, printable, read_tail_bounded

JOB_FILE = "job.json"
LOG_FILE = "bench.log"
EXIT_FILE = "exit-code"
RESULT_DIR = "result"
# What a status answer carries of the log and the report (their ends).
LOG_TAIL_BYTES = 16 * 1024
REPORT_BYTES = 64 * 1024
MAX_JOB_BYTES = 256 * 1024


@dataclass(frozen=True)
class JobRecord:
    """job.json: what `start` began."""

    run_id: str
    args: list[str]
    started_at: float
    pid: int


def jobs_root(environ: Mapping[str, str]) -> Path:
    """Where the jobs live: T4SERVE_CACHE_DIR/bench (its default: the image's cache volume)."""
    from t4serve.config.settings import default_of

    return Path(environ.get("T4SERVE_CACHE_DIR") or default_of("T4SERVE_CACHE_DIR")) / "bench"


def new_run_id(now: float) -> str:
    return f"{time.strftime('%Y%m%d-%H%M%S', time.gmtime(now))}-{uuid.uuid4().hex[:6]}"


def start(root: Path, args: Sequence[str], environ: Mapping[str, str], now: float | None = None) -> BenchStartAnswer:
    """Start the sweep `t4serve bench ARGS` in the background in a new job folder under `root`; one at a time."""
    running = [run for run in list_runs(root).runs if run.state == "running"]
    if running:
        raise ConfigError(
            "a benchmark is running",
            found=f"run {running[0].run_id} has not finished",
            required="one benchmark at a time (two would share the GPU and skew both)",
            fix=f"`t4serve bench status {running[0].run_id}` until it is done",
        )
    began = time.time() if now is None else now
    run_id = new_run_id(began)
    folder = root / run_id
    try:
        folder.mkdir(parents=True)
        log = (folder / LOG_FILE).open("ab")
    except OSError as exc:
        raise ConfigError(
            f"cannot make the benchmark's folder {folder}",
            found=exc.strerror or str(exc),
            required="a writable T4SERVE_CACHE_DIR (the image's cache volume)",
            fix="check the volume mounted at T4SERVE_CACHE_DIR and its owner (uid 1000 in the image)",
        ) from None
    with log:
        watcher = subprocess.Popen(
            [sys.executable, "-m", "t4serve", "bench", "job", str(folder), "--", *args],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=dict(environ), start_new_session=True,
        )  # fmt: skip
    write_atomic(folder / JOB_FILE, _json(JobRecord(run_id, list(args), began, watcher.pid)))
    return BenchStartAnswer(progress(folder))


def _json(record: JobRecord) -> str:
    import json

    return json.dumps(to_dict(record), indent=1) + "\n"


def run_job(folder: Path, args: Sequence[str]) -> int:
    """The watcher: the sweep into folder/result, a stop signal passed on to it, its exit code written (128+N for a
    signal). Returns that code."""
    sweep = subprocess.Popen([sys.executable, "-m", "t4serve", "bench", "--output", str(folder / RESULT_DIR), *args],
                             stdin=subprocess.DEVNULL)  # fmt: skip

    def forward(signum: int, _frame: FrameType | None) -> None:
        if sweep.poll() is None:
            sweep.send_signal(signum)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, forward)
    code = sweep.wait()
    code = 128 - code if code < 0 else code
    write_atomic(folder / EXIT_FILE, f"{code}\n")
    return code


def _read(path: Path, limit: int) -> str | None:
    try:
        return read_tail_bounded(path, limit, "the benchmark's file").decode("utf-8", "replace")
    except (OSError, Untrusted):  # absent, or not a regular file
        return None


def _record(folder: Path) -> JobRecord | None:
    try:
        return from_dict(JobRecord, load_json_file(folder / JOB_FILE, MAX_JOB_BYTES, "the job file"))
    except (OSError, Untrusted, ConfigError):
        return None


def _alive(pid: int, folder: Path, proc: Path) -> bool:
    """The watcher `pid` still runs: its command line names `folder` (a reused pid would not)."""
    try:
        return str(folder).encode() in (proc / str(pid) / "cmdline").read_bytes().split(b"\0")
    except OSError:
        return False


def progress(folder: Path, proc: Path = Path("/proc")) -> BenchProgress:
    """How far the job in `folder` got; a job folder without a readable job.json (being made, or not a job) is
    `failed` with no runs."""
    record = _record(folder)
    alive = record is not None and _alive(record.pid, folder, proc)
    # Read after `alive`: a watcher that ends in between has written it.
    text = (_read(folder / EXIT_FILE, 32) or "").strip()
    code = int(text) if text.lstrip("-").isdigit() and len(text) < 8 else None
    done, planned = 0, None
    result = folder / RESULT_DIR
    if (result / "runs.json").is_file():
        from t4serve.bench.results import read_runs

        try:
            runs_file = read_runs(result)
            done, planned = len(runs_file.runs), runs_file.planned_runs
        except T4ServeError:
            pass
    state = "running" if code is None and alive else "done" if code == 0 else "failed"
    return BenchProgress(run_id=folder.name, folder=str(folder), state=state, exit_code=code, runs_done=done,
                         runs_planned=planned, started_at=record.started_at if record is not None else 0.0)  # fmt: skip


def list_runs(root: Path) -> BenchRunsAnswer:
    names = sorted(p.name for p in root.iterdir() if p.is_dir() and RUN_ID.match(p.name)) if root.is_dir() else []
    return BenchRunsAnswer(root=str(root), runs=[progress(root / name) for name in names])


def result(root: Path, run_id: str) -> BenchResultAnswer:
    """One job's progress, log tail, and once ended its report, cells and plots (paths inside its folder)."""
    folder = root / run_id
    if not RUN_ID.match(run_id) or not folder.is_dir():
        raise ConfigError(
            f"no benchmark {printable(run_id)[:40]}",
            found=f"no folder {printable(str(folder))[:300]}",
            required="a run id `t4serve bench start` printed (`t4serve bench status` lists them)",
            fix="`t4serve bench status` lists the benchmarks; `t4serve bench start` starts one",
        )
    run = progress(folder)
    log = _read(folder / LOG_FILE, LOG_TAIL_BYTES) or ""
    if run.state == "failed" and run.exit_code is None:
        log += "\n(the benchmark's process is gone without an exit code: the container restarted or it was killed)"
    if run.state == "running":
        return BenchResultAnswer(run=run, log_tail=log, report_md=None, cells=[], plots=[])
    res = folder / RESULT_DIR
    plots = sorted(f"{RESULT_DIR}/{p.name}" for p in res.glob("*.png")) if res.is_dir() else []
    return BenchResultAnswer(run=run, log_tail=log, report_md=_read(res / "report.md", REPORT_BYTES),
                             cells=cells(res), plots=plots)  # fmt: skip


def cells(result_dir: Path) -> list[BenchCell]:
    """The report's figures per cell, from the result folder's runs.json ([] where there is none to read)."""
    from t4serve.bench.results import read_runs, summarize

    if not (result_dir / "runs.json").is_file():
        return []
    try:
        summaries = summarize(read_runs(result_dir).runs)
    except T4ServeError:
        return []
    return [
        BenchCell(model=c.model, input_len=c.input_len, concurrency=c.concurrency, repeats_ok=c.repeats_ok,
                  repeats_failed=c.repeats_failed, completed_requests=c.completed, failed_requests=c.failed_requests,
                  throughput_tok_s=c.throughput, per_stream_tok_s=c.per_stream, ttft_ms=c.ttft_ms,
                  variation_pct=c.variation_pct, errors=[e[:300] for e in c.errors[:5]])
        for c in summaries
    ]  # fmt: skip


def describe(run: BenchProgress) -> str:
    """One line per job, for `t4serve bench status` without --json."""
    runs = f"{run.runs_done}/{run.runs_planned}" if run.runs_planned is not None else f"{run.runs_done}/?"
    ended = f", exit {run.exit_code}" if run.exit_code is not None else ""
    return f"{run.run_id}  {run.state:<8} runs {runs}{ended}  {run.folder}"
