"""Issue 44's report, items 1 to 5 and 10: recorded facts files, the container's contract answers, redaction before
anything is cut, stored or shown, names and text from the container, state folder paths, and the MCP schemas,
errors and HTTP sessions. Each test failed on the code before the fix (the commits say how). What a container
prints is given as its bytes (FakeEngine.canned: an image other than this checkout's), read by the host's real code.
"""

from __future__ import annotations

import copy
import json
import logging
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from fake_engine import CACHE_DIR, FakeEngine
from hardening import REPO, Outcome, base_environ, record, run_cli, tried, wait_listening
from test_mcp_tools import API_KEY, HF_TOKEN, call, manifest_file, ok, serve_state, tool_env

from t4serve.contract import CONTRACT, Failure
from t4serve.host.engine import Completed, ServiceContainer
from t4serve.serde import to_dict

AREA = "issue 44 regressions"
SECRETS = (API_KEY, HF_TOKEN)
RUN = "20261203-101010-abcdef"


@pytest.fixture
def engine(tmp_path: Path) -> FakeEngine:
    """The Docker engine, its image this checkout's (test_mcp_tools' engine), a compose project beside it."""
    import shutil

    fake = FakeEngine(tmp_path, manifest=manifest_file(), state_on_up=serve_state("loading_weights"))
    fake.project_directory.mkdir()
    shutil.copy(REPO / "compose.yaml", fake.project_directory / "compose.yaml")
    return fake


@pytest.fixture
def environ(tmp_path: Path) -> dict[str, str]:
    """The MCP server's environment: the API key set, the HF token in compose's secret file."""
    secret = tmp_path / "hf_token"
    secret.write_text(HF_TOKEN)
    return {"HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf"), "HF_TOKEN_SECRET_FILE": str(secret),
            "T4SERVE_API_KEY": API_KEY}  # fmt: skip


def _check(outcome: Outcome, allowed: set[int], label: str) -> Outcome:
    tried(AREA)
    record(AREA, outcome, allowed, secrets=SECRETS, label=label)
    return outcome


def _tool(env: Any, name: str, args: dict[str, Any] | None = None, *, label: str) -> tuple[bool, str]:
    """A tool call through the SDK's client: (is an error, its text), recorded (no internal error, no secret)."""
    result = call(env, name, args)
    text = "\n".join(getattr(c, "text", "") for c in result.content)
    text += json.dumps(result.structured_content or {})
    bug = "internal error" in text or "Traceback" in text
    _check(Outcome(70 if bug else 0, text, ""), {0}, f"{name}: {label}")
    return bool(result.is_error), text


def _running(engine: FakeEngine) -> None:
    engine.container = ServiceContainer("c0ffee123456", "t4serve-t4serve-1", "running", "healthy", 0,
                                        "2026-12-03T10:00:00Z", engine.image_ref)  # fmt: skip


def _answer(body: object) -> Completed:
    return Completed(0, json.dumps(body) + "\n", "")


# 1. A recorded facts file passes the checks of the checkpoint it stands for.


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """`t4serve probe --json` of this machine with the built-in QAT checkpoint, as a user records it."""
    tmp = tmp_path_factory.mktemp("recorded")
    outcome = run_cli(["probe", "--json"], base_environ(tmp))
    assert outcome.code == 0, outcome.err
    facts: dict[str, Any] = json.loads(outcome.out)
    assert facts["model"]["config"]["text"]["layer_types"]
    return facts


BAD_CONFIG = [("layer_types", 0, None), ("layer_types", 0, True), ("layer_types", 0, -1), ("hidden_size", None, "x"),
              ("vocab_size", None, []), ("num_hidden_layers", None, 2**63), ("head_dim", None, 1.5)]  # fmt: skip


