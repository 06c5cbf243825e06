"""The Turing clamp's source text, its hash, and the decision it makes, as one piece of code inserted into vLLM.

`CLAMP_SOURCE` is what `t4serve patch apply` writes into vLLM's triton_unified_attention.py after renaming vLLM's
own `_get_tile_size`; `clamp_namespace()` executes the same text so the decision table is tested on the very code
that ships. The marker lines around it carry the text's sha256, so a second apply is a no-op and an edit is caught.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

# The function vLLM calls for both tiles, and the name its original body is moved to.
TARGET_FUNCTION = "_get_tile_size"
UNCLAMPED_FUNCTION = "_t4serve_unclamped_get_tile_size"
# The module attribute that tests and the proof set to pretend a device's opt-in shared memory per block.
OVERRIDE_ATTRIBUTE = "T4SERVE_SHARED_MEMORY_OVERRIDE"
# The environment variable CLAMP_SOURCE reads at import into that attribute: a server sized as a smaller card
# (T4SERVE_SIZE_AS) runs that card's tiles.
SHARED_MEMORY_ENV = "T4SERVE_SHARED_MEMORY_PER_BLOCK"

# published-t4-run.md, "The Turing clamp": compiled for sm_75, the attention kernels need
# 2 B x padded head x (2 x TILE + 2 x BLOCK_M) of shared memory (K and V tiles, Q and the accumulator's staging).
CLAMPED_TILE = 16
UNCLAMPED_TILE = 32
MIN_CLAMPED_HEAD = 512
# vLLM's smallest BLOCK_M (16 query rows; Gemma 4 E2B: 8 query heads per KV head x BLOCK_Q 2).
BLOCK_M = 16
ELEMENT_BYTES = 2

# The text inserted into vLLM. It must run on every Python vLLM supports and may use only what the target module
# already imports (`torch`, `triton` from vllm.triton_utils), so it carries its own copy of the arithmetic.
CLAMP_SOURCE = '''\
import functools as _t4serve_functools
import os as _t4serve_os

# Opt-in shared memory per block (bytes) to assume instead of asking the device; None asks the device.
# t4serve's proof sets it to a T4's 65,536 to compile and run the clamped tiles where no T4 is present; a server
# sized as a smaller card (T4SERVE_SIZE_AS) gets that card's figure through T4SERVE_SHARED_MEMORY_PER_BLOCK.
T4SERVE_SHARED_MEMORY_OVERRIDE: "int | None" = (
    int(_t4serve_os.environ["T4SERVE_SHARED_MEMORY_PER_BLOCK"])
    if _t4serve_os.environ.get("T4SERVE_SHARED_MEMORY_PER_BLOCK", "").isdigit()
    else None
)


def _t4serve_tile_shared_memory(head_size_padded: int, tile_size: int) -> int:
    """Shared memory vLLM's attention kernel needs at 16-bit with BLOCK_M 16, as compiled for sm_75:
    2 B x padded head x (2 x TILE + 2 x BLOCK_M)."""
    return 2 * head_size_padded * (2 * tile_size + 2 * 16)


def _t4serve_clamp_tile(
    tile_size: int, head_size: int, element_size: int, shared_memory_per_block: "int | None"
) -> int:
    """Tile 16 where tile 32 would not fit the device's opt-in shared memory per block (head >= 512, 16-bit or
    wider); vLLM's own choice everywhere else, and wherever the device cannot be asked."""
    if shared_memory_per_block is None or tile_size <= 16 or element_size < 2:
        return tile_size
    head_size_padded = 1 << max(head_size - 1, 0).bit_length()
    if head_size_padded < 512:
        return tile_size
    if shared_memory_per_block >= _t4serve_tile_shared_memory(head_size_padded, 32):
        return tile_size
    return 16


@_t4serve_functools.cache
def _t4serve_device_shared_memory(device_index: int) -> "int | None":
    """The device's opt-in shared memory per block: Triton's own figure first (the one its launcher checks a
    kernel against), then torch's device properties; None when neither can be read."""
    try:
        properties = triton.runtime.driver.active.utils.get_device_properties(device_index)
        return int(properties["max_shared_mem"])
    except Exception:
        pass
    try:
        return int(torch.cuda.get_device_properties(device_index).shared_memory_per_block_optin)
    except Exception:
        return None


