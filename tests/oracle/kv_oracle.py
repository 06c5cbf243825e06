"""The KV cache figures vLLM itself computes for a checkpoint on a Tesla T4, run on a machine without a GPU.

What is vLLM's own code: the engine config (`EngineArgs.create_engine_config`: dtype, block size, the Triton backend
Gemma 4 forces, max_num_batched_tokens, async scheduling, whether the extensible KV cache is on), the model
(`initialize_model` builds the real model class with its real `Attention` layers, KV sharing included, on the meta
device), the per-layer specs (the GPU model runner's `get_kv_cache_spec`, vLLM 0.34's `vllm.v1.worker.gpu`), the layout
(`resolve_kv_cache_layout`), and everything after: grouping and page unification (`get_global_kv_cache_groups`),
blocks (`get_kv_cache_configs`, which also refuses a pool that cannot hold one max-length request), the scheduler's
config and `update_kv_cache_capacity`, whose log line is captured.
What the oracle supplies itself: a stand-in CUDA platform describing a T4 (capability 7.5, 15,360 MiB), the pool
size (given, as `--kv-cache-memory-bytes` does, instead of profiled: the engine config gets the largest pool as its
`kv_cache_memory_bytes`, as t4serve's plan passes one), the block size t4serve passes (16 unless told), and
placeholders for the compiled kernels that cannot load without libcuda (each stub below says why). It re-traces two
steps of EngineCore._initialize_kv_caches in its own lines (the calls in order, the scheduler's block size) and
evaluates per group the expression vLLM's `get_max_concurrency_for_kv_cache_config` sums, to show each group's share.
It never states an expected figure.

    python tests/oracle/kv_oracle.py --e2b bf16 --max-model-len 16384 --pool 3040935936   # JSON on stdout
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib.util
import json
import logging
import os
import re
import socket
import sys
import tempfile
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

# The oracle must never touch a GPU, and vllm.triton_utils needs the variable empty (not unset) to stay quiet.
os.environ["CUDA_VISIBLE_DEVICES"] = ""
# vLLM logs to stdout by default; stdout carries the JSON.
os.environ["VLLM_LOGGING_STREAM"] = "ext://sys.stderr"

T4_CAPABILITY = (7, 5)
T4_NAME = "Tesla T4"
T4_MEMORY_BYTES = 15360 * 1024**2  # published-t4-run.md: 15360 MiB
GRID_NAMESPACES = ("_C", "_moe_C", "_C_cache_ops", "_C_custom_ar")


def stub_cuda_extensions() -> None:
    """Stand-ins for vLLM's compiled CUDA extensions, which link libcuda.so.1 and cannot load on a GPU-less machine.

    Stub 1: `vllm._C_stable_libtorch` and `vllm._moe_C_stable_libtorch` (imported by vllm/platforms/cuda.py only to
    register kernels) become empty modules. Stub 2: `vllm.vllm_flash_attn` (the FlashAttention kernels) becomes a
    module whose kernel functions raise, and whose version checks answer what vllm_flash_attn's own
    `_is_fa{2,3,4}_supported` answer on the stand-in GPU with the image's files: FA2 where its extension file is in the
    image and the capability is 8.0 or more, FA3 where its extension is there on 9.x, FA4 where its cute interface is
    there on 9.x, 10.x or 11.x. Stub 3 (`answer_capability_probes`): the cutlass capability probes vLLM calls at import
    time answer False. No KV figure passes through any of them; they decide which attention backend vLLM picks.
    """
    for name in ("vllm._C_stable_libtorch", "vllm._moe_C_stable_libtorch"):
        sys.modules[name] = types.ModuleType(name)
    flash = types.ModuleType("vllm.vllm_flash_attn")

    def no_flash_attention(*args: object, **kwargs: object) -> None:
        raise RuntimeError("kv_oracle: FlashAttention kernels are not loaded (no GPU)")

    for name in ("compile_flash_attn_varlen_func_from_specs", "flash_attn_varlen_func", "get_scheduler_metadata"):
        setattr(flash, name, no_flash_attention)
    flash.fa_version_unsupported_reason = fa_version_unsupported_reason
    flash.is_fa_version_supported = lambda version: fa_version_unsupported_reason(version) is None
    # vllm/v1/attention/backends/fa_utils.py asks the interface submodule; it answers the same.
    interface = types.ModuleType("vllm.vllm_flash_attn.flash_attn_interface")
    for name in ("compile_flash_attn_varlen_func_from_specs", "flash_attn_varlen_func", "get_scheduler_metadata",
                 "fa_version_unsupported_reason", "is_fa_version_supported"):
        setattr(interface, name, getattr(flash, name))
    flash.flash_attn_interface = interface
    sys.modules["vllm.vllm_flash_attn"] = flash
    sys.modules["vllm.vllm_flash_attn.flash_attn_interface"] = interface


def _flash_attn_files() -> Path:
    spec = importlib.util.find_spec("vllm")
    assert spec is not None and spec.origin is not None
    return Path(spec.origin).parent / "vllm_flash_attn"


def fa_version_unsupported_reason(version: int) -> str | None:
    """vllm_flash_attn/flash_attn_interface.py's `_is_fa{N}_supported`, with availability read off the image's files
    (their import needs libcuda) and the capability off the stand-in platform."""
    from vllm.platforms import current_platform

    files = _flash_attn_files()
    if version == 2:
        if not list(files.glob("_vllm_fa2_C*.so")):
            return "FA2 is unavailable: no _vllm_fa2_C in the image"
        return None if current_platform.has_device_capability(80) else "FA2 needs compute capability >= 8"
    if version == 3:
        if not list(files.glob("_vllm_fa3_C*.so")):
            return "FA3 is unavailable: no _vllm_fa3_C in the image"
        return None if current_platform.is_device_capability_family(90) else "FA3 needs compute capability 9.x"
    if version == 4:
        if not (files / "cute" / "interface.py").exists():
            return "FA4 is unavailable: no cute interface in the image"
        if any(current_platform.is_device_capability_family(f) for f in (90, 100, 110)):
            return None
        return "FA4 needs compute capability 9.x, 10.x or 11.x"
    raise ValueError(f"Unsupported FA version: {version}")


def answer_capability_probes() -> None:
    """Stub 3 (after the platform is in place, since vllm._custom_ops reads it on import)."""
    import vllm._custom_ops as ops

    for probe in (
        "cutlass_scaled_mm_supports_fp8",
        "cutlass_scaled_mm_supports_block_fp8",
        "cutlass_group_gemm_supported",
        "cutlass_scaled_mm_supports_fp4",
    ):
        setattr(ops, probe, lambda *args, **kwargs: False)


@dataclasses.dataclass
class StandInGpu:
    """The GPU the stand-in platform describes; `install_platform` sets it, and may change it between runs."""

    name: str = T4_NAME
    capability: tuple[int, int] = T4_CAPABILITY
    memory_bytes: int = T4_MEMORY_BYTES


STAND_IN = StandInGpu()


def install_platform(name: str, capability: tuple[int, int], memory_bytes: int) -> None:
    """vLLM's CUDA platform with the device queries answered for the GPU described instead of by NVML or the CUDA
    runtime (its name, capability and total memory: what sets vLLM's batch defaults, dtypes and attention backends).

    Without a GPU vLLM resolves `UnspecifiedPlatform`; the planner and the backend selector need the CUDA platform.
    Called again, the same platform object describes the new GPU (modules hold it from their imports).
    """
    import vllm.platforms
    from vllm.platforms.cuda import NonNvmlCudaPlatform
    from vllm.platforms.interface import DeviceCapability

    STAND_IN.name, STAND_IN.capability, STAND_IN.memory_bytes = name, (capability[0], capability[1]), memory_bytes
    if isinstance(getattr(vllm.platforms, "_current_platform", None), NonNvmlCudaPlatform):
        return

    class StandInPlatform(NonNvmlCudaPlatform):  # type: ignore[misc]  # vLLM is untyped to mypy here
        @classmethod
        def get_device_capability(cls, device_id: int = 0) -> DeviceCapability:
            return DeviceCapability(*STAND_IN.capability)

        @classmethod
        def get_device_name(cls, device_id: int = 0) -> str:
            return STAND_IN.name

        @classmethod
        def get_device_total_memory(cls, device_id: int = 0) -> int:
            return STAND_IN.memory_bytes

    vllm.platforms.current_platform = StandInPlatform()


def install_t4_platform() -> None:
    """The stand-in platform describing a Tesla T4 (capability 7.5, 15,360 MiB)."""
    install_platform(T4_NAME, T4_CAPABILITY, T4_MEMORY_BYTES)


@contextlib.contextmanager
def kernel_placeholders() -> Iterator[None]:
    """Stub 4, only while the model is built: layers look their kernels up in `torch.ops._C` at construction (for
    example `GeluAndMul` keeps `torch.ops._C.gelu_tanh_and_mul`); with the extension not loaded the lookup fails. A
    missing op becomes a placeholder that raises if called; building the model on the meta device calls none."""
    import torch._ops

    original = torch._ops._OpNamespace.__getattr__

    class MissingKernel:
        def __init__(self, name: str) -> None:
            self.name = name

        def __call__(self, *args: object, **kwargs: object) -> None:
            raise RuntimeError(f"kv_oracle: kernel {self.name} is not loaded (no GPU)")

        def __getattr__(self, attr: str) -> MissingKernel:
            if attr.startswith("__"):
                raise AttributeError(attr)
            return MissingKernel(f"{self.name}.{attr}")

    def lookup(namespace: Any, name: str) -> Any:
        try:
            return original(namespace, name)
        except AttributeError:
            if namespace.name in GRID_NAMESPACES and not name.startswith("__"):
                return MissingKernel(f"torch.ops.{namespace.name}.{name}")
            raise

    torch._ops._OpNamespace.__getattr__ = lookup
    try:
        yield
    finally:
        torch._ops._OpNamespace.__getattr__ = original


class LogCapture(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def spec_json(spec: Any) -> dict[str, Any]:
    return {
        "type": type(spec).__name__,
        "block_size": spec.block_size,
        "page_size_bytes": spec.page_size_bytes,
        "num_kv_heads": spec.num_kv_heads,
        "head_size": spec.head_size,
        "head_size_v": spec.head_size_v,
        "dtype": str(spec.dtype).removeprefix("torch."),
        "sliding_window": getattr(spec, "sliding_window", None),
    }


# vLLM's refusal of a pool too small for one max-length request names the length that would fit.
ESTIMATE = re.compile(r"estimated maximum model length is (\d+)")


def plan_pools(config: Any, kv_cache_specs: list[dict[str, Any]], global_groups: Any,
               pools: list[int]) -> list[dict[str, Any]]:
    """For each pool size, what vLLM's planner makes of it (inside the caller's `set_current_vllm_config`):
    get_kv_cache_configs (or its refusal, with the largest length it names), the scheduler's config, the groups and
    each one's blocks per max-length request, then `update_kv_cache_capacity` with the log line it writes."""
    from vllm.model_executor.models.utils import extract_layer_index
    from vllm.utils.math_utils import cdiv
    from vllm.v1.core.kv_cache_planning import _pool_bytes_per_block, get_kv_cache_configs
    from vllm.v1.core.kv_cache_utils import generate_scheduler_kv_cache_config, update_kv_cache_capacity

    capture = LogCapture()
    logging.getLogger("vllm.v1.core.kv_cache_utils").addHandler(capture)
    results = []
    try:
        for pool in pools:
            result: dict[str, Any] = {"pool_bytes": pool}
            try:
                worker_configs = get_kv_cache_configs(config, kv_cache_specs, [pool], global_groups)
            except ValueError as exc:  # vLLM's "not enough KV cache memory" refusal
                found = ESTIMATE.search(str(exc))
                result.update(fits=False, error=str(exc).splitlines()[0],
                              estimated_max_model_len=int(found.group(1)) if found else 0)
                results.append(result)
                continue
            scheduler = generate_scheduler_kv_cache_config(worker_configs)
            groups = [
                {
                    "layers": [extract_layer_index(n) for n in g.layer_names],
                    **spec_json(g.kv_cache_spec),
                    # The expression `get_max_concurrency_for_kv_cache_config` sums over the groups.
                    "blocks_per_request": cdiv(g.kv_cache_spec.max_memory_usage_bytes(config),
                                               g.kv_cache_spec.page_size_bytes),
                }
                for g in scheduler.kv_cache_groups
            ]
            # EngineCore._initialize_kv_caches: the scheduler's block size (the smallest of the groups that take
            # part in prefix caching, else of all), then the capacity it logs.
            participating = [g.kv_cache_spec.block_size for g in scheduler.kv_cache_groups
                             if g.kv_cache_spec.prefix_cacheable]
            config.cache_config.block_size = min(participating or
                                                 [g.kv_cache_spec.block_size for g in scheduler.kv_cache_groups])
            del capture.lines[:]
            update_kv_cache_capacity(config, scheduler)
            result.update(
                fits=True,
                num_blocks=scheduler.num_blocks,
                # The divisor get_kv_cache_configs turned the pool into blocks with.
                bytes_per_block=_pool_bytes_per_block(config, worker_configs[0].kv_cache_groups),
                groups=groups,
                kv_cache_size_tokens=config.cache_config.kv_cache_size_tokens,
                max_concurrency=config.cache_config.kv_cache_max_concurrency,
                log=[line for line in capture.lines if "KV cache size" in line],
            )
            results.append(result)
    finally:
        logging.getLogger("vllm.v1.core.kv_cache_utils").removeHandler(capture)
    return results


