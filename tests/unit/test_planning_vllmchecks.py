"""planning.vllmchecks and the plan: T4SERVE_KV_CACHE_DTYPE mapped to vLLM's names and sized, fp8 refused below 8.9
and quantization methods refused below their capability, each in vLLM's words."""

from __future__ import annotations

import dataclasses

import pytest
from sample_facts import model, t4

from t4serve.config.settings import KV_CACHE_DTYPES, Settings
from t4serve.errors import ConfigError
from t4serve.facts import Facts
from t4serve.pipeline import ensure_model, with_known_gpu
from t4serve.planning import vllmchecks
from t4serve.planning.plan import Plan, plan


def plan_for(facts: Facts, **env: str) -> Plan:
    s = Settings.from_environ({"HF_HOME": "/nonexistent-hf-home", **env})
    return plan(s, ensure_model(s, facts))


def flag(argv: tuple[str, ...], name: str) -> str | None:
    return argv[argv.index(name) + 1] if name in argv else None


def test_every_setting_has_a_vllm_name() -> None:
    assert set(vllmchecks.VLLM_KV_CACHE_DTYPES) == set(KV_CACHE_DTYPES)


# int4 on an L4: on a T4 its attention kernel does not fit (tests/unit/test_planning_kernelfit.py).
@pytest.mark.parametrize(("setting", "vllm_name", "gpu"),
                         [("auto", "auto", "t4"), ("int8", "int8_per_token_head", "t4"),
                          ("int4", "int4_per_token_head", "l4")])
def test_the_plan_passes_vllms_name_and_sizes_for_it(setting: str, vllm_name: str, gpu: str) -> None:
    p = plan_for(with_known_gpu(t4(), gpu), T4SERVE_KV_CACHE_DTYPE=setting)
    assert flag(p.argv, "--kv-cache-dtype") == vllm_name and p.kv_cache_dtype == vllm_name
    assert p.sizing is not None
    assert f"kv cache dtype:    {vllm_name}" in p.summary()


def test_quantized_caches_hold_more_tokens_from_the_same_card() -> None:
    tokens = {}
    for setting in ("auto", "int8", "int4"):
        # An L4: int4's kernel does not fit a T4; the pool is set, so the card changes no figure here.
        p = plan_for(with_known_gpu(t4(), "l4"), T4SERVE_KV_CACHE_DTYPE=setting, T4SERVE_KV_CACHE_MEMORY_BYTES="3GiB")
        assert p.sizing is not None
        tokens[setting] = int(p.sizing.kv_tokens.value)
    # The same pool: int8 about 1.5x, int4 about 3x the 16-bit tokens (sliding groups on padded 16-token blocks).
    assert 1.4 < tokens["int8"] / tokens["auto"] < 1.6
    assert 2.7 < tokens["int4"] / tokens["auto"] < 3.0


def test_fp8_is_refused_below_8_9_in_vllms_words() -> None:
    p = plan_for(t4(), T4SERVE_KV_CACHE_DTYPE="fp8")
    assert p.sizing is None and p.sizing_error is not None
    assert ("FP8 KV cache is not supported by the Triton attention backend on Tesla T4 (compute capability 7.5); "
            "native FP8 (fp8e4nv) requires SM89+.") in p.sizing_error
    assert "T4SERVE_KV_CACHE_DTYPE=int8" in p.sizing_error


def test_fp8_is_planned_from_8_9() -> None:
    p = plan_for(with_known_gpu(t4(), "l4"), T4SERVE_KV_CACHE_DTYPE="fp8")
    assert p.sizing is not None and flag(p.argv, "--kv-cache-dtype") == "fp8"


def test_a_kv_cache_dtype_in_vllm_args_names_the_variable() -> None:
    with pytest.raises(ConfigError) as err:
        Settings.from_environ({"T4SERVE_VLLM_ARGS": "--kv-cache-dtype int8_per_token_head"})
    assert "T4SERVE_KV_CACHE_DTYPE" in err.value.message()


def test_an_unknown_kv_cache_dtype_is_refused() -> None:
    with pytest.raises(ConfigError) as err:
        Settings.from_environ({"T4SERVE_KV_CACHE_DTYPE": "q8_0"})
    assert "T4SERVE_KV_CACHE_DTYPE" in err.value.message() and "int8" in err.value.message()


def gpt_oss(facts: Facts) -> Facts:
    base = model()
    config = {**base.config, "model_type": "gpt_oss"}
    return dataclasses.replace(facts, model=dataclasses.replace(base, quantization="mxfp4", config=config))


def test_gpt_oss_mxfp4_is_refused_on_a_t4_by_vllms_reason() -> None:
    p = plan_for(gpt_oss(t4()))
    assert p.sizing is None and p.sizing_error is not None
    assert ("The quantization method gpt_oss_mxfp4 is not supported for the current GPU. Minimum capability: 80. "
            "Current capability: 75.") in p.sizing_error


def test_quantization_dtypes_are_vllms() -> None:
    facts = gpt_oss(with_known_gpu(t4(), "a100"))
    assert vllmchecks.quantization_refusal(facts.model, "float16", (8, 0)) == (
        "torch.float16 is not supported for quantization method gpt_oss_mxfp4. Supported dtypes: [torch.bfloat16]")
    assert vllmchecks.quantization_refusal(facts.model, "bfloat16", (8, 0)) is None
    assert vllmchecks.quantization_refusal(model(), "float16", (7, 5)) is None  # compressed-tensors from 7.0


def test_quantized_caches_run_on_triton() -> None:
    p = plan_for(with_known_gpu(t4(), "h100"), T4SERVE_KV_CACHE_DTYPE="int8")
    assert flag(p.argv, "--attention-backend") == "TRITON_ATTN" and p.attention.backend == "TRITON_ATTN"
    auto = plan_for(with_known_gpu(t4(), "h100"))
    assert "--attention-backend" not in auto.argv and auto.attention.path is None
