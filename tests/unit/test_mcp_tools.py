"""Every `t4serve mcp` tool through the MCP SDK's own client, in memory (mcp.Client on the MCPServer). The Docker side
is FakeEngine (tests/unit/fake_engine.py) and the host's NVML is FakeNvml (a T4); the OpenAI API of a running server
is tests/unit/local_http.py. The checks, plan, settings parser and state reader are t4serve's own, unfaked."""

from __future__ import annotations

import inspect
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import pytest
from fake_engine import FakeEngine
from local_http import Canned, serve
from mcp import Client
from mcp.types import CallToolResult, Implementation
from sample_facts import MANIFEST
from test_probes_gpu import FakeDevice, FakeNvml

from t4serve.errors import ConfigError
from t4serve.host.engine import ServiceContainer
from t4serve.mcp import registry
from t4serve.mcp.calls import ToolEnv, ToolGroup
from t4serve.mcp.checktools import CheckTools
from t4serve.mcp.deploylock import lock_file
from t4serve.mcp.server import (
    TOOL_ANNOTATIONS,
    TOOL_GROUPS,
    TOOLS,
    TOOLSETS,
    Modes,
    build_server,
    parse_modes,
    tools_in_order,
)
from t4serve.mcp.servertools import MAX_LOG_BYTES
from t4serve.serde import to_dict
from t4serve.supervise.state import STATE_SCHEMA, CanaryRecord, Figure, PhaseMark, Prediction, ServeState

REPO = Path(__file__).resolve().parents[2]
NOW = 1_790_000_000.0
API_KEY = "sk-test-0123456789abcdef0123"
HF_TOKEN = "hf_testtoken_abcdefghijklmnop"
READ_ONLY_TOOLS = {"check_host_capacity", "verify_gpu_arch", "verify_turing_patch", "plan", "profiles",
                   "server_status", "server_logs", "benchmark_status", "query"}  # fmt: skip


def manifest_file(**changes: Any) -> dict[str, Any]:
    """The build manifest as the image stores it (the reader fields are the reader's)."""
    data: dict[str, Any] = {k: v for k, v in to_dict(MANIFEST).items() if k not in ("path", "present", "error")}
    data.update(changes)
    return data


@pytest.fixture
def engine(tmp_path: Path) -> FakeEngine:
    fake = FakeEngine(tmp_path, manifest=manifest_file(), state_on_up=serve_state("loading_weights"))
    fake.project_directory.mkdir()
    # The file route (the token in HF_TOKEN_SECRET_FILE), as compose.token-file.yaml gives it; compose.yaml's own
    # route (HF_TOKEN in the environment) has its tests below.
    shutil.copy(REPO / "compose.token-file.yaml", fake.project_directory / "compose.yaml")
    return fake


@pytest.fixture
def environ(tmp_path: Path) -> dict[str, str]:
    secret = tmp_path / "hf_token"
    secret.write_text(HF_TOKEN)
    return {"HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf"), "HF_TOKEN_SECRET_FILE": str(secret),
            "T4SERVE_API_KEY": API_KEY}  # fmt: skip


def tool_env(engine: FakeEngine, environ: dict[str, str], devices: list[FakeDevice] | None = None) -> ToolEnv:
    return ToolEnv(engine=engine, environ=environ, data_dir=engine.root / "data",  # type: ignore[arg-type]
                   compose_file=engine.project_directory / "compose.yaml",
                   clock=lambda: NOW, nvml=FakeNvml([FakeDevice()] if devices is None else devices))  # fmt: skip


def call(env: ToolEnv, name: str, args: dict[str, Any] | None = None, *, read_only: bool = False,
         progress: Callable[..., Any] | None = None) -> CallToolResult:  # fmt: skip
    server = build_server(env, read_only=read_only)

    async def go() -> CallToolResult:
        async with Client(server) as client:
            return await client.call_tool(name, args or {}, progress_callback=progress)

    return anyio.run(go)


def ok(result: CallToolResult) -> dict[str, Any]:
    assert not result.is_error, result.content
    assert result.structured_content is not None
    return result.structured_content


def error_text(result: CallToolResult) -> str:
    assert result.is_error
    text = "\n".join(getattr(c, "text", "") for c in result.content)
    assert "Traceback" not in text
    return text


def serve_state(phase: str = "ready", **changes: Any) -> ServeState:
    t0 = NOW - 200
    marks = [PhaseMark("starting", t0), PhaseMark("loading_weights", t0 + 5)]
    if phase == "ready":
        marks += [PhaseMark("canary", t0 + 150), PhaseMark("ready", t0 + 160)]
    state = ServeState(
        schema=STATE_SCHEMA, phase=phase, started_at=t0, attempt_started_at=t0, updated_at=NOW, attempt=1,
        model="google/gemma-4-E2B-it-qat-w4a16-ct", served_model_name="gemma-4-e2b", host="0.0.0.0", port=8000,
        gpu_name="Tesla T4", phases=marks,
        figures={"kv_tokens": Figure("kv_tokens", 507_000, "tokens", "GPU KV cache size: 507,000 tokens")},
        predictions={"kv_tokens": Prediction("kv_tokens", 507_832, "tokens", "pool / bytes per token"),
                     "max_concurrency": Prediction("max_concurrency", 31.0, "x", "tokens / max length")},
        canary=CanaryRecord(True, "17*23=", "391", None, None, 0.4) if phase == "ready" else None,
        estimate_seconds=180.0 if phase != "ready" else None,
        estimate_phases={"loading_weights": 100.0} if phase != "ready" else {},
    )  # fmt: skip
    return dataclass_replace(state, **changes)


def dataclass_replace(state: ServeState, **changes: Any) -> ServeState:
    import dataclasses

    return dataclasses.replace(state, **changes)


def assert_no_secret(data: object) -> None:
    text = json.dumps(data)
    assert API_KEY not in text and HF_TOKEN not in text


# ----- the list --------------------------------------------------------------------------------------------------


def test_every_tool_is_listed_with_annotations_and_an_output_schema(
    engine: FakeEngine, environ: dict[str, str]
) -> None:
    async def listing(read_only: bool) -> list[Any]:
        async with Client(build_server(tool_env(engine, environ), read_only=read_only)) as client:
            return list((await client.list_tools()).tools)

    tools = anyio.run(listing, False)
    assert [t.name for t in tools] == list(TOOLS) and set(TOOLS) == set(TOOL_ANNOTATIONS)
    for tool in tools:
        assert tool.output_schema is not None and tool.output_schema.get("properties"), tool.name
        assert tool.description and len(tool.description) > 40, tool.name
        # A title, and a one-line purpose first.
        assert tool.title and tool.title == TOOLS[tool.name].title, tool.name
        purpose = tool.description.splitlines()[0]
        assert 20 < len(purpose) <= 120 and purpose.endswith("."), (tool.name, purpose)
        # Every parameter is described; numbers carry their range.
        for param, schema in tool.input_schema.get("properties", {}).items():
            assert schema.get("description"), (tool.name, param)
            if schema.get("type") in ("integer", "number"):
                assert "maximum" in schema and "minimum" in schema, (tool.name, param)
        hints = tool.annotations
        assert hints is not None and hints.read_only_hint is not None and hints.idempotent_hint is not None
        assert hints.read_only_hint == (tool.name in READ_ONLY_TOOLS), tool.name
    by_name = {t.name: t for t in tools}
    assert by_name["stop_vllm_server"].annotations.destructive_hint is True  # type: ignore[union-attr]
    assert by_name["start_vllm_server"].annotations.destructive_hint is False  # type: ignore[union-attr]
    read_only = anyio.run(listing, True)
    assert {t.name for t in read_only} == READ_ONLY_TOOLS


