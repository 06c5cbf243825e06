"""The readiness canary: one fixed greedy completion that proves the model computes, not only that it is loaded.

`run_canary(base_url, model, dtype, api_key=...)` POSTs `17*23=` to /v1/completions at temperature 0 (with the bearer
key when the server has one) and judges the answer with `judge_completion`: non-empty text, finite log-probabilities,
and "391" in the text. A wrong or garbled answer on
float16 gets the fp16-overflow hint. It goes through t4serve.httpclient: a deadline over the whole request, a cap on
the answer's size, no redirects followed with the key. With T4SERVE_SPECULATIVE=mtp, `check_drafting` then reads
vLLM's /metrics: the right answer must have come with tokens the drafter drafted (a drafter that never ran would leave
the answer right and the speed unchanged).
"""

from __future__ import annotations

import json
import math
import re
import time
from dataclasses import dataclass
from typing import Any

from t4serve.gpus import BF16_MIN_CAPABILITY, format_capability
from t4serve.httpclient import HttpFailure, fetch
from t4serve.supervise.state import CanaryRecord

PROMPT = "17*23="
EXPECTED = "391"
MAX_TOKENS = 8
# The first request after start may still wait on lazily compiled kernels; a minute is generous on a T4.
TIMEOUT_S = 120.0

FP16_HINT = (
    "float16 overflow: Gemma's activations can exceed float16's range (65,504), which turns logits into NaN or "
    "garbage; this is the usual cause on Turing (no bfloat16). Use the QAT checkpoint (T4SERVE_MODEL=qat), or a GPU "
    f"with compute capability >= {format_capability(BF16_MIN_CAPABILITY)} and --dtype bfloat16"
)


@dataclass(frozen=True)
class Verdict:
    ok: bool
    text: str | None
    reason: str | None


def _finite(values: Any) -> bool:
    """True when every number in a logprobs structure is finite (NaN/inf come back from a broken forward pass)."""
    if values is None:
        return True
    if isinstance(values, bool):
        return True
    if isinstance(values, int | float):
        return math.isfinite(values)
    if isinstance(values, list):
        return all(_finite(v) for v in values)
    if isinstance(values, dict):
        return all(_finite(v) for v in values.values())
    return True


def judge_completion(body: Any) -> Verdict:
    """Judge a /v1/completions response body (already parsed JSON)."""
    if not isinstance(body, dict) or not isinstance(body.get("choices"), list) or not body["choices"]:
        return Verdict(False, None, f"the response has no choices: {json.dumps(body)[:200]}")
    choice = body["choices"][0]
    if not isinstance(choice, dict):
        return Verdict(False, None, f"the first choice is not an object: {choice!r}"[:200])
    text = choice.get("text")
    if not isinstance(text, str):
        return Verdict(False, None, f"the first choice has no text: {json.dumps(choice)[:200]}")
    logprobs = choice.get("logprobs")
    token_logprobs = logprobs.get("token_logprobs") if isinstance(logprobs, dict) else None
    if not _finite(token_logprobs):
        return Verdict(False, text, f"non-finite log-probabilities in the answer: {token_logprobs!r}"[:300])
    if isinstance(token_logprobs, list) and not token_logprobs:
        return Verdict(False, text, "empty logits: the answer carried no token log-probabilities")
    if not text.strip():
        return Verdict(False, text, f"empty answer to {PROMPT!r} (finish_reason {choice.get('finish_reason')!r})")
    if EXPECTED not in text:
        return Verdict(False, text, f"wrong answer to {PROMPT!r}: {text!r} does not contain {EXPECTED}")
    return Verdict(True, text, None)


