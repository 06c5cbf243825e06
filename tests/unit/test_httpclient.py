"""t4serve.httpclient against a local server with canned answers (tests/unit/local_http.py): status and body, the
bearer key, JSON checked as untrusted input, the size cap, the wall-clock deadline, and the local URL of a bind
address. Misbehaving servers (trickled bytes, broken protocol, redirects) are the hardening suite's."""

from __future__ import annotations

import time

import pytest
from local_http import Canned, serve

from t4serve.httpclient import Answer, HttpFailure, auth_headers, fetch, local_url


def test_status_body_and_json() -> None:
    with serve({"/v1/models": Canned(body={"data": [{"id": "gemma"}]}), "/health": Canned(status=503)}) as server:
        answer = fetch("GET", f"{server.url}/v1/models", deadline_s=5)
        assert answer.status == 200 and answer.json("the answer") == {"data": [{"id": "gemma"}]}
        assert not answer.redirect and answer.location is None
        assert fetch("GET", f"{server.url}/health", deadline_s=5).status == 503


def test_the_key_goes_as_a_bearer_header_only_when_given() -> None:
    with serve({"/v1/models": Canned(body={"data": []})}, api_key="k-123") as server:
        assert fetch("GET", f"{server.url}/v1/models", deadline_s=5).status == 401
        assert fetch("GET", f"{server.url}/v1/models", deadline_s=5, api_key="k-123").status == 200
        assert server.authorizations == [None, "Bearer k-123"]
    assert auth_headers(None) == {} and auth_headers("") == {}


def test_a_post_carries_its_json_body() -> None:
    with serve({"/v1/completions": Canned(body={"ok": True})}) as server:
        fetch("POST", f"{server.url}/v1/completions", deadline_s=5, json_body={"prompt": "hi"})
        assert server.requests == [("/v1/completions", {"prompt": "hi"})]


def test_a_body_that_is_not_json_is_an_http_failure() -> None:
    with pytest.raises(HttpFailure):
        Answer(200, b"{not json").json("the answer")
    assert Answer(200, "é".encode() * 400).text(3) == "é\ufffd"


def test_an_answer_over_the_cap_is_refused() -> None:
    with serve({"/big": Canned(body=b"x" * 5000)}) as server, pytest.raises(HttpFailure, match="5,000 bytes"):
        fetch("GET", f"{server.url}/big", deadline_s=5, max_bytes=1000)


def test_the_deadline_holds_against_a_hung_server() -> None:
    with serve({"/health": Canned(delay=3.0)}) as server:
        began = time.monotonic()
        with pytest.raises(HttpFailure):
            fetch("GET", f"{server.url}/health", deadline_s=0.5)
        assert time.monotonic() - began < 2.5


def test_a_refused_connection_is_an_http_failure() -> None:
    with serve({}) as server:
        url = server.url
    with pytest.raises(HttpFailure):
        fetch("GET", f"{url}/health", deadline_s=2)


@pytest.mark.parametrize(
    ("host", "url"),
    [
        ("0.0.0.0", "http://127.0.0.1:8000"),
        ("::", "http://127.0.0.1:8000"),
        ("", "http://127.0.0.1:8000"),
        ("::1", "http://[::1]:8000"),
        ("[::1]", "http://[::1]:8000"),
        ("gpu-box", "http://gpu-box:8000"),
    ],
)
def test_local_url(host: str, url: str) -> None:
    assert local_url(host, 8000) == url