def test_every_public_coroutine_of_a_tool_group_is_a_registered_tool_and_nothing_else_is() -> None:
    """A tool is published through @tool alone: no method of a group escapes the list, none is listed twice, and the
    list runs in the order a deployment goes through (host and image, plan, server, status, query, bench)."""
    public = [name for cls in TOOL_GROUPS for name, fn in vars(cls).items()
              if not name.startswith("_") and inspect.iscoroutinefunction(fn)]  # fmt: skip
    assert public == list(TOOLS) and len(set(public)) == len(public)
    assert [TOOLS[name].owner for name in TOOLS] == sorted((TOOLS[n].owner for n in TOOLS),
                                                           key=[c.__qualname__ for c in TOOL_GROUPS].index)
    assert TOOLSETS == ("host", "image", "plan", "server", "status", "query", "bench")


def test_a_tool_outside_the_published_groups_or_named_twice_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(registry, "REGISTRY", dict(registry.REGISTRY))

    class Stray(ToolGroup):
        @registry.tool("Stray", "host", registry.READ_ONLY)
        async def stray_tool(self) -> None:
            """Not in TOOL_GROUPS: never published, so refused."""

    with pytest.raises(TypeError, match=r"Stray\.stray_tool"):
        tools_in_order(TOOL_GROUPS)
    assert list(tools_in_order((*TOOL_GROUPS, Stray)))[-1] == "stray_tool"
    with pytest.raises(TypeError, match="two tools are named plan"):
        registry.tool("Again", "plan", registry.READ_ONLY)(CheckTools.plan)
    with pytest.raises(TypeError, match="public method"):

        async def _hidden(self: ToolGroup) -> None: ...

        registry.tool("Hidden", "host", registry.READ_ONLY)(_hidden)


def test_gpu_parameters_say_which_gpu_they_mean(engine: FakeEngine, environ: dict[str, str]) -> None:
    async def listing() -> dict[str, Any]:
        async with Client(build_server(tool_env(engine, environ))) as client:
            return {t.name: t.input_schema["properties"] for t in (await client.list_tools()).tools}

    params = anyio.run(listing)
    assert "gpu" not in params["plan"] and "gpu" not in params["start_vllm_server"]
    assert "known GPU model" in params["plan"]["gpu_model"]["description"]
    assert "index" in params["start_vllm_server"]["gpu_device"]["description"]
    assert "UUID" in params["start_vllm_server"]["gpu_device"]["description"]


@pytest.mark.parametrize(
    ("modes", "published"),
    [
        (Modes(disable_destructive=True), set(TOOLS) - {"stop_vllm_server", "apply_turing_patch"}),
        (Modes(toolsets=frozenset({"host", "status", "bench"})),
         {"check_host_capacity", "verify_gpu_arch", "server_status", "server_logs", "run_benchmark",
          "benchmark_status"}),
        (Modes(deny=frozenset({"query", "start_vllm_server"})), set(TOOLS) - {"query", "start_vllm_server"}),
        (Modes(read_only=True, toolsets=frozenset({"bench", "server"})), {"benchmark_status"}),
    ],
)  # fmt: skip
def test_modes_choose_the_published_tools(
    engine: FakeEngine, environ: dict[str, str], modes: Modes, published: set[str]
) -> None:
    async def listing() -> set[str]:
        async with Client(build_server(tool_env(engine, environ), modes=modes)) as client:
            return {t.name for t in (await client.list_tools()).tools}

    assert anyio.run(listing) == published


def test_mode_flags_are_checked() -> None:
    assert parse_modes(False, True, "host, status", "server_logs").published() == [
        "check_host_capacity", "verify_gpu_arch", "server_status"]  # fmt: skip
    for args, words in [
        ((False, False, "host,gpus", None), "--toolsets: gpus is not a tool set"),
        ((False, False, None, "stop_server"), "--deny-tools: stop_server is not a tool"),
        ((True, False, "server", None), "leave no tool"),
    ]:
        with pytest.raises(ConfigError) as info:
            parse_modes(*args)  # type: ignore[arg-type]
        assert words in info.value.message() and "fix:" in info.value.message()


def test_read_only_server_refuses_a_mutating_tool(engine: FakeEngine, environ: dict[str, str]) -> None:
    result = call(tool_env(engine, environ), "stop_vllm_server", read_only=True)
    assert "stop_vllm_server" in error_text(result)
    assert ("down", 90) not in engine.calls


# ----- host and image --------------------------------------------------------------------------------------------


def test_check_host_capacity_passes_a_t4_host_with_the_toolkit(engine: FakeEngine, environ: dict[str, str]) -> None:
    data = ok(call(tool_env(engine, environ), "check_host_capacity"))
    levels = {f["check"]: f["level"] for f in data["findings"]}
    assert levels["docker"] == "ok" and levels["host-gpu"] == "ok" and levels["driver"] == "ok"
    assert levels["container-toolkit"] == "ok" and levels["shm"] == "ok"
    assert "docker-disk" in levels and "host-memory" in levels
    assert data["image"] == "t4serve:dev" and data["compose_file"].endswith("compose.yaml")
    assert data["failed"] == sum(f["level"] == "fail" for f in data["findings"])


def test_check_host_capacity_without_the_toolkit_or_driver_says_how_to_fix(
    engine: FakeEngine, environ: dict[str, str]
) -> None:
    engine.runtimes = ["runc"]
    data = ok(call(tool_env(engine, environ, devices=[]), "check_host_capacity"))
    findings = {f["check"]: f for f in data["findings"]}
    assert not data["ok"]
    toolkit = findings["container-toolkit"]
    assert toolkit["level"] == "fail" and "nvidia-ctk runtime configure --runtime=docker" in toolkit["fix"]
    assert findings["host-gpu"]["level"] == "fail" and findings["host-gpu"]["required"]


