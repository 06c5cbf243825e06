"""`t4serve mcp` against the local Docker engine, through the MCP SDK's in-memory client and the real engine adapter
(the docker and docker-compose clients): start_vllm_server brings up the stand-in image (t4serve:standin, built by
test_supervision's fixture) with compose, server_status reaches ready, query answers, server_logs is bounded,
stop_vllm_server stops it, and nothing is left behind (no container, network or anonymous volume of the project).

The engine here refuses the nvidia reservation (no GPU), so compose.yaml is used as test_compose uses it: without its
`deploy:` block. T4SERVE_PREFLIGHT=warn lets serve start past the no-GPU finding, as in the supervision tests."""

from __future__ import annotations

import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client

from t4serve.engine import DockerCli
from t4serve.mcptools import MAX_LOG_BYTES, ToolEnv, build_server

from .conftest import REPO
from .test_compose import COMPOSE, without_gpu
from .test_supervision import standin

pytestmark = pytest.mark.image

__all__ = ["standin"]  # the stand-in image fixture, shared with test_supervision


def docker_lines(docker: str, *args: str) -> list[str]:
    out = subprocess.run([docker, *args], capture_output=True, text=True, timeout=60, check=True).stdout
    return [line for line in out.splitlines() if line.strip()]


def test_start_status_query_logs_stop_through_mcp(docker_bin: str, standin: str, tmp_path: Path) -> None:
    project = f"t4smcp{uuid.uuid4().hex[:6]}"
    compose_file = tmp_path / "compose.yaml"
    compose_file.write_text(without_gpu((REPO / "compose.yaml").read_text()))
    token = tmp_path / "hf_token"
    token.write_text("hf_testtokennotreal\n")
    token.chmod(0o644)
    # The MCP process's environment: compose's own variables (not the container's settings) come from here.
    environ = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "HF_TOKEN_SECRET_FILE": str(token),
               "T4SERVE_TELEMETRY_PUBLISH_PORT": "0", "T4SERVE_VOLUME_PREFIX": project}  # fmt: skip
    engine = DockerCli(compose_file=compose_file, project=project, image=standin, docker=docker_bin,
                       compose=[COMPOSE], environ=environ)  # fmt: skip
    env = ToolEnv(engine=engine, environ=environ, data_dir=tmp_path / "data", compose_file=compose_file)
    results: dict[str, Any] = {}

    async def session() -> None:
        async with Client(build_server(env)) as client:

            async def tool(name: str, args: dict[str, Any] | None = None) -> dict[str, Any]:
                result = await client.call_tool(name, args or {})
                assert not result.is_error, (name, result.content)
                assert result.structured_content is not None
                return result.structured_content

            began = time.monotonic()
            settings = {"T4SERVE_PREFLIGHT": "warn", "HF_HUB_OFFLINE": "1", "T4SERVE_DTYPE": "float16"}
            start_args = {"model": "qat", "publish_port": 0, "settings": settings}
            results["start"] = await tool("start_vllm_server", start_args)
            results["start_s"] = time.monotonic() - began
            deadline = time.monotonic() + 180
            status: dict[str, Any] = {}
            while time.monotonic() < deadline:
                status = await tool("server_status")
                if status["ready"] or status["phase"] in ("failed", "canary_failed") or not status["running"]:
                    break
                await anyio.sleep(1.0)
            results["status"] = status
            if not status.get("ready"):
                results["logs_on_failure"] = await tool("server_logs", {"tail": 80})
                return
            mounts = docker_lines(docker_bin, "inspect", "-f", "{{range .Mounts}}{{.Name}}\n{{end}}",
                                  results["start"]["container"])  # fmt: skip
            results["volumes"] = set(mounts)
            results["query"] = await tool("query", {"prompt": "17*23=", "max_tokens": 8})
            results["logs"] = await tool("server_logs", {"tail": 5})
            results["logs_all"] = await tool("server_logs", {"tail": 500})
            results["stop"] = await tool("stop_vllm_server", {"timeout_s": 30})
            results["after"] = await tool("server_status")

    try:
        anyio.run(session)
        status = results["status"]
        assert status.get("ready"), f"not ready: {status}\nlogs: {results.get('logs_on_failure')}"
        start = results["start"]
        print(f"\nstart_vllm_server returned in {results['start_s']:.1f} s; ready: {status['text'][:400]}")
        assert start["container_state"] == "running" and start["api_url"].startswith("http://127.0.0.1:")
        assert status["model"] == "google/gemma-4-E2B-it-qat-w4a16-ct" and status["canary_ok"] is True
        # No GPU here, so the plan predicts nothing; the figures are the stand-in's logged ones.
        logged = {f["name"]: f["logged"] for f in status["figures"] if f["logged"] is not None}
        assert logged.get("kv_tokens") == 315974 and logged.get("max_model_len") == 16384, status["figures"]
        query = results["query"]
        assert "391" in query["text"] and query["latency_s"] > 0 and query["completion_tokens"]
        logs = results["logs"]
        assert 0 < len(logs["lines"]) <= 5 and logs["bytes"] <= MAX_LOG_BYTES
        assert len(results["logs_all"]["lines"]) <= 500 and results["logs_all"]["bytes"] <= MAX_LOG_BYTES
        assert any("t4serve" in line for line in results["logs_all"]["lines"])
        assert results["stop"]["stopped"] and results["stop"]["was_state"] == "running"
        assert results["after"]["running"] is False and results["after"]["container"] is None
        label = f"label=com.docker.compose.project={project}"
        assert docker_lines(docker_bin, "ps", "-a", "-q", "--filter", label) == []
        assert docker_lines(docker_bin, "network", "ls", "-q", "--filter", label) == []
        # The named cache volumes stay by design (stop keeps the caches); the anonymous one (the image declares
        # VOLUME /cache) must be gone with the container.
        named = {f"{project}-hf-cache", f"{project}-compile-cache", f"{project}-cache"}
        anonymous = results["volumes"] - named
        assert named <= results["volumes"] and len(anonymous) == 1, results["volumes"]
        left = [v for v in anonymous if subprocess.run([docker_bin, "volume", "inspect", v], capture_output=True,
                                                       timeout=60).returncode == 0]  # fmt: skip
        assert left == [], f"anonymous volumes left behind: {left}"
    finally:
        base = [COMPOSE, "-p", project, "--project-directory", str(tmp_path), "-f", str(compose_file)]
        compose_env = {**environ, "T4SERVE_IMAGE": standin}
        subprocess.run([*base, "down", "-v"], capture_output=True, timeout=180, env=compose_env)
        for suffix in ("hf-cache", "compile-cache", "cache"):
            subprocess.run([docker_bin, "volume", "rm", "-f", f"{project}-{suffix}"], capture_output=True, timeout=60)


