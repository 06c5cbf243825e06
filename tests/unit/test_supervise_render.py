"""render: supervisord.conf against a golden file, `%` escaping, quoting, and the run spec drawn from a plan."""

from __future__ import annotations

import configparser
import os
import shlex
from pathlib import Path

from sample_facts import t4

from t4serve.config.settings import Settings
from t4serve.pipeline import ensure_model
from t4serve.planning.derived import Derived
from t4serve.planning.plan import plan as make_plan
from t4serve.supervise.render import (
    STOP_MARGIN_S,
    SupervisorInputs,
    conf_value,
    predicted_figures,
    predictions,
    render_supervisord_conf,
    run_spec,
)

GOLDEN = Path(__file__).parent / "golden" / "supervisord.conf"

INPUTS = SupervisorInputs(
    t4serve=("/opt/venv/bin/python", "-m", "t4serve"),
    state_dir="/tmp/t4serve",
    spec_path="/tmp/t4serve/run-spec.json",
    shutdown_timeout=30,
    max_restarts=3,
    restart_window=300,
    telemetry_host="0.0.0.0",
    telemetry_port=9400,
)


def _parse(text: str) -> configparser.RawConfigParser:
    parser = configparser.RawConfigParser(inline_comment_prefixes=None)
    parser.read_string(text)
    return parser


def test_matches_golden_file() -> None:
    text = render_supervisord_conf(INPUTS)
    if os.environ.get("T4SERVE_UPDATE_GOLDEN") == "1":
        GOLDEN.write_text(text)
    assert text == GOLDEN.read_text(), "rendered config changed; review it and rerun with T4SERVE_UPDATE_GOLDEN=1"


def test_stop_wait_exceeds_vllm_drain_and_logs_go_to_stdout() -> None:
    conf = _parse(render_supervisord_conf(INPUTS))
    vllm = conf["program:vllm"]
    assert int(vllm["stopwaitsecs"]) == 30 + STOP_MARGIN_S > 30
    assert vllm["killasgroup"] == "true"
    assert vllm["stdout_logfile"] == "/dev/stdout" and vllm["stdout_logfile_maxbytes"] == "0"
    assert conf["program:telemetry"]["autorestart"] == "unexpected"
    assert conf["program:telemetry"]["exitcodes"] == "0"
    assert conf["eventlistener:listener"]["events"] == "PROCESS_STATE_EXITED,PROCESS_STATE_FATAL"
    assert int(vllm["startretries"]) == 3


def test_percent_doubled_and_paths_quoted() -> None:
    inputs = SupervisorInputs(**{**INPUTS.__dict__, "state_dir": "/tmp/odd 50%dir", "spec_path": "/tmp/odd 50%dir/s"})
    conf = _parse(render_supervisord_conf(inputs))
    command = conf["program:vllm"]["command"]
    assert "50%%dir" in command
    # supervisord expands %% back to %, then shlex-splits the command.
    assert shlex.split(command.replace("%%", "%"))[-2:] == ["--spec", "/tmp/odd 50%dir/s"]
    assert conf_value("a%b%%") == "a%%b%%%%"


def test_telemetry_port_zero_drops_the_program() -> None:
    conf = _parse(render_supervisord_conf(SupervisorInputs(**{**INPUTS.__dict__, "telemetry_port": 0})))
    assert "program:telemetry" not in conf.sections()
    assert {"program:vllm", "eventlistener:listener"} <= set(conf.sections())


def test_run_spec_from_plan_carries_no_token_and_predictions() -> None:
    settings = Settings.from_environ({"HF_HOME": "/cache/huggingface/", "T4SERVE_CACHE_DIR": "/cache/t",
                                      "HF_TOKEN": "hf_rendertokennotreal", "T4SERVE_MODEL": "bf16"})  # fmt: skip
    plan = make_plan(settings, ensure_model(settings, t4()))
    spec = run_spec(plan, settings)
    assert [rung[0] for rung in spec.compile_ladder] == ["full", "lean", "o1", "eager"]
    assert spec.compile_ladder[0] == ["full"] and spec.compile_ladder[-1] == ["eager", "--enforce-eager"]
    assert spec.argv[:2] == ["vllm", "serve"] and spec.argv == list(plan.argv)
    assert spec.hf_hub_cache == "/cache/huggingface/hub"
    assert spec.gpu_name == "Tesla T4"
    assert plan.sizing is not None
    assert set(spec.predictions) == {"kv_tokens", "max_concurrency", "max_model_len", "model_memory_gib",
                                     "kv_cache_memory_gib"}  # fmt: skip
    assert spec.predictions["max_concurrency"].value == plan.sizing.concurrency.value
    assert spec.predictions["model_memory_gib"].unit == "GiB"
    assert spec.predictions["model_memory_gib"].value == plan.sizing.gpu_weights_bytes.value / 2**30
    assert "HF_TOKEN" not in spec.env and "hf_rendertokennotreal" not in repr(spec)
    figures = {
        "kv_tokens": Derived(315_974, "tokens", "2.832 GiB pool / 98,304 B per block x 32 tokens"),
        "max_concurrency": Derived(19.29, "x", "315,974 / 16,384"),
        "max_model_len": Derived(16384, "tokens", "setting", "setting"),
    }
    assert set(predictions(figures)) == {"kv_tokens", "max_concurrency", "max_model_len"}
    assert predictions(figures)["max_concurrency"].value == 19.29
    assert set(predicted_figures(plan.sizing)) == set(spec.predictions)
    assert predictions(None) == {}
