"""The pure parts of tests/gpu/bench_host.py (the GPU host's sweep): the step's deadline and how many repeats of the
KV caches' 4,096 x 16 fit what is left. The servers themselves need a GPU."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "gpu"))
import bench_host as bh
import kv_quant_host as kq


def test_the_deadline_comes_from_the_session_else_the_hold(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("T4SERVE_GPU_DEADLINE", "1000.5")
    assert bh.step_deadline(0.0) == 1000.5
    monkeypatch.delenv("T4SERVE_GPU_DEADLINE")
    assert bh.step_deadline(100.0) == 100.0 + 30 * 60 - 8 * 60 - 60


def runs(tmp_path: Path, walls: list[float]) -> Path:
    path = tmp_path / "runs.json"
    rows = [{"input_len": 4096, "concurrency": 16, "timing": {"wall_s": w}} for w in walls]
    rows.append({"input_len": 512, "concurrency": 16, "timing": {"wall_s": 500.0}})  # another cell: not counted
    path.write_text(json.dumps({"runs": rows}))
    return path


def test_kv_repeats_fit_what_is_left_from_the_sweeps_own_runs(tmp_path: Path) -> None:
    path = runs(tmp_path, [10.0, 12.0, 30.0])  # median 12 s
    assert bh.kv_bench_repeats(path, 3, 40 + 3 * 12 * 3.2) == (3, 12.0)
    assert bh.kv_bench_repeats(path, 3, 40 + 3 * 12 * 3.2 - 1) == (2, 12.0)
    assert bh.kv_bench_repeats(path, 3, 40 + 3 * 12 * 1.2 - 1) == (0, 12.0)


def test_kv_repeats_without_the_sweeps_runs_use_the_fallback(tmp_path: Path) -> None:
    assert bh.kv_bench_repeats(tmp_path / "missing.json", 2, 1000, fallback_s=20.0) == (3, 20.0)
    (tmp_path / "bad.json").write_text("{not json")
    assert bh.kv_bench_repeats(tmp_path / "bad.json", 2, 40 + 2 * 20 * 1.2, fallback_s=20.0) == (1, 20.0)


def test_kv_servers_differ_from_the_plans_only_in_the_cache(tmp_path: Path) -> None:
    plan = bh.servers_for(tmp_path, tmp_path / "ckpt")["t4serve"]
    kv = bh.kv_servers_for(tmp_path, tmp_path / "ckpt", ["int8", "int4"])
    assert [s.port for s in kv.values()] == [8502, 8503]
    for kind, server in zip(("int8", "int4"), kv.values(), strict=True):
        extra = {k: v for k, v in server.env.items() if plan.env.get(k) != v}
        assert extra == {"T4SERVE_SERVED_MODEL_NAME": f"kv-{kind}", "T4SERVE_KV_CACHE_DTYPE": kind}


def test_numerics_carry_a_16bit_control_beside_the_quantized_caches(monkeypatch: pytest.MonkeyPatch) -> None:
    import time
    from types import SimpleNamespace

    from local_http import Canned, serve

    def answer(top: int, second: int) -> dict[str, object]:
        position = {str(top): {"logprob": -0.1}, str(second): {"logprob": -2.0}}
        return {"choices": [{"prompt_logprobs": [None, position], "token_ids": [top]}]}

    monkeypatch.setattr(kq, "PROMPT_LENGTHS", (8, 600))  # two lengths, two prompts each: fewer requests, same path
    monkeypatch.setattr(kq, "PROMPTS_PER_LENGTH", 2)
    # Stand-ins for three servers' /v1/completions: the control answers as the reference does, int8 does not.
    with serve({"/v1/completions": Canned(body=answer(5, 9))}) as ref, \
            serve({"/v1/completions": Canned(body=answer(5, 9))}) as control, \
            serve({"/v1/completions": Canned(body=answer(9, 5))}) as int8:
        servers = {n: SimpleNamespace(base_url=s.url) for n, s in
                   (("t4serve", ref), ("published", control), ("kv-int8", int8))}
        out = bh.kv_numerics(servers, ["int8"], until=time.time() + 60)  # type: ignore[arg-type]
    assert out["control_16bit"]["top1_agreement"] == 1.0 and out["control_16bit"]["greedy"]["identical"] == 4
    assert out["same_server_again"]["top1_agreement"] == 1.0
    assert len(ref.requests) == 4 * len(kq.prompts())  # the reference measured twice: two requests a prompt
    assert out["int8"]["top1_agreement"] == 0.0 and out["int8"]["largest_top1_logprob_difference"] == pytest.approx(1.9)
