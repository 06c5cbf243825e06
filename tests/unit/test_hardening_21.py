"""Issue 21's classes of hostile input, a named test (with a case chosen here) for each: numbers and hosts that read
as something else, files that are not what they claim, the compile ladder's record and lock, programs that are not
programs, bench result folders, settings that contradict the card, exit codes that lie, pass-through vLLM flags that
break supervision, and the MCP server's echo and bearer check. Each run is counted in the hardening figures."""

from __future__ import annotations

import dataclasses
import fcntl
import json
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from hardening import (
    HOSTILE_FILES,
    INITIALIZE,
    SENTINEL,
    SENTINEL_TOKEN,
    TOKEN,
    Outcome,
    StdioServer,
    base_environ,
    hostile_file,
    mcp_env,
    record,
    run_cli,
    tried,
    wait_listening,
)

from t4serve.supervise.state import read_state

AREA = "issue 21 regressions"
REPO = Path(__file__).resolve().parents[2]


def _check(outcome: Outcome, allowed: set[int], label: str, **kwargs: Any) -> Outcome:
    tried(AREA)
    record(AREA, outcome, allowed, secrets=(SENTINEL, SENTINEL_TOKEN), label=label, **kwargs)
    return outcome


# Values that look valid to Python but not to a person: ASCII decimal only, one parser for numbers and one for hosts.


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("T4SERVE_PORT", "1_0"),
        ("T4SERVE_PORT", "\u0663"),
        ("T4SERVE_KV_CACHE_MEMORY_BYTES", "\u0663"),
        ("T4SERVE_KV_CACHE_MEMORY_BYTES", "\u0662.\u0665GiB"),
        ("T4SERVE_GPU_MEMORY_UTILIZATION", "\u0660.\u0669"),
        ("T4SERVE_GPU_MEMORY_UTILIZATION", "0.9_0"),
        ("T4SERVE_MAX_NUM_SEQS", "\uff18"),
        ("T4SERVE_HOST", "0x10"),
        ("T4SERVE_HOST", "0x7f000001"),
        ("T4SERVE_TELEMETRY_HOST", "017.1"),
    ],
)
def test_numbers_and_hosts_are_ascii_decimal_only(tmp_path: Path, name: str, value: str) -> None:
    outcome = _check(run_cli(["plan", "--gpu", "t4"], {**base_environ(tmp_path), name: value}), {2}, f"{name}={value}")
    assert f"{name}=" in outcome.err and "must be" in outcome.err


@pytest.mark.parametrize(
    "args",
    [
        ["mcp", "--http", "127.0.0.1:\u0663"],
        ["mcp", "--http", "127.0.0.1:1_0"],
        ["mcp", "--http", "0x10:8765"],
        ["bench", "--repeats", "\u0661", "--base-url", "http://127.0.0.1:1", "--models", "m"],
        ["bench", "--num-prompts", "1_0", "--base-url", "http://127.0.0.1:1", "--models", "m"],
        ["roofline", "--context", "\u0664\u0660\u0669\u0666"],
    ],
)
def test_options_take_ascii_decimal_only(tmp_path: Path, args: list[str]) -> None:
    outcome = _check(run_cli(args, base_environ(tmp_path)), {2}, " ".join(args))
    assert "must be" in outcome.err or "not HOST:PORT" in outcome.err
    assert not any(tmp_path.glob("bench-*")), "a usage error left an output folder behind"


# Files that are not what they claim: one bounded, non-blocking reader (t4serve.untrusted.open_regular/read_bounded)
# for every file t4serve reads. Each kind below is refused at once, with the path named, by every door.

def _timed(args: list[str], env: dict[str, str]) -> tuple[Outcome, float]:
    began = time.monotonic()
    outcome = run_cli(args, env)
    return outcome, time.monotonic() - began


@pytest.mark.parametrize("kind", HOSTILE_FILES)
def test_the_mcp_token_file_is_read_bounded(tmp_path: Path, kind: str) -> None:
    token = hostile_file(tmp_path / "token", kind)
    env = {**base_environ(tmp_path), "T4SERVE_MCP_TOKEN_FILE": str(token)}
    outcome, took = _timed(["mcp", "--http", "127.0.0.1:9", "--compose-file", str(tmp_path / "compose.yaml")], env)
    _check(outcome, {2}, f"T4SERVE_MCP_TOKEN_FILE {kind}", seconds=took, deadline=5.0)
    assert "T4SERVE_MCP_TOKEN_FILE=" in outcome.err and str(token) in outcome.err
    assert kind == "not-utf8" or "cannot read it" in outcome.err