def run_canary(
    base_url: str, model: str, dtype: str | None, *, api_key: str | None = None, timeout: float = TIMEOUT_S
) -> CanaryRecord:
    """Send the canary once; a transport failure or a bad answer is a failed record with its reason, never a raise."""
    payload = {"model": model, "prompt": PROMPT, "max_tokens": MAX_TOKENS, "temperature": 0, "logprobs": 1}
    began = time.monotonic()
    try:
        answer = fetch("POST", f"{base_url}/v1/completions", deadline_s=timeout, api_key=api_key, json_body=payload)
    except HttpFailure as exc:
        verdict = Verdict(False, None, f"/v1/completions did not answer within {timeout:g} s: {exc.reason}")
    else:
        if answer.status != 200:
            moved = f" (a redirect to {answer.location}, not followed)" if answer.redirect else ""
            verdict = Verdict(False, None, f"/v1/completions answered HTTP {answer.status}{moved}: {answer.text()}")
        else:
            try:
                verdict = judge_completion(answer.json("the answer"))
            except HttpFailure as exc:
                verdict = Verdict(False, None, f"/v1/completions answered something that is not JSON: {exc.reason}")
    hint = None
    # Garbage or NaN on float16 is the classic overflow; a transport failure is not a numerics problem.
    if not verdict.ok and verdict.text is not None and (dtype or "").lower() in ("float16", "half", "fp16"):
        hint = FP16_HINT
    return CanaryRecord(
        ok=verdict.ok,
        prompt=PROMPT,
        text=verdict.text,
        reason=verdict.reason,
        hint=hint,
        seconds=round(time.monotonic() - began, 3),
    )


# vLLM 0.34's speculative decoding counters on /metrics (vllm/v1/spec_decode/metrics.py), one sample per engine.
DRAFT_TOKENS_METRIC = "vllm:spec_decode_num_draft_tokens_total"
ACCEPTED_TOKENS_METRIC = "vllm:spec_decode_num_accepted_tokens_total"
# /metrics of one vLLM server is tens of KB; a cap well above it.
MAX_METRICS_BYTES = 4 << 20


@dataclass(frozen=True)
class Drafting:
    """What vLLM's counters say the drafter did: draft tokens proposed and accepted so far, or why not known."""

    draft_tokens: int | None
    accepted_tokens: int | None
    reason: str | None


def metric_total(text: str, name: str) -> int | None:
    """The sum of a Prometheus counter's samples (every label set) in /metrics text; None where it has none."""
    pattern = re.compile(rf"^{re.escape(name)}(?:{{[^}}\n]*}})? ([0-9.eE+-]+)$", re.MULTILINE)
    values = [float(m.group(1)) for m in pattern.finditer(text)]
    finite = [v for v in values if math.isfinite(v) and v >= 0]
    return int(sum(finite)) if finite and len(finite) == len(values) else None


def check_drafting(base_url: str, *, api_key: str | None = None, timeout: float = 10.0) -> Drafting:
    """After a right canary answer under T4SERVE_SPECULATIVE=mtp: the drafter proposed tokens for it (vLLM counts
    them from the first decode step); a failed Drafting (reason set) otherwise, never a raise."""
    try:
        answer = fetch("GET", f"{base_url}/metrics", deadline_s=timeout, api_key=api_key, max_bytes=MAX_METRICS_BYTES)
    except HttpFailure as exc:
        return Drafting(None, None, f"/metrics did not answer, so whether the drafter ran is unknown: {exc.reason}")
    if answer.status != 200:
        return Drafting(None, None, f"/metrics answered HTTP {answer.status}, so whether the drafter ran is unknown")
    text = answer.body.decode("utf-8", errors="replace")
    drafted = metric_total(text, DRAFT_TOKENS_METRIC)
    accepted = metric_total(text, ACCEPTED_TOKENS_METRIC)
    if not drafted:
        return Drafting(drafted, accepted, (
            f"T4SERVE_SPECULATIVE=mtp, yet vLLM drafted no tokens for the canary ({DRAFT_TOKENS_METRIC} "
            f"{'absent' if drafted is None else 0} on /metrics): the drafter is not running"))
    return Drafting(drafted, accepted, None)
