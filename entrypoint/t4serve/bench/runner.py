"""Run the sweep: per cell and repeat, vLLM's own `vllm bench serve` against each model's server (a running one at
--base-url, or `t4serve serve` started as a user runs it: t4serve.bench.servers), with GPU telemetry and vLLM's
/metrics sampled during each run; the result folder's runs.json, runs.csv and report.md written after every run,
the plots at the end.

The order is t4serve.bench.grid.sweep_steps': the models interleaved pair by pair (A B, then B A). Servers at
--base-url are all resident, so a pair's runs are back to back. Servers bench starts run one at a time, in rounds:
`t4serve serve` sizes its KV pool to the card's whole free memory (preflight and the plan read it), so a second one
started beside it would find that memory taken and be refused, or size another pool than the one a user gets; and
a start costs minutes (load, compile, canary) against a run's seconds, so a start per pair would spend most of the
sweep starting servers. To interleave pair by pair on one large card, start the servers sized to share it
(T4SERVE_SIZE_AS, as tests/gpu/bench_host.py does) and pass --base-url.

The client (t4serve.bench.client): one process for the sweep by default, so vLLM's import is paid once; each run
records its start and end time and the client's time, and bench prints where the client's time went.

A run that fails (the client exits non-zero, times out, or writes no JSON) is recorded with its error and the tail
of its log, and the sweep goes on; a server that never becomes ready fails every later run of its model, visibly.
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
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from t4serve.atomic import write_atomic
from t4serve.bench import grid, report
from t4serve.bench.client import Client, make_client
from t4serve.bench.results import (
    RUNS_SCHEMA,
    Run,
    RunFigures,
    RunsFile,
    ServerSide,
    Telemetry,
    model_label,
    raw_name,
    read_result,
    write_runs,
)
from t4serve.bench.servers import BenchServer, plan_servers, running_server, tail
from t4serve.bench.serverside import MetricsSampler
from t4serve.bench.telemetry import Sampler
from t4serve.bench.timing import RunTiming, describe, now, split
from t4serve.config.secrets import client_api_key
from t4serve.errors import BenchError, ConfigError, T4ServeError
from t4serve.gpus import KnownGpu
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
    num_prompts: int | None = None  # requests per run; None: grid.prompts_per_cell (waves x c, a steady state)
    waves: int = grid.STEADY_WAVES  # requests per stream in a run, without num_prompts
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
    # "sweep": one client process for the whole sweep (this Python imports vLLM); "per-run": `vllm` per run.
    client: str = "sweep"
    # Goodput's objectives: a request counts as good when its TTFT and its TPOT are both within them.
    slo_ttft_ms: float = grid.DEFAULT_SLO_TTFT_MS
    slo_tpot_ms: float = grid.DEFAULT_SLO_TPOT_MS


WARMUP_DIR = "warmup"


def bench_args(opts: BenchOptions, url: str, served_name: str, tokenizer: str, cell: grid.Cell, raw: Path,
               num_prompts: int | None = None) -> list[str]:
    """The arguments of `vllm bench serve` for one run of a cell, as published-t4-run.md's sweep ran it."""
    return [
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
        str(num_prompts or grid.prompts_per_cell(cell.concurrency, opts.num_prompts, opts.waves)),
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


def bench_argv(opts: BenchOptions, url: str, served_name: str, tokenizer: str, cell: grid.Cell, raw: Path) -> list[str]:
    """`vllm bench serve` for one run, as a command line (`--client per-run` runs it as it is)."""
    return [*shlex.split(opts.vllm), "bench", "serve", *bench_args(opts, url, served_name, tokenizer, cell, raw)]


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
    timing: RunTiming | None = None,
) -> Run:
    """The record of one run of one cell, measured or failed."""
    return Run(
        model=model,
        input_len=cell.input_len,
        concurrency=cell.concurrency,
        repeat=cell.repeat,
        seed=cell.seed,
        num_prompts=grid.prompts_per_cell(cell.concurrency, opts.num_prompts, opts.waves),
        raw_file=raw_file,
        figures=figures,
        error=error,
        telemetry=telemetry,
        server=server,
        timing=timing,
    )


@dataclass(frozen=True)
class Endpoint:
    """Where a model's runs go: its server's URL, the name it serves under, the tokenizer the client loads."""

    url: str
    served_name: str
    tokenizer: str