@pytest.mark.parametrize("kind", HOSTILE_FILES)
def test_facts_and_manifest_files_are_read_bounded(tmp_path: Path, kind: str) -> None:
    env = base_environ(tmp_path)
    facts = hostile_file(tmp_path / "facts.json", kind)
    outcome, took = _timed(["plan", "--facts", str(facts)], env)
    _check(outcome, {2}, f"plan --facts {kind}", seconds=took, deadline=5.0)
    assert str(facts) in outcome.err and "t4serve probe --json" in outcome.err
    env["T4SERVE_MANIFEST"] = str(hostile_file(tmp_path / "manifest.json", kind))
    outcome, took = _timed(["preflight", "--json"], env)
    _check(outcome, {3}, f"T4SERVE_MANIFEST {kind}", seconds=took, deadline=5.0)
    manifest = next(f for f in json.loads(outcome.out) if f["check"] == "manifest")
    assert manifest["level"] == "fail" and env["T4SERVE_MANIFEST"] in manifest["found"]


@pytest.mark.parametrize("kind", HOSTILE_FILES)
def test_cache_files_are_read_bounded(tmp_path: Path, kind: str) -> None:
    from t4serve.supervise import compilerecord, history

    tried(AREA)
    cache = tmp_path / "cache"
    hostile_file(cache / history.HISTORY_FILE, kind)
    hostile_file(cache / compilerecord.RECORD_FILE, kind)
    began = time.monotonic()
    records, problem = history.load(cache)
    record_, record_problem = compilerecord.load_record(cache, "key")
    took = time.monotonic() - began
    record(AREA, Outcome(0, "", f"{problem}\n{record_problem}"), {0}, seconds=took, deadline=5.0,
           label=f"history and compile record {kind}")
    assert records == [] and problem is not None and str(cache / history.HISTORY_FILE) in problem
    assert record_ is None and record_problem is not None and str(cache / compilerecord.RECORD_FILE) in record_problem


# The compile ladder's record and lock: a bad record is set aside and the ladder starts over; a lock that cannot be
# taken within seconds is an error in the state file; SIGTERM always ends the wrapper promptly. The wrapper runs as
# supervisord runs it (`python -m t4serve run-vllm --spec FILE`), the stand-in vLLM as its server.


@pytest.fixture
def supervised() -> Iterator[Callable[..., Any]]:
    """Starts `python -m t4serve run-vllm --spec FILE` as supervisord does (test_run_vllm.Supervised); each one left
    running at the end is killed with its session."""
    from test_supervise_run_vllm import Supervised

    started: list[Supervised] = []

    def start(spec: Any, state_dir: Path) -> Supervised:
        started.append(Supervised(spec, state_dir))
        return started[-1]

    yield start
    for wrapper in started:
        wrapper.cleanup()


def _ladder_spec(tmp_path: Path, *, compile_oom: bool) -> Any:
    from test_supervise_run_vllm import free_port, make_spec, standin_argv

    from t4serve.config import compilation

    port = free_port()
    spec = dataclasses.replace(make_spec(tmp_path, standin_argv(port), port=port, canary=False),
                               compile_ladder=[[r.name, *r.flags] for r in compilation.LADDER])  # fmt: skip
    if compile_oom:
        spec.env["T4SERVE_STANDIN_COMPILE_OOM_WITHOUT"] = "--enforce-eager"
    return spec


def _state_dir(tmp_path: Path) -> Path:
    state = tmp_path / "state"
    state.mkdir()
    return state


def test_a_compile_record_of_the_wrong_shape_is_set_aside_and_the_ladder_starts_over(
    tmp_path: Path, supervised: Any
) -> None:
    from t4serve.supervise import compilerecord

    spec = _ladder_spec(tmp_path, compile_oom=False)
    cache = Path(spec.cache_dir)
    cache.mkdir()
    key = compilerecord.record_key(spec.model, spec.gpu_name, spec.argv)
    # A number where the list of failed rungs belongs: run-vllm once died of a TypeError here, before any state.
    (cache / compilerecord.RECORD_FILE).write_text(json.dumps({key: {"rung": "lean", "failed": 5}}))
    tried(AREA)
    wrapper = supervised(spec, _state_dir(tmp_path))
    ready = wrapper.wait_state(lambda s: s.phase in ("ready", "failed"))
    assert ready.phase == "ready", wrapper.output
    assert "set aside as compile-ladder.json.bad-" in wrapper.output and "compile: full (" in wrapper.output
    [aside] = cache.glob(f"{compilerecord.RECORD_FILE}.bad-*")
    assert json.loads(aside.read_text())[key]["failed"] == 5
    end = time.monotonic() + 10
    while compilerecord.load_record(cache, key)[0] is None and time.monotonic() < end:
        time.sleep(0.05)
    entry, problem = compilerecord.load_record(cache, key)
    assert problem is None and entry is not None and entry["rung"] == "full" and entry["failed"] == []
    began = time.monotonic()
    os.kill(wrapper.proc.pid, signal.SIGTERM)
    code = wrapper.finish()
    record(AREA, Outcome(code, wrapper.output, ""), {0}, seconds=time.monotonic() - began, deadline=5.0,
           label="compile record of the wrong shape")


