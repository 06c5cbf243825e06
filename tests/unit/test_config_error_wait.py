"""`serve` after a configuration error under T4SERVE_ON_CONFIG_ERROR=wait (compose.yaml's setting): the error is
printed once and left in the state folder, healthcheck and status say so, and the process waits for a stop signal
before exiting 2, so Docker's `restart: unless-stopped` has no exit to restart. The default still exits at once.
The real `python -m t4serve` runs in a child process, as the image's PID 1 does."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from t4serve.contract import StatusAnswer, read_answer
from t4serve.supervise.health import check, check_liveness
from t4serve.supervise.state import CONFIG_ERROR_FILE

BAD = "T4SERVE_MAX_MODEL_LEN=nope (from --max-model-len): must be"


def start(state_dir: Path, *args: str, mode: str | None, **extra: str) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("T4SERVE_", "HF_"))}
    env["T4SERVE_STATE_DIR"] = str(state_dir)
    env.update(extra)
    if mode is not None:
        env["T4SERVE_ON_CONFIG_ERROR"] = mode
    return subprocess.Popen([sys.executable, "-m", "t4serve", *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)  # fmt: skip


def wait_for(path: Path, proc: subprocess.Popen[str], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert proc.poll() is None, f"exited {proc.returncode} instead of waiting: {proc.communicate()}"
        assert time.monotonic() < deadline, f"{path} never written"
        time.sleep(0.05)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_config_error_waits_for_a_stop_signal_then_exits_2(tmp_path: Path, sig: signal.Signals) -> None:
    proc = start(tmp_path, "--max-model-len", "nope", mode="wait")
    try:
        wait_for(tmp_path / CONFIG_ERROR_FILE, proc)
        time.sleep(0.5)
        assert proc.poll() is None, "serve exited instead of waiting"
        code, line = check(tmp_path)
        assert code == 1 and "stopped on a configuration error and waits" in line and BAD in line
        code, line = check_liveness(tmp_path)
        assert code == 0 and BAD in line  # a restart would meet the same setting
        # status reports it as the phase config_error, in text and as the typed answer the host reads.
        status = subprocess.run([sys.executable, "-m", "t4serve", "status", "--state-dir", str(tmp_path)],
                                capture_output=True, text=True, timeout=60)  # fmt: skip
        assert status.returncode == 0 and "stopped on a configuration error" in status.stdout and BAD in status.stdout
        # What recreates the container for each way it is started, not only compose v2's (issue 45).
        assert "`docker-compose -f compose.yaml up -d`" in status.stdout and "`docker run` again" in status.stdout
        typed = subprocess.run([sys.executable, "-m", "t4serve", "status", "--json", "--state-dir", str(tmp_path)],
                               capture_output=True, text=True, timeout=60)  # fmt: skip
        answer = read_answer(StatusAnswer, ["t4serve", "status", "--json"], typed.returncode, typed.stdout,
                             typed.stderr, "t4serve:dev")  # fmt: skip
        assert answer.phase == "config_error" and answer.state is None and answer.config_error is not None
        assert BAD in answer.config_error.what and answer.config_error.fix
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 2
    assert err.count(BAD) == 1, err
    assert "T4SERVE_ON_CONFIG_ERROR=wait: waiting for a stop signal instead of exiting" in err
    assert "`docker-compose -f compose.yaml up -d`" in err
    assert "Traceback" not in err


def test_the_flag_asks_for_the_wait_too(tmp_path: Path) -> None:
    proc = start(tmp_path, "serve", "--on-config-error", "wait", "--max-model-len", "nope", mode=None)
    try:
        wait_for(tmp_path / CONFIG_ERROR_FILE, proc)
        proc.terminate()
        proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 2


@pytest.mark.parametrize("mode", [None, "exit", "bogus"])
def test_otherwise_a_config_error_exits_at_once(tmp_path: Path, mode: str | None) -> None:
    proc = start(tmp_path, "--max-model-len", "nope", mode=mode)
    try:
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 2 and BAD in err
    assert not (tmp_path / CONFIG_ERROR_FILE).exists()
    if mode == "bogus":
        assert "T4SERVE_ON_CONFIG_ERROR=bogus: must be one of exit, wait" in err


def test_an_unknown_serve_option_is_a_config_error_that_waits(tmp_path: Path) -> None:
    proc = start(tmp_path, "--enable-prefix-caching", mode="wait")
    try:
        wait_for(tmp_path / CONFIG_ERROR_FILE, proc)
        proc.terminate()
        _, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 2 and "t4serve serve has no option --enable-prefix-caching" in err


def test_other_commands_never_wait(tmp_path: Path) -> None:
    proc = start(tmp_path, "plan", "--gpu", "t4", "--max-model-len", "nope", mode="wait")
    try:
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 2 and BAD in err


def test_an_unknown_variable_is_a_config_error_that_waits(tmp_path: Path) -> None:
    """A mistyped variable in compose's environment stops serve as any bad setting does (issue 45)."""
    proc = start(tmp_path, "serve", mode="wait", T4SERVE_MAX_MODELLEN="4096")
    try:
        wait_for(tmp_path / CONFIG_ERROR_FILE, proc)
        code, line = check(tmp_path)
        assert code == 1 and "T4SERVE_MAX_MODELLEN is not a t4serve variable" in line
        proc.terminate()
        proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 2