def run_cell(opts: BenchOptions, client: Client, model: str, at: Endpoint, cell: grid.Cell, raw_dir: Path,
             num_prompts: int | None = None) -> Run:
    """One run of a cell in the client, its telemetry and vLLM's /metrics sampled meanwhile."""
    raw = raw_dir / raw_name(model, cell)
    log = raw.with_suffix(".log")
    args = bench_args(opts, at.url, at.served_name, at.tokenizer, cell, raw, num_prompts)
    server: ServerSide | None = None
    timing: RunTiming | None = None

    def made(raw_file: str | None, figures: RunFigures | None, error: str | None,
             telemetry: Telemetry | None = None) -> Run:
        run = cell_run(opts, model, cell, raw_file=raw_file, figures=figures, error=error, telemetry=telemetry,
                       server=server, timing=timing)
        return dataclasses.replace(run, num_prompts=num_prompts) if num_prompts is not None else run

    started = now()
    with Sampler(opts.telemetry_interval_s) as sampler, MetricsSampler(at.url, opts.telemetry_interval_s) as metrics:
        ran = client.run(args, log, opts.cell_timeout_s)
    timing = RunTiming(started=started, ended=now(), wall_s=round(ran.wall_s, 3),
                       client_start_s=None if ran.client_start_s is None else round(ran.client_start_s, 3))
    telemetry = sampler.result()
    server = metrics.result()
    if ran.error is not None:
        return made(None, None, ran.error, telemetry)
    if ran.rc is None:
        error = f"`vllm bench serve` ran past {opts.cell_timeout_s:.0f} s and was stopped; log {log.name}"
        return made(None, None, error, telemetry)
    if ran.rc != 0 or not raw.is_file():
        error = f"`vllm bench serve` exited {ran.rc} without a result; log {log.name}: ...{tail(log, 3)[-300:]}"
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


def default_tokenizer(model: str, environ: Mapping[str, str]) -> str:
    """The checkpoint `model` names as T4SERVE_MODEL resolves it (an alias is expanded there, once); the name itself
    where it names none (a running server's own model name)."""
    from t4serve.config.settings import VARIABLES_BY_NAME
    from t4serve.config.variables import Context, Invalid

    try:
        return str(VARIABLES_BY_NAME["T4SERVE_MODEL"].parse(model, Context(environ, Path.cwd())).target)
    except Invalid:
        return model


def sweep_gpu(environ: Mapping[str, str]) -> tuple[KnownGpu | None, str]:
    """The known card this sweep runs on (its first visible GPU, by NVML's name), for the decode ceiling; None with
    why when there is none or t4serve.gpus does not know it."""
    from t4serve.gpus import match_known_gpu
    from t4serve.probes.gpu import probe_gpu

    facts = probe_gpu(environ)
    if not facts.devices:
        return None, f"no GPU visible here ({facts.error or 'NVML found none'})"
    name = facts.devices[0].name
    card = match_known_gpu(name)
    return card, "" if card is not None else f"{name} is not among t4serve's known GPUs (t4serve.gpus.KNOWN_GPUS)"


