"""The proof of t4serve's Turing attention, run against vLLM's real kernel in a child process:
`python -m t4serve.turing TARGET`.

For every row of the launch table (t4serve.turing.launch.LAUNCHES) and for every FMA combination of warps, register
cap and tile at Gemma 4 E2B's two head sizes (step 1), vLLM's own `unified_attention` is run on CPU tensors with its
kernel replaced by a recorder (through TuringLaunches for the table's rows), each recorded launch is compiled by
Triton for target sm_75 (tensor-core rows through Triton's sm_80 code generator and t4serve.turing.lowering), and
ptxas for sm_75 says its registers and spill bytes, cuobjdump its HMMA and FFMA instructions. Figures go to stdout
as they come; the last line is RESULT_PREFIX + JSON. Imports torch/triton/vLLM only here.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from t4serve.patch import worker as clamp_worker
from t4serve.patch.clamp import padded_head_size
from t4serve.turing.launch import DECODE, KV_INT8, KV_MODES, LAUNCHES, PREFILL, Launch, TuringLaunches

RESULT_PREFIX = "T4SERVE-TURING-RESULT "
# (head size, sliding window, KV block size) per padded head: E2B's two layer kinds as vLLM allocates their cache,
# and the smaller heads other models have, as full attention.
SHAPES = {512: (512, 0, 16), 256: (256, 512, 32), 128: (128, 0, 16), 64: (64, 0, 16)}
# Step 1's combinations (FMA: Triton's own code for Turing), at E2B's head sizes.
STEP1_HEADS = (512, 256)
STEP1_WARPS = (2, 4, 8)
STEP1_MAXNREG = (None, 255)
STEP1_TILES = (16, 32)


def say(text: str) -> None:
    print(text, flush=True)


def batch(torch: Any, phase: str, head: int, seed: int) -> Any:
    size, window, block = SHAPES[head]
    if phase == PREFILL:
        return clamp_worker.make_batch(torch, size, window, block, [0, 13, 30], [20, 9, 5], seed)
    return clamp_worker.make_batch(torch, size, window, block, [40, 17, 33], [1, 1, 1], seed)


def cache_arguments(torch: Any, b: Any, kv_mode: int) -> dict[str, Any]:
    """vLLM's int8 per-token-head cache in place of the batch's 16-bit one (random codes and scales: the proof
    compiles, it does not compare)."""
    if kv_mode != KV_INT8:
        return {}
    from vllm.v1.kv_cache_interface import KVQuantMode

    shape = b.tensors["k"].shape
    return {"k": torch.randint(-127, 127, shape, dtype=torch.int8),
            "v": torch.randint(-127, 127, shape, dtype=torch.int8),
            "kv_quant_mode": KVQuantMode.INT8_PER_TOKEN_HEAD,
            "k_scale_cache": torch.rand(shape[:3], dtype=torch.float32),
            "v_scale_cache": torch.rand(shape[:3], dtype=torch.float32)}


def recorded(module: Any, torch: Any, phase: str, head: int, kv_mode: int, table: dict[Any, Launch] | None) -> Any:
    """The one `kernel_unified_attention` launch vLLM makes for this shape, through TuringLaunches with `table`."""
    b = batch(torch, phase, head, seed=head + kv_mode)
    with clamp_worker.shared_memory(module, 65_536), clamp_worker.recording(module, launch=False) as launches:
        if table is not None:
            module.kernel_unified_attention = TuringLaunches(module.kernel_unified_attention, table)
        clamp_worker.run_unified_attention(module, torch, b, **cache_arguments(torch, b, kv_mode))
    [launch] = [x for x in launches if x.kernel == "kernel_unified_attention"]
    return launch


def assemble(ptx: str) -> dict[str, Any]:
    """ptxas for sm_75 on the PTX Triton made (registers, spill bytes), cuobjdump on the result (HMMA, FFMA)."""
    from triton import knobs

    with tempfile.TemporaryDirectory() as tmp:
        src, cubin = Path(tmp) / "k.ptx", Path(tmp) / "k.cubin"
        src.write_text(ptx)
        done = subprocess.run([knobs.nvidia.ptxas.path, "-v", "--gpu-name=sm_75", str(src), "-o", str(cubin)],
                              capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"ptxas for sm_75 refused the kernel: {done.stderr.strip()[-1500:]}")
        sass = subprocess.run([knobs.nvidia.cuobjdump.path, "-sass", str(cubin)], capture_output=True, text=True,
                              check=True).stdout
    registers = re.search(r"Used (\d+) registers", done.stderr)
    spills = re.search(r"(\d+) bytes spill stores", done.stderr)
    return {"registers": int(registers.group(1)) if registers else 0,
            "spill_bytes": int(spills.group(1)) if spills else 0,
            "hmma": len(re.findall(r"\bHMMA\.", sass)), "ffma": len(re.findall(r"\bFFMA\b", sass))}


def compile_for_turing(launch: Any) -> dict[str, Any]:
    """The recorded launch compiled by Triton for sm_75 as Triton's launcher would (same binder and specialisation,
    the launch's options), then assembled and counted."""
    from triton.backends.compiler import GPUTarget

    started = time.monotonic()
    kernel = clamp_worker.compile_launch(launch, GPUTarget("cuda", 75, 32))
    figures = assemble(kernel.asm["ptx"])
    return {"shared_memory_bytes": int(kernel.metadata.shared), "num_warps": int(kernel.metadata.num_warps),
            "seconds": round(time.monotonic() - started, 1), **figures}


