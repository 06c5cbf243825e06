"""The clamp's proof, run against vLLM's real code in a child process: `python -m t4serve.patch MODE TARGET`.

MODE `compile` (steps 2 and 4): captures the kernel launches vLLM's real `unified_attention` makes for Gemma 4 E2B's
shapes, compiles each for sm_75 and reads its shared memory; then compares the clamped tile choice with vLLM's own.
MODE `interpret` (step 3): runs `unified_attention` under TRITON_INTERPRET=1 on CPU tensors against a float32
reference. Figures go to stdout as they come; the last line is `RESULT_PREFIX` + JSON. Imports torch/triton/vLLM
only here, so the parent (`t4serve patch verify`) never does.
"""

from __future__ import annotations

import argparse
import importlib.util
import inspect
import json
import math
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from t4serve.patch.clamp import padded_head_size

RESULT_PREFIX = "T4SERVE-CLAMP-RESULT "
TARGET_MODULE_NAME = "t4serve_clamp_target"

# Gemma 4 E2B (published-t4-run.md): 8 query heads, 1 KV head; sliding layers head 256 window 512, global layers head
# 512.
NUM_QUERY_HEADS = 8
NUM_KV_HEADS = 1
# (label, head size, sliding window in tokens or 0 for global attention, KV block size in tokens)
E2B_LAYERS = (("sliding", 256, 512, 32), ("global", 512, 0, 16))
# vLLM's triton backend: 16 parallel softmax segments for the 3D (split-KV) decode kernel.
NUM_SEGMENTS = 16
SEQ_THRESHOLD_3D = 128 // NUM_KV_HEADS
# Devices with at least this much opt-in shared memory per block must see vLLM's own tiles (step 4): the figure tile
# 32 needs at head 512, and the opt-in limits of sm_86/89, sm_80 and sm_90.
ENOUGH_SHARED_MEMORY = (98_304, 101_376, 166_912, 232_448)
# Head sizes vLLM's Triton backend serves, up to the largest the 98,304-B figure covers.
HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 256, 320, 512)
SLIDING_WINDOWS = (0, 512, 1024, 4096)
ELEMENT_SIZES = (1, 2, 4)


def say(text: str) -> None:
    print(text, flush=True)


def load_target(path: Path) -> Any:
    """Import the (patched) kernel file by path, with vLLM's own imports resolving to the installed vLLM."""
    spec = importlib.util.spec_from_file_location(TARGET_MODULE_NAME, path)
    if spec is None or spec.loader is None:
        raise RuntimeError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[TARGET_MODULE_NAME] = module
    spec.loader.exec_module(module)
    for name in ("_get_tile_size", "_t4serve_unclamped_get_tile_size", "T4SERVE_SHARED_MEMORY_OVERRIDE"):
        if not hasattr(module, name):
            raise RuntimeError(f"{path} has no {name}: the clamp is not applied")
    return module


@dataclass
class Launch:
    kernel: str
    # The real `@triton.jit` function, for compiling the launch.
    jit_fn: Any
    grid: Any
    kwargs: dict[str, Any]
    options: dict[str, Any]


class Recorder:
    """Stands in for a `@triton.jit` kernel in the target module: records each `kernel[grid](**kwargs)` launch and,
    when `launch` is set, forwards it to the real kernel."""

    def __init__(self, name: str, real: Any, launches: list[Launch], launch: bool) -> None:
        self.name = name
        self.real = real
        self.launches = launches
        self.launch = launch

    def __getitem__(self, grid: Any) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            # Launch options (num_warps, num_stages) are not kernel parameters: keep them aside for the compile.
            signature = inspect.signature(self.real.fn)
            params = {k: v for k, v in kwargs.items() if k in signature.parameters}
            options = {k: v for k, v in kwargs.items() if k not in signature.parameters}
            bound = signature.bind_partial(*args, **params)
            self.launches.append(Launch(self.name, self.real, grid, dict(bound.arguments), options))
            if self.launch:
                return self.real[grid](*args, **kwargs)
            return None

        return call


