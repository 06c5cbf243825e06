"""Run the sweep: per model (a running server at --base-url, or `t4serve serve` started as a user runs it:
t4serve.bench.servers), per cell and repeat, vLLM's own `vllm bench serve`, with GPU telemetry sampled during each
cell; then write the result folder.

A run that fails (the client exits non-zero, times out, or writes no JSON) is recorded with its error and the tail
of its log, and the sweep goes on; a server that never becomes ready fails every cell of its model, visibly.
With an API key (T4SERVE_API_KEY / T4SERVE_API_KEY_FILE, else OPENAI_API_KEY) the servers it starts read it as `serve`
does (vLLM gets it as VLLM_API_KEY), `vllm bench serve` gets it as OPENAI_API_KEY
(vllm/benchmarks/lib/endpoint_request_func.py reads it for its Authorization header), and the readiness check and the
/v1/models lookup as a bearer token; never on a command line or in the result folder.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from t4serve.atomic import write_atomic
from t4serve.bench import grid, report
from t4serve.bench.results import (
    RUNS_SCHEMA,
    Run,
    RunFigures,
    RunsFile,
    ServerSide,
    Telemetry,
    raw_name,
    read_result,
    write_runs,
)
from t4serve.bench.servers import BenchServer, plan_servers, running_server, tail
from t4serve.bench.serverside import MetricsSampler
from t4serve.bench.telemetry import Sampler
from t4serve.config.secrets import client_api_key
from t4serve.errors import BenchError, ConfigError, T4ServeError
from t4serve.httpclient import HttpFailure, fetch
from t4serve.units import fmt_duration


@dataclass(frozen=True)
class BenchOptions:
    models: list[str]
    inputs: list[int]
    concurrencies: list[int]
    repeats: int
    output_len: int
    output: Path
    num_prompts: int | None = None
    # model -> URL of a server already running it; empty: start each model's server from the plan.
    base_urls: dict[str, str] = field(default_factory=dict)
    # model -> tokenizer for `vllm bench serve --tokenizer`; default: the checkpoint the model names.
    tokenizers: dict[str, str] = field(default_factory=dict)
    ceilings: dict[str, float] = field(default_factory=dict)
    vllm: str = "vllm"
    num_warmups: int = 2
    # One unrecorded run of each cell before its repeats (raw/warmup/): the batch shapes the repeats will use have
    # compiled their kernels (Triton JIT-compiles some attention variants at the first batch that needs them).
    warmup_run: bool = False
    ready_timeout_s: float = 1800.0
    cell_timeout_s: float = 3600.0
    telemetry_interval_s: float = 0.5
    # Goodput's objectives: a request counts as good when its TTFT and its TPOT are both within them.
    slo_ttft_ms: float = grid.DEFAULT_SLO_TTFT_MS
    slo_tpot_ms: float = grid.DEFAULT_SLO_TPOT_MS


WARMUP_DIR = "warmup"


def bench_argv(opts: BenchOptions, url: str, served_name: str, tokenizer: str, cell: grid.Cell, raw: Path) -> list[str]:
    """`vllm bench serve` for one cell and repeat, as published-t4-run.md's sweep ran it."""
    return [
        *shlex.split(opts.vllm),
        "bench",
        "serve",
        "--backend",
        "vllm",
        "--base-url",
        url,
        "--model",
        served_name,
        "--tokenizer",
        tokenizer,
        "--dataset-name",
        "random",
        "--random-input-len",
        str(cell.input_len),
        "--random-output-len",
        str(opts.output_len),
        "--num-prompts",
        str(grid.prompts_per_cell(cell.concurrency, opts.num_prompts)),
        "--max-concurrency",
        str(cell.concurrency),
        "--ignore-eos",
        "--temperature",
        "0",
        "--num-warmups",
        str(opts.num_warmups),
        "--seed",
        str(cell.seed),
        "--disable-tqdm",
        # vLLM counts the requests that met both objectives itself (`request_goodput` in the result).
        "--goodput",
        f"ttft:{opts.slo_ttft_ms:g}",
        f"tpot:{opts.slo_tpot_ms:g}",
        "--save-result",
        "--result-dir",
        str(raw.parent),
        "--result-filename",
        raw.name,
        # Per-request TTFTs, latencies and (where the server sends them) its own queue times, kept in raw/.
        "--save-detailed",
    ]