@pytest.mark.parametrize(("key", "index", "value"), BAD_CONFIG, ids=[f"{k}[{i}]={v!r}" for k, i, v in BAD_CONFIG])
def test_1_a_facts_files_model_config_is_checked_as_config_json_is(
    tmp_path: Path, recorded: dict[str, Any], key: str, index: int | None, value: object
) -> None:
    facts = copy.deepcopy(recorded)
    text = facts["model"]["config"]["text"]
    if index is None:
        text[key] = value
    else:
        text[key][index] = value
    path = tmp_path / "facts.json"
    path.write_text(json.dumps(facts))
    env = base_environ(tmp_path)
    for command in (["plan", "--gpu", "t4"], ["profiles", "--gpu", "t4"], ["preflight"]):
        outcome = _check(run_cli([*command, "--facts", str(path)], env), {2}, f"{command[0]} --facts {key}")
        assert "found:" in outcome.err and "required:" in outcome.err and "fix:" in outcome.err
        assert key in outcome.err


def test_1_a_facts_file_of_impossible_machine_figures_is_refused(tmp_path: Path, recorded: dict[str, Any]) -> None:
    for section, key, value in (("host", "mem_total_bytes", -5), ("host", "cpu_count", 2**40),
                                ("gpu", "cuda_driver_version", [13]), ("manifest", "present", "yes")):  # fmt: skip
        facts = copy.deepcopy(recorded)
        facts[section][key] = value
        path = tmp_path / "facts.json"
        path.write_text(json.dumps(facts))
        outcome = _check(run_cli(["plan", "--gpu", "t4", "--facts", str(path)], base_environ(tmp_path)), {2},
                         f"plan --facts {section}.{key}")
        assert key in outcome.err and "fix:" in outcome.err


# 2. The container's answers are read by one typed, bounded reader.


def _state_answer(**state_changes: Any) -> dict[str, Any]:
    state = to_dict(serve_state("ready"))
    state.update(state_changes)
    return {"phase": state["phase"], "label": "ready", "state": state, "config_error": None, "ending": None,
            "contract": CONTRACT}  # fmt: skip


def _raw(answer: dict[str, Any], key: str, raw: str) -> str:
    """The answer as JSON text with the state's `key` holding `raw` as written (what json.dumps never writes)."""
    answer["state"][key] = "@RAW@"
    return json.dumps(answer).replace('"@RAW@"', raw)


HOSTILE_STATUS = {
    "nested 100,000 deep": "[" * 100_000 + "]" * 100_000,
    "400 digits in a float field": _raw(_state_answer(), "started_at", "9" * 400),
    "an unknown phase": json.dumps({**_state_answer(phase="warp"), "phase": "warp"}),
    "an empty phase list": json.dumps(_state_answer(phases=[])),
    "an infinite timestamp": _raw(_state_answer(), "updated_at", "Infinity"),
    "a NaN timestamp": _raw(_state_answer(), "attempt_started_at", "NaN"),
    "a huge timestamp": json.dumps(_state_answer(started_at=1e308)),
    "a negative port": json.dumps(_state_answer(port=-1)),
}


@pytest.mark.parametrize("label", list(HOSTILE_STATUS))
def test_2_server_status_reads_any_answer_without_a_traceback(
    engine: FakeEngine, environ: dict[str, str], label: str
) -> None:
    _running(engine)
    engine.canned[("status", "--json")] = Completed(0, HOSTILE_STATUS[label] + "\n", "")
    is_error, text = _tool(tool_env(engine, environ), "server_status", label=label)
    assert is_error and ("is not the StatusAnswer" in text or "older than this t4serve" in text), text


@pytest.mark.parametrize("code", [70, 2, 3])
def test_2_a_containers_failure_is_not_the_hosts_exit_code(tmp_path: Path, code: int) -> None:
    """host-check reads the image's manifest from a throwaway container: its failure is the engine's (5)."""
    from hardening import mcp_env

    from t4serve.host.hostcheck import image_manifest

    failure = Failure("InternalError", code, "it broke in there", "a bug", None, "report it")
    engine = FakeEngine(tmp_path, canned={("probe",): _answer(to_dict(failure))})
    with pytest.raises(Exception) as caught:
        image_manifest(engine, engine.image())
    assert caught.value.exit_code == 5 and caught.value.container_exit_code == code  # type: ignore[attr-defined]
    # The whole command: a docker client that runs this checkout's t4serve for `docker run`, and answers the rest.
    docker = tmp_path / "bin" / "docker"
    docker.parent.mkdir()
    answer = json.dumps(to_dict(failure))
    docker.write_text(f"""#!/bin/sh
case "$1" in
  info) echo '{{"ServerVersion": "27.3.1", "DockerRootDir": "{tmp_path}", "Runtimes": {{"runc": {{}}}}}}' ;;
  image) echo '{{"Id": "sha256:ab", "Size": 100, "Created": "2026-12-03"}}' ;;
  run) echo '{answer}'; exit {code} ;;
  *) exit 1 ;;
esac
""")
    docker.chmod(0o755)
    env = {**mcp_env(tmp_path), "DOCKER": str(docker), "HF_HOME": str(tmp_path / "hf")}
    outcome = _check(run_cli(["host-check", "--compose-file", str(REPO / "compose.yaml")], env), {5},
                     f"host-check, the container failed with {code}")
    assert "it broke in there" in outcome.err


