"""The markdown report, CSV and compare table, on runs whose figures are computed by hand."""

from __future__ import annotations

import csv
import io

from test_bench_results import figures, hand_runs, run

from t4serve.bench.report import CSV_COLUMNS, compare, markdown, runs_csv, winner_and_ratio
from t4serve.bench.results import Run, RunsFile, Telemetry, summarize


def runs_file(runs: list[Run], ceilings: dict[str, float | None] | None = None) -> RunsFile:
    return RunsFile(1, ["qat", "bf16"], [512], [4], 3, 128, "2026-12-01T00:00:00+00:00", runs, ceilings or {})


def table_row(text: str, first_cell: str) -> list[str]:
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells[0] == first_cell:
            return cells
    raise AssertionError(f"no row {first_cell!r} in:\n{text}")


def test_markdown_row_has_throughput_per_stream_ttft_variation_winner_ratio() -> None:
    text = markdown(runs_file(hand_runs()))
    assert "## input 512 tokens" in text
    header = table_row(text, "c")
    row = dict(zip(header, table_row(text, "4"), strict=True))
    assert row["qat tok/s"] == "100.00 [90 - 110]"  # median [lowest - highest] over the repeats
    assert row["bf16 tok/s"] == "52.50 [50 - 55]"
    assert row["qat per stream"] == "50.00"
    assert row["bf16 per stream"] == "28.57"
    assert row["qat TTFT ms"] == "300"
    assert row["bf16 TTFT ms"] == "410"
    assert row["variation %"] == "20.0"
    assert row["winner"] == "qat"
    assert row["ratio"] == "1.90x"
    assert row["decided"] == "yes"  # qat's lowest repeat (90) beats bf16's highest (55)
    assert row["failed requests"] == "2"
    assert "- bf16, input 512, c=4: 1 repeat(s) failed" in text


def test_failed_cell_is_reported_not_dropped() -> None:
    runs = [r for r in hand_runs() if r.model == "qat"]
    runs += [run("bf16", i, None, "the vLLM server exited with code 1 before it was ready") for i in (1, 2, 3)]
    text = markdown(runs_file(runs))
    header = table_row(text, "c")
    row = dict(zip(header, table_row(text, "4"), strict=True))
    assert row["bf16 tok/s"] == "FAILED"
    assert row["winner"] == "qat"
    assert row["ratio"] == "-"
    assert "- bf16, input 512, c=4: FAILED (no repeat succeeded)" in text
    assert "repeat 1: the vLLM server exited with code 1 before it was ready" in text


def test_roofline_fraction_is_per_stream_over_ceiling() -> None:
    text = markdown(runs_file(hand_runs(), {"qat": 125.0, "bf16": None}))
    assert "| qat | 125.0 | 512 | 4 | 50.00 | 40.0 % |" in text
    assert "| bf16 |" not in text.split("## roofline")[1].split("##")[0]
    assert "No decode ceiling known" in markdown(runs_file(hand_runs()))


def test_telemetry_table_and_its_absence() -> None:
    runs = hand_runs()
    t = Telemetry(3, 69.5, 70.0, 1290.0, 1590.0, ["SW power cap"])
    runs[0] = Run(**{**runs[0].__dict__, "telemetry": t})
    assert "| qat | 512 | 4 | 1 | 69.5 / 70 | 1,290 / 1,590 | SW power cap |" in markdown(runs_file(runs))
    runs[0] = Run(**{**runs[0].__dict__, "telemetry": Telemetry(0, error="NVML unavailable: no driver")})
    assert "Not sampled: NVML unavailable: no driver" in markdown(runs_file(runs))


def test_winner_needs_two_models_with_throughput() -> None:
    qat, bf16 = summarize(hand_runs())
    assert winner_and_ratio([qat, bf16]) == ("qat", "1.90x")
    assert winner_and_ratio([qat]) == ("qat", "-")


def test_csv_has_one_row_per_run_with_per_stream() -> None:
    rows = list(csv.DictReader(io.StringIO(runs_csv(hand_runs()))))
    assert list(rows[0]) == list(CSV_COLUMNS)
    assert len(rows) == 6
    assert rows[1]["per_stream"] == "40.0000"  # 1000 / 25 ms
    assert rows[1]["seed"] == "5120402"
    assert rows[5]["output_throughput"] == "" and "exited 1" in rows[5]["error"]


def test_compare_shows_both_folders_and_the_change() -> None:
    before = runs_file(hand_runs())
    after_runs = [run("qat", i, figures(120.0, 16.0, 240.0)) for i in (1, 2, 3)]
    after_runs += [run("bf16", i, None, "crashed") for i in (1, 2, 3)]
    text = compare(before, runs_file(after_runs), "old", "new")
    assert "A = old, B = new" in text
    assert "| qat | 512 | 4 | 100.00 | 120.00 | +20.0 % | 50.00 | 62.50 | +25.0 % | 300 | 240 | -20.0 % |" in text
    assert "| bf16 | 512 | 4 | 52.50 | FAILED | - |" in text


def test_spread_goodput_and_the_decision_when_ranges_overlap() -> None:
    import dataclasses

    from t4serve.bench.report import decided

    runs = [dataclasses.replace(r, figures=dataclasses.replace(r.figures, request_throughput=4.0,
                                                                request_goodput=3.0 if r.model == "qat" else 1.0))
            if r.figures else r for r in hand_runs()]
    rf = dataclasses.replace(runs_file(runs), slo_ttft_ms=2000.0, slo_tpot_ms=100.0)
    text = markdown(rf)
    assert "TTFT was within 2000 ms and TPOT within 100 ms" in text
    row = dict(zip(table_row(text, "c"), table_row(text, "4"), strict=True))
    assert row["qat goodput req/s"] == "3.00 (75 %)"
    assert row["bf16 goodput req/s"] == "1.00 (25 %)"
    qat, bf16 = summarize(runs)
    assert (qat.throughput_min, qat.throughput_max, qat.ttft_min_ms, qat.ttft_max_ms) == (90.0, 110.0, 290.0, 310.0)
    # Overlapping ranges are no decision; a single repeat on a side cannot decide either.
    close = dataclasses.replace(bf16, throughput_max=95.0)
    assert decided([qat, close]) == "no"
    assert decided([qat, dataclasses.replace(bf16, repeats_ok=1)]) == "-"
    assert decided([qat]) == "-"


def test_server_side_section_takes_medians_over_repeats() -> None:
    import dataclasses

    from t4serve.bench.results import ServerSide

    runs = hand_runs()
    sides = [ServerSide(5, running_mean=m, running_max=8, waiting_max=w, kv_usage_max_pct=40.0, preemptions=0,
                        steps=100, tokens_per_step=20.5, queue_ms_mean=q, prefill_ms_mean=30.0, decode_ms_mean=900.0)
             for m, w, q in ((7.0, 4, 10.0), (7.5, 6, 30.0), (6.0, 2, 20.0))]
    for i in range(3):
        runs[i] = dataclasses.replace(runs[i], server=sides[i])
    text = markdown(runs_file(runs))
    assert "## server side (vLLM's /metrics)" in text
    assert "| qat | 512 | 4 | 7.0 / 8 | 4 | 40.0 | 0 | 100 | 20.5 | 20.0 | 30.0 | 900.0 |" in text
    assert "| bf16 | 512 | 4 |" not in text.split("## server side")[1]
    rows = list(csv.DictReader(io.StringIO(runs_csv(runs))))
    assert rows[1]["server_waiting_max"] == "6.0000" and rows[3]["server_waiting_max"] == ""
    assert "## server side" not in markdown(runs_file(hand_runs()))