def test_verify_gpu_arch_t4_against_the_image(engine: FakeEngine, environ: dict[str, str]) -> None:
    data = ok(call(tool_env(engine, environ), "verify_gpu_arch"))
    assert data["ok"] and data["gpus"][0]["compute_capability"] == "7.5" and data["gpus"][0]["name"] == "Tesla T4"
    assert data["torch_cuda_version"] == "13.0" and "sm_75" in data["torch_arch_list"]
    assert {f["check"] for f in data["findings"]} >= {"host-gpu", "driver", "torch-cuda", "capability", "torch-arch"}


def test_verify_gpu_arch_fails_an_arch_list_without_the_gpu_and_an_old_driver(
    engine: FakeEngine, environ: dict[str, str]
) -> None:
    engine.manifest = manifest_file(torch_arch_list=["sm_80", "sm_90"])
    env = tool_env(engine, environ)
    env.nvml = FakeNvml([FakeDevice()], driver="535.104.05", cuda=12020)
    data = ok(call(env, "verify_gpu_arch"))
    failed = {f["check"] for f in data["findings"] if f["level"] == "fail"}
    assert failed == {"driver", "torch-arch"} and not data["ok"]


def test_verify_gpu_arch_without_the_image_says_to_build_it(engine: FakeEngine, environ: dict[str, str]) -> None:
    engine.image_present = False
    data = ok(call(tool_env(engine, environ), "verify_gpu_arch"))
    manifest = next(f for f in data["findings"] if f["check"] == "manifest")
    assert manifest["level"] == "fail" and "apply_turing_patch" in manifest["fix"]


def test_verify_turing_patch_runs_patch_verify_in_the_image(engine: FakeEngine, environ: dict[str, str]) -> None:
    data = ok(call(tool_env(engine, environ), "verify_turing_patch", {"skip_interpreter": True}))
    assert ("run_in_image", ["patch", "verify", "--skip-interpreter"]) in engine.calls
    assert data["ok"] and data["clamp"]["state"] == "applied" and data["verify_exit_code"] == 0
    assert data["clamp"]["shared_memory"]["2d/prefill/head512/tile16"] == 65536
    assert {f["check"]: f["level"] for f in data["findings"]} == {"clamp": "ok", "patch-verify": "ok"}


def test_verify_turing_patch_reports_a_failed_verify(engine: FakeEngine, environ: dict[str, str]) -> None:
    engine.verify_code = 4
    data = ok(call(tool_env(engine, environ), "verify_turing_patch"))
    assert not data["ok"] and data["verify_exit_code"] == 4 and "FAILED" in data["verify_output"]
    failed = next(f for f in data["findings"] if f["check"] == "patch-verify")
    assert failed["level"] == "fail" and "apply_turing_patch" in failed["fix"]


def test_verify_turing_patch_without_an_image_is_a_tool_error(engine: FakeEngine, environ: dict[str, str]) -> None:
    engine.image_present = False
    text = error_text(call(tool_env(engine, environ), "verify_turing_patch"))
    assert "found:" in text and "required:" in text and "fix:" in text and "apply_turing_patch" in text


def test_apply_turing_patch_builds_and_returns_the_manifest(engine: FakeEngine, environ: dict[str, str]) -> None:
    engine.image_present = False
    data = ok(call(tool_env(engine, environ), "apply_turing_patch"))
    assert ("build_image", None) in engine.calls and engine.image_present
    assert data["manifest"]["clamp"]["state"] == "applied" and data["manifest"]["vllm_version"] == "0.33.0"
    assert data["build_exit_code"] == 0 and "DONE" in data["build_output"] and data["size_bytes"] > 0


def test_apply_turing_patch_reports_progress_while_the_build_runs(engine: FakeEngine, environ: dict[str, str]) -> None:
    import time

    lines = engine.build_lines
    slow = FakeEngine.build_image

    def build(self: FakeEngine, on_line: Callable[[str], None], timeout: float = 3600.0) -> Any:
        time.sleep(2.5)  # long enough for two heartbeats
        return slow(self, on_line, timeout)

    engine.build_image = build.__get__(engine)  # type: ignore[method-assign]
    seen: list[tuple[float, str | None]] = []

    async def progress(value: float, total: float | None, message: str | None) -> None:
        seen.append((value, message))

    ok(call(tool_env(engine, environ), "apply_turing_patch", progress=progress))
    assert len(seen) >= 2 and [v for v, _ in seen] == sorted(v for v, _ in seen)
    assert seen[0][1] == "starting scripts/build-image" and lines


def test_apply_turing_patch_failure_is_a_tool_error(engine: FakeEngine, environ: dict[str, str]) -> None:
    engine.build_code = 1
    engine.build_lines = ["ERROR: failed to solve: pip install exited 1"]
    text = error_text(call(tool_env(engine, environ), "apply_turing_patch"))
    assert "exit 1" in text and "failed to solve" in text and "fix:" in text


# ----- plan ------------------------------------------------------------------------------------------------------


def test_plan_for_a_known_gpu_and_model(engine: FakeEngine, environ: dict[str, str]) -> None:
    data = ok(call(tool_env(engine, environ, devices=[]), "plan",
                   {"model": "bf16", "gpu_model": "T4", "settings": {"T4SERVE_MAX_MODEL_LEN": "8192"}}))  # fmt: skip
    assert "--dtype float16" in data["command_line"] and "--max-model-len 8192" in data["command_line"]
    assert data["plan"]["gpu"]["name"] == "Tesla T4" and data["plan"]["gpu_origin"].startswith("known")
    assert data["settings"]["T4SERVE_MAX_MODEL_LEN"]["value"] == "8192"
    assert {f["check"] for f in data["findings"]} >= {"capability", "dtype", "sizing", "clamp"}
    assert_no_secret(data)


def test_plan_and_profiles_with_the_drafter(engine: FakeEngine, environ: dict[str, str]) -> None:
    """T4SERVE_SPECULATIVE through the tools: the plan passes the drafter and checks it; profiles show it."""
    data = ok(call(tool_env(engine, environ, devices=[]), "plan",
                   {"model": "qat", "gpu_model": "t4", "settings": {"T4SERVE_SPECULATIVE": "mtp"}}))
    assert '"method": "mtp", "model": "google/gemma-4-E2B-it-assistant"' in data["command_line"]
    assert data["plan"]["speculative"].startswith("mtp: google/gemma-4-E2B-it-assistant")
    assert "drafter" in {f["check"] for f in data["findings"]}
    rows = ok(call(tool_env(engine, environ, devices=[]), "profiles",
                   {"gpu_model": "t4", "settings": {"T4SERVE_SPECULATIVE": "mtp"}}))["profiles"]
    assert {r["speculative"].split(":")[0] for r in rows} == {"mtp"}
    text = error_text(call(tool_env(engine, environ), "plan", {"settings": {
        "T4SERVE_VLLM_ARGS": "--speculative-config '{\"method\": \"ngram_gpu\"}'"}}))
    assert "T4SERVE_SPECULATIVE" in text and "fix:" in text


