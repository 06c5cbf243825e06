"""`t4serve serve` run in this process up to the point where it would start supervisord.

`serve_until_supervisord(tmp_path, monkeypatch, env)` sets a clean t4serve environment (this machine's facts,
T4SERVE_PREFLIGHT=warn, folders under tmp_path) plus `env`, and replaces `pid1.run` by a recorder: a TEST DOUBLE
for supervisord that keeps the argv and environment it would have been given. The caller then runs
`main(["serve"])` and reads the printed output and the files serve wrote in the returned state folder.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from t4serve.commands import serve
from t4serve.config.settings import VARIABLES


def serve_until_supervisord(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, env: dict[str, str]
) -> tuple[Path, dict[str, Any]]:
    for var in VARIABLES:
        monkeypatch.delenv(var.name, raising=False)
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    state_dir = tmp_path / "state"
    base = {
        "HF_HOME": str(tmp_path / "hf"),
        "HF_HUB_OFFLINE": "1",
        "T4SERVE_PREFLIGHT": "warn",
        "T4SERVE_MANIFEST": str(tmp_path / "no-manifest.json"),
        "T4SERVE_STATE_DIR": str(state_dir),
        "T4SERVE_CACHE_DIR": str(tmp_path / "cache"),
        "TMPDIR": str(tmp_path),
    }
    for name, value in {**base, **env}.items():
        monkeypatch.setenv(name, value)
    started: dict[str, Any] = {}

    def record(argv: list[str], state: Path, environ: dict[str, str]) -> int:
        started.update(argv=argv, env=environ)
        return 0

    monkeypatch.setattr(serve.shutil, "which", lambda name: f"/usr/bin/{name}")
    monkeypatch.setattr(serve.pid1, "run", record)
    return state_dir, started
