"""T4SERVE_VLLM_ARGS read as the image's vLLM reads it. t4serve.config.vllmargv reads the arguments with a copy of
`vllm serve`'s option table (data/vllm-serve-flags.json) and its own rendering of vLLM's preprocessing and Python
3.13's argparse; here both are held to the image's vLLM: the table is the one `python -m t4serve.config.vllmargv
--check` reads from the installed vLLM, and for thousands of argument lists (every spelling: `=`, underscores,
abbreviations, `-O3`, dotted keys; and every fault: a dangling value-taking flag, an ambiguous or unknown flag, a
stray value, `--`) vLLM's own parser (tests/oracle/vllm_parse.py) and t4serve's reader accept and refuse the same
lists, and give the flags that matter to the plan the same values."""

from __future__ import annotations

import json
import random
import subprocess
from typing import Any

import pytest

from t4serve.config.vllmargv import flag_table, read_vllm_args

from .conftest import REPO

pytestmark = pytest.mark.image

PARSE_TIMEOUT_S = 600
CASES = 3000


def test_the_table_is_the_images_vllm(docker_bin: str, image_ref: str) -> None:
    """data/vllm-serve-flags.json is the image's vLLM's option table: regenerate it (scripts/vllm-flags) when the
    lock moves vLLM."""
    done = subprocess.run([docker_bin, "run", "--rm", "--network", "none", "--entrypoint", "python", image_ref, "-m",
                           "t4serve.config.vllmargv", "--check"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    answer = json.loads(done.stdout.strip().splitlines()[-1])
    assert answer["same"] is True and answer["installed"] == flag_table().vllm_version


# Flags whose values the comparison reads back, each with values vLLM's types accept.
SWITCHES = ("--enforce-eager", "--no-enforce-eager", "--enable-prefix-caching", "--no-enable-prefix-caching",
            "--disable-prefix-caching", "--async-scheduling", "--no-async-scheduling", "--disable-log-stats",
            "--enable-chunked-prefill", "--disable-chunked-prefill", "--trust-remote-code")  # fmt: skip
VALUED: dict[str, list[str]] = {
    "--attention-backend": ["TRITON_ATTN", "FLASH_ATTN", "FLEX_ATTENTION"],
    "--max-logprobs": ["0", "5", "-1", "20"],
    "--block-size": ["16", "32", "64"],
    "--seed": ["0", "7", "-3"],
    "--tokenizer-mode": ["auto", "slow"],
    "--chat-template": ["t.jinja", "{{ x }}", "-x y"],
    "--speculative-config": ['{"method": "ngram_gpu", "num_speculative_tokens": 3}', '{"method": "eagle3"}'],
    "-tp": ["1", "2"],
    "-q": ["awq", "gptq"],
}
MULTI = {"--served-model-name": ["a", "b", "c-d"]}
DESTS = ("enforce_eager", "enable_prefix_caching", "async_scheduling", "disable_log_stats", "enable_chunked_prefill",
         "trust_remote_code", "attention_backend", "max_logprobs", "block_size", "seed", "tokenizer_mode",
         "chat_template", "speculative_config", "tensor_parallel_size", "quantization", "served_model_name",
         "optimization_level", "hf_token")  # fmt: skip
INTS = {"max_logprobs", "block_size", "seed", "tensor_parallel_size"}


def abbreviations(option: str) -> list[str]:
    """Every prefix of `option` argparse expands to it alone (longest first), and one it cannot (ambiguous)."""
    table = flag_table()
    own = table.by_option[option]
    unique = [option[:n] for n in range(len(option) - 1, 2, -1)
              if {a for o, a in table.by_option.items() if o.startswith(option[:n])} == {own}]
    return unique


def spell(rng: random.Random, option: str) -> str:
    """`option` as a user may write it: whole, with underscores, or abbreviated."""
    choice = rng.random()
    if option.startswith("--") and choice < 0.25:
        return "--" + option[2:].replace("-", "_")
    if choice < 0.5:
        short = abbreviations(option)
        if short:
            return rng.choice(short)
    return option


def one_flag(rng: random.Random) -> list[str]:
    kind = rng.random()
    if kind < 0.3:
        return [spell(rng, rng.choice(SWITCHES))]
    if kind < 0.75:
        option = rng.choice(sorted(VALUED))
        value = rng.choice(VALUED[option])
        written = spell(rng, option)
        if written.startswith("--") and rng.random() < 0.3:
            return [f"{written}={value}"]
        return [written, value]
    if kind < 0.85:
        return [spell(rng, "--served-model-name"), *rng.sample(MULTI["--served-model-name"], rng.randint(1, 3))]
    if kind < 0.92:
        return [rng.choice(["-O3", "-O0", "-O=2", "-O", "--optimization-level"]), *(["1"] if rng.random() < 0.5
                                                                                 else [])]
    if kind < 0.96:
        key = rng.choice(["method", "num_speculative_tokens"])
        value = {"method": rng.choice(["ngram_gpu", "eagle3"]), "num_speculative_tokens": "4"}[key]
        return [f"--speculative-config.{key}", value] if rng.random() < 0.5 else [f"-sc.{key}={value}"]
    return ["--hf-token", *(["x"] if rng.random() < 0.5 else [])]


FAULTS = (
    lambda rng, argv: argv[:-1] if len(argv) > 1 and not argv[-1].startswith("-") else argv,  # a dangling flag
    lambda rng, argv: [*argv, rng.choice(["--attention", "--max-num", "--enable", "--no-async", "-d", "--disable"])],
    lambda rng, argv: [*argv, rng.choice(["--frobnicate", "--Enforce-eager", "-tp2", "-x", "--attention-backendx"])],
    lambda rng, argv: [*argv, "stray"],
    lambda rng, argv: [*argv, "--", "x"],
    lambda rng, argv: [*argv, rng.choice(["--hf-overrides.x", "--max-logprobs", "--block-size"])],
    lambda rng, argv: [rng.choice(["--max-logprobs", "--attention-backend"]), *argv],
    lambda rng, argv: [*argv, "--enforce-eager=1"],
)


def cases(count: int) -> list[list[str]]:
    rng = random.Random(44)
    out: list[list[str]] = []
    for _ in range(count):
        argv = [a for _ in range(rng.randint(1, 5)) for a in one_flag(rng)]
        if rng.random() < 0.35:
            argv = rng.choice(FAULTS)(rng, argv)
        out.append(argv)
    return out


def expected_values(argv: list[str]) -> dict[str, Any] | None:
    """What t4serve's reader says vLLM's namespace holds for DESTS (None: it refuses the list); dests the list does
    not set are left out."""
    read = read_vllm_args(argv)
    if read.problem is not None:
        return None
    values: dict[str, Any] = {}
    for dest in DESTS:
        last = read.last(dest)
        if last is None:
            continue
        if last.action.nargs == 0:
            values[dest] = last.switched_on
        elif dest == "served_model_name":
            values[dest] = list(last.values)
        elif dest == "speculative_config":
            values[dest] = json.loads(last.values[-1])
        elif dest in INTS:
            values[dest] = int(last.values[-1])
        elif dest == "hf_token":
            continue  # `--hf-token` alone stores argparse's const
        else:
            values[dest] = last.values[-1]
    return values


def test_vllms_parser_and_t4serves_reader_read_every_list_alike(docker_bin: str, image_ref: str) -> None:
    argvs = cases(CASES)
    lines = "".join(json.dumps(a) + "\n" for a in argvs)
    done = subprocess.run([docker_bin, "run", "-i", "--rm", "--network", "none", "-v", f"{REPO / 'tests'}:/t:ro",
                           "--entrypoint", "python", image_ref, "/t/oracle/vllm_parse.py", *DESTS], input=lines,
                          capture_output=True, text=True, timeout=PARSE_TIMEOUT_S)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    answers = [json.loads(line) for line in done.stdout.splitlines()]
    assert len(answers) == len(argvs)
    disagreements = []
    refused = 0
    for argv, answer in zip(argvs, answers, strict=True):
        mine = expected_values(argv)
        refused += mine is None
        if (mine is None) != (not answer["ok"]):
            disagreements.append(f"{argv}: vLLM {'accepts' if answer['ok'] else answer['error']}, t4serve "
                                 f"{'accepts' if mine is not None else read_vllm_args(argv).problem}")
            continue
        if mine is not None:
            theirs = {k: answer["values"][k] for k in mine}
            if {k: str(v) for k, v in theirs.items()} != {k: str(v) for k, v in mine.items()}:
                disagreements.append(f"{argv}: vLLM {theirs}, t4serve {mine}")
    print(f"{len(argvs)} argument lists, {refused} refused by both, {len(disagreements)} read differently")
    assert not disagreements, "\n".join(disagreements[:20])
    assert 0.1 < refused / len(argvs) < 0.6, "the cases must exercise both sides"
