"""t4serve.contract: the answers the host reads from the container. Each `--json` command prints its dataclass and
the host reads it back whole; a failure is an engine error on the host that keeps the container's exit code and words;
an older image's answer (recorded here as the previous t4serve printed it) is an "upgrade the image" error, a newer one
an "upgrade t4serve" error."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from t4serve.contract import (
    CONTRACT,
    BenchRunsAnswer,
    ContainerFailure,
    Failure,
    ManifestAnswer,
    StatusAnswer,
    read_answer,
)
from t4serve.errors import EngineError
from t4serve.serde import to_dict

ARGV = ["t4serve", "status", "--json"]


def t4serve(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "t4serve", *args], capture_output=True, text=True, timeout=60,
                          env=env)  # fmt: skip


def test_every_command_answers_its_dataclass_and_the_host_reads_it_back(tmp_path: Path) -> None:
    import os

    env = {**os.environ, "T4SERVE_STATE_DIR": str(tmp_path / "state"), "T4SERVE_CACHE_DIR": str(tmp_path / "cache"),
           "T4SERVE_MANIFEST": str(tmp_path / "absent.json")}  # fmt: skip
    runs = t4serve("bench", "status", "--json", env=env)
    answer = read_answer(BenchRunsAnswer, ["t4serve", "bench", "status", "--json"], runs.returncode, runs.stdout,
                         runs.stderr, "t4serve:dev")  # fmt: skip
    assert answer.runs == [] and answer.root == str(tmp_path / "cache" / "bench") and answer.contract == CONTRACT
    manifest = t4serve("probe", "--manifest-only", "--json", env=env)
    read = read_answer(ManifestAnswer, ["t4serve", "probe"], manifest.returncode, manifest.stdout, manifest.stderr, "x")
    assert not read.manifest.present and "absent.json" in (read.manifest.error or "")
    # No state yet: exit 2, as in text, and the failure typed on stdout; on the host an engine error (exit 5).
    status = t4serve("status", "--json", env=env)
    assert status.returncode == 2
    with pytest.raises(ContainerFailure) as caught:
        read_answer(StatusAnswer, ARGV, status.returncode, status.stdout, status.stderr, "t4serve:dev")
    assert "state file not found" in caught.value.what and caught.value.fix
    assert caught.value.container_exit_code == 2 and caught.value.exit_code == EngineError.exit_code


# What t4serve before the contract answered: `status --json` printed the state file as is, and a command it lacks is
# click's usage error.
OLD_STATUS = json.dumps({"schema": 1, "phase": "ready", "started_at": 1.0, "attempt_started_at": 1.0,
                         "updated_at": 2.0, "attempt": 1, "model": "m", "served_model_name": "m", "host": "0.0.0.0",
                         "port": 8000, "gpu_name": None})  # fmt: skip
OLD_BENCH = ("Usage: t4serve bench [OPTIONS] COMMAND [ARGS]...\nTry 't4serve bench -h' for help.\n\n"
             "Error: No such command 'status'.\n")


@pytest.mark.parametrize(("code", "out", "err"), [(0, OLD_STATUS, ""), (2, "", OLD_BENCH), (0, "not json", ""),
                                                  (0, json.dumps({"contract": 0, "phase": "ready"}), "")])
def test_an_older_image_is_told_to_upgrade(code: int, out: str, err: str) -> None:
    with pytest.raises(EngineError) as caught:
        read_answer(StatusAnswer, ARGV, code, out, err, "t4serve:old")
    message = caught.value.message()
    assert "the image t4serve:old is older than this t4serve: upgrade the image" in message
    assert f"contract {CONTRACT}" in message and "scripts/build-image" in message
    assert f"exited {code}" in message


def test_a_newer_image_is_told_to_upgrade_the_host() -> None:
    with pytest.raises(EngineError) as caught:
        read_answer(StatusAnswer, ARGV, 0, json.dumps({"contract": CONTRACT + 1}), "", "t4serve:new")
    assert "upgrade t4serve on this host" in caught.value.what


def test_a_failure_keeps_the_containers_words_and_code_but_not_as_the_hosts_exit_code() -> None:
    fail = Failure("BenchError", 6, "bench measured nothing", "all 2 runs failed", "a server", "read report.md")
    with pytest.raises(ContainerFailure) as caught:
        read_answer(StatusAnswer, ARGV, 6, json.dumps(to_dict(fail)), "", "t4serve:dev")
    assert (caught.value.what, caught.value.found, caught.value.fix) == ("bench measured nothing",
                                                                          "all 2 runs failed", "read report.md")
    assert (caught.value.container_exit_code, caught.value.container_error) == (6, "BenchError")
    assert caught.value.exit_code == EngineError.exit_code


def test_an_answer_of_another_shape_is_an_engine_error_not_a_traceback() -> None:
    with pytest.raises(EngineError) as caught:
        read_answer(StatusAnswer, ARGV, 0, json.dumps({"contract": CONTRACT, "phase": "ready"}), "", "t4serve:dev")
    assert "is not the StatusAnswer of contract" in caught.value.what
