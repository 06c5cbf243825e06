"""t4serve.bench.plots: the three PNGs drawn for real with matplotlib (Agg), failed cells left out of the lines, and
a missing matplotlib as a ConfigError that names the package."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from t4serve.bench.plots import PLOTS, write_plots
from t4serve.bench.results import Run, RunFigures, RunsFile
from t4serve.errors import ConfigError

PNG = b"\x89PNG\r\n\x1a\n"


def run(model: str, input_len: int, concurrency: int, throughput: float | None) -> Run:
    figures = None if throughput is None else RunFigures(8, 0, throughput, 1000 / throughput * concurrency, 80.0,
                                                             85.0, 1024, 10.0)  # fmt: skip
    return Run(model, input_len, concurrency, 1, 1, 8, None if figures is None else "r.json", figures,
               None if figures else "exited 1")  # fmt: skip


def runs_file(runs: list[Run]) -> RunsFile:
    return RunsFile(1, ["qat", "bf16"], [512, 4096], [1, 4], 1, 128, "2026-12-01T00:00:00+00:00", runs, {})


def test_three_pngs_are_written(tmp_path: Path) -> None:
    runs = [run(m, i, c, t) for m, t0 in (("qat", 60.0), ("bf16", 40.0)) for i in (512, 4096) for c, t in
            ((1, t0), (4, t0 * 3))]  # fmt: skip
    assert write_plots(tmp_path, runs_file(runs)) == list(PLOTS)
    for name in PLOTS:
        assert (tmp_path / name).read_bytes().startswith(PNG)


def test_failed_cells_do_not_stop_the_plots(tmp_path: Path) -> None:
    runs = [run("qat", 512, 1, 60.0), run("qat", 512, 4, None), run("bf16", 512, 1, None), run("bf16", 512, 4, None)]
    assert write_plots(tmp_path, runs_file(runs)) == list(PLOTS)
    assert all((tmp_path / name).stat().st_size > 0 for name in PLOTS)


def test_without_matplotlib_the_error_names_the_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # stands for a Python without matplotlib installed
    with pytest.raises(ConfigError) as caught:
        write_plots(tmp_path, runs_file([run("qat", 512, 1, 60.0)]))
    assert "matplotlib is not installed" in caught.value.what and caught.value.fix is not None
    assert "pip install matplotlib" in caught.value.fix
    assert list(tmp_path.iterdir()) == []