@pytest.mark.parametrize("lock", ["fifo", "directory", "dev-zero"])
def test_a_lock_that_is_not_a_file_is_an_error_in_the_state_not_a_hang(
    tmp_path: Path, supervised: Any, lock: str
) -> None:
    from t4serve.supervise import compilerecord

    spec = _ladder_spec(tmp_path, compile_oom=True)
    hostile_file(Path(spec.cache_dir) / compilerecord.LOCK_FILE, lock)
    tried(AREA)
    began = time.monotonic()
    wrapper = supervised(spec, state := _state_dir(tmp_path))
    code = wrapper.finish(timeout=30)
    record(AREA, Outcome(code, wrapper.output, ""), {1}, seconds=time.monotonic() - began, deadline=15.0,
           label=f"compile lock {lock}")
    final = read_state(state)
    assert final.phase == "failed" and final.diagnosis is not None and "inside torch.compile" in final.diagnosis
    assert final.fix is not None and "could not record compile rung lean" in final.fix
    assert f"{compilerecord.LOCK_FILE} must be a regular file" in final.fix and "T4SERVE_COMPILE=lean" in final.fix


def test_sigterm_ends_a_wrapper_waiting_for_a_held_lock(tmp_path: Path, supervised: Any) -> None:
    """Another process holds the lock and never lets go: the wrapper, recording the next rung after vLLM died,
    waits at most atomic.LOCK_TIMEOUT_S for it, and a SIGTERM during that wait ends it at once."""
    from t4serve.supervise import compilerecord
    from t4serve.supervise.children import descendants

    spec = _ladder_spec(tmp_path, compile_oom=True)
    cache = Path(spec.cache_dir)
    cache.mkdir()
    tried(AREA)
    with open(cache / compilerecord.LOCK_FILE, "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        wrapper = supervised(spec, state := _state_dir(tmp_path))
        end = time.monotonic() + 20
        while not descendants(wrapper.proc.pid) and time.monotonic() < end:  # vLLM started
            time.sleep(0.02)
        while descendants(wrapper.proc.pid) and time.monotonic() < end:  # vLLM died in torch.compile
            time.sleep(0.02)
        time.sleep(0.3)
        began = time.monotonic()
        os.kill(wrapper.proc.pid, signal.SIGTERM)
        code = wrapper.finish()
        took = time.monotonic() - began
    record(AREA, Outcome(code, wrapper.output, ""), {1}, seconds=took, deadline=1.0, label="SIGTERM in a lock wait")
    final = read_state(state)
    assert final.phase == "failed" and final.fix is not None
    assert "gave up waiting for the lock" in final.fix and "a stop signal came" in final.fix, final.fix


# Programs that are not programs: DOCKER naming a folder or a file that is no program, a client that prints what is
# not JSON or JSON of the wrong shape, a compose client that fails. host-check keeps to its codes (a failed finding,
# exit 3; the engine refusing a request, 5), the MCP tools answer found/required/fix, never "internal error", and a
# configured client that fails is never replaced by the system docker-compose (another engine's client).

INFO_OK = {"ServerVersion": "27.3.1", "DockerRootDir": "/var/lib/docker", "Runtimes": {"runc": {}}}


def hostile_docker(folder: Path, kind: str) -> Path:
    """A DOCKER that is not the Docker client: `folder`, a file without the x bit, a file that is no program, or the
    stand-in client of tests/unit/test_host_docker.py answering `docker info` with text that is not what Docker
    gives."""
    from test_host_docker import make_clients

    if kind == "folder":
        folder.mkdir(parents=True)
        return folder
    if kind in ("not-executable", "not-a-program"):
        folder.mkdir(parents=True)
        path = folder / "docker"
        path.write_bytes(b"\x7fELF\x00garbage" if kind == "not-a-program" else b"#!/bin/sh\necho hi\n")
        path.chmod(0o755 if kind == "not-a-program" else 0o644)
        return path
    answers = {
        "not-json": "Client: Docker Engine\n Version: 27\nWARNING: no JSON here\n",
        "runtimes-a-list": json.dumps({**INFO_OK, "Runtimes": ["runc", "nvidia"]}),
        "runtimes-a-string": json.dumps({**INFO_OK, "Runtimes": "nvidia"}),
        "root-a-number": json.dumps({**INFO_OK, "DockerRootDir": 7}),
        "a-list": json.dumps([INFO_OK]),
        "deep": "[" * 100000 + "]" * 100000,
        "nan": '{"ServerVersion": NaN}',
    }
    docker, _ = make_clients(folder, {"info": [0, answers[kind], ""]})
    return docker


DOCKER_KINDS = ("folder", "not-executable", "not-a-program", "not-json", "runtimes-a-list", "runtimes-a-string",
                "root-a-number", "a-list", "deep", "nan")  # fmt: skip


@pytest.mark.parametrize("kind", DOCKER_KINDS)
def test_host_check_with_a_docker_that_is_not_docker(tmp_path: Path, kind: str) -> None:
    docker = hostile_docker(tmp_path / "bin", kind)
    env = {**base_environ(tmp_path), "DOCKER": str(docker)}
    outcome, took = _timed(["host-check", "--json", "--compose-file", str(REPO / "compose.yaml")], env)
    _check(outcome, {3}, f"host-check DOCKER {kind}", seconds=took, deadline=30.0)
    finding = json.loads(outcome.out)[0]
    assert finding["check"] == "docker" and finding["level"] == "fail" and finding["fix"]
    assert str(docker) in finding["found"] or "docker info" in finding["found"]


@pytest.mark.parametrize("tool", ["check_host_capacity", "verify_gpu_arch", "plan", "server_status",
                                  "stop_vllm_server", "start_vllm_server", "server_logs"])  # fmt: skip
@pytest.mark.parametrize("kind", ["folder", "not-json", "runtimes-a-list"])
def test_mcp_tools_with_a_docker_that_is_not_docker(tmp_path: Path, tool: str, kind: str) -> None:
    from test_mcp_tools import call
    from test_probes_gpu import FakeDevice, FakeNvml

    from t4serve.host.docker import engine_from_environ
    from t4serve.mcp.calls import ToolEnv

    docker = hostile_docker(tmp_path / "bin", kind)
    environ = {"DOCKER": str(docker), "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf"),
               "PATH": os.environ["PATH"]}  # fmt: skip
    engine = engine_from_environ(environ, compose_file=REPO / "compose.yaml")
    env = ToolEnv(engine=engine, environ=environ, data_dir=tmp_path / "data", compose_file=engine.compose_file,
                  nvml=FakeNvml([FakeDevice()]))  # fmt: skip
    tried(AREA)
    result = call(env, tool, {"model": "qat"} if tool == "start_vllm_server" else {})
    text = "\n".join(getattr(c, "text", "") for c in result.content)
    code = 0 if not result.is_error else (2 if "fix:" in text else 70)
    record(AREA, Outcome(70 if "internal error" in text else code, text, ""), {0, 2},
           label=f"{tool} with DOCKER {kind}")
    assert "internal error" not in text and "Traceback" not in text
    if tool == "check_host_capacity":
        assert not result.is_error and result.structured_content is not None
        assert result.structured_content["findings"][0]["level"] == "fail"
    elif result.is_error or tool in ("verify_gpu_arch", "plan") or kind == "folder":
        # The tools that read `docker info`, and every tool of a DOCKER that cannot run, answer found/required/fix.
        assert result.is_error and "found:" in text and "fix:" in text, text


