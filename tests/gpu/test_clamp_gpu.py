"""The Turing clamp on a real NVIDIA GPU: vLLM's attention kernel, patched by t4serve, compiled for this device and
for sm_75, and run with the clamped tiles (forced even where the device has room for tile 32) against a float32
reference. Skips cleanly without a GPU.

Needs only torch with CUDA and its Triton: vLLM comes from a folder written by tests/gpu/vendor_attention.py (the real
kernel files plus documented test doubles for the few vllm modules they import), at tests/gpu/vendored or
$T4SERVE_VENDORED_VLLM. Run with pytest (`pytest -m gpu tests/gpu/test_clamp_gpu.py -s`) or without it
(`python tests/gpu/test_clamp_gpu.py`).
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
if str(REPO / "entrypoint") not in sys.path:
    # The GPU machine has the repository but not the installed package; t4serve.patch needs only the stdlib.
    sys.path.append(str(REPO / "entrypoint"))

from t4serve.patch.apply import apply_clamp  # noqa: E402
from t4serve.patch.locate import TARGET_PATH  # noqa: E402
from t4serve.patch.proof import INTERPRETER_TOLERANCE, TURING_SHARED_MEMORY  # noqa: E402
from t4serve.patch.worker import (  # noqa: E402
    E2B_LAYERS,
    compile_shared_memory,
    e2b_batches,
    launch_label,
    load_target,
    recording,
    reference_attention,
    run_unified_attention,
    shared_memory,
)

try:
    import pytest
except ImportError:  # the GPU machine may have no pytest: __main__ below runs the same checks
    pytest = None  # type: ignore[assignment]

VENDORED = Path(os.environ.get("T4SERVE_VENDORED_VLLM", REPO / "tests" / "gpu" / "vendored"))
TILE32_NEED_HEAD512 = 98_304


class Skip(Exception):
    """No GPU here: the checks cannot run (not a failure)."""


@dataclass
class Setup:
    module: Any
    torch: Any
    device_name: str
    capability: tuple[int, int]
    device_shared_memory: int


def gpu_setup(workdir: Path) -> Setup:
    try:
        import torch
    except ImportError as exc:
        raise Skip(f"torch is not installed ({exc})") from exc
    if not torch.cuda.is_available():
        raise Skip("no NVIDIA GPU visible to torch (torch.cuda.is_available() is False)")
    if not (VENDORED / "vllm" / TARGET_PATH).is_file():
        raise RuntimeError(
            f"no vendored vLLM kernel at {VENDORED}: run `/opt/vllm-venv/bin/python tests/gpu/vendor_attention.py "
            f"{VENDORED}` on a machine with vLLM, or set T4SERVE_VENDORED_VLLM"
        )
    tree = workdir / "vendored"
    shutil.copytree(VENDORED, tree)
    result = apply_clamp(tree / "vllm")
    print(f"clamp {result.action} on a copy of vLLM {result.vllm_version}'s kernel at {result.path}")
    # The vendored package (with its test doubles) must win over any other vllm on the path.
    sys.path.insert(0, str(tree))
    sys.modules.pop("vllm", None)
    module = load_target(result.path)
    properties = torch.cuda.get_device_properties(0)
    return Setup(
        module,
        torch,
        properties.name,
        (properties.major, properties.minor),
        int(properties.shared_memory_per_block_optin),
    )


def check_device_shared_memory(setup: Setup) -> None:
    """Unforced, the patched code reads the device's real opt-in shared memory and decides by it."""
    import triton

    module = setup.module
    with shared_memory(module, None):
        seen = module._t4serve_shared_memory_per_block()
        tile = module._get_tile_size(512, 0, 2, True)
    triton_figure = triton.runtime.driver.active.utils.get_device_properties(0)["max_shared_mem"]
    print(
        f"{setup.device_name} sm_{setup.capability[0]}{setup.capability[1]}: opt-in shared memory per block "
        f"{setup.device_shared_memory:,} B (torch), {triton_figure:,} B (triton); the clamp reads {seen:,} B and "
        f"chooses tile {tile} for head 512 prefill"
    )
    assert seen == triton_figure == setup.device_shared_memory
    assert tile == (16 if seen < TILE32_NEED_HEAD512 else 32)


