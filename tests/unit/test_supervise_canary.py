"""canary: the answer is judged (empty, NaN, wrong, right) and a float16 failure carries the overflow hint."""

from __future__ import annotations

import math

import pytest
from local_http import Canned, serve

from t4serve.supervise.canary import (
    DRAFT_TOKENS_METRIC,
    EXPECTED,
    FP16_HINT,
    PROMPT,
    Drafting,
    check_drafting,
    judge_completion,
    metric_total,
    run_canary,
)


def completion(text: str, logprobs: list[float] | None = None) -> dict[str, object]:
    choice: dict[str, object] = {"index": 0, "text": text, "finish_reason": "length"}
    if logprobs is not None:
        choice["logprobs"] = {"tokens": list(text), "token_logprobs": logprobs}
    return {"id": "cmpl-1", "object": "text_completion", "choices": [choice]}


def test_right_answer_passes() -> None:
    verdict = judge_completion(completion("391\n\n17*", [-0.01, -0.2, -0.3]))
    assert verdict.ok and verdict.reason is None


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (completion(""), "empty answer"),
        (completion("   "), "empty answer"),
        (completion("<pad><pad><pad>", [0.0, 0.0, 0.0]), "wrong answer"),
        (completion("391", [math.nan]), "non-finite"),
        (completion("391", [-math.inf]), "non-finite"),
        (completion("391", []), "empty logits"),
        ({"choices": []}, "no choices"),
        ({"object": "error", "message": "boom"}, "no choices"),
        ({"choices": [{"index": 0}]}, "no text"),
    ],
)
def test_bad_answers_fail_with_reason(body: object, reason: str) -> None:
    verdict = judge_completion(body)
    assert not verdict.ok and verdict.reason is not None and reason in verdict.reason


def test_run_canary_sends_a_greedy_fixed_request() -> None:
    with serve({"/v1/completions": Canned(body=completion(" 391"))}) as server:
        record = run_canary(server.url, "gemma", "float16")
    assert record.ok and record.text == " 391" and record.hint is None
    [(path, payload)] = server.requests
    assert path == "/v1/completions"
    assert payload["prompt"] == PROMPT and payload["temperature"] == 0 and payload["model"] == "gemma"
    assert 0 < payload["max_tokens"] <= 16
    assert EXPECTED == "391"


def test_run_canary_sends_the_api_key_as_a_bearer_token() -> None:
    with serve({"/v1/completions": Canned(body=completion(" 391"))}, api_key="sk-canary") as server:
        keyed = run_canary(server.url, "gemma", "float16", api_key="sk-canary")
        keyless = run_canary(server.url, "gemma", "float16")
    assert keyed.ok, keyed.reason
    assert server.authorizations == ["Bearer sk-canary", None]
    assert not keyless.ok and keyless.reason is not None
    assert "HTTP 401" in keyless.reason and "Unauthorized" in keyless.reason and keyless.hint is None


def test_garbage_on_float16_gets_the_overflow_hint() -> None:
    with serve({"/v1/completions": Canned(body=completion("<pad><pad>"))}) as server:
        fp16 = run_canary(server.url, "gemma", "float16")
        bf16 = run_canary(server.url, "gemma", "bfloat16")
    assert not fp16.ok and fp16.hint == FP16_HINT
    assert not bf16.ok and bf16.hint is None


def test_http_error_and_no_server_are_failures_without_numerics_hint() -> None:
    with serve({"/v1/completions": Canned(status=404, body={"message": "model gemma does not exist"})}) as server:
        record = run_canary(server.url, "gemma", "float16")
    assert not record.ok and "HTTP 404" in (record.reason or "") and record.hint is None
    closed = run_canary(f"http://127.0.0.1:{server.port}", "gemma", "float16", timeout=1.0)
    assert not closed.ok and "did not answer" in (closed.reason or "")


def test_timeout_is_reported() -> None:
    with serve({"/v1/completions": Canned(body=completion("391"), delay=1.5)}) as server:
        record = run_canary(server.url, "gemma", None, timeout=0.3)
    assert not record.ok and "did not answer within 0.3 s" in (record.reason or "")


METRICS = (b"# TYPE vllm:spec_decode_num_draft_tokens counter\n"
           b'vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="gemma"} 12.0\n'
           b"# TYPE vllm:spec_decode_num_accepted_tokens counter\n"
           b'vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="gemma"} 7.0\n'
           b'vllm:generation_tokens_total{engine="0",model_name="gemma"} 9.0\n')


def test_drafting_passes_when_vllm_counted_draft_tokens() -> None:
    with serve({"/metrics": Canned(body=METRICS)}) as server:
        drafting = check_drafting(server.url)
    assert drafting == Drafting(12, 7, None)


@pytest.mark.parametrize(("body", "status", "words"), [
    (METRICS.replace(b"} 12.0", b"} 0.0"), 200, f"{DRAFT_TOKENS_METRIC} 0 on /metrics"),
    (b'vllm:generation_tokens_total{engine="0"} 9.0\n', 200, f"{DRAFT_TOKENS_METRIC} absent"),
    (METRICS.replace(b"} 12.0", b"} NaN"), 200, f"{DRAFT_TOKENS_METRIC} absent"),
    (b"", 500, "HTTP 500"),
])
def test_no_draft_tokens_fail_the_canary_with_the_reason(body: bytes, status: int, words: str) -> None:
    with serve({"/metrics": Canned(status=status, body=body)}) as server:
        drafting = check_drafting(server.url)
    assert drafting.reason is not None and words in drafting.reason


def test_metric_totals_add_every_label_set() -> None:
    text = (f'{DRAFT_TOKENS_METRIC}{{engine="0"}} 3.0\n{DRAFT_TOKENS_METRIC}{{engine="1"}} 4.0\n'
            f"{DRAFT_TOKENS_METRIC}_created 1.7e9\n{DRAFT_TOKENS_METRIC} 1\n")
    assert metric_total(text, DRAFT_TOKENS_METRIC) == 8
    assert metric_total(text, "vllm:spec_decode_num_drafts_total") is None