def cell_run(
    opts: BenchOptions,
    model: str,
    cell: grid.Cell,
    *,
    raw_file: str | None,
    figures: RunFigures | None,
    error: str | None,
    telemetry: Telemetry | None,
    server: ServerSide | None = None,
) -> Run:
    """The record of one run of one cell, measured or failed."""
    return Run(
        model=model,
        input_len=cell.input_len,
        concurrency=cell.concurrency,
        repeat=cell.repeat,
        seed=cell.seed,
        num_prompts=grid.prompts_per_cell(cell.concurrency, opts.num_prompts),
        raw_file=raw_file,
        figures=figures,
        error=error,
        telemetry=telemetry,
        server=server,
    )


def run_cell(
    opts: BenchOptions,
    model: str,
    url: str,
    served_name: str,
    tokenizer: str,
    cell: grid.Cell,
    raw_dir: Path,
    api_key: str | None = None,
) -> Run:
    raw = raw_dir / raw_name(model, cell)
    log = raw.with_suffix(".log")
    argv = bench_argv(opts, url, served_name, tokenizer, cell, raw)

    server: ServerSide | None = None

    def made(
        raw_file: str | None, figures: RunFigures | None, error: str | None, telemetry: Telemetry | None = None
    ) -> Run:
        return cell_run(opts, model, cell, raw_file=raw_file, figures=figures, error=error, telemetry=telemetry,
                        server=server)

    with (
        Sampler(opts.telemetry_interval_s) as sampler,
        MetricsSampler(url, opts.telemetry_interval_s) as metrics,
        log.open("w", encoding="utf-8") as out,
    ):
        out.write("$ " + shlex.join(argv) + "\n")
        out.flush()
        env = {**os.environ, "OPENAI_API_KEY": api_key} if api_key else None
        try:
            done = subprocess.run(
                argv, stdout=out, stderr=subprocess.STDOUT, timeout=opts.cell_timeout_s, check=False, env=env
            )
            rc: int | None = done.returncode
        except subprocess.TimeoutExpired:
            rc = None
        except OSError as exc:
            return made(None, None, f"cannot run {argv[0]}: {exc}")
    telemetry = sampler.result()
    server = metrics.result()
    if rc is None:
        error = f"`vllm bench serve` ran past {opts.cell_timeout_s:.0f} s and was stopped; log {log.name}"
        return made(None, None, error, telemetry)
    if rc != 0 or not raw.is_file():
        error = f"`vllm bench serve` exited {rc} without a result; log {log.name}: ...{tail(log, 3)[-300:]}"
        return made(None, None, error, telemetry)
    try:
        figures = read_result(raw)
    except ConfigError as exc:
        return made(raw.name, None, f"{exc.what} ({exc.found})", telemetry)
    failed = f"all {figures.failed} requests failed; log {log.name}" if figures.completed == 0 else None
    return made(raw.name, figures, failed, telemetry)


def served_model_name(url: str, timeout: float = 10.0, api_key: str | None = None) -> str:
    """The first model id the server lists at /v1/models (what requests must name)."""
    not_listing = {
        "required": "a running vLLM OpenAI server",
        "fix": "start it (`t4serve serve`) or drop --base-url to let `t4serve bench` start the servers",
    }
    try:
        answer = fetch("GET", f"{url}/v1/models", deadline_s=timeout, api_key=api_key)
        if answer.status == 200:
            data = answer.json("the answer")
            first = data["data"][0]["id"] if isinstance(data, dict) and isinstance(data.get("data"), list) else None
            if isinstance(first, str) and first:
                return first
    except HttpFailure as exc:
        raise BenchError(
            f"the server at {url} does not list a model", found=f"GET {url}/v1/models: {exc.reason}", **not_listing
        ) from None
    except (LookupError, TypeError):
        pass
    if answer.status == 401:
        raise BenchError(
            f"the server at {url} wants an API key {'other than the one given' if api_key else 'and none was given'}",
            found=f"GET {url}/v1/models: HTTP 401 Unauthorized",
            required="the server's key",
            fix="set T4SERVE_API_KEY_FILE (or T4SERVE_API_KEY) to the file holding the server's key",
        )
    moved = f" (a redirect to {answer.location!r}, not followed: it would carry the key)" if answer.redirect else ""
    found = f"GET {url}/v1/models: HTTP {answer.status}{moved}" + (
        f": {answer.text(200)}" if answer.status == 200 else ""
    )
    raise BenchError(f"the server at {url} does not list a model", found=found, **not_listing)


def default_tokenizer(model: str) -> str:
    from t4serve.config.aliases import MODEL_ALIASES

    return MODEL_ALIASES.get(model, model)


