"""Issue 44's property suite: every leaf of a valid value, and every list and object in it, replaced by each kind of
hostile value (hardening.MUTATIONS: other types, NaN and Infinity, huge integers, 100,000 levels of nesting, unknown
enums, long text, control characters with a sentinel secret, a lone surrogate, a path), then read by the one reader
of its boundary and used by the real code after it:

- facts files: `pipeline.load_facts` (plan, profiles and preflight's `--facts` reader) for every mutation; the three
  commands for every mutation the reader accepts (of a list, its first two entries: the reader sees them all);
- the container's contract answers (status, bench start, bench status of every job and of one, the manifest, a
  failure), as the bytes a container prints: the MCP tools' own code (server_status, run_benchmark,
  benchmark_status, verify_gpu_arch, each as published: errors and results redacted; and host-check's own code for
  the manifest) through an engine whose `t4serve` answers them, with a sentinel as the host's API key;
- state files (state.json, config-error.json, exit-request.json): `healthcheck` and `status --json`.

No traceback (an internal error), no sentinel secret in what a tool returns, stores or says (a control character in
it counts as a leak too: container text that reached a result as it came), every run within its deadline, every exit
code one its command promises. Deterministic: the same runs each time.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from fake_engine import CACHE_DIR, FakeEngine
from hardening import (
    MUTATIONS,
    SENTINEL,
    Outcome,
    base_environ,
    files_text,
    label_of,
    mutated,
    node_paths,
    ready_state,
    record,
    run_cli,
    tried,
)
from sample_facts import MANIFEST
from test_mcp_tools import serve_state
from test_probes_gpu import FakeDevice, FakeNvml

from t4serve.config.settings import Settings
from t4serve.contract import CONTRACT
from t4serve.errors import ConfigError, T4ServeError
from t4serve.host.engine import Completed, ServiceContainer
from t4serve.host.hostcheck import check_host
from t4serve.mcp.benchtools import BenchTools
from t4serve.mcp.calls import ToolEnv
from t4serve.mcp.checktools import CheckTools
from t4serve.mcp.servertools import ServerTools
from t4serve.pipeline import load_facts
from t4serve.preflight import has_failures
from t4serve.serde import to_dict
from t4serve.supervise.state import ExitRequest

REPO = Path(__file__).resolve().parents[2]
RUN = "20261203-101010-abcdef"
# What no result may hold: the sentinel (the host's API key here) and control characters other than newline and tab.
UNCLEAN = ("\x00", "\x07", "\x08", "\x1b", "\x9b", "\r")
DEADLINE_S = 10.0


def _outcome(code: int, text: str) -> Outcome:
    return Outcome(code, text, "")


def _unclean(text: str) -> bool:
    return any(c in text for c in UNCLEAN)


# ----- facts files


@pytest.fixture(scope="module")
def facts_value(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A T4's recorded machine (the shipped published-run facts) with the QAT checkpoint as `probe --json` records
    it: what `plan --facts` replays."""
    tmp = tmp_path_factory.mktemp("facts")
    recorded = run_cli(["probe", "--json"], base_environ(tmp))
    assert recorded.code == 0, recorded.err
    value: dict[str, Any] = json.loads((REPO / "entrypoint/t4serve/data/facts/t4-published.json").read_text())
    value["model"] = json.loads(recorded.out)["model"]
    return value


COMMANDS = (("plan", {0, 2}), ("profiles", {0, 2}), ("preflight", {0, 2, 3}))


