"""The API key on every route of vLLM's server: an ASGI middleware vLLM loads with
`--middleware t4serve.apiguard.ApiKeyGuard` (t4serve's plan always passes it).

vLLM 0.33's own guard (VLLM_API_KEY or --api-key; vllm/entrypoints/serve/middleware/authenticate.py) asks for the
key only on paths under /v1, /v2, /inference and /cohere. The same server answers other routes without it:
/invocations (SageMaker's router, which runs completions and chat), /generative_scoring, /scale_elastic_ep,
/tokenize, /detokenize, /load, the OpenAPI docs. ApiKeyGuard turns the rule around: every path needs the key except
the few that only report health, metrics and the version (OPEN_PATHS, compared exactly), so a route a later vLLM adds
is guarded from its first release. It reads the key where t4serve puts it for vLLM (VLLM_API_KEY); without a key it
passes everything through, as vLLM does. CORS preflights (OPTIONS) pass, as in vLLM's guard: they carry no key and
run nothing.

Pure ASGI and the standard library only: vLLM imports it in its API server process (the image's venv, where t4serve
is installed), and the stand-in server of the tests drives the same class.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]

# What `t4serve plan` puts on vLLM's command line.
MIDDLEWARE = "t4serve.apiguard.ApiKeyGuard"
# Paths answered without the key: liveness and readiness (/health; /ping is SageMaker's name for it), Prometheus'
# scrape (/metrics) and the version. Nothing here runs the model or changes the server.
OPEN_PATHS = frozenset({"/health", "/ping", "/metrics", "/version"})
KEY_VARIABLE = "VLLM_API_KEY"
UNAUTHORIZED = json.dumps({"error": "Unauthorized"}).encode()


def _digest(text: str) -> bytes:
    return hashlib.sha256(text.encode("utf-8")).digest()


class ApiKeyGuard:
    """`Authorization: Bearer KEY` on every path but OPEN_PATHS, else 401 {"error": "Unauthorized"} (vLLM's answer)."""

    def __init__(self, app: App, key: str | None = None) -> None:
        self.app = app
        value = os.environ.get(KEY_VARIABLE, "") if key is None else key
        # Only the key's digest is kept, compared in constant time (as vLLM's own guard does).
        self.key_digest = _digest(value) if value else None

    def allows(self, path: str, method: str | None, authorization: str | None) -> bool:
        """Whether a request may pass: no key configured, an open path, a CORS preflight, or the right bearer key."""
        if self.key_digest is None or method == "OPTIONS" or path in OPEN_PATHS:
            return True
        scheme, _, param = (authorization or "").partition(" ")
        return scheme.lower() == "bearer" and secrets.compare_digest(_digest(param), self.key_digest)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            # lifespan: nothing to guard.
            await self.app(scope, receive, send)
            return
        root_path = scope.get("root_path", "") or ""
        path = str(scope.get("path", "")).removeprefix(root_path) or "/"
        authorization = None
        for name, value in scope.get("headers", []):
            if bytes(name).lower() == b"authorization":
                authorization = bytes(value).decode("latin-1")
                break
        if self.allows(path, scope.get("method"), authorization):
            await self.app(scope, receive, send)
            return
        if scope["type"] == "websocket":
            # Closing before accepting: the server answers the handshake with 403.
            await send({"type": "websocket.close", "code": 1008})
            return
        await send({
            "type": "http.response.start",
            "status": 401,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(UNAUTHORIZED)).encode())],
        })  # fmt: skip
        await send({"type": "http.response.body", "body": UNAUTHORIZED})
