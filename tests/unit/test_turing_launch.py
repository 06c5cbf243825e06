"""t4serve.turing.launch: the table's options reach each launch, prefill's tile and query rows with the grid recounted
as vLLM counts it, decode's tile never (its reduction shares vLLM's), and launches the table has no row for run as
vLLM made them. `RecordingKernel` stands for Triton's JITFunction (`kernel[grid](**kwargs)`); the launches against
vLLM's real kernel under the Triton interpreter are tests/image/test_turing_attention.py's."""

from __future__ import annotations

from typing import Any

from t4serve.turing.launch import (
    DECODE,
    KV_INT8,
    KV_MODES,
    LAUNCHES,
    PREFILL,
    TURING_MMA_HEADS,
    Launch,
    TuringLaunches,
    install,
)


class RecordingKernel:
    """Stands for a @triton.jit kernel: records each launch's grid and keyword arguments."""

    def __init__(self) -> None:
        self.launches: list[tuple[Any, dict[str, Any]]] = []
        self.fn = "the kernel's function"

    def __getitem__(self, grid: Any) -> Any:
        def run(**kwargs: Any) -> None:
            self.launches.append((grid, kwargs))

        return run


class Tensor:
    """Stands for a torch tensor: a shape and a dtype."""

    def __init__(self, rows: int, dtype: str = "torch.float16") -> None:
        self.shape = (rows, 8, 512)
        self.dtype = dtype


def vllm_kwargs(*, is_3d: bool, head: int = 512, kv: int = 0, rows: int = 100, dtype: str = "torch.float16"
                ) -> dict[str, Any]:
    """The keyword arguments vLLM 0.33's unified_attention passes that the table reads (and a few it passes through)."""
    return {"query_ptr": Tensor(rows, dtype), "num_seqs": 3, "num_queries_per_kv": 8, "BLOCK_M": 16, "BLOCK_Q": 2,
            "TILE_SIZE": 16, "HEAD_SIZE": head, "HEAD_SIZE_PADDED": head, "IS_3D": is_3d, "KV_QUANT_MODE": kv,
            "num_warps": 4}


def test_a_prefill_launch_takes_the_tables_options_tile_rows_and_a_recounted_grid() -> None:
    kernel = RecordingKernel()
    launch = Launch(num_warps=8, maxnreg=None, tensor_cores=True, tile_size=16, block_m=32)
    TuringLaunches(kernel, {(PREFILL, 512, 0): launch})[(53, 1)](**vllm_kwargs(is_3d=False))
    [(grid, kwargs)] = kernel.launches
    # vLLM's upper bound on query blocks: tokens // BLOCK_Q + sequences, at the new BLOCK_Q of 32 // 8 = 4.
    assert grid == (100 // 4 + 3, 1)
    assert (kwargs["BLOCK_M"], kwargs["BLOCK_Q"], kwargs["TILE_SIZE"]) == (32, 4, 16)
    assert (kwargs["num_warps"], kwargs["num_stages"], kwargs["arch"]) == (8, 1, "sm80")
    assert "maxnreg" not in kwargs


def test_a_decode_launch_keeps_vllms_tile_rows_and_grid() -> None:
    kernel = RecordingKernel()
    launch = Launch(num_warps=8, maxnreg=128, tensor_cores=False, tile_size=32, block_m=64)
    TuringLaunches(kernel, {(DECODE, 512, 0): launch})[(53, 1, 16)](**vllm_kwargs(is_3d=True))
    [(grid, kwargs)] = kernel.launches
    assert grid == (53, 1, 16) and (kwargs["BLOCK_M"], kwargs["TILE_SIZE"]) == (16, 16)
    assert (kwargs["num_warps"], kwargs["maxnreg"]) == (8, 128) and "arch" not in kwargs


def test_launches_without_a_row_or_with_a_float32_query_run_as_vllm_made_them() -> None:
    kernel = RecordingKernel()
    proxy = TuringLaunches(kernel, {(PREFILL, 512, 0): Launch(8, None, True, 16, 32)})
    proxy[(53, 1)](**vllm_kwargs(is_3d=False, head=256))
    proxy[(53, 1)](**vllm_kwargs(is_3d=False, kv=KV_INT8))
    proxy[(53, 1)](**vllm_kwargs(is_3d=False, dtype="torch.float32"))
    assert [(grid, kw["num_warps"], "arch" in kw) for grid, kw in kernel.launches] == [((53, 1), 4, False)] * 3


def test_a_block_m_the_group_does_not_divide_is_not_applied() -> None:
    kernel = RecordingKernel()
    TuringLaunches(kernel, {(PREFILL, 512, 0): Launch(8, None, True, None, 36)})[(53, 1)](
        **vllm_kwargs(is_3d=False))
    [(grid, kwargs)] = kernel.launches
    assert grid == (53, 1) and kwargs["BLOCK_M"] == 16


def test_the_table_covers_every_phase_head_and_kv_mode_it_names() -> None:
    assert {(p, h, kv) for p in (PREFILL, DECODE) for h in TURING_MMA_HEADS for kv in KV_MODES} == set(LAUNCHES)
    # vLLM's 3D kernel shares its tile with the reduction: no decode row may change it.
    assert all(launch.tile_size is None and launch.block_m is None
               for (phase, _, _), launch in LAUNCHES.items() if phase == DECODE)


def test_install_replaces_the_kernel_once_and_forwards_attributes() -> None:
    class Module:
        kernel_unified_attention: Any = RecordingKernel()

    first = install(Module)
    assert isinstance(Module.kernel_unified_attention, TuringLaunches) and install(Module) is first
    assert first.fn == "the kernel's function"
