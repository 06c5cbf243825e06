"""A tiny HTTP server on 127.0.0.1 with canned answers per path, for the canary, healthcheck and wrapper tests.

It stands in for vLLM's HTTP API only where a test needs exact bodies (NaN log-probabilities, a missing model); the
stand-in server (tests/standin) plays the whole of vLLM in the image tests. With `api_key`, /v1/* answers 401
{"error": "Unauthorized"} unless the request carries `Authorization: Bearer KEY`, as vLLM's middleware does.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Canned:
    status: int = 200
    body: Any = None
    # Seconds to wait before answering (a hung server).
    delay: float = 0.0
    # Extra response headers (a redirect's Location).
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class LocalServer:
    port: int
    routes: dict[str, Canned]
    requests: list[tuple[str, Any]] = field(default_factory=list)
    # The Authorization header of each request, in order (None when absent).
    authorizations: list[str | None] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@contextmanager
def serve(routes: dict[str, Canned], api_key: str | None = None) -> Iterator[LocalServer]:
    state = LocalServer(0, routes)
    unauthorized = Canned(status=401, body={"error": "Unauthorized"})

    class Handler(BaseHTTPRequestHandler):
        def _answer(self, payload: Any) -> None:
            state.requests.append((self.path, payload))
            authorization = self.headers.get("Authorization")
            state.authorizations.append(authorization)
            canned = state.routes.get(self.path)
            if api_key is not None and self.path.startswith("/v1") and authorization != f"Bearer {api_key}":
                canned = unauthorized
            if canned is None:
                self.send_error(404)
                return
            time.sleep(canned.delay)
            body = canned.body
            raw = b"" if body is None else body if isinstance(body, bytes) else json.dumps(body).encode()
            try:
                self.send_response(canned.status)
                self.send_header("Content-Length", str(len(raw)))
                for name, value in canned.headers.items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(raw)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client gave up first: exactly what the timeout tests do

        def do_GET(self) -> None:
            self._answer(None)

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length", "0"))
            self._answer(json.loads(self.rfile.read(length) or b"null"))

        def log_message(self, format: str, *args: Any) -> None:
            return

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    state.port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()
