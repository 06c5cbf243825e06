"""Issue 44's report, items 6 to 9: T4SERVE_VLLM_ARGS read as vLLM's parser reads it, scripts/publish's kustomization
edit, one refusal of a checkpoint and of an over-long setting by every command, and tests/gpu/imagebox.py's doors
(tests/unit/test_imagebox.py holds those). Each failed on the code before the fix (see the commits).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from e2b_checkpoint import write_checkpoint
from hardening import SENTINEL, SENTINEL_TOKEN, Outcome, base_environ, record, run_cli, tried

AREA = "issue 44 items 6-9"


def _check(outcome: Outcome, allowed: set[int], label: str, **kwargs: Any) -> Outcome:
    tried(AREA)
    record(AREA, outcome, allowed, secrets=(SENTINEL, SENTINEL_TOKEN), label=label, **kwargs)
    return outcome


# 6. T4SERVE_VLLM_ARGS read as vLLM's parser reads it


@pytest.mark.parametrize("args", [
    "--attention-backend TRITON_ATTN --attention-b FLASH_ATTN",  # the plan took the first; vLLM the last
    "--attention-b FLASH_ATTN",  # an abbreviation argparse expands
    "--enforce-eager --attention_backend=FLASH_ATTN",
])  # fmt: skip
def test_the_attention_backend_is_t4serves_in_every_spelling(tmp_path: Path, args: str) -> None:
    """A control: since issue 43 T4SERVE_ATTENTION owns the flag (one entry of CONTROLLED_FLAGS), refused however
    vLLM's parser would read it."""
    env = {**base_environ(tmp_path), "T4SERVE_VLLM_ARGS": args, "T4SERVE_KV_CACHE_DTYPE": "int8"}
    outcome = _check(run_cli(["plan", "--gpu", "t4", "--json"], env), {2}, f"int8 with {args}")
    assert "(--attention-backend)" in outcome.err or "must not contain --attention-backend" in outcome.err
    assert "T4SERVE_ATTENTION" in outcome.err


@pytest.mark.parametrize(("args", "words"), [
    ("--max-logprobs", "--max-logprobs needs a value"),
    ("--enforce-eager --tokenizer-mode", "--tokenizer-mode needs a value"),
    ("--max-logprobs --enforce-eager", "another flag follows it"),
    ("--seed --enforce-eager", "another flag follows it"),
    ("--hf-overrides.text_config.x", "needs a value"),  # vLLM itself dies of an IndexError here
    ("--seed 1 2", "a value stands with no flag before it"),
    ("--max-num 4", "ambiguous"),
    ("--frobnicate", "is not a flag of vLLM 0.34.0"),
    ("--enforce-eager=1", "a value with `=`"),
    ("-- --enforce-eager", "ends vLLM's options"),
])  # fmt: skip
def test_what_vllms_parser_refuses_is_refused_before_it_starts(tmp_path: Path, args: str, words: str) -> None:
    """Each passed: vLLM would have exited with a usage error (or a traceback) after t4serve had started it."""
    env = {**base_environ(tmp_path), "T4SERVE_VLLM_ARGS": args}
    for command in (["env"], ["plan", "--gpu", "t4", "--json"], ["serve"]):
        outcome = _check(run_cli(command, env), {2}, f"T4SERVE_VLLM_ARGS={args} ({command[0]})")
        assert words in outcome.err and "fix: remove" in outcome.err, outcome.err[-600:]


@pytest.mark.parametrize(("args", "words"), [
    ("--max-model-l=4096", "T4SERVE_MAX_MODEL_LEN"),
    ("-t 2", "one GPU"),  # -tp to argparse
    ("--tensor_p 2", "one GPU"),
    ("-sc.method=ngram", "use T4SERVE_SPECULATIVE instead"),
    ("--help", "print its help and exit"),
    ("--hf_overr.text_config.num_hidden_layers 2", "edited config.json"),
])  # fmt: skip
def test_an_owned_or_refused_flag_is_refused_in_every_spelling_vllm_reads(tmp_path: Path, args: str,
                                                                         words: str) -> None:
    env = {**base_environ(tmp_path), "T4SERVE_VLLM_ARGS": args}
    outcome = _check(run_cli(["plan", "--gpu", "t4", "--json"], env), {2}, f"T4SERVE_VLLM_ARGS={args}")
    assert words in outcome.err and ("must not contain" in outcome.err or "must not use" in outcome.err)


# 8. One refusal of a checkpoint, and of a setting, by every command


@pytest.fixture(scope="module")
def e2b_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("e2b") / "checkpoint"
    write_checkpoint(folder, "bf16")
    return folder