def test_every_leaf_of_a_facts_file(tmp_path: Path, facts_value: dict[str, Any]) -> None:
    area = "facts files (every leaf)"
    env = base_environ(tmp_path)
    path = tmp_path / "facts.json"
    for where in node_paths(facts_value):
        later_entry = any(isinstance(key, int) and key > 1 for key in where)
        for kind in MUTATIONS:
            label = label_of(where, kind)
            path.write_text(mutated(facts_value, where, kind), errors="surrogatepass")
            tried(area)
            began = time.monotonic()
            try:
                load_facts(path)
                accepted = True
                code, said = 0, ""
            except ConfigError as exc:
                accepted = False
                code, said = exc.exit_code, exc.message()
            except Exception as exc:
                accepted, code, said = False, 70, f"Traceback: {type(exc).__name__}: {exc}"
            record(area, _outcome(code, said), {0, 2}, secrets=(), seconds=time.monotonic() - began,
                   deadline=DEADLINE_S, label=f"the reader: {label}")  # fmt: skip
            if not accepted or later_entry:
                continue
            for command, allowed in COMMANDS:
                began = time.monotonic()
                outcome = run_cli([command, "--facts", str(path)], env)
                record(area, outcome, allowed, secrets=(), seconds=time.monotonic() - began, deadline=DEADLINE_S,
                       label=f"{command}: {label}")  # fmt: skip


# ----- the container's contract answers


def _valid_answers() -> dict[str, dict[str, Any]]:
    """One valid answer of each kind, as this checkout's container prints them, every optional part filled."""
    state = to_dict(serve_state("ready"))
    state.update(reason="all good", diagnosis="none", fix="none", exit_code=0, last_lines=["one", "two"],
                 estimate_seconds=180.0, estimate_phases={"loading_weights": 100.0}, wrapper_pid=42)  # fmt: skip
    ending = to_dict(ExitRequest(3, "vLLM restarted too often", 1_790_000_100.0))
    run = {"run_id": RUN, "folder": f"{CACHE_DIR}/bench/{RUN}", "state": "done", "exit_code": 0, "runs_done": 2,
           "runs_planned": 2, "started_at": 1_790_000_000.0}  # fmt: skip
    cell = {"model": "qat", "input_len": 512, "concurrency": 4, "repeats_ok": 1, "repeats_failed": 1,
            "completed_requests": 16, "failed_requests": 0, "throughput_tok_s": 210.5, "per_stream_tok_s": 52.1,
            "ttft_ms": 180.0, "variation_pct": 3.5, "errors": ["one run failed"]}  # fmt: skip
    return {
        "status": {"phase": "ready", "label": "ready", "state": state, "config_error": None, "ending": ending,
                   "contract": CONTRACT},
        "status, stopped on a configuration error": {
            "phase": "config_error", "label": "stopped", "state": None, "ending": None, "contract": CONTRACT,
            "config_error": {"what": "T4SERVE_PORT: bad", "found": "x", "required": "a port", "fix": "unset it",
                             "stopped_at": 1_790_000_000.0}},
        "a failure": {"failed": "ConfigError", "exit_code": 2, "what": "the server state file not found",
                      "found": "no file", "required": "serve writes it", "fix": "restart", "contract": CONTRACT},
        "bench status of one": {"run": run, "log_tail": "INFO done\n", "report_md": "# report\n", "cells": [cell],
                                "plots": ["result/throughput_vs_concurrency.png"], "contract": CONTRACT},
        "bench status of every job": {"root": f"{CACHE_DIR}/bench", "runs": [run], "contract": CONTRACT},
        "bench start": {"run": {**run, "state": "running", "exit_code": None}, "contract": CONTRACT},
        "manifest": {"manifest": to_dict(MANIFEST), "contract": CONTRACT},
        "manifest, read by host-check": {"manifest": to_dict(MANIFEST), "contract": CONTRACT},
    }  # fmt: skip


