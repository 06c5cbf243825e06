"""The result folder's tables: a CSV of every run, the markdown report per input length, and `compare A B`.

Pure: from a `RunsFile` to text. Per cell: throughput and TPOT per model, TTFT, goodput, run-to-run variation, the
winner and its ratios over the runner-up pair by pair (t4serve.bench.pairs), and the fraction of the roofline
ceiling. A failed cell stays in its row as FAILED with its error below the table; failed requests are counted in a
column. A partial sweep's report says which cells are complete.
"""

from __future__ import annotations

import csv
import io
import statistics

from t4serve.bench import pairs
from t4serve.bench.results import SERVER_FIGURES, CellSummary, Run, RunsFile, ServerSide, summarize
from t4serve.bench.timing import describe, split

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
    "started",
    "ended",
    "client_wall_s",
    "client_start_s",
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
                r.timing.started if r.timing else "",
                r.timing.ended if r.timing else "",
                _num(r.timing.wall_s) if r.timing else "",
                _opt(r.timing.client_start_s if r.timing else None),
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


ORDERS = {
    "interleaved": "interleaved: per cell and repeat, each model's run back to back (a pair), the order alternating "
    "between repeats (A B, then B A)",
    "rounds": "in rounds: one server at a time, each running every cell once per repeat, the rounds' order "
    "alternating (A B, then B A)",
    "sequential": "sequentially: every run of one model before the next model's (or gathered from several sweeps)",
}


def markdown(runs_file: RunsFile, plots: list[str] | None = None) -> str:
    summaries = summarize(runs_file.runs)
    by_key = {(s.model, s.input_len, s.concurrency): s for s in summaries}
    models = runs_file.models
    lines = [
        "# t4serve bench",
        "",
        f"Started {runs_file.started}. Models: {', '.join(models)}; output {runs_file.output_len} tokens "
        f"(`--ignore-eos`, temperature 0); {runs_file.repeats} repeat(s) per cell; seed = input x 10000 + c x 100 "
        f"+ repeat, the same for every model. Runs made {ORDERS.get(runs_file.order, runs_file.order)}. "
        "Throughput: median over repeats of output tok/s, [lowest - highest] beside it. TPOT: median over repeats "
        "of the run's median time per output token, the time each stream waits per token (per stream: 1000 / TPOT "
        "tok/s). TTFT: median. Variation: (max - min) / median throughput over repeats. Ratio: the winner's "
        "throughput over the runner-up's pair by pair (a pair: one repeat, same prompts, both models), the median "
        "of the pairs [lowest - highest]; TPOT ratio the same for TPOT (above 1: each of the winner's streams is "
        "slower by that much). Decided: every pair puts the winner ahead (beyond the spread of the pair ratios).",
        "",
    ]
    if runs_file.slo_ttft_ms is not None and runs_file.slo_tpot_ms is not None:
        lines += [f"Goodput: requests per second whose TTFT was within {runs_file.slo_ttft_ms:g} ms and TPOT within "
                  f"{runs_file.slo_tpot_ms:g} ms (vLLM's count, or `bench report --slo-*` counting again from raw/ the "
                  "same way), median over repeats, with the share of requests that met both.", ""]
    if runs_file.partial:
        why = f" ({runs_file.interrupted})" if runs_file.interrupted else ""
        lines += [f"**Partial**: {len(runs_file.runs)} of {runs_file.planned_runs} runs finished{why}; "
                  "cells without a run say \"not run\".", *pairs.completeness_lines(runs_file), ""]
    failed_cells: list[CellSummary] = []
    for input_len in runs_file.inputs:
        lines += [f"## input {input_len} tokens", ""]
        header = ["c"]
        for m in models:
            header += [f"{md(m)} tok/s", f"{md(m)} TPOT ms"]
        header += [f"{md(m)} TTFT ms" for m in models]
        header += [f"{md(m)} goodput req/s" for m in models]
        header += ["variation %", "winner", "ratio", "TPOT ratio", "decided", "failed requests"]
        lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        for c in runs_file.concurrencies:
            cell = [by_key.get((m, input_len, c)) for m in models]
            row = [str(c)]
            for s in cell:
                row.append("not run" if s is None else "FAILED" if s.failed else _throughput(s))
                row.append(_fmt(1000 / s.per_stream) if s and s.per_stream else "-")
            row += [_fmt(s.ttft_ms, 0) if s else "-" for s in cell]
            row += [_goodput(s) for s in cell]
            variations = [s.variation_pct for s in cell if s and s.variation_pct is not None]
            row.append(_fmt(max(variations), 1) if variations else "-")
            v = pairs.verdict(runs_file.runs, models, input_len, c)
            if v is None:
                row += [md(_lone_winner(cell)), "-", "-", "-"]
            else:
                row += [md(v.winner), v.throughput.text(), v.tpot.text() if v.tpot else "-", v.throughput.decided]
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
    lines += client_section(runs_file)
    if runs_file.notes:
        lines += ["## notes", ""] + [f"- {n}" for n in runs_file.notes] + [""]
    if plots:
        lines += ["## plots", ""] + [f"![{p}]({p})" for p in plots] + [""]
    return "\n".join(lines)


