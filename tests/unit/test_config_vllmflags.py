"""t4serve.config.vllmflags: which T4SERVE_VLLM_ARGS flags are refused, and why, in every spelling vLLM's parser
accepts (the arguments read by t4serve.config.vllmargv, as tests/unit/test_config_vllmargv.py checks)."""

from __future__ import annotations

import pytest

from t4serve.config import kvflags, vllmflags
from t4serve.config.vllmargv import flag_table
from t4serve.config.vllmflags import canonical_flag, is_secret_flag, names_flag, refused_flags, vllm_flag_refusal


def refusal(*args: str) -> str | None:
    found = refused_flags(args)
    return None if found is None else found.reason


@pytest.mark.parametrize("args", [("--max-model-len", "1"), ("--max_model_len=4096",), ("--max-model", "1"),
                                  ("--max-model-l=1",), ("--enforce-eager", "--max-model-len", "8", "--seed", "1")])
def test_a_controlled_flag_is_refused_with_its_variable_in_every_spelling(args: tuple[str, ...]) -> None:
    found = refused_flags(args)
    assert found is not None and "use T4SERVE_MAX_MODEL_LEN instead" in found.reason
    assert found.variable == "T4SERVE_MAX_MODEL_LEN"


@pytest.mark.parametrize("args", [("--api-key", "x"), ("--api_key=x",), ("--hf-token",), ("--api-k", "x"),
                                  ("--hf-token=x",)])
def test_a_secret_flag_names_the_environment_route_not_the_value(args: tuple[str, ...]) -> None:
    why = refusal(*args)
    assert why is not None and "secret would show in `ps`" in why and "x" not in why.split(":")[0]
    assert is_secret_flag(args[0].split("=")[0])


@pytest.mark.parametrize("args", [("-tp", "2"), ("-t", "2"), ("--tensor-parallel-size=2",), ("--tensor_p", "2"),
                                  ("--kv-cache-dtype", "fp8"), ("-q", "awq"), ("-qawq",), ("--quantization=awq",),
                                  ("--hf-overrides.text_config.num_hidden_layers", "2"), ("--headless",),
                                  ("--help",), ("-h",), ("--help=all",)])
def test_owned_fixed_and_supervision_flags_are_refused_in_every_spelling(args: tuple[str, ...]) -> None:
    assert refusal(*args) is not None


@pytest.mark.parametrize("args", [("--enable-prefix-caching",), ("-O3",), ("--seed", "1"),
                                  ("--tokenizer-mode", "slow")])
def test_other_flags_pass(args: tuple[str, ...]) -> None:
    assert refusal(*args) is None


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("--load-format", "dummy"), "random weights"),
        (("--load_format=DUMMY",), "random weights"),
        (("--load-f", "fastsafetensors"), "leaves fastsafetensors out"),
        (("--load-format=instanttensor",), "leaves instanttensor out"),
    ],
)
def test_load_formats_the_image_cannot_serve_are_refused(args: tuple[str, ...], needle: str) -> None:
    why = refusal(*args)
    assert why is not None and needle in why


@pytest.mark.parametrize(
    "args",
    [
        ("--speculative-config", '{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4}'),
        ('--speculative_config={"method":"ngram","num_speculative_tokens":3}',),
        ("-sc", '{"model": "[ngram]", "num_speculative_tokens": 3}'),
        ("--speculative-config.method", "ngram"),
        ("-sc.method=ngram",),
        ("--speculative-config", '{"method": "ngram_gpu", "num_speculative_tokens": 4}'),
        ("--speculative-config", "not json"),
        ("--speculative-config.num-speculative-tokens", "ngram"),
        ("-sc", '{"method": "' + "[" * 100 + '"}'),
        ("--spec-method", "mtp"),
    ],
)
def test_every_speculative_config_is_t4serve_speculatives(args: tuple[str, ...]) -> None:
    """The plan writes --speculative-config for T4SERVE_SPECULATIVE (and sizes its drafter): any the user passes, in
    any spelling or value, is refused with that variable, before the value is read."""
    why = refusal(*args)
    assert why is not None and "use T4SERVE_SPECULATIVE instead" in why


def test_a_flag_that_leaves_the_server_unready_is_refused_and_its_off_switch_passes() -> None:
    """vLLM 0.34's --checkpoint-prepare-on-startup serves nothing until a checkpoint restore."""
    why = refusal("--checkpoint-prepare-on-startup")
    assert why is not None and "/checkpoint/restore" in why
    assert refusal("--no-checkpoint-prepare-on-startup") is None


def test_the_default_load_formats_pass() -> None:
    assert refusal("--load-format", "safetensors") is None
    assert refusal("--load-format", "auto") is None


def test_every_flag_a_policy_table_names_is_one_of_vllms() -> None:
    """A vLLM that renames or drops a flag fails here (the table comes from the image's vLLM), not silently."""
    named = [*vllmflags.CONTROLLED_FLAGS, *vllmflags.FIXED_FLAGS, *vllmflags.SUPERVISION_FLAGS,
             *vllmflags.REFUSED_FLAG_VALUES, *kvflags.REFUSED_KV_FLAGS, kvflags.EXTENSIBLE_KV_CACHE,
             kvflags.BLOCK_SIZE_FLAG]  # fmt: skip
    table = flag_table()
    assert [f for f in named if f not in table.by_option] == []
    assert {d for d in kvflags.SWITCHES} <= {a.dest for a in table.actions}


@pytest.mark.parametrize("args", [("--attention-backend", "X"), ("--attention-b", "X"), ("--attention_backend=X",),
                                  ("--attention-backe=FLASH_ATTN",), ("--enforce-eager", "--attention-backend", "X")])
def test_the_attention_backend_is_t4serves_in_every_spelling(args: tuple[str, ...]) -> None:
    """T4SERVE_ATTENTION owns `--attention-backend` with one entry of CONTROLLED_FLAGS; the reading does the rest."""
    found = refused_flags(args)
    assert found is not None and found.variable == "T4SERVE_ATTENTION" and "--attention-backend" in found.reason


def test_owning_one_more_flag_is_one_entry(monkeypatch: pytest.MonkeyPatch) -> None:
    # A setting that exists stands for the one a new entry would name.
    monkeypatch.setitem(vllmflags.CONTROLLED_FLAGS, "--enable-prefix-caching", "T4SERVE_COMPILE")
    for args in (("--enable-prefix-caching",), ("--enable-prefix",), ("--enable_prefix_caching",),
                 ("--no-enable-prefix-caching",), ("--disable-prefix-caching",)):
        found = refused_flags(args)
        assert found is not None and found.variable == "T4SERVE_COMPILE", args


def test_an_option_after_the_image_name_is_named_by_what_vllm_reads() -> None:
    assert vllm_flag_refusal("-t") is not None and "one GPU" in str(vllm_flag_refusal("-t"))
    assert vllm_flag_refusal("--max-model-l=5") is not None
    assert vllm_flag_refusal("--enable-prefix-caching") is None and vllm_flag_refusal("--nonsense") is None


def test_spelling_rules() -> None:
    assert canonical_flag("--Max_Num_Seqs") == "--max-num-seqs"
    assert names_flag("--max-num", "--max-num-seqs") and not names_flag("--m", "--max-num-seqs")
