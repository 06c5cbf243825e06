"""What runs on this GPU and host, and what does not and why: checkpoint x KV cache dtype x max model length.

`profiles(cases)` plans each case with `planning.plan.plan` itself (the settings with T4SERVE_KV_CACHE_DTYPE and
T4SERVE_MAX_MODEL_LEN replaced), so every figure of a profile is the plan's own: runnable or the plan's refusal,
KV tokens, concurrency, max_num_seqs, weight memory, the host memory a load needs and the swap to add, the decode
ceiling. `t4serve profiles` and the MCP tool `profiles` print it. Pure: settings and facts in.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from t4serve.config.settings import KV_CACHE_DTYPES, Settings
from t4serve.facts import Facts
from t4serve.planning.derived import format_bytes
from t4serve.planning.plan import Plan, plan, refuse_unreadable_model
from t4serve.planning.sizing import derived_max_model_len
from t4serve.serde import to_dict

# The lengths asked of every checkpoint: 4k, the published 16k, 32k; the model's own maximum is added to them.
PROFILE_LENGTHS = (4096, 16384, 32768)


@dataclass(frozen=True)
class Profile:
    """One checkpoint at one KV cache dtype and max model length, as the plan has it."""

    checkpoint: str
    kv_cache_dtype: str
    max_model_len: int
    runnable: bool
    # The plan's refusal (vLLM's words where it is vLLM's), else None.
    reason: str | None
    kv_tokens: int | None
    concurrency: float | None
    max_num_seqs: int | None
    gpu_weights_bytes: int | None
    host_memory_need_bytes: int | None
    swap_to_add_bytes: int | None
    decode_ceiling_tokens_per_s: float | None
    # The `vllm serve` command line the plan would run (None where it refuses).
    command_line: str | None
    # The attention path the plan chose (T4SERVE_ATTENTION resolved), with its reason.
    attention: str = ""
    # T4SERVE_SPECULATIVE as the plan resolved it: off, or the method, the drafter and the tokens per step.
    speculative: str = "off"


def model_lengths(facts: Facts) -> tuple[int, ...]:
    """PROFILE_LENGTHS up to the model's maximum, and the maximum itself (vLLM's derivation), in order."""
    text = facts.model.config.get("text") if facts.model is not None else None
    maximum = derived_max_model_len(text)[0] if isinstance(text, dict) else None
    if maximum is None:
        return PROFILE_LENGTHS
    return tuple(sorted({n for n in PROFILE_LENGTHS if n <= maximum} | {maximum}))


def profile_of(the_plan: Plan, checkpoint: str, kv_cache_dtype: str, length: int) -> Profile:
    s = the_plan.sizing
    if s is None:
        return Profile(checkpoint, kv_cache_dtype, length, False, the_plan.sizing_error, None, None, None, None, None,
                       None, None, None, attention_of(the_plan), the_plan.speculative)
    ceiling = s.decode_ceiling_tokens_per_s
    return Profile(
        checkpoint=checkpoint,
        kv_cache_dtype=kv_cache_dtype,
        max_model_len=length,
        runnable=True,
        reason=None,
        kv_tokens=int(s.kv_tokens.value),
        concurrency=float(s.concurrency.value),
        max_num_seqs=int(s.max_num_seqs.value),
        gpu_weights_bytes=int(s.gpu_weights_bytes.value),
        host_memory_need_bytes=int(s.host_memory_need_bytes.value),
        swap_to_add_bytes=int(s.swap_to_add_bytes.value),
        decode_ceiling_tokens_per_s=float(ceiling.value) if ceiling is not None else None,
        command_line=the_plan.command_line(),
        attention=attention_of(the_plan),
        speculative=the_plan.speculative,
    )


def attention_of(the_plan: Plan) -> str:
    return f"{the_plan.attention.label}: {the_plan.attention.reason}"


def profiles(cases: Sequence[tuple[Settings, Facts]]) -> list[Profile]:
    """Each (settings for a checkpoint, facts with that checkpoint probed) at every KV cache dtype and length. A
    checkpoint that cannot be read is refused as `plan` refuses it (a ConfigError), not listed as a profile."""
    for settings, facts in cases:
        refuse_unreadable_model(settings, facts.model)
    out = []
    for settings, facts in cases:
        checkpoint = settings.model.requested
        for length in model_lengths(facts):
            for kv_dtype in KV_CACHE_DTYPES:
                chosen = dataclasses.replace(settings, kv_cache_dtype=kv_dtype, max_model_len=length)
                out.append(profile_of(plan(chosen, facts), checkpoint, kv_dtype, length))
    return out


def to_json(rows: Sequence[Profile], gpu: str) -> str:
    data: dict[str, Any] = {"gpu": gpu, "profiles": [to_dict(r) for r in rows]}
    return json.dumps(data, indent=2) + "\n"


def _figure(value: float | int | None, unit: str = "") -> str:
    if value is None:
        return "-"
    if unit == "B":
        return format_bytes(int(value))
    return f"{value:,.2f}{unit}" if isinstance(value, float) else f"{value:,}{unit}"


def summary(rows: Sequence[Profile], gpu: str) -> str:
    """A table: one line per profile, the refusals' reasons below it."""
    head = (f"{'checkpoint':<12} {'kv dtype':<8} {'max len':>8} {'runs':<4} {'KV tokens':>10} {'concur.':>8} "
            f"{'seqs':>5} {'weights':>10} {'host need':>10} {'add swap':>9} {'decode tok/s':>12} {'attention':<10} "
            f"{'spec':<5}")
    lines = [f"profiles for {gpu}: every figure is `t4serve plan`'s for that checkpoint, KV cache dtype and length",
             "", head]
    drafted = sorted({r.speculative for r in rows if r.speculative != "off" and r.runnable})
    if drafted:
        # Weights and host need include the drafter (T4SERVE_SPECULATIVE), whose KV cache is the model's own.
        lines[1:1] = [f"speculative decoding {d}" for d in drafted]
    reasons: dict[str, list[str]] = {}
    for r in rows:
        name = r.checkpoint if len(r.checkpoint) <= 12 else "..." + r.checkpoint[-9:]
        lines.append(
            f"{name:<12} {r.kv_cache_dtype:<8} {r.max_model_len:>8,} {'yes' if r.runnable else 'no':<4} "
            f"{_figure(r.kv_tokens):>10} {_figure(r.concurrency, 'x'):>8} {_figure(r.max_num_seqs):>5} "
            f"{_figure(r.gpu_weights_bytes, 'B'):>10} {_figure(r.host_memory_need_bytes, 'B'):>10} "
            f"{_figure(r.swap_to_add_bytes, 'B'):>9} {_figure(r.decode_ceiling_tokens_per_s):>12} "
            f"{r.attention.split(':')[0]:<10} {r.speculative.split(':')[0]:<5}")
        if r.reason is not None:
            reasons.setdefault(r.reason, []).append(f"{r.checkpoint} {r.kv_cache_dtype} {r.max_model_len:,}")
    if reasons:
        lines += ["", "not runnable, and why:"]
        for reason, which in reasons.items():
            lines.append(f"- {'; '.join(which)}:")
            lines += [f"    {line}" for line in reason.splitlines()]
    return "\n".join(lines)
