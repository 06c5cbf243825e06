"""serve: the secrets reach the supervised programs only through the environment handed to supervisord.

`t4serve serve` runs here up to the point where it would start supervisord (pid1.run is replaced by a recorder), on
this machine's facts with T4SERVE_PREFLIGHT=warn, so the printed output and every file it writes can be read.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from serve_here import serve_until_supervisord

from t4serve.cli import main
from t4serve.commands import serve
from t4serve.config.settings import VARIABLES, Settings

API_KEY = "sk-serve-SECRET-api-key"
TOKEN = "hf_serveSECRETtoken"


def test_child_environment_gets_vllm_api_key_and_leaves_the_caller_alone(tmp_path: Path) -> None:
    key_file = tmp_path / "api_key"
    key_file.write_text(API_KEY)
    environ = {"T4SERVE_API_KEY_FILE": str(key_file), "PATH": "/usr/bin"}
    settings = Settings.from_environ({**environ, "HF_HOME": str(tmp_path / "hf")})
    env = serve.child_environment(settings, environ)
    assert env["VLLM_API_KEY"] == API_KEY
    assert "VLLM_API_KEY" not in environ
    assert "VLLM_API_KEY" not in serve.child_environment(Settings.from_environ({}), {})


def test_serve_hands_the_key_to_supervisord_in_its_environment_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    key_file = tmp_path / "api_key"
    key_file.write_text(API_KEY + "\n")
    state_dir, started = serve_until_supervisord(
        tmp_path, monkeypatch, {"T4SERVE_API_KEY_FILE": str(key_file), "HF_TOKEN": TOKEN})
    assert main(["serve"]) == 0
    out, err = capsys.readouterr()
    assert started["env"]["VLLM_API_KEY"] == API_KEY and started["env"]["HF_TOKEN"] == TOKEN
    assert API_KEY not in " ".join(started["argv"])
    assert API_KEY not in out + err and TOKEN not in out + err
    written = sorted(p.name for p in state_dir.iterdir())
    assert {"run-spec.json", "state.json", "supervisord.conf"} <= set(written), written
    for path in state_dir.iterdir():
        text = path.read_text(encoding="utf-8")
        assert API_KEY not in text and TOKEN not in text, path.name
        assert "VLLM_API_KEY" not in text, path.name


def test_an_earlier_runs_state_is_gone_before_the_probes_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A state folder that outlived its container (an emptyDir across a container restart) held "ready" and the old
    listener's exit request: status must not read the state as this run's while serve probes the machine, and
    neither may survive a preflight failure."""
    from t4serve import pipeline

    for var in VARIABLES:
        monkeypatch.delenv(var.name, raising=False)
    state_dir = tmp_path / "state"
    state_dir.mkdir()
    (state_dir / "state.json").write_text('{"phase": "ready"}')
    (state_dir / "exit-request.json").write_text('{"code": 1, "reason": "an earlier run gave up", "requested_at": 1}')
    monkeypatch.setenv("T4SERVE_STATE_DIR", str(state_dir))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    seen: list[bool] = []
    real = pipeline.gather_facts

    def gather(*args: Any, **kwargs: Any) -> Any:
        seen.append((state_dir / "state.json").exists())
        return real(*args, **kwargs)

    monkeypatch.setattr(pipeline, "gather_facts", gather)
    main(["serve"])  # on this GPU-less machine preflight fails (strict) before supervisord
    capsys.readouterr()
    assert seen == [False]
    assert not (state_dir / "state.json").exists() and not (state_dir / "exit-request.json").exists()
