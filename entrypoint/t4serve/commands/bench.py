"""`t4serve bench`: run the T4 sweep with vLLM's `vllm bench serve` and write tables, plots and raw JSON;
`t4serve bench compare A B`: two result folders side by side. Output is a folder; progress goes to stderr.
"""

from __future__ import annotations

from pathlib import Path

import click

from t4serve.errors import ConfigError


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
@click.option("--repeats", default=3, show_default=True, help="Runs per cell; the seed changes per repeat.")
@click.option("--output-len", default=128, show_default=True, help="Generated tokens per request (--ignore-eos).")
@click.option("--num-prompts", type=int, default=None, help="Requests per cell [default: max(4 x concurrency, 8)].")
@click.option("--num-warmups", default=2, show_default=True, help="Warm-up requests before each run.")
@click.option(
    "--base-url",
    default=None,
    help="Benchmark running servers instead of starting them: URL (one model) or MODEL=URL,MODEL=URL.",
)
@click.option("--tokenizer", default=None, help="Tokenizer: PATH (for every model) or MODEL=PATH,...")
@click.option("--ceiling", default=None, help="Decode ceiling tok/s per stream: MODEL=N,... [default: roofline].")
@click.option("--output", type=click.Path(path_type=Path), default=None, help="Result folder [default: bench-DATE].")
@click.option("--vllm", default="vllm", show_default=True, help="The vLLM command whose `bench serve` runs.")
@click.option("--ready-timeout", default=1800.0, show_default=True, help="Seconds a started server may take to load.")
@click.option("--cell-timeout", default=3600.0, show_default=True, help="Seconds one run may take before it fails.")
@click.pass_context
def command(
    ctx: click.Context,
    models: str,
    inputs: str,
    concurrency: str,
    repeats: int,
    output_len: int,
    num_prompts: int | None,
    num_warmups: int,
    base_url: str | None,
    tokenizer: str | None,
    ceiling: str | None,
    output: Path | None,
    vllm: str,
    ready_timeout: float,
    cell_timeout: float,
) -> None:
    """Run the published T4 sweep: per model, input length, concurrency and repeat, `vllm bench serve`.

    Writes OUTPUT/raw/*.json (vLLM's own results), runs.csv, runs.json, report.md and PNG plots.
    """
    if ctx.invoked_subcommand is not None:
        return
    import datetime

    from t4serve.bench import grid
    from t4serve.bench.runner import BenchOptions, run_bench

    model_list = [m.strip() for m in models.split(",") if m.strip()]
    if not model_list or len(set(model_list)) != len(model_list):
        raise ConfigError(
            f"--models {models!r} must name one or more distinct checkpoints",
            found=models,
            required="e.g. qat,bf16",
            fix="--models qat,bf16",
        )
    ceilings: dict[str, float] = {}
    for key, value in _pairs(ceiling, "--ceiling", model_list).items():
        try:
            ceilings[key] = float(value)
        except ValueError:
            raise ConfigError(
                f"--ceiling {key}={value!r} is not a number", found=value, required="tok/s", fix=f"--ceiling {key}=60.3"
            ) from None
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    opts = BenchOptions(
        models=model_list,
        inputs=grid.parse_int_list(inputs, "--inputs"),
        concurrencies=grid.parse_int_list(concurrency, "--concurrency"),
        repeats=repeats,
        output_len=output_len,
        output=output or Path(f"bench-{stamp}"),
        num_prompts=num_prompts,
        base_urls=_pairs(base_url, "--base-url", model_list),
        tokenizers=_pairs(tokenizer, "--tokenizer", model_list, lone_for_all=True),
        ceilings=ceilings,
        vllm=vllm,
        num_warmups=num_warmups,
        ready_timeout_s=ready_timeout,
        cell_timeout_s=cell_timeout,
    )
    runs_file = run_bench(opts)
    click.echo((opts.output / "report.md").read_text(encoding="utf-8"))
    failed = sum(1 for r in runs_file.runs if r.figures is None or r.figures.completed == 0)
    if failed:
        click.echo(f"t4serve bench: {failed} of {len(runs_file.runs)} runs failed (see report.md)", err=True)
        ctx.exit(1)


@command.command("compare")
@click.argument("a", type=click.Path(path_type=Path, file_okay=False))
@click.argument("b", type=click.Path(path_type=Path, file_okay=False))
def compare_command(a: Path, b: Path) -> None:
    """Two result folders side by side (before A, after B): throughput, per stream, TTFT and B's change."""
    from t4serve.bench.report import compare
    from t4serve.bench.results import read_runs

    click.echo(compare(read_runs(a), read_runs(b), str(a), str(b)), nl=False)
