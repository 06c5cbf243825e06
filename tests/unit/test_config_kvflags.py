"""The flags that move vLLM's KV accounting: parsed in every spelling vLLM's parser takes, refused where not modelled,
and carried into the plan's KV figures (tests/image/test_kv_oracle_families.py checks those against vLLM's planner)."""

from __future__ import annotations

import pytest
from sample_facts import t4

from t4serve.config.kvflags import KVFlags, kv_flags, refused_kv_flags
from t4serve.config.settings import Settings
from t4serve.errors import ConfigError
from t4serve.facts import Facts
from t4serve.pipeline import ensure_model
from t4serve.planning.plan import Plan, plan


def settings(**env: str) -> Settings:
    return Settings.from_environ({"HF_HOME": "/nonexistent-hf-home", **env})


def plan_for(facts: Facts, **env: str) -> Plan:
    s = settings(**env)
    return plan(s, ensure_model(s, facts))


def flag(argv: tuple[str, ...], name: str) -> str | None:
    return argv[argv.index(name) + 1] if name in argv else None


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        ((), KVFlags()),
        (("--no-async-scheduling",), KVFlags(async_scheduling=False)),
        (("--no-async-sched",), KVFlags(async_scheduling=False)),  # an abbreviation argparse expands
        (("--no-async-scheduling", "--async-scheduling"), KVFlags()),  # the later flag wins
        (("--block-size", "32"), KVFlags(block_size=32)),
        (("--block_size=64",), KVFlags(block_size=64)),
        (("--disable-hybrid-kv-cache-manager",), KVFlags(hybrid_kv_cache_manager=False)),
        (("--disable-hybrid-kv-cache-manager", "--enable-hybrid-kv-cache-manager"), KVFlags()),
        (("--no-enable-chunked-prefill",), KVFlags(chunked_prefill=False)),
        (("--disable-chunked-prefill",), KVFlags(chunked_prefill=False)),
        (("--enforce-eager", "--enable-chunked-mm-input"), KVFlags()),
        (("--no-disable-hybrid-kv-cache-manager",), KVFlags()),
        (("--enable-chunked",), KVFlags()),  # `--enable-chunked-prefill` to argparse (and to vLLM)
        (("--block-size", "64", "--block_s=32"), KVFlags(block_size=32)),  # the last one, as vLLM takes it
    ],
)
def test_kv_flags_in_every_spelling(args: tuple[str, ...], expected: KVFlags) -> None:
    assert kv_flags(args) == expected
    assert refused_kv_flags(args) is None


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (("--disable-sliding-window",), "caps max_model_len at the window"),
        (("-dcp", "2"), "context parallelism"),
        (("--decode-context", "2"), "context parallelism"),
        (("--prefill-context-parallel-size=2",), "context parallelism"),
        (("--kv-transfer-config", "{}"), "KV connector"),
        (("--kv-offloading-size", "4"), "host tier"),
        (("--attention-config", '{"backend": "FLASH_ATTN"}'), "set T4SERVE_ATTENTION instead"),
        (("--attention-config.backend", "FLASH_ATTN"), "set T4SERVE_ATTENTION instead"),
        (("--block-size", "128"), "16, 32, 64"),
        (("--block-size=8",), "16, 32, 64"),
        (("--block-size", "32", "--block-s", "128"), "16, 32, 64"),
        (("--block-size", "big"), "whole number"),
    ],
)
def test_unmodelled_kv_flags_are_refused_with_the_reason(args: tuple[str, ...], words: str) -> None:
    refused = refused_kv_flags(args)
    assert refused is not None and words in refused[0]


def test_settings_refuse_them_naming_the_variable_and_the_fix() -> None:
    with pytest.raises(ConfigError) as exc:
        settings(T4SERVE_VLLM_ARGS="--enforce-eager --disable-sliding-window")
    text = str(exc.value)
    assert "T4SERVE_VLLM_ARGS" in text and "--disable-sliding-window" in text
    assert exc.value.fix is not None and "remove --disable-sliding-window" in exc.value.fix
    # vLLM 0.34 refuses it beside the --kv-cache-memory-bytes t4serve passes; its off switches change nothing there.
    with pytest.raises(ConfigError, match="T4SERVE_KV_CACHE_MEMORY_BYTES=profile"):
        settings(T4SERVE_VLLM_ARGS="--enable-extensible-kv-cache")
    for off in ("--no-enable-extensible-kv-cache", "--disable-extensible-kv-cache"):
        assert settings(T4SERVE_VLLM_ARGS=off).vllm_args == (off,)


