"""`t4serve bench`: run the T4 sweep with vLLM's `vllm bench serve` and write tables, plots and raw JSON;
`t4serve bench compare A B`: two result folders side by side; `t4serve bench merge OUT SOURCE...`: sweeps made one
after the other as one report; `t4serve bench report DIR`: a folder's report written again. Output is a folder;
progress goes to stderr.
Exit 0 when every run measured, 1 when some failed, 6 (BenchError) when none did; the folder is written in each case.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import tempfile
from pathlib import Path

import click

from t4serve.bench.grid import DEFAULT_SLO_TPOT_MS, DEFAULT_SLO_TTFT_MS
from t4serve.config.options import FloatText, IntText
from t4serve.errors import BenchError, ConfigError
from t4serve.untrusted import Untrusted, check_host, check_path, check_text, parse_float, parse_int, printable

# results.MAX_MODEL_NAME_CHARS, restated so `t4serve bench --help` imports nothing of the sweep.
MAX_MODEL_NAME_CHARS = 160

# Seconds a server may take to load or a run may last: a week is beyond any sweep.
MAX_TIMEOUT_S = 7 * 24 * 3600.0
# A goodput objective of an hour per token or first token: no request could miss it, so it is no objective.
MAX_OBJECTIVE_MS = 3_600_000.0


def _output_folder(output: Path) -> Path:
    """The result folder, created now: a new or empty folder (never one holding results), a path the system takes,
    where this user can write (a file is created and removed to know: root's and a read-only mount's answers to
    os.access differ from what a write does)."""
    try:
        check_path(str(output), "--output")
        if output.exists() and not output.is_dir():
            raise Untrusted(f"--output {output} is a file, not a folder")
        if output.is_dir() and any(output.iterdir()):
            raise Untrusted(f"--output {output} already holds files (results are never overwritten)")
        created = not output.exists()
        output.mkdir(parents=True, exist_ok=True)
        try:
            fd, probe = tempfile.mkstemp(prefix=".t4serve-write-test-", dir=output)
            os.close(fd)
            os.unlink(probe)
        except OSError:
            _remove_if_empty(output, created=created)
            raise
    except (Untrusted, OSError) as exc:
        reason = exc.reason if isinstance(exc, Untrusted) else f"cannot create {output}: {exc.strerror or exc}"
        raise ConfigError(
            f"--output cannot hold the results: {reason}",
            found=str(output)[:300],
            required="a new or empty folder in a writable place",
            fix="give --output a new folder name, or leave it out for bench-DATE in this folder",
        ) from None
    return output


def _remove_if_empty(folder: Path, *, created: bool) -> None:
    """After a usage error: the folder this run created, if nothing but empty folders is in it (no half-made result
    folder is left behind; a folder the user made stays)."""
    if not created or not folder.is_dir():
        return
    for sub in sorted(folder.rglob("*"), key=lambda p: len(p.parts), reverse=True):
        if not sub.is_dir() or sub.is_symlink() or any(sub.iterdir()):
            return
        sub.rmdir()
    with contextlib.suppress(OSError):
        folder.rmdir()


def _pairs(raw: str | None, flag: str, models: list[str], lone_for_all: bool = False) -> dict[str, str]:
    """`a=x,b=y` -> {a: x, b: y}. A lone value with no `=` belongs to the only model, or, with `lone_for_all`
    (a tokenizer shared by every checkpoint), to every model."""
    if not raw:
        return {}
    result: dict[str, str] = {}
    for part in (p.strip() for p in raw.split(",") if p.strip()):
        key, eq, value = part.partition("=")
        if not eq or key.startswith("http"):
            if lone_for_all:
                result.update(dict.fromkeys(models, part))
                continue
            if len(models) != 1:
                raise ConfigError(
                    f"{flag} {raw!r}: a value without MODEL= is only allowed with a single model",
                    found=part,
                    required="MODEL=VALUE pairs, one per model in --models",
                    fix=f"{flag} qat=VALUE,bf16=VALUE",
                )
            key, value = models[0], part
        result[key] = value
    return result


@click.group(invoke_without_command=True)
@click.option("--models", default="qat,bf16", show_default=True, help="Checkpoints to compare (aliases or repo ids).")
@click.option("--inputs", default="512,4096", show_default=True, help="Prompt lengths in tokens.")
@click.option("--concurrency", default="1,4,8,16", show_default=True, help="Concurrent streams per cell.")
@click.option("--repeats", type=IntText(1, 99), default=3, show_default=True,
              help="Runs per cell; the seed changes per repeat.")
@click.option("--output-len", type=IntText(1, 1 << 20), default=128, show_default=True,
              help="Generated tokens per request (--ignore-eos).")
@click.option("--num-prompts", type=IntText(1, 1 << 20), default=None,
              help="Requests per run [default: --waves x concurrency].")
@click.option("--waves", type=IntText(1, 1000), default=10, show_default=True,
              help="Without --num-prompts: requests per stream in a run (10: a steady state, the ramp and the drain "
              "a small part of it).")
@click.option("--num-warmups", type=IntText(0, 1 << 16), default=2, show_default=True,
              help="Warm-up requests before each run.")
@click.option("--warmup-run", is_flag=True, default=False,
              help="Run each cell once per server, unrecorded, before its first pair (2 x concurrency requests, "
              "raw/warmup/): kernels a new batch shape compiles are not timed.")
@click.option(
    "--base-url",
    default=None,
    help="Benchmark running servers instead of starting each model's `t4serve serve`: URL (one model) or "
    "MODEL=URL,MODEL=URL.",
)
@click.option("--tokenizer", default=None, help="Tokenizer: PATH (for every model) or MODEL=PATH,...")
@click.option("--ceiling", default=None, help="Decode ceiling tok/s per stream: MODEL=N,... [default: roofline].")
@click.option("--output", type=click.Path(path_type=Path), default=None, help="Result folder [default: bench-DATE].")
@click.option("--client", "client_kind", type=click.Choice(["sweep", "per-run"]), default="sweep", show_default=True,
              help="sweep: one `vllm bench serve` client for the whole sweep, in this Python (vLLM imported once); "
              "per-run: --vllm's command, a process per run.")
@click.option("--vllm", default=None, help="With --client per-run: the vLLM command whose `bench serve` runs "
              "[default: vllm].")
@click.option("--ready-timeout", default="1800", type=FloatText(0.0, MAX_TIMEOUT_S, lo_open=True), show_default=True,
              help="Seconds a started server may take to load.")
@click.option("--cell-timeout", default="3600", type=FloatText(0.0, MAX_TIMEOUT_S, lo_open=True), show_default=True,
              help="Seconds one run may take before it fails.")
@click.option("--slo-ttft-ms", default=f"{DEFAULT_SLO_TTFT_MS:g}", type=FloatText(0.0, MAX_OBJECTIVE_MS, lo_open=True),
              show_default=True, help="Goodput: a request is good when its time to first token is within this (ms)...")
@click.option("--slo-tpot-ms", default=f"{DEFAULT_SLO_TPOT_MS:g}", type=FloatText(0.0, MAX_OBJECTIVE_MS, lo_open=True),
              show_default=True,
              help="...and its time per output token too (ms). Defaults: MLPerf's server scenario for an 8B model.")
@click.pass_context
def command(
    ctx: click.Context,
    models: str,
    inputs: str,
    concurrency: str,
    repeats: int,
    output_len: int,
    num_prompts: int | None,
    waves: int,
    num_warmups: int,
    warmup_run: bool,
    base_url: str | None,
    tokenizer: str | None,
    ceiling: str | None,
    output: Path | None,
    client_kind: str,
    vllm: str | None,
    ready_timeout: float,
    cell_timeout: float,
    slo_ttft_ms: float,
    slo_tpot_ms: float,
) -> None:
    """Run the published T4 sweep: per input length, concurrency and repeat, `vllm bench serve` for each model.

    The models are interleaved: a cell's repeat is a pair, one run of each model, the order alternating between
    repeats (A B, then B A); the report gives each cell's ratio pair by pair. With --base-url (servers already
    running) a pair's runs are back to back. Without it each model is served by `t4serve serve` (preflight, plan,
    canary, supervision), one at a time, in rounds: every cell once per server start, the rounds alternating.
    Writes OUTPUT/raw/*.json (vLLM's own results), runs.csv, runs.json and report.md after every run, the PNG plots
    at the end, and prints where the client's time went (start-up against measured time).
    """
    if ctx.invoked_subcommand is not None:
        return
    import datetime

    from t4serve.bench import grid
    from t4serve.bench.runner import BenchOptions, run_bench

    model_list = [m.strip() for m in models.split(",") if m.strip()]
    if not model_list or len(set(model_list)) != len(model_list) or not all(_model_name(m) for m in model_list):
        raise ConfigError(
            f"--models {printable(models[:200])!r} must name one or more distinct checkpoints",
            found=printable(models[:300]),
            required="one or more distinct aliases, repo ids or folders, each one word without control characters "
            f"of at most {MAX_MODEL_NAME_CHARS} characters (each names its raw/ files); e.g. qat,bf16",
            fix="--models qat,bf16 (a checkpoint in a deep folder: a shorter path, or a symlink to it)",
        )
    ceilings: dict[str, float] = {}
    for key, value in _pairs(ceiling, "--ceiling", model_list).items():
        try:
            ceilings[key] = parse_float(value, 0.0, 1e9, lo_open=True)
        except Untrusted as exc:
            raise ConfigError(
                f"--ceiling {key}={value[:40]!r} {exc.reason}",
                found=value[:200],
                required="tok/s, a finite number above 0",
                fix=f"--ceiling {key}=60.3",
            ) from None
    given_vllm, vllm = vllm, vllm if vllm is not None else "vllm"
    try:
        vllm_command = shlex.split(vllm)
    except ValueError as exc:
        vllm_command = []
        reason = str(exc)
    else:
        reason = "it names no command"
    if not vllm_command:
        raise ConfigError(
            f"--vllm {vllm[:200]!r} is not a shell-quoted command: {reason}",
            found=vllm[:200],
            required="a command, shell-quoted, e.g. vllm or '/opt/venv/bin/python -m vllm.entrypoints.cli.main'",
            fix="--vllm vllm",
        )
    if given_vllm is not None and client_kind != "per-run":
        raise ConfigError(
            "--vllm names a command for --client per-run; the default client runs vLLM in this Python",
            found=f"--vllm {vllm[:200]!r} with --client {client_kind}",
            required="--client per-run beside --vllm, or no --vllm",
            fix=f"--client per-run --vllm {shlex.quote(vllm[:200])}",
        )
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    parsed_inputs = grid.parse_int_list(inputs, "--inputs")
    concurrencies = grid.parse_int_list(concurrency, "--concurrency", grid.MAX_CONCURRENCY)
    grid.validate(parsed_inputs, concurrencies, repeats)
    base_urls = {key: _checked_url(key, url) for key, url in _pairs(base_url, "--base-url", model_list).items()}
    for flag, pairs in (("--base-url", base_urls), ("--ceiling", ceilings)):
        stray = [key for key in pairs if key not in model_list]
        if stray:
            raise ConfigError(
                f"{flag} names a model not in --models: {printable(stray[0][:80])}",
                found=f"{flag} for {', '.join(printable(k[:80]) for k in pairs)}; --models {', '.join(model_list)}",
                required=f"{flag} MODEL=VALUE for models of --models only",
                fix=f"add {printable(stray[0][:80])} to --models, or drop it from {flag}",
            )
    tokenizers = _pairs(tokenizer, "--tokenizer", model_list, lone_for_all=True)
    # Last, once every option is known good: a usage error leaves no folder behind.
    folder = output or Path(f"bench-{stamp}")
    created = not folder.exists()
    opts = BenchOptions(
        models=model_list,
        inputs=parsed_inputs,
        concurrencies=concurrencies,
        repeats=repeats,
        output_len=output_len,
        output=_output_folder(folder),
        num_prompts=num_prompts,
        waves=waves,
        base_urls=base_urls,
        tokenizers=tokenizers,
        ceilings=ceilings,
        vllm=vllm,
        client=client_kind,
        num_warmups=num_warmups,
        warmup_run=warmup_run,
        ready_timeout_s=ready_timeout,
        cell_timeout_s=cell_timeout,
        slo_ttft_ms=slo_ttft_ms,
        slo_tpot_ms=slo_tpot_ms,
    )
    from t4serve.bench.runner import Interrupted

    try:
        runs_file = run_bench(opts)
    except ConfigError:
        # A setting found wrong before the first run (a --base-url for no model, an unusable key): nothing was
        # measured, so the folder this run made goes again (one holding results never does).
        _remove_if_empty(opts.output, created=created)
        raise
    except Interrupted as exc:
        click.echo(f"t4serve bench: {exc.why}; the {opts.output} folder holds the runs finished before it "
                   "(report.md says which)", err=True)
        ctx.exit(128 + exc.signum)
    click.echo((opts.output / "report.md").read_text(encoding="utf-8"))
    failed = sum(1 for r in runs_file.runs if r.figures is None or r.figures.completed == 0)
    if runs_file.runs and failed == len(runs_file.runs):
        first = next((r.error for r in runs_file.runs if r.error), "no run produced figures")
        raise BenchError(
            f"t4serve bench measured nothing: all {failed} runs failed",
            found=f"first failure: {first}",
            required="a server that answers and a `vllm bench serve` that writes its result, for at least one run",
            fix=f"read {opts.output / 'report.md'} and the logs in {opts.output / 'raw'}; `t4serve preflight` names "
            "most causes of a server that never became ready",
        )
    if failed:
        click.echo(f"t4serve bench: {failed} of {len(runs_file.runs)} runs failed (see report.md)", err=True)
        ctx.exit(1)


def _checked_url(model: str, url: str) -> str:
    """A --base-url value: http(s)://HOST[:PORT][/PATH], the host through the one host check and the port through
    the one integer parser; else a ConfigError (exit 2), where the sweep used to run and fail every cell (exit 6)."""
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        netloc = parts.netloc.rpartition("@")[2]
        port = netloc.rpartition("]")[2].rpartition(":")[2] if ":" in netloc.rpartition("]")[2] else None
        if parts.scheme not in ("http", "https") or not host or "@" in parts.netloc or parts.query or parts.fragment:
            raise Untrusted("must be http://HOST:PORT (no user, query or fragment)")
        check_host(host)
        if port is not None:
            parse_int(port, 1, 65535)
    except (Untrusted, ValueError) as exc:
        reason = exc.reason if isinstance(exc, Untrusted) else str(exc)
        raise ConfigError(
            f"--base-url for {printable(model[:80])}: {printable(url[:200])!r} is not a server's URL ({reason})",
            found=printable(url[:200]),
            required="http://HOST:PORT or https://HOST:PORT/PATH, the host an IP address or a name, the port in "
            "ASCII digits",
            fix="--base-url http://127.0.0.1:8000",
        ) from None
    return url


def _one_word(name: str) -> bool:
    try:
        check_text(name, "")
    except Untrusted:
        return False
    return not any(c.isspace() for c in name)


def _model_name(name: str) -> bool:
    from t4serve.bench.results import check_model_name

    try:
        check_model_name(name)
    except Untrusted:
        return False
    return True


@command.command("compare")
@click.argument("a", type=click.Path(path_type=Path, file_okay=False))
@click.argument("b", type=click.Path(path_type=Path, file_okay=False))
def compare_command(a: Path, b: Path) -> None:
    """Two result folders side by side (before A, after B): throughput, per stream, TTFT and B's change."""
    from t4serve.bench.report import compare
    from t4serve.bench.results import read_runs

    click.echo(compare(read_runs(a), read_runs(b), str(a), str(b)), nl=False)


@command.command("report")
@click.argument("folder", type=click.Path(path_type=Path, file_okay=False, exists=True))
@click.option("--slo-ttft-ms", default=None, type=FloatText(0.0, MAX_OBJECTIVE_MS, lo_open=True),
              help="Count goodput again against this TTFT objective (ms), from raw/'s per-request figures.")
@click.option("--slo-tpot-ms", default=None, type=FloatText(0.0, MAX_OBJECTIVE_MS, lo_open=True),
              help="... and this TPOT objective (ms). With either, the report is printed, the folder left as it is.")
def report_command(folder: Path, slo_ttft_ms: float | None, slo_tpot_ms: float | None) -> None:
    """Write FOLDER's report.md, runs.csv and plots again from its runs.json (or, if that is missing, from raw/).

    With --slo-ttft-ms or --slo-tpot-ms, goodput is counted again against those objectives (the other keeps the
    sweep's, or its default) and the report is printed only: the folder keeps the objectives it was run with."""
    import sys

    from t4serve.bench.report import markdown
    from t4serve.bench.results import load_runs, with_objectives
    from t4serve.bench.runner import write_folder

    runs_file = load_runs(folder)
    if slo_ttft_ms is None and slo_tpot_ms is None:
        plot_error = write_folder(folder, runs_file, sys.stderr)
        if plot_error is not None:
            raise plot_error
        click.echo((folder / "report.md").read_text(encoding="utf-8"), nl=False)
        return
    ttft = slo_ttft_ms if slo_ttft_ms is not None else runs_file.slo_ttft_ms or DEFAULT_SLO_TTFT_MS
    tpot = slo_tpot_ms if slo_tpot_ms is not None else runs_file.slo_tpot_ms or DEFAULT_SLO_TPOT_MS
    click.echo(markdown(with_objectives(folder, runs_file, ttft, tpot)))


@command.command("merge")
@click.argument("output", type=click.Path(path_type=Path))
@click.argument("sources", nargs=-1, required=True)
def merge_command(output: Path, sources: tuple[str, ...]) -> None:
    """Sweeps made one after the other (a card serves one configuration at a time) as one report in OUTPUT.

    Each SOURCE is a result folder (every model in it) or MODEL=FOLDER (that model only; MODEL,MODEL=FOLDER for
    several). A model's cell must come from one folder only. OUTPUT gets raw/, runs.json, runs.csv, report.md and
    plots, all written before it appears: an error leaves no half-merged folder."""
    import io
    import shutil
    import tempfile

    from t4serve.bench.merge import Source, merge_runs
    from t4serve.bench.results import load_runs
    from t4serve.bench.runner import write_folder

    if len(sources) < 2:
        raise ConfigError("bench merge needs two sources or more", found=" ".join(sources),
                          required="two result folders, or MODEL=FOLDER pairs",
                          fix="t4serve bench merge OUT published=DIR_A t4serve=DIR_B")
    parsed: list[Source] = []
    for raw in sources:
        folder, models = _source(raw)
        parsed.append(Source(folder, load_runs(folder), models))
    merged = merge_runs(parsed)
    existed = output.is_dir()
    _output_folder(output)  # refuses a folder holding files before anything is written
    staging = Path(tempfile.mkdtemp(prefix=f".{output.name}.merging-", dir=output.parent))
    try:
        (staging / "raw").mkdir()
        for source in parsed:
            for run in source.taken():
                if run.raw_file:
                    for name in (run.raw_file, Path(run.raw_file).with_suffix(".log").name):
                        if (source.folder / "raw" / name).is_file():
                            shutil.copy2(source.folder / "raw" / name, staging / "raw" / name)
        # No plots (matplotlib missing): the tables are written, the folder stands, the error follows.
        plot_error = write_folder(staging, merged, io.StringIO())
        output.rmdir()
        staging.rename(output)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        if not existed and output.is_dir() and not any(output.iterdir()):
            output.rmdir()
        raise
    click.echo(f"merged {len(merged.runs)} runs of {', '.join(merged.models)} into {output}", err=True)
    if plot_error is not None:
        raise plot_error
    click.echo((output / "report.md").read_text(encoding="utf-8"), nl=False)


def _source(raw: str) -> tuple[Path, tuple[str, ...] | None]:
    """FOLDER, or MODEL[,MODEL]=FOLDER: a path that is a folder wins, so a folder named with '=' still works."""
    try:
        check_path(raw, "SOURCE")
    except Untrusted as exc:
        raise ConfigError(f"bench merge: {exc.reason}", found=raw[:300], required="a result folder or MODEL=FOLDER",
                          fix="pass the --output folder of an earlier `t4serve bench` run") from None
    if Path(raw).is_dir():
        return Path(raw), None
    names, eq, folder = raw.partition("=")
    models = tuple(m.strip() for m in names.split(",") if m.strip())
    if eq and models and all(_one_word(m) for m in models) and Path(folder).is_dir():
        return Path(folder), models
    raise ConfigError(
        f"bench merge: {raw!r} is neither a result folder nor MODEL=FOLDER with an existing folder",
        found=raw[:300], required="a folder written by `t4serve bench --output DIR`, or MODEL=FOLDER",
        fix="check the path; `ls` it to see runs.json and raw/",
    )


# ----- a sweep in the background (the MCP tools' run_benchmark): t4serve.bench.jobs, answers in t4serve.contract


@command.command("start")
@click.option("--json", "as_json", is_flag=True, help="Print the answer as JSON (the host/container contract).")
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def start_command(as_json: bool, args: tuple[str, ...]) -> None:
    """Start the sweep in the background (ARGS: its options, after --) in T4SERVE_CACHE_DIR/bench/RUN_ID; print its
    run id. One at a time; `bench status RUN_ID` follows it."""
    import os

    from t4serve.bench import jobs
    from t4serve.contract import answering, emit

    with answering(as_json):
        _check_sweep_args(args)
        answer = jobs.start(jobs.jobs_root(os.environ), args, os.environ)
    if as_json:
        emit(answer)
    else:
        click.echo(jobs.describe(answer.run))


@command.command("status")
@click.option("--json", "as_json", is_flag=True, help="Print the answer as JSON (the host/container contract).")
@click.argument("run_id", required=False)
def status_command(as_json: bool, run_id: str | None) -> None:
    """The benchmarks `bench start` began (runs done and planned, state); with RUN_ID, that one's log tail, and once
    ended its report and figures per cell."""
    import os

    from t4serve.bench import jobs
    from t4serve.contract import BenchRunsAnswer, answering, emit

    with answering(as_json):
        root = jobs.jobs_root(os.environ)
        answer = jobs.list_runs(root) if run_id is None else jobs.result(root, run_id)
    if as_json:
        emit(answer)
    elif isinstance(answer, BenchRunsAnswer):
        click.echo("\n".join(jobs.describe(run) for run in answer.runs) or f"no benchmarks in {answer.root}")
    else:
        click.echo(jobs.describe(answer.run))
        click.echo(answer.report_md or answer.log_tail, nl=False)


@command.command("job", hidden=True)
@click.argument("folder", type=click.Path(path_type=Path, file_okay=False, exists=True))
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
@click.pass_context
def job_command(ctx: click.Context, folder: Path, args: tuple[str, ...]) -> None:
    """Internal: `bench start`'s watcher; runs the sweep into FOLDER/result and writes its exit code."""
    from t4serve.bench.jobs import run_job

    ctx.exit(run_job(folder, args))


def _check_sweep_args(args: tuple[str, ...]) -> None:
    """The sweep's options, parsed as `t4serve bench` parses them, before anything starts: a bad one is exit 2 now,
    not a failed job later. --output is the job's own, and no subcommand or argument may follow."""
    shown = printable(" ".join(args))[:300]
    refused = next((a for a in args if a.split("=", 1)[0] in ("--output", "--help", "-h")), None)
    try:
        ctx = command.make_context("bench", list(args), resilient_parsing=False) if refused is None else None
    except click.ClickException as exc:
        raise ConfigError(f"bench start: {exc.format_message()}", found=shown,
                          required="the options of `t4serve bench` (`t4serve bench --help`)",
                          fix="correct the option named above") from None  # fmt: skip
    extra = [*ctx.protected_args, *ctx.args] if ctx is not None else []
    if refused is not None or extra:
        raise ConfigError(
            f"bench start: {refused or extra[0]} cannot be given to a background sweep",
            found=shown,
            required="the sweep's options only; the job chooses its --output folder",
            fix=f"leave {refused or extra[0]} out",
        )
