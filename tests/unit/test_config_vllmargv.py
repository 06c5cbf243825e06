"""t4serve.config.vllmargv: T4SERVE_VLLM_ARGS read as vLLM 0.33's parser reads them, over the table of `vllm serve`'s
options (data/vllm-serve-flags.json). The reading itself is held to the image's vLLM by tests/image/test_vllm_argv.py
(thousands of argument lists through both); here, the rules one by one and the table against the lock."""

from __future__ import annotations

import json
import re
from importlib import resources

import pytest
from k8s_manifests import REPO

from t4serve.config.vllmargv import DATA_FILE, flag_table, read_vllm_args, resolve, table_text


def read(*args: str) -> list[tuple[str, tuple[str, ...]]]:
    found = read_vllm_args(args)
    assert found.problem is None, found.problem
    return [(o.option, o.values) for o in found.occurrences]


def problem(*args: str) -> str:
    found = read_vllm_args(args).problem
    assert found is not None
    return f"{found.written} {found.reason}"


def test_the_table_is_the_locked_vllms() -> None:
    """Moving the pin without regenerating the table (scripts/vllm-flags) fails here, on any machine."""
    pinned = re.search(r"^vllm==([^ ;\\]+)", (REPO / "docker" / "requirements.lock").read_text(), re.M)
    assert pinned is not None and flag_table().vllm_version == pinned.group(1)


def test_the_data_file_is_written_as_table_text_writes_it() -> None:
    text = resources.files("t4serve").joinpath("data", DATA_FILE).read_text()
    assert table_text(json.loads(text)) == text


@pytest.mark.parametrize(("args", "expected"), [
    (("--attention-backend", "X"), [("--attention-backend", ("X",))]),
    (("--attention-b", "X"), [("--attention-backend", ("X",))]),
    (("--attention_backend=X",), [("--attention-backend", ("X",))]),
    (("--attention-b=X", "--attention-backend", "Y"), [("--attention-backend", ("X",)),
                                                       ("--attention-backend", ("Y",))]),
    (("-tp", "2"), [("-tp", ("2",))]),
    (("-t", "2"), [("-tp", ("2",))]),  # the one option starting -t
    (("-qawq",), [("-q", ("awq",))]),  # a two-character option takes its value glued on
    (("-O3",), [("--optimization-level", ("3",))]),  # vLLM's own rewrite
    (("-O", "2"), [("--optimization-level", ("2",))]),
    (("-O=1",), [("--optimization-level", ("1",))]),
    (("--max-logprobs", "-1"), [("--max-logprobs", ("-1",))]),  # a negative number is a value
    (("--served-model-name", "a", "b", "--seed", "1"), [("--served-model-name", ("a", "b")), ("--seed", ("1",))]),
    (("--hf-token",), [("--hf-token", ())]),  # nargs "?"
    (("--chat-template", "-x y"), [("--chat-template", ("-x y",))]),  # a space: a value, not an option
    (("--no-enable-prefix-caching",), [("--no-enable-prefix-caching", ())]),
])  # fmt: skip
def test_flags_are_read_as_argparse_reads_them(args: tuple[str, ...], expected: list[tuple[str, tuple[str, ...]]]) \
        -> None:
    assert read(*args) == expected


def test_dotted_keys_are_merged_into_one_json_value_after_everything_else() -> None:
    got = read("--speculative-config.method", "ngram_gpu", "--seed", "1", "--speculative_config.num_speculative_tokens",
               "3", "--speculative-config", '{"method": "eagle3"}')
    assert got[0] == ("--seed", ("1",))
    assert got[1] == ("--speculative-config", ('{"method": "eagle3"}',))
    option, (value,) = got[2]
    assert option == "--speculative-config"
    assert json.loads(value) == {"method": "ngram_gpu", "num_speculative_tokens": 3}
    assert read_vllm_args(["--speculative-config.method", "x"]).last("speculative_config") is not None
    lists = read("--compilation-config.splitting_ops+", "a,b", "--compilation-config.splitting_ops+=c")
    assert json.loads(lists[0][1][0]) == {"splitting_ops": ["a", "b", "c"]}
    assert json.loads(read("--kv-cache-memory-bytes.x", "80g")[0][1][0]) == {"x": 80 * 10**9}


@pytest.mark.parametrize(("args", "words"), [
    (("--max-logprobs",), "--max-logprobs needs a value (--max-logprobs: expected one argument), and it ends"),
    (("--max-logprobs", "--seed", "1"), "another flag follows it"),
    (("--served-model-name", "--seed", "1"), "expected at least one argument"),
    (("--max-logprobs", "-x"), "another flag follows it"),
    (("--attention", "X"), "could be --attention-backend, --attention-config"),
    (("-d", "1"), "ambiguous"),
    (("--nope",), "is not a flag of vLLM 0.34.0's `vllm serve`"),
    (("--Enforce-Eager",), "vLLM's flags are lower case: --enforce-eager"),
    (("-tp2",), "is not a flag"),  # a three-character option takes no glued value
    (("--enforce-eager=yes",), "a value with `=`"),
    (("value",), "a value stands with no flag before it"),
    (("--", "--seed", "1"), "-- ends vLLM's options"),
    (("--a.b",), "needs a value: a dotted key"),
    (("-O",), "is not a flag"),
    (("--x.y", "[" * 5000 + "]" * 5000), "nests its value deeper"),
])  # fmt: skip
def test_what_vllms_parser_refuses_is_named(args: tuple[str, ...], words: str) -> None:
    assert words in problem(*args)


def test_a_problem_never_quotes_a_value() -> None:
    secret = "s3cr3t-value"
    for args in (("--seed", "1", secret), ("--max-logprobs", f"-{secret}"), ("--nope", secret)):
        found = read_vllm_args(args).problem
        assert found is not None and secret not in found.written + found.reason


def test_the_last_of_a_flag_wins_and_switches_say_which_way() -> None:
    found = read_vllm_args(["--enable-prefix-caching", "--disable-prefix-caching", "--block-size", "16",
                            "--block-size", "32"])
    switch = found.last("enable_prefix_caching")
    assert switch is not None and switch.switched_on is False
    block = found.last("block_size")
    assert block is not None and block.value == "32"


def test_resolve_names_the_option_one_argument_is() -> None:
    occurrence = resolve("--max-model-l=9")
    assert occurrence is not None and occurrence.option == "--max-model-len"
    assert resolve("--attention") is None and resolve("--nope") is None
