"""The result folder's tables: a CSV of every run, the markdown report per input length, and `compare A B`.

Pure: from a `RunsFile` to text. Per cell: throughput per model, per stream (1000 / median TPOT), TTFT, run-to-run
variation, the winner and its throughput ratio over the runner-up, and the fraction of the roofline ceiling.
A failed cell stays in its row as FAILED with its error below the table; failed requests are counted in a column.
"""

from __future__ import annotations

import csv
import io
import statistics

from t4serve.bench.results import SERVER_FIGURES, CellSummary, Run, RunsFile, ServerSide, summarize

CSV_COLUMNS = (
    "model",
    "input_len",
    "concurrency",
    "repeat",
    "seed",
    "num_prompts",
    "completed",
    "failed",
    "output_throughput",
    "median_tpot_ms",
    "per_stream",
    "median_ttft_ms",
    "request_throughput",
    "request_goodput",
    "power_w_mean",
    "sm_clock_mhz_mean",
    "throttle_reasons",
    *(f"server_{name}" for name in SERVER_FIGURES),
    "raw_file",
    "error",
)


def runs_csv(runs: list[Run]) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    for r in runs:
        f, t, s = r.figures, r.telemetry, r.server
        writer.writerow(
            [
                r.model,
                r.input_len,
                r.concurrency,
                r.repeat,
                r.seed,
                r.num_prompts,
                f.completed if f else "",
                f.failed if f else "",
                _num(f.output_throughput) if f else "",
                _num(f.median_tpot_ms) if f else "",
                _num(1000 / f.median_tpot_ms) if f and f.median_tpot_ms > 0 else "",
                _num(f.median_ttft_ms) if f else "",
                _opt(f.request_throughput if f else None),
                _opt(f.request_goodput if f else None),
                _num(t.power_w_mean) if t and t.power_w_mean is not None else "",
                _num(t.sm_clock_mhz_mean) if t and t.sm_clock_mhz_mean is not None else "",
                ";".join(t.throttle_reasons) if t else "",
                *(_opt(getattr(s, name) if s else None) for name in SERVER_FIGURES),
                r.raw_file or "",
                r.error or "",
            ]
        )
    return out.getvalue()


def md(text: str) -> str:
    """Text as one cell of a markdown table: `|` escaped, line breaks as spaces (results.check_runs_file refuses
    control characters in model names; this keeps any other text from splitting a row)."""
    return text.replace("\\", "\\\\").replace("|", "\\|").replace("\r", " ").replace("\n", " ")


def _num(value: float) -> str:
    return f"{value:.4f}"


def _opt(value: float | None) -> str:
    return "" if value is None else _num(value)


def _fmt(value: float | None, digits: int = 2) -> str:
    if value is None:
        return "-"
    return f"{value:,.{digits}f}"