@contextmanager
def recording(
    module: Any, *, launch: bool, kernels: tuple[str, ...] = ("kernel_unified_attention", "reduce_segments")
) -> Iterator[list[Launch]]:
    """The module's `kernels` replaced by Recorders for the block; yields the launches they record."""
    launches: list[Launch] = []
    originals = {name: getattr(module, name) for name in kernels}
    try:
        for name, real in originals.items():
            setattr(module, name, Recorder(name, real, launches, launch))
        yield launches
    finally:
        for name, real in originals.items():
            setattr(module, name, real)


@contextmanager
def shared_memory(module: Any, limit: int | None) -> Iterator[None]:
    previous = module.T4SERVE_SHARED_MEMORY_OVERRIDE
    module.T4SERVE_SHARED_MEMORY_OVERRIDE = limit
    try:
        yield
    finally:
        module.T4SERVE_SHARED_MEMORY_OVERRIDE = previous


@contextmanager
def unpatched(module: Any) -> Iterator[None]:
    """vLLM's own tile choice in place of the clamp, for the figure that shows the clamp mattered."""
    clamped = module._get_tile_size
    module._get_tile_size = module._t4serve_unclamped_get_tile_size
    try:
        yield
    finally:
        module._get_tile_size = clamped


@dataclass
class Batch:
    """A paged-KV attention batch as vLLM's triton backend passes it, plus what the reference needs."""

    head_size: int
    window: int
    block_size: int
    context_lens: list[int]
    query_lens: list[int]
    tensors: dict[str, Any]

    @property
    def decode(self) -> bool:
        return max(self.query_lens) == 1


def make_batch(
    torch: Any, head_size: int, window: int, block_size: int, context_lens: list[int], query_lens: list[int], seed: int
) -> Batch:
    """Random fp16 queries and KV cache in shuffled physical blocks (a non-trivial block table)."""
    generator = torch.Generator().manual_seed(seed)
    seq_lens = [c + q for c, q in zip(context_lens, query_lens, strict=True)]
    blocks_per_seq = [math.ceil(s / block_size) for s in seq_lens]
    max_blocks = max(blocks_per_seq)
    num_blocks = sum(blocks_per_seq) + 3  # spare blocks that no sequence owns, so wrong reads show
    order = torch.randperm(num_blocks, generator=generator)
    block_table = torch.zeros((len(seq_lens), max_blocks), dtype=torch.int32)
    used = 0
    for i, n in enumerate(blocks_per_seq):
        block_table[i, :n] = order[used : used + n].to(torch.int32)
        used += n
    shape = (num_blocks, block_size, NUM_KV_HEADS, head_size)
    key_cache = torch.randn(shape, generator=generator).to(torch.float16)
    value_cache = torch.randn(shape, generator=generator).to(torch.float16)
    num_tokens = sum(query_lens)
    query = torch.randn((num_tokens, NUM_QUERY_HEADS, head_size), generator=generator).to(torch.float16)
    cu = [0]
    for q in query_lens:
        cu.append(cu[-1] + q)
    tensors = {
        "q": query,
        "k": key_cache,
        "v": value_cache,
        "out": torch.zeros_like(query),
        "cu_seqlens_q": torch.tensor(cu, dtype=torch.int32),
        "seqused_k": torch.tensor(seq_lens, dtype=torch.int32),
        "block_table": block_table,
    }
    return Batch(head_size, window, block_size, context_lens, query_lens, tensors)