def model_kv_specs(config: Any) -> tuple[dict[str, Any], dict[str, str], Any]:
    """What the engine core gathers from the model's layers once they are built (inside `set_current_vllm_config`):
    the per-layer specs from the GPU model runner's own `get_kv_cache_spec` (vLLM 0.34's `vllm.v1.worker.gpu`, on a
    stand-in `self` holding what it reads: the config, no draft-model speculator whose layers it would re-shard across
    context-parallel ranks, one such rank), the layers that read another's cache (`get_shared_kv_cache_layers`), and the
    layout `resolve_kv_cache_layout` picks from the workers' supported layouts."""
    from vllm.v1.attention.backends.utils import resolve_kv_cache_layout
    from vllm.v1.worker.gpu.attn_utils import get_shared_kv_cache_layers
    from vllm.v1.worker.gpu.model_runner import GPUModelRunner
    from vllm.v1.worker.worker_base import WorkerBase

    runner = types.SimpleNamespace(vllm_config=config, speculator=None, dcp_size=1)
    layer_specs: dict[str, Any] = GPUModelRunner.get_kv_cache_spec(runner)
    shared: dict[str, str] = get_shared_kv_cache_layers(config)
    layouts = WorkerBase.get_supported_kv_cache_layouts(runner)
    return layer_specs, shared, resolve_kv_cache_layout(config, [layouts], list(layer_specs.values()))