# 3. One redaction step before anything is cut, stored or shown.


def _finished_job(engine: FakeEngine, secret_line: str) -> None:
    """A benchmark that ended in the container: its folder as `t4serve bench start` leaves it."""
    folder = engine.in_container(f"{CACHE_DIR}/bench/{RUN}")
    (folder / "result").mkdir(parents=True)
    (folder / "job.json").write_text(json.dumps({"run_id": RUN, "args": [], "started_at": 1_790_000_000.0,
                                                 "pid": 999_999}))  # fmt: skip
    (folder / "exit-code").write_text("0\n")
    (folder / "bench.log").write_text(f"INFO starting\n{secret_line}\nINFO done\n")
    (folder / "result" / "report.md").write_text(f"# report\n\n{secret_line}\n")


def test_3_benchmark_status_stores_and_shows_no_secret(engine: FakeEngine, environ: dict[str, str]) -> None:
    _running(engine)
    _finished_job(engine, f"vLLM args: --api-key {API_KEY} HF_TOKEN={HF_TOKEN} \x1b[31mred\x1b[0m")
    env = tool_env(engine, environ)
    status = ok(call(env, "benchmark_status", {"run_id": RUN}))
    _check(Outcome(0, json.dumps(status), ""), {0}, "benchmark_status of a log holding the secrets")
    assert status["state"] == "done" and "<redacted>" in status["log_tail"] and "\x1b" not in status["log_tail"]
    stored = env.data_dir / "bench" / RUN
    for path in stored.rglob("*"):
        if path.is_file():
            data = path.read_text(errors="replace")
            assert API_KEY not in data and HF_TOKEN not in data, path
    # Read again from the host copy: the same, still without them.
    again = ok(call(env, "benchmark_status", {"run_id": RUN}))
    assert API_KEY not in json.dumps(again) and again["log_tail"] == status["log_tail"]


def test_3_no_container_text_reaches_docker_cps_command_line(engine: FakeEngine, environ: dict[str, str]) -> None:
    _running(engine)
    run = {"run_id": RUN, "folder": f"/cache/{HF_TOKEN}/bench/{RUN}", "state": "done", "exit_code": 0,
           "runs_done": 1, "runs_planned": 1, "started_at": 1_790_000_000.0}  # fmt: skip
    engine.canned[("bench", "status")] = _answer({"run": run, "log_tail": "", "report_md": None, "cells": [],
                                                  "plots": [], "contract": CONTRACT})  # fmt: skip
    engine.in_container(run["folder"]).mkdir(parents=True)  # it is there to copy: only the command line is wrong
    is_error, text = _tool(tool_env(engine, environ), "benchmark_status", {"run_id": RUN}, label="folder with a secret")
    assert is_error and "folder" in text
    assert not any(HF_TOKEN in json.dumps(detail) for _, detail in engine.calls)


def test_3_a_secret_is_redacted_before_the_quote_is_cut(
    engine: FakeEngine, environ: dict[str, str], caplog: pytest.LogCaptureFixture
) -> None:
    """An answer that is no answer is quoted to 300 characters: a key straddling the cut left its prefix."""
    _running(engine)
    engine.canned[("status", "--json")] = Completed(1, "", "E" * 290 + API_KEY + " and more\n")
    with caplog.at_level(logging.INFO):
        is_error, text = _tool(tool_env(engine, environ), "server_status", label="a key at the quote's end")
    assert is_error and "E" * 250 in text
    for seen in (text, caplog.text):
        assert API_KEY[:8] not in seen