def roofline_ceilings(
    models: list[str], given: dict[str, float], gpu_key: str = "t4"
) -> tuple[dict[str, float | None], list[str]]:
    """Per-stream decode ceiling per model: --ceiling first, else `roofline.decode_ceiling` on a known GPU.

    The checkpoint's headers come from the local cache or, for the aliases, the built-in facts
    (t4serve.probes.checkpoint); a model whose headers cannot be read gets no ceiling and a note saying why, never a
    made-up figure.
    """
    from t4serve.config.settings import Settings
    from t4serve.gpus import known_gpu
    from t4serve.pipeline import probe_settings_model
    from t4serve.planning.roofline import decode_ceiling

    gpu = known_gpu(gpu_key)
    if gpu is None:
        raise ConfigError(f"unknown GPU {gpu_key!r} for the roofline ceiling", found=gpu_key,
                          required="a key of t4serve.gpus.KNOWN_GPUS", fix="--gpu t4")
    ceilings: dict[str, float | None] = {}
    notes: list[str] = []
    for model in models:
        if model in given:
            ceilings[model] = given[model]
            continue
        ceilings[model] = None
        try:
            facts = probe_settings_model(Settings.from_environ(os.environ, overrides={"T4SERVE_MODEL": model}))
            ceiling = decode_ceiling(facts, gpu)
        except T4ServeError as exc:
            notes.append(f"{model}: no roofline ceiling: {exc.what} ({exc.found})")
            continue
        ceilings[model] = ceiling.value
        notes.append(f"{model}: roofline ceiling {ceiling}")
    return ceilings, notes


class Progress:
    """One line per finished run: done/total, elapsed, and an ETA from the mean time per run so far."""

    def __init__(self, total: int, stream: IO[str]) -> None:
        self.total = total
        self.done = 0
        self.start = time.monotonic()
        self.stream = stream

    def step(self, label: str, outcome: str) -> None:
        self.done += 1
        elapsed = time.monotonic() - self.start
        eta = elapsed / self.done * (self.total - self.done)
        width = 20
        filled = width * self.done // self.total
        bar = "#" * filled + "." * (width - filled)
        self.stream.write(
            f"[{bar}] {self.done}/{self.total} {label}: {outcome}  "
            f"elapsed {fmt_duration(elapsed)}, ETA {fmt_duration(eta)}\n"
        )
        self.stream.flush()


def run_bench(opts: BenchOptions, environ: Mapping[str, str] | None = None, stream: IO[str] | None = None) -> RunsFile:
    """The whole sweep into opts.output: raw/ (JSON and logs), runs.json, runs.csv, report.md, plots."""
    environ = dict(os.environ if environ is None else environ)
    out = stream or sys.stderr
    cells = grid.cells(opts.inputs, opts.concurrencies, opts.repeats)
    missing = [m for m in opts.models if opts.base_urls and m not in opts.base_urls]
    if missing:
        raise ConfigError(
            f"--base-url names no server for {', '.join(missing)}",
            found=f"--base-url for: {', '.join(opts.base_urls)}",
            required="a URL for every model in --models, or no --base-url at all",
            fix="--base-url qat=http://127.0.0.1:8000,bf16=http://127.0.0.1:8001 (or a single URL with one model)",
        )
    raw_dir = opts.output / "raw"
    raw_dir.mkdir(parents=True, exist_ok=True)
    if opts.warmup_run:
        (raw_dir / WARMUP_DIR).mkdir(exist_ok=True)
    started = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    client_key = client_api_key(environ, "OPENAI_API_KEY")
    ceilings, notes = roofline_ceilings(opts.models, opts.ceilings)
    if opts.warmup_run:
        notes.append(f"each cell ran once before its repeats, unrecorded (--warmup-run; seed repeat 0, files in "
                     f"raw/{WARMUP_DIR}/), so kernels compiled for its batch shapes are not timed")
    planned: dict[str, BenchServer] = {}
    if not opts.base_urls:
        planned, plan_notes = plan_servers(opts.models, environ, opts.output)
        notes += plan_notes
    runs_file = RunsFile(
        schema=RUNS_SCHEMA,
        models=list(opts.models),
        inputs=list(opts.inputs),
        concurrencies=list(opts.concurrencies),
        repeats=opts.repeats,
        output_len=opts.output_len,
        started=started,
        runs=[],
        ceilings=ceilings,
        notes=notes,
        planned_runs=len(opts.models) * len(cells),
        slo_ttft_ms=opts.slo_ttft_ms,
        slo_tpot_ms=opts.slo_tpot_ms,
    )
    progress = Progress(runs_file.planned_runs, out)
    # The line benchmark_status reads runs done / planned from, before the first run (a server start, minutes) ends.
    out.write(f"[{'.' * 20}] 0/{runs_file.planned_runs} planned\n")
    out.flush()

    def record(run: Run) -> None:
        # runs.json after every run: a sweep killed at any moment (even -9) leaves every finished run on disk.
        runs_file.runs.append(run)
        write_runs(opts.output, runs_file)

    write_runs(opts.output, runs_file)
    try:
        with _signals_interrupt():
            for model in opts.models:
                _run_model(opts, model, cells, raw_dir, planned.get(model), progress, record, client_key, environ)
    except Interrupted as exc:
        runs_file = dataclasses.replace(runs_file, interrupted=exc.why)
        write_folder(opts.output, runs_file, out)
        raise
    write_folder(opts.output, runs_file, out)
    return runs_file


