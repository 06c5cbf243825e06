"""t4serve.config.vllmflags: which T4SERVE_VLLM_ARGS flags are refused, and why, in every spelling vLLM's parser
accepts."""

from __future__ import annotations

import pytest

from t4serve.config.vllmflags import canonical_flag, is_secret_flag, names_flag, refused_value, vllm_flag_conflict


@pytest.mark.parametrize("arg", ["--max-model-len", "--max_model_len=4096", "--MAX-MODEL-LEN", "--max-model"])
def test_a_controlled_flag_is_refused_with_its_variable_in_every_spelling(arg: str) -> None:
    why = vllm_flag_conflict(arg)
    assert why is not None and "use T4SERVE_MAX_MODEL_LEN instead" in why


@pytest.mark.parametrize("arg", ["--api-key", "--api_key=x", "--hf-token"])
def test_a_secret_flag_names_the_environment_route_not_the_value(arg: str) -> None:
    why = vllm_flag_conflict(arg)
    assert why is not None and "secret would show in `ps`" in why and "=x" not in why
    assert is_secret_flag(arg.split("=")[0])


@pytest.mark.parametrize("arg", ["-tp", "-tp2", "--tensor-parallel-size=2", "--kv-cache-dtype"])
def test_fixed_flags_are_refused_with_the_reason(arg: str) -> None:
    assert vllm_flag_conflict(arg) is not None


@pytest.mark.parametrize("arg", ["--enable-prefix-caching", "-O", "value", "-", "--"])
def test_other_flags_and_values_pass(arg: str) -> None:
    assert vllm_flag_conflict(arg) is None


@pytest.mark.parametrize("arg", ["--attention-backend", "--attention_backend=FLASH_ATTN", "--attention-backend=X"])
def test_the_attention_backend_is_t4serves(arg: str) -> None:
    problem = vllm_flag_conflict(arg)
    assert problem is not None and "T4SERVE_ATTENTION" in problem


@pytest.mark.parametrize(
    ("arg", "following", "needle"),
    [
        ("--load-format", "dummy", "random weights"),
        ("--load_format=DUMMY", None, "random weights"),
        ("--load-format", "fastsafetensors", "leaves fastsafetensors out"),
        ("--load-format=instanttensor", None, "leaves instanttensor out"),
    ],
)
def test_load_formats_the_image_cannot_serve_are_refused(arg: str, following: str | None, needle: str) -> None:
    why = refused_value(arg, following)
    assert why is not None and needle in why


@pytest.mark.parametrize(
    ("arg", "following"),
    [
        ("--speculative-config", '{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4}'),
        ('--speculative_config={"method":"ngram","num_speculative_tokens":3}', None),
        ("-sc", '{"model": "[ngram]", "num_speculative_tokens": 3}'),
        ("--speculative-config.method", "ngram"),
        ("--speculative-config.method=NGRAM", None),
        ("--speculative", '{"method": "ngram"}'),
    ],
)
def test_cpu_ngram_speculation_is_refused_because_the_image_has_no_numba(arg: str, following: str | None) -> None:
    why = refused_value(arg, following)
    assert why is not None and "numba" in why and "ngram_gpu" in why


@pytest.mark.parametrize(
    ("arg", "following"),
    [
        ("--speculative-config", '{"method": "ngram_gpu", "num_speculative_tokens": 4}'),
        ("--speculative-config", '{"method": "eagle3", "model": "ngram"}'),  # method wins over model, as in vLLM
        ("--speculative-config", "not json"),  # vLLM's own parser names it
        ("--speculative-config", '["ngram"]'),
        ("--speculative-config.num-speculative-tokens", "ngram"),
        ("--speculative-config", None),
        ("-sc", '{"method": "' + "[" * 100 + '"}'),
    ],
)
def test_other_speculative_configs_pass(arg: str, following: str | None) -> None:
    assert refused_value(arg, following) is None


def test_the_default_load_formats_pass() -> None:
    assert refused_value("--load-format", "safetensors") is None
    assert refused_value("--load-format", "auto") is None
    assert refused_value("--quantization", "dummy") is None


def test_spelling_rules() -> None:
    assert canonical_flag("--Max_Num_Seqs") == "--max-num-seqs"
    assert names_flag("--max-num", "--max-num-seqs") and not names_flag("--m", "--max-num-seqs")
