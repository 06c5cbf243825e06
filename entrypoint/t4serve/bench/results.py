"""Runs and their per-cell summaries: what one `vllm bench serve` JSON says, and what a cell's repeats add up to.

A `Run` is one (model, cell, repeat): the figures read from vLLM's `--save-result` JSON, or the error that left it
without one. `summarize` groups runs into `CellSummary`s: medians over repeats, per stream = 1000 / median TPOT,
run-to-run variation = (max - min) / median throughput. A cell whose every repeat failed is kept, marked failed.
"""

from __future__ import annotations

import dataclasses
import json
import re
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from t4serve.atomic import write_atomic
from t4serve.bench.grid import MAX_CONCURRENCY, MAX_INPUT_LEN, MAX_REPEATS, Cell
from t4serve.bench.timing import RunTiming, check_timing
from t4serve.errors import ConfigError
from t4serve.serde import from_dict, to_dict
from t4serve.untrusted import Untrusted, check_finite, check_int, check_text, load_json_file

# A model's name names its raw/ files (raw_name: the name, input, concurrency and repeat, .json), which a file
# system takes up to 255 bytes.
MAX_MODEL_NAME_CHARS = 160
RUNS_FILE = "runs.json"
RUNS_SCHEMA, READ_SCHEMAS = 2, (1, 2)  # 2: runs' timing, the sweep's order and client; 1 reads as sequential
# runs.json of a 99-repeat sweep, or a result with per-request lists, is a few MB; past this it is not ours.
MAX_JSON_BYTES = 64 << 20


@dataclass(frozen=True)
class RunFigures:
    """The fields of vLLM's result JSON the report uses (vllm/benchmarks/serve.py `result_json`)."""

    completed: int
    failed: int
    output_throughput: float  # generated tokens per second, all streams
    median_tpot_ms: float
    median_ttft_ms: float
    mean_ttft_ms: float
    total_output_tokens: int
    duration_s: float
    # Requests per second; and those that met the run's objectives (vLLM's `request_goodput`, from `--goodput`).
    # None in results written without them.
    request_throughput: float | None = None
    request_goodput: float | None = None


@dataclass(frozen=True)
class Telemetry:
    """GPU samples taken while the cell ran; `error` says why there are none."""

    samples: int
    power_w_mean: float | None = None
    power_limit_w: float | None = None
    sm_clock_mhz_mean: float | None = None
    sm_clock_max_mhz: float | None = None
    throttle_reasons: list[str] = field(default_factory=list)
    error: str | None = None


@dataclass(frozen=True)
class ServerSide:
    """What vLLM's /metrics said about one run; None where the server did not say."""

    samples: int
    running_mean: float | None = None  # requests in the batch, mean over busy samples
    running_max: float | None = None
    waiting_max: float | None = None
    kv_usage_max_pct: float | None = None
    preemptions: float | None = None
    steps: float | None = None  # engine steps (iteration_tokens_total's count)
    tokens_per_step: float | None = None  # prefill + decode tokens per engine step, mean
    queue_ms_mean: float | None = None  # from arrival to first schedule, per request
    prefill_ms_mean: float | None = None
    decode_ms_mean: float | None = None
    error: str | None = None


# ServerSide's figures (all but `samples` and `error`), in the order the CSV's server_* columns list them.
SERVER_FIGURES = ("running_mean", "running_max", "waiting_max", "kv_usage_max_pct", "preemptions", "steps",
                  "tokens_per_step", "queue_ms_mean", "prefill_ms_mean", "decode_ms_mean")


@dataclass(frozen=True)
class Run:
    model: str
    input_len: int
    concurrency: int
    repeat: int
    seed: int
    num_prompts: int
    raw_file: str | None
    figures: RunFigures | None
    error: str | None = None
    telemetry: Telemetry | None = None
    server: ServerSide | None = None  # vLLM's own /metrics over the run (bench.serverside); None in older folders
    timing: RunTiming | None = None  # when it ran, and the client's time (t4serve.bench.timing); None before schema 2

    @property
    def cell(self) -> Cell:
        return Cell(self.input_len, self.concurrency, self.repeat)


# What a figure of one run may be: counts and rates that no sweep on one server comes near, so a larger one (1e308)
# is not a measurement, and a report or plot never has to draw it.
MAX_COUNT = 10**12
MAX_FIGURE = 1e9