def run_unified_attention(module: Any, torch: Any, batch: Batch, **cache: Any) -> Any:
    """vLLM's `unified_attention` on the batch as its Triton backend calls it; `cache` replaces the batch's 16-bit
    `k` and `v` and adds the quantized cache's arguments (`kv_quant_mode`, `k_scale_cache`, `v_scale_cache`)."""
    t = batch.tensors
    padded = padded_head_size(batch.head_size)
    num_tokens = t["q"].shape[0]
    device = t["q"].device
    split = {}
    if batch.decode:
        # vLLM's backend hands the 3D kernel these scratch buffers; with them a decode batch takes the 3D path.
        split = {
            "seq_threshold_3D": SEQ_THRESHOLD_3D,
            "num_par_softmax_segments": NUM_SEGMENTS,
            "softmax_segm_output": torch.empty((num_tokens, NUM_QUERY_HEADS, NUM_SEGMENTS, padded), device=device),
            "softmax_segm_max": torch.empty((num_tokens, NUM_QUERY_HEADS, NUM_SEGMENTS), device=device),
            "softmax_segm_expsum": torch.empty((num_tokens, NUM_QUERY_HEADS, NUM_SEGMENTS), device=device),
        }
    arguments = dict(
        q=t["q"],
        k=t["k"],
        v=t["v"],
        out=t["out"],
        cu_seqlens_q=t["cu_seqlens_q"],
        max_seqlen_q=max(batch.query_lens),
        seqused_k=t["seqused_k"],
        # From the batch's own lengths, not the tensor: no device-to-host copy, so a CUDA graph can capture the call.
        max_seqlen_k=max(c + q for c, q in zip(batch.context_lens, batch.query_lens, strict=True)),
        softmax_scale=batch.head_size**-0.5,
        causal=True,
        # vLLM's backend passes (window - 1, 0) for a sliding layer and (-1, -1) for global attention.
        window_size=(batch.window - 1, 0) if batch.window else (-1, -1),
        block_table=t["block_table"],
        softcap=0,
        q_descale=None,
        k_descale=None,
        v_descale=None,
        **split,
    ) | cache
    module.unified_attention(**arguments)
    return t["out"]