def test_a_failing_compose_of_a_configured_client_never_falls_back_to_docker_compose(tmp_path: Path) -> None:
    """DOCKER names a client of another engine whose `compose version` fails: stop_vllm_server once ran stop, rm and
    down through the system docker-compose against the default engine. Now it is a tool error naming the client."""
    from test_host_docker import calls, make_clients
    from test_mcp_tools import call

    from t4serve.host.docker import engine_from_environ
    from t4serve.mcp.calls import ToolEnv

    docker, _compose = make_clients(tmp_path / "bin", {"compose version": [1, "", "compose: engine refused\n"],
                                                      "compose": [0, "", ""]})  # fmt: skip
    environ = {"DOCKER": str(docker), "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}"}
    engine = engine_from_environ(environ, compose_file=REPO / "compose.yaml")
    env = ToolEnv(engine=engine, environ=environ, data_dir=tmp_path / "data", compose_file=engine.compose_file)
    tried(AREA)
    result = call(env, "stop_vllm_server", {})
    text = "\n".join(getattr(c, "text", "") for c in result.content)
    record(AREA, Outcome(2 if result.is_error else 0, text, ""), {2}, label="stop with a failing compose plugin")
    assert "no compose client for this Docker client" in text and f"DOCKER={docker}" in text
    assert [c["prog"] for c in calls(tmp_path / "bin")] == ["docker"], "the system docker-compose was run"


# Bench result folders: `bench report` and `bench compare` refuse (exit 2, the file and the problem named) or render
# safely whatever runs.json holds; matplotlib never sees a value it cannot draw. `bench` refuses a model name too
# long for its raw/ files and an output folder it cannot write, both with exit 2, and leaves no folder behind.


