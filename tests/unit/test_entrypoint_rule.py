"""The command table and the entrypoint rule of t4serve.cli: commands listed explicitly (internal ones hidden from
help), and a first argument that is no t4serve command run as a program (`docker run IMAGE echo hi`)."""

from __future__ import annotations

import os
import pkgutil
import subprocess
import sys
from pathlib import Path

import click
import pytest

import t4serve.commands
from t4serve import cli
from t4serve.cli import COMMANDS, INTERNAL_COMMANDS, main
from t4serve.config.settings import markdown_table


def run_t4serve(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`python -m t4serve ARGS` in a child process, so a real exec replaces it."""
    return subprocess.run([sys.executable, "-m", "t4serve", *args], capture_output=True, text=True, timeout=60,
                          env={**os.environ, **(env or {})})  # fmt: skip


def test_every_command_module_is_listed_once() -> None:
    modules = {info.name for info in pkgutil.iter_modules(t4serve.commands.__path__) if not info.name.startswith("_")}
    listed = [*COMMANDS.values(), *INTERNAL_COMMANDS.values()]
    assert sorted(listed) == sorted(modules)
    assert not set(COMMANDS) & set(INTERNAL_COMMANDS)
    for name, module in {**COMMANDS, **INTERNAL_COMMANDS}.items():
        command = cli.cli.get_command(click.Context(cli.cli), name)
        assert command is not None, module


def test_help_lists_the_commands_and_leaves_the_internal_ones_out(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    listing = out.split("Commands:", 1)[1].split("\n\n", 1)[0]
    listed = [line.split()[0] for line in listing.splitlines() if line.startswith("  ") and line.split()]
    assert listed == sorted(COMMANDS)
    for name in INTERNAL_COMMANDS:
        assert name not in listed
        # Named once, in the epilog, so a reader of a supervisord.conf finds what they are.
        assert name in out.split("Commands:", 1)[1]


@pytest.mark.parametrize("name", sorted(INTERNAL_COMMANDS))
def test_internal_commands_still_run(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([name, "--help"]) == 0
    assert f"Usage: t4serve {name}" in capsys.readouterr().out


def test_a_program_runs_in_place_of_t4serve() -> None:
    out = run_t4serve("echo", "hi")
    assert (out.returncode, out.stdout, out.stderr) == (0, "hi\n", "")
    # exec, not a child: the program's exit status is the process's own.
    assert run_t4serve("sh", "-c", "exit 7").returncode == 7


def test_a_program_by_path_and_its_arguments_pass_unchanged(tmp_path: Path) -> None:
    script = tmp_path / "show-args"
    script.write_text('#!/bin/sh\nfor a in "$@"; do printf "[%s]" "$a"; done\n')
    script.chmod(0o755)
    out = run_t4serve(str(script), "--help", "a b", "")
    assert out.returncode == 0, out.stderr
    assert out.stdout == "[--help][a b][]"


def test_main_execs_the_program_found_on_path(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    program = tmp_path / "bash"
    program.write_text("#!/bin/sh\n")
    program.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    calls: list[tuple[str, list[str]]] = []

    def execv(path: str, argv: list[str]) -> None:
        calls.append((path, argv))
        raise SystemExit(0)

    monkeypatch.setattr(os, "execv", execv)
    with pytest.raises(SystemExit):
        main(["bash", "-l"])
    assert calls == [(str(program), ["bash", "-l"])]


def test_t4serve_commands_win_over_programs_of_the_same_name() -> None:
    # /usr/bin/env exists; `env` is t4serve's command.
    out = run_t4serve("env", "--markdown")
    assert out.returncode == 0, out.stderr
    assert out.stdout == markdown_table()


def test_options_go_to_t4serve(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--version"]) == 0
    assert "t4serve" in capsys.readouterr().out


def test_neither_command_nor_program_is_a_usage_error(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    assert main(["servee"]) == 2
    err = capsys.readouterr().err
    assert "No such command 'servee' (did you mean `t4serve serve`?)" in err
    assert "neither a t4serve command, nor a program on PATH, nor a model" in err and "fix: `t4serve --help`" in err


def test_a_model_after_the_image_name_is_served(
    settings_free_env: None, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """`docker run IMAGE google/gemma-4-E2B-it --max-model-len 4096`, as vLLM's image takes a model: serve runs with
    it (here its preflight refuses: no GPU, and the hub is off), not "No such command"."""
    monkeypatch.setenv("T4SERVE_STATE_DIR", str(tmp_path / "state"))
    assert main(["google/gemma-4-E2B-it", "--max-model-len", "4096"]) == 3
    captured = capsys.readouterr()
    assert "google/gemma-4-E2B-it is not in" in captured.out and "No such command" not in captured.err
    assert "preflight failed" in captured.err


def test_serve_takes_the_model_as_its_argument(
    settings_free_env: None, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("T4SERVE_STATE_DIR", str(tmp_path / "state"))
    assert main(["serve", "google/gemma-4-E2B-it"]) == 3
    assert "google/gemma-4-E2B-it is not in" in capsys.readouterr().out
    assert main(["serve", "bf16", "--model", "qat"]) == 2
    err = capsys.readouterr().err
    assert "the model is given twice: the MODEL argument and --model" in err
    assert main(["serve", "not a model"]) == 2
    assert "T4SERVE_MODEL=not a model (from the MODEL argument): must be qat, bf16" in capsys.readouterr().err


def test_a_word_that_is_no_model_says_how_a_model_is_given(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    assert main(["./gemma"]) == 2
    err = capsys.readouterr().err
    assert "nor a model: it must be an existing directory holding config.json" in err
    assert "`--model MODEL`" in err


def test_a_file_that_cannot_be_executed_is_a_usage_error(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    plain = tmp_path / "notes.txt"
    plain.write_text("not a program\n")
    assert main([str(plain)]) == 2
    assert f"No such command {str(plain)!r}" in capsys.readouterr().err


def test_a_failing_exec_is_a_usage_error(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    # Executable bits on a file the kernel cannot run (no #! line, not ELF): execv fails with ENOEXEC.
    garbage = tmp_path / "garbage"
    garbage.write_bytes(b"\x00\x01\x02")
    garbage.chmod(0o755)
    assert main([str(garbage)]) == 2
    err = capsys.readouterr().err
    assert f"cannot run {str(garbage)!r}" in err and "Exec format error" in err


def test_an_option_first_is_serve_with_that_option(capsys: pytest.CaptureFixture[str]) -> None:
    """`docker run IMAGE --max-model-len ...` reaches serve's own option handling, as vLLM's image would."""
    assert main(["--max-model-len", "nope"]) == 2
    err = capsys.readouterr().err
    assert "T4SERVE_MAX_MODEL_LEN=nope (from --max-model-len): must be" in err
    assert main(["--max-model-len", "4096", "--gpu-memory-utilization", "0.8", "--help"]) == 0
    assert "Usage: t4serve serve [OPTIONS]" in capsys.readouterr().out


def test_the_group_options_stay_the_groups(capsys: pytest.CaptureFixture[str]) -> None:
    assert set(cli.GROUP_OPTIONS) == {o for p in cli.cli.params for o in p.opts} | {"-h", "--help"}
    assert main(["-h"]) == 0
    assert "Commands:" in capsys.readouterr().out


def test_an_unknown_serve_option_says_where_vllm_flags_go(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--enable-prefix-caching"]) == 2
    err = capsys.readouterr().err
    assert "t4serve serve has no option --enable-prefix-caching" in err
    assert "fix: if --enable-prefix-caching is a `vllm serve` flag: --vllm-args '--enable-prefix-caching ...'" in err
    # A shortened serve option is a typo of t4serve's own, with click's suggestions.
    assert main(["--max-model-le", "4096"]) == 2
    err = capsys.readouterr().err
    assert "no option --max-model-le (did you mean" in err and "--max-model-len" in err and "refuses" not in err


@pytest.mark.parametrize(
    ("args", "shown", "why"),
    [
        (["--tensor-parallel-size", "2"], "--tensor-parallel-size", "t4serve serves one GPU"),
        (["-tp", "2"], "-tp", "t4serve serves one GPU"),
        (["--quantization", "awq"], "--quantization", "pick a quantized checkpoint with T4SERVE_MODEL"),
        (["--hf-token=hf_notarealtokenvalue"], "--hf-token", "use HF_TOKEN or HF_TOKEN_FILE instead"),
        (["--api-key", "sk-notarealkey"], "--api-key", "use T4SERVE_API_KEY_FILE or T4SERVE_API_KEY instead"),
    ],
)
def test_a_vllm_flag_t4serve_owns_is_refused_with_its_reason(
    args: list[str], shown: str, why: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(args) == 2
    err = capsys.readouterr().err
    assert f"t4serve serve has no option {shown}" in err and "a `vllm serve` flag t4serve refuses: " in err
    assert why in err
    assert "notareal" not in err
