"""t4serve.commands.status: the readout of a state file while loading, when ready (vLLM's figures beside the plan's
predictions) and after a failure, `--json`, and the listener's exit request."""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path

import pytest
from serve_states import state_at

from t4serve.cli import main
from t4serve.supervise.readout import render_status
from t4serve.supervise.state import ExitRequest, Figure, Prediction, write_exit_request, write_state


def test_loading_with_and_without_an_estimate() -> None:
    loading = state_at(8000, "loading_weights")
    text = render_status(loading, 1070.0)
    assert text.startswith("phase:    loading weights for 1m00s")
    assert "estimate: no past starts of this model on this GPU yet" in text
    timed = replace(loading, estimate_seconds=200.0, estimate_phases={"loading_weights": 100.0})
    assert "estimate: 40s to ready (past starts took 3m20s, median)" in render_status(timed, 1070.0)
    assert "  starting" in text and "phases:" in text


def test_ready_sets_figures_beside_predictions() -> None:
    ready = replace(
        state_at(8000, "ready"),
        figures={"kv_tokens": Figure("kv_tokens", 300_000, "tokens", "GPU KV cache size: 300,000 tokens")},
        predictions={
            "kv_tokens": Prediction("kv_tokens", 315_974, "tokens", "pool / block"),
            "max_concurrency": Prediction("max_concurrency", 19.29, "x", "315,974 / 16,384"),
        },
    )
    text = render_status(ready, 1100.0)
    assert "figures (vLLM's log):" in text
    assert "kv_tokens: measured 300,000.00 tokens, predicted 315,974.00 tokens (-5.1%; pool / block)" in text
    assert "predictions not yet logged by vLLM:\n  max_concurrency: 19.29 x (315,974 / 16,384)" in text
    assert "estimate:" not in text


def test_failed_shows_reason_diagnosis_fix_and_last_lines() -> None:
    failed = replace(state_at(8000, "failed"), reason="vLLM exited 1", diagnosis="CUDA out of memory",
                     fix="lower T4SERVE_GPU_MEMORY_UTILIZATION", last_lines=["Traceback", "torch.OutOfMemoryError"])
    text = render_status(failed, 1100.0)
    for line in ("reason:   vLLM exited 1", "diagnosis: CUDA out of memory", "fix:      lower T4SERVE_GPU_MEMORY",
                 "vLLM's last lines:\n  | Traceback\n  | torch.OutOfMemoryError"):  # fmt: skip
        assert line in text


def test_command_json_and_the_exit_request(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_state(tmp_path, state_at(8000, "ready", t0=time.time() - 30))
    assert main(["status", "--state-dir", str(tmp_path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["phase"] == "ready"
    write_exit_request(tmp_path, ExitRequest(1, "vLLM exited 4 times within 300 s", time.time()))
    assert main(["status", "--state-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("phase:    ready for ")
    assert "ending:   the container is exiting 1: vLLM exited 4 times within 300 s" in out