def _t4serve_shared_memory_per_block() -> "int | None":
    if T4SERVE_SHARED_MEMORY_OVERRIDE is not None:
        return T4SERVE_SHARED_MEMORY_OVERRIDE
    if not torch.cuda.is_available():
        return None
    return _t4serve_device_shared_memory(torch.cuda.current_device())


def _get_tile_size(
    head_size: int,
    sliding_window: int,
    element_size: int,
    is_prefill: bool,
) -> int:
    """vLLM's tile choice, clamped to 16 where the device's shared memory cannot hold tile 32 (t4serve)."""
    tile_size = _t4serve_unclamped_get_tile_size(head_size, sliding_window, element_size, is_prefill)
    return _t4serve_clamp_tile(tile_size, head_size, element_size, _t4serve_shared_memory_per_block())
'''

MARKER_BEGIN_PREFIX = "# >>> t4serve turing clamp sha256="
MARKER_END = "# <<< t4serve turing clamp <<<"
_MARKER_RE = re.compile(r"^# >>> t4serve turing clamp sha256=(?P<sha>[0-9a-f]{64}) >>>$")


def clamp_sha256(source: str = CLAMP_SOURCE) -> str:
    return hashlib.sha256(source.encode("utf-8")).hexdigest()


def marked_block(source: str = CLAMP_SOURCE) -> str:
    """The clamp between its marker lines, as inserted (ends with a newline)."""
    return f"{MARKER_BEGIN_PREFIX}{clamp_sha256(source)} >>>\n{source}{MARKER_END}\n"


@dataclass(frozen=True)
class MarkedClamp:
    """A clamp block found in a file: the hash its marker states and the hash of the text actually there."""

    stated_sha256: str
    actual_sha256: str
    begin_line: int
    end_line: int

    @property
    def intact(self) -> bool:
        return self.stated_sha256 == self.actual_sha256


def find_marked_clamp(text: str) -> MarkedClamp | None:
    """The marked clamp block in a file's text, or None. Used only to read t4serve's own marker, never to locate
    vLLM's code (that is done by the syntax tree in t4serve.patch.locate)."""
    lines = text.splitlines(keepends=True)
    begin = next((i for i, line in enumerate(lines) if _MARKER_RE.match(line.rstrip("\n"))), None)
    if begin is None:
        return None
    match = _MARKER_RE.match(lines[begin].rstrip("\n"))
    assert match is not None
    end = next((i for i in range(begin + 1, len(lines)) if lines[i].rstrip("\n") == MARKER_END), None)
    if end is None:
        return MarkedClamp(match["sha"], "", begin + 1, len(lines))
    body = "".join(lines[begin + 1 : end])
    return MarkedClamp(match["sha"], clamp_sha256(body), begin + 1, end + 1)


def tile_shared_memory(head_size_padded: int, tile_size: int, block_m: int = BLOCK_M) -> int:
    """The kernel's shared memory at 16-bit, as fitted in published-t4-run.md: 2 B x padded head x (2 x TILE + 2 x
    BLOCK_M)."""
    return ELEMENT_BYTES * head_size_padded * (2 * tile_size + 2 * block_m)


def padded_head_size(head_size: int) -> int:
    """vLLM's HEAD_SIZE_PADDED: the next power of two (triton.next_power_of_2)."""
    return 1 << max(head_size - 1, 0).bit_length()


def clamp_namespace(
    unclamped: Callable[[int, int, int, bool], int] | None = None,
    *,
    torch_module: Any = None,
    triton_module: Any = None,
) -> dict[str, Any]:
    """Execute CLAMP_SOURCE in a fresh namespace (as it runs inside vLLM) and return that namespace.

    `unclamped` stands for vLLM's renamed `_get_tile_size`; `torch_module`/`triton_module` for the target module's
    imports. Tests use it to check the decision table on the exact shipped text without vLLM or torch.
    """
    namespace: dict[str, Any] = {
        "__name__": "t4serve_clamp_under_test",
        UNCLAMPED_FUNCTION: unclamped,
        "torch": torch_module,
        "triton": triton_module,
    }
    exec(compile(CLAMP_SOURCE, "<t4serve clamp>", "exec"), namespace)
    return namespace


def clamp_decision(namespace: dict[str, Any]) -> Callable[[int, int, int, int | None], int]:
    return cast(Callable[[int, int, int, int | None], int], namespace["_t4serve_clamp_tile"])
