"""The pure parts of issue 43's GPU-host tools (tests/gpu/turing_kernels.py, turing_served.py, t4mode.py): the
FLOPs of E2B's attention, a whole prefill's total from per-layer times, the launch chosen from the times, the record
kept, and the register cap the T4 mode writes into PTX. (The tools themselves run on the GPU host only.)"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "gpu"))
import t4mode
import turing_kernels as tk
import turing_served as ts

from t4serve.turing.launch import KV_MODES


def test_e2b_attention_flops_are_the_issues_figures() -> None:
    # 7 global layers (head 512, causal) and 28 sliding (head 256, window 512): 1.41 TFLOP at 4,096, 45 GFLOP at 512.
    def total(n: int) -> float:
        return 7 * tk.attention_flops(512, 0, [0], [n]) + 28 * tk.attention_flops(256, 512, [0], [n])

    assert total(4096) == pytest.approx(1.41e12, rel=0.01)
    assert total(512) == pytest.approx(45e9, rel=0.03)
    # A second chunk over the first attends to both: the two chunks are the whole prefill.
    assert tk.attention_flops(512, 0, [0], [2048]) + tk.attention_flops(512, 0, [2048], [2048]) == \
        tk.attention_flops(512, 0, [0], [4096])


def cases(times: dict[str, float], error: float = 1e-3) -> list[dict[str, Any]]:
    out = []
    for variant, ms in times.items():
        for layer, head in (("global", 512), ("sliding", 256)):
            for shape in ("prefill512", "prefill2048", "chunk2of4096"):
                out.append({"layer": layer, "head": head, "shape": shape, "phase": "prefill", "variant": variant,
                            "ms": ms, "max_abs_error": error})
            out.append({"layer": layer, "head": head, "shape": "decode1x4096", "phase": "decode", "variant": variant,
                        "ms": ms / 100, "max_abs_error": error})
    return out


def test_totals_add_the_layers_and_chunks_of_a_prefill() -> None:
    totals = tk.totals(cases({"vllm": 10.0, "fma/w8": 5.0, "mma/w8/t16/m32": 1.0}))
    assert totals["vllm"] == {"prefill512_ms": 350.0, "prefill4096_ms": 700.0}
    assert totals["mma"]["prefill4096_speedup"] == 10.0 and totals["fma"]["prefill512_speedup"] == 2.0


def test_a_launch_outside_the_error_bound_is_never_chosen() -> None:
    rows = cases({"vllm": 10.0, "mma/w8/t16/m32": 1.0}, error=0.5) + cases({"mma/w4/t16/m16": 2.0})
    choice = tk.choose(rows, [])
    assert choice["prefill/512/mma"]["variant"] == "mma/w4/t16/m16"


def test_the_table_takes_the_faster_family_and_leaves_vllms_launch_where_it_wins() -> None:
    choice = {
        "prefill/512/mma": {"variant": "mma/w8/t16/m32", "sum_ms": 1.0, "vllm_sum_ms": 10.0},
        "prefill/512/fma": {"variant": "fma/w8", "sum_ms": 5.0, "vllm_sum_ms": 10.0},
        "decode/256/fma": {"variant": "fma/w8", "sum_ms": 0.2, "vllm_sum_ms": 0.1},
        "compiled_kernels": 3,
    }
    table = tk.table_from_choice(choice)
    assert set(table) == {("prefill", 512, kv) for kv in KV_MODES}
    launch = table[("prefill", 512, 0)]
    assert launch.tensor_cores and (launch.num_warps, launch.tile_size, launch.block_m) == (8, 16, 32)
    assert tk.variant_launch("fma/w4/r255").maxnreg == 255


def test_greedy_agreement_counts_tokens_position_by_position() -> None:
    assert ts.greedy_agreement([[1, 2, 3], [4, 5]], [[1, 2, 4], [4, 5]]) == 0.8
    assert ts.greedy_agreement([[1, 2]], [None]) == 0.0


def test_the_served_record_holds_the_issues_keys() -> None:
    record = ts.served_record({"vllm": "0.33.0", "device": "NVIDIA H200",
                               "numerics": {"turing-mma": {"greedy_agreement": 0.97}},
                               "ttft_ms": {"triton": {"4096": {"median": 900.0, "runs": [900.0]}}}})
    assert record["as_t4_kernels"] is True and record["attention_path"] == "turing-mma"
    assert record["greedy_agreement"] == 0.97 and record["ttft_ms"] == {"triton": {"4096": 900.0}}
    assert record["vllm_version"] == "0.33.0" and record["device"] == "NVIDIA H200"


def test_the_register_cap_follows_the_thread_count_directive() -> None:
    ptx = ".visible .entry k(\n\t.param .u64 p\n)\n.reqntid 128\n.maxnreg 32\n{\n\tret;\n}\n"
    capped = t4mode.cap_registers(ptx, 64)
    assert ".reqntid 128\n.maxnreg 64\n{" in capped and capped.count(".maxnreg") == 1
    with pytest.raises(RuntimeError, match=r"no \.reqntid"):
        t4mode.cap_registers(".visible .entry k()\n{\n}\n", 64)


def test_the_t4_model_record_is_what_the_model_gives_from_the_recorded_kernels() -> None:
    import json

    import t4_time_model as model

    root = Path(__file__).resolve().parents[2] / "docs" / "verified" / "turing-attention"
    kernels = json.loads((root / "gpu-host" / "kernels-16bit-repeat.json").read_text())
    assert json.loads(json.dumps(model.model(kernels))) == json.loads((root / "t4-model.json").read_text())
    # The fit reproduces the published times it was made from.
    per_token, rate = model.fit(300.0, 7199.0)
    for tokens, ttft in ((512, 300.0), (4096, 7199.0)):
        assert per_token * tokens + model.e2b_attention_flops(tokens) / rate == pytest.approx(ttft)
