"""A T4 time model of Gemma 4 E2B's time to first token at c=1, per attention path: the published T4 run fitted, then
its attention scaled by what the GPU host measured as a T4 runs it. No T4 was measured: every figure here is modelled.

    python3 tests/gpu/t4_time_model.py KERNELS_JSON OUT_JSON

KERNELS_JSON is tests/gpu/turing_kernels.py's turing-kernels.json. The model:
1. TTFT(N) = a * N + A(N) / R: a per-token cost for everything but attention, and attention at one effective rate R,
   fitted to the published bf16 TTFTs at 512 and 4,096 prompt tokens (two equations, two unknowns). A(N) is E2B's
   attention FLOPs (7 full-attention layers at head 512, 28 sliding at head 256 with window 512; 8 query heads).
2. The attention of each path on a T4 = today's fitted attention / S, where S is the speedup of the path's kernels
   over vLLM's own launch in the GPU host's T4 mode (sm_75 code within a T4's registers and shared memory), for the
   whole prefill (512: one chunk; 4,096: two chunks of 2,048, as t4serve's plan batches them).
3. Two readings of S on a T4: as measured (the host's tensor cores stand for the T4's), and S times the ratio of
   tensor-core to FP32 peaks, the T4's (65 / 8.1 TFLOP/s) over the host's (989 / 67 for Hopper's dense FP16, which
   mma.sync does not reach): the conservative one, reported as `ttft_ms_4096_c1`.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from turing_kernels import GLOBAL_LAYERS, SLIDING_LAYERS, attention_flops

PUBLISHED = {
    "ttft_512_ms": (300.0, "docs/published-t4-run.md: bf16, input 512, concurrency 1"),
    "ttft_4096_ms": (7199.0, "docs/published-t4-run.md: bf16, input 4,096, concurrency 1"),
}
# NVIDIA T4 datasheet: 2,560 CUDA cores, 320 tensor cores, boost 1,590 MHz; FP32 8.1 TFLOP/s, mixed FP16/FP32 65.
T4_FP32_TFLOPS = 8.1
T4_TENSOR_TFLOPS = 65.0
# NVIDIA H100 SXM datasheet (the H200 has the same chip): FP32 67 TFLOP/s, dense FP16 tensor 989 TFLOP/s.
HOST_FP32_TFLOPS = 67.0
HOST_TENSOR_TFLOPS = 989.0


def e2b_attention_flops(tokens: int) -> float:
    return (GLOBAL_LAYERS * attention_flops(512, 0, [0], [tokens])
            + SLIDING_LAYERS * attention_flops(256, 512, [0], [tokens]))


# NVIDIA T4 datasheet: 320 GB/s of GDDR6; its L2 holds 4 MB, less than one full-attention layer's K and V at 4,096
# tokens (8 MB at head 512), so a T4 may read them from DRAM once per query block.
T4_DRAM_BYTES_PER_S = 320e9


def kv_bytes(tokens: int, chunk: int, block_m: dict[int, int]) -> float:
    """K and V bytes the attention kernels load for a prefill of `tokens` in chunks of `chunk` (16-bit cache, one KV
    head, 8 query heads): each program of BLOCK_M // 8 query tokens reads the keys and values it attends to, per
    layer."""
    total = 0.0
    for layers, head, window in ((GLOBAL_LAYERS, 512, 0), (SLIDING_LAYERS, 256, 512)):
        per_token = 2 * 2 * head  # K and V, 2 bytes each
        step = block_m[head] // 8
        for start in range(0, tokens, chunk):
            for first in range(start, min(start + chunk, tokens), step):
                last = min(first + step, tokens) - 1
                keys = last + 1 if not window else min(last + 1, window + step - 1)
                total += layers * keys * per_token
    return total


def fit(ttft_512_ms: float, ttft_4096_ms: float) -> tuple[float, float]:
    """(a in ms per token, R in FLOP per ms) from TTFT(N) = a N + A(N) / R at N = 512 and 4,096."""
    a512, a4096 = e2b_attention_flops(512), e2b_attention_flops(4096)
    # Eliminate a: ttft_4096 - 8 ttft_512 = (A(4096) - 8 A(512)) / R.
    rate = (a4096 - 8 * a512) / (ttft_4096_ms - 8 * ttft_512_ms)
    per_token = (ttft_512_ms - a512 / rate) / 512
    return per_token, rate


def model(kernels: dict[str, Any]) -> dict[str, Any]:
    totals = kernels["totals"]
    per_token, rate = fit(PUBLISHED["ttft_512_ms"][0], PUBLISHED["ttft_4096_ms"][0])
    peak_scale = (T4_TENSOR_TFLOPS / T4_FP32_TFLOPS) / (HOST_TENSOR_TFLOPS / HOST_FP32_TFLOPS)
    out: dict[str, Any] = {"paths": {}}
    for family, path in (("vllm", "triton (vLLM's launch, today)"), ("fma", "step 1: t4serve's FMA launch"),
                         ("mma", "turing-mma")):
        row: dict[str, Any] = {"path": path}
        for tokens in (512, 4096):
            attention_today = e2b_attention_flops(tokens) / rate
            speedup = totals["vllm"][f"prefill{tokens}_ms"] / totals[family][f"prefill{tokens}_ms"]
            # Tensor cores replace FMA: the gain shrinks with the ratio of tensor to FP32 peaks (never below 1).
            conservative = max(1.0, speedup * peak_scale) if family == "mma" else speedup
            row[f"host_attention_ms_{tokens}"] = totals[family][f"prefill{tokens}_ms"]
            row[f"speedup_{tokens}"] = round(speedup, 2)
            row[f"ttft_ms_{tokens}_c1_as_measured_ratio"] = round(per_token * tokens + attention_today / speedup)
            row[f"ttft_ms_{tokens}_c1"] = round(per_token * tokens + attention_today / conservative)
        out["paths"][family] = row
    mma = out["paths"]["mma"]
    # The bandwidth a T4 lacks: were every K and V load of the table's launches served from DRAM and never overlapped
    # with compute, they would add this to the conservative figure.
    from t4serve.turing.launch import LAUNCHES, PREFILL

    rows = {head: (LAUNCHES[(PREFILL, head, 0)].block_m or 16) for head in (512, 256)}
    dram_ms = kv_bytes(4096, 2048, rows) / T4_DRAM_BYTES_PER_S * 1000
    mma["kv_bytes_4096"] = kv_bytes(4096, 2048, rows)
    mma["t4_dram_ms_4096_if_no_l2_hits"] = round(dram_ms)
    mma["ttft_ms_4096_c1_plus_dram_no_overlap"] = round(mma["ttft_ms_4096_c1"] + dram_ms)
    out["ttft_ms_4096_c1"] = mma["ttft_ms_4096_c1"]
    out["ttft_ms_4096_c1_as_measured_ratio"] = mma["ttft_ms_4096_c1_as_measured_ratio"]
    out["attention_speedup_4096_on_host"] = mma["speedup_4096"]
    out["inputs"] = {
        **{k: {"value": v, "source": s} for k, (v, s) in PUBLISHED.items()},
        "attention_flops_512": {"value": e2b_attention_flops(512), "source": "E2B's config: 7 x head 512 full + 28 x "
                                "head 256 window 512, 8 query heads, QK^T and PV"},
        "attention_flops_4096": {"value": e2b_attention_flops(4096), "source": "as above"},
        "fitted_ms_per_token_rest": {"value": round(per_token, 4), "source": "the fit (step 1)"},
        "fitted_attention_tflops_today": {"value": round(rate / 1e9, 4), "source": "the fit (step 1)"},
        "host_attention_ms": {"value": {f: {n: totals[f][f"prefill{n}_ms"] for n in (512, 4096)} for f in totals},
                              "source": f"turing-kernels.json on {kernels.get('device')} in T4 mode"},
        "t4_fp32_tflops": {"value": T4_FP32_TFLOPS, "source": "NVIDIA T4 datasheet (1,590 MHz)"},
        "t4_tensor_tflops": {"value": T4_TENSOR_TFLOPS, "source": "NVIDIA T4 datasheet, FP16 with FP32 accumulate"},
        "host_fp32_tflops": {"value": HOST_FP32_TFLOPS, "source": "NVIDIA H100 SXM datasheet"},
        "host_tensor_tflops": {"value": HOST_TENSOR_TFLOPS, "source": "NVIDIA H100 SXM datasheet, dense FP16"},
        "t4_dram_bytes_per_s": {"value": T4_DRAM_BYTES_PER_S, "source": "NVIDIA T4 datasheet"},
        "table_block_m": {"value": {str(h): m for h, m in rows.items()}, "source": "t4serve/turing/launch.py's "
                          "prefill rows (query heads x tokens per program)"},
        "tensor_speedup_scale": {"value": round(peak_scale, 4), "source": "(T4 tensor / T4 FP32) / (host tensor / "
                                 "host FP32): the share of the host's tensor-core gain a T4 keeps, at most"},
    }
    return out


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: t4_time_model.py KERNELS_JSON OUT_JSON", file=sys.stderr)
        return 2
    result = model(json.loads(Path(args[0]).read_text()))
    Path(args[1]).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "inputs"}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