def roofline_ceilings(
    models: list[str], given: dict[str, float], environ: Mapping[str, str], gpu: KnownGpu | None, no_gpu: str = ""
) -> tuple[dict[str, float | None], list[str]]:
    """Per-stream decode ceiling per model: --ceiling first, else `roofline.decode_ceiling` on `gpu`, the card the
    sweep runs on (`sweep_gpu`); without one, no ceiling and a note saying why (`no_gpu`).

    The checkpoint's headers come from the local cache or, for the aliases, the built-in facts
    (t4serve.probes.checkpoint); a model whose headers cannot be read gets no ceiling and a note saying why, never a
    made-up figure.
    """
    from t4serve.config.settings import Settings
    from t4serve.pipeline import probe_settings_model
    from t4serve.planning.roofline import decode_ceiling

    ceilings: dict[str, float | None] = {}
    notes: list[str] = []
    for model in models:
        if model in given:
            ceilings[model] = given[model]
            continue
        ceilings[model] = None
        if gpu is None:
            notes.append(f"{model}: no roofline ceiling: {no_gpu or 'no known GPU'} (--ceiling {model}=N gives one)")
            continue
        try:
            facts = probe_settings_model(Settings.from_environ(environ, overrides={"T4SERVE_MODEL": model}))
            ceiling = decode_ceiling(facts, gpu)
        except T4ServeError as exc:
            notes.append(f"{model}: no roofline ceiling: {exc.what} ({exc.found})")
            continue
        ceilings[model] = ceiling.value
        notes.append(f"{model}: roofline ceiling on {gpu.name} {ceiling}")
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
    card, no_card = sweep_gpu(environ) if set(opts.models) - set(opts.ceilings) else (None, "")
    ceilings, notes = roofline_ceilings(opts.models, opts.ceilings, environ, card, no_card)
    together = bool(opts.base_urls)
    if opts.warmup_run:
        notes.append(f"each cell ran once before its first pair (each server's first run of it), unrecorded "
                     f"(--warmup-run; 2 x c requests, seed repeat 0, files in raw/{WARMUP_DIR}/), so kernels compiled "
                     "for its batch shapes are not timed")
    planned: dict[str, BenchServer] = {}
    if not together:
        planned, plan_notes = plan_servers(opts.models, environ, opts.output)
        notes += plan_notes
    steps = grid.sweep_steps(opts.models, opts.inputs, opts.concurrencies, opts.repeats, together=together,
                             warmup=opts.warmup_run)
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
        order="interleaved" if together else "rounds",
        client=opts.client,
    )
    progress = Progress(runs_file.planned_runs, out)
    # The line benchmark_status reads runs done / planned from, before the first run (a server start, minutes) ends.
    out.write(f"[{'.' * 20}] 0/{runs_file.planned_runs} planned\n")
    out.flush()
    client = make_client(opts.client, opts.vllm, raw_dir, client_key, environ)
    servers = Servers(opts, planned, raw_dir, out, environ, client_key)
    sweep = Sweep(opts, runs_file, client, servers, progress)
    write_runs(opts.output, runs_file)
    try:
        with _signals_interrupt(), contextlib.closing(client), contextlib.closing(servers):
            for step in steps:
                sweep.step(step)
    except Interrupted as exc:
        runs_file = dataclasses.replace(runs_file, interrupted=exc.why)
        _print_split(runs_file, out)
        _say_no_plots(write_folder(opts.output, runs_file, out), out)  # the signal decides the exit code
        raise
    _print_split(runs_file, out)
    plot_error = write_folder(opts.output, runs_file, out)
    if plot_error is not None and any(r.figures is not None and r.figures.completed > 0 for r in runs_file.runs):
        raise plot_error
    # Nothing measured: that (BenchError, exit 6) is the failure to report, not the plots that had nothing to draw.
    _say_no_plots(plot_error, out)
    return runs_file


def _say_no_plots(plot_error: ConfigError | None, out: IO[str]) -> None:
    if plot_error is not None:
        out.write(f"t4serve bench: no plots: {plot_error.what}\n")


def _print_split(runs_file: RunsFile, out: IO[str]) -> None:
    s = split((r.timing, r.figures.duration_s if r.figures else None) for r in runs_file.runs if r.timing)
    if s is not None:
        out.write(describe(s) + "\n")
        out.flush()


class Servers:
    """Each model's endpoint as the sweep reaches it: at --base-url (all resident; each asked once for the name it
    serves), or a `t4serve serve` bench starts, one at a time: reaching another model stops the running one first.
    A server that fails (never ready, or lists no model) fails every later run of its model, at once."""

    def __init__(self, opts: BenchOptions, planned: dict[str, BenchServer], raw_dir: Path, out: IO[str],
                 environ: Mapping[str, str], api_key: str | None) -> None:
        self.opts, self.planned, self.raw_dir, self.out = opts, planned, raw_dir, out
        self.environ, self.api_key = environ, api_key
        self.failed: dict[str, T4ServeError] = {}
        self.known: dict[str, Endpoint] = {}
        self.current: str | None = None
        self.starts: dict[str, int] = {}
        self.stack = contextlib.ExitStack()

    def endpoint(self, model: str) -> Endpoint:
        """Where `model`'s run goes now; T4ServeError (also for every later call) where its server fails."""
        if model in self.failed:
            raise self.failed[model]
        try:
            return self._endpoint(model)
        except T4ServeError as exc:
            self.failed[model] = exc
            self.out.write(f"{model}: {exc.message()}\n")
            raise

    def _endpoint(self, model: str) -> Endpoint:
        server = self.planned.get(model)
        if server is None:
            if model not in self.known:
                url = self.opts.base_urls[model].rstrip("/")
                tokenizer = self.opts.tokenizers.get(model) or default_tokenizer(model, self.environ)
                self.known[model] = Endpoint(url, served_model_name(url, api_key=self.api_key), tokenizer)
            return self.known[model]
        if self.current != model:
            self.stack.close()
            self.current = None
            n = self.starts[model] = self.starts.get(model, 0) + 1
            self.out.write(f"starting {model}{'' if n == 1 else f' (start {n})'}: {server.describe()}\n")
            self.out.flush()
            log = self.raw_dir / f"server_{model_label(model)}_{n}.log"
            started = self.stack.enter_context(running_server(server, log, self.opts.ready_timeout_s, self.environ,
                                                              self.api_key))
            self.current = model
            tokenizer = self.opts.tokenizers.get(model, started.checkpoint)
            self.known[model] = Endpoint(started.url, served_model_name(started.url, api_key=self.api_key), tokenizer)
        return self.known[model]

    def close(self) -> None:
        self.stack.close()