def runs_json(**edits: Any) -> dict[str, Any]:
    """A runs.json body of two models, two cells and two repeats, as `t4serve bench` writes it; `edits` replace
    top-level keys, or, given as run0_KEY / fig0_KEY, a key of the first run or of its figures."""
    from test_bench_results import figures, run

    from t4serve.bench.results import RUNS_SCHEMA, RunsFile
    from t4serve.serde import to_dict

    runs = [run(m, r, figures(100.0 + r, 20.0, 300.0), c=c) for m in ("qat", "bf16") for c in (1, 4) for r in (1, 2)]
    body: dict[str, Any] = to_dict(RunsFile(schema=RUNS_SCHEMA, models=["qat", "bf16"], inputs=[512],
                                            concurrencies=[1, 4], repeats=2, output_len=128, started="2026-12-04",
                                            runs=runs, ceilings={"qat": 60.0, "bf16": None}, planned_runs=8))
    for key, value in edits.items():
        if key.startswith("run0_"):
            body["runs"][0][key[5:]] = value
        elif key.startswith("fig0_"):
            body["runs"][0]["figures"][key[5:]] = value
        else:
            body[key] = value
    return body


HOSTILE_RUNS: dict[str, dict[str, Any]] = {
    "throughput 1e308": runs_json(fig0_output_throughput=1e308),
    "tpot 1e308": runs_json(fig0_median_tpot_ms=1e308),
    "negative throughput": runs_json(fig0_output_throughput=-5.0),
    "negative completed": runs_json(fig0_completed=-1),
    "concurrency 0": runs_json(concurrencies=[0, 1], run0_concurrency=0),
    "a run of concurrency 0": runs_json(run0_concurrency=0),
    "duplicate cells": runs_json(runs=runs_json()["runs"] * 2),
    "schema 3": runs_json(schema=3),
    "no schema": {k: v for k, v in runs_json().items() if k != "schema"},
    "model with a newline": runs_json(models=["qat\n| x |", "bf16"], run0_model="qat\n| x |"),
    "model listed twice": runs_json(models=["qat", "qat"]),
    "a run of an unlisted model": runs_json(run0_model="other"),
    "repeat 10**30": runs_json(run0_repeat=10**18),
    "ceiling 1e300": runs_json(ceilings={"qat": 1e300}),
    "telemetry power 1e300": runs_json(run0_telemetry={"samples": 1, "power_w_mean": 1e300}),
    "a string for a float": runs_json(fig0_median_ttft_ms="nan"),
    "a model of 100000 characters": runs_json(models=["q" * 100000, "bf16"]),
}


@pytest.mark.parametrize("case", list(HOSTILE_RUNS), ids=list(HOSTILE_RUNS))
def test_bench_report_and_compare_refuse_runs_they_cannot_show(tmp_path: Path, case: str) -> None:
    bad, good = tmp_path / "bad", tmp_path / "good"
    for folder, body in ((bad, HOSTILE_RUNS[case]), (good, runs_json())):
        (folder / "raw").mkdir(parents=True)
        (folder / "runs.json").write_text(json.dumps(body))
    env = base_environ(tmp_path)
    for args in (["bench", "report", str(bad)], ["bench", "compare", str(good), str(bad)],
                 ["bench", "merge", str(tmp_path / "merged"), f"qat={good}", f"bf16={bad}"]):  # fmt: skip
        outcome, took = _timed(args, env)
        _check(outcome, {2}, f"{' '.join(args[:2])}: {case}", seconds=took, deadline=30.0)
        assert str(bad / "runs.json") in outcome.err and "fix:" in outcome.err
    assert not (bad / "report.md").exists() and not (tmp_path / "merged").exists()


def test_a_model_name_holding_a_bar_is_escaped_in_every_table(tmp_path: Path) -> None:
    body = runs_json(models=["org/q|at", "bf16"])
    for r in body["runs"]:
        r["model"] = "org/q|at" if r["model"] == "qat" else r["model"]
    body["ceilings"] = {"org/q|at": 60.0}
    (tmp_path / "raw").mkdir()
    (tmp_path / "runs.json").write_text(json.dumps(body))
    outcome = _check(run_cli(["bench", "report", str(tmp_path)], base_environ(tmp_path)), {0}, "a model holding |")
    tables = [line for line in outcome.out.splitlines() if line.startswith("|")]
    widths = {line.replace("\\|", "").count("|") for line in tables if "org/q" in line or line.startswith("| c ")}
    assert "org/q\\|at" in outcome.out and len(widths) >= 1
    for block in outcome.out.split("\n\n"):
        rows = [ln.replace("\\|", "") for ln in block.splitlines() if ln.startswith("|")]
        assert len({row.count("|") for row in rows}) <= 1, block  # every row of a table has its header's columns


