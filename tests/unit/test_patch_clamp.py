"""t4serve.patch.clamp: the shared-memory formula, the decision table, and the device query, all run on the exact
clamp text that is inserted into vLLM (executed here with stand-ins for vLLM's `torch` and `triton`)."""

from __future__ import annotations

import hashlib
from types import SimpleNamespace
from typing import Any

import pytest

from t4serve.gpus import shared_memory_per_block_optin
from t4serve.patch.clamp import (
    CLAMP_SOURCE,
    clamp_decision,
    clamp_namespace,
    clamp_sha256,
    find_marked_clamp,
    marked_block,
    padded_head_size,
    tile_shared_memory,
)

T4 = shared_memory_per_block_optin((7, 5))


def vllm_tile(head_size: int, sliding_window: int, element_size: int, is_prefill: bool) -> int:
    """vLLM 0.33.0's _get_tile_size body (the function the clamp wraps)."""
    if sliding_window == 1024 and head_size in (128, 256):
        return 32
    if is_prefill:
        return 32
    return 16 if element_size >= 2 else 32


@pytest.mark.parametrize(
    ("head", "tile", "expected"),
    # published-t4-run.md's table, compiled for sm_75 with fp16, BLOCK_M 16.
    [(256, 16, 32_768), (512, 16, 65_536), (256, 32, 49_152), (512, 32, 98_304), (256, 64, 81_920), (512, 64, 163_840)],
)
def test_shared_memory_formula_matches_the_compiled_figures(head: int, tile: int, expected: int) -> None:
    assert tile_shared_memory(head, tile) == expected
    # The copy inside the inserted text says the same.
    assert clamp_namespace()["_t4serve_tile_shared_memory"](head, tile) == expected


def test_padded_head_size_is_the_next_power_of_two() -> None:
    assert [padded_head_size(h) for h in (1, 64, 80, 256, 257, 320, 512, 576)] == [1, 64, 128, 256, 512, 512, 512, 1024]


DECISIONS = [
    # (tile, head, element size, shared memory per block, expected tile)
    (32, 512, 2, T4, 16),  # Gemma 4 global layer prefill on a T4: the case the clamp exists for
    (32, 320, 2, T4, 16),  # pads to 512: same kernel footprint
    (32, 512, 4, T4, 16),  # wider elements need even more
    (32, 256, 2, T4, 32),  # sliding layers fit at tile 32 (49,152 B)
    (16, 512, 2, T4, 16),  # decode tile is already 16
    (32, 512, 1, T4, 32),  # fp8 needs tile >= 32 (vLLM's note), the clamp stays out
    (32, 512, 2, None, 32),  # device unknown (no CUDA): vLLM's choice
    (32, 512, 2, 98_303, 16),  # one byte short of tile 32's need
    (32, 512, 2, 98_304, 32),  # exactly tile 32's need
    (32, 512, 2, 232_448, 32),  # H100
    (32, 1024, 2, 98_304, 16),  # head 1024 needs 196,608 B at tile 32
    (32, 1024, 2, 196_608, 32),
]


@pytest.mark.parametrize(("tile", "head", "element", "shared", "expected"), DECISIONS)
def test_decision_table(tile: int, head: int, element: int, shared: int | None, expected: int) -> None:
    assert clamp_decision(clamp_namespace())(tile, head, element, shared) == expected


def test_enough_shared_memory_changes_nothing() -> None:
    decide = clamp_decision(clamp_namespace())
    for shared in (98_304, 101_376, 166_912, 232_448):
        for head in (32, 64, 80, 96, 128, 192, 256, 320, 512):
            for window in (0, 512, 1024, 4096):
                for element in (1, 2, 4):
                    for prefill in (True, False):
                        tile = vllm_tile(head, window, element, prefill)
                        assert decide(tile, head, element, shared) == tile, (shared, head, window, element, prefill)


def test_t4_changes_exactly_the_16_bit_head_512_tiles_above_16() -> None:
    decide = clamp_decision(clamp_namespace())
    changed = set()
    for head in (64, 128, 256, 320, 512):
        for window in (0, 512, 1024):
            for element in (1, 2, 4):
                for prefill in (True, False):
                    tile = vllm_tile(head, window, element, prefill)
                    if decide(tile, head, element, T4) != tile:
                        changed.add((head, element, prefill))
    assert changed == {(320, 2, True), (320, 4, True), (512, 2, True), (512, 4, True)}