def figures_from_result(data: dict[str, Any], where: str) -> RunFigures:
    """Read vLLM's result JSON: each figure a number of its kind (a count an integer, a rate or time finite, none
    negative or beyond MAX_COUNT / MAX_FIGURE); a missing or wrong one is a ConfigError naming the file."""
    try:
        return _figures(data)
    except (KeyError, Untrusted) as exc:
        found = exc.reason if isinstance(exc, Untrusted) else f"no key {exc}"
        raise ConfigError(
            f"{where} is not a `vllm bench serve --save-result` JSON this version understands",
            found=found,
            required="keys completed, output_throughput, median_tpot_ms, median_ttft_ms, total_output_tokens, "
            f"duration: counts from 0 to {MAX_COUNT:,}, figures finite from 0 to {MAX_FIGURE:g}",
            fix="run the vLLM pinned in the image (0.33.0); its result format is the one read here",
        ) from None


def goodput_from_detail(data: dict[str, Any], slo_ttft_ms: float, slo_tpot_ms: float) -> float | None:
    """Requests per second that met both objectives, counted from a `--save-detailed` result the way vLLM counts
    `request_goodput` (vllm/benchmarks/serve.py `calculate_metrics`): over the successful requests, TTFT and TPOT
    (latency - TTFT over output tokens - 1; 0 for a single token) each at most its objective, divided by the run's
    duration. None where the result keeps no per-request figures (a run without --save-detailed)."""
    try:
        ttfts, latencies, lens, errors = (data[k] for k in ("ttfts", "latencies", "output_lens", "errors"))
        duration = float(data["duration"])
        if not (len(ttfts) == len(latencies) == len(lens) == len(errors)) or duration <= 0:
            return None
        good = 0
        for ttft, latency, n, error in zip(ttfts, latencies, lens, errors, strict=True):
            if error:
                continue
            tpot = (float(latency) - float(ttft)) / (int(n) - 1) if int(n) > 1 else 0.0
            if float(ttft) * 1000 <= slo_ttft_ms and tpot * 1000 <= slo_tpot_ms:
                good += 1
        # The figure within the bounds every figure of a run is held to: a duration of 1e-300 s is no rate.
        return check_finite(good / duration, "request_goodput", 0.0, MAX_FIGURE)
    except (KeyError, TypeError, ValueError, OverflowError):  # Untrusted is a ValueError
        return None


def _figures(data: dict[str, Any]) -> RunFigures:
    def count(key: str, value: object) -> int:
        return check_int(value, key, 0, MAX_COUNT)

    def figure(key: str, value: object) -> float:
        return check_finite(value, key, 0.0, MAX_FIGURE)

    def optional(key: str) -> float | None:
        value = data.get(key)
        return None if value is None else figure(key, value)

    return RunFigures(
        completed=count("completed", data["completed"]),
        failed=count("failed", data.get("failed", 0)),
        output_throughput=figure("output_throughput", data["output_throughput"]),
        median_tpot_ms=figure("median_tpot_ms", data["median_tpot_ms"]),
        median_ttft_ms=figure("median_ttft_ms", data["median_ttft_ms"]),
        mean_ttft_ms=figure("mean_ttft_ms", data["mean_ttft_ms"]),
        total_output_tokens=count("total_output_tokens", data["total_output_tokens"]),
        duration_s=figure("duration", data["duration"]),
        # Written only with some flags (`request_goodput` is null without `--goodput`).
        request_throughput=optional("request_throughput"),
        request_goodput=optional("request_goodput"),
    )


@dataclass(frozen=True)
class CellSummary:
    model: str
    input_len: int
    concurrency: int
    repeats_ok: int
    repeats_failed: int
    completed: int
    failed_requests: int
    throughput: float | None  # median over repeats, tok/s
    per_stream: float | None  # 1000 / median of the repeats' median TPOT, tok/s
    ttft_ms: float | None  # median over repeats of the median TTFT
    variation_pct: float | None  # (max - min) / median throughput over repeats, percent
    errors: list[str] = field(default_factory=list)
    # The spread over repeats: lowest and highest throughput and median TTFT.
    throughput_min: float | None = None
    throughput_max: float | None = None
    ttft_min_ms: float | None = None
    ttft_max_ms: float | None = None
    # Median over repeats of requests per second that met the objectives, and of the share of requests that did.
    goodput: float | None = None
    good_pct: float | None = None

    @property
    def failed(self) -> bool:
        return self.repeats_ok == 0