def test_bench_refuses_a_long_model_name_and_leaves_no_folder(tmp_path: Path) -> None:
    env = base_environ(tmp_path)
    outcome = _check(run_cli(["bench", "--models", "m" * 300, "--base-url", "http://127.0.0.1:9",
                              "--output", str(tmp_path / "out")], env), {2}, "a 300-character model")  # fmt: skip
    assert "at most 160 characters" in outcome.err and not (tmp_path / "out").exists()
    # A usage error found after the folder was made (a --base-url naming no server for a model) removes it again.
    outcome = _check(run_cli(["bench", "--models", "a,b", "--base-url", "a=http://127.0.0.1:9",
                              "--output", str(tmp_path / "out")], env), {2}, "--base-url for one of two models")
    assert "--base-url names no server for b" in outcome.err and not (tmp_path / "out").exists()


def test_bench_refuses_an_output_folder_it_cannot_write(tmp_path: Path) -> None:
    """The (empty) folder is read-only (0555). Root writes anywhere while it holds CAP_DAC_OVERRIDE, so when the
    tests run as root the command runs without it (dropped from the bounding set before exec, as a container with
    `--cap-drop DAC_OVERRIDE` runs); it is the real `python -m t4serve bench` either way."""
    import ctypes
    import subprocess
    import sys

    def drop_dac_override() -> None:
        if os.geteuid() == 0:
            libc = ctypes.CDLL(None, use_errno=True)
            for capability in (1, 2):  # CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH
                if libc.prctl(24, capability, 0, 0, 0) != 0:  # PR_CAPBSET_DROP
                    raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")

    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o555)
    env = {**base_environ(tmp_path), "PYTHONPATH": str(REPO / "entrypoint")}
    tried(AREA)
    try:
        done = subprocess.run([sys.executable, "-m", "t4serve", "bench", "--models", "m", "--base-url",
                               "http://127.0.0.1:9", "--output", str(folder)], env=env, cwd=tmp_path,
                              preexec_fn=drop_dac_override, capture_output=True, text=True, timeout=60)  # fmt: skip
    finally:
        folder.chmod(0o755)
    record(AREA, Outcome(done.returncode, done.stdout, done.stderr), {2}, label="an output folder it cannot write")
    assert "--output cannot hold the results" in done.stderr and "Permission denied" in done.stderr
    assert list(folder.iterdir()) == []


# Exit codes that lie, and settings that contradict the card: one table (t4serve.errors.EXIT_CODES), kept by every
# command in every output form.


def test_mcp_http_on_an_address_in_use_exits_2_without_announcing(tmp_path: Path) -> None:
    import socket

    (tmp_path / "token").write_text("mcp-test-token-0123456789abcdef\n")
    env = {**base_environ(tmp_path), "T4SERVE_MCP_TOKEN_FILE": str(tmp_path / "token")}
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        for listen in (f"127.0.0.1:{port}", f"192.0.2.1:{port}", f"no-such-host.invalid:{port}"):
            outcome, took = _timed(["mcp", "--http", listen, "--allowed-host", "gpu-box",
                                    "--compose-file", str(REPO / "compose.yaml")], env)  # fmt: skip
            _check(outcome, {2}, f"mcp --http {listen}", seconds=took, deadline=30.0)
            assert "cannot listen there" in outcome.err and "streamable HTTP on" not in outcome.err


@pytest.mark.parametrize("as_json", [False, True], ids=["text", "json"])
def test_status_on_a_corrupt_exit_request_exits_2_in_both_forms(tmp_path: Path, as_json: bool) -> None:
    from hardening import ready_state, write_state

    write_state(tmp_path / "state", ready_state(9))
    (tmp_path / "state" / "exit-request.json").write_text('{"code": "one"')
    outcome = _check(run_cli(["status", *(["--json"] if as_json else [])], base_environ(tmp_path)), {2},
                     f"status {'--json ' if as_json else ''}with a corrupt exit request")
    assert "exit-request.json" in outcome.err
    if not as_json:
        assert outcome.out == ""
        return
    # --json prints no state: only the failure, typed as the host reads it (t4serve.contract).
    from t4serve.contract import ContainerFailure, StatusAnswer, read_answer

    with pytest.raises(ContainerFailure) as caught:
        read_answer(StatusAnswer, ["t4serve", "status", "--json"], 2, outcome.out, outcome.err, "t4serve:dev")
    assert "exit request is unreadable" in caught.value.what and "exit-request.json" in (caught.value.found or "")
    assert caught.value.container_exit_code == 2


@pytest.mark.parametrize("as_json", [False, True], ids=["text", "json"])
def test_plan_of_an_unreadable_checkpoint_exits_2_in_both_forms(tmp_path: Path, as_json: bool) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_bytes(b"\xff\xfe not json")
    args = ["plan", "--gpu", "t4", "--model", str(model), *(["--json"] if as_json else [])]
    outcome = _check(run_cli(args, base_environ(tmp_path)), {2}, f"plan {'--json ' if as_json else ''}unreadable")
    assert f"cannot read the checkpoint {model}" in outcome.err and "config.json" in outcome.err