class Interrupted(BaseException):
    """The sweep was stopped by a signal; the result folder holds every run finished before it. A BaseException,
    like KeyboardInterrupt, so no `except Exception` on the way can swallow it."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        self.why = f"stopped by {signal.Signals(signum).name}"
        super().__init__(self.why)


@contextlib.contextmanager
def _signals_interrupt() -> Iterator[None]:
    """SIGINT and SIGTERM (Ctrl-C, `docker stop`, a CI timeout) raise Interrupted in the sweep's thread, so the
    running client is stopped, a server bench started is stopped in order, and the partial report is written."""

    def handler(signum: int, _frame: object) -> None:
        raise Interrupted(signum)

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def _run_model(
    opts: BenchOptions,
    model: str,
    cells: list[grid.Cell],
    raw_dir: Path,
    server: BenchServer | None,
    progress: Progress,
    record: Callable[[Run], None],
    api_key: str | None = None,
    environ: Mapping[str, str] | None = None,
) -> None:
    done = 0  # cells of this model recorded so far
    try:
        with contextlib.ExitStack() as stack:
            if server is not None:
                progress.stream.write(f"starting {model}: {server.describe()}\n")
                log = raw_dir / f"server_{raw_name(model, cells[0])[:-5]}.log"
                started = stack.enter_context(running_server(server, log, opts.ready_timeout_s,
                                                             os.environ if environ is None else environ, api_key))
                url, tokenizer = started.url, opts.tokenizers.get(model, started.checkpoint)
            else:
                url, tokenizer = opts.base_urls[model].rstrip("/"), opts.tokenizers.get(model, default_tokenizer(model))
            name = served_model_name(url, api_key=api_key)
            for cell in cells:
                if opts.warmup_run and cell.repeat == 1:
                    warm = run_cell(opts, model, url, name, tokenizer, grid.Cell(cell.input_len, cell.concurrency, 0),
                                    raw_dir / WARMUP_DIR, api_key)
                    progress.stream.write(f"  warm-up {model} in={cell.input_len} c={cell.concurrency} (not recorded): "
                                          f"{warm.error or 'done'}\n")
                    progress.stream.flush()
                run = run_cell(opts, model, url, name, tokenizer, cell, raw_dir, api_key)
                record(run)
                done += 1
                outcome = run.error or (
                    f"{run.figures.output_throughput:.2f} tok/s, {run.figures.failed} failed" if run.figures else "?"
                )
                progress.step(f"{model} in={cell.input_len} c={cell.concurrency} r={cell.repeat}", outcome)
    except T4ServeError as exc:
        # The server never served: every remaining cell of this model is a failed run, shown, not dropped.
        for cell in cells[done:]:
            record(cell_run(opts, model, cell, raw_file=None, figures=None, error=exc.what,
                            telemetry=Telemetry(samples=0, error="server not running")))
            progress.step(f"{model} in={cell.input_len} c={cell.concurrency} r={cell.repeat}", f"FAILED: {exc.what}")
        progress.stream.write(f"{model}: {exc.message()}\n")


def write_folder(folder: Path, runs_file: RunsFile, out: IO[str]) -> None:
    write_runs(folder, runs_file)
    write_atomic(folder / "runs.csv", report.runs_csv(runs_file.runs))
    plots: list[str] = []
    plot_error: ConfigError | None = None
    try:
        from t4serve.bench.plots import write_plots

        plots = write_plots(folder, runs_file)
    except ConfigError as exc:
        plot_error = exc
    write_atomic(folder / "report.md", report.markdown(runs_file, plots))
    out.write(f"results in {folder}: report.md, runs.csv, runs.json, raw/, {', '.join(plots) or 'no plots'}\n")
    if plot_error is not None:
        raise plot_error