def reference_attention(torch: Any, batch: Batch) -> Any:
    """Causal (and sliding-window) attention in float32 over the same paged cache, one sequence at a time, on the
    device the batch is on."""
    t = batch.tensors
    device = t["q"].device
    out = torch.zeros(t["q"].shape, dtype=torch.float32, device=device)
    scale = batch.head_size**-0.5
    start = 0
    for i, (context, qlen) in enumerate(zip(batch.context_lens, batch.query_lens, strict=True)):
        seq_len = context + qlen
        blocks = t["block_table"][i, : math.ceil(seq_len / batch.block_size)].long()
        keys = t["k"][blocks].reshape(-1, NUM_KV_HEADS, batch.head_size)[:seq_len].float()
        values = t["v"][blocks].reshape(-1, NUM_KV_HEADS, batch.head_size)[:seq_len].float()
        query = t["q"][start : start + qlen].float()
        query_pos = torch.arange(context, seq_len, device=device)[:, None]
        key_pos = torch.arange(seq_len, device=device)[None, :]
        allowed = key_pos <= query_pos
        if batch.window:
            allowed &= (query_pos - key_pos) < batch.window
        group = NUM_QUERY_HEADS // NUM_KV_HEADS
        for h in range(NUM_QUERY_HEADS):
            scores = query[:, h, :] @ keys[:, h // group, :].T * scale
            scores = scores.masked_fill(~allowed, float("-inf"))
            out[start : start + qlen, h, :] = torch.softmax(scores, dim=-1) @ values[:, h // group, :]
        start += qlen
    return out


def launch_label(launch: Launch) -> str:
    k = launch.kwargs
    head = k["HEAD_SIZE"]
    tile = k["TILE_SIZE"]
    if launch.kernel == "reduce_segments":
        return f"reduce/decode/head{head}/tile{tile}"
    phase = "decode" if k["IS_3D"] else "prefill"
    return f"{'3d' if k['IS_3D'] else '2d'}/{phase}/head{head}/tile{tile}"


def compile_launch(launch: Launch, target: Any) -> Any:
    """Compile a recorded launch for `target` the way Triton's launcher would (same binder, same specialisation, the
    launch's own options) and return Triton's CompiledKernel (its metadata and its asm: ttgir, ptx, cubin)."""
    import triton
    from triton.compiler import ASTSource
    from triton.compiler.compiler import make_backend
    from triton.runtime.jit import create_function_from_signature

    jit_fn = launch.jit_fn
    backend = make_backend(target)
    binder = create_function_from_signature(jit_fn.signature, jit_fn.params, backend)
    kwargs = launch.kwargs | launch.options
    kwargs.setdefault("debug", bool(jit_fn.debug))
    bound_args, specialization, options = binder(**kwargs)
    options, signature, constexprs, attrs = jit_fn._pack_args(backend, kwargs, bound_args, specialization, options)
    return triton.compile(ASTSource(jit_fn, signature, constexprs, attrs), target=target, options=options.__dict__)


def compile_shared_memory(launch: Launch, target: Any) -> tuple[int, float]:
    """A recorded launch's shared memory (bytes) compiled for `target`, and the seconds the compile took. Registers
    are known only once a driver loads the binary."""
    started = time.monotonic()
    kernel = compile_launch(launch, target)
    return int(kernel.metadata.shared), time.monotonic() - started


def e2b_batches(torch: Any, head_size: int, window: int, block_size: int, seed: int) -> dict[str, Batch]:
    return {
        # Mixed prefill: a fresh prompt, a chunk on top of cached context, a short chunk: the 2D kernel.
        "prefill": make_batch(torch, head_size, window, block_size, [0, 13, 30], [20, 9, 5], seed),
        # Decode: one new token per sequence over different context lengths: the 3D kernel plus the reduce.
        "decode": make_batch(torch, head_size, window, block_size, [40, 17, 33], [1, 1, 1], seed + 1),
    }


def mode_compile(module: Any, limit: int, capability: tuple[int, int]) -> dict[str, Any]:
    import torch
    from triton.backends.compiler import GPUTarget

    target = GPUTarget("cuda", capability[0] * 10 + capability[1], 32)
    shared: dict[str, int] = {}
    say(
        f"step 2: vLLM's kernels for Gemma 4 E2B, compiled for {target.backend} sm_{target.arch} "
        f"(opt-in shared memory per block {limit:,} B)"
    )
    for layer, head, window, block in E2B_LAYERS:
        for phase, batch in e2b_batches(torch, head, window, block, seed=head).items():
            with shared_memory(module, limit), recording(module, launch=False) as launches:
                run_unified_attention(module, torch, batch)
            expected_3d = phase == "decode"
            for launch in launches:
                if launch.kernel == "kernel_unified_attention" and bool(launch.kwargs["IS_3D"]) != expected_3d:
                    raise RuntimeError(
                        f"{layer} {phase}: vLLM launched IS_3D={launch.kwargs['IS_3D']}, "
                        f"expected {expected_3d}; the proof's batch no longer takes that path"
                    )
                label = launch_label(launch)
                need, seconds = compile_shared_memory(launch, target)
                shared[label] = need
                say(f"  {label:<30} {layer:<7} window {window or '-':<4} {need:>8,} B  ({seconds:.1f} s)")
    with shared_memory(module, limit), unpatched(module), recording(module, launch=False) as launches:
        _, head, window, block = E2B_LAYERS[1]
        run_unified_attention(module, torch, e2b_batches(torch, head, window, block, seed=head)["prefill"])
    [unclamped] = [x for x in launches if x.kernel == "kernel_unified_attention"]
    unpatched_need, seconds = compile_shared_memory(unclamped, target)
    say(f"  {'unpatched ' + launch_label(unclamped):<30} global  window -    {unpatched_need:>8,} B  ({seconds:.1f} s)")
    decisions = decision_table(module)
    return {
        "target": f"cuda:{target.arch}",
        "shared_memory": shared,
        "unpatched_label": launch_label(unclamped),
        "unpatched_shared_memory": unpatched_need,
        **decisions,
    }


def decision_table(module: Any) -> dict[str, Any]:
    """Step 4: with enough shared memory the clamp must return vLLM's own tile for every combination; at the T4's
    65,536 B it must change exactly the 16-bit-or-wider head-512 tiles above 16."""
    unclamped = module._t4serve_unclamped_get_tile_size
    combos = [(h, w, e, p) for h in HEAD_SIZES for w in SLIDING_WINDOWS for e in ELEMENT_SIZES for p in (True, False)]
    differing: list[str] = []
    checked = 0
    for limit in ENOUGH_SHARED_MEMORY:
        with shared_memory(module, limit):
            for combo in combos:
                checked += 1
                if module._get_tile_size(*combo) != unclamped(*combo):
                    differing.append(f"{limit}:{combo}")
    changed_on_t4: list[str] = []
    # The window never enters the clamp's decision: the summary lists each changed (head, element, phase) once.
    changed_kinds: set[str] = set()
    with shared_memory(module, 65_536):
        for head, window, element, prefill in combos:
            before = unclamped(head, window, element, prefill)
            after = module._get_tile_size(head, window, element, prefill)
            if before != after:
                phase = "prefill" if prefill else "decode"
                changed_on_t4.append(f"head {head} window {window} element {element} {phase}: {before} -> {after}")
                changed_kinds.add(f"head {head} element {element} {phase}: {before} -> {after}")
    say(
        f"step 4: tile choice with >= 98,304 B: {checked} combinations "
        f"({len(HEAD_SIZES)} heads x {len(SLIDING_WINDOWS)} windows x {len(ELEMENT_SIZES)} element sizes x "
        f"prefill/decode x {len(ENOUGH_SHARED_MEMORY)} devices), {len(differing)} differ from vLLM's own"
    )
    say(f"  at 65,536 B the clamp changes {len(changed_on_t4)} of {len(combos)}: " + "; ".join(sorted(changed_kinds)))
    return {"decisions_checked": checked, "decisions_differing": differing, "changed_on_t4": changed_on_t4}


def mode_interpret(module: Any, limit: int) -> dict[str, Any]:
    import torch

    # The interpreter evaluates both sides of the kernels' tl.where (e.g. 0/0 for rows the mask drops) in numpy;
    # those values are discarded, and the comparison with the reference is what judges the result.
    warnings.filterwarnings("ignore", category=RuntimeWarning, module="triton.runtime.interpreter")

    say(
        f"step 3: vLLM's unified_attention under TRITON_INTERPRET=1 vs float32 reference "
        f"(shared memory per block {limit:,} B)"
    )
    cases: list[dict[str, Any]] = []
    for layer, head, _window, block in E2B_LAYERS:
        # A small window so the sliding mask bites within tens of tokens (E2B's 512 would never cut in here).
        window = 16 if layer == "sliding" else 0
        for phase, batch in e2b_batches(torch, head, window, block, seed=head + 7).items():
            started = time.monotonic()
            with shared_memory(module, limit), recording(module, launch=True) as launches:
                result = run_unified_attention(module, torch, batch)
            elapsed = time.monotonic() - started
            error = float((result.float() - reference_attention(torch, batch)).abs().max())
            labels = [launch_label(x) for x in launches]
            say(
                f"  {layer:<7} head {head} window {window or '-':<3} {phase:<7} {labels}: max |error| {error:.2e} "
                f"({elapsed:.1f} s)"
            )
            cases.append(
                {
                    "layer": layer,
                    "phase": phase,
                    "head": head,
                    "window": window,
                    "launches": labels,
                    "max_abs_error": error,
                    "seconds": elapsed,
                }
            )
    return {"cases": cases, "max_abs_error": max(c["max_abs_error"] for c in cases)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m t4serve.patch")
    parser.add_argument("mode", choices=("compile", "interpret"))
    parser.add_argument("target", type=Path, help="the patched triton_unified_attention.py")
    parser.add_argument("--shared-memory", type=int, default=65_536, help="opt-in shared memory per block to assume")
    parser.add_argument("--capability", default="7.5", help="compute capability to compile for")
    args = parser.parse_args(argv)
    started = time.monotonic()
    module = load_target(args.target)
    say(f"  loaded {args.target} with vLLM's imports in {time.monotonic() - started:.1f} s")
    if args.mode == "compile":
        major, minor = (int(x) for x in args.capability.split("."))
        result = mode_compile(module, args.shared_memory, (major, minor))
    else:
        result = mode_interpret(module, args.shared_memory)
    result["seconds"] = time.monotonic() - started
    print(RESULT_PREFIX + json.dumps(result), flush=True)
    return 0