@pytest.mark.parametrize(
    ("settings", "words"),
    [
        ({"HF_TOKEN": HF_TOKEN}, "cannot be passed through a tool"),
        ({"T4SERVE_API_KEY_FILE": "/run/secrets/api_key"}, "cannot be passed through a tool"),
        ({"T4SERVE_NOT_A_THING": "1"}, "not a t4serve setting"),
        ({"T4SERVE_MAX_MODEL_LEN": "lots"}, "T4SERVE_MAX_MODEL_LEN"),
    ],
)
def test_plan_refuses_bad_settings_with_the_fix(
    engine: FakeEngine, environ: dict[str, str], settings: dict[str, str], words: str
) -> None:
    text = error_text(call(tool_env(engine, environ), "plan", {"settings": settings}))
    assert words in text and "fix:" in text
    assert HF_TOKEN not in text


def test_plan_for_an_unknown_gpu_names_the_known_ones(engine: FakeEngine, environ: dict[str, str]) -> None:
    text = error_text(call(tool_env(engine, environ), "plan", {"gpu_model": "v100"}))
    assert "not a known GPU" in text and "t4" in text


def test_profiles_are_the_plans_for_each_kv_cache_dtype(engine: FakeEngine, environ: dict[str, str]) -> None:
    data = ok(call(tool_env(engine, environ, devices=[]), "profiles", {"gpu_model": "t4"}))
    assert data["gpu"] == "Tesla T4"
    rows = {(r["checkpoint"], r["kv_cache_dtype"], r["max_model_len"]): r for r in data["profiles"]}
    assert rows[("qat", "int8", 16384)]["runnable"] and "--kv-cache-dtype int8_per_token_head" in rows[
        ("qat", "int8", 16384)]["command_line"]
    assert not rows[("bf16", "fp8", 4096)]["runnable"] and "SM89+" in rows[("bf16", "fp8", 4096)]["reason"]
    assert "not runnable, and why:" in data["summary"]
    plan_data = ok(call(tool_env(engine, environ, devices=[]), "plan",
                        {"gpu_model": "t4", "settings": {"T4SERVE_KV_CACHE_DTYPE": "int4",
                                                         "T4SERVE_MAX_MODEL_LEN": "32768"}}))  # fmt: skip
    # int4's attention kernel needs 98,304 B of shared memory at head 512 on sm_75: refused on a T4, by both alike.
    int4 = rows[("qat", "int4", 32768)]
    assert not int4["runnable"] and "98,304 B" in int4["reason"]
    assert plan_data["plan"]["sizing"] is None and int4["reason"] in plan_data["plan"]["sizing_error"]
    plan_data = ok(call(tool_env(engine, environ, devices=[]), "plan",
                        {"gpu_model": "t4", "settings": {"T4SERVE_KV_CACHE_DTYPE": "int8",
                                                         "T4SERVE_MAX_MODEL_LEN": "32768"}}))  # fmt: skip
    assert rows[("qat", "int8", 32768)]["kv_tokens"] == plan_data["plan"]["sizing"]["kv_tokens"]["value"]
    assert_no_secret(data)


# ----- start, status, logs, stop ---------------------------------------------------------------------------------


def test_start_returns_once_under_way_with_where_to_poll(engine: FakeEngine, environ: dict[str, str]) -> None:
    args = {"model": "qat", "settings": {"T4SERVE_MAX_MODEL_LEN": "8192"}, "gpu_device": "1", "publish_port": 8001}
    data = ok(call(tool_env(engine, environ), "start_vllm_server", args))
    up = next(detail for name, detail in engine.calls if name == "up")
    assert up == {"environment": {"T4SERVE_MODEL": "qat", "T4SERVE_MAX_MODEL_LEN": "8192"},  # type: ignore[comparison-overlap]
                  "compose_env": {"T4SERVE_GPU": "1", "T4SERVE_PUBLISH_PORT": "8001"}}  # fmt: skip
    assert data["container"] == "c0ffee123456" and "server_status" in data["poll"]
    assert data["model"] == data["model_in_container"] == "google/gemma-4-E2B-it-qat-w4a16-ct"
    # It returned once t4serve's state existed: the phase is the state's.
    assert data["state_written"] and data["phase"] == "loading_weights"
    assert_no_secret(data)


def test_start_follows_the_phases_when_asked_and_reports_progress(engine: FakeEngine, environ: dict[str, str]) -> None:
    engine.state_on_up = serve_state("ready")
    seen: list[str | None] = []

    async def progress(value: float, total: float | None, message: str | None) -> None:
        seen.append(message)

    data = ok(call(tool_env(engine, environ), "start_vllm_server", {"wait_s": 10}, progress=progress))
    assert data["phase"] == "ready"
    assert seen[0] is not None and seen[0].startswith("compose up") and "under way: ready" in seen


def test_start_without_the_token_secret_file_says_how_to_make_it(engine: FakeEngine, environ: dict[str, str]) -> None:
    environ["HF_TOKEN_SECRET_FILE"] = str(engine.root / "missing" / "hf_token")
    text = error_text(call(tool_env(engine, environ), "start_vllm_server"))
    assert "secret file is missing" in text and "printf %s" in text
    assert not any(name == "up" for name, _ in engine.calls)


def test_start_with_compose_yaml_takes_the_token_from_its_environment(
    engine: FakeEngine, environ: dict[str, str]
) -> None:
    """compose.yaml's hf_token secret reads HF_TOKEN in compose's environment, which is this process's: without it
    the start stops before compose, saying so (issue 45); with it, no secret file is needed."""
    shutil.copy(REPO / "compose.yaml", engine.project_directory / "compose.yaml")
    del environ["HF_TOKEN_SECRET_FILE"]
    text = error_text(call(tool_env(engine, environ), "start_vllm_server"))
    assert "compose has no HF token to give the server" in text and "no HF_TOKEN in its environment" in text
    assert "HF_TOKEN=hf_..." in text and "compose.token-file.yaml" in text
    assert not any(name == "up" for name, _ in engine.calls)
    environ["HF_TOKEN"] = HF_TOKEN
    engine.state_on_up = serve_state("ready")
    assert ok(call(tool_env(engine, environ), "start_vllm_server", {"wait_s": 10}))["phase"] == "ready"


def test_start_refuses_bad_settings_before_compose(engine: FakeEngine, environ: dict[str, str]) -> None:
    text = error_text(call(tool_env(engine, environ), "start_vllm_server", {"settings": {"T4SERVE_DTYPE": "int3"}}))
    assert "T4SERVE_DTYPE" in text and "fix:" in text
    assert not any(name == "up" for name, _ in engine.calls)


def test_start_refuses_a_gpu_that_is_not_an_index_or_uuid(engine: FakeEngine, environ: dict[str, str]) -> None:
    assert "pattern" in error_text(call(tool_env(engine, environ), "start_vllm_server", {"gpu_device": "0'\n  x: y"}))
    assert not any(name == "up" for name, _ in engine.calls)


