"""The entrypoint's one HTTP client (healthcheck, canary, the wrapper's health poll, bench's lookups), on `requests`.

`fetch(method, url, deadline_s=..., api_key=...)` returns the status and at most `max_bytes` of body, or raises
`HttpFailure` with a reason that never holds the key. The deadline bounds the whole exchange on the wall clock
(connect, headers, body): a server that trickles bytes, sends a huge body, breaks the protocol or hangs cannot hold
the caller past it. Redirects are never followed (the key would go wherever they point), the environment's proxies
and .netrc are ignored (they could route or replace the key), and bodies are read undecoded (no gzip bombs).
`requests` is imported on first use, so commands that never call a server do not pay for it.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any

from t4serve.units import MIB
from t4serve.untrusted import REDACTED, Untrusted, loads_json

# /health, /v1/models and a canary completion are a few KB; a MiB is far beyond any of them.
MAX_BODY_BYTES = MIB
_CHUNK = 64 * 1024


def local_url(host: str, port: int) -> str:
    """The URL to reach a server bound to `host` from the same machine (wildcards mean loopback; IPv6 bracketed)."""
    if host in ("", "0.0.0.0", "::", "[::]"):
        host = "127.0.0.1"
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"http://{host}:{port}"


class HttpFailure(Exception):
    """No usable answer: `reason` says what happened (refused, timed out, broken protocol, too large)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class Answer:
    status: int
    body: bytes
    # Where a 3xx answer points (not followed); None otherwise.
    location: str | None = None

    def json(self, what: str) -> Any:
        """The body as JSON checked as untrusted input (depth, numbers); HttpFailure when it is not."""
        try:
            return loads_json(self.body, what)
        except Untrusted as exc:
            raise HttpFailure(exc.reason) from None

    def text(self, limit: int = 300) -> str:
        return self.body[:limit].decode("utf-8", errors="replace")

    @property
    def redirect(self) -> bool:
        return 300 <= self.status < 400


def auth_headers(api_key: str | None) -> dict[str, str]:
    """The header vLLM's API-key middleware checks (`Authorization: Bearer KEY`); none without a key."""
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def fetch(
    method: str,
    url: str,
    *,
    deadline_s: float,
    api_key: str | None = None,
    json_body: Any = None,
    max_bytes: int = MAX_BODY_BYTES,
) -> Answer:
    """One request, answered within `deadline_s` seconds of wall clock or an HttpFailure."""
    began = time.monotonic()
    outcome: list[Answer | HttpFailure] = []

    def attempt() -> None:
        try:
            outcome.append(_exchange(method, url, began + deadline_s, api_key, json_body, max_bytes))
        except HttpFailure as exc:
            outcome.append(exc)
        except Exception as exc:  # whatever a misbehaving server makes the HTTP stack raise is "no answer", not a crash
            outcome.append(HttpFailure(_describe(exc, api_key)))

    # The exchange runs in a daemon thread so that the deadline holds even where one blocking read does not return
    # (a status line trickled a byte at a time); the thread's own socket timeouts end it soon after.
    worker = threading.Thread(target=attempt, name="t4serve-http", daemon=True)
    worker.start()
    worker.join(max(0.0, deadline_s))
    if not outcome:
        raise HttpFailure(f"no complete answer within {deadline_s:g} s")
    result = outcome[0]
    if isinstance(result, HttpFailure):
        raise result
    return result


def _exchange(
    method: str, url: str, deadline: float, api_key: str | None, json_body: Any, max_bytes: int
) -> Answer:
    import requests

    def left() -> float:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise HttpFailure("the deadline passed while the answer was still arriving")
        return remaining

    headers = {"Accept-Encoding": "identity", **auth_headers(api_key)}
    with requests.Session() as session:
        session.trust_env = False
        timeout = left()
        response = session.request(
            method, url, headers=headers, json=json_body, timeout=(timeout, timeout), allow_redirects=False,
            stream=True,
        )  # fmt: skip
        with response:
            declared = response.headers.get("Content-Length", "")
            if declared.isdigit() and len(declared) < 20 and int(declared) > max_bytes:
                raise HttpFailure(f"the answer declares {int(declared):,} bytes, more than the {max_bytes:,} read")
            chunks: list[bytes] = []
            total = 0
            for chunk in response.raw.stream(_CHUNK, decode_content=False):
                total += len(chunk)
                if total > max_bytes:
                    raise HttpFailure(f"the answer is longer than the {max_bytes:,} bytes read")
                chunks.append(chunk)
                left()
            location = response.headers.get("Location") if response.is_redirect else None
            return Answer(int(response.status_code), b"".join(chunks), location)


def _describe(exc: BaseException, api_key: str | None) -> str:
    text = f"{type(exc).__name__}: {exc}"
    if len(text) > 300:
        text = text[:297] + "..."
    return text.replace(api_key, REDACTED) if api_key else text