# The module and torch the jobs use, set before the pool forks (its children inherit them).
_LOADED: dict[str, Any] = {}


def table_job(key: tuple[str, int, int]) -> dict[str, Any]:
    """One row of the launch table, recorded through TuringLaunches and compiled."""
    phase, head, kv_mode = key
    launch = LAUNCHES[key]
    recorded_launch = recorded(_LOADED["module"], _LOADED["torch"], phase, head, kv_mode, {key: launch})
    k = recorded_launch.kwargs
    figures = compile_for_turing(recorded_launch)
    return {"kernel": "kernel_unified_attention", "phase": phase, "head_size": head, "kv_cache": KV_MODES[kv_mode],
            "arch": "sm_75", "launch": launch.describe(), "tensor_cores": launch.tensor_cores,
            "tile_size": int(k["TILE_SIZE"]), "block_m": int(k["BLOCK_M"]),
            "tensor_core_instructions": figures["hmma"], **figures}


def step1_job(combo: tuple[int, str, int, int | None, int | None]) -> dict[str, Any]:
    """One FMA combination at an E2B head, 16-bit cache."""
    head, phase, warps, maxnreg, tile = combo
    launch = Launch(num_warps=warps, maxnreg=maxnreg, tensor_cores=False, tile_size=tile)
    recorded_launch = recorded(_LOADED["module"], _LOADED["torch"], phase, head, 0, {(phase, head, 0): launch})
    figures = compile_for_turing(recorded_launch)
    return {"phase": phase, "head_size": head, "num_warps": warps, "maxnreg": maxnreg,
            "tile_size": int(recorded_launch.kwargs["TILE_SIZE"]),
            "fits": figures["shared_memory_bytes"] <= 65_536, **figures}


def step1_combos() -> list[tuple[int, str, int, int | None, int | None]]:
    """Every FMA combination at E2B's heads: warps x register cap x tile (prefill; decode keeps vLLM's tile, which
    its reduction shares)."""
    combos = []
    for head, phase in itertools.product(STEP1_HEADS, (PREFILL, DECODE)):
        tiles: tuple[int | None, ...] = STEP1_TILES if phase == PREFILL else (None,)
        combos += [(head, phase, w, r, t) for w, r, t in itertools.product(STEP1_WARPS, STEP1_MAXNREG, tiles)]
    return combos


def run_jobs(job: Any, items: list[Any], workers: int) -> list[dict[str, Any]]:
    """`job` over `items` in order, on `workers` forked processes (Triton's compiles are CPU-bound and single-threaded;
    each process compiles into its own copy of the Triton cache directory's contents)."""
    if workers <= 1:
        return [job(item) for item in items]
    import multiprocessing

    with multiprocessing.get_context("fork").Pool(workers) as pool:
        return list(pool.imap(job, items))


def say_row(row: dict[str, Any]) -> None:
    if "launch" in row:
        say(f"  {row['phase']:<7} head {row['head_size']:<3} {row['kv_cache']:<6} {row['launch']:<60} "
            f"{row['shared_memory_bytes']:>7,} B {row['registers']:>3} regs {row['spill_bytes']:>5} B spills "
            f"{row['hmma']:>4} HMMA ({row['seconds']} s)")
    else:
        say(f"  step 1: {row['phase']:<7} head {row['head_size']} warps {row['num_warps']} maxnreg "
            f"{row['maxnreg'] or '-':<3} tile {row['tile_size']:<2} {row['shared_memory_bytes']:>7,} B "
            f"{row['registers']:>3} regs {row['spill_bytes']:>5} B spills"
            f"{'' if row['fits'] else ' (over 65,536 B: cannot launch)'} ({row['seconds']} s)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m t4serve.turing")
    parser.add_argument("target", type=Path, help="the clamped triton_unified_attention.py")
    parser.add_argument("--no-step1", dest="step1", action="store_false", help="the table's rows only")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="compiling processes")
    args = parser.parse_args(argv)
    started = time.monotonic()
    import torch

    from t4serve.turing import hook

    _LOADED["module"] = clamp_worker.load_target(args.target)
    _LOADED["torch"] = torch
    hook.install()
    say(f"  loaded {args.target} with vLLM's imports; Triton's lowering hook {hook.HOOK_VERSION}; "
        f"{args.workers} compiling processes")
    say("the launch table, each row compiled for sm_75:")
    result: dict[str, Any] = {"kernels": run_jobs(table_job, sorted(LAUNCHES), args.workers)}
    for row in result["kernels"]:
        say_row(row)
    if args.step1:
        say("step 1: every FMA launch at Gemma 4 E2B's heads, compiled for sm_75:")
        result["step1"] = run_jobs(step1_job, step1_combos(), args.workers)
        for row in result["step1"]:
            say_row(row)
    result["padded_heads"] = sorted({padded_head_size(h) for h in SHAPES})
    result["seconds"] = round(time.monotonic() - started, 1)
    print(RESULT_PREFIX + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
