"""The GPU memory vLLM 0.34 allocates for a checkpoint's weights on a Tesla T4, found without a GPU.

What is vLLM's own code: the engine config (`EngineArgs.create_engine_config`: dtype, quantization config, max
batched tokens), the model (`initialize_model`: the real Gemma 4 classes, each linear layer's quant method running
its `create_weights`; for compressed-tensors W4A16 `choose_mp_linear_kernel` picks the kernel for the stand-in T4's
capability 7.5, and the choice is captured from vLLM's own log line), and the post-load step the loader runs
(`model_loader.utils.process_weights_after_loading`: Marlin's repack and scale permutation, its empty zero-point
tensor, tied-embedding re-tying, attention post-processing; 0.33's Marlin kernel keeps no g_idx and takes its
workspace at run time, not at load). Everything is built on the meta device: shapes and dtypes are vLLM's, no bytes
are read or allocated.
What the oracle supplies itself: kv_oracle.py's stand-in T4 platform and kernel stubs; `.item()` on a meta tensor
answering 1.0 during post-processing (`meta_scalars`); and one shape rule: the compiled `gptq_marlin_repack` cannot
run without a GPU, so it is replaced by the output shape of vLLM's own fake (meta) implementation of that op in
vllm/_custom_ops.py, `(size_k // 16, size_n * 16 // (32 // num_bits))` int32. Weights are not loaded: by reading
the loader, `load_weights` copies into the tensors built here, so it changes no size (not executed here).

Bytes are counted per distinct storage (tied and shared tensors once) over parameters, buffers and plain tensor
attributes of modules, by part and dtype, before and after post-processing.

With `--mtp`, Gemma 4 E2B's drafter (google/gemma-4-E2B-it-assistant's test checkpoint) is built after the target as
vLLM's Gemma 4 speculator builds it (kv_oracle.build_drafter_model), given the target's embeddings by the speculator's
own `_share_embeddings`, post-processed, and counted apart: storage the target already holds (the shared embeddings,
a rotary cache vLLM's `get_rope` hands both) is not counted again.

    python tests/oracle/weights_oracle.py --e2b qat [--mtp]  # JSON on stdout
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import sys
import tempfile
import types
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
# Importing kv_oracle sets CUDA_VISIBLE_DEVICES empty and sends vLLM's log to stderr before vLLM is imported.
from kv_oracle import (
    T4_CAPABILITY,
    T4_NAME,
    LogCapture,
    answer_capability_probes,
    build_drafter_model,
    e2b_checkpoint,
    free_port,
    install_t4_platform,
    kernel_placeholders,
    oracle_parser,
    speculative_config,
    stub_cuda_extensions,
)

_LAYER = re.compile(r"\.layers\.(\d+)\.")


def part_of(name: str, tensor_name: str, kind: str) -> str:
    """The part of the model a tensor belongs to, in t4serve.probes.checkpoint's terms, from vLLM's module path; tensors
    the top-level model keeps as plain attributes (Gemma 4's per-layer-embedding input buffer) are "other"."""
    full = f"{name}.{tensor_name}" if name else tensor_name
    if not name and kind == "attribute":
        return "other"
    if "vision_tower" in full or "embed_vision" in full:
        return "vision_tower"
    if "audio_tower" in full or "embed_audio" in full:
        return "audio_tower"
    if tensor_name == "cos_sin_cache" or name.endswith("rotary_emb"):
        return "rotary"
    if "embed_tokens_per_layer" in full:
        return "per_layer_embedding"
    if "embed_tokens" in full:
        return "embedding"
    if "lm_head" in full:
        return "output_layer"
    if "per_layer" in full:
        return "per_layer_projection"
    if _LAYER.search(full) or full.startswith("language_model.model."):
        return "text_decoder"
    return "other"


def tensors(model: Any) -> Iterator[tuple[str, str, str, Any]]:
    """(module name, tensor name, kind, tensor) for every parameter, buffer and plain tensor attribute."""
    import torch

    for name, module in model.named_modules(remove_duplicate=False):
        for tensor_name, p in module._parameters.items():
            if p is not None:
                yield name, tensor_name, "parameter", p
        for tensor_name, b in module._buffers.items():
            if b is not None:
                yield name, tensor_name, "buffer", b
        for tensor_name, value in vars(module).items():
            if isinstance(value, torch.Tensor) and not isinstance(value, torch.nn.Parameter):
                yield name, tensor_name, "attribute", value


def tally(model: Any, seen: set[int] | None = None) -> dict[str, Any]:
    """Bytes per part, dtype and kind, each storage once (the first name that reaches it names its part; storage in
    `seen`, another model's, is skipped and `seen` grows). Only meta tensors count: they are what the loader would place
    on the GPU; vLLM's few explicit CPU tensors (the attention layers' host copies of their KV scales) are reported
    apart."""
    seen = set() if seen is None else seen
    cpu_bytes = 0
    by_part: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    by_kind: dict[str, int] = defaultdict(int)
    attributes: list[dict[str, Any]] = []
    buffers: dict[str, int] = defaultdict(int)
    total = 0
    for name, tensor_name, kind, t in tensors(model):
        storage = t.untyped_storage()
        key = storage._cdata
        if key in seen:
            continue
        seen.add(key)
        n = storage.nbytes()
        if not t.is_meta:
            cpu_bytes += n
            continue
        part = part_of(name, tensor_name, kind)
        by_part[part][str(t.dtype).removeprefix("torch.")] += n
        by_kind[kind] += n
        total += n
        if kind == "attribute" and n >= 4096:
            attributes.append({"name": f"{name}.{tensor_name}", "shape": list(t.shape),
                               "dtype": str(t.dtype).removeprefix("torch."), "bytes": n})
        if kind == "buffer":
            buffers[_LAYER.sub(".layers.N.", f"{name}.{tensor_name}")] += n
    return {
        "total_bytes": total,
        "by_kind": dict(by_kind),
        "by_part": {part: dict(d) for part, d in sorted(by_part.items())},
        "attributes_of_4_kib_or_more": attributes,
        "cpu_bytes": cpu_bytes,
        "buffers_of_4_kib_or_more": {k: v for k, v in sorted(buffers.items(), key=lambda kv: -kv[1]) if v >= 4096},
    }


def quantized_linears(model: Any) -> list[dict[str, Any]]:
    """Per quantized linear: vLLM's kernel config and Marlin's padded extents (vLLM's `marlin_padded_nk`)."""
    from vllm.model_executor.layers.quantization.utils.marlin_utils import marlin_padded_nk

    out = []
    for name, module in model.named_modules():
        kernel = getattr(getattr(module, "scheme", None), "kernel", None)
        if kernel is None:
            continue
        c = kernel.config
        size_k, size_n = c.partition_weight_shape
        out.append({"name": name, "kernel": type(kernel).__name__, "k": size_k, "n": size_n,
                    "group_size": c.group_size, "zero_points": c.zero_points,
                    "act_type": str(c.act_type).removeprefix("torch."),
                    "padded_nk": list(marlin_padded_nk(size_n, size_k, c.group_size))})
    return out


def marlin_repack_shape_rule() -> None:
    """Stand-in for the compiled gptq_marlin_repack: vLLM's own fake implementation's output shape and dtype."""
    import torch
    import vllm._custom_ops as ops

    def repack(b_q_weight: Any, size_k: int, size_n: int, num_bits: int, is_a_8bit: bool = False) -> Any:
        pack_factor = 32 // num_bits
        marlin_tile_size = 16
        return torch.empty((size_k // marlin_tile_size, size_n * marlin_tile_size // pack_factor),
                           dtype=b_q_weight.dtype, device=b_q_weight.device)

    ops.gptq_marlin_repack = repack


@contextlib.contextmanager
def meta_scalars() -> Iterator[None]:
    """During post-processing only: `.item()` on a meta tensor answers 1.0. Attention layers read their (placeholder)
    KV scales into Python floats (`CompressedTensorsKVCacheMethod.process_weights_after_loading`); a Python float
    holds no GPU memory, and meta tensors have no value to read."""
    import torch

    original = torch.Tensor.item

    def item(self: Any) -> Any:
        return 1.0 if self.is_meta else original(self)

    torch.Tensor.item = item  # type: ignore[method-assign]
    try:
        yield
    finally:
        torch.Tensor.item = original  # type: ignore[method-assign]


def weights_for(model: str, dtype: str, max_model_len: int,
                speculative_config: dict[str, Any] | None = None) -> dict[str, Any]:
    import torch
    from vllm.config import set_current_vllm_config
    from vllm.distributed import ensure_model_parallel_initialized, init_distributed_environment
    from vllm.distributed.parallel_state import model_parallel_is_initialized
    from vllm.engine.arg_utils import EngineArgs
    from vllm.model_executor.model_loader.utils import initialize_model, process_weights_after_loading
    from vllm.utils.torch_utils import set_default_torch_dtype

    args = EngineArgs(model=model, dtype=dtype, max_model_len=max_model_len, load_format="dummy",
                      speculative_config=speculative_config)
    config = args.create_engine_config()
    capture = LogCapture()
    logging.getLogger("vllm").addHandler(capture)
    with set_current_vllm_config(config):
        if not model_parallel_is_initialized():
            init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo",
                                         distributed_init_method=f"tcp://127.0.0.1:{free_port()}")
            ensure_model_parallel_initialized(1, 1, backend="gloo")
        with kernel_placeholders(), set_default_torch_dtype(config.model_config.dtype), torch.device("meta"):
            built = initialize_model(vllm_config=config)
            constructed = tally(built)
            linears = quantized_linears(built)
            with meta_scalars():
                process_weights_after_loading(built, config.model_config, torch.device("meta"))
            seen: set[int] = set()
            processed = tally(built, seen)
        drafter = None
        if speculative_config is not None:
            drafter = drafter_weights(config, built, seen)
    logging.getLogger("vllm").removeHandler(capture)
    kernels = sorted({line for line in capture.lines if "CompressedTensorsWNA16" in line or "mixed-precision" in line})
    return {
        "model_class": type(built).__name__,
        "dtype": str(config.model_config.dtype).removeprefix("torch."),
        "quantization": config.model_config.quantization,
        "max_num_batched_tokens": config.scheduler_config.max_num_batched_tokens,
        "kernel_log": kernels,
        "quantized_linears": len(linears),
        "kernels": sorted({entry["kernel"] for entry in linears}),
        "padded_linears": [e for e in linears if e["padded_nk"] != [e["n"], e["k"]]],
        "constructed": constructed,
        "after_process_weights": processed,
        "drafter": drafter,
    }


def drafter_weights(config: Any, target: Any, seen: set[int]) -> dict[str, Any]:
    """The drafter's own bytes once built beside `target` (inside `set_current_vllm_config`), as
    `Gemma4Speculator.load_draft_model` leaves it: built, its embeddings replaced by the target's, post-processed."""
    import torch
    from vllm.model_executor.model_loader.utils import process_weights_after_loading
    from vllm.utils.torch_utils import set_default_torch_dtype
    from vllm.v1.worker.gpu.spec_decode.gemma4.speculator import Gemma4Speculator

    draft, layers = build_drafter_model(config)
    constructed = tally(draft, set(seen))
    speculator = types.SimpleNamespace(vllm_config=config, speculative_config=config.speculative_config)
    Gemma4Speculator._share_embeddings(speculator, draft, target)
    with (kernel_placeholders(), set_default_torch_dtype(config.model_config.dtype), torch.device("meta"),
          meta_scalars()):
        process_weights_after_loading(draft, config.speculative_config.draft_model_config, torch.device("meta"))
    return {"model_class": type(draft).__name__, "attention_layers": len(layers), "constructed": constructed,
            "after_share_and_process": tally(draft, seen)}


def main(argv: list[str] | None = None) -> int:
    parser = oracle_parser(__doc__.splitlines()[0])
    parser.add_argument("--max-model-len", type=int, default=16384)
    parser.add_argument("--mtp", action="store_true", help="also Gemma 4 E2B's MTP drafter")
    parser.add_argument("--num-speculative-tokens", type=int, default=2)
    args = parser.parse_args(argv)

    out = sys.stdout
    sys.stdout = sys.stderr
    stub_cuda_extensions()
    install_t4_platform()
    answer_capability_probes()
    marlin_repack_shape_rule()
    import vllm

    with tempfile.TemporaryDirectory(prefix="weights-oracle-") as scratch:
        model = args.model or e2b_checkpoint(args.e2b, str(Path(scratch) / "model"))
        speculative = speculative_config("mtp", args.num_speculative_tokens, scratch) if args.mtp else None
        result = weights_for(model, args.dtype, args.max_model_len, speculative)
    json.dump({"vllm_version": vllm.__version__, "platform": f"stand-in {T4_NAME} {T4_CAPABILITY}", **result},
              out, indent=1)
    out.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
