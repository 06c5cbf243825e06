"""Shared memory per block of vLLM's attention kernels with a quantized KV cache, compiled for a GPU target without a
GPU: the figures behind t4serve.planning.kernelfit. Runs where vLLM and Triton are installed (the image):

    docker run --rm -e CUDA_VISIBLE_DEVICES= -v "$PWD/tests:/t:ro" --entrypoint python t4serve:dev \\
        /t/gpu/kv_kernel_shared_memory.py [--arch 75] [--tiles clamped|vllm] [--modes none,int8,int4]
        [--layers e2b|heads] [--json]

For each cache mode and layer shape it calls vLLM's real `unified_attention` (the installed, clamped file) on CPU
tensors laid out as vLLM's Triton backend lays out that cache (`TritonAttentionImpl._pth_key_value_caches`: the
inline float32 scales), with the kernels replaced by t4serve.patch.worker's Recorder (it records each launch, nothing
runs), then compiles each recorded launch for `--arch` as Triton's launcher would and reads its shared memory.
`--tiles clamped`: the tile the clamp picks on a card of 65,536 B per block (a T4); `vllm`: vLLM's own. `--layers
e2b`: Gemma 4 E2B's two layer kinds (head 256 with a 512-token window, head 512 full), 16-token blocks as the
quantized caches use; `heads`: full attention at heads 64 to 512. int4 runs its own kernel (`_attn_packed` in
int4_per_token_head.py), int8 the unified one with its scales. A measuring tool, not a test; its output is in
docs/verified/kv-kernel-shared-memory/.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import types
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "entrypoint"))

LAYERS = {"e2b": [("sliding", 256, 512), ("global", 512, 0)],
          "heads": [("full", h, 0) for h in (64, 128, 256, 512)]}
BLOCK = 16


def quantized_caches(mode: Any, num_blocks: int, head: int) -> tuple[Any, Any, Any, Any]:
    """Zeroed key and value caches (and the float32 scale views) for `mode`, laid out as vLLM's Triton backend lays
    them out: its own `TritonAttentionImpl._pth_key_value_caches` over one packed tensor."""
    import torch
    from vllm.v1.attention.backends.triton_attn import TritonAttentionImpl
    from vllm.v1.kv_cache_interface import KVQuantMode

    from t4serve.patch import worker as w

    if mode == KVQuantMode.NONE:
        k = torch.zeros((num_blocks, BLOCK, w.NUM_KV_HEADS, head), dtype=torch.float16)
        return k, k.clone(), None, None
    # vLLM's logical (blocks, heads, slots, content) with each side's float32 scale inline after its data.
    data = head // 2 if mode == KVQuantMode.INT4_PER_TOKEN_HEAD else head
    dtype = torch.int8 if mode == KVQuantMode.INT8_PER_TOKEN_HEAD else torch.uint8
    kv = torch.zeros((num_blocks, w.NUM_KV_HEADS, BLOCK, 2 * (data + 4)), dtype=dtype)
    # The attributes vLLM's methods below read on the impl; `_set_kv_ptr_range` (vLLM 0.34) is ROCm's, False on CUDA.
    impl = types.SimpleNamespace(_k_scale_cache=None, _v_scale_cache=None, _kv_quant_mode=mode,
                                 fp8_dtype=torch.float8_e4m3fn, _set_kv_ptr_range=False)
    impl._ensure_scale_caches = types.MethodType(TritonAttentionImpl._ensure_scale_caches, impl)
    key, value = TritonAttentionImpl._pth_key_value_caches(impl, kv)
    return key, value, impl._k_scale_cache, impl._v_scale_cache


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arch", type=int, default=75)
    parser.add_argument("--tiles", choices=("clamped", "vllm"), default="clamped")
    parser.add_argument("--modes", default="none,int8,int4")
    parser.add_argument("--layers", choices=tuple(LAYERS), default="e2b")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)

    import torch
    import vllm.v1.attention.ops.int4_per_token_head as i4
    import vllm.v1.attention.ops.triton_unified_attention as tua
    from triton.backends.compiler import GPUTarget
    from vllm.v1.kv_cache_interface import KVQuantMode

    from t4serve.patch import worker as w

    if not hasattr(tua, "T4SERVE_SHARED_MEMORY_OVERRIDE"):
        print("the installed vLLM's triton_unified_attention.py has no clamp (t4serve patch apply)", file=sys.stderr)
        return 2
    modes = {"none": KVQuantMode.NONE, "int8": KVQuantMode.INT8_PER_TOKEN_HEAD,
             "int4": KVQuantMode.INT4_PER_TOKEN_HEAD}
    target = GPUTarget("cuda", args.arch, 32)

    def launches_of(mode: Any, batch: Any) -> list[Any]:
        key, value, k_scales, v_scales = quantized_caches(mode, batch.tensors["k"].shape[0], batch.head_size)
        tiles = w.unpatched(tua) if args.tiles == "vllm" else contextlib.nullcontext()
        with w.shared_memory(tua, 65_536), tiles, w.recording(tua, launch=False) as unified, \
                w.recording(i4, launch=False, kernels=("_attn_packed", "reduce_segments")) as packed:
            w.run_unified_attention(tua, torch, batch, k=key, v=value, kv_quant_mode=mode, k_scale_cache=k_scales,
                                    v_scale_cache=v_scales)
        return [*unified, *packed]

    rows = []
    for mode_name in args.modes.split(","):
        mode = modes[mode_name]
        for layer, head, window in LAYERS[args.layers]:
            for phase, batch in w.e2b_batches(torch, head, window, BLOCK, seed=head).items():
                for launch in launches_of(mode, batch):
                    if launch.kernel == "reduce_segments":
                        continue
                    need, _seconds = w.compile_shared_memory(launch, target)
                    row = {"arch": args.arch, "tiles": args.tiles, "mode": mode_name, "layer": layer, "head": head,
                           "window": window, "phase": phase, "kernel": launch.kernel,
                           "tile": launch.kwargs.get("TILE_SIZE"), "shared_memory": need}
                    rows.append(row)
                    if not args.json:
                        print(f"sm_{args.arch} {args.tiles:<7} {mode_name:<4} {layer:<7} head {head:<3} window "
                              f"{window or '-':<3} {phase:<7} {launch.kernel:<24} tile {row['tile']:<2} "
                              f"{need:>8,} B", flush=True)
    if args.json:
        print(json.dumps(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