def markdown(runs_file: RunsFile, plots: list[str] | None = None) -> str:
    summaries = summarize(runs_file.runs)
    by_key = {(s.model, s.input_len, s.concurrency): s for s in summaries}
    models = runs_file.models
    lines = [
        "# t4serve bench",
        "",
        f"Started {runs_file.started}. Models: {', '.join(models)}; output {runs_file.output_len} tokens "
        f"(`--ignore-eos`, temperature 0); {runs_file.repeats} repeat(s) per cell; seed = input x 10000 + c x 100 "
        "+ repeat, the same for every model. Throughput: median over repeats of output tok/s, [lowest - highest] "
        "beside it. Per stream: 1000 / median TPOT ms. TTFT: median. Variation: (max - min) / median throughput over "
        "repeats. Decided: the winner's lowest repeat beats the runner-up's highest (else the cell is within the "
        "spread).",
        "",
    ]
    if runs_file.slo_ttft_ms is not None and runs_file.slo_tpot_ms is not None:
        lines += [f"Goodput: requests per second whose TTFT was within {runs_file.slo_ttft_ms:g} ms and TPOT within "
                  f"{runs_file.slo_tpot_ms:g} ms (vLLM's count, or `bench report --slo-*` counting again from raw/ the "
                  "same way), median over repeats, with the share of requests that met both.", ""]
    if runs_file.partial:
        why = f" ({runs_file.interrupted})" if runs_file.interrupted else ""
        lines += [f"**Partial**: {len(runs_file.runs)} of {runs_file.planned_runs} runs finished{why}; "
                  "cells without a run say \"not run\".", ""]
    failed_cells: list[CellSummary] = []
    for input_len in runs_file.inputs:
        lines += [f"## input {input_len} tokens", ""]
        header = ["c"]
        header += [f"{md(m)} tok/s" for m in models]
        header += [f"{md(m)} per stream" for m in models]
        header += [f"{md(m)} TTFT ms" for m in models]
        header += [f"{md(m)} goodput req/s" for m in models]
        header += ["variation %", "winner", "ratio", "decided", "failed requests"]
        lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        for c in runs_file.concurrencies:
            cell = [by_key.get((m, input_len, c)) for m in models]
            row = [str(c)]
            row += ["not run" if s is None else "FAILED" if s.failed else _throughput(s) for s in cell]
            row += [_fmt(s.per_stream) if s else "-" for s in cell]
            row += [_fmt(s.ttft_ms, 0) if s else "-" for s in cell]
            row += [_goodput(s) for s in cell]
            variations = [s.variation_pct for s in cell if s and s.variation_pct is not None]
            row.append(_fmt(max(variations), 1) if variations else "-")
            present = [s for s in cell if s is not None]
            winner, ratio = winner_and_ratio(present)
            row += [md(winner), ratio, decided(present)]
            row.append(str(sum(s.failed_requests for s in cell if s)))
            lines.append("| " + " | ".join(row) + " |")
            failed_cells += [s for s in cell if s is not None and (s.failed or s.errors)]
        lines.append("")
    lines += roofline_section(runs_file, summaries)
    if failed_cells:
        lines += ["## failures", ""]
        for s in failed_cells:
            state = "FAILED (no repeat succeeded)" if s.failed else f"{s.repeats_failed} repeat(s) failed"
            lines.append(f"- {s.model}, input {s.input_len}, c={s.concurrency}: {state}")
            lines += [f"  - {e}" for e in s.errors]
        lines.append("")
    lines += server_section(runs_file)
    lines += telemetry_section(runs_file)
    if runs_file.notes:
        lines += ["## notes", ""] + [f"- {n}" for n in runs_file.notes] + [""]
    if plots:
        lines += ["## plots", ""] + [f"![{p}]({p})" for p in plots] + [""]
    return "\n".join(lines)


def _throughput(s: CellSummary) -> str:
    if s.repeats_ok > 1 and s.throughput_min is not None and s.throughput_max is not None:
        return f"{_fmt(s.throughput)} [{_fmt(s.throughput_min, 0)} - {_fmt(s.throughput_max, 0)}]"
    return _fmt(s.throughput)


def _goodput(s: CellSummary | None) -> str:
    if s is None or s.goodput is None:
        return "-"
    share = f" ({s.good_pct:.0f} %)" if s.good_pct is not None else ""
    return f"{s.goodput:.2f}{share}"


def winner_and_ratio(cell: list[CellSummary]) -> tuple[str, str]:
    """The model with the highest throughput and its throughput over the runner-up's (ratio "-" with no runner-up:
    a single model, or the others failed)."""
    ranked = sorted((s for s in cell if s.throughput), key=lambda s: s.throughput or 0.0, reverse=True)
    if not ranked:
        return "-", "-"
    if len(ranked) == 1 or not ranked[1].throughput:
        return ranked[0].model, "-"
    return ranked[0].model, f"{(ranked[0].throughput or 0.0) / ranked[1].throughput:.2f}x"


def decided(cell: list[CellSummary]) -> str:
    """Whether the cell's winner won beyond the spread: its lowest repeat above the runner-up's highest. "yes", "no"
    (the ranges overlap: within the spread), or "-" (one model, or fewer than two repeats on a side to judge by)."""
    ranked = sorted((s for s in cell if s.throughput), key=lambda s: s.throughput or 0.0, reverse=True)
    if len(ranked) < 2 or ranked[0].repeats_ok < 2 or ranked[1].repeats_ok < 2:
        return "-"
    low, high = ranked[0].throughput_min, ranked[1].throughput_max
    if low is None or high is None:
        return "-"
    return "yes" if low > high else "no"


def roofline_section(runs_file: RunsFile, summaries: list[CellSummary]) -> list[str]:
    ceilings = {m: c for m, c in runs_file.ceilings.items() if c}
    lines = ["## roofline", ""]
    if not ceilings:
        return [*lines, "No decode ceiling known for these models (pass --ceiling MODEL=TOK_S).", ""]
    lines += [
        "Per-stream rate as a fraction of the bandwidth ceiling (bytes read per decode token / streaming bandwidth).",
        "",
        "| model | ceiling tok/s | input | c | per stream | fraction |",
        "|---|---|---|---|---|---|",
    ]
    for s in summaries:
        ceiling = ceilings.get(s.model)
        if ceiling is None or s.per_stream is None:
            continue
        lines.append(
            f"| {md(s.model)} | {ceiling:.1f} | {s.input_len} | {s.concurrency} | {s.per_stream:.2f} | "
            f"{s.per_stream / ceiling * 100:.1f} % |"
        )
    return [*lines, ""]