def test_no_async_scheduling_shrinks_the_sliding_groups_in_the_plan() -> None:
    default = plan_for(t4(), T4SERVE_MODEL="bf16")
    sync = plan_for(t4(), T4SERVE_MODEL="bf16", T4SERVE_VLLM_ARGS="--no-async-scheduling")
    assert default.sizing is not None and sync.sizing is not None
    # One batch in flight instead of two: sliding layers hold 511 + 2048 tokens, not 511 + 4096.
    assert sync.sizing.kv_tokens.value > default.sizing.kv_tokens.value
    assert "ceil(min(512-1+2048, 16384)/32)+1" in sync.sizing.concurrency.how
    assert any("--no-async-scheduling" in n for n in sync.sizing.notes)
    assert sync.argv.count("--no-async-scheduling") == 1


def test_block_size_is_pinned_or_taken_from_the_flags() -> None:
    p = plan_for(t4(), T4SERVE_MODEL="bf16")
    assert flag(p.argv, "--block-size") == "16"
    big = plan_for(t4(), T4SERVE_MODEL="bf16", T4SERVE_VLLM_ARGS="--block-size 32")
    assert big.argv.count("--block-size") == 1 and flag(big.argv, "--block-size") == "32"
    assert big.sizing is not None and big.sizing.block_size == 32
    assert "block = 196,608 B" in big.sizing.concurrency.how


def test_disabled_hybrid_manager_roughly_halves_the_tokens() -> None:
    default = plan_for(t4(), T4SERVE_MODEL="bf16", T4SERVE_KV_CACHE_MEMORY_BYTES="3040935936")
    flat = plan_for(t4(), T4SERVE_MODEL="bf16", T4SERVE_KV_CACHE_MEMORY_BYTES="3040935936",
                    T4SERVE_VLLM_ARGS="--disable-hybrid-kv-cache-manager")
    assert default.sizing is not None and flat.sizing is not None
    assert default.sizing.kv_tokens.value == 315_974  # the published run
    ratio = default.sizing.kv_tokens.value / flat.sizing.kv_tokens.value
    assert 1.85 < ratio < 1.95


def test_chunked_prefill_off_batches_a_whole_request() -> None:
    """vLLM refuses max_num_batched_tokens below max_model_len without chunked prefill: the plan raises its own
    batched tokens to max_model_len, as vLLM's default does, and refuses a setting below it in vLLM's words."""
    p = plan_for(t4(), T4SERVE_MODEL="qat", T4SERVE_MAX_MODEL_LEN="8192",
                 T4SERVE_VLLM_ARGS="--no-enable-chunked-prefill")
    assert p.sizing is not None
    assert flag(p.argv, "--max-num-batched-tokens") == "8192"
    assert "chunked prefill off" in p.sizing.max_num_batched_tokens.how
    auto = plan_for(t4(), T4SERVE_MODEL="qat", T4SERVE_VLLM_ARGS="--no-enable-chunked-prefill")
    assert auto.sizing is not None
    assert int(auto.sizing.max_num_batched_tokens.value) == int(auto.sizing.max_model_len.value)
    refused = plan_for(t4(), T4SERVE_MODEL="qat", T4SERVE_MAX_MODEL_LEN="8192", T4SERVE_MAX_NUM_BATCHED_TOKENS="2048",
                       T4SERVE_VLLM_ARGS="--no-enable-chunked-prefill")
    assert refused.sizing is None and refused.sizing_error is not None
    assert "max_num_batched_tokens (2048) is smaller than max_model_len (8192)" in refused.sizing_error
    assert "T4SERVE_MAX_NUM_BATCHED_TOKENS=8192" in refused.sizing_error


def test_max_num_seqs_above_the_batched_tokens_is_refused_in_vllms_words() -> None:
    p = plan_for(t4(), T4SERVE_MODEL="qat", T4SERVE_MAX_NUM_SEQS="300", T4SERVE_MAX_NUM_BATCHED_TOKENS="256",
                 T4SERVE_MAX_MODEL_LEN="1024")
    assert p.sizing is None and p.sizing_error is not None
    assert "max_num_batched_tokens (256) must be greater than or equal to max_num_seqs (300)" in p.sizing_error


def test_chunked_prefill_off_caps_the_auto_length_at_the_batched_tokens() -> None:
    p = plan_for(t4(), T4SERVE_MODEL="qat", T4SERVE_MAX_NUM_BATCHED_TOKENS="2048",
                 T4SERVE_VLLM_ARGS="--no-enable-chunked-prefill")
    assert p.sizing is not None, p.sizing_error
    assert flag(p.argv, "--max-model-len") == "2048" and "chunked prefill off" in p.sizing.max_model_len.how
