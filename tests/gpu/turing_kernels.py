"""vLLM's Triton attention at Gemma 4 E2B's shapes, timed as a T4 runs it (tests/gpu/t4mode.py), launch by launch.

    python3 tests/gpu/turing_kernels.py OUT [--reps 20] [--quick]

Variants, each vLLM's own `kernel_unified_attention` (the image's clamped vLLM) on the same batches:
- `vllm`: launched as vLLM launches it (today's path on a T4: FMA, 4 warps, ptxas's register choice);
- `fma/...`: t4serve's sm_75 FMA launches (step 1: warps and register cap), FMA_CANDIDATES;
- `mma/...`: Triton's sm_80 tensor-core code lowered to Turing's m16n8k8 (t4serve.turing), MMA_CANDIDATES: warps,
  KV tile and query rows per program.
Shapes: E2B's two layer kinds (global: head 512, full causal attention; sliding: head 256, window 512), 8 query heads
on 1 KV head, paged KV in shuffled blocks; a fresh prefill of 512, 2,048 and 4,096 tokens, a second 2,048-token
chunk over 2,048 cached tokens (t4serve's plan batches 2,048 tokens a step on a T4), decode of 1 and 16 sequences at
4,096 tokens. Each is timed as a CUDA graph replayed `--reps` times (median), and checked against float32 attention over
the same cache. Totals: the attention of a whole 512- and 4,096-token prefill (7 global + 28 sliding layers, in the
plan's 2,048-token chunks). `choice.json`: per phase and head the fastest launch among those that compiled for sm_75
without spills within 65,536 B and stayed within the error bound, for the table in t4serve/turing/launch.py.

OUT gets turing-kernels.json (every time, error and compile record: registers, spills, HMMA/FFMA counts for sm_75,
registers of the loaded function) and choice.json. A measuring tool for the GPU host (no T4 here), not a test.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

# (label, head size, sliding window, KV block size): E2B's layer kinds as vLLM 0.33 allocates their cache (the
# sliding group's block is doubled so both groups' pages are equal: t4serve.planning.kvcache).
LAYERS = (("global", 512, 0, 16), ("sliding", 256, 512, 32))
GLOBAL_LAYERS, SLIDING_LAYERS = 7, 28
CHUNK = 2048
PREFILLS = (512, 1024, 2048, 4096)
DECODE_BATCHES = (1, 8, 16)
DECODE_CONTEXT = 4096
# A float32-accumulated attention written as fp16 is good to about 1e-3 (t4serve.patch.proof's tolerance is 5e-3).
ERROR_BOUND = 5e-3

# (warps, maxnreg, tile, block_m) per (phase, padded head): the candidates of the sm_75 builds that fit 65,536 B
# without spills (docs/verified/turing-attention/sweep.json has every combination).
MMA_CANDIDATES: dict[tuple[str, int], list[tuple[int, int | None, int | None, int | None]]] = {
    ("prefill", 512): [(4, None, 16, 16), (8, None, 16, 16), (8, None, 16, 32)],
    ("prefill", 256): [(4, None, 32, 16), (8, None, 32, 16), (4, None, 32, 32), (8, None, 32, 32), (8, None, 16, 32),
                       (8, None, 32, 64)],
    ("decode", 512): [(4, None, None, None), (8, None, None, None)],
    ("decode", 256): [(2, None, None, None), (4, None, None, None), (8, None, None, None)],
}
FMA_CANDIDATES: dict[tuple[str, int], list[tuple[int, int | None, int | None, int | None]]] = {
    ("prefill", 512): [(4, 255, None, None), (8, None, None, None)],
    ("prefill", 256): [(8, None, None, None), (4, None, 16, None)],
    ("decode", 512): [(4, 255, None, None), (8, None, None, None)],
    ("decode", 256): [(8, None, None, None)],
}


def say(text: str) -> None:
    print(text, flush=True)


def shapes(quick: bool) -> list[tuple[str, list[int], list[int]]]:
    """(name, context lengths, query lengths) of the batches, per layer kind."""
    out = [(f"prefill{n}", [0], [n]) for n in (PREFILLS[:2] if quick else PREFILLS)]
    out.append((f"chunk2of{2 * CHUNK}", [CHUNK], [CHUNK]))
    out += [(f"decode{b}x{DECODE_CONTEXT}", [DECODE_CONTEXT - 1] * b, [1] * b)
            for b in (DECODE_BATCHES[:1] if quick else DECODE_BATCHES)]
    return out


def graph_time(torch: Any, fn: Any, reps: int) -> float:
    """Milliseconds per call: `fn` captured as a CUDA graph (after one eager call that compiles and loads), replayed
    `reps` times, the median of single replays timed with CUDA events."""
    fn()
    torch.cuda.synchronize()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--quick", action="store_true", help="two prefill lengths and one decode batch")
    parser.add_argument("--kv", choices=("16-bit", "int8"), default="16-bit",
                        help="the KV cache: vLLM's int8 per-token-head cache against attention over its dequantized "
                             "values")
    args = parser.parse_args(argv)
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    began = time.time()
    # The T4's shared memory for the clamp's tile choice (read when vLLM's module is imported), then T4 mode before
    # any attention kernel is compiled.
    os.environ["T4SERVE_SHARED_MEMORY_PER_BLOCK"] = "65536"
    import t4mode

    t4mode.install(out / "records")
    import torch
    import vllm.v1.attention.ops.triton_unified_attention as module

    from t4serve.patch import worker
    from t4serve.turing import hook
    from t4serve.turing.launch import DECODE, PREFILL, Launch, TuringLaunches

    hook.install()
    real = module.kernel_unified_attention
    device = torch.cuda.get_device_name()
    say(f"{device}: T4 mode; vLLM's kernel from {module.__file__}")
    record: dict[str, Any] = {"device": device, "torch": torch.__version__, "reps": args.reps, "cases": []}

    def variants(phase: str, head: int) -> list[tuple[str, Launch | None]]:
        found: list[tuple[str, Launch | None]] = [("vllm", None)]
        for kind, table in (("fma", FMA_CANDIDATES), ("mma", MMA_CANDIDATES)):
            for warps, maxnreg, tile, block_m in table.get((phase, head), []):
                launch = Launch(num_warps=warps, maxnreg=maxnreg, tensor_cores=kind == "mma", tile_size=tile,
                                block_m=block_m)
                name = f"{kind}/w{warps}" + (f"/r{maxnreg}" if maxnreg else "") + (f"/t{tile}" if tile else "") + (
                    f"/m{block_m}" if block_m else "")
                found.append((name, launch))
        return found

    seed = 43
    for layer, head, window, block in LAYERS:
        for shape, contexts, queries in shapes(args.quick):
            phase = DECODE if max(queries) == 1 else PREFILL
            seed += 1
            batch = worker.make_batch(torch, head, window, block, contexts, queries, seed)
            batch.tensors = {k: v.cuda() for k, v in batch.tensors.items()}
            cache, kv_mode = int8_cache(torch, batch) if args.kv == "int8" else ({}, 0)
            reference = worker.reference_attention(torch, batch)
            flops = attention_flops(head, window, contexts, queries)
            for name, launch in variants(phase, head):
                case: dict[str, Any] = {"kv": args.kv, "layer": layer, "head": head, "window": window, "shape": shape,
                                        "phase": phase, "variant": name, "gflop": round(flops / 1e9, 3)}
                module.kernel_unified_attention = (real if launch is None
                                                   else TuringLaunches(real, {(phase, head, kv_mode): launch}))
                try:
                    batch.tensors["out"].zero_()
                    ms = graph_time(torch, lambda b=batch, c=cache: worker.run_unified_attention(module, torch, b, **c),
                                    args.reps)
                    error = float((batch.tensors["out"].float() - reference).abs().max())
                    case |= {"ms": round(ms, 4), "max_abs_error": error, "tflops": round(flops / ms / 1e9, 3)}
                    say(f"{layer:<7} {shape:<16} {name:<18} {ms:9.3f} ms  {flops / ms / 1e9:7.2f} TFLOP/s  "
                        f"error {error:.1e}")
                except Exception as e:  # a launch a T4 cannot run (shared memory) fails here too: recorded
                    case["error"] = f"{type(e).__name__}: {str(e)[:400]}"
                    say(f"{layer:<7} {shape:<16} {name:<18} failed: {case['error'][:160]}")
                finally:
                    module.kernel_unified_attention = real
                record["cases"].append(case)
            del batch, reference
            torch.cuda.empty_cache()
            (out / "turing-kernels.json").write_text(json.dumps(record, indent=1))
    record["compiles"] = t4mode.read_records(out / "records")
    record["totals"] = totals(record["cases"])
    record["choice"] = choose(record["cases"], record["compiles"])
    record["seconds"] = round(time.time() - began, 1)
    (out / "turing-kernels.json").write_text(json.dumps(record, indent=1))
    (out / "choice.json").write_text(json.dumps(record["choice"], indent=1))
    say(json.dumps(record["totals"], indent=1))
    say(json.dumps(record["choice"], indent=1))
    return 0


def int8_cache(torch: Any, batch: Any) -> tuple[dict[str, Any], int]:
    """vLLM's int8 per-token-head cache of the batch's keys and values (absmax / 127 per token and head, as vLLM's
    write kernel rounds), and the batch's 16-bit cache replaced by its dequantized values: the reference then
    attends over what the int8 cache holds. Returns the kernel's cache arguments and vLLM's KV_QUANT_MODE (2)."""
    from vllm.v1.kv_cache_interface import KVQuantMode

    out: dict[str, Any] = {"kv_quant_mode": KVQuantMode.INT8_PER_TOKEN_HEAD}
    for name in ("k", "v"):
        values = batch.tensors[name].float()
        scale = values.abs().amax(dim=-1).clamp(min=1e-6) / 127.0
        codes = torch.round(values / scale[..., None]).clamp(-127, 127).to(torch.int8)
        out[name] = codes
        out[f"{name}_scale_cache"] = scale.contiguous()
        batch.tensors[name] = (codes.float() * scale[..., None]).to(torch.float16)
    return out, int(KVQuantMode.INT8_PER_TOKEN_HEAD)


def variant_launch(name: str) -> Any:
    """The Launch a variant's name stands for (`mma/w8/t16/m32`: tensor cores, 8 warps, tile 16, BLOCK_M 32)."""
    from t4serve.turing.launch import Launch

    kind, *parts = name.split("/")
    fields = {p[0]: int(p[1:]) for p in parts}
    return Launch(num_warps=fields["w"], maxnreg=fields.get("r"), tensor_cores=kind == "mma",
                  tile_size=fields.get("t"), block_m=fields.get("m"))


