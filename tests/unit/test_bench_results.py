"""Reading vLLM's result JSON and summarizing repeats, checked against values computed by hand."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from t4serve.bench.results import (
    Run,
    RunFigures,
    RunsFile,
    Telemetry,
    figures_from_result,
    read_runs,
    summarize,
    write_runs,
)
from t4serve.bench.timing import RunTiming
from t4serve.errors import ConfigError
from t4serve.serde import to_dict


def figures(throughput: float, tpot: float, ttft: float, completed: int = 16, failed: int = 0) -> RunFigures:
    return RunFigures(
        completed=completed,
        failed=failed,
        output_throughput=throughput,
        median_tpot_ms=tpot,
        median_ttft_ms=ttft,
        mean_ttft_ms=ttft,
        total_output_tokens=completed * 128,
        duration_s=10.0,
    )


def run(model: str, repeat: int, f: RunFigures | None, error: str | None = None, c: int = 4) -> Run:
    return Run(model, 512, c, repeat, 5_120_400 + repeat, 16, None if f is None else "x.json", f, error)


def hand_runs() -> list[Run]:
    return [
        run("qat", 1, figures(100.0, 20.0, 300.0)),
        run("qat", 2, figures(110.0, 25.0, 310.0)),
        run("qat", 3, figures(90.0, 18.0, 290.0, failed=2)),
        run("bf16", 1, figures(50.0, 40.0, 400.0)),
        run("bf16", 2, figures(55.0, 30.0, 420.0)),
        run("bf16", 3, None, "`vllm bench serve` exited 1 without a result"),
    ]


def test_summary_takes_medians_and_variation_over_repeats() -> None:
    qat, bf16 = summarize(hand_runs())
    assert (qat.model, qat.repeats_ok, qat.repeats_failed) == ("qat", 3, 0)
    assert qat.throughput == 100.0
    assert qat.per_stream == pytest.approx(1000 / 20.0)  # median TPOT of 20, 25, 18 is 20 ms
    assert qat.ttft_ms == 300.0
    assert qat.variation_pct == pytest.approx((110 - 90) / 100 * 100)
    assert qat.failed_requests == 2
    assert qat.completed == 48
    assert bf16.throughput == pytest.approx(52.5)
    assert bf16.per_stream == pytest.approx(1000 / 35.0)
    assert bf16.variation_pct == pytest.approx(5 / 52.5 * 100)
    assert (bf16.repeats_ok, bf16.repeats_failed) == (2, 1)
    assert bf16.errors == ["repeat 3: `vllm bench serve` exited 1 without a result"]
    assert not bf16.failed


def test_a_cell_with_no_successful_repeat_is_kept_and_marked_failed() -> None:
    (s,) = summarize([run("bf16", 1, None, "server gone"), run("bf16", 2, figures(0.0, 0.0, 0.0, 0, 16), "all 16")])
    assert s.failed
    assert s.throughput is None and s.per_stream is None and s.ttft_ms is None
    assert s.failed_requests == 16
    assert len(s.errors) == 2


def test_figures_from_vllm_result_json() -> None:
    data = {
        "completed": 8,
        "failed": 1,
        "output_throughput": 716.5,
        "median_tpot_ms": 2.2,
        "median_ttft_ms": 1.35,
        "mean_ttft_ms": 1.43,
        "total_output_tokens": 128,
        "duration": 0.18,
    }
    f = figures_from_result(data, "r.json")
    assert (f.completed, f.failed, f.output_throughput, f.duration_s) == (8, 1, 716.5, 0.18)
    del data["median_tpot_ms"]
    with pytest.raises(ConfigError, match=r"r\.json"):
        figures_from_result(data, "r.json")


def test_runs_file_round_trips(tmp_path: Path) -> None:
    runs = hand_runs()
    runs[0] = Run(
        **{**runs[0].__dict__, "telemetry": Telemetry(samples=3, power_w_mean=69.5, throttle_reasons=["SW power cap"])}
    )
    runs[1] = dataclasses.replace(runs[1], timing=RunTiming("2026-12-01T00:00:01.000+00:00",
                                                           "2026-12-01T00:00:09.500+00:00", 8.5, 0.0))
    original = RunsFile(2, ["qat", "bf16"], [512], [4], 3, 128, "2026-12-01T00:00:00+00:00", runs, {"qat": 150.0},
                        order="interleaved", client="sweep")
    write_runs(tmp_path, original)
    assert read_runs(tmp_path) == original


def test_a_schema_1_folder_reads_as_made_sequentially_and_other_schemas_are_refused(tmp_path: Path) -> None:
    """The records in docs/verified are schema 1: no timing, no order. They read (and `bench report` writes them
    back as schema 2); a schema this t4serve does not know is refused with its number."""
    import json

    data = to_dict(RunsFile(2, ["qat", "bf16"], [512], [4], 3, 128, "2026-12-01T00:00:00+00:00", hand_runs()))
    for key in ("order", "client"):
        del data[key]
    for run_data in data["runs"]:
        del run_data["timing"]
    (tmp_path / "runs.json").write_text(json.dumps({**data, "schema": 1}))
    old = read_runs(tmp_path)
    assert (old.schema, old.order, old.client) == (2, "sequential", None)
    assert all(r.timing is None for r in old.runs)
    (tmp_path / "runs.json").write_text(json.dumps({**data, "schema": 3}))
    with pytest.raises(ConfigError, match="of a schema this t4serve does not read"):
        read_runs(tmp_path)
    bad = {**data, "schema": 2, "order": "shuffled", "client": None}
    bad["runs"] = [{**r, "timing": None} for r in data["runs"]]
    (tmp_path / "runs.json").write_text(json.dumps(bad))
    with pytest.raises(ConfigError, match="order 'shuffled'"):
        read_runs(tmp_path)


def test_reading_a_folder_without_runs_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not a `t4serve bench` result folder"):
        read_runs(tmp_path)


def _raw(folder: Path, name: str, throughput: float, completed: int = 8) -> None:
    import json

    (folder / "raw").mkdir(parents=True, exist_ok=True)
    result = {"completed": completed, "failed": 8 - completed, "output_throughput": throughput,
              "median_tpot_ms": 3.0, "median_ttft_ms": 35.0, "mean_ttft_ms": 40.0,
              "total_output_tokens": 128 * completed, "duration": 3.4, "num_prompts": 8}
    (folder / "raw" / name).write_text(json.dumps(result))
    (folder / "raw" / name.replace(".json", ".log")).write_text("$ vllm bench serve ...\n")


def test_a_folder_without_runs_json_is_rebuilt_from_raw_and_marked_partial(tmp_path: Path) -> None:
    from t4serve.bench.results import runs_from_raw

    _raw(tmp_path, "published_in512_c1_r1.json", 301.5)
    _raw(tmp_path, "published_in4096_c1_r1.json", 217.9)
    _raw(tmp_path, "t4serve_in512_c1_r1.json", 293.9)
    (tmp_path / "raw" / "t4serve_in512_c16_r1.log").write_text("killed mid-run: a log, no result\n")
    runs_file = runs_from_raw(tmp_path)
    assert runs_file.models == ["published", "t4serve"] and runs_file.inputs == [512, 4096]
    assert runs_file.output_len == 128 and runs_file.planned_runs == 4 and runs_file.partial
    assert [(r.model, r.input_len, r.seed) for r in runs_file.runs] == [
        ("published", 512, 5_120_101), ("published", 4096, 40_960_101), ("t4serve", 512, 5_120_101)]
    assert all(r.telemetry is not None and r.telemetry.samples == 0 for r in runs_file.runs)


def test_a_folder_with_no_results_at_all_is_a_config_error(tmp_path: Path) -> None:
    from t4serve.bench.results import runs_from_raw

    (tmp_path / "raw").mkdir()
    (tmp_path / "raw" / "notes.json").write_text("{}")
    with pytest.raises(ConfigError, match=r"neither runs\.json nor raw"):
        runs_from_raw(tmp_path)


def test_bench_report_command_writes_the_report_from_raw(tmp_path: Path) -> None:
    from t4serve.cli import main

    _raw(tmp_path, "published_in512_c1_r1.json", 301.5)
    _raw(tmp_path, "t4serve_in512_c1_r1.json", 293.9)
    _raw(tmp_path, "published_in512_c4_r1.json", 1036.9)
    assert main(["bench", "report", str(tmp_path)]) == 0
    report = (tmp_path / "report.md").read_text()
    assert "**Partial**: 3 of 4 runs finished (rebuilt from raw/)" in report
    assert "| 4 | 1,036.90 | 3.00 | not run |" in report  # published's tok/s and TPOT; t4serve's
    assert "Complete cells (every model measured every repeat): 512/c1." in report
    assert "Without a complete pair: 512/c4." in report
    assert (tmp_path / "runs.json").is_file() and (tmp_path / "runs.csv").is_file()
    assert main(["bench", "report", str(tmp_path)]) == 0  # now from the runs.json it wrote: the same report
    assert (tmp_path / "report.md").read_text() == report


@pytest.mark.parametrize(
    ("content", "found"),
    [
        ('{"completed": 1e999}', "finite"),
        ("[1, 2]", "list at the top level"),
        ('{"a": ' * 40 + "1" + "}" * 40, "nest at most"),
        ('{"completed": 1, "completed": 2}', "must not repeat the key 'completed'"),
    ],
)
def test_a_hostile_result_file_is_a_config_error_not_a_traceback(tmp_path: Path, content: str, found: str) -> None:
    from t4serve.bench.results import read_result

    path = tmp_path / "qat_in32_c1_r1.json"
    path.write_text(content)
    with pytest.raises(ConfigError) as caught:
        read_result(path)
    assert found in caught.value.found


def test_raw_name_reads_back_what_raw_name_wrote() -> None:
    from t4serve.bench.grid import Cell
    from t4serve.bench.results import RAW_NAME, raw_name

    m = RAW_NAME.match(raw_name("google/gemma-4-E2B-it", Cell(4096, 16, 3)))
    assert m is not None and (m["model"], m["input"], m["c"], m["r"]) == ("google_gemma-4-E2B-it", "4096", "16", "3")


def _sweep_folder(folder: Path, model_throughputs: dict[str, list[tuple[int, int, float]]],
                  output_len: int = 128, ceiling: float | None = None) -> RunsFile:
    """A result folder as `t4serve bench` writes it: raw/ files and runs.json, for (input, c, tok/s) per model."""
    runs = []
    for model, cells in model_throughputs.items():
        for input_len, c, throughput in cells:
            name = f"{model}_in{input_len}_c{c}_r1.json"
            _raw(folder, name, throughput)
            runs.append(Run(model, input_len, c, 1, input_len * 10_000 + c * 100 + 1, 8, name,
                            figures(throughput, 3.0, 35.0, completed=8)))
    runs_file = RunsFile(1, list(model_throughputs), sorted({i for v in model_throughputs.values() for i, _, _ in v}),
                         sorted({c for v in model_throughputs.values() for _, c, _ in v}), 1, output_len,
                         "2026-12-03T16:49:33+00:00", runs, dict.fromkeys(model_throughputs, ceiling))
    write_runs(folder, runs_file)
    return runs_file


def test_merge_takes_each_model_from_its_own_sweep(tmp_path: Path) -> None:
    from t4serve.bench.merge import Source, merge_runs

    a = _sweep_folder(tmp_path / "a", {"published": [(512, 1, 301.5), (512, 16, 1783.2)],
                                       "t4serve": [(512, 1, 293.9)]})
    b = _sweep_folder(tmp_path / "b", {"t4serve": [(512, 1, 290.0), (512, 16, 2010.3)]}, ceiling=1052.7)
    merged = merge_runs([Source(tmp_path / "a", a, ("published",)), Source(tmp_path / "b", b)])
    assert merged.models == ["published", "t4serve"] and merged.concurrencies == [1, 16]
    assert [(r.model, r.concurrency, r.figures.output_throughput if r.figures else None) for r in merged.runs] == [
        ("published", 1, 301.5), ("published", 16, 1783.2), ("t4serve", 1, 290.0), ("t4serve", 16, 2010.3)]
    assert merged.planned_runs == 4 and not merged.partial
    assert merged.ceilings == {"published": None, "t4serve": 1052.7}
    assert merged.notes[0] == f"published: 2 run(s) from {tmp_path / 'a'} (started 2026-12-03T16:49:33+00:00)"


@pytest.mark.parametrize(
    ("pick_a", "output_len_b", "says"),
    [
        (None, 128, "t4serve, input 512, c=1, repeat 1 is in two folders"),
        (("bf16",), 128, "holds no runs of bf16"),
        (("published",), 256, "different output lengths"),
    ],
)
def test_merge_refuses_a_cell_twice_a_model_not_there_and_unlike_sweeps(
    tmp_path: Path, pick_a: tuple[str, ...] | None, output_len_b: int, says: str
) -> None:
    from t4serve.bench.merge import Source, merge_runs

    a = _sweep_folder(tmp_path / "a", {"published": [(512, 1, 301.5)], "t4serve": [(512, 1, 293.9)]})
    b = _sweep_folder(tmp_path / "b", {"t4serve": [(512, 1, 290.0)]}, output_len=output_len_b)
    with pytest.raises(ConfigError, match=says) as caught:
        merge_runs([Source(tmp_path / "a", a, pick_a), Source(tmp_path / "b", b)])
    assert caught.value.fix


def test_bench_merge_command_writes_one_folder_or_none(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from t4serve.cli import main

    _sweep_folder(tmp_path / "a", {"published": [(512, 8, 1899.2)], "t4serve": [(512, 8, 1936.5)]})
    _sweep_folder(tmp_path / "b", {"t4serve": [(512, 8, 1998.9)]})
    out = tmp_path / "merged"
    # Both folders hold t4serve at c=8: refused, and nothing is left behind.
    assert main(["bench", "merge", str(out), str(tmp_path / "a"), str(tmp_path / "b")]) == 2
    assert "is in two folders" in capsys.readouterr().err
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["a", "b"]
    assert main(["bench", "merge", str(out), f"published={tmp_path / 'a'}", str(tmp_path / "b")]) == 0
    report = (out / "report.md").read_text()
    assert "| 8 | 1,899.20 | 3.00 | 1,998.90 | 3.00 |" in report and "Partial" not in report
    assert sorted(p.name for p in (out / "raw").iterdir()) == [
        "published_in512_c8_r1.json", "published_in512_c8_r1.log",
        "t4serve_in512_c8_r1.json", "t4serve_in512_c8_r1.log"]
    assert read_runs(out).models == ["published", "t4serve"]
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no staging folder left
    # The merged folder is never overwritten, and sources that are not there are named.
    assert main(["bench", "merge", str(out), str(tmp_path / "a"), str(tmp_path / "b")]) == 2
    assert main(["bench", "merge", str(tmp_path / "m2"), "t4serve=" + str(tmp_path / "nope"), str(tmp_path / "b")]) == 2
    assert "neither a result folder nor MODEL=FOLDER" in capsys.readouterr().err
    assert main(["bench", "merge", str(tmp_path / "m3"), str(tmp_path / "a")]) == 2
    assert "needs two sources or more" in capsys.readouterr().err


def test_goodput_is_read_from_the_result_and_absent_without_it() -> None:
    base = {"completed": 4, "output_throughput": 10.0, "median_tpot_ms": 1.0, "median_ttft_ms": 2.0,
            "mean_ttft_ms": 2.0, "total_output_tokens": 40, "duration": 1.0}
    with_slo = figures_from_result({**base, "request_throughput": 4.0, "request_goodput": 3.5}, "x")
    assert (with_slo.request_throughput, with_slo.request_goodput) == (4.0, 3.5)
    # vLLM writes "request_goodput": null when run without --goodput.
    assert figures_from_result({**base, "request_goodput": None}, "x").request_goodput is None


def test_merge_refuses_sweeps_counted_against_different_objectives(tmp_path: Path) -> None:
    import dataclasses

    from t4serve.bench.merge import Source, merge_runs

    a = RunsFile(1, ["qat"], [512], [4], 3, 128, "s", hand_runs()[:3], slo_ttft_ms=2000.0, slo_tpot_ms=100.0)
    b = RunsFile(1, ["bf16"], [512], [4], 3, 128, "s", hand_runs()[3:], slo_ttft_ms=500.0, slo_tpot_ms=100.0)
    with pytest.raises(ConfigError, match="different objectives"):
        merge_runs([Source(tmp_path / "a", a), Source(tmp_path / "b", b)])
    older = dataclasses.replace(b, slo_ttft_ms=None, slo_tpot_ms=None)  # written before goodput was counted
    merged = merge_runs([Source(tmp_path / "a", a), Source(tmp_path / "b", older)])
    assert (merged.slo_ttft_ms, merged.slo_tpot_ms) == (2000.0, 100.0)


GPU_SWEEP = Path(__file__).resolve().parents[2] / "docs/verified/gpu-host-vllm-0.33.0/bench/sweep"


def test_goodput_counted_from_detail_equals_vllms_own_on_the_gpu_hosts_results() -> None:
    """The 24 runs of the GPU host's sweep (vLLM 0.33.0, --save-detailed, --goodput ttft:2000 tpot:100): counted again
    from the per-request figures against the same objectives, every run's goodput is vLLM's own, to the bit."""
    import json

    from t4serve.bench.results import goodput_from_detail

    raws = sorted((GPU_SWEEP / "raw").glob("*.json"))
    assert len(raws) == 24
    for path in raws:
        data = json.loads(path.read_text())
        assert goodput_from_detail(data, 2000.0, 100.0) == data["request_goodput"], path.name
    assert goodput_from_detail({"duration": 1.0}, 2000.0, 100.0) is None  # a result without --save-detailed


def test_goodput_against_other_objectives_from_the_gpu_hosts_results() -> None:
    from t4serve.bench.results import load_runs, summarize, with_objectives

    recorded = load_runs(GPU_SWEEP)
    strict = with_objectives(GPU_SWEEP, recorded, 500.0, 8.0)
    cells = {(s.model, s.input_len, s.concurrency): s for s in summarize(strict.runs)}
    # The published flags queue half of 16 streams (TTFT 1,008 ms median); t4serve's plan runs them all, and with
    # prefill chunks in most steps each token takes 9.4 ms: neither meets 500 ms / 8 ms at 4096 tokens, c=16.
    assert cells[("published", 4096, 16)].good_pct == pytest.approx(12.5)
    assert cells[("t4serve", 4096, 16)].good_pct == 0.0
    assert cells[("t4serve", 512, 16)].good_pct == 100.0
    assert (strict.slo_ttft_ms, strict.slo_tpot_ms) == (500.0, 8.0)
    assert any("counted again from raw/" in n for n in strict.notes)
    assert recorded.slo_ttft_ms == 2000.0  # the folder's own record is untouched