def build_drafter(config: Any) -> list[str]:
    return build_drafter_model(config)[1]


def build_drafter_model(config: Any) -> tuple[Any, list[str]]:
    """The speculative config's draft model, built as vLLM 0.34 builds it beside the target (inside the caller's
    `set_current_vllm_config`, after the target), on the meta device; returns the draft's attention layer names.

    Gemma 4's drafter (`Gemma4Speculator`): the speculator's own `_create_draft_vllm_config` (the target's forced
    Triton backend carried over), `initialize_model` of the draft model config under the draft's model tag (the loader's
    step, without weights), then the speculator's own `_setup_gemma4_kv_sharing`, which points each draft layer at the
    target's last layer of its attention type. A method with no draft model (n-gram) builds nothing. Any other draft
    model is reported, not built: t4serve sizes none."""
    import torch
    from vllm.compilation.backends import set_model_tag
    from vllm.config.vllm import get_layers_from_vllm_config
    from vllm.model_executor.layers.attention_layer_base import AttentionLayerBase
    from vllm.model_executor.model_loader.utils import initialize_model
    from vllm.utils.import_utils import resolve_obj_by_qualname
    from vllm.utils.torch_utils import set_default_torch_dtype
    from vllm.v1.worker.gpu.spec_decode.gemma4.speculator import Gemma4Speculator
    from vllm.v1.worker.gpu.spec_decode.speculator import DraftModelSpeculator

    spec = config.speculative_config
    if spec is None:
        return None, []
    cls = resolve_obj_by_qualname(spec.speculator_config.speculator_class)
    if not issubclass(cls, DraftModelSpeculator):
        return None, []
    if not issubclass(cls, Gemma4Speculator):
        raise NotImplementedError(f"kv_oracle builds Gemma 4's drafter only, not {cls.__name__}")
    target_layers = set(get_layers_from_vllm_config(config, AttentionLayerBase))
    speculator = types.SimpleNamespace(vllm_config=config, speculative_config=spec)
    draft_config = Gemma4Speculator._create_draft_vllm_config(speculator)
    with (set_model_tag("eagle_head"), kernel_placeholders(), set_default_torch_dtype(config.model_config.dtype),
          torch.device("meta")):
        model = initialize_model(vllm_config=draft_config, model_config=spec.draft_model_config)
    Gemma4Speculator._setup_gemma4_kv_sharing(speculator, model, target_layers)
    return model, sorted(set(get_layers_from_vllm_config(config, AttentionLayerBase)) - target_layers)


