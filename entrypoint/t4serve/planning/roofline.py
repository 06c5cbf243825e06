"""The decode bandwidth ceiling: bytes one decode step reads per token, from the safetensors headers, and tokens/s.

Read per token: the text decoder's linears and norms, the per-layer-embedding projections and the output layer (an
untied lm_head, else the tied embedding). Not read: the per-layer-embedding table and an untied model's embedding (one
row lookup each), the idle vision and audio towers, and the K/V weights of KV-shared layers that vLLM drops (shown
apart: published-t4-run.md's published 4.597 GB counts them).
"""

from __future__ import annotations

from dataclasses import dataclass

from t4serve.errors import ConfigError
from t4serve.facts import ModelFacts
from t4serve.gpus import KnownGpu
from t4serve.planning.derived import Derived
from t4serve.planning.kvcache import kv_cache_specs
from t4serve.probes.checkpoint import (
    PART_EMBEDDING,
    PART_KV_SHARED_DROPPED,
    PART_OUTPUT_LAYER,
    PART_PER_LAYER_EMBEDDING,
    PART_PER_LAYER_PROJECTION,
    PART_TEXT_DECODER,
)
from t4serve.units import GB


@dataclass(frozen=True)
class Roofline:
    weights_read_bytes: Derived
    dropped_kv_weights_bytes: Derived
    not_read_bytes: Derived
    kv_read_bytes: Derived
    bytes_per_token: Derived
    ceiling_tokens_per_s: Derived | None


def part_bytes(model: ModelFacts, part: str) -> int:
    return sum(g.total_bytes for g in model.weights if g.part == part)


def read_parts(model: ModelFacts) -> tuple[str, ...]:
    """The parts a decode step reads in full: with an untied lm_head the embedding is only a row lookup."""
    output = PART_OUTPUT_LAYER if part_bytes(model, PART_OUTPUT_LAYER) else PART_EMBEDDING
    return (PART_TEXT_DECODER, PART_PER_LAYER_PROJECTION, output)


def kv_read_bytes(model: ModelFacts, context: int, dtype_bytes: int) -> tuple[int, str]:
    """K/V bytes one decode step reads for one sequence at `context` tokens: each owning layer's cache in its window."""
    specs = kv_cache_specs(model.config.get("text", {}), dtype_bytes)
    total = 0
    terms = []
    for s in specs:
        tokens = min(context, s.sliding_window) if s.sliding_window else context
        total += tokens * s.bytes_per_token
        terms.append((s.kind, tokens, s.bytes_per_token))
    sliding = [t for t in terms if t[0] == "sliding"]
    full = [t for t in terms if t[0] == "full"]
    how = " + ".join(
        f"{len(ts)} {ts[0][0]} layers x {ts[0][1]:,} tokens x {ts[0][2]:,} B" for ts in (sliding, full) if ts
    )
    return total, how or "no KV cache layers"


def roofline(model: ModelFacts, *, context: int, dtype_bytes: int, bandwidth_bytes_per_s: float | None,
             bandwidth_how: str = "") -> Roofline:
    if not model.weights:
        raise ConfigError(
            "the bandwidth ceiling needs the checkpoint's safetensors headers",
            found=f"{model.requested}: source {model.source}, {model.error or 'no tensors'}",
            required="a local checkpoint, a reachable Hugging Face hub, or one of the aliases qat / bf16",
            fix="download the model (huggingface-cli download REPO) or pass a local directory",
        )
    read = {p: part_bytes(model, p) for p in read_parts(model)}
    weights = sum(read.values())
    dropped = part_bytes(model, PART_KV_SHARED_DROPPED)
    not_read = model.weight_bytes - weights - dropped
    lookups = f"{part_bytes(model, PART_PER_LAYER_EMBEDDING) / GB:.3f} GB per-layer-embedding table"
    if PART_EMBEDDING not in read:
        lookups += f" + {part_bytes(model, PART_EMBEDDING) / GB:.3f} GB token embedding (untied from the output layer)"
    kv, kv_how = kv_read_bytes(model, context, dtype_bytes)
    per_token = weights + kv
    read_how = " + ".join(f"{p} {v / GB:.3f} GB" for p, v in read.items() if v)
    ceiling = None
    if bandwidth_bytes_per_s:
        ceiling = Derived(
            bandwidth_bytes_per_s / per_token, "tok/s",
            f"{bandwidth_bytes_per_s / GB:.1f} GB/s{bandwidth_how} / {per_token / GB:.3f} GB per token "
            "(one sequence; an upper bound, compute and launch overhead ignored)",
        )
    return Roofline(
        weights_read_bytes=Derived(weights, "B", f"{read_how} = {weights / GB:.3f} GB (headers)"),
        dropped_kv_weights_bytes=Derived(
            dropped, "B",
            f"{dropped / GB * 1000:.1f} MB of KV-shared layers' K/V weights that vLLM drops at load; counting them "
            f"gives {(weights + dropped) / GB:.3f} GB",
        ),
        not_read_bytes=Derived(
            not_read, "B",
            f"{lookups} (row lookups) + idle vision/audio towers and other tensors",
        ),
        kv_read_bytes=Derived(kv, "B", f"at context {context:,}: {kv_how}"),
        bytes_per_token=Derived(per_token, "B", f"{weights / GB:.3f} GB weights + {kv / GB:.4f} GB KV"),
        ceiling_tokens_per_s=ceiling,
    )


def decode_ceiling(model: ModelFacts, gpu: KnownGpu, *, context: int = 0, dtype_bytes: int = 2) -> Derived:
    """The single-stream decode ceiling of `model` on a known GPU, in tokens/s (what `t4serve bench` divides by)."""
    result = roofline(model, context=context, dtype_bytes=dtype_bytes, bandwidth_bytes_per_s=gpu.bandwidth,
                      bandwidth_how=" measured" if gpu.bandwidth_measured else " nominal")
    assert result.ceiling_tokens_per_s is not None  # a known GPU always has a bandwidth
    return result.ceiling_tokens_per_s
