"""A T4 model of Gemma 4 E2B QAT's single-stream decode with its MTP drafter: tokens per second against vLLM's draft
acceptance rate. No T4 ran it: every figure here is modelled from the inputs named below, with --measured on the step
costs an H100 measured (docs/verified/gpu-host-vllm-0.34.0-served/mtp.json).

    python3 tests/gpu/mtp_t4_model.py [--json] [--measured MTP_JSON]

With --measured, the model on a GPU host's measured step costs at one stream (tests/gpu/mtp_host.py's mtp.json,
steptiming's medians over its bench): see measured_model. Without it, the model below, on paper.

The model, per engine step at one stream with k drafted tokens (vLLM's MTP: one verify, then k drafter forwards):
1. tokens a step = 1 + k x r, where r is vLLM's acceptance rate (accepted / drafted tokens, what
   vllm:spec_decode_num_accepted_tokens_total / ..._draft_tokens_total give), whatever its spread over positions.
2. the verify, a target forward over k + 1 tokens of one sequence, costs what the published T4 run's steps cost at
   that many tokens: its QAT time per output token at 1 stream (one token a step) and at 4 streams (four), joined
   by a line. Four streams also read four contexts' KV where one verify reads one: an overestimate of the verify.
3. a drafter forward reads its weights but the token embedding (its centroid head reads 2,048 centroids and the 4,096
   embedding rows of the 32 chosen centroids), and the target's KV it attends (3 sliding layers reading layer 13's
   window, one full layer reading layer 14's context), at the bandwidth the published QAT step reached (its bytes per
   token over its time: the same efficiency). Launch overhead is not in it: DRAFT_SCALES reads the draft at 1x, 2x
   and 4x that.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()
sys.path[:0] = [str(HERE.parents[1] / "unit"), str(HERE.parents[2] / "entrypoint")]

# docs/published-t4-run.md, the QAT sweep at 512 input tokens: per-stream tokens/s = 1000 / median TPOT.
PUBLISHED_PER_STREAM = {1: 72.31, 4: 54.50}
# The T4's measured streaming read (docs/published-t4-run.md), what t4serve's roofline divides by.
T4_BANDWIDTH = 277.0e9
CONTEXT = 512 + 64  # the published run's 512-token prompts, a little way into the answer
NUM_SPECULATIVE_TOKENS = 2  # vLLM's recipe for E2B's drafter
ACCEPTANCE_RATES = (0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
# The nearest published figure found: Gemma 4 E4B with its MTP drafter in vLLM (nightly of 2026-05-07, the day after
# PR #41745), 77.3 % acceptance over three runs on an RTX 5090M (airelien.dev, "Gemma 4 E4B MTP on the RTX 5090M").
# No acceptance rate for E2B's drafter was found published, by Google or in vLLM's recipes.
PUBLISHED_ACCEPTANCE = (0.773, "Gemma 4 E4B's drafter in vLLM, RTX 5090M, airelien.dev (2026-05); none found for E2B")
DRAFT_SCALES = (1.0, 2.0, 4.0)
GOAL_TOKENS_PER_S = 110.0


def step_ms(tokens: int) -> float:
    """A published T4 QAT decode step over `tokens` tokens: the 1- and 4-stream steps, joined by a line."""
    one, four = 1000.0 / PUBLISHED_PER_STREAM[1], 1000.0 / PUBLISHED_PER_STREAM[4]
    return one + (tokens - 1) * (four - one) / 3


def _bytes_per_token(repo: str, context: int) -> float:
    """What one decode step of `repo` reads (t4serve's roofline on the model's built-in facts)."""
    from t4serve.planning.roofline import roofline
    from t4serve.probes.checkpoint import builtin_facts

    facts = builtin_facts(repo, "the model's built-in facts")
    assert facts is not None
    return float(roofline(facts, context=context, dtype_bytes=2, bandwidth_bytes_per_s=None).bytes_per_token.value)


def qat_bytes_per_token(context: int = CONTEXT) -> float:
    """What one QAT decode step reads (the published T4 run's model)."""
    return _bytes_per_token("google/gemma-4-E2B-it-qat-w4a16-ct", context)


def bf16_bytes_per_token(context: int = CONTEXT) -> float:
    """What one bf16 E2B decode step reads (the GPU host's servers run the bf16 checkpoint's shapes)."""
    return _bytes_per_token("google/gemma-4-E2B-it", context)


def published_bandwidth() -> float:
    """Bytes per second the published T4 QAT step reached: its bytes a token over its single-stream step."""
    return qat_bytes_per_token() / (step_ms(1) / 1000.0)


def drafter_bytes_per_forward(context: int = CONTEXT) -> dict[str, float]:
    """Bytes one drafter forward reads: its weights but the token embedding, the embedding rows and centroids its
    centroid head reads, and the target's KV its layers attend (float16)."""
    from e2b_checkpoint import ASSISTANT_CONFIG, assistant_tensors  # type: ignore[import-not-found]

    sizes = {"BF16": 2, "I64": 8}
    weights = 0
    for name, dtype, shape in assistant_tensors():
        if name in ("model.embed_tokens.weight", "masked_embedding.token_ordering"):
            continue
        count = 1
        for n in shape:
            count *= n
        weights += count * sizes[dtype]
    text = ASSISTANT_CONFIG["text_config"]
    hidden, vocab, centroids = text["hidden_size"], text["vocab_size"], ASSISTANT_CONFIG["num_centroids"]
    rows = ASSISTANT_CONFIG["centroid_intermediate_top_k"] * (vocab // centroids)
    head = rows * hidden * 2 + rows * 8  # the chosen rows and their ids in the token ordering
    window = min(context, text["sliding_window"])
    # E2B's KV per token: one KV head, K and V, float16: 256 wide in sliding layers, 512 in full ones.
    kv = 3 * window * 2 * 256 * 2 + context * 2 * 512 * 2
    return {"weights": float(weights), "head_rows": float(head), "kv": float(kv), "total": float(weights + head + kv)}


def model(rates: tuple[float, ...] = ACCEPTANCE_RATES, k: int = NUM_SPECULATIVE_TOKENS) -> dict[str, Any]:
    plain = step_ms(1)
    qat_bytes = qat_bytes_per_token()
    efficiency_bandwidth = published_bandwidth()
    draft = drafter_bytes_per_forward()
    draft_ms = draft["total"] / efficiency_bandwidth * 1000.0
    verify = step_ms(k + 1)
    rows = []
    for r in (*rates, PUBLISHED_ACCEPTANCE[0]):
        tokens = 1 + k * r
        rows.append({"acceptance_rate": r, "tokens_per_step": round(tokens, 3),
                     **{f"tok_s_draft_x{s:g}": round(tokens / ((verify + k * s * draft_ms) / 1000.0), 1)
                        for s in DRAFT_SCALES}})
    return {
        "inputs": {
            "published_step_ms_1_stream": round(plain, 3), "published_step_ms_4_streams": round(step_ms(4), 3),
            "published_tok_s_1_stream": PUBLISHED_PER_STREAM[1],
            "qat_bytes_per_token": round(qat_bytes), "effective_bandwidth_gb_s":
                round(efficiency_bandwidth / 1e9, 1), "t4_bandwidth_gb_s": T4_BANDWIDTH / 1e9,
            "drafter_bytes_per_forward": {k2: round(v) for k2, v in draft.items()},
            "num_speculative_tokens": k, "context": CONTEXT,
            "published_acceptance": {"rate": PUBLISHED_ACCEPTANCE[0], "source": PUBLISHED_ACCEPTANCE[1]},
        },
        "verify_ms": round(verify, 3), "draft_ms_per_forward": round(draft_ms, 4),
        "step_ms_draft_x1": round(verify + k * draft_ms, 3), "rows": rows, "goal_tok_s": GOAL_TOKENS_PER_S,
    }


def host_step_costs(record: dict[str, Any], requests: str = "1") -> dict[str, float]:
    """From tests/gpu/mtp_host.py's mtp.json: the GPU host's median decode step without MTP and, with it, its verify
    and its draft (all k drafter forwards), at `requests` streams, over the bench's window (`step_times`)."""
    try:
        ref, mtp = record["pair"]
        times = record["step_times"]
        plain = times[ref][requests]["step_ms"]["median"]
        verify = times[mtp][requests]["verify_ms"]["median"]
        draft = times[mtp][requests]["draft_ms"]["median"]
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"the record has no decode step times of its pair at {requests} stream(s) "
                         f"(missing: {exc})") from exc
    return {"plain_ms": float(plain), "verify_ms": float(verify), "draft_ms": float(draft)}


def measured_model(record: dict[str, Any], rates: tuple[float, ...] = ACCEPTANCE_RATES,
                   k: int = NUM_SPECULATIVE_TOKENS) -> dict[str, Any]:
    """The model on the GPU host's measured step costs at one stream, carried to the T4 by bytes:
    - the draft (k drafter forwards) splits into what its bytes cost at the host's achieved bandwidth (a plain bf16
      step's bytes over its time) and the rest, a fixed overhead (launches, small kernels, the proposer's own work);
      on the T4 the bytes take the published QAT step's achieved bandwidth and the overhead is read at 1x, 2x and 4x
      the host's (DRAFT_SCALES: a T4 and its host CPU run small kernels and launches slower, by how much unmeasured);
    - the verify (one target forward over k + 1 tokens) is the published steps' line at k + 1 tokens, the larger and
      so the conservative of two readings; the other, the published single-stream step x the host's verify/plain
      ratio, is given beside it (`optimistic`: the T4 computes k + 1 tokens slower than the host, by an unmeasured
      amount)."""
    host = host_step_costs(record)
    t4_plain = step_ms(1)
    host_bandwidth = bf16_bytes_per_token() / (host["plain_ms"] / 1000.0)
    t4_bandwidth = published_bandwidth()
    draft_bytes = k * drafter_bytes_per_forward()["total"]
    overhead = max(host["draft_ms"] - draft_bytes / host_bandwidth * 1000.0, 0.0)
    t4_draft_bytes_ms = draft_bytes / t4_bandwidth * 1000.0
    verify = step_ms(k + 1)
    optimistic_verify = t4_plain * host["verify_ms"] / host["plain_ms"]

    def step(scale: float, verify_ms: float = verify) -> float:
        return verify_ms + t4_draft_bytes_ms + scale * overhead

    rows = []
    for r in (*rates, PUBLISHED_ACCEPTANCE[0]):
        tokens = 1 + k * r
        rows.append({"acceptance_rate": r, "tokens_per_step": round(tokens, 3),
                     **{f"tok_s_overhead_x{s:g}": round(tokens / (step(s) / 1000.0), 1) for s in DRAFT_SCALES},
                     "tok_s_optimistic": round(tokens / (step(1.0, optimistic_verify) / 1000.0), 1)})
    return {"host": {**{key: round(v, 4) for key, v in host.items()}, "pair": record["pair"],
                     "vllm": record.get("vllm"), "achieved_bandwidth_gb_s": round(host_bandwidth / 1e9, 1)},
            "t4_plain_ms": round(t4_plain, 3), "t4_achieved_bandwidth_gb_s": round(t4_bandwidth / 1e9, 1),
            "draft_bytes": round(draft_bytes), "draft_overhead_ms_host": round(overhead, 4),
            "draft_ms_t4_bytes": round(t4_draft_bytes_ms, 4), "verify_ms": round(verify, 3),
            "verify_ms_optimistic": round(optimistic_verify, 3),
            **{f"step_ms_overhead_x{s:g}": round(step(s), 3) for s in DRAFT_SCALES},
            "break_even_acceptance": {f"overhead_x{s:g}": round((step(s) / t4_plain - 1) / k, 3)
                                      for s in DRAFT_SCALES},
            "acceptance_for_goal": {f"overhead_x{s:g}": round((GOAL_TOKENS_PER_S * step(s) / 1000.0 - 1) / k, 3)
                                    for s in DRAFT_SCALES},
            "rows": rows, "goal_tok_s": GOAL_TOKENS_PER_S}


def _table(rows: list[dict[str, Any]], columns: list[tuple[str, str]]) -> str:
    """A markdown table of the rows: acceptance rate, tokens a step, then each (header, key) column; the last row is
    the published acceptance rate's."""
    lines = ["| acceptance rate | tokens a step | " + " | ".join(h for h, _ in columns) + " |",
             "|" + "---|" * (2 + len(columns))]
    for row in rows:
        label = f"{row['acceptance_rate']:.3g}" + (" (published, E4B)" if row is rows[-1] else "")
        lines.append(f"| {label} | {row['tokens_per_step']} | " + " | ".join(str(row[k]) for _, k in columns) + " |")
    return "\n".join(lines)


def measured_table(result: dict[str, Any]) -> str:
    return _table(result["rows"], [(f"tok/s, overhead x{s:g}", f"tok_s_overhead_x{s:g}") for s in DRAFT_SCALES]
                  + [("tok/s, optimistic verify", "tok_s_optimistic")])


def table(result: dict[str, Any]) -> str:
    return _table(result["rows"], [(f"tok/s, draft x{s:g}", f"tok_s_draft_x{s:g}") for s in DRAFT_SCALES])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--measured", type=Path, metavar="MTP_JSON",
                        help="tests/gpu/mtp_host.py's record: the model on its measured step costs")
    args = parser.parse_args(argv)
    if args.measured:
        try:
            measured = measured_model(json.loads(args.measured.read_text()))
        except (OSError, ValueError) as exc:
            print(f"mtp_t4_model: {args.measured}: {exc}", file=sys.stderr)
            return 2
        if args.json:
            print(json.dumps(measured, indent=1))
        else:
            print(json.dumps({k: v for k, v in measured.items() if k != "rows"}, indent=1))
            print(measured_table(measured))
        return 0
    result = model()
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        print(json.dumps(result["inputs"], indent=1))
        print(f"verify {result['verify_ms']} ms, a drafter forward {result['draft_ms_per_forward']} ms, "
              f"a step {result['step_ms_draft_x1']} ms (draft x1)")
        print(table(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
