"""`t4serve mcp` against the local Docker engine, driven as an assistant drives it: through the MCP SDK's client (in
memory) and the real engine adapter (the docker and docker-compose clients), with no fake anywhere on the path.

The whole path: start_vllm_server brings up the stand-in image (built by test_supervision's fixture) with compose,
serving a model folder of this host (a Gemma 4 E2B test checkpoint with a word-level tokenizer, mounted read-only),
while a second start is answered "busy"; server_status reaches ready; query answers; server_logs is bounded;
run_benchmark runs the real `t4serve bench` (vLLM's own `vllm bench serve`) in the container through `t4serve bench
start` and benchmark_status follows it through `t4serve bench status` (typed answers: t4serve.contract) to a finished
report whose figures come back in the result; stop_vllm_server stops it and nothing is left
(no container, network or anonymous volume of the project). Then: a start whose container exits at once (a bad token
file: exit 2) returns the exit code and the log lines, and a cancelled verify_turing_patch leaves no container and no
client process behind.

The engine here refuses the nvidia reservation (no GPU), so the compose file is used as test_compose uses it: without
its `deploy:` block. With docker-compose 1.29 that is compose.token-file.yaml (the token from a file; 1.29 refuses
compose.yaml's from the environment). T4SERVE_PREFLIGHT=warn lets serve start past the no-GPU finding, as in the
supervision tests."""

from __future__ import annotations

import json
import os
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client
from mcp.types import CallToolResult

from t4serve.host.docker import THROWAWAY_LABEL, DockerCli
from t4serve.mcp.calls import ToolEnv
from t4serve.mcp.server import build_server
from t4serve.mcp.servertools import MAX_LOG_BYTES

from .conftest import REPO, load_e2b_checkpoint
from .test_compose import COMPOSE, TOKEN_FILE_COMPOSE, without_gpu
from .test_supervision import standin

pytestmark = pytest.mark.image

__all__ = ["standin"]  # the stand-in image fixture, shared with test_supervision

E2B = load_e2b_checkpoint()
# The stand-in logs the published QAT figures for a model whose name says qat.
MODEL_NAME = "gemma-4-E2B-it-qat-w4a16-ct"
BASE_SETTINGS = {"T4SERVE_PREFLIGHT": "warn", "HF_HUB_OFFLINE": "1", "T4SERVE_DTYPE": "float16"}


def docker_lines(docker: str, *args: str) -> list[str]:
    out = subprocess.run([docker, *args], capture_output=True, text=True, timeout=60, check=True).stdout
    return [line for line in out.splitlines() if line.strip()]


@dataclass
class Deployment:
    """A compose project of its own (its name, compose file, HF token file, volumes), torn down after the test."""

    project: str
    env: ToolEnv
    environ: dict[str, str]
    compose_file: Path
    token: Path


@pytest.fixture
def deployment(docker_bin: str, standin: str, tmp_path: Path) -> Iterator[Deployment]:
    project = f"t4smcp{uuid.uuid4().hex[:6]}"
    compose_file = tmp_path / "compose.yaml"
    compose_file.write_text(without_gpu(TOKEN_FILE_COMPOSE.read_text()))
    token = tmp_path / "hf_token"
    token.write_text("hf_testtokennotreal\n")
    token.chmod(0o644)
    # The MCP process's environment: compose's own variables (not the container's settings) come from here.
    environ = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "HF_TOKEN_SECRET_FILE": str(token),
               "T4SERVE_TELEMETRY_PUBLISH_PORT": "0", "T4SERVE_VOLUME_PREFIX": project}  # fmt: skip
    engine = DockerCli(compose_file=compose_file, project=project, image=standin, docker=docker_bin,
                       compose=[COMPOSE], environ=environ)  # fmt: skip
    env = ToolEnv(engine=engine, environ=environ, data_dir=tmp_path / "data", compose_file=compose_file)
    try:
        yield Deployment(project, env, environ, compose_file, token)
    finally:
        base = [COMPOSE, "-p", project, "--project-directory", str(tmp_path), "-f", str(compose_file)]
        subprocess.run([*base, "down", "-v"], capture_output=True, timeout=180,
                       env={**environ, "T4SERVE_IMAGE": standin})  # fmt: skip
        for suffix in ("hf-cache", "compile-cache", "cache"):
            subprocess.run([docker_bin, "volume", "rm", "-f", f"{project}-{suffix}"], capture_output=True, timeout=60)


def structured(name: str, result: CallToolResult) -> dict[str, Any]:
    assert not result.is_error, (name, result.content)
    assert result.structured_content is not None
    return result.structured_content


def error_text(result: CallToolResult) -> str:
    assert result.is_error, result.structured_content
    return "\n".join(getattr(c, "text", "") for c in result.content)