@pytest.fixture
def tool_env(tmp_path: Path) -> Iterator[tuple[FakeEngine, Callable[[], ToolEnv]]]:
    """A fresh ToolEnv per run (its own data folder) over one engine whose container runs, with the sentinel as the
    host's API key and a finished job folder in the container to copy."""
    engine = FakeEngine(tmp_path, manifest={k: v for k, v in to_dict(MANIFEST).items()
                                            if k not in ("path", "present", "error")})  # fmt: skip
    engine.project_directory.mkdir()
    (engine.project_directory / "compose.yaml").write_text((REPO / "compose.yaml").read_text())
    engine.container = ServiceContainer("c0ffee123456", "t4serve-t4serve-1", "running", "healthy", 0,
                                        "2026-12-03T10:00:00Z", engine.image_ref)  # fmt: skip
    job = engine.in_container(f"{CACHE_DIR}/bench/{RUN}")
    (job / "result").mkdir(parents=True)
    (job / "result" / "throughput_vs_concurrency.png").write_bytes(b"\x89PNG\r\n")
    (job / "bench.log").write_text("INFO done\n")
    count = iter(range(1_000_000))

    compose = engine.project_directory / "compose.yaml"

    def make() -> ToolEnv:
        return ToolEnv(engine=engine, environ={"T4SERVE_API_KEY": SENTINEL, "HF_HUB_OFFLINE": "1"},  # type: ignore[arg-type]
                       data_dir=tmp_path / f"data-{next(count)}", compose_file=compose, nvml=FakeNvml([FakeDevice()]))

    yield engine, make


def _drive(kind: str, text: str, engine: FakeEngine, make: Callable[[], ToolEnv]) -> tuple[int, str, str]:
    """The host's real code over the answer `text` of kind `kind`: (0 for a result, 5 for an error a user can meet,
    70 for any other exception), what it returned or said, and what it stored."""
    env = make()
    valid = _valid_answers()
    printed = Completed(0, text + "\n", "")
    engine.canned = {("status", "--json"): Completed(0, json.dumps(valid["status"]) + "\n", ""),
                     ("bench", "status", "--json"): Completed(0, json.dumps(valid["bench status of every job"]), ""),
                     ("bench", "status", "--json", RUN): Completed(0, json.dumps(valid["bench status of one"]), ""),
                     ("bench", "start"): Completed(0, json.dumps(valid["bench start"]) + "\n", ""),
                     ("probe",): Completed(0, json.dumps(valid["manifest"]) + "\n", "")}  # fmt: skip
    key = {"status": ("status", "--json"), "status, stopped on a configuration error": ("status", "--json"),
           "a failure": ("status", "--json"), "bench status of one": ("bench", "status", "--json", RUN),
           "bench status of every job": ("bench", "status", "--json"), "bench start": ("bench", "start"),
           "manifest": ("probe",), "manifest, read by host-check": ("probe",)}[kind]  # fmt: skip
    engine.canned[key] = printed
    try:
        if kind.startswith("status") or kind == "a failure":
            result: Any = anyio.run(ServerTools(env).server_status)
        elif kind == "bench status of one":
            result = anyio.run(BenchTools(env).benchmark_status, RUN)
        elif kind in ("bench status of every job", "bench start"):
            result = anyio.run(BenchTools(env).run_benchmark)
        elif kind == "manifest":
            result = anyio.run(CheckTools(env).verify_gpu_arch)
        else:
            # `t4serve host-check`'s own code (its command adds only the table and the exit code 3 on a failure).
            settings = Settings.from_environ({"HF_HUB_OFFLINE": "1", "HF_HOME": str(env.data_dir / "hf")})
            findings = check_host(settings, env.environ, env.engine, env.compose_file, nvml=env.nvml)
            return (3 if has_failures(findings) else 0), json.dumps([to_dict(f) for f in findings]), ""
        code, said = 0, result.model_dump_json()
    except T4ServeError as exc:  # host-check's: the exit code its command would end with
        code, said = exc.exit_code, exc.message()
    except Exception as exc:
        said = str(exc)
        code = 70 if type(exc).__name__ != "ToolError" or "internal error" in said else 5
    stored = files_text(env.data_dir) if env.data_dir.exists() else ""
    return code, said, stored


ANSWERS = list(_valid_answers())


