"""The stand-in vLLM server (tests/standin/vllm_standin.py) behaves as its docstring promises, in every mode.

Each test starts it as its own process on 127.0.0.1 and a free port, with a load of a few hundredths of a second,
and talks HTTP to it with the standard library only; every wait is bounded.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from picker_scrape import PICKER, families, picker_problems

STANDIN = Path(__file__).resolve().parents[1] / "standin" / "vllm_standin.py"
MODEL = "google/gemma-4-E2B-it"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Standin:
    def __init__(self, port: int, proc: subprocess.Popen[str]) -> None:
        self.port = port
        self.proc = proc
        self._out: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._out.append(line)

    @property
    def output(self) -> str:
        return "".join(self._out)

    def wait_ready(self, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"stand-in exited {self.proc.returncode}:\n{self.output}")
            if "Application startup complete." in self.output:
                return
            time.sleep(0.02)
        raise AssertionError(f"stand-in not ready in {timeout}s:\n{self.output}")

    def finish(self, timeout: float = 10.0) -> int:
        rc = self.proc.wait(timeout=timeout)
        self._reader.join(timeout=2)
        return rc

    def request(
        self,
        method: str,
        path: str,
        body: dict[str, Any] | None = None,
        timeout: float = 5.0,
        headers: dict[str, str] | None = None,
    ) -> tuple[int, str]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            data = json.dumps(body).encode() if body is not None else None
            headers = {**({"Content-Type": "application/json"} if data else {}), **(headers or {})}
            conn.request(method, path, body=data, headers=headers)
            resp = conn.getresponse()
            return resp.status, resp.read().decode()
        finally:
            conn.close()


@pytest.fixture
def start() -> Iterator[Any]:
    started: list[Standin] = []

    def _start(*extra: str, env: dict[str, str] | None = None, ready: bool = True, model: str = MODEL) -> Standin:
        port = free_port()
        full_env = {**os.environ, "T4SERVE_STANDIN_LOAD_SECONDS": "0.05", **(env or {})}
        proc = subprocess.Popen(
            [sys.executable, str(STANDIN), "serve", model, "--host", "127.0.0.1", "--port", str(port), *extra],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=full_env,
        )
        standin = Standin(port, proc)
        started.append(standin)
        if ready:
            standin.wait_ready()
        return standin

    yield _start
    for standin in started:
        if standin.proc.poll() is None:
            standin.proc.kill()
            standin.proc.wait(timeout=5)


def sse_events(text: str) -> list[Any]:
    events = [block.removeprefix("data: ") for block in text.split("\n\n") if block.strip()]
    assert events[-1] == "[DONE]"
    return [json.loads(e) for e in events[:-1]]


def test_ok_serves_health_models_metrics_and_logs_vllm_lines(start: Any) -> None:
    s = start("--max-model-len", "16384", "--dtype", "float16", "--served-model-name", "gemma")
    assert s.request("GET", "/health") == (200, "")
    status, body = s.request("GET", "/v1/models")
    assert status == 200
    assert [m["id"] for m in json.loads(body)["data"]] == ["gemma"]
    out = s.output
    assert "vLLM server version 0.33.0, serving model google/gemma-4-E2B-it" in out
    assert "Model loading took 9.8 GiB memory and 157.180000 seconds" in out
    assert "GPU KV cache size: 315,974 tokens, Maximum concurrency for 16,384 tokens per request: 19.29x" in out
    assert "Graph capturing finished in" in out
    assert out.index("Loading weights took") < out.index("Starting vLLM server on http://127.0.0.1:")
    s.request("POST", "/v1/completions", {"model": "gemma", "prompt": "a b c", "max_tokens": 4, "ignore_eos": True})
    status, metrics = s.request("GET", "/metrics")
    assert status == 200
    assert 'vllm:generation_tokens_total{engine="0",model_name="gemma"} 4.0' in metrics
    assert 'vllm:prompt_tokens_total{engine="0",model_name="gemma"} 3.0' in metrics
    s.proc.send_signal(signal.SIGTERM)
    assert s.finish() == 0
    assert "Application shutdown complete." in s.output


@pytest.mark.parametrize(
    ("extra", "env"),
    [((), {"VLLM_API_KEY": "sk-standin"}), (("--api-key", "sk-other", "sk-standin"), {"VLLM_API_KEY": "sk-env"})],
)
def test_api_key_guards_v1_as_vllm_does(start: Any, extra: tuple[str, ...], env: dict[str, str]) -> None:
    s = start("--served-model-name", "gemma", *extra, env=env)
    unauthorized = (401, json.dumps({"error": "Unauthorized"}))
    assert s.request("GET", "/v1/models") == unauthorized
    assert s.request("GET", "/v1/models", headers={"Authorization": "Bearer sk-wrong"}) == unauthorized
    assert s.request("GET", "/v1/models", headers={"Authorization": "Basic sk-standin"}) == unauthorized
    body = {"model": "gemma", "prompt": "17*23=", "max_tokens": 8}
    assert s.request("POST", "/v1/completions", body)[0] == 401
    # The flag wins over VLLM_API_KEY, as in vLLM.
    assert s.request("GET", "/v1/models", headers={"Authorization": f"Bearer {env['VLLM_API_KEY']}"})[0] == (
        401 if extra else 200
    )
    auth = {"Authorization": "bearer sk-standin"}
    assert s.request("GET", "/v1/models", headers=auth)[0] == 200
    assert s.request("POST", "/v1/completions", body, headers=auth)[0] == 200
    assert s.request("GET", "/health") == (200, "")
    assert s.request("GET", "/metrics")[0] == 200
    assert "sk-standin" not in s.output


def test_invocations_runs_the_model_without_the_key_as_vllm_does(start: Any) -> None:
    """vLLM 0.33's guard covers /v1, /v2, /inference and /cohere only: SageMaker's /invocations answers keyless."""
    s = start("--served-model-name", "gemma", env={"VLLM_API_KEY": "sk-standin"})
    status, body = s.request("POST", "/invocations", {"model": "gemma", "prompt": "17*23=", "max_tokens": 8})
    assert status == 200 and json.loads(body)["choices"][0]["text"] == "391"
    status, body = s.request("POST", "/invocations", {"model": "gemma", "messages": [{"role": "user",
                                                                                     "content": "17*23="}]})
    assert status == 200 and json.loads(body)["choices"][0]["message"]["content"] == "391"
    status, body = s.request("POST", "/invocations", {"model": "gemma"})
    assert status == 400 and "Cannot find suitable handler" in body
    assert s.request("GET", "/ping") == (200, "") and s.request("POST", "/ping")[0] == 200


def test_middleware_wraps_every_route_as_vllm_adds_it(start: Any) -> None:
    """`--middleware t4serve.apiguard.ApiKeyGuard`: the class itself, driven as ASGI, closes /invocations too."""
    s = start("--served-model-name", "gemma", "--middleware", "t4serve.apiguard.ApiKeyGuard",
              env={"VLLM_API_KEY": "sk-standin"})  # fmt: skip
    unauthorized = (401, json.dumps({"error": "Unauthorized"}))
    prompt = {"model": "gemma", "prompt": "17*23=", "max_tokens": 8}
    assert s.request("POST", "/invocations", prompt) == unauthorized
    assert s.request("POST", "/invocations", prompt, headers={"Authorization": "Bearer sk-wrong"}) == unauthorized
    assert s.request("POST", "/nonexistent") == unauthorized
    auth = {"Authorization": "Bearer sk-standin"}
    status, body = s.request("POST", "/invocations", prompt, headers=auth)
    assert status == 200 and json.loads(body)["choices"][0]["text"] == "391"
    assert s.request("POST", "/v1/completions", prompt, headers=auth)[0] == 200
    for path in ("/health", "/ping", "/metrics"):
        assert s.request("GET", path)[0] == 200, path


def test_middleware_that_cannot_be_imported_ends_the_start(start: Any) -> None:
    s = start("--middleware", "t4serve.apiguard.NoSuchGuard", ready=False)
    assert s.finish() == 1
    assert "AttributeError" in s.output and "NoSuchGuard" in s.output


def test_no_key_means_no_authentication(start: Any) -> None:
    s = start("--served-model-name", "gemma", env={"VLLM_API_KEY": ""})
    assert s.request("GET", "/v1/models")[0] == 200


@pytest.mark.parametrize(("extra", "block"), [(("--block-size", "16"), 16), (("--block-size", "32"), 32), ((), 16)])
def test_what_the_endpoint_picker_scrapes_passes_the_key_guard(start: Any, extra: tuple[str, ...], block: int) -> None:
    """llm-d-router's endpoint picker asks each pod for /metrics without a key (tests/unit/picker_scrape.py): behind
    t4serve's guard with a key set, the stand-in answers it with vLLM's queue, running, KV-use and cache-info families,
    the block size it was given (vLLM's 16 when none) in cache_config_info's labels, while the API stays guarded."""
    s = start("--served-model-name", "gemma", "--middleware", "t4serve.apiguard.ApiKeyGuard", "--max-model-len", "8192",
              *extra, env={"VLLM_API_KEY": "sk-standin"})  # fmt: skip
    assert s.request("GET", "/v1/models")[0] == 401
    status, text = s.request("GET", PICKER["scrape"]["path"])
    assert status == 200
    assert picker_problems(text, block) == []
    info = families(text)[PICKER["vllm"]["cacheInfoSpec"]].samples[0]
    assert info.value == 1.0 and info.labels["kv_cache_size_tokens"] == "315974" and info.labels["engine"] == "0"
    # The checks see what would fail the picker: another block size, an untyped family, a family it reads missing.
    assert picker_problems(text, 64) and picker_problems(text.replace("# TYPE vllm:num_requests_waiting gauge\n", ""),
                                                         block)  # fmt: skip
    assert picker_problems("\n".join(line for line in text.splitlines() if "cache_config_info" not in line), block)
    doubled = text + "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 0.0\n"
    assert any("second TYPE" in p for p in picker_problems(doubled, block))


def test_qat_checkpoint_logs_its_own_figures(start: Any) -> None:
    s = start("--max-model-len", "8192", model="google/gemma-4-E2B-it-qat-w4a16-ct")
    assert "Using MarlinLinearKernel for CompressedTensorsWNA16" in s.output
    assert "Model loading took 8.02 GiB memory and 98.700000 seconds" in s.output
    assert "Maximum concurrency for 8,192 tokens per request: 38.57x" in s.output


def test_port_stays_closed_while_loading(start: Any) -> None:
    # By the stand-in's own log, not a fixed sleep (0.3 s did not see it start on a loaded machine): between "Starting
    # to load model" and "Model loading took" the port is closed. A check that only ran after the load had ended (the
    # test descheduled for the load's second) proves nothing, so it is tried again on a fresh stand-in.
    for _attempt in range(3):
        s = start(env={"T4SERVE_STANDIN_MODE": "slow-load", "T4SERVE_STANDIN_LOAD_SECONDS": "1.0"}, ready=False)
        deadline = time.monotonic() + 30
        while "Starting to load model" not in s.output and time.monotonic() < deadline:
            time.sleep(0.02)
        assert "Starting to load model" in s.output, s.output
        try:
            socket.create_connection(("127.0.0.1", s.port), timeout=1).close()
            opened = True
        except ConnectionRefusedError:
            opened = False
        time.sleep(0.2)  # the reader thread catches up with what was printed before the connection
        assert not opened or "Model loading took" in s.output, "the port opened while the model loaded"
        if not opened:
            break
    assert not opened, "three tries all came after the load had ended: the closed port was never checked"
    s.wait_ready(timeout=30)
    assert s.request("GET", "/health")[0] == 200


def test_completion_answers_the_canary_and_honours_max_tokens(start: Any) -> None:
    s = start()
    status, body = s.request("POST", "/v1/completions", {"model": MODEL, "prompt": "17*23=", "max_tokens": 8})
    assert status == 200
    reply = json.loads(body)
    assert reply["choices"][0]["text"] == "391"
    assert reply["choices"][0]["finish_reason"] == "stop"
    assert reply["usage"] == {"prompt_tokens": 4, "total_tokens": 5, "completion_tokens": 1}
    body_ignore = {"model": MODEL, "prompt": "17*23=", "max_tokens": 8, "ignore_eos": True}
    reply = json.loads(s.request("POST", "/v1/completions", body_ignore)[1])
    assert reply["usage"]["completion_tokens"] == 8
    assert reply["choices"][0]["text"].startswith("391 ")
    assert reply["choices"][0]["finish_reason"] == "length"
    again = json.loads(s.request("POST", "/v1/completions", body_ignore)[1])
    assert again["choices"][0]["text"] == reply["choices"][0]["text"]


def test_streaming_completion_sends_deltas_usage_and_done(start: Any) -> None:
    s = start()
    body = {
        "model": MODEL,
        "prompt": "one two three",
        "max_tokens": 5,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    status, text = s.request("POST", "/v1/completions", body)
    assert status == 200
    events = sse_events(text)
    token_events = [e for e in events if e["choices"]]
    assert len(token_events) == 5
    assert [e["choices"][0]["finish_reason"] for e in token_events] == [None, None, None, None, "length"]
    assert events[-1]["choices"] == []
    assert events[-1]["usage"] == {"prompt_tokens": 3, "total_tokens": 8, "completion_tokens": 5}
    no_usage = sse_events(s.request("POST", "/v1/completions", {**body, "stream_options": None})[1])
    assert all("usage" not in e for e in no_usage)


def test_streaming_chat_sends_role_then_content(start: Any) -> None:
    s = start()
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "What is 17*23?"}],
        "max_tokens": 3,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    events = sse_events(s.request("POST", "/v1/chat/completions", body)[1])
    assert events[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert events[1]["choices"][0]["delta"] == {"content": "391"}
    assert events[-1]["usage"]["completion_tokens"] == 1


def test_rejects_unknown_model_and_overlong_request(start: Any) -> None:
    s = start("--max-model-len", "64")
    status, body = s.request("POST", "/v1/completions", {"model": "other", "prompt": "x"})
    assert status == 404
    assert "does not exist" in json.loads(body)["error"]["message"]
    status, body = s.request("POST", "/v1/completions", {"model": MODEL, "prompt": "x " * 60, "max_tokens": 10})
    assert status == 400
    assert "maximum context length is 64 tokens" in json.loads(body)["error"]["message"]


@pytest.mark.parametrize(
    ("kind", "expected"),
    [
        ("cuda-oom", "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate"),
        ("host-oom", "Failed core proc(s): {'EngineCore_DP0': -9}"),
        ("clamp", "Required: 98304, Hardware limit: 65536"),
        ("bf16", "Bfloat16 is only supported on GPUs with compute capability of at least 8.0"),
        ("shm", "No space left on device (28)"),
        ("driver", "The NVIDIA driver on your system is too old"),
        ("gated", "Cannot access gated repo for url https://huggingface.co/google/gemma-4-E2B-it/"),
    ],
)
def test_crash_on_load_prints_the_failure_and_exits_1(start: Any, kind: str, expected: str) -> None:
    env = {"T4SERVE_STANDIN_MODE": "crash-on-load", "T4SERVE_STANDIN_CRASH_LOG": kind}
    s = start(env=env, ready=False)
    assert s.finish() == 1
    assert expected in s.output
    assert "Application startup complete." not in s.output


def test_crash_after_ready_turns_health_503_then_exits_1(start: Any) -> None:
    env = {"T4SERVE_STANDIN_MODE": "crash-after-ready", "T4SERVE_STANDIN_CRASH_AFTER": "0.3"}
    s = start(env=env)
    assert s.request("GET", "/health")[0] == 200
    deadline = time.monotonic() + 5
    while s.request("GET", "/health")[0] == 200 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert s.request("GET", "/health")[0] == 503
    assert s.request("POST", "/v1/completions", {"model": MODEL, "prompt": "x"})[0] == 500
    assert s.finish() == 1
    assert "EngineDeadError" in s.output


def test_hang_accepts_connections_but_never_answers(start: Any) -> None:
    s = start(env={"T4SERVE_STANDIN_MODE": "hang"})
    with pytest.raises(TimeoutError):
        s.request("GET", "/health", timeout=0.5)
    s.proc.send_signal(signal.SIGTERM)
    assert s.finish() == 0


def test_hang_after_some_seconds_answers_first(start: Any) -> None:
    s = start(env={"T4SERVE_STANDIN_MODE": "hang", "T4SERVE_STANDIN_HANG_AFTER": "0.5"})
    assert s.request("GET", "/health")[0] == 200
    time.sleep(0.7)
    with pytest.raises(TimeoutError):
        s.request("GET", "/health", timeout=0.5)


@pytest.mark.parametrize(("garbage", "token"), [("empty", ""), ("pad", "<pad>")])
def test_garbage_returns_no_usable_text(start: Any, garbage: str, token: str) -> None:
    s = start(env={"T4SERVE_STANDIN_MODE": "garbage", "T4SERVE_STANDIN_GARBAGE": garbage})
    reply = json.loads(s.request("POST", "/v1/completions", {"model": MODEL, "prompt": "17*23=", "max_tokens": 3})[1])
    assert reply["choices"][0]["text"] == token
    assert reply["usage"]["completion_tokens"] == 1


def stream_in_background(s: Standin, max_tokens: int) -> tuple[threading.Thread, list[str]]:
    result: list[str] = []
    body = {"model": MODEL, "prompt": "drain me", "max_tokens": max_tokens, "ignore_eos": True, "stream": True}

    def run() -> None:
        result.append(s.request("POST", "/v1/completions", body, timeout=10)[1])

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, result


def test_sigterm_drains_in_flight_requests_within_shutdown_timeout(start: Any) -> None:
    s = start("--shutdown-timeout", "5", env={"T4SERVE_STANDIN_TOKEN_DELAY": "0.05"})
    thread, result = stream_in_background(s, 20)
    time.sleep(0.3)
    s.proc.send_signal(signal.SIGTERM)
    thread.join(timeout=10)
    assert s.finish() == 0
    events = sse_events(result[0])
    assert len(events) == 20
    assert events[-1]["choices"][0]["finish_reason"] == "length"
    assert "draining in-flight requests count=1 timeout=5s" in s.output
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", s.port), timeout=1).close()


def test_sigterm_without_shutdown_timeout_aborts_in_flight_requests(start: Any) -> None:
    s = start(env={"T4SERVE_STANDIN_TOKEN_DELAY": "0.05"})
    thread, result = stream_in_background(s, 200)
    time.sleep(0.3)
    s.proc.send_signal(signal.SIGTERM)
    thread.join(timeout=10)
    assert s.finish() == 0
    events = sse_events(result[0])
    assert events[-1]["choices"][0]["finish_reason"] == "abort"
    assert len(events) < 200
    assert "aborting in-flight requests count=1" in s.output


def test_other_subcommands_go_to_the_next_real_vllm_on_path(tmp_path: Path) -> None:
    mine, theirs = tmp_path / "standin", tmp_path / "real"
    mine.mkdir()
    theirs.mkdir()
    (mine / "vllm").symlink_to(STANDIN)
    real = theirs / "vllm"
    real.write_text('#!/bin/sh\necho real-vllm "$@"\n')
    real.chmod(0o755)
    env = {**os.environ, "PATH": f"{mine}{os.pathsep}{theirs}{os.pathsep}{os.environ['PATH']}"}
    done = subprocess.run(
        ["vllm", "bench", "serve", "--seed", "1"], env=env, capture_output=True, text=True, timeout=10
    )
    assert done.stdout.strip() == "real-vllm bench serve --seed 1"
    alone = {**os.environ, "PATH": f"{mine}{os.pathsep}/usr/bin{os.pathsep}/bin"}
    done = subprocess.run(["vllm", "bench", "serve"], env=alone, capture_output=True, text=True, timeout=10)
    assert done.returncode == 2
    assert "no other `vllm` executable on PATH" in done.stderr


def test_unknown_mode_is_refused_with_the_choices(start: Any) -> None:
    s = start(env={"T4SERVE_STANDIN_MODE": "explode"}, ready=False)
    assert s.finish() == 2
    assert "crash-on-load" in s.output
