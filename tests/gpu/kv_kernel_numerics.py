"""What a quantized KV cache does to vLLM's attention output, with vLLM's own kernels run under TRITON_INTERPRET=1 on
the CPU at the tiles the clamp picks for a T4. Runs where vLLM and Triton are installed (the image):

    docker run --rm -e CUDA_VISIBLE_DEVICES= -v "$PWD/tests:/t:ro" --entrypoint python t4serve:dev \\
        /t/gpu/kv_kernel_numerics.py [--modes none,int8,int4] [--shared-memory 65536] [--json]

For each cache mode and Gemma 4 E2B layer kind (head 256 sliding, head 512 global; a prefill batch and a decode batch
from t4serve.patch.worker) it writes the batch's fp16 keys and values into the cache with vLLM's own write path
(`triton_reshape_and_cache_flash_per_token_head_quant`: per token and head, absmax / 127 and round half away from
zero for int8; a Hadamard rotation and packed nibbles for int4) and runs the clamped `unified_attention` on it, as
vLLM's Triton backend calls both (`TritonAttentionImpl.do_kv_cache_update` and `forward`). It prints, per case:

- `vs 16-bit`: max |output - float32 attention over the fp16 keys and values|, what the cache costs in all;
- `vs stored`: for int8, max |output - float32 attention over the values the cache holds| (data x scale), the
  kernel's own error apart from the quantization; for int4 the stored values are rotated, so it is left out;
- the tiles the launches used (the clamp's, for `--shared-memory` B per block).

The interpreter runs the kernels' semantics in NumPy, not a GPU's rounding: a GPU's accumulation order differs in
the last bits. A measuring tool, not a test; tests/image/test_kv_kernel_numerics.py checks its figures in CI's image
and its output is in docs/verified/kv-kernel-numerics/.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
import warnings
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "entrypoint"))

# This directory is on sys.path when the script runs (and in the unit tests' pythonpath).
from kv_kernel_shared_memory import BLOCK, quantized_caches

# Gemma 4 E2B's layer kinds; the sliding window cut to 16 tokens so that it bites within the batches' tens of tokens.
LAYERS = (("sliding", 256, 16), ("global", 512, 0))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--modes", default="none,int8,int4")
    parser.add_argument("--shared-memory", type=int, default=65_536, help="opt-in shared memory per block to clamp to")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)

    os.environ["TRITON_INTERPRET"] = "1"
    import torch
    import vllm.v1.attention.ops.int4_per_token_head as i4
    import vllm.v1.attention.ops.triton_unified_attention as tua
    from vllm.v1.attention.ops.triton_reshape_and_cache_flash import (
        triton_reshape_and_cache_flash_per_token_head_quant as write_quantized,
    )
    from vllm.v1.kv_cache_interface import KVQuantMode

    from t4serve.patch import worker as w

    if not hasattr(tua, "T4SERVE_SHARED_MEMORY_OVERRIDE"):
        print("the installed vLLM's triton_unified_attention.py has no clamp (t4serve patch apply)", file=sys.stderr)
        return 2
    # As the proof's interpret step: the interpreter evaluates both sides of a tl.where in NumPy (0/0 for rows the
    # mask drops); those values are discarded, and the comparison with the reference judges the result.
    warnings.filterwarnings("ignore", category=RuntimeWarning, module="triton.runtime.interpreter")
    modes = {"none": KVQuantMode.NONE, "int8": KVQuantMode.INT8_PER_TOKEN_HEAD, "int4": KVQuantMode.INT4_PER_TOKEN_HEAD}

    def stored(batch: w.Batch, mode: Any) -> tuple[dict[str, Any], w.Batch | None]:
        """The batch's keys and values written into a `mode` cache by vLLM's write path: the cache arguments for
        `unified_attention`, and (int8) the batch as the cache holds it, dequantized, for the reference."""
        num_blocks, block, heads, head = batch.tensors["k"].shape
        assert block == BLOCK
        key, value, k_scales, v_scales = quantized_caches(mode, num_blocks, head)
        if mode == KVQuantMode.NONE:
            return {}, None
        # Every slot of every block, as vLLM writes a token's slot: slot = block number x block size + offset.
        slots = torch.arange(num_blocks * BLOCK, dtype=torch.int64)
        write_quantized(
            batch.tensors["k"].reshape(-1, heads, head),
            batch.tensors["v"].reshape(-1, heads, head),
            key,
            value,
            k_scales,
            v_scales,
            slots,
            kv_quant_mode=mode,
        )
        cache = {"k": key, "v": value, "kv_quant_mode": mode, "k_scale_cache": k_scales, "v_scale_cache": v_scales}
        if mode != KVQuantMode.INT8_PER_TOKEN_HEAD:
            return cache, None
        held = {
            "k": key[..., :head].float() * k_scales[..., None],
            "v": value[..., :head].float() * v_scales[..., None],
        }
        return cache, dataclasses.replace(batch, tensors=batch.tensors | held)

    rows = []
    for mode_name in args.modes.split(","):
        mode = modes[mode_name]
        for layer, head, window in LAYERS:
            for phase, batch in w.e2b_batches(torch, head, window, BLOCK, seed=head + 11).items():
                reference = w.reference_attention(torch, batch)
                cache, held = stored(batch, mode)
                fresh = {"out": torch.zeros_like(batch.tensors["q"])}
                batch = dataclasses.replace(batch, tensors=batch.tensors | fresh)
                started = time.monotonic()
                with (
                    w.shared_memory(tua, args.shared_memory),
                    w.recording(tua, launch=True) as unified,
                    w.recording(i4, launch=True, kernels=("_attn_packed",)) as packed,
                ):
                    out = w.run_unified_attention(tua, torch, batch, **cache).float()
                seconds = time.monotonic() - started
                scale = float(reference.abs().max())
                row = {
                    "mode": mode_name,
                    "layer": layer,
                    "head": head,
                    "window": window,
                    "phase": phase,
                    "tiles": sorted({x.kwargs["TILE_SIZE"] for x in [*unified, *packed] if "TILE_SIZE" in x.kwargs}),
                    "kernels": sorted({x.kernel for x in [*unified, *packed]}),
                    "vs_16bit": float((out - reference).abs().max()),
                    "vs_stored": None
                    if held is None and mode != KVQuantMode.NONE
                    else float((out - w.reference_attention(torch, held or batch)).abs().max()),
                    "reference_max": scale,
                    "seconds": round(seconds, 1),
                }
                rows.append(row)
                if not args.json:
                    stored_text = "-" if row["vs_stored"] is None else f"{row['vs_stored']:.2e}"
                    print(
                        f"{mode_name:<4} {layer:<7} head {head:<3} window {window or '-':<3} {phase:<7} "
                        f"tiles {row['tiles']} max |error| vs 16-bit {row['vs_16bit']:.2e} "
                        f"({row['vs_16bit'] / scale:.2%} of max |out|), vs stored {stored_text} "
                        f"({seconds:.1f} s)",
                        flush=True,
                    )
    if args.json:
        print(json.dumps(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