def check_compile(setup: Setup) -> None:
    """The clamped launches compile for this device and for sm_75, each within a T4's 65,536 B."""
    import triton
    from triton.backends.compiler import GPUTarget

    torch, module = setup.torch, setup.module
    here = triton.runtime.driver.active.get_current_target()
    turing = GPUTarget("cuda", 75, 32)
    for _layer, head, window, block in E2B_LAYERS:
        for batch in e2b_batches(torch, head, window, block, seed=head).values():
            batch.tensors = {k: v.cuda() for k, v in batch.tensors.items()}
            with shared_memory(module, TURING_SHARED_MEMORY), recording(module, launch=False) as launches:
                run_unified_attention(module, torch, batch)
            for launch in launches:
                need_here, _ = compile_shared_memory(launch, here)
                need_turing, _ = compile_shared_memory(launch, turing)
                print(f"  {launch_label(launch):<30} sm_{here.arch}: {need_here:>8,} B   sm_75: {need_turing:>8,} B")
                assert need_turing <= TURING_SHARED_MEMORY, launch_label(launch)
                assert need_here <= setup.device_shared_memory, launch_label(launch)


def check_against_reference(setup: Setup) -> None:
    """vLLM's unified_attention on the GPU, with the clamp forced and unforced, matches float32 attention."""
    torch, module = setup.torch, setup.module
    worst = 0.0
    for forced in (TURING_SHARED_MEMORY, None):
        for layer, head, _window, block in E2B_LAYERS:
            window = 16 if layer == "sliding" else 0
            for phase, batch in e2b_batches(torch, head, window, block, seed=head + 7).items():
                expected = reference_attention(torch, batch)
                batch.tensors = {k: v.cuda() for k, v in batch.tensors.items()}
                started = time.monotonic()
                with shared_memory(module, forced), recording(module, launch=True) as launches:
                    result = run_unified_attention(module, torch, batch)
                torch.cuda.synchronize()
                elapsed = time.monotonic() - started
                error = float((result.float().cpu() - expected).abs().max())
                worst = max(worst, error)
                labels = [launch_label(x) for x in launches]
                mode = f"forced {forced:,} B" if forced else "device"
                print(
                    f"  {mode:<17} {layer:<7} head {head} {phase:<7} {labels}: max |error| {error:.2e} "
                    f"({elapsed:.2f} s incl. compile)"
                )
                assert error <= INTERPRETER_TOLERANCE, (layer, phase, labels, error)
                if forced and head == 512 and phase == "prefill":
                    assert "2d/prefill/head512/tile16" in labels, labels
    print(f"  worst max |error| {worst:.2e} <= {INTERPRETER_TOLERANCE:.0e}")


CHECKS: tuple[Callable[[Setup], None], ...] = (check_device_shared_memory, check_compile, check_against_reference)

if pytest is not None:
    pytestmark = pytest.mark.gpu

    @pytest.fixture(scope="module")
    def setup(tmp_path_factory: pytest.TempPathFactory) -> Setup:
        try:
            return gpu_setup(tmp_path_factory.mktemp("clamp-gpu"))
        except Skip as exc:
            pytest.skip(str(exc))

    def test_device_shared_memory_is_read_from_the_device(setup: Setup) -> None:
        check_device_shared_memory(setup)

    def test_clamped_kernels_compile_for_this_device_and_sm75(setup: Setup) -> None:
        check_compile(setup)

    def test_clamped_attention_matches_reference_on_the_gpu(setup: Setup) -> None:
        check_against_reference(setup)


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="t4serve-clamp-gpu-") as workdir:
        try:
            setup = gpu_setup(Path(workdir))
        except Skip as exc:
            print(f"SKIPPED: {exc}")
            return 0
        failed = 0
        for check in CHECKS:
            print(f"== {check.__name__}")
            try:
                check(setup)
            except AssertionError as exc:
                failed += 1
                print(f"FAILED {check.__name__}: {exc!r}")
            else:
                print(f"passed {check.__name__}")
        return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