def summarize(runs: list[Run]) -> list[CellSummary]:
    """One summary per (model, input, concurrency), in the order the runs first name them."""
    groups: dict[tuple[str, int, int], list[Run]] = {}
    for run in runs:
        groups.setdefault((run.model, run.input_len, run.concurrency), []).append(run)
    return [_summary(key, group) for key, group in groups.items()]


def _summary(key: tuple[str, int, int], runs: list[Run]) -> CellSummary:
    model, input_len, concurrency = key
    ok = [r.figures for r in runs if r.figures is not None and r.figures.completed > 0]
    errors = [f"repeat {r.repeat}: {r.error}" for r in runs if r.error]
    throughputs = [f.output_throughput for f in ok]
    tpots = [f.median_tpot_ms for f in ok if f.median_tpot_ms > 0]
    median_tp = statistics.median(throughputs) if throughputs else None
    ttfts = [f.median_ttft_ms for f in ok]
    goodputs = [f.request_goodput for f in ok if f.request_goodput is not None]
    shares = [f.request_goodput / f.request_throughput * 100 for f in ok
              if f.request_goodput is not None and f.request_throughput]
    variation = None
    if median_tp and len(throughputs) > 1:
        variation = (max(throughputs) - min(throughputs)) / median_tp * 100
    elif median_tp:
        variation = 0.0
    return CellSummary(
        model=model,
        input_len=input_len,
        concurrency=concurrency,
        repeats_ok=len(ok),
        repeats_failed=len(runs) - len(ok),
        completed=sum(r.figures.completed for r in runs if r.figures),
        failed_requests=sum(r.figures.failed for r in runs if r.figures),
        throughput=median_tp,
        per_stream=1000 / statistics.median(tpots) if tpots else None,
        ttft_ms=statistics.median(f.median_ttft_ms for f in ok) if ok else None,
        variation_pct=variation,
        errors=errors,
        throughput_min=min(throughputs) if throughputs else None,
        throughput_max=max(throughputs) if throughputs else None,
        ttft_min_ms=min(ttfts) if ttfts else None,
        ttft_max_ms=max(ttfts) if ttfts else None,
        goodput=statistics.median(goodputs) if goodputs else None,
        good_pct=statistics.median(shares) if shares else None,
    )


@dataclass(frozen=True)
class RunsFile:
    """Everything a result folder needs to be re-reported or compared: settings and every run."""

    schema: int
    models: list[str]
    inputs: list[int]
    concurrencies: list[int]
    repeats: int
    output_len: int
    started: str
    runs: list[Run]
    # Per model: the decode ceiling in tok/s per stream from t4serve.planning.roofline, or None when not known.
    ceilings: dict[str, float | None] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    # Runs the sweep set out to make (models x cells); fewer in `runs` means it stopped early, and `interrupted`
    # says why (a signal, or "rebuilt from raw/" for a folder whose runs.json was never written).
    planned_runs: int = 0
    interrupted: str | None = None
    # The objectives goodput counts against (`--slo-ttft-ms`, `--slo-tpot-ms`); None in folders written before.
    slo_ttft_ms: float | None = None
    slo_tpot_ms: float | None = None
    # "interleaved" (pairs back to back), "rounds" (a server started per round) or "sequential" (older, merged).
    order: str = "sequential"
    client: str | None = None  # "sweep" (one client process) or "per-run"; None before schema 2

    @property
    def partial(self) -> bool:
        return self.interrupted is not None or len(self.runs) < self.planned_runs


def write_runs(folder: Path, runs_file: RunsFile) -> Path:
    """Atomically: the sweep rewrites it after every run, so a kill at any moment leaves the last whole version."""
    path = folder / RUNS_FILE
    write_atomic(path, json.dumps(to_dict(runs_file), indent=2) + "\n")
    return path


def model_label(model: str) -> str:
    """A model as a file name's part: an alias or repo id's `/` and anything else a path would read become `_`."""
    # No leading dot either: `--models ../x` made raw/.._x_in512_c1_r1.json, a hidden file.
    return re.sub(r"^[._]+", "", re.sub(r"[^A-Za-z0-9_.-]+", "_", model)).rstrip("_") or "model"


