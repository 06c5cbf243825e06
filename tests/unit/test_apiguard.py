"""t4serve.apiguard.ApiKeyGuard as an ASGI middleware: driven here with ASGI scopes as Starlette (vLLM's app) would
send them; the stand-in tests drive it over HTTP, and tests/image/test_apiguard_vllm.py inside vLLM 0.33's own app."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from sample_facts import t4

from t4serve import apiguard
from t4serve.apiguard import OPEN_PATHS, ApiKeyGuard
from t4serve.config.settings import Settings
from t4serve.pipeline import ensure_model
from t4serve.planning.plan import plan

KEY = "sk-guard-0123456789"


def call(guard: ApiKeyGuard, scope: dict[str, Any]) -> tuple[bool, list[dict[str, Any]]]:
    """(whether the request reached the app, what the guard sent itself)."""
    reached: list[bool] = []
    sent: list[dict[str, Any]] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        reached.append(True)

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Any) -> None:
        sent.append(message)

    guard.app = app
    asyncio.run(guard(scope, receive, send))
    return bool(reached), sent


def http(path: str, method: str = "POST", authorization: str | None = None, root_path: str = "") -> dict[str, Any]:
    headers = [(b"content-type", b"application/json")]
    if authorization is not None:
        headers.append((b"Authorization", authorization.encode()))
    return {"type": "http", "method": method, "path": path, "root_path": root_path, "headers": headers}


def guard(key: str | None = KEY) -> ApiKeyGuard:
    async def nothing(scope: Any, receive: Any, send: Any) -> None:
        raise AssertionError("replaced in call()")

    return ApiKeyGuard(app=nothing, key=key)


GUARDED = ["/invocations", "/generative_scoring", "/scale_elastic_ep", "/tokenize", "/docs", "/v1/completions", "/load",
           "/health/", "//health", "/", "/v1/../invocations"]  # fmt: skip


@pytest.mark.parametrize("path", GUARDED)
def test_every_other_path_needs_the_key(path: str) -> None:
    for authorization in (None, "Bearer sk-wrong", f"Basic {KEY}", f"Bearer {KEY} ", "Bearer", ""):
        reached, sent = call(guard(), http(path, authorization=authorization))
        assert not reached, (path, authorization)
        assert sent[0]["status"] == 401 and json.loads(sent[1]["body"]) == {"error": "Unauthorized"}
    for authorization in (f"Bearer {KEY}", f"bearer {KEY}", f"BEARER {KEY}"):
        assert call(guard(), http(path, authorization=authorization)) == (True, [])


@pytest.mark.parametrize("path", sorted(OPEN_PATHS))
def test_health_metrics_ping_and_version_stay_open(path: str) -> None:
    assert call(guard(), http(path, method="GET")) == (True, [])


def test_the_root_path_is_removed_before_the_check_as_vllm_does() -> None:
    assert call(guard(), http("/api/health", method="GET", root_path="/api")) == (True, [])
    assert not call(guard(), http("/api/invocations", root_path="/api"))[0]


def test_cors_preflight_lifespan_and_no_key_pass() -> None:
    assert call(guard(), http("/invocations", method="OPTIONS")) == (True, [])
    assert call(guard(), {"type": "lifespan"}) == (True, [])
    assert call(guard(key=""), http("/invocations")) == (True, [])


def test_a_websocket_without_the_key_is_closed_before_the_handshake() -> None:
    scope = {"type": "websocket", "path": "/v1/realtime", "headers": []}
    reached, sent = call(guard(), scope)
    assert not reached and sent == [{"type": "websocket.close", "code": 1008}]
    scope["headers"] = [(b"authorization", f"Bearer {KEY}".encode())]
    assert call(guard(), scope) == (True, [])


def test_the_key_comes_from_vllms_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VLLM_API_KEY", KEY)
    from_env = guard(key=None)
    assert not call(from_env, http("/invocations"))[0]
    assert call(from_env, http("/invocations", authorization=f"Bearer {KEY}"))[0]
    monkeypatch.delenv("VLLM_API_KEY")
    assert call(guard(key=None), http("/invocations"))[0]
    # Only a digest of the key is kept.
    assert KEY not in repr(vars(from_env))


def test_the_plan_always_loads_the_guard() -> None:
    settings = Settings.from_environ({"HF_HOME": "/nonexistent-hf-home"})
    argv = list(plan(settings, ensure_model(settings, t4())).argv)
    assert argv[argv.index("--middleware") + 1] == apiguard.MIDDLEWARE == "t4serve.apiguard.ApiKeyGuard"
    module, _, name = apiguard.MIDDLEWARE.rpartition(".")
    assert getattr(__import__(module, fromlist=[name]), name) is ApiKeyGuard
