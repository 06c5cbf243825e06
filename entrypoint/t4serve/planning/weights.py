"""The bytes vLLM holds on the GPU for a checkpoint's weights, from its safetensors headers: one function for the
served model and its drafter (t4serve.planning.sizing, t4serve.planning.speculative). Pure."""

from __future__ import annotations

from t4serve.facts import ModelFacts
from t4serve.probes.checkpoint import PART_KV_SHARED_DROPPED
from t4serve.units import GIB

# safetensors dtypes of floating-point weights and their bits: vLLM holds these in the model dtype.
FLOAT_WEIGHT_BITS = {"F16": 16, "BF16": 16, "F32": 32, "F64": 64}


def weights_in_gpu(model: ModelFacts, dtype_bytes: int) -> tuple[int, str]:
    """Bytes vLLM keeps on the GPU: every tensor but the dropped KV-shared K/V; floating-point tensors in the model
    dtype (float32 weights cast down to 16 bits, 16-bit ones up to float32), quantized and 8-bit ones as stored."""
    total = 0
    cast: dict[str, int] = {}
    for g in model.weights:
        if g.part == PART_KV_SHARED_DROPPED:
            continue
        for dtype, n in g.bytes_by_dtype.items():
            bits = FLOAT_WEIGHT_BITS.get(dtype)
            if bits is not None and bits != 8 * dtype_bytes:
                held = n * 8 * dtype_bytes // bits
                cast[dtype] = cast.get(dtype, 0) + held - n
                total += held
            else:
                total += n
    dropped = sum(g.total_bytes for g in model.weights if g.part == PART_KV_SHARED_DROPPED)
    how = f"{model.weight_bytes / GIB:.4f} GiB in the headers - {dropped / GIB:.4f} GiB dropped KV-shared K/V"
    for dtype, change in sorted(cast.items()):
        sign = "+" if change > 0 else "-"
        how += f" {sign} {abs(change) / GIB:.4f} GiB of {dtype} held as {8 * dtype_bytes}-bit"
    return total, how
