"""`t4serve mcp` as a real process: over stdio with the MCP SDK's stdio client, and over streamable HTTP (bearer
token required, Host header checked by the SDK's DNS-rebinding protection). No Docker engine is needed: DOCKER names
a missing client (and T4SERVE_MCP_COMPOSE a missing compose), so the engine-side tools answer with their
found / required / fix."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from hardening import wait_listening
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client

from t4serve.commands.mcp import allowed_hosts, parse_listen, read_token
from t4serve.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]
TOKEN = "mcp-test-token-0123456789abcdef"


def server_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp_path), "HF_HUB_OFFLINE": "1",
            "DOCKER": str(tmp_path / "no-docker-here"), "T4SERVE_MCP_COMPOSE": str(tmp_path / "no-compose-here"),
            "T4SERVE_MCP_DATA_DIR": str(tmp_path / "data"), **extra}  # fmt: skip


def test_stdio_with_the_sdk_client(tmp_path: Path) -> None:
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "t4serve", "mcp", "--read-only", "--compose-file", str(REPO / "compose.yaml")],
        env=server_env(tmp_path),
        cwd=str(tmp_path),
    )

    async def session() -> tuple[set[str], Any, Any]:
        async with Client(params) as client:
            names = {t.name for t in (await client.list_tools()).tools}
            capacity = await client.call_tool("check_host_capacity", {})
            status = await client.call_tool("server_status", {})
            return names, capacity, status

    names, capacity, status = anyio.run(session)
    assert "server_status" in names and "start_vllm_server" not in names and "stop_vllm_server" not in names
    assert not capacity.is_error
    docker = capacity.structured_content["findings"][0]
    assert docker["check"] == "docker" and docker["level"] == "fail" and "no-docker-here" in docker["found"]
    assert docker["fix"]
    assert status.is_error
    text = status.content[0].text
    assert "no-compose-here" in text and "found:" in text and "fix:" in text and "Traceback" not in text


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def http_server(tmp_path: Path) -> Iterator[int]:
    port = free_port()
    token_file = tmp_path / "mcp_token"
    token_file.write_text(TOKEN + "\n")
    process = subprocess.Popen(
        [sys.executable, "-m", "t4serve", "mcp", "--http", f"127.0.0.1:{port}",
         "--compose-file", str(REPO / "compose.yaml")],
        env=server_env(tmp_path, T4SERVE_MCP_TOKEN_FILE=str(token_file)), cwd=tmp_path,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        if not wait_listening(port, process):
            if process.poll() is not None:
                pytest.fail(f"t4serve mcp --http exited {process.returncode}: {process.stdout.read()}")  # type: ignore[union-attr]
            pytest.fail("t4serve mcp --http did not listen within 30 s")
        yield port
    finally:
        process.terminate()
        try:
            out, _ = process.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            out, _ = process.communicate()
        assert TOKEN not in out


INITIALIZE = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": "2025-06-18",
              "capabilities": {}, "clientInfo": {"name": "t4serve-test", "version": "0"}}}  # fmt: skip


def post(port: int, headers: dict[str, str], path: str = "/mcp", full: bool = False) -> Any:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}",
        data=json.dumps(INITIALIZE).encode(),
        headers={"Content-Type": "application/json", "Accept": "application/json, text/event-stream", **headers},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            status, answer_headers, body = int(response.status), response.headers, response.read().decode()
    except urllib.error.HTTPError as exc:
        status, answer_headers, body = exc.code, exc.headers, exc.read().decode()
    return (status, answer_headers, body) if full else (status, body)


def test_http_requires_the_token_and_a_known_host(http_server: int) -> None:
    port = http_server
    status, body = post(port, {})
    assert status == 401 and "Bearer" in body
    assert post(port, {"Authorization": "Bearer wrong-token-0123456789"})[0] == 401
    bearer = {"Authorization": f"Bearer {TOKEN}"}
    status, body = post(port, {**bearer, "Host": f"evil.example:{port}"})
    assert status == 421, body
    status, _ = post(port, {**bearer, "Origin": "http://evil.example"})
    assert status == 403
    status, body = post(port, bearer)
    assert status == 200 and '"serverInfo"' in body and "t4serve" in body


def test_http_bearer_scheme_is_case_insensitive(http_server: int) -> None:
    for scheme in ("bearer", "BEARER", "BeArEr"):
        status, body = post(http_server, {"Authorization": f"{scheme} {TOKEN}"})
        assert status == 200 and '"serverInfo"' in body, scheme
    assert post(http_server, {"Authorization": f"Basic {TOKEN}"})[0] == 401
    assert post(http_server, {"Authorization": TOKEN})[0] == 401


def test_http_401_tells_a_static_token_client_what_to_send_and_offers_no_oauth(http_server: int) -> None:
    status, headers, body = post(http_server, {}, full=True)
    assert status == 401 and headers["WWW-Authenticate"] == 'Bearer realm="t4serve mcp"'
    answer = json.loads(body)
    assert "static bearer token, not OAuth" in answer["error_description"]
    assert "Authorization: Bearer <token>" in answer["error_description"]
    status, headers, _ = post(http_server, {"Authorization": "Bearer wrong-token-0123456789"}, full=True)
    assert status == 401 and 'error="invalid_token"' in headers["WWW-Authenticate"]
    # OAuth discovery finds nothing, and says why, so a client stops looking for an authorization server.
    for path in ("/.well-known/oauth-protected-resource/mcp", "/.well-known/oauth-protected-resource",
                 "/.well-known/oauth-authorization-server", "/.well-known/openid-configuration", "/register"):
        status, body = post(http_server, {}, path=path)
        assert status == 404 and "static bearer token, not OAuth" in json.loads(body)["error_description"], path


def test_http_with_the_sdk_client_and_the_token(http_server: int) -> None:
    async def session() -> set[str]:
        async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {TOKEN}"}) as http:
            transport = streamable_http_client(f"http://127.0.0.1:{http_server}/mcp", http_client=http)
            async with Client(transport) as client:
                return {t.name for t in (await client.list_tools()).tools}

    names = anyio.run(session)
    assert {"start_vllm_server", "stop_vllm_server", "query", "run_benchmark"} <= names


def test_http_without_a_token_refuses_to_start(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "t4serve", "mcp", "--http", "127.0.0.1:1"], env=server_env(tmp_path),
                          cwd=tmp_path, capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 2 and "needs a bearer token" in done.stderr and "openssl rand" in done.stderr
    assert "Traceback" not in done.stderr


def test_token_rules(tmp_path: Path) -> None:
    assert read_token({"T4SERVE_MCP_TOKEN": TOKEN}) == TOKEN
    file = tmp_path / "t"
    file.write_text(TOKEN + "\nignored\n")
    assert read_token({"T4SERVE_MCP_TOKEN_FILE": str(file)}) == TOKEN
    for environ, words in [
        ({"T4SERVE_MCP_TOKEN": TOKEN, "T4SERVE_MCP_TOKEN_FILE": str(file)}, "both set"),
        ({"T4SERVE_MCP_TOKEN": "short"}, "at least 16"),
        ({"T4SERVE_MCP_TOKEN_FILE": str(tmp_path / "missing")}, "cannot read it"),
        ({}, "needs a bearer token"),
    ]:
        with pytest.raises(ConfigError) as info:
            read_token(environ)
        assert words in info.value.message() and TOKEN not in info.value.message()


def test_listen_address_and_host_allow_list() -> None:
    assert parse_listen("127.0.0.1:8765") == ("127.0.0.1", 8765)
    assert parse_listen("8765") == ("127.0.0.1", 8765)
    assert parse_listen("[::1]:8765") == ("::1", 8765)
    with pytest.raises(ConfigError):
        parse_listen("127.0.0.1:http")
    assert allowed_hosts("127.0.0.1", 8765, ()) == ["127.0.0.1:8765", "localhost:8765", "[::1]:8765"]
    assert allowed_hosts("0.0.0.0", 8765, ("gpu-box", "gpu-box.lan:443")) == ["gpu-box:8765", "gpu-box.lan:443"]
    with pytest.raises(ConfigError) as info:
        allowed_hosts("0.0.0.0", 8765, ())
    assert "--allowed-host" in info.value.message()


def test_stdio_publishes_what_the_mode_flags_allow(tmp_path: Path) -> None:
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "t4serve", "mcp", "--toolsets", "host,status,bench", "--compose-file", str(REPO / "compose.yaml")],
        env=server_env(tmp_path, T4SERVE_MCP_DENY_TOOLS="server_logs"),
        cwd=str(tmp_path),
    )

    async def session() -> set[str]:
        async with Client(params) as client:
            return {t.name for t in (await client.list_tools()).tools}

    assert anyio.run(session) == {"check_host_capacity", "verify_gpu_arch", "server_status", "run_benchmark",
                                  "benchmark_status"}  # fmt: skip
    argv = [sys.executable, "-m", "t4serve", "mcp", "--disable-destructive", "--toolsets", "gpu"]
    done = subprocess.run(argv, env=server_env(tmp_path), cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "gpu is not a tool set" in done.stderr and "Traceback" not in done.stderr


# A stand-in for scripts/build-image: it prints a line, starts a helper that would outlive it (as a build's `docker
# buildx` would), records both pids, and waits.
BUILD_STANDIN = """#!/bin/sh
echo '#1 [base] FROM debian:trixie-slim'
sleep 600 &
echo $$ $! > "$(dirname "$0")/../build.pids"
wait
"""


def running(pid: int) -> bool:
    try:
        return "State:\tZ" not in Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False


def test_a_cancelled_long_tool_leaves_no_child_process(tmp_path: Path) -> None:
    """apply_turing_patch over stdio, cancelled by the SDK client (notifications/cancelled) while the build runs: the
    build script and the helper it started are gone, and the deployment's lock is free again."""
    project = tmp_path / "project"
    (project / "scripts").mkdir(parents=True)
    (project / "compose.yaml").write_text((REPO / "compose.yaml").read_text())
    script = project / "scripts" / "build-image"
    script.write_text(BUILD_STANDIN)
    script.chmod(0o755)
    pids_file = project / "build.pids"
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "t4serve", "mcp", "--compose-file", str(project / "compose.yaml")],
        env=server_env(tmp_path),
        cwd=str(tmp_path),
    )
    out: dict[str, Any] = {}

    async def session() -> None:
        async with Client(params) as client:
            messages: list[str | None] = []

            async def progress(value: float, total: float | None, message: str | None) -> None:
                messages.append(message)

            async def build() -> None:
                out["build"] = await client.call_tool("apply_turing_patch", {}, progress_callback=progress)

            with anyio.fail_after(60):
                async with anyio.create_task_group() as group:
                    group.start_soon(build)
                    while not pids_file.exists() or len(pids_file.read_text().split()) < 2:
                        await anyio.sleep(0.05)
                    out["pids"] = [int(p) for p in pids_file.read_text().split()]
                    assert all(running(p) for p in out["pids"])
                    group.cancel_scope.cancel()
                deadline = time.monotonic() + 20
                while time.monotonic() < deadline and any(running(p) for p in out["pids"]):
                    await anyio.sleep(0.1)
                out["left"] = [p for p in out["pids"] if running(p)]
                out["messages"] = messages
                # The lock goes with the cancelled call (a cancellation is a notification: it has no answer to
                # wait for, so the call's end is seen here as the lock coming free, within seconds).
                deadline = time.monotonic() + 10
                while True:
                    out["stop"] = await client.call_tool("stop_vllm_server", {})
                    if "busy" not in out["stop"].content[0].text or time.monotonic() > deadline:
                        break
                    await anyio.sleep(0.2)

    anyio.run(session)
    assert "build" not in out  # the cancelled request is never answered
    assert out["left"] == [], f"still running after the cancellation: {out['left']}"
    assert "starting scripts/build-image" in out["messages"]
    stop = out["stop"].content[0].text
    assert out["stop"].is_error and "busy" not in stop and "no-compose-here" in stop


def test_without_the_mcp_sdk_the_fix_installs_from_the_checkout(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 45: the fix named `t4serve[mcp]` from a package index that publishes no t4serve."""
    from t4serve.cli import main

    monkeypatch.setitem(sys.modules, "t4serve.mcp.calls", None)  # stands for a Python without the MCP SDK
    assert main(["mcp"]) == 2
    err = capsys.readouterr().err
    assert "t4serve mcp needs the MCP SDK" in err and "from a checkout of t4serve: pip install '.[mcp]'" in err
    assert "pip install 't4serve[mcp]'" not in err
