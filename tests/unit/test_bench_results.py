"""Reading vLLM's result JSON and summarizing repeats, checked against values computed by hand."""

from __future__ import annotations

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
from t4serve.errors import ConfigError


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
    original = RunsFile(1, ["qat", "bf16"], [512], [4], 3, 128, "2026-12-01T00:00:00+00:00", runs, {"qat": 150.0})
    write_runs(tmp_path, original)
    assert read_runs(tmp_path) == original


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
    assert "| 4 | 1,036.90 | not run |" in report
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