def raw_name(model: str, cell: Cell) -> str:
    """The file in raw/ that holds one run's `vllm bench serve` result; RAW_NAME reads it back."""
    return f"{model_label(model)}_in{cell.input_len}_c{cell.concurrency}_r{cell.repeat}.json"


RAW_NAME = re.compile(r"^(?P<model>.+)_in(?P<input>[0-9]+)_c(?P<c>[0-9]+)_r(?P<r>[0-9]+)\.json$", re.ASCII)


def runs_from_raw(folder: Path) -> RunsFile:
    """A RunsFile rebuilt from raw/*.json alone (vLLM's own results), for a folder whose runs.json was never written:
    a sweep killed before this version wrote it after every run. Models are the raw names' labels; telemetry was
    not kept; cells present for one model but not another count as planned and not run."""
    found: list[Run] = []
    output_lens: set[int] = set()
    for path in sorted((folder / "raw").glob("*.json")):
        m = RAW_NAME.match(path.name)
        if m is None:
            continue
        data = _load(path, "a `vllm bench serve` result", "`vllm bench serve --save-result` JSON files in raw/",
                     "remove the damaged file and run `t4serve bench report` again")
        figures = figures_from_result(data, str(path))
        cell = Cell(int(m["input"]), int(m["c"]), int(m["r"]))
        if figures.completed:
            output_lens.add(figures.total_output_tokens // figures.completed)
        found.append(Run(model=m["model"], input_len=cell.input_len, concurrency=cell.concurrency,
                         repeat=cell.repeat, seed=cell.seed, num_prompts=_num_prompts(data, path),
                         raw_file=path.name, figures=figures,
                         error=f"all {figures.failed} requests failed" if figures.completed == 0 else None,
                         telemetry=Telemetry(samples=0, error="not kept: rebuilt from raw/")))
    if not found:
        raise ConfigError(
            f"{folder} holds neither {RUNS_FILE} nor raw/*.json results",
            found=f"{folder}: no {RUNS_FILE}, no raw/MODEL_inN_cN_rN.json",
            required=f"a folder written by `t4serve bench --output DIR` ({RUNS_FILE}, or raw/ at least)",
            fix="pass the --output folder of an earlier `t4serve bench` run",
        )
    rebuilt = _gathered(sorted({r.model for r in found}), found, output_len=min(output_lens) if output_lens else 0,
                        started="unknown (rebuilt from raw/)", interrupted="rebuilt from raw/")
    return check_runs_file(rebuilt, str(folder / "raw"))


def _num_prompts(data: dict[str, Any], path: Path) -> int:
    try:
        return check_int(data.get("num_prompts", 0) or 0, "num_prompts", 0, MAX_COUNT)
    except Untrusted as exc:
        raise ConfigError(f"{path} is not a `vllm bench serve --save-result` JSON this version understands",
                          found=exc.reason, required=f"num_prompts a count from 0 to {MAX_COUNT:,}",
                          fix="remove the damaged file and run `t4serve bench report` again") from None


def _gathered(models: list[str], runs: list[Run], **fields: Any) -> RunsFile:
    """A RunsFile for runs gathered after the fact (from raw/, or from several folders): the grid is the cells they
    hold, every model counts as planned in every cell, the runs in report order."""
    inputs = sorted({r.input_len for r in runs})
    concurrencies = sorted({r.concurrency for r in runs})
    repeats = max(r.repeat for r in runs)
    runs.sort(key=lambda r: (models.index(r.model), r.input_len, r.concurrency, r.repeat))
    return RunsFile(schema=RUNS_SCHEMA, models=models, inputs=inputs, concurrencies=concurrencies, repeats=repeats,
                    runs=runs, planned_runs=len(models) * len(inputs) * len(concurrencies) * repeats, **fields)


def load_runs(folder: Path) -> RunsFile:
    """A result folder's runs: its runs.json, or, where that was never written, its raw/ files."""
    return read_runs(folder) if (folder / RUNS_FILE).exists() else runs_from_raw(folder)


def read_runs(folder: Path) -> RunsFile:
    path = folder / RUNS_FILE
    required = f"a folder written by `t4serve bench --output DIR` (it holds {RUNS_FILE})"
    fix = "pass the --output folder of an earlier `t4serve bench` run"
    data = _load(path, f"{folder} is not a `t4serve bench` result folder:", required, fix)
    if data.get("schema") not in READ_SCHEMAS:
        raise ConfigError(f"{path} is of a schema this t4serve does not read",
                          found=f"schema {str(data.get('schema'))[:40]}", required=f"schema {READ_SCHEMAS}: {required}",
                          fix="report it with the t4serve version that wrote it")  # fmt: skip
    try:
        runs_file = from_dict(RunsFile, data, where=str(path))
    except ConfigError as exc:
        raise ConfigError(f"{path} is not a runs file of this t4serve", found=exc.what, required=required,
                          fix=fix) from None
    return check_runs_file(dataclasses.replace(runs_file, schema=RUNS_SCHEMA), str(path))


def check_runs_file(runs_file: RunsFile, where: str) -> RunsFile:
    """What the report, the CSV and the plots rely on, checked once for any runs file however it was made (read,
    rebuilt from raw/, merged): model names of one word a markdown table can hold, cells in the grid's ranges and
    each made once, figures of their kind (finite, not negative, bounded), a known GPU's telemetry. ConfigError
    otherwise, naming the file and the first problem: matplotlib and the tables never see a value they cannot show."""
    try:
        _check_runs_file(runs_file)
    except Untrusted as exc:
        raise ConfigError(
            f"{where} holds runs t4serve cannot report",
            found=exc.reason,
            required="runs as `t4serve bench` writes them: one-word model names, input 1..2^24, concurrency 1..99, "
            "repeat 1..99, each cell once, figures finite and not negative",
            fix="run the sweep again, or remove the damaged runs.json (`t4serve bench report` then rebuilds it from "
            "raw/)",
        ) from None
    return runs_file


def _check_runs_file(rf: RunsFile) -> None:
    if len(rf.models) != len(set(rf.models)) or not rf.models:
        raise Untrusted(f"models must be listed once each (found {str(rf.models)[:120]})")
    for model in rf.models:
        check_model_name(model)
    for what, values, hi in (("inputs", rf.inputs, MAX_INPUT_LEN), ("concurrencies", rf.concurrencies,
                                                                     MAX_CONCURRENCY)):  # fmt: skip
        for value in values:
            check_int(value, what, 1, hi)
        if len(values) != len(set(values)):
            raise Untrusted(f"{what} must be listed once each (found {str(values)[:120]})")
    check_int(rf.repeats, "repeats", 1, MAX_REPEATS)
    check_int(rf.output_len, "output_len", 0, MAX_INPUT_LEN)
    check_int(rf.planned_runs, "planned_runs", 0, MAX_COUNT)
    if rf.order not in ("interleaved", "rounds", "sequential") or rf.client not in (None, "sweep", "per-run"):
        raise Untrusted(f"order {rf.order[:20]!r} / client {str(rf.client)[:20]!r} is not one this t4serve wrote")
    for name in ("slo_ttft_ms", "slo_tpot_ms"):
        value = getattr(rf, name)
        if value is not None:
            check_finite(value, name, 0.0, MAX_FIGURE)
    for model, ceiling in rf.ceilings.items():
        if ceiling is not None:
            check_finite(ceiling, f"the ceiling of {model[:40]!r}", 0.0, MAX_FIGURE)
    seen: set[tuple[str, int, int, int]] = set()
    for run in rf.runs:
        where = f"the run {run.model[:40]!r} input {str(run.input_len)[:20]} c={str(run.concurrency)[:20]}"
        if run.model not in rf.models:
            raise Untrusted(f"{where} names a model the file does not list")
        check_int(run.input_len, f"{where}: input_len", 1, MAX_INPUT_LEN)
        check_int(run.concurrency, f"{where}: concurrency", 1, MAX_CONCURRENCY)
        check_int(run.repeat, f"{where}: repeat", 1, MAX_REPEATS)
        check_int(run.num_prompts, f"{where}: num_prompts", 0, MAX_COUNT)
        key = (run.model, run.input_len, run.concurrency, run.repeat)
        if key in seen:
            raise Untrusted(f"{where} repeat {run.repeat} is listed twice")
        seen.add(key)
        if run.figures is not None:
            _figures({"completed": run.figures.completed, "failed": run.figures.failed,
                      "output_throughput": run.figures.output_throughput,
                      "median_tpot_ms": run.figures.median_tpot_ms, "median_ttft_ms": run.figures.median_ttft_ms,
                      "mean_ttft_ms": run.figures.mean_ttft_ms,
                      "total_output_tokens": run.figures.total_output_tokens,
                      "duration": run.figures.duration_s, "request_throughput": run.figures.request_throughput,
                      "request_goodput": run.figures.request_goodput})  # fmt: skip
        t = run.telemetry
        if t is not None:
            check_int(t.samples, f"{where}: telemetry samples", 0, MAX_COUNT)
            for name in ("power_w_mean", "power_limit_w", "sm_clock_mhz_mean", "sm_clock_max_mhz"):
                value = getattr(t, name)
                if value is not None:
                    check_finite(value, f"{where}: {name}", 0.0, MAX_FIGURE)
            for text in (*t.throttle_reasons, run.error or "", run.raw_file or "", t.error or ""):
                check_text(text, f"{where}: a note", allow_blanks=True)
        s = run.server
        if s is not None:
            check_int(s.samples, f"{where}: server samples", 0, MAX_COUNT)
            for name in SERVER_FIGURES:
                value = getattr(s, name)
                if value is not None:
                    check_finite(value, f"{where}: server {name}", 0.0, MAX_FIGURE)
            check_text(s.error or "", f"{where}: a note", allow_blanks=True)
        if run.timing is not None:
            check_timing(run.timing, where)


def check_model_name(name: str) -> str:
    """A model name as a result folder may hold it: one word without control characters (a newline would break
    report.md's tables; `|` is escaped where a table shows it), at most MAX_MODEL_NAME_CHARS."""
    check_int(len(name), "a model name's length", 1, MAX_MODEL_NAME_CHARS)
    check_text(name, "a model name")
    if any(c.isspace() for c in name):
        raise Untrusted(f"a model name must be one word (found {name[:60]!r})")
    return name


def with_objectives(folder: Path, runs_file: RunsFile, slo_ttft_ms: float, slo_tpot_ms: float) -> RunsFile:
    """The folder's runs with goodput counted again against other objectives, from each run's detailed result in
    raw/; a run whose result keeps no per-request figures gets no goodput, and a note says how many."""
    runs: list[Run] = []
    missing = 0
    for run in runs_file.runs:
        if run.figures is None or run.raw_file is None:
            runs.append(run)
            continue
        data = _load(folder / "raw" / run.raw_file, "a `vllm bench serve` result",
                     "the JSON `vllm bench serve --save-result --save-detailed` writes", "run the cell again")
        goodput = goodput_from_detail(data, slo_ttft_ms, slo_tpot_ms)
        missing += goodput is None
        runs.append(dataclasses.replace(run, figures=dataclasses.replace(run.figures, request_goodput=goodput)))
    notes = list(runs_file.notes)
    if runs_file.slo_ttft_ms is not None:
        notes.append(f"goodput counted again from raw/ against TTFT {slo_ttft_ms:g} ms / TPOT {slo_tpot_ms:g} ms "
                     f"(the sweep ran with TTFT {runs_file.slo_ttft_ms:g} ms / TPOT {runs_file.slo_tpot_ms:g} ms)")
    if missing:
        notes.append(f"{missing} run(s) kept no per-request figures (made without --save-detailed): no goodput")
    return dataclasses.replace(runs_file, runs=runs, notes=notes, slo_ttft_ms=slo_ttft_ms, slo_tpot_ms=slo_tpot_ms)


def read_result(path: Path) -> RunFigures:
    """The figures of one `vllm bench serve --save-result` file."""
    data = _load(path, "a `vllm bench serve` result", "the JSON `vllm bench serve --save-result` writes",
                 "run the cell again")
    return figures_from_result(data, str(path))


def _load(path: Path, what: str, required: str, fix: str) -> dict[str, Any]:
    """A JSON object from a file a run wrote, read as untrusted input (bounded size and nesting, finite numbers)."""
    try:
        data = load_json_file(path, MAX_JSON_BYTES, what)
    except (OSError, Untrusted) as exc:
        found = exc.reason if isinstance(exc, Untrusted) else f"{path}: {exc.strerror or exc}"
        raise ConfigError(f"{what} {path} cannot be read", found=found, required=required, fix=fix) from None
    if not isinstance(data, dict):
        raise ConfigError(f"{what} {path} is not a JSON object", found=f"{type(data).__name__} at the top level",
                          required=required, fix=fix)
    return data
