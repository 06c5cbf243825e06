"""t4serve.commands.bench: its options checked before anything runs (exit 2 with the fix), MODEL=VALUE pairs, the
exit status of a sweep that ran (0 all measured, 1 some runs failed, 6 none measured), and `bench compare`."""

from __future__ import annotations

from pathlib import Path

import pytest

from t4serve.bench.results import Run, RunFigures, RunsFile
from t4serve.cli import main
from t4serve.commands.bench import _pairs
from t4serve.errors import ConfigError


def test_pairs_per_model_and_a_lone_value() -> None:
    assert _pairs(None, "--base-url", ["qat"]) == {}
    assert _pairs("qat=http://a:1, bf16=http://b:2", "--base-url", ["qat", "bf16"]) == {
        "qat": "http://a:1",
        "bf16": "http://b:2",
    }
    assert _pairs("http://a:1", "--base-url", ["qat"]) == {"qat": "http://a:1"}
    assert _pairs("/tok", "--tokenizer", ["qat", "bf16"], lone_for_all=True) == {"qat": "/tok", "bf16": "/tok"}
    with pytest.raises(ConfigError, match="only allowed with a single model"):
        _pairs("http://a:1", "--base-url", ["qat", "bf16"])


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--models", "qat,qat"], "must name one or more distinct checkpoints"),
        (["--models", "a b"], "must name one or more distinct checkpoints"),
        (["--ceiling", "qat=-3"], "--ceiling qat="),
        (["--vllm", "'unclosed"], "is not a shell-quoted command"),
        (["--ready-timeout", "nan"], "--ready-timeout"),
        (["--concurrency", "0"], "--concurrency"),
    ],
)
def test_bad_options_exit_2_before_anything_runs(
    args: list[str], says: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["bench", "--models", "qat", "--output", str(tmp_path / "out"), *args]) == 2
    assert says in capsys.readouterr().err


def test_an_output_folder_holding_files_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "old.json").write_text("{}")
    assert main(["bench", "--models", "qat", "--output", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "already holds files" in err and "fix:" in err


def _sweep(outcomes: list[bool]) -> object:
    def run_bench(opts: object, *_args: object, **_kwargs: object) -> RunsFile:
        """Stands for a sweep that ran: writes the report the command prints and returns one run per outcome
        (True: measured, False: failed)."""
        output: Path = opts.output  # type: ignore[attr-defined]
        (output / "report.md").write_text("# report\n")
        runs = []
        for c, measured in enumerate(outcomes, start=1):
            figures = RunFigures(8, 0, 60.0, 16.0, 80.0, 85.0, 1024, 10.0) if measured else None
            error = None if measured else "the vLLM server was not ready within 1800 s"
            runs.append(Run("qat", 512, c, 1, 1, 8, "r.json" if measured else None, figures, error))
        return RunsFile(1, ["qat"], [512], list(range(1, len(outcomes) + 1)), 1, 128, "2026-12-01T00:00:00+00:00",
                        runs, {})  # fmt: skip

    return run_bench


@pytest.mark.parametrize(
    ("outcomes", "code", "says"),
    [
        ([True, True], 0, ""),
        ([True, False], 1, "1 of 2 runs failed"),
        ([False, False], 6, "t4serve bench measured nothing: all 2 runs failed"),
    ],
)
def test_a_sweep_that_ran_exits_0_1_or_6(
    outcomes: list[bool],
    code: int,
    says: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from t4serve.bench import runner

    monkeypatch.setattr(runner, "run_bench", _sweep(outcomes))
    assert main(["bench", "--models", "qat", "--output", str(tmp_path / "out")]) == code
    captured = capsys.readouterr()
    assert "# report" in captured.out
    assert says in captured.err
    if code == 6:
        assert "first failure: the vLLM server was not ready within 1800 s" in captured.err
        assert f"fix: read {tmp_path / 'out' / 'report.md'}" in captured.err


def test_compare_two_folders_and_a_folder_that_is_not_one(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from t4serve.bench.results import write_runs

    for name, throughput in (("a", 60.0), ("b", 66.0)):
        (tmp_path / name).mkdir()
        figures = RunFigures(8, 0, throughput, 16.0, 80.0, 85.0, 1024, 10.0)
        runs = [Run("qat", 512, 1, 1, 1, 8, "r.json", figures)]
        write_runs(tmp_path / name, RunsFile(1, ["qat"], [512], [1], 1, 128, "2026-12-01T00:00:00+00:00", runs, {}))
    assert main(["bench", "compare", str(tmp_path / "a"), str(tmp_path / "b")]) == 0
    out = capsys.readouterr().out
    assert str(tmp_path / "a") in out and str(tmp_path / "b") in out
    (tmp_path / "c").mkdir()
    assert main(["bench", "compare", str(tmp_path / "a"), str(tmp_path / "c")]) == 2
    assert "is not a `t4serve bench` result folder" in capsys.readouterr().err


def test_report_with_other_objectives_prints_and_leaves_the_folder_alone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import shutil

    folder = tmp_path / "sweep"
    shutil.copytree(Path(__file__).resolve().parents[2] / "docs/verified/gpu-host-vllm-0.33.0/bench/sweep", folder)
    before = {p: p.read_bytes() for p in folder.rglob("*") if p.is_file()}
    assert main(["bench", "report", str(folder), "--slo-ttft-ms", "500", "--slo-tpot-ms", "8"]) == 0
    assert "TTFT was within 500 ms and TPOT within 8 ms" in capsys.readouterr().out
    assert {p: p.read_bytes() for p in folder.rglob("*") if p.is_file()} == before
    assert main(["bench", "report", str(folder), "--slo-ttft-ms", "nan"]) == 2
    assert "must be a number" in capsys.readouterr().err


@pytest.mark.parametrize(("args", "says"), [
    (["--vllm", "/opt/venv/bin/vllm"], "--vllm names a command for --client per-run"),
    (["--client", "one"], "Invalid value for '--client'"),
    (["--waves", "0"], "--waves"),
])
def test_the_client_options_are_checked_before_anything_runs(
    args: list[str], says: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["bench", "--models", "qat", "--output", str(tmp_path / "out"), *args]) == 2
    assert says in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