def test_start_refuses_when_already_running(engine: FakeEngine, environ: dict[str, str]) -> None:
    env = tool_env(engine, environ)
    ok(call(env, "start_vllm_server"))
    text = error_text(call(env, "start_vllm_server"))
    assert "already running" in text and "stop_vllm_server" in text


def test_start_of_a_container_that_exits_at_once_returns_its_exit_code_and_log_lines(
    engine: FakeEngine, environ: dict[str, str]
) -> None:
    engine.exit_on_up = 2
    engine.log_lines = [f"t4serve: starting (token {HF_TOKEN})", "t4serve: error: HF_TOKEN_FILE must name a file "
                        "holding one token (/run/secrets/hf_token holds whitespace inside)", "  fix: write the token"]
    text = error_text(call(tool_env(engine, environ), "start_vllm_server"))
    assert "the container exited at once (exit 2)" in text and "is exited" in text
    assert "holds whitespace inside" in text and "fix: write the token" in text
    assert "a setting is wrong" in text and "stop_vllm_server" in text
    assert HF_TOKEN not in text and "<redacted>" in text


def test_start_of_a_container_that_waits_on_a_configuration_error_stops_it_and_says_why(
    engine: FakeEngine, environ: dict[str, str]
) -> None:
    """compose.yaml's T4SERVE_ON_CONFIG_ERROR=wait keeps such a container running (no restart loop); the start stops
    it, so it exits 2 and stays stopped, and answers with that exit code and the log lines, as for one that exited."""
    engine.config_error = "HF_TOKEN_FILE must name a file holding one token (/run/secrets/hf_token holds whitespace)"
    engine.log_lines = ["t4serve: error: HF_TOKEN_FILE must name a file holding one token (/run/secrets/hf_token "
                        "holds whitespace inside)", "  fix: write the token"]
    env = tool_env(engine, environ)
    text = error_text(call(env, "start_vllm_server"))
    assert "the container exited at once (exit 2)" in text and "holds whitespace inside" in text
    assert "a setting is wrong" in text
    assert [c for c in engine.calls if c[0] in ("stop", "down")] == [("stop", 10)]
    status = ok(call(env, "server_status"))
    assert status["running"] is False and status["exit_code"] == 2
    # A corrected start is not refused as "already running": the stopped container is replaced.
    engine.config_error = None
    ok(call(env, "start_vllm_server"))


def test_server_status_names_the_configuration_error_a_container_waits_on(
    engine: FakeEngine, environ: dict[str, str]
) -> None:
    engine.config_error = "T4SERVE_PORT must be a port number (found 'x')"
    engine.container = ServiceContainer("c0ffee123456", "t4serve-t4serve-1", "running", "starting", 0,
                                        "2026-12-03T10:00:00Z", "t4serve:dev")  # fmt: skip
    status = ok(call(tool_env(engine, environ), "server_status"))
    assert status["phase"] == "config_error" and status["ready"] is False
    assert status["reason"] == "T4SERVE_PORT must be a port number (found 'x')"


def test_start_of_a_container_docker_keeps_restarting_is_a_failure_too(
    engine: FakeEngine, environ: dict[str, str]
) -> None:
    import dataclasses

    def up(environment: Any, compose_env: Any, mounts: Any = ()) -> ServiceContainer:
        # restart: unless-stopped: the container exited 3 (preflight) and Docker is restarting it.
        engine.container = ServiceContainer("c0ffee123456", "t4serve-t4serve-1", "running", "starting", 0,
                                            "2026-12-03T10:00:00Z", "t4serve:dev")  # fmt: skip
        engine.container = dataclasses.replace(engine.container, state="restarting", exit_code=3, restart_count=2)
        return engine.container

    engine.up = up  # type: ignore[assignment,method-assign]
    engine.log_lines = ["preflight failed (1 check(s): gpu); not starting vLLM. First: gpu"]
    text = error_text(call(tool_env(engine, environ), "start_vllm_server"))
    assert "exited at once (exit 3)" in text and "restarted 2 time(s) by Docker" in text
    assert "preflight failed" in text and "T4SERVE_PREFLIGHT=warn" in text


def test_start_mounts_a_model_folder_of_this_host(engine: FakeEngine, environ: dict[str, str], tmp_path: Path) -> None:
    folder = tmp_path / "models" / "gemma-4-E2B-it"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    data = ok(call(tool_env(engine, environ), "start_vllm_server", {"model": str(folder)}))
    up = next(detail for name, detail in engine.calls if name == "up")
    assert up["mounts"] == [(str(folder), "/models/gemma-4-E2B-it")]  # type: ignore[index]
    assert up["environment"]["T4SERVE_MODEL"] == "/models/gemma-4-E2B-it"  # type: ignore[index]
    assert data["model"] == str(folder) and data["model_in_container"] == "/models/gemma-4-E2B-it"


def test_start_refuses_a_model_folder_this_host_lacks(engine: FakeEngine, environ: dict[str, str]) -> None:
    text = error_text(call(tool_env(engine, environ), "start_vllm_server", {"model": "/srv/no/such/model"}))
    assert "T4SERVE_MODEL" in text and "not a directory" in text and "fix:" in text
    assert not any(name == "up" for name, _ in engine.calls)


@pytest.mark.parametrize(
    ("settings", "words"),
    [
        ({"T4SERVE_PORT": "9000"}, "T4SERVE_PORT cannot be changed here"),
        ({"T4SERVE_HOST": "127.0.0.1"}, "T4SERVE_HOST cannot be changed here"),
        ({"T4SERVE_MODEL": "bf16"}, "T4SERVE_MODEL is the tool's `model` argument"),
    ],
)
def test_start_refuses_settings_the_deployment_fixes(
    engine: FakeEngine, environ: dict[str, str], settings: dict[str, str], words: str
) -> None:
    text = error_text(call(tool_env(engine, environ), "start_vllm_server", {"settings": settings}))
    assert words in text and "fix:" in text
    assert not any(name == "up" for name, _ in engine.calls)


def test_a_second_start_while_the_first_runs_is_busy(engine: FakeEngine, environ: dict[str, str]) -> None:
    gate = threading.Event()
    real_up = engine.up

    def slow_up(environment: Any, compose_env: Any, mounts: Any = ()) -> ServiceContainer:
        assert gate.wait(30)
        return real_up(environment, compose_env, mounts)

    engine.up = slow_up  # type: ignore[assignment,method-assign]
    env = tool_env(engine, environ)
    out: dict[str, Any] = {}

    async def session() -> None:
        async with Client(build_server(env), client_info=Implementation(name="test-client", version="1.0")) as client:
            under_way = anyio.Event()

            async def progress(value: float, total: float | None, message: str | None) -> None:
                if message and message.startswith("compose up"):
                    under_way.set()

            async def first() -> None:
                out["first"] = await client.call_tool("start_vllm_server", {}, progress_callback=progress)

            async with anyio.create_task_group() as group:
                group.start_soon(first)
                await under_way.wait()
                out["second"] = await client.call_tool("start_vllm_server", {})
                out["stop"] = await client.call_tool("stop_vllm_server", {})
                gate.set()

    anyio.run(session)
    second = error_text(out["second"])
    assert "start_vllm_server: busy: start_vllm_server (pid " in second and "client test-client 1.0" in second
    assert "since 20" in second and "UTC" in second and "wait for that call to finish" in second
    assert "stop_vllm_server: busy: start_vllm_server" in error_text(out["stop"])
    assert ok(out["first"])["state_written"]
    assert [name for name, _ in engine.calls].count("up") == 1 and ("down", 90) not in engine.calls


