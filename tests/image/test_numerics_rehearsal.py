"""The precondition of the GPU host's KV numerics, on the CPU with a real Gemma 4 decoder (transformers' in the image,
narrowed by tests/gpu/gemma4_numerics_transformers.py): with the weights tests/gpu/kv_quant_host.py's `init_rule`
writes, two 16-bit computations agree and int8 can be told from them; with the first hold's weights they did not
agree with each other (what that hold measured). Also: the int8 rounding the rehearsal uses is vLLM 0.33's kernel's,
bit for bit (the tool stops otherwise)."""

from __future__ import annotations

from typing import Any

import pytest

from .conftest import GpuTool

pytestmark = pytest.mark.image


@pytest.fixture(scope="module")
def result(gpu_tool: GpuTool) -> dict[str, Any]:
    found: dict[str, Any] = gpu_tool("gemma4_numerics_transformers.py", "--lengths", "64", "--prompts", "2",
                                     timeout=900)
    return found


def test_the_int8_rounding_is_vllms_kernels(result: dict[str, Any]) -> None:
    assert result["int8_formula"] == {"vllm_kernel_equal": True, "rows_checked": {"256": 96, "512": 96}}


def test_with_init_rule_two_16bit_runs_agree_and_int8_is_measurable(result: dict[str, Any]) -> None:
    rows = result["rules"]["init_rule"]["against_16bit_eager"]
    assert rows["16-bit"]["positions"] == 2 * 63 and rows["16-bit"]["logit_std"] > 2
    assert rows["16-bit, other kernel"]["top1_agreement"] >= 0.99
    assert rows["int8 KV"]["top1_agreement"] >= 0.95
    # int8 moves the log-probabilities by more than another 16-bit kernel does: the comparison sees the cache.
    assert (
        rows["int8 KV"]["largest_top1_logprob_difference"]
        > rows["16-bit, other kernel"]["largest_top1_logprob_difference"]
    )


def test_with_the_first_holds_weights_two_16bit_runs_disagree(result: dict[str, Any]) -> None:
    rows = result["rules"]["first-hold"]["against_16bit_eager"]
    assert rows["16-bit, other kernel"]["top1_agreement"] <= 0.5