@pytest.mark.parametrize("command", [["plan", "--gpu", "t4"], ["plan", "--gpu", "t4", "--json"],
                                     ["preflight", "--json"], ["serve"]])  # fmt: skip
def test_size_as_a_bigger_card_than_the_one_present_exits_2(tmp_path: Path, command: list[str]) -> None:
    from test_probes_gpu import FakeDevice, FakeNvml

    env = {**base_environ(tmp_path), "T4SERVE_SIZE_AS": "a10g", "T4SERVE_PREFLIGHT": "warn"}
    # This machine has no GPU: NVML answers as a T4 host's would (FakeNvml stands for the driver's library).
    with mock.patch.dict(sys.modules, {"pynvml": FakeNvml([FakeDevice()])}):
        outcome = _check(run_cli(command, env), {2}, f"T4SERVE_SIZE_AS=a10g on a T4: {' '.join(command)}")
    assert "T4SERVE_SIZE_AS=a10g" in outcome.err and "larger than the card present" in outcome.err
    assert "--gpu-memory-utilization" not in outcome.out


# Pass-through vLLM flags that break health or supervision, or change what was sized: refused with what owns the
# choice, in every spelling vLLM's parser takes (= glued, underscores, capitals, abbreviations, one key of a dict
# flag); and two settings choosing compilation are an error, never a silent winner.


@pytest.mark.parametrize(
    ("args", "words"),
    [
        ("--headless", "starts none"),
        ("--uds /tmp/vllm.sock", "T4SERVE_HOST:T4SERVE_PORT"),
        ("--grpc", "gRPC"),
        ("--ssl-keyfile /k.pem --ssl-certfile /c.pem", "terminate TLS in front"),
        ("--SSL_CERTFILE=/c.pem", "vLLM's flags are lower case: --ssl-certfile"),  # vLLM's parser refuses it too
        ("--enable-ssl-refresh", "terminate TLS in front"),
        ("--revision 0123abc", "T4SERVE_MODEL=./m"),
        ("--rev=main", "T4SERVE_MODEL=./m"),
        ("--hf-overrides '{\"text_config\": {\"num_hidden_layers\": 2}}'", "edited config.json"),
        ("--hf_overrides.text_config.num_hidden_layers 2", "edited config.json"),
        ("--hf-config-path /elsewhere", "config.json it probed"),
    ],
)
def test_flags_that_break_supervision_or_sizing_are_refused(tmp_path: Path, args: str, words: str) -> None:
    env = {**base_environ(tmp_path), "T4SERVE_VLLM_ARGS": args}
    for command in (["plan", "--gpu", "t4"], ["plan", "--gpu", "t4", "--json"], ["serve"]):
        outcome = _check(run_cli(command, env), {2}, f"T4SERVE_VLLM_ARGS={args} ({command[0]})")
        assert "T4SERVE_VLLM_ARGS=" in outcome.err and words in outcome.err
        assert "must not contain" in outcome.err or "is not a flag of vLLM" in outcome.err


@pytest.mark.parametrize("flags", ["-O3", "--enforce-eager", "--compilation-config '{\"mode\": 0}'",
                                   "--compilation_config.mode=0", "-O.mode=0"])  # fmt: skip
@pytest.mark.parametrize("mode", ["eager", "full", "o1"])
def test_t4serve_compile_and_compilation_flags_together_are_an_error(tmp_path: Path, flags: str, mode: str) -> None:
    env = {**base_environ(tmp_path), "T4SERVE_VLLM_ARGS": flags, "T4SERVE_COMPILE": mode}
    outcome = _check(run_cli(["plan", "--gpu", "t4", "--json"], env), {2}, f"T4SERVE_COMPILE={mode} with {flags}")
    assert f"T4SERVE_COMPILE={mode} and compilation flags in T4SERVE_VLLM_ARGS" in outcome.err
    assert "unset T4SERVE_COMPILE" in outcome.err and outcome.out == ""
    # auto (or unset) leaves compilation to the flags, as documented: no conflict.
    for same in ({"T4SERVE_COMPILE": "auto"}, {}):
        env = {**base_environ(tmp_path), "T4SERVE_VLLM_ARGS": flags, **same}
        plan = json.loads(_check(run_cli(["plan", "--gpu", "t4", "--json"], env), {0}, f"{same} {flags}").out)
        assert plan["settings"]["T4SERVE_VLLM_ARGS"]["value"] != "(none)"


# The MCP server's doors: every malformed stdio message answered (the SDK dropped them, leaving the client to wait),
# tool arguments as JSON gives them (no "1_0" read as 10), one Authorization header (the check read the last of
# several), and no argument of megabytes echoed back or logged in full.

