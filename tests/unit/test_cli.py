"""The probe, plan, preflight and env commands through t4serve.cli.main: output and exit codes 0, 2 and 3."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from sample_facts import QAT_REPO, no_gpu, t4

from t4serve.cli import main
from t4serve.config.settings import markdown_table
from t4serve.facts import Facts

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def clean_env(settings_free_env: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """conftest's settings_free_env, and the state and temporary files under the test's folder."""
    monkeypatch.setenv("T4SERVE_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("TMPDIR", str(tmp_path))


def write(tmp_path: Path, facts: Facts) -> str:
    path = tmp_path / "facts.json"
    path.write_text(facts.to_json())
    return str(path)


def test_help_lists_the_commands(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    for name in ("env", "plan", "preflight", "probe"):
        assert name in out


def test_plan_gpu_t4_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--gpu", "t4", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    argv = data["plan"]["argv"]
    assert argv[:3] == ["vllm", "serve", QAT_REPO]
    assert argv[argv.index("--dtype") + 1] == "float16"
    assert data["plan"]["clamp_needed"] is True
    assert data["plan"]["sizing"]["kv_tokens"]["how"]
    assert data["settings"]["T4SERVE_MODEL"]["value"].startswith("qat")


def test_plan_human_summary_with_flags(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--gpu", "t4", "--model", "bf16", "--port", "8123"]) == 0
    out = capsys.readouterr().out
    assert "settings:" in out and "plan:" in out and "--port 8123" in out
    assert "T4SERVE_PORT" in out and "[set by flag]" in out


def test_bad_setting_exits_2(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("T4SERVE_GPU_MEMORY_UTILIZATION", "1.4")
    assert main(["plan", "--gpu", "t4"]) == 2
    err = capsys.readouterr().err
    assert "T4SERVE_GPU_MEMORY_UTILIZATION=1.4: must be a number in (0, 1], e.g. 0.9" in err


def test_bad_flag_value_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["preflight", "--max-model-len", "lots"]) == 2
    assert "T4SERVE_MAX_MODEL_LEN=lots (from --max-model-len)" in capsys.readouterr().err


def test_missing_facts_file_exits_2(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["plan", "--facts", str(tmp_path / "nope.json")]) == 2
    assert "cannot read the facts file" in capsys.readouterr().err


def test_preflight_on_this_gpu_less_machine_exits_3_with_the_fix(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["preflight"]) == 3
    out = capsys.readouterr().out
    first = out.splitlines()[0]
    assert first.startswith("FAIL  gpu")
    assert "docker run --gpus all" in out and "NVIDIA Container Toolkit" in out


def test_preflight_warn_mode_still_exits_3(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("T4SERVE_PREFLIGHT", "warn")
    assert main(["preflight", "--facts", write(tmp_path, no_gpu())]) == 3


def test_preflight_recorded_t4_passes(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["preflight", "--facts", write(tmp_path, t4()), "--json", "--hf-hub-offline", "0"]) == 0
    findings = json.loads(capsys.readouterr().out)
    assert findings and all(f["level"] != "fail" for f in findings)


def test_preflight_recorded_t4_offline_without_the_model_exits_3(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    assert main(["preflight", "--facts", write(tmp_path, t4())]) == 3
    assert "HF_HUB_OFFLINE=1" in capsys.readouterr().out


def test_probe_json_replays_through_plan_facts(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["probe", "--json"]) == 0
    recorded = capsys.readouterr().out
    facts = Facts.from_json(recorded)
    assert facts.to_json() == recorded
    path = tmp_path / "me.json"
    path.write_text(recorded)
    assert main(["plan", "--facts", str(path), "--gpu", "t4", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["plan"]["gpu"]["name"] == "Tesla T4"


def test_probe_human_summary(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["probe"]) == 0
    out = capsys.readouterr().out
    assert "gpu:" in out and "host:" in out and "model:" in out and "disk:" in out


def test_env_markdown_and_summary(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    assert main(["env", "--markdown"]) == 0
    assert capsys.readouterr().out == markdown_table()
    monkeypatch.setenv("HF_TOKEN", "hf_cliSECRET")
    assert main(["env"]) == 0
    out = capsys.readouterr().out
    assert "HF_TOKEN" in out and "<redacted>" in out and "hf_cliSECRET" not in out


API_KEY = "sk-cli-SECRET-api-key"


@pytest.mark.parametrize("source", ["env", "file", "file-flag"])
def test_the_api_key_is_in_no_output(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path, source: str
) -> None:
    key_file = tmp_path / "api_key"
    key_file.write_text(API_KEY + "\n")
    flags: list[str] = []
    if source == "env":
        monkeypatch.setenv("T4SERVE_API_KEY", API_KEY)
    elif source == "file":
        monkeypatch.setenv("T4SERVE_API_KEY_FILE", str(key_file))
    else:
        flags = ["--api-key-file", str(key_file)]
    runs = [["plan", "--gpu", "t4", "--json"], ["plan", "--gpu", "t4"], ["env"], ["preflight", "--json"],
            ["probe", "--json"]]  # fmt: skip
    for argv in runs:
        main([*argv, *flags])
        out, err = capsys.readouterr()
        assert API_KEY not in out + err, argv
    main(["plan", "--gpu", "t4", "--json", *flags])
    data = json.loads(capsys.readouterr().out)
    assert data["settings"]["T4SERVE_API_KEY"]["value"] == "<redacted>"
    assert "--api-key" not in data["plan"]["argv"] and "VLLM_API_KEY" not in data["plan"]["env"]


def test_api_key_in_vllm_args_exits_2_naming_the_file_variable(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("T4SERVE_VLLM_ARGS", f"--enforce-eager --api-key={API_KEY}")
    assert main(["plan", "--gpu", "t4"]) == 2
    out, err = capsys.readouterr()
    assert "must not contain --api-key" in err and "T4SERVE_API_KEY_FILE" in err
    assert API_KEY not in out + err


def test_plan_answers_in_one_line_first(capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 45: `plan` was 62 lines with no answer; now its first line is one, here for the published T4 VM's facts
    (QAT: 7.3 GiB usable, 4.6 GiB short of the load's need)."""
    facts = str(REPO / "entrypoint" / "t4serve" / "data" / "facts" / "t4-published.json")
    assert main(["plan", "--facts", facts]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first == (
        "answer: fits a Tesla T4 (15.000 GiB): 16,384-token requests, 30 at once (507,832 KV tokens); loading needs "
        "5 GiB more swap on this host (sudo scripts/setup-swap 5G)"
    )
    assert main(["plan"]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first == "answer: no answer: no GPU visible (plan for a known card with --gpu t4)"
