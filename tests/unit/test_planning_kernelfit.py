"""The plan refuses a quantized KV cache whose attention kernel the card cannot launch: vLLM 0.33's int4 kernel on
Turing (t4serve.planning.kernelfit; its figures compiled for sm_75 in the image:
docs/verified/kv-kernel-shared-memory/)."""

from __future__ import annotations

import pytest
from sample_facts import t4
from test_planning_vllmchecks import plan_for

from t4serve.errors import ConfigError
from t4serve.pipeline import with_known_gpu
from t4serve.planning import kernelfit
from t4serve.planning.kvcache import KVSpec


def spec(head: int, window: int | None = None) -> KVSpec:
    return KVSpec(0, 16, 1, head, 2, window, "int4_per_token_head")


def test_e2bs_global_layers_do_not_fit_a_t4_and_the_refusal_says_what_would() -> None:
    with pytest.raises(ConfigError) as caught:
        kernelfit.check_kv_kernel_fits([spec(256, 512), spec(512)], "int4_per_token_head", "Tesla T4", (7, 5))
    text = caught.value.message()
    assert "98,304 B" in text and "head 512" in text and "65,536 B" in text
    assert "Required: 98304, Hardware limit: 65536" in text and "T4SERVE_KV_CACHE_DTYPE=int8" in text


@pytest.mark.parametrize("head", [64, 96, 128])
def test_heads_up_to_128_fit(head: int) -> None:
    kernelfit.check_kv_kernel_fits([spec(head)], "int4_per_token_head", "Tesla T4", (7, 5))


def test_a_256_wide_full_attention_layer_does_not_but_e2bs_sliding_one_does() -> None:
    kernelfit.check_kv_kernel_fits([spec(256, 512)], "int4_per_token_head", "Tesla T4", (7, 5))
    with pytest.raises(ConfigError, match="81,920 B"):
        kernelfit.check_kv_kernel_fits([spec(256)], "int4_per_token_head", "Tesla T4", (7, 5))
    # A window not measured is bounded by the full-attention figure.
    with pytest.raises(ConfigError, match="81,920 B"):
        kernelfit.check_kv_kernel_fits([spec(256, 4096)], "int4_per_token_head", "Tesla T4", (7, 5))


def test_a_head_above_any_measured_is_refused_on_turing() -> None:
    with pytest.raises(ConfigError, match="more than any head measured"):
        kernelfit.check_kv_kernel_fits([spec(1024)], "int4_per_token_head", "Tesla T4", (7, 5))


@pytest.mark.parametrize(("dtype", "capability"), [("int8_per_token_head", (7, 5)), ("auto", (7, 5)),
                                                   ("int4_per_token_head", (8, 9)), ("int4_per_token_head", (8, 0))])
def test_other_caches_and_cards_are_not_checked(dtype: str, capability: tuple[int, int]) -> None:
    kernelfit.check_kv_kernel_fits([spec(512)], dtype, "a card", capability)


def test_the_plan_refuses_int4_for_e2b_on_a_t4_and_plans_it_on_an_l4() -> None:
    refused = plan_for(t4(), T4SERVE_KV_CACHE_DTYPE="int4")
    assert refused.sizing is None and refused.sizing_error is not None and "98,304 B" in refused.sizing_error
    planned = plan_for(with_known_gpu(t4(), "l4"), T4SERVE_KV_CACHE_DTYPE="int4")
    assert planned.sizing is not None
    # int8 fits a T4 (65,536 B at head 512, as the 16-bit cache with the clamp).
    assert plan_for(t4(), T4SERVE_KV_CACHE_DTYPE="int8").sizing is not None


def test_int4_fits_answers_what_the_check_refuses() -> None:
    assert kernelfit.int4_fits([spec(128), spec(256, 512)], (7, 5))
    assert not kernelfit.int4_fits([spec(256, 512), spec(512)], (7, 5))
    assert not kernelfit.int4_fits([spec(1024)], (7, 5))
    # Other cards, and no layers to judge: nothing this table knows against it.
    assert kernelfit.int4_fits([spec(512)], (8, 9)) and kernelfit.int4_fits([], (7, 5))
