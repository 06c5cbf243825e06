"""The API key against vLLM 0.33's own server app, in the image: vLLM's argument parser reads the `--middleware` flag
t4serve's plan passes, vLLM's build_app registers its routes and middleware exactly as `vllm serve` does, and every
route it registers is sent a request without the key, with a wrong one and with the right one (Starlette's
TestClient, in process: no engine, no GPU). Without the key every route but t4serve.apiguard.OPEN_PATHS must answer
401; with it none may. The same app without t4serve's middleware shows the gap it closes: /invocations answers
without a key under vLLM's own guard.

The one stand-in here is vLLM's platform: with no GPU vLLM cannot infer a device type while it parses its own
arguments, so its CPU platform object takes the CUDA one's place; routes and middleware do not depend on it."""

from __future__ import annotations

import json
from typing import Any

import pytest

from t4serve.apiguard import MIDDLEWARE, OPEN_PATHS

from .conftest import RunInImage

pytestmark = pytest.mark.image

KEY = "sk-apiguard-image-0123456789"
SCRIPT = r"""
import json, os, sys
import vllm.platforms as platforms
from vllm.platforms.cpu import CpuPlatform
platforms._current_platform = CpuPlatform()
from fastapi.routing import APIRoute, APIWebSocketRoute
from starlette.testclient import TestClient
from vllm.entrypoints.common.cli_args import make_arg_parser
from vllm.entrypoints.launchers.app import build_app
from vllm.utils.argparse_utils import FlexibleArgumentParser

args = make_arg_parser(FlexibleArgumentParser()).parse_args(["--model", "google/gemma-4-E2B-it", *sys.argv[1:]])
app = build_app(args, supported_tasks=("generate",))
client = TestClient(app, raise_server_exceptions=False)
key = os.environ["VLLM_API_KEY"]
tries = {"none": {}, "wrong": {"Authorization": "Bearer sk-wrong"}, "key": {"Authorization": "Bearer " + key}}
out = {"middleware": [m.cls.__module__ + "." + m.cls.__name__ for m in app.user_middleware], "routes": []}
for route in app.routes:
    if isinstance(route, APIWebSocketRoute):
        out["routes"].append({"path": route.path, "method": "WEBSOCKET", "status": {}})
    elif isinstance(route, APIRoute):
        path = route.path.replace("{response_id}", "resp-1")
        for method in sorted(route.methods - {"HEAD"}):
            body = {} if method in ("POST", "PUT", "PATCH") else None
            status = {name: client.request(method, path, json=body, headers=h).status_code for name, h in tries.items()}
            out["routes"].append({"path": path, "method": method, "status": status})
print(json.dumps(out))
"""
Routes = list[dict[str, Any]]


def _app(run_in_image: RunInImage, *flags: str) -> tuple[list[str], Routes]:
    """vLLM's app built with these `vllm serve` flags: its middleware classes and each route's answers."""
    out = run_in_image("-c", SCRIPT, *flags, entrypoint="python3", env={"VLLM_API_KEY": KEY}, timeout=300)
    assert out.returncode == 0, f"could not build vLLM's app in the image:\n{out.stderr[-3000:]}"
    data = json.loads(out.stdout.strip().splitlines()[-1])
    return data["middleware"], data["routes"]


def test_every_route_of_vllms_app_needs_the_key(run_in_image: RunInImage) -> None:
    middleware, routes = _app(run_in_image, "--middleware", MIDDLEWARE)
    assert middleware[0] == MIDDLEWARE, f"vLLM did not load t4serve's middleware outermost: {middleware}"
    paths = {r["path"] for r in routes}
    # What makes this test meaningful: the routes vLLM's own guard leaves open are there to be sent.
    assert {"/invocations", "/generative_scoring", "/tokenize", "/v1/completions", "/health", "/metrics"} <= paths
    assert not [r for r in routes if r["method"] == "WEBSOCKET"], "a websocket route: send it a handshake here"
    open_answers, wrong = [], []
    for r in routes:
        status = r["status"]
        if r["path"] in OPEN_PATHS:
            open_answers.append((r["path"], r["method"], status["none"]))
            if status["none"] == 401:
                wrong.append(f"{r['method']} {r['path']}: 401 without a key, but it is an open path")
            continue
        if status["none"] != 401 or status["wrong"] != 401:
            wrong.append(f"{r['method']} {r['path']}: {status['none']} keyless, {status['wrong']} with a wrong key")
        if status["key"] == 401:
            wrong.append(f"{r['method']} {r['path']}: 401 with the right key")
    print(f"\n{len(routes)} route methods of vLLM's app; open: {open_answers}")
    assert wrong == []
    assert {path for path, _, _ in open_answers} == set(OPEN_PATHS)


def test_vllms_own_guard_leaves_invocations_open(run_in_image: RunInImage) -> None:
    """Why the middleware exists: with VLLM_API_KEY alone, /invocations (chat and completions) needs no key."""
    middleware, routes = _app(run_in_image)
    assert MIDDLEWARE not in middleware
    by_route = {(r["path"], r["method"]): r["status"] for r in routes}
    assert by_route[("/v1/completions", "POST")]["none"] == 401
    assert by_route[("/invocations", "POST")]["none"] != 401
    assert by_route[("/generative_scoring", "POST")]["none"] != 401
