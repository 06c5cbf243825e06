"""The int8 KV cache through vLLM 0.33's own write path and the clamped attention kernel, run in the image under
TRITON_INTERPRET=1 at a T4's tiles by tests/gpu/kv_kernel_numerics.py: the kernel computes what the cache holds, and
what the cache holds is within int8's rounding of the 16-bit keys and values."""

from __future__ import annotations

from typing import Any

import pytest

from .conftest import GpuTool

pytestmark = pytest.mark.image


@pytest.fixture(scope="module")
def rows(gpu_tool: GpuTool) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = gpu_tool("kv_kernel_numerics.py", "--modes", "none,int8", "--shared-memory", "65536")
    return found


def test_every_case_ran(rows: list[dict[str, Any]]) -> None:
    assert {(r["mode"], r["layer"], r["phase"]) for r in rows} == {
        (m, layer, p) for m in ("none", "int8") for layer in ("sliding", "global") for p in ("prefill", "decode")
    }
    assert all(
        r["kernels"]
        == (["kernel_unified_attention", "reduce_segments"] if r["phase"] == "decode" else ["kernel_unified_attention"])
        for r in rows
    )


def test_the_clamps_tile_at_head_512(rows: list[dict[str, Any]]) -> None:
    # At 65,536 B per block the clamp takes tile 16 for head 512's prefill, where vLLM's own would be 32.
    assert {tuple(r["tiles"]) for r in rows if r["head"] == 512} == {(16,)}


def test_int8_kernel_computes_what_the_cache_holds(rows: list[dict[str, Any]]) -> None:
    # Against attention over the dequantized cache, int8 is as close as the 16-bit cache is to its own reference:
    # both within the fp16 output's rounding (half an ulp at |out| < 4 is 0.00195).
    fp16 = {(r["layer"], r["phase"]): r["vs_stored"] for r in rows if r["mode"] == "none"}
    for r in (r for r in rows if r["mode"] == "int8"):
        assert r["vs_stored"] <= 2.5e-3, r
        assert r["vs_stored"] <= 2 * fp16[r["layer"], r["phase"]], r


def test_int8_costs_int8s_rounding_and_no_more(rows: list[dict[str, Any]]) -> None:
    # Each element is off by at most its vector's absmax / 254; the outputs here stay within 2 % of max |out|,
    # and more than the 16-bit cache's (the test would pass a cache that was never quantized otherwise).
    for r in (r for r in rows if r["mode"] == "int8"):
        assert r["vs_16bit"] <= 0.02 * r["reference_max"], r
        assert r["vs_16bit"] > 4 * r["vs_stored"], r