def _with_max_positions(source: Path, target: Path, value: Any) -> Path:
    target.mkdir()
    for item in source.iterdir():
        (target / item.name).symlink_to(item)
    (target / "config.json").unlink()
    config = json.loads((source / "config.json").read_text())
    config["text_config"]["max_position_embeddings"] = value
    (target / "config.json").write_text(json.dumps(config))
    return target


# The commands that read a checkpoint and plan for it: each refuses the same checkpoint with exit 2.
CHECKPOINT_COMMANDS = (
    ["plan", "--gpu", "t4"], ["plan", "--gpu", "t4", "--json"], ["profiles", "--gpu", "t4"],
    ["profiles", "--gpu", "t4", "--json"], ["preflight"], ["preflight", "--json"], ["roofline"], ["serve"],
)  # fmt: skip


@pytest.mark.parametrize("value", [0, 2**63, "32768", -1, 1.5, [], True, 2**24 + 1])
def test_every_command_refuses_a_checkpoint_plan_refuses_with_exit_2(tmp_path: Path, e2b_folder: Path,
                                                                     value: Any) -> None:
    """profiles exited 0, listing every profile as not runnable; preflight and serve exited 3 (a failed check)."""
    checkpoint = _with_max_positions(e2b_folder, tmp_path / "bad", value)
    environ = {**base_environ(tmp_path), "T4SERVE_MODEL": str(checkpoint)}
    for args in CHECKPOINT_COMMANDS:
        outcome = _check(run_cli(args, environ), {2}, f"max_position_embeddings {value!r}: {' '.join(args)}")
        assert "cannot read the checkpoint" in outcome.err and "max_position_embeddings" in outcome.err, args
        assert "supervisord" not in outcome.text


def test_profiles_of_a_readable_checkpoint_still_lists_what_does_not_fit(tmp_path: Path, e2b_folder: Path) -> None:
    environ = {**base_environ(tmp_path), "T4SERVE_MODEL": str(e2b_folder)}
    outcome = _check(run_cli(["profiles", "--gpu", "t4", "--json"], environ), {0}, "readable checkpoint")
    rows = json.loads(outcome.out)["profiles"]
    assert any(r["runnable"] for r in rows) and any(not r["runnable"] for r in rows)


LONG = "x" * 120_000


@pytest.mark.parametrize("name", ["T4SERVE_SERVED_MODEL_NAME", "T4SERVE_VLLM_ARGS", "T4SERVE_MODEL", "HF_HOME",
                                  "T4SERVE_API_KEY", "T4SERVE_HOST", "T4SERVE_MAX_MODEL_LEN"])
def test_a_120000_character_setting_is_refused_by_every_command_in_a_short_message(tmp_path: Path, name: str) -> None:
    """A 120,000-character T4SERVE_SERVED_MODEL_NAME made a 2 MB `profiles --json` (every row quotes it)."""
    value = "--x=" + "a" * 119_996 if name == "T4SERVE_VLLM_ARGS" else LONG
    environ = {**base_environ(tmp_path), name: value}
    for args in (["env"], ["plan", "--gpu", "t4", "--json"], ["profiles", "--gpu", "t4", "--json"], ["preflight"],
                 ["serve"]):
        outcome = _check(run_cli(args, environ), {2}, f"{name} of 120,000 characters: {' '.join(args)}")
        assert f"{name}=" in outcome.err and "characters" in outcome.err, (args, outcome.err[:500])
        assert len(outcome.text) < 4000, (args, len(outcome.text))
        assert LONG[:1000] not in outcome.text


def test_the_mcp_profiles_tool_refuses_the_checkpoint_profiles_refuses(tmp_path: Path, e2b_folder: Path) -> None:
    from fake_engine import FakeEngine
    from test_mcp_tools import call, error_text, manifest_file, tool_env

    checkpoint = _with_max_positions(e2b_folder, tmp_path / "bad", 0)
    engine = FakeEngine(tmp_path, manifest=manifest_file())
    environ = {"HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}
    tried(AREA)
    result = call(tool_env(engine, environ), "profiles", {"model": str(checkpoint), "gpu_model": "t4"})
    text = error_text(result)
    record(AREA, Outcome(0, text, ""), {0}, label="MCP profiles, max_position_embeddings 0")
    assert "cannot read the checkpoint" in text and "max_position_embeddings" in text
    long_name = call(tool_env(engine, environ), "profiles", {"settings": {"T4SERVE_SERVED_MODEL_NAME": LONG}})
    assert "at most 256 characters" in error_text(long_name) and len(error_text(long_name)) < 5000