class Sweep:
    """The sweep's runs, one step at a time: each recorded run written out at once (runs.json, runs.csv and
    report.md: a sweep killed at any moment, even by -9, leaves every finished run and pair on disk)."""

    def __init__(self, opts: BenchOptions, runs_file: RunsFile, client: Client, servers: Servers,
                 progress: Progress) -> None:
        self.opts, self.runs_file, self.client, self.servers, self.progress = opts, runs_file, client, servers, progress
        self.raw_dir = opts.output / "raw"
        # Client start-up paid by a warm-up run, carried to the next recorded run (whose timing says what it paid).
        self.carried_start_s = 0.0

    def record(self, run: Run) -> None:
        if run.timing is not None and run.timing.client_start_s is not None and self.carried_start_s:
            run = dataclasses.replace(run, timing=dataclasses.replace(
                run.timing, client_start_s=round(run.timing.client_start_s + self.carried_start_s, 3)))
            self.carried_start_s = 0.0
        self.runs_file.runs.append(run)
        write_tables(self.opts.output, self.runs_file)

    def step(self, step: grid.Step) -> None:
        cell = step.cell
        label = f"{step.model} in={cell.input_len} c={cell.concurrency}"
        try:
            at = self.servers.endpoint(step.model)
        except T4ServeError as exc:
            if not step.warmup:
                self.record(cell_run(self.opts, step.model, cell, raw_file=None, figures=None, error=exc.what,
                                     telemetry=Telemetry(samples=0, error="server not running")))
                self.progress.step(f"{label} r={cell.repeat}", f"FAILED: {exc.what}")
            return
        if step.warmup:
            warm = run_cell(self.opts, self.client, step.model, at, cell, self.raw_dir / WARMUP_DIR,
                            grid.warmup_prompts(cell.concurrency, self.opts.num_prompts, self.opts.waves))
            if warm.timing is not None and warm.timing.client_start_s:
                self.carried_start_s += warm.timing.client_start_s
            done = warm.error or "done"
            self.progress.stream.write(f"  warm-up {label} (not recorded): {done}{_client_time(warm)}\n")
            self.progress.stream.flush()
            return
        run = run_cell(self.opts, self.client, step.model, at, cell, self.raw_dir)
        self.record(run)
        outcome = run.error or (
            f"{run.figures.output_throughput:.2f} tok/s, TPOT {run.figures.median_tpot_ms:.2f} ms, "
            f"{run.figures.failed} failed" if run.figures else "?")
        self.progress.step(f"{label} r={cell.repeat}", outcome + _client_time(run))


def _client_time(run: Run) -> str:
    """A run's client time, as its progress line shows it: start-up paid, its wall time, the part measured."""
    t = run.timing
    if t is None:
        return ""
    start = f"client start-up {t.client_start_s:.1f} s, " if t.client_start_s else ""
    measured = f", measured {run.figures.duration_s:.1f} s" if run.figures else ""
    return f" [{start}run {t.wall_s:.1f} s{measured}]"


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


def write_tables(folder: Path, runs_file: RunsFile) -> None:
    """runs.json, runs.csv and report.md (each atomically): what a sweep leaves after every run."""
    write_runs(folder, runs_file)
    write_atomic(folder / "runs.csv", report.runs_csv(runs_file.runs))
    write_atomic(folder / "report.md", report.markdown(runs_file))


def write_folder(folder: Path, runs_file: RunsFile, out: IO[str]) -> ConfigError | None:
    """runs.json, runs.csv, the plots and report.md; returns why there are no plots (matplotlib missing), else None:
    the caller decides whether that is the error to exit with."""
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
    return plot_error
