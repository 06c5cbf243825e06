"""How vLLM's Triton attention kernel is launched on a Turing GPU: the table, and the proxy that applies it.

`LAUNCHES` says, per attention path, phase (prefill: vLLM's 2D kernel; decode: the 3D split-KV kernel) and padded
head size, which warps, register cap and code generator (FMA for sm_75, or Triton's sm_80 tensor-core code lowered to
sm_75 by t4serve.turing.lowering) each launch gets, and for prefill the tile and query rows. The image build proves
every row (t4serve.turing.proof: fits 65,536 B of shared memory, no spills, tensor-core instructions where claimed).
`TuringLaunches` stands in for the kernel in vLLM's module and adds those options to each launch vLLM makes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

# The attention paths t4serve runs vLLM's Triton backend with. `triton`: vLLM's own launch (the kernel vLLM 0.33 runs
# on a T4 today). `turing-mma`: the launches below.
TRITON = "triton"
TURING_MMA = "turing-mma"
PATHS = (TURING_MMA, TRITON)
PREFILL = "prefill"
DECODE = "decode"
# vLLM's KV_QUANT_MODE values the table covers: 16-bit cache (0) and int8 per token and head (2).
KV_16BIT = 0
KV_INT8 = 2
KV_MODES = {KV_16BIT: "16-bit", KV_INT8: "int8"}
# The only pipeline depth Turing can take: Triton pipelines loads with cp.async (sm_80) at more than one stage.
TURING_STAGES = 1
# The code generator Triton is told to use for tensor cores (its mma path starts at 8.0); the lowering does the rest.
TENSOR_CORE_ARCH = "sm80"


@dataclass(frozen=True)
class Launch:
    """The options one launch of vLLM's attention kernel gets on Turing."""

    num_warps: int
    # Triton's `maxnreg` (PTX `.maxnreg`): without it ptxas sizes registers for occupancy from the 128 or 256 threads
    # the PTX requires, and can pick 64 for a kernel that then spills kilobytes.
    maxnreg: int | None
    # Tensor cores: Triton's sm_80 code generator, lowered to Turing's m16n8k8 (t4serve.turing.lowering).
    tensor_cores: bool
    # Prefill only (vLLM's 3D decode kernel and its reduction must share vLLM's tile): the KV tile and the query rows
    # (query heads x tokens) per program; None keeps vLLM's (the clamped tile, BLOCK_M 16).
    tile_size: int | None = None
    block_m: int | None = None

    def options(self) -> dict[str, Any]:
        """Triton launch options (not kernel arguments)."""
        options: dict[str, Any] = {"num_warps": self.num_warps, "num_stages": TURING_STAGES}
        if self.maxnreg is not None:
            options["maxnreg"] = self.maxnreg
        if self.tensor_cores:
            options["arch"] = TENSOR_CORE_ARCH
        return options

    def describe(self) -> str:
        code = "tensor cores (sm_80 code lowered to m16n8k8)" if self.tensor_cores else "FMA"
        parts = [code, f"{self.num_warps} warps"]
        if self.maxnreg is not None:
            parts.append(f"maxnreg {self.maxnreg}")
        if self.tile_size is not None:
            parts.append(f"tile {self.tile_size}")
        if self.block_m is not None:
            parts.append(f"BLOCK_M {self.block_m}")
        return ", ".join(parts)


# (phase, padded head size, KV mode) -> launch, for the turing-mma path. Chosen by their times on the GPU host in its
# T4 mode (docs/verified/turing-attention/: E2B's heads; 4 warps won at every one, the 32 query rows at head 256's
# prefill) among the sm_75 builds that fit 65,536 B without spills; heads 64 and 128 take 4 warps and vLLM's tile and
# rows, unmeasured. The image build proves each row (t4serve.turing.proof).
LAUNCHES: dict[tuple[str, int, int], Launch] = {
    (phase, head, kv): launch
    for kv in KV_MODES
    for (phase, head), launch in {
        (PREFILL, 64): Launch(num_warps=4, maxnreg=None, tensor_cores=True),
        (PREFILL, 128): Launch(num_warps=4, maxnreg=None, tensor_cores=True),
        (PREFILL, 256): Launch(num_warps=4, maxnreg=None, tensor_cores=True, tile_size=32, block_m=32),
        (PREFILL, 512): Launch(num_warps=4, maxnreg=None, tensor_cores=True, tile_size=16, block_m=16),
        (DECODE, 64): Launch(num_warps=4, maxnreg=None, tensor_cores=True),
        (DECODE, 128): Launch(num_warps=4, maxnreg=None, tensor_cores=True),
        (DECODE, 256): Launch(num_warps=4, maxnreg=None, tensor_cores=True),
        (DECODE, 512): Launch(num_warps=4, maxnreg=None, tensor_cores=True),
    }.items()
}
# Padded head sizes the turing-mma path has a launch for (every phase and KV mode).
TURING_MMA_HEADS = tuple(sorted({head for _, head, _ in LAUNCHES}))


