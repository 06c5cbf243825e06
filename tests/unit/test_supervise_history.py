"""history: past start durations kept bounded and atomic; estimates are medians of matching starts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from t4serve.supervise import history
from t4serve.supervise.history import StartRecord


def rec(total: float, model: str = "qat", gpu: str | None = "Tesla T4", load: float = 100.0) -> StartRecord:
    phases = {"starting": 5.0, "loading_weights": load, "profiling": 60.0, "compiling": total - load - 65.0}
    return StartRecord(model, gpu, 0.0, total, phases)


def test_append_load_round_trip_and_bound(tmp_path: Path) -> None:
    for i in range(history.MAX_RECORDS + 5):
        history.append(tmp_path, rec(200.0 + i))
    records, problem = history.load(tmp_path)
    assert problem is None
    assert len(records) == history.MAX_RECORDS
    assert records[-1].total_seconds == 200.0 + history.MAX_RECORDS + 4
    assert records[0].total_seconds == 205.0


def test_missing_history_is_no_estimate_and_no_problem(tmp_path: Path) -> None:
    assert history.load(tmp_path) == ([], None)


def test_corrupt_history_is_reported_not_raised(tmp_path: Path) -> None:
    (tmp_path / history.HISTORY_FILE).write_text("[{")
    records, problem = history.load(tmp_path)
    assert records == [] and problem is not None and history.HISTORY_FILE in problem
    (tmp_path / history.HISTORY_FILE).write_text(json.dumps([{"model": "qat"}]))
    assert history.load(tmp_path)[1] is not None


def test_estimate_is_median_of_same_model_and_gpu() -> None:
    records = [rec(200.0), rec(260.0), rec(300.0), rec(900.0, model="bf16"), rec(10.0, gpu="NVIDIA L4")]
    est = history.estimate(records, "qat", "Tesla T4")
    assert est is not None
    assert est.total_seconds == 260.0 and est.starts == 3
    assert est.phases["loading_weights"] == 100.0
    assert history.estimate(records, "qat", None) is None


def test_remaining_counts_the_rest_of_this_phase_and_later_ones() -> None:
    est = history.Estimate(200.0, {"starting": 5.0, "loading_weights": 100.0, "profiling": 60.0, "compiling": 35.0}, 3)
    assert history.remaining(est, "loading_weights", 40.0, 45.0) == pytest.approx(60.0 + 60.0 + 35.0)
    # Past the median of the current phase: only the later phases are left.
    assert history.remaining(est, "profiling", 90.0, 200.0) == pytest.approx(35.0)
    assert history.remaining(est, "stopping", 1.0, 150.0) == pytest.approx(50.0)


def test_phase_durations_sum_repeated_phases() -> None:
    marks = [("starting", 0.0), ("loading_weights", 2.0), ("downloading", 3.0), ("loading_weights", 10.0)]
    assert history.phase_durations(marks, 15.0) == {"starting": 2.0, "loading_weights": 6.0, "downloading": 7.0}


def test_concurrent_appends_from_several_servers_keep_every_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The servers of a multi-GPU host share the cache volume. A pause between reading and rewriting the history
    # makes the race certain: without the lock, writers overwrite each other's records.
    import multiprocessing
    import time

    real_load = history.load

    def slow_load(cache_dir: Path) -> tuple[list[StartRecord], str | None]:
        out = real_load(cache_dir)
        time.sleep(0.02)
        return out

    monkeypatch.setattr(history, "load", slow_load)

    def writer(n: int) -> None:
        for i in range(10):
            history.append(tmp_path, StartRecord(f"m{n}", "Tesla T4", float(i), 1.0))

    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=writer, args=(n,)) for n in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    records, problem = real_load(tmp_path)
    assert problem is None
    assert sorted((r.model, r.finished_at) for r in records) == sorted(
        (f"m{n}", float(i)) for n in range(4) for i in range(10)
    )