def _lone_winner(cell: list[CellSummary | None]) -> str:
    """With no pair to compare by: the one model that measured the cell, or "-"."""
    ok = [s for s in cell if s is not None and s.throughput]
    return ok[0].model if len(ok) == 1 else "-"


def client_section(runs_file: RunsFile) -> list[str]:
    """Where the client's time went: its start-up against each run's set-up and measured time."""
    s = split((r.timing, r.figures.duration_s if r.figures else None) for r in runs_file.runs if r.timing)
    if s is None:
        return []
    return ["## client time", "", describe(s) + ".", ""]


def _throughput(s: CellSummary) -> str:
    if s.repeats_ok > 1 and s.throughput_min is not None and s.throughput_max is not None:
        return f"{_fmt(s.throughput)} [{_fmt(s.throughput_min, 0)} - {_fmt(s.throughput_max, 0)}]"
    return _fmt(s.throughput)


def _goodput(s: CellSummary | None) -> str:
    if s is None or s.goodput is None:
        return "-"
    share = f" ({s.good_pct:.0f} %)" if s.good_pct is not None else ""
    return f"{s.goodput:.2f}{share}"


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
    """Two result folders side by side per (model, input, c): throughput, TPOT and TTFT (medians over repeats), and
    B's change over A pair by pair (repeat r of B over repeat r of A: the same prompts), median [lowest - highest]."""
    sa = {(s.model, s.input_len, s.concurrency): s for s in summarize(a.runs)}
    sb = {(s.model, s.input_len, s.concurrency): s for s in summarize(b.runs)}
    keys = list(sa) + [k for k in sb if k not in sa]
    lines = [
        f"# t4serve bench compare: A = {name_a}, B = {name_b}",
        "",
        "Values: medians over repeats. Change: B over A pair by pair (repeat r of B against repeat r of A, the same "
        "seed and so the same prompts), the median of the pairs [lowest - highest]. A drift of the host between the "
        "two sweeps is in every pair: two folders measured apart compare less surely than one interleaved sweep.",
        "",
        "| model | input | c | A tok/s | B tok/s | change | A TPOT ms | B TPOT ms | change | A TTFT ms | "
        "B TTFT ms | change |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for key in keys:
        x, y = sa.get(key), sb.get(key)
        runs_a, runs_b = pairs.measured(a.runs, *key), pairs.measured(b.runs, *key)
        row = [md(key[0]), str(key[1]), str(key[2])]
        for attr, value, digits in (("throughput", pairs.throughput, 2), ("tpot", pairs.tpot, 2),
                                    ("ttft_ms", pairs.ttft, 0)):
            ratio = pairs.pair_ratio(runs_b, runs_a, value)
            row += [_cell(x, _value(x, attr), digits), _cell(y, _value(y, attr), digits),
                    ratio.change() if ratio else "-"]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


def _value(s: CellSummary | None, attr: str) -> float | None:
    if s is None or s.failed:
        return None
    if attr == "tpot":
        return 1000 / s.per_stream if s.per_stream else None
    value = getattr(s, attr)
    return float(value) if value is not None else None


def _cell(s: CellSummary | None, value: float | None, digits: int) -> str:
    if s is None:
        return "absent"
    if s.failed:
        return "FAILED"
    return _fmt(value, digits)