def test_the_whole_path_through_mcp(docker_bin: str, deployment: Deployment, tmp_path: Path) -> None:
    model = E2B.write_checkpoint(tmp_path / "models" / MODEL_NAME, kind="qat", tokenizer=True)
    results: dict[str, Any] = {}

    async def session() -> None:
        async with Client(build_server(deployment.env)) as client:

            async def tool(name: str, args: dict[str, Any] | None = None) -> dict[str, Any]:
                return structured(name, await client.call_tool(name, args or {}))

            # Two starts at once: the second is answered "busy" while the first holds the deployment's lock.
            under_way = anyio.Event()

            async def progress(value: float, total: float | None, message: str | None) -> None:
                if message and message.startswith("compose up"):
                    under_way.set()

            async def first_start() -> None:
                began = time.monotonic()
                args = {"model": str(model), "publish_port": 0, "settings": BASE_SETTINGS}
                results["start"] = structured("start", await client.call_tool("start_vllm_server", args,
                                                                              progress_callback=progress))
                results["start_s"] = time.monotonic() - began

            async with anyio.create_task_group() as group:
                group.start_soon(first_start)
                with anyio.fail_after(60):
                    await under_way.wait()
                results["second_start"] = await client.call_tool("start_vllm_server", {"model": str(model)})

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

            bench_args = {"inputs": [32], "concurrency": [1], "output_len": 8, "num_prompts": 4}
            results["bench"] = bench = await tool("run_benchmark", bench_args)
            results["bench_busy"] = await client.call_tool("run_benchmark", bench_args)
            deadline = time.monotonic() + 600
            seen: list[dict[str, Any]] = []
            while time.monotonic() < deadline:
                seen.append(await tool("benchmark_status", {"run_id": bench["run_id"]}))
                if seen[-1]["state"] != "running":
                    break
                await anyio.sleep(3.0)
            results["bench_seen"] = seen
            results["stop"] = await tool("stop_vllm_server", {"timeout_s": 30})
            results["after"] = await tool("server_status")
            # A finished benchmark stays readable from its copy on this host, with the server gone.
            results["bench_after_stop"] = await tool("benchmark_status", {"run_id": bench["run_id"]})

    anyio.run(session)
    status = results["status"]
    assert status.get("ready"), f"not ready: {status}\nlogs: {results.get('logs_on_failure')}"
    start = results["start"]
    print(f"\nstart_vllm_server returned in {results['start_s']:.1f} s (phase {start['phase']}); "
          f"ready: {status['text'][:400]}")  # fmt: skip
    second = error_text(results["second_start"])
    assert "start_vllm_server: busy: start_vllm_server (pid " in second, second
    # start returned once the container ran and t4serve had written its state.
    assert start["container_state"] == "running" and start["state_written"] and start["phase"]
    assert start["api_url"].startswith("http://127.0.0.1:")
    assert start["model"] == str(model) and start["model_in_container"] == f"/models/{MODEL_NAME}"
    assert status["model"] == f"/models/{MODEL_NAME}" and status["canary_ok"] is True
    # No GPU here, so the plan predicts nothing; the figures are the stand-in's logged ones.
    logged = {f["name"]: f["logged"] for f in status["figures"] if f["logged"] is not None}
    assert logged.get("kv_tokens") == 315974 and logged.get("max_model_len") == 16384, status["figures"]
    query = results["query"]
    assert "391" in query["text"] and query["latency_s"] > 0 and query["completion_tokens"]
    logs = results["logs"]
    assert 0 < len(logs["lines"]) <= 5 and logs["bytes"] <= MAX_LOG_BYTES
    assert len(results["logs_all"]["lines"]) <= 500 and results["logs_all"]["bytes"] <= MAX_LOG_BYTES
    assert any("t4serve" in line for line in results["logs_all"]["lines"])

    assert "busy: a benchmark is running" in error_text(results["bench_busy"])
    seen = results["bench_seen"]
    done = seen[-1]
    print(f"benchmark: {len(seen)} status calls; last: {json.dumps(done['cells'])}\n{done['log_tail'][-1500:]}")
    assert done["state"] == "done" and done["exit_code"] == 0, done["log_tail"]
    assert done["runs_done"] == done["runs_planned"] == 1
    (cell,) = done["cells"]
    assert cell["model"] == f"/models/{MODEL_NAME}" and (cell["input_len"], cell["concurrency"]) == (32, 1)
    assert cell["repeats_ok"] == 1 and cell["completed_requests"] == 4 and cell["failed_requests"] == 0
    assert cell["throughput_tok_s"] > 0 and cell["ttft_ms"] > 0 and cell["per_stream_tok_s"] > 0
    assert "## input 32 tokens" in done["report_md"]
    host = Path(done["host_folder"])
    assert (host / "result" / "runs.json").is_file() and (host / "bench.log").is_file()
    # The container's typed answer (t4serve bench status --json) kept beside the copy: what is read from now on.
    assert (host / "answer.json").is_file()
    assert done["plots"] and all(Path(p).is_file() and Path(p).stat().st_size > 5000 for p in done["plots"])
    assert results["bench_after_stop"]["cells"] == done["cells"]

    assert results["stop"]["stopped"] and results["stop"]["was_state"] == "running"
    assert results["after"]["running"] is False and results["after"]["container"] is None
    label = f"label=com.docker.compose.project={deployment.project}"
    assert docker_lines(docker_bin, "ps", "-a", "-q", "--filter", label) == []
    assert docker_lines(docker_bin, "network", "ls", "-q", "--filter", label) == []
    # The named cache volumes stay by design (stop keeps the caches); the anonymous one (the image declares
    # VOLUME /cache) must be gone with the container.
    named = {f"{deployment.project}-hf-cache", f"{deployment.project}-compile-cache", f"{deployment.project}-cache"}
    anonymous = results["volumes"] - named
    assert named <= results["volumes"] and len(anonymous) == 1, results["volumes"]
    left = [v for v in anonymous if subprocess.run([docker_bin, "volume", "inspect", v], capture_output=True,
                                                   timeout=60).returncode == 0]  # fmt: skip
    assert left == [], f"anonymous volumes left behind: {left}"


