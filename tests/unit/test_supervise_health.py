"""healthcheck: healthy only when the state says ready and /health + /v1/models answer; fast to start."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

from local_http import Canned, serve
from serve_states import state_at

from t4serve.supervise.health import check
from t4serve.supervise.state import CanaryRecord, write_state

MODELS = {"object": "list", "data": [{"id": "gemma", "object": "model"}]}


def test_loading_phase_is_not_ready_and_says_phase_elapsed_and_estimate(tmp_path: Path) -> None:
    state = replace(state_at(1, "loading_weights"), estimate_seconds=200.0, estimate_phases={"loading_weights": 100.0})
    write_state(tmp_path, state)
    code, line = check(tmp_path, now=1000.0 + 70.0)
    assert code == 1
    assert line == "not ready: loading weights for 1m00s (1m10s since vLLM started, attempt 1); estimated 40s to ready"


def test_ready_and_answering_is_healthy(tmp_path: Path) -> None:
    with serve({"/health": Canned(), "/v1/models": Canned(body=MODELS)}) as server:
        write_state(tmp_path, state_at(server.port, "ready"))
        assert check(tmp_path, timeout=2.0) == (0, f"ready: gemma answers on port {server.port}")


def test_ready_but_model_not_listed(tmp_path: Path) -> None:
    with serve({"/health": Canned(), "/v1/models": Canned(body={"data": [{"id": "other"}]})}) as server:
        write_state(tmp_path, state_at(server.port, "ready"))
        code, line = check(tmp_path, timeout=2.0)
    assert code == 1 and "does not list 'gemma'" in line and "['other']" in line


def test_ready_but_engine_dead_or_hung(tmp_path: Path) -> None:
    with serve({"/health": Canned(status=503), "/v1/models": Canned(body=MODELS)}) as server:
        write_state(tmp_path, state_at(server.port, "ready"))
        code, line = check(tmp_path, timeout=2.0)
    assert code == 1 and "HTTP 503" in line
    with serve({"/health": Canned(delay=1.0), "/v1/models": Canned(body=MODELS)}) as server:
        write_state(tmp_path, state_at(server.port, "ready"))
        began = time.monotonic()
        code, line = check(tmp_path, timeout=0.3)
        assert time.monotonic() - began < 1.0
    assert code == 1 and "did not answer within 0.3 s" in line


def test_canary_failure_and_death_report_reason(tmp_path: Path) -> None:
    canary = CanaryRecord(False, "17*23=", "<pad>", "wrong answer", "float16 overflow ...", 0.2)
    failed_canary = replace(
        state_at(1, "canary_failed"), reason="canary failed: wrong answer", fix="float16 overflow", canary=canary
    )
    write_state(tmp_path, failed_canary)
    assert check(tmp_path) == (1, "unhealthy: canary failed: wrong answer; hint: float16 overflow")
    dead = replace(
        state_at(1, "failed"), reason="vLLM exited with code 1 while loading weights", diagnosis="CUDA OOM", fix="lower"
    )
    write_state(tmp_path, dead)
    assert check(tmp_path) == (1, "unhealthy: vLLM exited with code 1 while loading weights; CUDA OOM; fix: lower")


def test_no_state_file_is_unhealthy_not_a_crash(tmp_path: Path) -> None:
    code, line = check(tmp_path)
    assert code == 1 and "state file not found" in line


def test_start_time_of_the_command(tmp_path: Path) -> None:
    """The whole `python -m t4serve healthcheck` process, cold, as Docker runs it every interval."""
    write_state(tmp_path, state_at(1, "profiling", t0=time.time()))
    env = {**os.environ, "T4SERVE_STATE_DIR": str(tmp_path)}
    began = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "t4serve", "healthcheck"], capture_output=True, text=True, env=env,
                         timeout=30)  # fmt: skip
    elapsed = time.monotonic() - began
    print(f"\nt4serve healthcheck wall time (process start to exit): {elapsed * 1000:.0f} ms")
    assert out.returncode == 1
    assert out.stderr.startswith("t4serve healthcheck: not ready: profiling / KV allocation for ")
    assert "torch" not in out.stderr and elapsed < 5.0
    probe = (
        "import sys, t4serve.cli; t4serve.cli.main(['healthcheck']); "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'vllm', 'pynvml')))"
    )
    mods = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=30)
    assert mods.stdout.strip() == "[]"


API_KEY = "sk-health-SECRET-key"


def test_the_api_key_goes_to_v1_models_and_a_401_names_the_variable(tmp_path: Path) -> None:
    routes = {"/health": Canned(), "/v1/models": Canned(body=MODELS)}
    with serve(routes, api_key=API_KEY) as server:
        write_state(tmp_path, state_at(server.port, "ready"))
        assert check(tmp_path, timeout=2.0, api_key=API_KEY)[0] == 0
        keyless = check(tmp_path, timeout=2.0)
        wrong = check(tmp_path, timeout=2.0, api_key="sk-wrong")
    assert [p for p, _ in server.requests] == ["/health", "/v1/models"] * 3
    assert server.authorizations[1::2] == [f"Bearer {API_KEY}", None, "Bearer sk-wrong"]
    assert keyless[0] == 1 and "HTTP 401 Unauthorized to no API key" in keyless[1]
    assert "T4SERVE_API_KEY_FILE" in keyless[1]
    assert wrong[0] == 1 and "a key that the server refuses" in wrong[1] and "sk-wrong" not in wrong[1]


def test_the_command_reads_the_key_from_its_file_and_an_unusable_file_is_exit_1(tmp_path: Path) -> None:
    key_file = tmp_path / "api_key"
    key_file.write_text(API_KEY + "\n")
    state_dir = tmp_path / "state"
    state_dir.mkdir()
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("T4SERVE_", "VLLM_API_KEY"))}
    with serve({"/health": Canned(), "/v1/models": Canned(body=MODELS)}, api_key=API_KEY) as server:
        write_state(state_dir, state_at(server.port, "ready"))

        def run(**env: str) -> subprocess.CompletedProcess[str]:
            full = {**clean, "T4SERVE_STATE_DIR": str(state_dir), **env}
            return subprocess.run([sys.executable, "-m", "t4serve", "healthcheck"], capture_output=True, text=True,
                                  env=full, timeout=30)  # fmt: skip

        from_file = run(T4SERVE_API_KEY_FILE=str(key_file))
        from_vllm_variable = run(VLLM_API_KEY=API_KEY)
        missing = run(T4SERVE_API_KEY_FILE=str(tmp_path / "absent"))
        keyless = run()
    assert from_file.returncode == 0, from_file.stderr
    assert from_vllm_variable.returncode == 0, from_vllm_variable.stderr
    assert missing.returncode == 1
    assert missing.stderr.startswith("t4serve healthcheck: cannot read the API key: T4SERVE_API_KEY_FILE=")
    assert "does not exist" in missing.stderr
    assert keyless.returncode == 1 and "401" in keyless.stderr
    for done in (from_file, from_vllm_variable, missing, keyless):
        assert API_KEY not in done.stdout + done.stderr