def launch_for(
    table: Mapping[tuple[str, int, int], Launch], phase: str, head_padded: int, kv_mode: int
) -> Launch | None:
    return table.get((phase, head_padded, kv_mode))


class TuringLaunches:
    """Stands in for `kernel_unified_attention` in vLLM's module: each `kernel[grid](**kwargs)` vLLM makes runs the
    real kernel with the table's options for its phase, head size and KV mode; a launch the table has no row for (and
    one whose query is not 16-bit: tensor cores on Turing take f16) runs as vLLM made it."""

    def __init__(self, kernel: Any, table: Mapping[tuple[str, int, int], Launch], *, on_launch: Callable[..., None]
                 | None = None) -> None:
        self.kernel = kernel
        self.table = table
        self.on_launch = on_launch

    def __getattr__(self, name: str) -> Any:
        # Everything else (its `fn`, its caches) is the real kernel's.
        return getattr(self.kernel, name)

    def choose(self, kwargs: Mapping[str, Any]) -> Launch | None:
        phase = DECODE if kwargs.get("IS_3D") else PREFILL
        kv_mode = int(kwargs.get("KV_QUANT_MODE", KV_16BIT))
        launch = launch_for(self.table, phase, int(kwargs["HEAD_SIZE_PADDED"]), kv_mode)
        query = kwargs.get("query_ptr")
        if launch is not None and launch.tensor_cores and str(getattr(query, "dtype", "")) != "torch.float16":
            return None
        return launch

    def __getitem__(self, grid: Any) -> Callable[..., Any]:
        def run(*args: Any, **kwargs: Any) -> Any:
            launch = self.choose(kwargs) if not args else None
            if launch is None:
                return self.kernel[grid](*args, **kwargs)
            kwargs, launch_grid = adjusted(kwargs, grid, launch)
            if self.on_launch is not None:
                self.on_launch(launch, kwargs)
            return self.kernel[launch_grid](**kwargs, **launch.options())

        return run


def adjusted(kwargs: Mapping[str, Any], grid: Any, launch: Launch) -> tuple[dict[str, Any], Any]:
    """The kernel arguments and grid for `launch`: vLLM's own launch options dropped, and for prefill the table's tile
    and query rows, with the grid's first axis recounted as vLLM counts it (tokens // BLOCK_Q + sequences)."""
    out = {k: v for k, v in kwargs.items() if k not in ("num_warps", "num_stages", "maxnreg", "arch")}
    if out.get("IS_3D"):
        return out, grid
    if launch.tile_size is not None:
        out["TILE_SIZE"] = launch.tile_size
    group = int(out["num_queries_per_kv"])
    if launch.block_m is not None and launch.block_m > int(out["BLOCK_M"]) and launch.block_m % group == 0:
        block_q = launch.block_m // group
        out["BLOCK_M"], out["BLOCK_Q"] = launch.block_m, block_q
        grid = (int(out["query_ptr"].shape[0]) // block_q + int(out["num_seqs"]), *tuple(grid)[1:])
    return out, grid


def install(module: Any, table: Mapping[tuple[str, int, int], Launch] = LAUNCHES) -> TuringLaunches:
    """Put a TuringLaunches in place of the module's `kernel_unified_attention` (once; a second call returns the
    one in place)."""
    current = module.kernel_unified_attention
    if isinstance(current, TuringLaunches):
        return current
    proxy = TuringLaunches(current, table)
    module.kernel_unified_attention = proxy
    return proxy
