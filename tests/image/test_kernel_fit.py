"""t4serve.planning.kernelfit's figures are the image's own: vLLM 0.33's int4 (and int8) attention kernels compiled for
sm_75 in the image by tests/gpu/kv_kernel_shared_memory.py, at the clamp's tiles. No GPU: Triton compiles for the
target and reports the shared memory each launch needs."""

from __future__ import annotations

from typing import Any

import pytest

from t4serve.planning import kernelfit

from .conftest import GpuTool

pytestmark = pytest.mark.image


def largest(rows: list[dict[str, Any]], **match: object) -> int:
    found = [r["shared_memory"] for r in rows if all(r[k] == v for k, v in match.items())]
    assert found, match
    return max(found)


@pytest.fixture(scope="module")
def e2b(gpu_tool: GpuTool) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = gpu_tool("kv_kernel_shared_memory.py", "--layers", "e2b", "--modes", "int8,int4")
    return rows


def test_int4_at_e2bs_layers_is_the_tables(e2b: list[dict[str, Any]]) -> None:
    assert largest(e2b, mode="int4", layer="global") == kernelfit.INT4_TURING_FULL_ATTENTION[512]
    assert largest(e2b, mode="int4", layer="sliding") == kernelfit.INT4_TURING_SLIDING[(256, 512)]
    # The clamp's tile 16 at head 512, and still past a T4's 65,536 B.
    assert {r["tile"] for r in e2b if r["mode"] == "int4" and r["layer"] == "global"} == {16}
    assert largest(e2b, mode="int4", layer="global") > 65_536


def test_int8_fits_a_t4_at_head_512(e2b: list[dict[str, Any]]) -> None:
    assert largest(e2b, mode="int8", layer="global") <= 65_536


def test_int4_full_attention_by_head_is_the_tables(gpu_tool: GpuTool) -> None:
    rows = gpu_tool("kv_kernel_shared_memory.py", "--layers", "heads", "--modes", "int4")
    for head, need in kernelfit.INT4_TURING_FULL_ATTENTION.items():
        assert largest(rows, head=head) == need, head