def server_section(runs_file: RunsFile) -> list[str]:
    """vLLM's own /metrics per cell (t4serve.bench.serverside), medians over repeats: what explains a cell."""
    rows: dict[tuple[str, int, int], list[ServerSide]] = {}
    for r in runs_file.runs:
        if r.server is not None and r.server.samples:
            rows.setdefault((r.model, r.input_len, r.concurrency), []).append(r.server)
    if not rows:
        return []
    lines = [
        "## server side (vLLM's /metrics)",
        "",
        "Medians over repeats. Running: requests in the batch (mean while the server had work, and the most); "
        "waiting: the most queued at once; KV: the highest cache use; steps: engine steps, with the tokens each "
        "carried; queue, prefill and decode: per request, mean. The window includes the client's test prompt and "
        "warm-ups.",
        "",
        "| model | input | c | running mean / max | waiting max | KV max % | preemptions | steps | tokens/step | "
        "queue ms | prefill ms | decode ms |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for (model, input_len, c), found in rows.items():

        def med(name: str, digits: int = 1, found: list[ServerSide] = found) -> str:
            values = [v for v in (getattr(s, name) for s in found) if v is not None]
            return _fmt(statistics.median(values), digits) if values else "-"

        lines.append(
            f"| {md(model)} | {input_len} | {c} | {med('running_mean')} / {med('running_max', 0)} | "
            f"{med('waiting_max', 0)} | {med('kv_usage_max_pct')} | {med('preemptions', 0)} | {med('steps', 0)} | "
            f"{med('tokens_per_step')} | {med('queue_ms_mean')} | {med('prefill_ms_mean')} | {med('decode_ms_mean')} |"
        )
    return [*lines, ""]


def telemetry_section(runs_file: RunsFile) -> list[str]:
    runs = [r for r in runs_file.runs if r.telemetry is not None]
    if not runs:
        return []
    errors = {r.telemetry.error for r in runs if r.telemetry and r.telemetry.error}
    sampled = [r for r in runs if r.telemetry and r.telemetry.samples]
    lines = ["## GPU telemetry", ""]
    if errors and not sampled:
        return [*lines, f"Not sampled: {'; '.join(sorted(errors))}", ""]
    lines += ["| model | input | c | repeat | power W | SM MHz | throttle reasons |", "|---|---|---|---|---|---|---|"]
    for r in sampled:
        t = r.telemetry
        assert t is not None
        power = f"{_fmt(t.power_w_mean, 1)} / {_fmt(t.power_limit_w, 0)}"
        clock = f"{_fmt(t.sm_clock_mhz_mean, 0)} / {_fmt(t.sm_clock_max_mhz, 0)}"
        reasons = md(", ".join(t.throttle_reasons)) or "none"
        cells = [md(r.model), str(r.input_len), str(r.concurrency), str(r.repeat), power, clock, reasons]
        lines.append("| " + " | ".join(cells) + " |")
    return [*lines, ""]


def compare(a: RunsFile, b: RunsFile, name_a: str = "A", name_b: str = "B") -> str:
    """Two result folders side by side: throughput, per stream and TTFT per (model, input, c), B's change over A."""
    sa = {(s.model, s.input_len, s.concurrency): s for s in summarize(a.runs)}
    sb = {(s.model, s.input_len, s.concurrency): s for s in summarize(b.runs)}
    keys = list(sa) + [k for k in sb if k not in sa]
    lines = [
        f"# t4serve bench compare: A = {name_a}, B = {name_b}",
        "",
        "| model | input | c | A tok/s | B tok/s | change | A per stream | B per stream | change | A TTFT ms | "
        "B TTFT ms | change |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for key in keys:
        x, y = sa.get(key), sb.get(key)
        row = [md(key[0]), str(key[1]), str(key[2])]
        for attr, digits in (("throughput", 2), ("per_stream", 2), ("ttft_ms", 0)):
            va = _value(x, attr)
            vb = _value(y, attr)
            row += [_cell(x, va, digits), _cell(y, vb, digits), _change(va, vb)]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


def _value(s: CellSummary | None, attr: str) -> float | None:
    if s is None or s.failed:
        return None
    value = getattr(s, attr)
    return float(value) if value is not None else None


def _cell(s: CellSummary | None, value: float | None, digits: int) -> str:
    if s is None:
        return "absent"
    if s.failed:
        return "FAILED"
    return _fmt(value, digits)


def _change(a: float | None, b: float | None) -> str:
    if a is None or b is None or a == 0:
        return "-"
    return f"{(b - a) / a * 100:+.1f} %"