def figures_for_length(model: str, dtype: str, max_model_len: int, pools: list[int], block_size: int | None = 16,
                       speculative_config: dict[str, Any] | None = None) -> dict[str, Any]:
    """One engine config and model for `max_model_len`, then vLLM's planner for each pool. `block_size` None: vLLM's
    own default; `speculative_config`: as `--speculative-config` gives it."""
    import torch
    from vllm.config import set_current_vllm_config
    from vllm.distributed import ensure_model_parallel_initialized, init_distributed_environment
    from vllm.distributed.parallel_state import model_parallel_is_initialized
    from vllm.engine.arg_utils import EngineArgs
    from vllm.model_executor.model_loader.utils import initialize_model
    from vllm.model_executor.models.utils import extract_layer_index
    from vllm.utils.torch_utils import set_default_torch_dtype
    from vllm.v1.core.kv_cache_planning import get_global_kv_cache_groups

    # load_format dummy: no weights are read; the layers are built on the meta device. The largest pool as
    # kv_cache_memory_bytes, as t4serve passes one (it also settles the extensible KV cache: off).
    args = EngineArgs(model=model, dtype=dtype, max_model_len=max_model_len, load_format="dummy",
                      kv_cache_memory_bytes=max(pools), speculative_config=speculative_config,
                      **({"block_size": block_size} if block_size is not None else {}))
    config = args.create_engine_config()
    with set_current_vllm_config(config):
        if not model_parallel_is_initialized():
            # A one-process gloo group: the parallel linear layers ask their tensor-parallel rank and size.
            init_distributed_environment(
                world_size=1,
                rank=0,
                local_rank=0,
                backend="gloo",
                distributed_init_method=f"tcp://127.0.0.1:{free_port()}",
            )
            ensure_model_parallel_initialized(1, 1, backend="gloo")
        with kernel_placeholders(), set_default_torch_dtype(config.model_config.dtype), torch.device("meta"):
            initialize_model(vllm_config=config)
        draft_layers = build_drafter(config)
        layer_specs, shared, layout = model_kv_specs(config)
        kv_cache_specs = [layer_specs]
        global_groups = get_global_kv_cache_groups(config, kv_cache_specs)
        config.adjust_dcp_kv_cache_interleave_size(global_groups)

        layers = []
        for name in sorted(set(layer_specs) | set(shared) - set(draft_layers), key=extract_layer_index):
            entry: dict[str, Any] = {"name": name, "layer": extract_layer_index(name)}
            if name in shared:
                entry["shares_kv_with"] = shared[name]
                entry["shares_kv_with_layer"] = extract_layer_index(shared[name])
            else:
                entry.update(spec_json(layer_specs[name]))
            layers.append(entry)

        drafter = [{"name": name, "shares_kv_with": shared.get(name), "owns_kv": name in layer_specs}
                   for name in draft_layers]
        results = plan_pools(config, kv_cache_specs, global_groups, pools)

    return {
        "max_model_len": config.model_config.max_model_len,
        "dtype": str(config.model_config.dtype).removeprefix("torch."),
        "block_size": config.cache_config.block_size,
        "attention_backend": str(config.attention_config.backend),
        "kv_cache_layout": layout.name,
        "max_num_batched_tokens": config.scheduler_config.max_num_batched_tokens,
        "async_scheduling": bool(config.scheduler_config.async_scheduling),
        "max_in_flight_tokens": config.max_in_flight_tokens,
        "extensible_kv_cache": bool(config.cache_config.enable_extensible_kv_cache),
        "speculative_method": config.speculative_config.method if config.speculative_config else None,
        "num_speculative_tokens": config.num_speculative_tokens,
        "layers": layers,
        "drafter_layers": drafter,
        "pools": results,
    }