class FakeCuda:
    def __init__(self, available: bool, optin: int) -> None:
        self.available = available
        self.optin = optin
        self.property_reads = 0

    def is_available(self) -> bool:
        return self.available

    def current_device(self) -> int:
        return 0

    def get_device_properties(self, index: int) -> Any:
        self.property_reads += 1
        return SimpleNamespace(shared_memory_per_block_optin=self.optin)


class FakeTritonUtils:
    def __init__(self, max_shared_mem: int | None) -> None:
        self.max_shared_mem = max_shared_mem
        self.reads = 0

    def get_device_properties(self, index: int) -> dict[str, int]:
        self.reads += 1
        if self.max_shared_mem is None:
            raise RuntimeError("0 active drivers")
        return {"max_shared_mem": self.max_shared_mem}


def wired(cuda_available: bool, torch_optin: int, triton_shared: int | None) -> tuple[dict[str, Any], Any, Any]:
    cuda = FakeCuda(cuda_available, torch_optin)
    utils = FakeTritonUtils(triton_shared)
    triton = SimpleNamespace(runtime=SimpleNamespace(driver=SimpleNamespace(active=SimpleNamespace(utils=utils))))
    return clamp_namespace(vllm_tile, torch_module=SimpleNamespace(cuda=cuda), triton_module=triton), cuda, utils


def test_get_tile_size_asks_triton_first_and_caches() -> None:
    ns, cuda, utils = wired(True, torch_optin=232_448, triton_shared=T4)
    assert ns["_get_tile_size"](512, 0, 2, True) == 16
    assert ns["_get_tile_size"](512, 0, 2, True) == 16
    assert ns["_get_tile_size"](512, 0, 2, False) == 16
    assert utils.reads == 1  # cached per device
    assert cuda.property_reads == 0


def test_get_tile_size_falls_back_to_torch_properties() -> None:
    ns, cuda, _ = wired(True, torch_optin=T4, triton_shared=None)
    assert ns["_get_tile_size"](512, 0, 2, True) == 16
    assert cuda.property_reads == 1
    ns, cuda, _ = wired(True, torch_optin=166_912, triton_shared=None)
    assert ns["_get_tile_size"](512, 0, 2, True) == 32
    assert cuda.property_reads == 1


def test_no_cuda_means_vllm_choice_and_override_wins() -> None:
    ns, _, utils = wired(False, torch_optin=T4, triton_shared=T4)
    assert ns["_get_tile_size"](512, 0, 2, True) == 32
    assert utils.reads == 0
    ns["T4SERVE_SHARED_MEMORY_OVERRIDE"] = T4
    assert ns["_get_tile_size"](512, 0, 2, True) == 16
    assert ns["_get_tile_size"](256, 512, 2, True) == 32


def test_hash_and_marker_round_trip() -> None:
    assert clamp_sha256() == hashlib.sha256(CLAMP_SOURCE.encode()).hexdigest()
    text = "before\n" + marked_block() + "after\n"
    found = find_marked_clamp(text)
    assert found is not None and found.intact and found.stated_sha256 == clamp_sha256()
    assert (found.begin_line, found.end_line) == (2, 2 + CLAMP_SOURCE.count("\n") + 1)
    assert find_marked_clamp("no marker here\n") is None


def test_shared_memory_from_the_environment_sets_the_override(monkeypatch: pytest.MonkeyPatch) -> None:
    """T4SERVE_SIZE_AS hands vLLM the smaller card's figure in T4SERVE_SHARED_MEMORY_PER_BLOCK: read at import."""
    monkeypatch.setenv("T4SERVE_SHARED_MEMORY_PER_BLOCK", str(T4))
    ns, _, utils = wired(True, torch_optin=232_448, triton_shared=232_448)
    assert ns["T4SERVE_SHARED_MEMORY_OVERRIDE"] == T4
    assert ns["_get_tile_size"](512, 0, 2, True) == 16
    assert utils.reads == 0
    monkeypatch.setenv("T4SERVE_SHARED_MEMORY_PER_BLOCK", "not-a-number")
    ns, _, _ = wired(True, torch_optin=232_448, triton_shared=232_448)
    assert ns["T4SERVE_SHARED_MEMORY_OVERRIDE"] is None
    assert ns["_get_tile_size"](512, 0, 2, True) == 32