LOCK_HOLDER = """
import sys, time
from pathlib import Path
from t4serve.mcp.deploylock import Holder, hold
with hold(Path(sys.argv[1]), Holder("stop_vllm_server", __import__("os").getpid(), "other-client 2.0", time.time())):
    print("held", flush=True)
    time.sleep(120)
"""


def test_the_lock_holds_across_processes_and_a_killed_holder_frees_it(
    engine: FakeEngine, environ: dict[str, str]
) -> None:
    env = tool_env(engine, environ)
    path = lock_file(env.data_dir, env.deployment())
    holder = subprocess.Popen([sys.executable, "-c", LOCK_HOLDER, str(path)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        text = error_text(call(env, "start_vllm_server"))
        assert f"busy: stop_vllm_server (pid {holder.pid}, client other-client 2.0)" in text
        assert not any(name == "up" for name, _ in engine.calls)
    finally:
        holder.kill()  # a crash: the process ends without letting go of anything itself
        holder.wait()
    assert ok(call(env, "start_vllm_server"))["state_written"]


def test_status_without_a_container(engine: FakeEngine, environ: dict[str, str]) -> None:
    data = ok(call(tool_env(engine, environ), "server_status"))
    assert data["running"] is False and data["ready"] is False and "start_vllm_server" in data["text"]


def test_status_while_loading_has_the_phase_and_an_estimate(engine: FakeEngine, environ: dict[str, str]) -> None:
    env = tool_env(engine, environ)
    ok(call(env, "start_vllm_server"))
    engine.state = serve_state("loading_weights")
    data = ok(call(env, "server_status"))
    assert data["running"] and not data["ready"] and data["phase"] == "loading_weights"
    assert data["phase_label"] == "loading weights" and data["phase_seconds"] == pytest.approx(195.0)
    assert data["estimate_to_ready_s"] is not None and data["estimate_to_ready_s"] >= 0
    assert "estimate:" in data["text"]


def test_status_when_ready_sets_figures_beside_predictions(engine: FakeEngine, environ: dict[str, str]) -> None:
    env = tool_env(engine, environ)
    ok(call(env, "start_vllm_server"))
    engine.state = serve_state("ready")
    engine.api_port = 18000
    data = ok(call(env, "server_status"))
    assert data["ready"] and data["canary_ok"] and data["api_url"] == "http://127.0.0.1:18000"
    figures = {f["name"]: f for f in data["figures"]}
    assert figures["kv_tokens"]["logged"] == 507_000 and figures["kv_tokens"]["predicted"] == 507_832
    assert figures["kv_tokens"]["deviation"] == pytest.approx((507_000 - 507_832) / 507_832)
    assert figures["max_concurrency"]["logged"] is None and figures["max_concurrency"]["predicted"] == 31.0


def test_status_of_an_exited_container(engine: FakeEngine, environ: dict[str, str]) -> None:
    env = tool_env(engine, environ)
    ok(call(env, "start_vllm_server"))
    assert engine.container is not None
    import dataclasses

    engine.container = dataclasses.replace(engine.container, state="exited", exit_code=3, health=None)
    data = ok(call(env, "server_status"))
    assert not data["running"] and data["exit_code"] == 3 and "server_logs" in data["text"]


def test_logs_are_bounded_by_lines_and_bytes_and_redacted(engine: FakeEngine, environ: dict[str, str]) -> None:
    env = tool_env(engine, environ)
    ok(call(env, "start_vllm_server"))
    engine.log_lines = [f"line {i}" for i in range(800)] + [f"leaked {API_KEY} and {HF_TOKEN}"]
    data = ok(call(env, "server_logs", {"tail": 500}))
    assert len(data["lines"]) == 500 and data["lines"][-1] == "leaked <redacted> and <redacted>"
    assert data["lines"][0] == "line 301" and not data["truncated"]
    assert_no_secret(data)
    engine.log_lines = ["x" * 1000] * 500
    big = ok(call(env, "server_logs", {"tail": 500, "since": "10m"}))
    assert big["truncated"] and big["bytes"] <= MAX_LOG_BYTES and len(big["lines"]) == MAX_LOG_BYTES // 1001
    assert ("logs", ("c0ffee123456", 500, "10m")) in engine.calls
    assert "less than or equal to 500" in error_text(call(env, "server_logs", {"tail": 501}))
    assert error_text(call(env, "server_logs", {"since": "1h; rm -rf /"}))


def test_logs_without_a_container_is_a_tool_error(engine: FakeEngine, environ: dict[str, str]) -> None:
    assert "start_vllm_server" in error_text(call(tool_env(engine, environ), "server_logs"))


def test_stop_stops_and_a_second_stop_finds_nothing(engine: FakeEngine, environ: dict[str, str]) -> None:
    env = tool_env(engine, environ)
    ok(call(env, "start_vllm_server"))
    first = ok(call(env, "stop_vllm_server", {"timeout_s": 30}))
    assert first["stopped"] and first["container"] == "c0ffee123456" and ("down", 30) in engine.calls
    second = ok(call(env, "stop_vllm_server"))
    assert not second["stopped"] and "no t4serve container" in second["note"]


# ----- query -----------------------------------------------------------------------------------------------------


def ready_server(engine: FakeEngine, environ: dict[str, str], port: int) -> ToolEnv:
    env = tool_env(engine, environ)
    ok(call(env, "start_vllm_server"))
    engine.state = serve_state("ready")
    engine.api_port = port
    return env


def test_query_completes_with_latency_and_the_key_only_in_the_header(
    engine: FakeEngine, environ: dict[str, str]
) -> None:
    routes = {
        "/v1/completions": Canned(body={"choices": [{"text": " 391", "finish_reason": "length"}],
                                        "usage": {"prompt_tokens": 6, "completion_tokens": 2}}, delay=0.05),
        "/v1/chat/completions": Canned(body={"choices": [{"message": {"role": "assistant", "content": "Hello."},
                                                          "finish_reason": "stop"}]}),
    }  # fmt: skip
    with serve(routes, api_key=API_KEY) as server:
        env = ready_server(engine, environ, server.port)
        data = ok(call(env, "query", {"prompt": "17*23=", "max_tokens": 4}))
        assert data["text"] == " 391" and data["completion_tokens"] == 2 and data["latency_s"] >= 0.05
        assert data["model"] == "gemma-4-e2b" and data["finish_reason"] == "length"
        path, body = server.requests[-1]
        assert path == "/v1/completions" and body == {"model": "gemma-4-e2b", "max_tokens": 4, "temperature": 0.0,
                                                       "prompt": "17*23="}  # fmt: skip
        assert server.authorizations[-1] == f"Bearer {API_KEY}"
        chat = ok(call(env, "query", {"messages": [{"role": "user", "content": "Hi"}]}))
        assert chat["text"] == "Hello." and server.requests[-1][0] == "/v1/chat/completions"
        assert_no_secret(data)
        assert_no_secret(chat)


def test_query_with_a_wrong_key_says_which_variable(engine: FakeEngine, environ: dict[str, str]) -> None:
    with serve({"/v1/completions": Canned(body={})}, api_key="another-key-entirely-000") as server:
        text = error_text(call(ready_server(engine, environ, server.port), "query", {"prompt": "hi"}))
    assert "HTTP 401" in text and "T4SERVE_API_KEY_FILE" in text and API_KEY not in text


@pytest.mark.parametrize(
    ("args", "words"),
    [
        ({"prompt": "a", "messages": [{"role": "user", "content": "b"}]}, "exactly one of prompt and messages"),
        ({}, "exactly one of prompt and messages"),
        ({"prompt": "a", "max_tokens": 4096}, "less than or equal to 1024"),
    ],
)
def test_query_arguments_are_bounded(engine: FakeEngine, environ: dict[str, str], args: dict[str, Any],
                                     words: str) -> None:  # fmt: skip
    with serve({}) as server:
        assert words in error_text(call(ready_server(engine, environ, server.port), "query", args))


def test_query_before_ready_is_a_tool_error(engine: FakeEngine, environ: dict[str, str]) -> None:
    env = tool_env(engine, environ)
    ok(call(env, "start_vllm_server"))
    engine.state = serve_state("loading_weights")
    text = error_text(call(env, "query", {"prompt": "hi"}))
    assert "query: the server is not ready" in text and "loading" in text and "call server_status until ready" in text


def test_query_and_benchmark_use_the_port_the_server_listens_on(engine: FakeEngine, environ: dict[str, str]) -> None:
    body = {"choices": [{"text": " 391", "finish_reason": "length"}]}
    with serve({"/v1/completions": Canned(body=body)}, api_key=API_KEY) as server:
        env = ready_server(engine, environ, server.port)
        engine.state = serve_state("ready", port=9000)
        text = error_text(call(env, "query", {"prompt": "17*23="}))
        assert "not published on this host" in text and "container port 9000" in text
        engine.published_container_port = 9000
        assert ok(call(env, "query", {"prompt": "17*23="}))["text"] == " 391"
        status = ok(call(env, "server_status"))
        assert status["api_port"] == 9000 and status["api_url"] == f"http://127.0.0.1:{server.port}"
        ok(call(env, "run_benchmark"))
        argv = bench_started(engine)
        assert argv[argv.index("--base-url") + 1] == "http://127.0.0.1:9000"


def test_query_does_not_follow_a_redirect_with_the_key(engine: FakeEngine, environ: dict[str, str]) -> None:
    with serve({"/v1/completions": Canned(status=307, headers={"Location": "http://elsewhere.example/steal"})},
               api_key=API_KEY) as server:  # fmt: skip
        text = error_text(call(ready_server(engine, environ, server.port), "query", {"prompt": "hi"}))
    assert "HTTP 307" in text and "redirects are not followed" in text and "elsewhere.example" in text


def test_secrets_in_structured_fields_are_redacted(engine: FakeEngine, environ: dict[str, str]) -> None:
    env = tool_env(engine, environ)
    ok(call(env, "start_vllm_server"))
    engine.state = serve_state("failed", reason=f"vLLM exited: bad key {API_KEY}",
                               diagnosis=f"token {HF_TOKEN} refused by the hub", fix=f"unset {API_KEY}")  # fmt: skip
    data = ok(call(env, "server_status"))
    assert_no_secret(data)
    assert data["reason"] == "vLLM exited: bad key <redacted>" and data["fix"] == "unset <redacted>"
    assert data["diagnosis"] == "token <redacted> refused by the hub"


# ----- benchmark -------------------------------------------------------------------------------------------------

# Stands in for `vllm bench serve` in the fake container (test_bench_runner.client_package makes it what the sweep's
# client imports of vLLM): waits for GATE (so a test sees the sweep running), then writes vLLM's result JSON from its
# own arguments.
BENCH_CLIENT = """#!{python}
import json, os, sys, time
args = sys.argv[1:]
value = lambda flag: args[args.index(flag) + 1]
deadline = time.monotonic() + 60
while not os.path.exists(GATE) and time.monotonic() < deadline:
    time.sleep(0.05)
c = int(value("--max-concurrency"))
result = {{"completed": 8, "failed": 0, "output_throughput": 60.1 if c == 1 else 200.0, "median_tpot_ms": 16.5,
          "median_ttft_ms": 41.0, "mean_ttft_ms": 44.0, "total_output_tokens": 512, "duration": 8.5,
          "model_id": value("--model")}}
with open(value("--result-dir") + "/" + value("--result-filename"), "w") as f:
    json.dump(result, f)
"""


def bench_client(engine: FakeEngine) -> Path:
    """The stand-in client in the fake container; returns its gate (create it to let the runs finish)."""
    from test_bench_runner import client_package

    gate = engine.root / "gate"
    engine.pythonpath = client_package(engine.root, BENCH_CLIENT.replace("GATE", repr(str(gate))))
    return gate


def until(env: ToolEnv, run_id: str, done: Callable[[dict[str, Any]], bool], timeout: float = 90.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        status = ok(call(env, "benchmark_status", {"run_id": run_id}))
        if done(status) or time.monotonic() > deadline:
            return status
        time.sleep(0.3)


def bench_started(engine: FakeEngine) -> list[str]:
    """The argv of the `t4serve bench start` the tool ran in the container."""
    return next(d[0] for n, d in engine.calls if n == "exec" and d[0][:3] == ["t4serve", "bench", "start"])  # type: ignore[index]


def test_benchmark_starts_in_the_container_and_its_status_follows_to_the_report(
    engine: FakeEngine, environ: dict[str, str]
) -> None:
    """The real `t4serve bench start` and `bench status` in the (fake) container, the sweep against a local server
    with a stand-in client: running with its runs planned, busy for a second start, then done with its figures."""
    gate = bench_client(engine)
    with serve({"/v1/models": Canned(body={"data": [{"id": "gemma-4-e2b"}]})}) as server:
        env = tool_env(engine, environ)
        ok(call(env, "start_vllm_server"))
        engine.state = serve_state("ready", port=server.port)
        started = ok(call(env, "run_benchmark", {"inputs": [512], "concurrency": [1, 4], "output_len": 64}))
        run_id = started["run_id"]
        assert bench_started(engine) == [
            "t4serve", "bench", "start", "--json", "--", "--models", "google/gemma-4-E2B-it-qat-w4a16-ct",
            "--base-url", f"http://127.0.0.1:{server.port}", "--inputs", "512", "--concurrency", "1,4", "--repeats",
            "1", "--output-len", "64"]  # fmt: skip
        assert started["output_dir"] == str(engine.in_container(f"/cache/t4serve/bench/{run_id}"))
        running = until(env, run_id, lambda s: s["runs_planned"] is not None)
        assert running["state"] == "running" and running["exit_code"] is None
        assert (running["runs_done"], running["runs_planned"]) == (0, 2) and running["cells"] == []
        busy = error_text(call(env, "run_benchmark"))
        assert "busy: a benchmark is running" in busy and run_id in busy
        gate.touch()
        done = until(env, run_id, lambda s: s["state"] != "running")
    assert done["state"] == "done" and done["exit_code"] == 0, done["log_tail"]
    assert (done["runs_done"], done["runs_planned"]) == (2, 2) and "60.1" in done["report_md"]
    assert done["host_folder"] == str(engine.root / "data" / "bench" / run_id)
    assert all(Path(p).is_file() and Path(p).suffix == ".png" for p in done["plots"])
    cells = {c["concurrency"]: c for c in done["cells"]}
    assert set(cells) == {1, 4} and cells[1]["throughput_tok_s"] == 60.1 and cells[1]["ttft_ms"] == 41.0
    assert cells[4]["per_stream_tok_s"] == pytest.approx(1000 / 16.5) and cells[4]["completed_requests"] == 8
    # Ended: read from the host copy from now on, even with the server gone.
    engine.container = None
    again = ok(call(env, "benchmark_status", {"run_id": run_id}))
    assert again == done
    assert not list((engine.root / "data" / "bench").glob(".*"))  # no staging folder left


def test_benchmark_whose_process_is_gone_is_failed_not_running_forever(
    engine: FakeEngine, environ: dict[str, str]
) -> None:
    gate = bench_client(engine)  # opened only at the end: the runs wait until they are killed
    env = tool_env(engine, environ)
    ok(call(env, "start_vllm_server"))
    engine.state = serve_state("ready")
    run_id = ok(call(env, "run_benchmark"))["run_id"]
    folder = engine.in_container(f"/cache/t4serve/bench/{run_id}")
    job = json.loads((folder / "job.json").read_text())
    os.killpg(job["pid"], signal.SIGKILL)  # the watcher's session: it and the sweep, as a kill -9 does
    gone = until(env, run_id, lambda s: s["state"] != "running", timeout=20)
    assert gone["state"] == "failed" and gone["exit_code"] is None and "process is gone" in gone["log_tail"]
    # A run that is not running does not block the next one.
    other = ok(call(env, "run_benchmark"))["run_id"]
    assert other != run_id
    os.killpg(json.loads((folder.parent / other / "job.json").read_text())["pid"], signal.SIGKILL)
    gate.touch()  # the sweep's client has a session of its own: it ends at the end of its run and its input


def test_benchmark_status_refuses_a_bad_run_id_and_an_unknown_one(engine: FakeEngine, environ: dict[str, str]) -> None:
    env = tool_env(engine, environ)
    ok(call(env, "start_vllm_server"))
    assert "pattern" in error_text(call(env, "benchmark_status", {"run_id": "../../etc"}))
    assert "no benchmark 20261203-101010-abcdef" in error_text(
        call(env, "benchmark_status", {"run_id": "20261203-101010-abcdef"}))


def test_benchmark_needs_a_ready_server(engine: FakeEngine, environ: dict[str, str]) -> None:
    text = error_text(call(tool_env(engine, environ), "run_benchmark"))
    assert "run_benchmark: the server is not ready" in text and "start_vllm_server if none is running" in text


# ----- errors ----------------------------------------------------------------------------------------------------


def test_a_bug_is_a_one_line_tool_error_without_a_traceback(engine: FakeEngine, environ: dict[str, str]) -> None:
    def broken() -> None:
        raise KeyError("DockerRootDir")

    engine.service = broken  # type: ignore[assignment,method-assign]
    text = error_text(call(tool_env(engine, environ), "server_status"))
    assert "internal error (a bug in t4serve" in text and "KeyError: 'DockerRootDir' at test_mcp_tools.py:" in text


def test_the_token_in_composes_default_secret_file_is_redacted(engine: FakeEngine, environ: dict[str, str]) -> None:
    # No HF_TOKEN_SECRET_FILE: compose reads ./secrets/hf_token in the project folder, and so does the redaction.
    del environ["HF_TOKEN_SECRET_FILE"]
    secret = engine.project_directory / "secrets" / "hf_token"
    secret.parent.mkdir()
    secret.write_text(HF_TOKEN + "\n")
    env = tool_env(engine, environ)
    ok(call(env, "start_vllm_server"))
    engine.log_lines = [f"token {HF_TOKEN}"]
    assert ok(call(env, "server_logs"))["lines"] == ["token <redacted>"]


def test_no_secret_reaches_the_server_log(
    engine: FakeEngine, environ: dict[str, str], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    with serve({"/v1/completions": Canned(body={})}, api_key="another-key-entirely-000") as server:
        env = ready_server(engine, environ, server.port)
        engine.log_lines = [f"token {HF_TOKEN} key {API_KEY}"]
        error_text(call(env, "query", {"prompt": "hi"}))
        ok(call(env, "server_logs"))
        error_text(call(env, "plan", {"settings": {"HF_TOKEN": HF_TOKEN}}))
    assert "Tool 'query' failed" in caplog.text
    assert API_KEY not in caplog.text and HF_TOKEN not in caplog.text


def test_a_copied_benchmark_folder_with_a_fifo_is_read_without_blocking(tmp_path: Path) -> None:
    """`docker cp` copies a FIFO as a FIFO: the host-side reader takes a regular answer file only, and says so."""
    from t4serve.mcp.benchtools import ANSWER_FILE, read_host_answer

    os.mkfifo(tmp_path / ANSWER_FILE)
    box: list[BaseException] = []

    def read() -> None:
        try:
            read_host_answer(tmp_path)
        except ConfigError as exc:
            box.append(exc)

    worker = threading.Thread(target=read, daemon=True)
    worker.start()
    worker.join(5)
    assert not worker.is_alive(), "read_host_answer blocked on a FIFO"
    assert len(box) == 1 and "cannot be read" in str(box[0]) and f"remove {tmp_path}" in str(box[0])
    assert read_host_answer(tmp_path / "absent") is None
