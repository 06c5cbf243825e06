"""The markdown report, CSV and compare table, on runs whose figures are computed by hand."""

from __future__ import annotations

import csv
import io

from test_bench_results import figures, hand_runs, run

from t4serve.bench.report import CSV_COLUMNS, compare, markdown, runs_csv
from t4serve.bench.results import Run, RunsFile, Telemetry, summarize


def runs_file(runs: list[Run], ceilings: dict[str, float | None] | None = None) -> RunsFile:
    return RunsFile(1, ["qat", "bf16"], [512], [4], 3, 128, "2026-12-01T00:00:00+00:00", runs, ceilings or {})


def table_row(text: str, first_cell: str) -> list[str]:
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells[0] == first_cell:
            return cells
    raise AssertionError(f"no row {first_cell!r} in:\n{text}")


def test_markdown_row_has_throughput_tpot_ttft_variation_and_the_ratios_pair_by_pair() -> None:
    text = markdown(runs_file(hand_runs()))
    assert "## input 512 tokens" in text
    header = table_row(text, "c")
    assert header[1:5] == ["qat tok/s", "qat TPOT ms", "bf16 tok/s", "bf16 TPOT ms"]  # TPOT beside throughput
    row = dict(zip(header, table_row(text, "4"), strict=True))
    assert row["qat tok/s"] == "100.00 [90 - 110]"  # median [lowest - highest] over the repeats
    assert row["bf16 tok/s"] == "52.50 [50 - 55]"
    assert row["qat TPOT ms"] == "20.00"  # median of 20, 25, 18
    assert row["bf16 TPOT ms"] == "35.00"  # median of 40, 30
    assert row["qat TTFT ms"] == "300"
    assert row["bf16 TTFT ms"] == "410"
    assert row["variation %"] == "20.0"
    assert row["winner"] == "qat"
    # Pair by pair (bf16's repeat 3 failed, so two pairs): 100 / 50 and 110 / 55, both 2.00, where the medians'
    # ratio would say 100 / 52.5 = 1.90. TPOT: 20 / 40 = 0.50 and 25 / 30 = 0.83, median 0.67.
    assert row["ratio"] == "2.00x [2.00 - 2.00] (2 pairs)"
    assert row["TPOT ratio"] == "0.67x [0.50 - 0.83] (2 pairs)"
    assert row["decided"] == "yes"  # qat ahead in every pair
    assert row["failed requests"] == "2"
    assert "- bf16, input 512, c=4: 1 repeat(s) failed" in text
    assert "Partial" not in text and "Runs made sequentially" in text  # a schema-1 file: no order recorded


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


def test_the_winner_is_the_model_ahead_pair_by_pair_and_a_lone_model_has_no_ratio() -> None:
    import dataclasses

    from t4serve.bench.pairs import verdict

    v = verdict(hand_runs(), ["qat", "bf16"], 512, 4)
    assert v is not None and (v.winner, v.runner_up, v.throughput.median, v.throughput.pairs) == ("qat", "bf16", 2.0, 2)
    assert verdict([r for r in hand_runs() if r.model == "qat"], ["qat", "bf16"], 512, 4) is None
    # No repeat measured by both: no pair, no ratio (the lone model with figures is still named the winner).
    apart = [dataclasses.replace(r, repeat=r.repeat + 3) if r.model == "bf16" else r for r in hand_runs()]
    assert verdict(apart, ["qat", "bf16"], 512, 4) is None
    row = dict(zip(table_row(markdown(runs_file(apart)), "c"), table_row(markdown(runs_file(apart)), "4"),
                   strict=True))
    assert (row["winner"], row["ratio"], row["decided"]) == ("-", "-", "-")


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
    # Pair by pair: 120 over 100, 110 and 90 (+20.0, +9.1, +33.3 %); TPOT 16 over 20, 25, 18; TTFT 240 over 300,
    # 310, 290.
    assert ("| qat | 512 | 4 | 100.00 | 120.00 | +20.0 % [+9.1 - +33.3] | 20.00 | 16.00 | -20.0 % [-36.0 - -11.1] | "
            "300 | 240 | -20.0 % [-22.6 - -17.2] |") in text
    assert "| bf16 | 512 | 4 | 52.50 | FAILED | - |" in text


def test_spread_goodput_and_the_decision_when_pairs_disagree() -> None:
    import dataclasses

    from t4serve.bench.pairs import PairRatio

    runs = [dataclasses.replace(r, figures=dataclasses.replace(r.figures, request_throughput=4.0,
                                                                request_goodput=3.0 if r.model == "qat" else 1.0))
            if r.figures else r for r in hand_runs()]
    rf = dataclasses.replace(runs_file(runs), slo_ttft_ms=2000.0, slo_tpot_ms=100.0)
    text = markdown(rf)
    assert "TTFT was within 2000 ms and TPOT within 100 ms" in text
    row = dict(zip(table_row(text, "c"), table_row(text, "4"), strict=True))
    assert row["qat goodput req/s"] == "3.00 (75 %)"
    assert row["bf16 goodput req/s"] == "1.00 (25 %)"
    qat, _ = summarize(runs)
    assert (qat.throughput_min, qat.throughput_max, qat.ttft_min_ms, qat.ttft_max_ms) == (90.0, 110.0, 290.0, 310.0)
    # Pairs on both sides of 1 are no decision; a single pair cannot decide either; all below 1 decide too.
    assert PairRatio(1.1, 0.9, 1.3, 3).decided == "no"
    assert PairRatio(1.1, 1.0, 1.3, 3).decided == "no"
    assert PairRatio(2.0, 2.0, 2.0, 1).decided == "-"
    assert PairRatio(0.8, 0.7, 0.9, 2).decided == "yes"
    # One pair where bf16 is ahead: the cell is within the spread.
    flipped = [dataclasses.replace(r, figures=dataclasses.replace(r.figures, output_throughput=120.0))
               if r.model == "bf16" and r.repeat == 2 and r.figures else r for r in hand_runs()]
    row = dict(zip(table_row(markdown(runs_file(flipped)), "c"), table_row(markdown(runs_file(flipped)), "4"),
                   strict=True))
    assert row["ratio"] == "1.46x [0.92 - 2.00] (2 pairs)" and row["decided"] == "no"


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


def test_an_incomplete_sweeps_report_says_which_cells_are_complete() -> None:
    import dataclasses

    complete = [r if r.figures else run("bf16", 3, figures(60.0, 35.0, 400.0)) for r in hand_runs()]
    partly = [run("qat", 1, figures(150.0, 30.0, 300.0), c=8), run("bf16", 1, figures(70.0, 50.0, 500.0), c=8),
              run("qat", 2, figures(150.0, 30.0, 300.0), c=8)]  # the hold ended before bf16's repeat 2
    rf = dataclasses.replace(runs_file(complete + partly), concurrencies=[4, 8, 16], planned_runs=18,
                             interrupted="stopped by SIGTERM", order="interleaved")
    text = markdown(rf)
    assert "**Partial**: 9 of 18 runs finished (stopped by SIGTERM)" in text
    assert "Complete cells (every model measured every repeat): 512/c4." in text
    assert "Incomplete: 512/c8 (1 of 3 pairs). Without a complete pair: 512/c16." in text
    assert "Runs made interleaved: per cell and repeat" in text
    row = dict(zip(table_row(text, "c"), table_row(text, "8"), strict=True))
    assert row["ratio"] == "2.14x (1 pair)" and row["decided"] == "-"
    assert table_row(text, "16")[1] == "not run"