def table_from_choice(choice: dict[str, Any]) -> dict[tuple[str, int, int], Any]:
    """The turing-mma launch table the kernel step's choice gives: per (phase, head) the faster of its best mma and
    best fma launch, for the 16-bit and the int8 cache alike; no row where vLLM's own launch was faster than both."""
    from t4serve.turing.launch import KV_MODES

    table: dict[tuple[str, int, int], Any] = {}
    slots = {tuple(key.split("/")[:2]) for key in choice if key.count("/") == 2}
    for phase, head in slots:
        best = min((choice[k] for k in (f"{phase}/{head}/mma", f"{phase}/{head}/fma") if k in choice),
                   key=lambda c: c["sum_ms"])
        if best["sum_ms"] >= best["vllm_sum_ms"]:
            continue
        for kv in KV_MODES:
            table[(phase, int(head), kv)] = variant_launch(best["variant"])
    return table


def attention_flops(head: int, window: int, contexts: list[int], queries: list[int]) -> float:
    """2 x 2 x query heads x head x (query, key) pairs attended (QK^T and PV), causal, within the window."""
    pairs = 0
    for context, count in zip(contexts, queries, strict=True):
        for position in range(context, context + count):
            keys = position + 1
            pairs += min(keys, window) if window else keys
    return 4.0 * 8 * head * pairs


