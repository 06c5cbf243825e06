"""healthcheck --liveness: restart a ready server that stopped answering /health, or a vLLM attempt that has loaded
for longer than the cold-start budget (a wedged reload); never one loading within it."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
from local_http import Canned, serve
from serve_states import state_at

from t4serve.config.aliases import MODEL_ALIASES
from t4serve.probes.checkpoint import builtin_facts
from t4serve.supervise.health import check_liveness, loading_bound_s
from t4serve.supervise.phases import LOADING_PHASES
from t4serve.supervise.startbudget import cold_start_budget
from t4serve.supervise.state import Prediction, write_state
from t4serve.units import fmt_duration


@pytest.mark.parametrize("phase", LOADING_PHASES)
def test_a_loading_server_is_alive_until_its_cold_start_budget_has_passed(tmp_path: Path, phase: str) -> None:
    # Port 1: nothing listens, as vLLM keeps its port closed while loading. A reload (attempt 2) that began at 1000 s.
    write_state(tmp_path, replace(state_at(1, phase), attempt=2))
    bound = loading_bound_s(state_at(1, phase))
    code, line = check_liveness(tmp_path, timeout=0.5, now=1000.0 + bound - 1)
    assert code == 0 and line.startswith("alive, loading: ")
    code, line = check_liveness(tmp_path, timeout=0.5, now=1000.0 + bound + 1)
    assert code == 1 and line.startswith("not alive: ") and line.endswith(": wedged"), line
    assert "attempt 2" in line and f"beyond the {fmt_duration(bound)}" in line


def test_the_loading_bound_is_the_larger_built_in_models_cold_start_budget() -> None:
    """The same figure the Kubernetes startupProbe is sized from (tests/unit/test_kubernetes.py): bf16's 1287 s."""
    bf16 = builtin_facts(MODEL_ALIASES["bf16"], "test")
    assert bf16 is not None
    assert loading_bound_s(state_at(1, "loading_weights")) == cold_start_budget(bf16.weight_bytes).total_seconds
    assert 1200 < loading_bound_s(state_at(1, "loading_weights")) < 1350
    # Another model's bound follows the weights the plan predicted for it, when they are larger.
    big = replace(state_at(1, "loading_weights"),
                  predictions={"model_memory_gib": Prediction("model_memory_gib", 40.0, "GiB", "plan")})  # fmt: skip
    assert loading_bound_s(big) == cold_start_budget(40 * 2**30).total_seconds


@pytest.mark.parametrize("phase", ["stopping", "failed", "canary_failed"])
def test_stopping_failed_and_canary_failed_are_left_to_their_own_handling(tmp_path: Path, phase: str) -> None:
    write_state(tmp_path, replace(state_at(1, phase), reason="why"))
    code, line = check_liveness(tmp_path, timeout=0.5, now=1070.0)
    assert code == 0 and line.startswith("alive: ") and "for 1m00s" in line


def test_ready_and_answering_health_is_alive_without_touching_v1(tmp_path: Path) -> None:
    with serve({"/health": Canned()}) as server:
        write_state(tmp_path, state_at(server.port, "ready"))
        assert check_liveness(tmp_path, timeout=2.0) == (0, f"alive: http://127.0.0.1:{server.port}/health answers")
    assert [p for p, _ in server.requests] == ["/health"]


def test_a_hung_ready_server_is_not_alive_within_the_timeout(tmp_path: Path) -> None:
    with serve({"/health": Canned(delay=2.0)}) as server:
        write_state(tmp_path, state_at(server.port, "ready"))
        began = time.monotonic()
        code, line = check_liveness(tmp_path, timeout=0.3)
        took = time.monotonic() - began
    assert code == 1 and "did not answer within 0.3 s" in line and line.endswith(": hung")
    assert took < 1.5


def test_a_dead_engine_is_not_alive(tmp_path: Path) -> None:
    with serve({"/health": Canned(status=503)}) as server:
        write_state(tmp_path, state_at(server.port, "ready"))
        code, line = check_liveness(tmp_path, timeout=2.0)
    assert code == 1 and "HTTP 503" in line and "engine is dead" in line


def test_no_state_file_is_not_alive(tmp_path: Path) -> None:
    code, line = check_liveness(tmp_path)
    assert code == 1 and "state file not found" in line


def test_the_command_flag_exits_0_while_loading_and_1_when_hung(tmp_path: Path) -> None:
    env = {**os.environ, "T4SERVE_STATE_DIR": str(tmp_path)}

    def run() -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "t4serve", "healthcheck", "--liveness", "--timeout", "0.3"],
                              capture_output=True, text=True, env=env, timeout=30)  # fmt: skip

    write_state(tmp_path, state_at(1, "compiling", t0=time.time()))
    loading = run()
    assert loading.returncode == 0 and loading.stdout.startswith("t4serve healthcheck: alive, loading: compiling")
    with serve({"/health": Canned(delay=2.0)}) as server:
        write_state(tmp_path, state_at(server.port, "ready", t0=time.time()))
        hung = run()
    assert hung.returncode == 1 and hung.stderr.startswith("t4serve healthcheck: not alive: ready, but ")