# 4. Names, paths and ids from the container, and text without control characters.


@pytest.mark.parametrize("plot", ["/etc/shadow", "../../../../etc/passwd", "result/../../x.png", "result/a\x00.png"])
def test_4_a_plot_from_the_container_is_never_a_host_path_outside_the_copy(
    engine: FakeEngine, environ: dict[str, str], plot: str
) -> None:
    _running(engine)
    run = {"run_id": RUN, "folder": f"/cache/t4serve/bench/{RUN}", "state": "done", "exit_code": 0,
           "runs_done": 1, "runs_planned": 1, "started_at": 1_790_000_000.0}  # fmt: skip
    engine.canned[("bench", "status")] = _answer({"run": run, "log_tail": "", "report_md": None, "cells": [],
                                                  "plots": [plot], "contract": CONTRACT})  # fmt: skip
    _finished_job(engine, "INFO nothing secret")
    is_error, text = _tool(tool_env(engine, environ), "benchmark_status", {"run_id": RUN}, label=f"plot {plot!r}")
    assert is_error and "etc/passwd" not in text.replace(json.dumps(plot)[1:-1], "") and "/etc/shadow\"" not in text


@pytest.mark.parametrize("run_id", ["../..", "a\x00b", "\x1b[2J20261203-101010-abcdef", "9" * 100_000])
def test_4_a_run_id_from_the_container_is_checked_as_a_clients(
    engine: FakeEngine, environ: dict[str, str], run_id: str
) -> None:
    engine.state = serve_state("ready")
    _running(engine)
    run = {"run_id": run_id, "folder": f"/cache/t4serve/bench/{run_id}", "state": "running", "exit_code": None,
           "runs_done": 0, "runs_planned": None, "started_at": 1_790_000_000.0}  # fmt: skip
    engine.canned[("bench", "status", "--json")] = _answer({"root": "/cache/t4serve/bench", "runs": [],
                                                            "contract": CONTRACT})  # fmt: skip
    engine.canned[("bench", "start")] = _answer({"run": run, "contract": CONTRACT})
    is_error, text = _tool(tool_env(engine, environ), "run_benchmark", label=f"run id {run_id[:20]!r}")
    assert is_error and "run id" in text and "\x00" not in text and "\x1b" not in text and len(text) < 20_000


def test_4_escape_sequences_from_the_container_reach_no_result(engine: FakeEngine, environ: dict[str, str]) -> None:
    engine.state = serve_state("failed", reason="vLLM exited 1 \x1b[31mCUDA\x1b[0m \x1b]0;owned\x07",
                               diagnosis="out of \x9b2Jmemory", last_lines=["\x1b[1mline\x1b[0m", "tab\there"])
    _running(engine)
    engine.log_lines = ["\x1b[32mINFO\x1b[0m ready", "a\rb\x08c"]
    env = tool_env(engine, environ)
    for name in ("server_status", "server_logs"):
        data = ok(call(env, name))
        text = json.dumps(data, ensure_ascii=False)
        _check(Outcome(0, text, ""), {0}, f"{name} with escape sequences")
        assert not any(c in text for c in "\x1b\x9b\x07\x08\r"), text
    status = ok(call(env, "server_status"))
    assert "CUDA" in status["reason"] and "out of memory" in status["diagnosis"]


# 5. A state folder whose path no file system accepts.


def test_5_a_state_folder_component_over_255_bytes(tmp_path: Path) -> None:
    env = {**base_environ(tmp_path), "T4SERVE_STATE_DIR": str(tmp_path / ("a" * 300))}
    for args, allowed in ((["healthcheck"], {1}), (["healthcheck", "--liveness"], {1}), (["status"], {2}),
                          (["status", "--json"], {2})):  # fmt: skip
        outcome = _check(run_cli(args, env), allowed, " ".join(args) + " with a 300-byte component")
        assert "255 bytes" in outcome.text


# 10. MCP: schemas, errors, run ids, HTTP sessions.