def totals(cases: list[dict[str, Any]]) -> dict[str, Any]:
    """Per variant family (vllm, the best fma, the best mma at each shape), a whole prefill's attention in ms:
    512 tokens (one chunk) and 4,096 (two 2,048-token chunks), 7 global and 28 sliding layers."""
    best: dict[tuple[str, str, str], float] = {}
    for c in cases:
        if "ms" not in c or c["max_abs_error"] > ERROR_BOUND:
            continue
        family = c["variant"].split("/")[0]
        key = (family, c["layer"], c["shape"])
        best[key] = min(best.get(key, math.inf), c["ms"])
    out: dict[str, Any] = {}
    for family in ("vllm", "fma", "mma"):
        def t(layer: str, shape: str, family: str = family) -> float:
            return best.get((family, layer, shape), math.nan)

        out[family] = {
            "prefill512_ms": round(GLOBAL_LAYERS * t("global", "prefill512") + SLIDING_LAYERS * t("sliding",
                                                                                                  "prefill512"), 2),
            "prefill4096_ms": round(
                GLOBAL_LAYERS * (t("global", f"prefill{CHUNK}") + t("global", f"chunk2of{2 * CHUNK}"))
                + SLIDING_LAYERS * (t("sliding", f"prefill{CHUNK}") + t("sliding", f"chunk2of{2 * CHUNK}")), 2),
        }
    for family in ("fma", "mma"):
        for key in ("prefill512_ms", "prefill4096_ms"):
            base, new = out["vllm"][key], out[family][key]
            out[family][key.replace("_ms", "_speedup")] = round(base / new, 2) if new else None
    return out


def choose(cases: list[dict[str, Any]], compiles: list[dict[str, Any]]) -> dict[str, Any]:
    """Per (phase, head), the fastest mma and the fastest fma launch over the shapes of that phase (sum of times),
    among variants that ran every shape within ERROR_BOUND; spills are in the compile records and the proof."""
    sums: dict[tuple[str, int, str], float] = {}
    failed: set[tuple[str, int, str]] = set()
    for c in cases:
        key = (c["phase"], c["head"], c["variant"])
        if "ms" not in c or c["max_abs_error"] > ERROR_BOUND:
            failed.add(key)
            continue
        sums[key] = sums.get(key, 0.0) + c["ms"]
    choice: dict[str, Any] = {}
    for (phase, head, variant), total in sorted(sums.items()):
        if (phase, head, variant) in failed or variant == "vllm":
            continue
        family = variant.split("/")[0]
        slot = f"{phase}/{head}/{family}"
        if slot not in choice or total < choice[slot]["sum_ms"]:
            choice[slot] = {"variant": variant, "sum_ms": round(total, 4),
                            "vllm_sum_ms": round(sums.get((phase, head, "vllm"), math.nan), 4)}
    choice["compiled_kernels"] = len([c for c in compiles if c.get("event") == "compile"])
    return choice


if __name__ == "__main__":
    sys.exit(main())