def test_every_malformed_stdio_message_is_answered(stdio_server: StdioServer) -> None:
    cases = [(b"not json", None, -32700), (b"{", None, -32700), (b"[]", None, -32600), (b"\xff\xfe", None, -32700),
             (b'{"jsonrpc": "2.0", "id": 7}', 7, -32600), (b'{"jsonrpc": "1.0", "id": "x", "method": "ping"}', "x",
             -32600), (b"[" * 100000 + b"]" * 100000, None, -32700),
             (b'{"jsonrpc":"2.0","id":9,"method":"tools/call","params":{"name":"plan","arguments":{"settings":'
              + b'{"a":' * 5000 + b"1" + b"}" * 5000 + b"}}}", None, -32700),
             (b'"' + b"x" * (5 << 20) + b'"', None, -32700)]  # fmt: skip
    for line, request_id, code in cases:
        tried(AREA)
        began = time.monotonic()
        stdio_server.send(line)
        answer = json.loads(stdio_server.answer())
        record(AREA, Outcome(0, json.dumps(answer), ""), {0}, seconds=time.monotonic() - began, deadline=5.0,
               label=f"stdio {line[:40]!r}")
        assert answer["id"] == request_id and answer["error"]["code"] == code, answer
    # Still serving after all of it.
    stdio_server.send(b'{"jsonrpc": "2.0", "id": 10, "method": "tools/list"}')
    assert json.loads(stdio_server.answer())["id"] == 10
    assert "Traceback" not in stdio_server.close()


def test_tool_arguments_are_taken_as_json_gives_them(stdio_server: StdioServer) -> None:
    """pydantic's lax mode read the string "1_0" as the integer 10, true as 1 and "nan" as a float."""
    for arguments in ({"tail": "1_0"}, {"tail": True}, {"tail": 5.0}, {"tail": "\u0663"}):
        tried(AREA)
        call = {"jsonrpc": "2.0", "id": 3, "method": "tools/call",
                "params": {"name": "server_logs", "arguments": arguments}}  # fmt: skip
        stdio_server.send(json.dumps(call).encode())
        answer = json.loads(stdio_server.answer())
        record(AREA, Outcome(0, json.dumps(answer), ""), {0}, label=f"server_logs {arguments}")
        # Since issue 33 the refusal says found / required / fix instead of pydantic's own text.
        text = answer["result"]["content"][0]["text"]
        assert answer["result"]["isError"] and "server_logs: invalid arguments" in text and "tail:" in text
    stdio_server.close()


def test_a_megabyte_argument_is_not_echoed_or_logged_in_full(stdio_server: StdioServer) -> None:
    model = "a" * (3 << 20)
    for name, arguments in (("plan", {"model": model}), ("plan", {"settings": {model: "1"}}),
                            ("start_vllm_server", {"model": model}), ("server_logs", {"since": model})):  # fmt: skip
        tried(AREA)
        call = {"jsonrpc": "2.0", "id": 4, "method": "tools/call", "params": {"name": name, "arguments": arguments}}
        stdio_server.send(json.dumps(call).encode())
        answer = stdio_server.answer(30)
        record(AREA, Outcome(0, answer.decode(errors="replace")[:2000], ""), {0}, label=f"{name} with 3 MB")
        assert len(answer) < 16_384 and json.loads(answer)["result"]["isError"]
    log = stdio_server.close()
    assert len(log) < 64_000 and "a" * 5000 not in log


def test_the_bearer_check_refuses_several_authorization_headers(tmp_path: Path) -> None:
    import http.client
    import socket
    import subprocess

    (tmp_path / "token").write_text(TOKEN + "\n")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "t4serve", "mcp", "--http", f"127.0.0.1:{port}",
                             "--compose-file", str(REPO / "compose.yaml")],
                            env=mcp_env(tmp_path, T4SERVE_MCP_TOKEN_FILE=str(tmp_path / "token")), cwd=tmp_path,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        wait_listening(port, proc)

        def post(*authorizations: str) -> int:
            # http.client sends a header given twice to putheader twice, in that order.
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            body = json.dumps(INITIALIZE).encode()
            conn.putrequest("POST", "/mcp")
            for header, value in (("Content-Type", "application/json"), ("Accept", "application/json, "
                                  "text/event-stream"), ("Content-Length", str(len(body))),
                                  *(("Authorization", a) for a in authorizations)):  # fmt: skip
                conn.putheader(header, value)
            conn.endheaders(body)
            status = conn.getresponse().status
            conn.close()
            return status

        good, bad = f"Bearer {TOKEN}", "Bearer wrong-token-0123456789abcd"
        assert post(good) == 200
        for headers in ((bad, good), (good, bad), (good, good)):
            tried(AREA)
            status = post(*headers)
            record(AREA, Outcome(0 if status == 401 else 1, str(status), ""), {0}, label=f"{len(headers)} headers")
    finally:
        proc.terminate()
        proc.wait(timeout=10)