def test_image_side_checks_read_the_real_image(docker_bin: str, image_ref: str, tmp_path: Path) -> None:
    """check_host_capacity, verify_gpu_arch and verify_turing_patch against the image under test: its manifest read
    in a throwaway container, and `t4serve patch verify` (interpreter step skipped) run in another."""
    environ = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "HF_HUB_OFFLINE": "1"}
    engine = DockerCli(compose_file=REPO / "compose.yaml", project=f"t4smcp{uuid.uuid4().hex[:6]}", image=image_ref,
                       docker=docker_bin, compose=[COMPOSE], environ=environ)  # fmt: skip
    env = ToolEnv(engine=engine, environ=environ, data_dir=tmp_path / "data", compose_file=REPO / "compose.yaml")

    async def session() -> dict[str, Any]:
        async with Client(build_server(env, read_only=True)) as client:
            out = {}
            for name, args in (("check_host_capacity", {}), ("verify_gpu_arch", {}),
                               ("verify_turing_patch", {"skip_interpreter": True})):  # fmt: skip
                result = await client.call_tool(name, args)
                assert not result.is_error, (name, result.content)
                out[name] = result.structured_content
            return out

    out = anyio.run(session)
    capacity = {f["check"]: f for f in out["check_host_capacity"]["findings"]}
    assert capacity["docker"]["level"] == "ok" and capacity["shm"]["level"] == "ok"
    assert "present" in capacity["docker-disk"]["required"]
    arch = out["verify_gpu_arch"]
    assert "sm_75" in arch["torch_arch_list"] and arch["torch_cuda_version"].startswith("13")
    patch = out["verify_turing_patch"]
    print(f"\npatch verify in the image:\n{patch['verify_output'][-600:]}")
    assert patch["verify_exit_code"] == 0 and patch["clamp"]["state"] in ("applied", "not-needed")
    assert "clamp proven" in patch["verify_output"]