def test_a_start_whose_container_exits_at_once_returns_its_exit_code_and_log_lines(
    docker_bin: str, deployment: Deployment
) -> None:
    # A token file t4serve refuses in the container (two words): a settings error there, exit 2, seconds after start.
    deployment.token.write_text("hf_not a-token\n")

    async def session() -> tuple[CallToolResult, float, dict[str, Any]]:
        async with Client(build_server(deployment.env)) as client:
            began = time.monotonic()
            result = await client.call_tool("start_vllm_server", {"settings": BASE_SETTINGS})
            took = time.monotonic() - began
            status = structured("server_status", await client.call_tool("server_status", {}))
            return result, took, status

    result, took, status = anyio.run(session)
    text = error_text(result)
    print(f"\nthe failed start answered in {took:.1f} s:\n{text}")
    assert "start_vllm_server: the container exited at once (exit 2)" in text
    assert "HF_TOKEN_FILE" in text and "holds whitespace inside" in text  # t4serve's own message, from its log
    assert "a setting is wrong" in text and "stop_vllm_server" in text and "Traceback" not in text
    assert status["running"] is False and status["exit_code"] == 2


def cmdlines_holding(*words: str) -> list[str]:
    """The processes of this machine whose arguments hold every one of `words`."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if all(any(w.encode() in a for a in args) for w in words):
            found.append(pid)
    return found


def test_a_cancelled_patch_verify_leaves_no_container_or_client(docker_bin: str, image_ref: str,
                                                                tmp_path: Path) -> None:  # fmt: skip
    environ = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "HF_HUB_OFFLINE": "1"}
    engine = DockerCli(compose_file=REPO / "compose.yaml", project=f"t4smcp{uuid.uuid4().hex[:6]}", image=image_ref,
                       docker=docker_bin, compose=[COMPOSE], environ=environ)  # fmt: skip
    env = ToolEnv(engine=engine, environ=environ, data_dir=tmp_path / "data", compose_file=REPO / "compose.yaml")
    ours = ["--filter", f"label={THROWAWAY_LABEL}", "--filter", f"ancestor={image_ref}"]
    before = set(docker_lines(docker_bin, "ps", "-a", "-q", "--no-trunc", *ours))
    out: dict[str, Any] = {}

    async def session() -> None:
        async with Client(build_server(env, read_only=True)) as client:

            async def verify() -> None:
                out["result"] = await client.call_tool("verify_turing_patch", {})

            with anyio.fail_after(120):
                async with anyio.create_task_group() as group:
                    group.start_soon(verify)
                    while True:
                        # One listing (id and name): a container gone between two calls cannot fail the second.
                        rows = docker_lines(docker_bin, "ps", "--no-trunc", "--format", "{{.ID}} {{.Names}}", *ours)
                        names = [name for cid, _, name in (r.partition(" ") for r in rows) if cid not in before]
                        # The manifest read is a throwaway container too; patch verify is the one that lasts.
                        if any(cmdlines_holding(n, "verify") for n in names):
                            out["names"] = names
                            await anyio.sleep(2.0)  # well inside the verify's minutes
                            break
                        await anyio.sleep(0.2)
                    group.cancel_scope.cancel()

    anyio.run(session)
    assert "result" not in out  # a cancelled request is not answered
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        left = set(docker_lines(docker_bin, "ps", "-a", "-q", "--no-trunc", *ours)) - before
        clients = [pid for name in out["names"] for pid in cmdlines_holding(name)]
        if not left and not clients:
            break
        time.sleep(0.5)
    print(f"\ncancelled patch verify in {out['names']}: containers left {left}, client processes left {clients}")
    assert not left and not clients


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
