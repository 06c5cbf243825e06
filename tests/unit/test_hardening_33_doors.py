"""Issue 33's report, items 9 and 10: the MCP server's frames and arguments (the docker-compose fallback, a request
over 4 MiB, unknown argument names, an id that is an object, benchmark progress, argument errors that say found /
required / fix) and bench's doors (a base URL that is none, a model name that made hidden raw files, a ceiling for a
model not benchmarked, an infinite goodput). Each failed on the code before the fix (see the commit).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import time
from pathlib import Path
from typing import Any

import pytest
from hardening import SENTINEL, SENTINEL_TOKEN, Outcome, StdioServer, base_environ, record, run_cli, tried

AREA = "issue 33 regressions"


def _check(outcome: Outcome, allowed: set[int], label: str, **kwargs: Any) -> Outcome:
    tried(AREA)
    record(AREA, outcome, allowed, secrets=(SENTINEL, SENTINEL_TOKEN), label=label, **kwargs)
    return outcome


# 9. MCP


@pytest.mark.parametrize("answer", [
    "docker: 'compose' is not a docker command.\nSee 'docker --help'\n",
    "unknown command \"compose\" for \"docker\"\n\nUsage:  docker [OPTIONS] COMMAND\n\nRun 'docker --help'\n",
])  # fmt: skip
def test_without_the_compose_plugin_docker_compose_is_used(tmp_path: Path, answer: str) -> None:
    """Docker 20.10 and 28.2 say so above their usage lines; only the last line was read."""
    from test_host_docker import make_clients

    from t4serve.host.docker import find_compose

    docker, standalone = make_clients(tmp_path / "bin", {"compose version": [1, "", answer]})
    tried(AREA)
    chosen = find_compose(str(docker), {"PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}"})
    record(AREA, Outcome(0, str(chosen), ""), {0}, label="compose fallback")
    assert chosen == (str(standalone),)


def _answer(server: StdioServer, line: bytes, label: str) -> dict[str, Any]:
    tried(AREA)
    began = time.monotonic()
    server.send(line)
    answer: dict[str, Any] = json.loads(server.answer())
    record(AREA, Outcome(0, json.dumps(answer)[:2000], ""), {0}, seconds=time.monotonic() - began, deadline=10.0,
           label=label)
    return answer


def test_a_request_over_4_mib_is_answered_with_its_id(stdio_server: StdioServer) -> None:
    call = {"jsonrpc": "2.0", "id": 42, "method": "tools/call",
            "params": {"name": "plan", "arguments": {"model": "a" * (5 << 20)}}}  # fmt: skip
    answer = _answer(stdio_server, json.dumps(call).encode(), "5 MiB request")
    assert answer["id"] == 42 and answer["error"]["code"] == -32700
    # An "id" inside the params is not the request's.
    nested = b'{"jsonrpc": "2.0", "params": {"id": 9, "x": "' + b"b" * (5 << 20) + b'"}, "id": "r"}'
    assert _answer(stdio_server, nested, "5 MiB, id last")["id"] is None
    stdio_server.close()


@pytest.mark.parametrize("request_id", [{"a": 1}, [1], None, True])
def test_a_request_whose_id_is_not_a_string_or_integer_is_answered(stdio_server: StdioServer, request_id: Any) -> None:
    line = json.dumps({"jsonrpc": "2.0", "id": request_id, "method": "ping"}).encode()
    answer = _answer(stdio_server, line, f"id {request_id!r}")
    assert answer["id"] is None and answer["error"]["code"] == -32600 and "id" in answer["error"]["message"]
    stdio_server.close()


@pytest.mark.parametrize(("name", "arguments", "words"), [
    ("server_logs", {"tailx": 5}, "tailx: not an argument of server_logs"),
    ("start_vllm_server", {"model": "qat", "gpu": 1}, "gpu: not an argument of start_vllm_server"),
    ("server_logs", {"tail": "1_0"}, "tail: Input should be a valid integer"),
])  # fmt: skip
def test_tool_argument_errors_say_found_required_fix(stdio_server: StdioServer, name: str,
                                                     arguments: dict[str, Any], words: str) -> None:  # fmt: skip
    call = {"jsonrpc": "2.0", "id": 5, "method": "tools/call", "params": {"name": name, "arguments": arguments}}
    answer = _answer(stdio_server, json.dumps(call).encode(), f"{name} {arguments}")
    text = answer["result"]["content"][0]["text"]
    assert answer["result"]["isError"] and words in text
    assert "found:" in text and "required:" in text and "fix:" in text and "validation error" not in text
    stdio_server.close()


def test_run_benchmark_reports_progress(tmp_path: Path) -> None:
    from test_mcp_tools import call, environ, serve_state, tool_env
    from test_mcp_tools import engine as make_engine

    fake = make_engine.__wrapped__(tmp_path)  # type: ignore[attr-defined]
    env = tool_env(fake, environ.__wrapped__(tmp_path))  # type: ignore[attr-defined]
    call(env, "start_vllm_server")
    fake.state = serve_state("ready")
    seen: list[str | None] = []

    async def progress(value: float, total: float | None, message: str | None) -> None:
        seen.append(message)

    tried(AREA)
    result = call(env, "run_benchmark", {"inputs": [512], "concurrency": [1]}, progress=progress)
    record(AREA, Outcome(1 if result.is_error else 0, str(seen), ""), {0}, label="run_benchmark progress")
    assert any(m and m.startswith("starting t4serve bench") for m in seen)
    assert any(m and "started; follow it with benchmark_status" in m for m in seen)


def test_a_running_benchmark_says_its_runs_planned_before_the_first_ends(tmp_path: Path) -> None:
    """runs.json holds the runs planned before the first run ends: `t4serve bench status` (what benchmark_status
    reads) answers 0 of N while the first run waits on a server that does not answer."""
    import socket
    import threading

    from t4serve.bench.jobs import progress
    from t4serve.bench.runner import BenchOptions, run_bench

    folder = tmp_path / "20261203-101010-abcdef"
    out = folder / "result"
    out.mkdir(parents=True)
    with socket.create_server(("127.0.0.1", 0)) as silent:  # accepts, never answers: /v1/models waits
        port = silent.getsockname()[1]
        opts = BenchOptions(models=["qat"], inputs=[8], concurrencies=[1, 2], repeats=1, output_len=4, output=out,
                            num_prompts=None, base_urls={"qat": f"http://127.0.0.1:{port}"}, tokenizers={},
                            ceilings={"qat": 1.0}, vllm=str(tmp_path / "no-vllm"), num_warmups=0, warmup_run=False,
                            ready_timeout_s=1.0, cell_timeout_s=5.0)  # fmt: skip
        tried(AREA)

        def run() -> None:
            # No server answers and no vLLM: the runs fail, whatever the sweep ends with.
            with contextlib.suppress(Exception):
                run_bench(opts, environ={"PATH": os.environ["PATH"]}, stream=io.StringIO())

        sweep = threading.Thread(target=run, daemon=True)
        sweep.start()
        deadline = time.monotonic() + 30
        seen = progress(folder)
        while seen.runs_planned is None and time.monotonic() < deadline:
            time.sleep(0.05)
            seen = progress(folder)
        record(AREA, Outcome(0, str(seen), ""), {0}, label="bench 0/N before the first run")
        assert (seen.runs_done, seen.runs_planned) == (0, 2)
    sweep.join(60)


# 10. bench


@pytest.mark.parametrize("url", ["notaurl", "http://", "ftp://127.0.0.1:8000", "http://0x7f000001:8000",
                                 "http://127.0.0.1:\u0668\u0660", "http://user:pw@127.0.0.1:8000"])  # fmt: skip
def test_bench_refuses_a_base_url_that_is_no_server_url(tmp_path: Path, url: str) -> None:
    out = tmp_path / "out"
    outcome = _check(run_cli(["bench", "--models", "qat", "--base-url", url, "--output", str(out)],
                             base_environ(tmp_path)), {2}, f"--base-url {url}")
    assert "--base-url" in outcome.err and "fix:" in outcome.err and not out.exists()


@pytest.mark.parametrize("args", [["--ceiling", "bf16=50"], ["--base-url", "bf16=http://127.0.0.1:8000"]])
def test_bench_refuses_a_setting_for_a_model_it_does_not_run(tmp_path: Path, args: list[str]) -> None:
    out = tmp_path / "out"
    outcome = _check(run_cli(["bench", "--models", "qat", *args, "--output", str(out)], base_environ(tmp_path)),
                     {2}, f"bench {' '.join(args)}")
    assert "not in --models" in outcome.err and not out.exists()


@pytest.mark.parametrize("model", ["../x", ".hidden", "./m", "_x", "/abs/.m"])
def test_no_model_name_makes_a_hidden_raw_file(model: str) -> None:
    from t4serve.bench.grid import Cell
    from t4serve.bench.results import RAW_NAME, raw_name

    tried(AREA)
    name = raw_name(model, Cell(512, 1, 1))
    record(AREA, Outcome(0, name, ""), {0}, label=f"raw name of {model}")
    assert not name.startswith((".", "_")) and "/" not in name and RAW_NAME.match(name)


@pytest.mark.parametrize("duration", [1e-300, 5e-324, 1e-12])
def test_goodput_of_a_near_zero_duration_is_no_figure(duration: float) -> None:
    from t4serve.bench.results import goodput_from_detail

    data = {"ttfts": [0.01], "latencies": [0.02], "output_lens": [2], "errors": [""], "duration": duration}
    tried(AREA)
    goodput = goodput_from_detail(data, 1000.0, 1000.0)
    record(AREA, Outcome(0, str(goodput), ""), {0}, label=f"goodput over {duration} s")
    assert goodput is None