def _objects(schema: object) -> list[dict[str, Any]]:
    found = []
    if isinstance(schema, dict):
        if schema.get("type") == "object":
            found.append(schema)
        for value in schema.values():
            found += _objects(value)
    elif isinstance(schema, list):
        for value in schema:
            found += _objects(value)
    return found


def test_10_every_input_schema_refuses_other_properties_and_bounds_its_text(
    engine: FakeEngine, environ: dict[str, str]
) -> None:
    import anyio

    from t4serve.mcp.server import build_server

    tools = anyio.run(build_server(tool_env(engine, environ)).list_tools)
    assert len(tools) == 13
    for tool in tools:
        tried(AREA)
        objects = _objects(tool.input_schema)
        # What a strict conversion (an agents SDK's) refuses: an object that allows other properties.
        assert objects and all(o.get("additionalProperties") is False for o in objects), tool.name
        for name in ("model", "settings"):
            if name in tool.input_schema["properties"]:
                text = json.dumps(tool.input_schema["properties"][name])
                assert '"maxLength"' in text, (tool.name, name)
        record(AREA, Outcome(0, "", ""), {0}, label=f"{tool.name}'s input schema")


def test_10_errors_do_not_repeat_the_tools_name(engine: FakeEngine, environ: dict[str, str]) -> None:
    env = tool_env(engine, environ)
    for name, args in (("server_logs", {}), ("server_logs", {"tail": "x"}), ("plan", {"settings": {"X": "1"}})):
        is_error, text = _tool(env, name, args, label="an error")
        assert is_error and f"{name}: {name}" not in text and text.count(name + ":") <= 1, text


def test_10_benchmark_status_for_an_unknown_run_id_says_so(engine: FakeEngine, environ: dict[str, str]) -> None:
    is_error, text = _tool(tool_env(engine, environ), "benchmark_status", {"run_id": RUN}, label="unknown, no server")
    assert is_error and f"no benchmark {RUN}" in text


def test_10_http_sessions_are_capped_in_number_and_idle_time(tmp_path: Path) -> None:
    from hardening import INITIALIZE, TOKEN, mcp_env

    from t4serve.commands.mcp import HTTP_SESSION_IDLE_S, MAX_HTTP_SESSIONS, http_app

    assert HTTP_SESSION_IDLE_S <= 900
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "t4serve", "mcp", "--http", f"127.0.0.1:{port}"],
                            env=mcp_env(tmp_path, T4SERVE_MCP_TOKEN=TOKEN), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        assert wait_listening(port, proc)
        codes = []
        for _ in range(MAX_HTTP_SESSIONS + 2):
            request = urllib.request.Request(
                f"http://127.0.0.1:{port}/mcp", data=json.dumps(INITIALIZE).encode(), method="POST",
                headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json",
                         "Accept": "application/json, text/event-stream"})  # fmt: skip
            try:
                with urllib.request.urlopen(request, timeout=10) as answer:
                    codes.append(answer.status)
            except urllib.error.HTTPError as exc:
                codes.append(exc.code)
        tried(AREA)
        record(AREA, Outcome(0 if codes.count(200) == MAX_HTTP_SESSIONS else 1, str(codes), ""), {0},
               label="HTTP sessions past the cap")
        assert codes[:MAX_HTTP_SESSIONS] == [200] * MAX_HTTP_SESSIONS and set(codes[MAX_HTTP_SESSIONS:]) == {503}
    finally:
        proc.terminate()
        proc.wait(timeout=20)
    # The idle bound is the app's own: the session manager the SDK built for it.
    from t4serve.mcp.calls import ToolEnv
    from t4serve.mcp.server import build_server

    env = ToolEnv(engine=FakeEngine(tmp_path), environ={}, data_dir=tmp_path / "d",  # type: ignore[arg-type]
                  compose_file=tmp_path / "compose.yaml")  # fmt: skip
    server = build_server(env)
    http_app(server, TOKEN, ["127.0.0.1:1"])
    manager = server._lowlevel_server.session_manager
    assert manager.session_idle_timeout == HTTP_SESSION_IDLE_S and manager.max_sessions == MAX_HTTP_SESSIONS