def e2b_checkpoint(kind: str, directory: str) -> str:
    """Gemma 4 E2B's config.json and safetensors headers, written by the unit tests' helper (data left sparse)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))
    from e2b_checkpoint import write_checkpoint  # type: ignore[import-not-found]  # found at run time

    write_checkpoint(directory, kind=kind)
    return directory


def e2b_assistant_checkpoint(directory: str) -> str:
    """google/gemma-4-E2B-it-assistant's config.json and safetensors header, by the unit tests' helper."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))
    from e2b_checkpoint import write_assistant_checkpoint  # type: ignore[import-not-found]  # found at run time

    write_assistant_checkpoint(directory)
    return directory


def speculative_config(kind: str, tokens: int, scratch: str) -> dict[str, Any] | None:
    """The `--speculative-config` asked for: none, Gemma 4 E2B's MTP drafter (its assistant checkpoint, as vLLM's
    recipe serves it), or vLLM's ngram_gpu."""
    if kind == "off":
        return None
    if kind == "ngram":
        return {"method": "ngram_gpu", "num_speculative_tokens": tokens}
    drafter = e2b_assistant_checkpoint(str(Path(scratch) / "assistant"))
    return {"method": "mtp", "model": drafter, "num_speculative_tokens": tokens}


def oracle_parser(description: str) -> argparse.ArgumentParser:
    """The arguments every oracle takes: the checkpoint (--model DIR or --e2b KIND) and vLLM's --dtype."""
    parser = argparse.ArgumentParser(description=description)
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--model", help="a checkpoint directory (config.json; weights are not read)")
    source.add_argument("--e2b", choices=("bf16", "qat"), help="write Gemma 4 E2B's test checkpoint and use it")
    parser.add_argument("--dtype", default="float16", help="vLLM --dtype (float16: what t4serve passes on a T4)")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = oracle_parser(__doc__.splitlines()[0])
    parser.add_argument("--max-model-len", type=int, action="append", required=True)
    parser.add_argument("--pool", type=int, action="append", required=True, help="KV cache pool in bytes")
    parser.add_argument("--block-size", default="16",
                        help="--block-size to pass (16: what t4serve passes), or `vllm` for vLLM's own default")
    parser.add_argument("--speculative", choices=("off", "mtp", "ngram"), default="off",
                        help="mtp: Gemma 4 E2B's drafter (its test checkpoint written beside the model); ngram: "
                             "vLLM's ngram_gpu")
    parser.add_argument("--num-speculative-tokens", type=int, default=2)
    args = parser.parse_args(argv)

    out = sys.stdout
    sys.stdout = sys.stderr  # anything vLLM prints stays off the JSON
    stub_cuda_extensions()
    install_t4_platform()
    answer_capability_probes()
    import vllm

    block_size = None if args.block_size == "vllm" else int(args.block_size)
    with tempfile.TemporaryDirectory(prefix="kv-oracle-") as scratch:
        model = args.model or e2b_checkpoint(args.e2b, str(Path(scratch) / "model"))
        speculative = speculative_config(args.speculative, args.num_speculative_tokens, scratch)
        runs = [figures_for_length(model, args.dtype, length, args.pool, block_size, speculative)
                for length in args.max_model_len]
    json.dump(
        {"vllm_version": vllm.__version__, "platform": f"stand-in {T4_NAME} {T4_CAPABILITY}", "runs": runs},
        out,
        indent=1,
    )
    out.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