@pytest.mark.parametrize("kind", ANSWERS)
def test_every_leaf_of_a_containers_answer(tool_env: tuple[FakeEngine, Callable[[], ToolEnv]], kind: str) -> None:
    area = "contract answers (every leaf)"
    value = _valid_answers()[kind]
    code, said, _ = _drive(kind, json.dumps(value), *tool_env)
    # The valid answer itself is read and used (host-check's findings of this machine may fail: exit 3).
    assert code in ({0, 3} if "host-check" in kind else {0}), said
    for where in node_paths(value):
        for mutation in MUTATIONS:
            label = f"{kind}: {label_of(where, mutation)}"
            tried(area)
            began = time.monotonic()
            code, said, stored = _drive(kind, mutated(value, where, mutation), *tool_env)
            # The unclean characters count with the leaks: container text that reached a result as it came.
            shown = said if not _unclean(said) else said + SENTINEL
            record(area, _outcome(code, shown), {0, 3, 5} if "host-check" in kind else {0, 5}, written=stored,
                   seconds=time.monotonic() - began,
                   deadline=DEADLINE_S, label=label)  # fmt: skip


# ----- state files


def _state_files() -> dict[str, dict[str, Any]]:
    state = ready_state(9)
    state.update(figures={"kv_tokens": {"name": "kv_tokens", "value": 5.0, "unit": "tokens", "line": "KV 5"}},
                 predictions={"kv_tokens": {"name": "kv_tokens", "value": 5.0, "unit": "tokens", "how": "a / b"}},
                 canary={"ok": True, "prompt": "17*23=", "text": "391", "reason": None, "hint": None, "seconds": 0.4},
                 last_lines=["one"], estimate_seconds=10.0, estimate_phases={"loading_weights": 5.0}, reason="r")
    return {
        "state.json": state,
        "config-error.json": {"what": "bad", "found": "x", "required": "y", "fix": "z", "stopped_at": 1.0},
        "exit-request.json": {"code": 3, "reason": "too many restarts", "requested_at": 1.0},
    }  # fmt: skip


@pytest.mark.parametrize("name", list(_state_files()))
def test_every_leaf_of_a_state_file(tmp_path: Path, name: str) -> None:
    area = "state files (every leaf)"
    files = _state_files()
    env = base_environ(tmp_path)
    folder = tmp_path / "state"
    folder.mkdir()
    for where in node_paths(files[name]):
        for mutation in MUTATIONS:
            label = f"{name}: {label_of(where, mutation)}"
            tried(area)
            (folder / "state.json").write_text(json.dumps(files["state.json"]))
            (folder / name).write_text(mutated(files[name], where, mutation), errors="surrogatepass")
            for args, allowed in ((["healthcheck", "--timeout", "1"], {0, 1}), (["status", "--json"], {0, 2})):
                began = time.monotonic()
                outcome = run_cli(args, env)
                record(area, outcome, allowed, secrets=(), seconds=time.monotonic() - began, deadline=DEADLINE_S,
                       label=f"{args[0]}: {label}")  # fmt: skip
            for other in ("config-error.json", "exit-request.json"):
                (folder / other).unlink(missing_ok=True)


def test_the_start_tool_reads_the_answers_too(tool_env: tuple[FakeEngine, Callable[[], ToolEnv]]) -> None:
    """start_vllm_server's status after compose up is the same reader's: a hostile answer is an error, never a bug."""
    engine, make = tool_env
    env = make()
    engine.container = None
    (engine.project_directory / "secrets").mkdir()
    (engine.project_directory / "secrets" / "hf_token").write_text("hf_x")
    engine.canned = {("status", "--json"): Completed(0, "[" * 100_000 + "\n", "")}
    tried("contract answers (every leaf)")
    try:
        anyio.run(ServerTools(env).start_vllm_server)
        code, said = 0, ""
    except Exception as exc:
        said = str(exc)
        code = 70 if type(exc).__name__ != "ToolError" or "internal error" in said else 5
    record("contract answers (every leaf)", _outcome(code, said), {5}, label="start_vllm_server, nested answer")
