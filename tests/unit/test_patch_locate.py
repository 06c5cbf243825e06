"""t4serve.patch.locate: vLLM's current shape is accepted; every kind of drift is refused with what moved."""

from __future__ import annotations

import pytest

from t4serve.errors import PatchError
from t4serve.patch.apply import patch_source
from t4serve.patch.clamp import CLAMP_SOURCE, MARKER_END, marked_block
from t4serve.patch.locate import locate

# A trimmed copy of vLLM 0.33.0's triton_unified_attention.py: the same tile function, the same two callers, the
# same launches of both kernels with their TILE_SIZE (the kernel bodies do not matter to the locator).
VLLM_LIKE_SOURCE = '''\
from vllm.triton_utils import tl, triton


@triton.jit
def kernel_unified_attention(output_ptr, TILE_SIZE: tl.constexpr):
    pass


@triton.jit
def reduce_segments(output_ptr, TILE_SIZE: tl.constexpr):
    pass


def _is_gemma3_attention(head_size: int, sliding_window: int) -> bool:
    return sliding_window == 1024 and head_size in (128, 256)


def _get_tile_size(
    head_size: int,
    sliding_window: int,
    element_size: int,
    is_prefill: bool,
) -> int:
    """Select tile size with Gemma3-specific optimization."""
    if _is_gemma3_attention(head_size, sliding_window):
        # Gemma3: use 32 for decode (default is 16)
        return 32

    # Default behavior
    if is_prefill:
        return 32
    # Note: tile size must be at least 32 for fp8 (element_size == 1).
    return 16 if element_size >= 2 else 32


def unified_attention(q, out, window_size, block_size, use_3d, use_td=False):
    head_size = q.shape[2]
    sliding_window_val = 1 + window_size[0] if window_size[0] >= 0 else 0
    TILE_SIZE_PREFILL = _get_tile_size(
        head_size, sliding_window_val, q.element_size(), is_prefill=True
    )
    TILE_SIZE_DECODE = _get_tile_size(
        head_size, sliding_window_val, q.element_size(), is_prefill=False
    )
    if use_td:
        TILE_SIZE_PREFILL = min(TILE_SIZE_PREFILL, block_size)
    if not use_3d:
        tile_size = TILE_SIZE_PREFILL
    else:
        tile_size = TILE_SIZE_DECODE
    kernel_unified_attention[(1,)](output_ptr=out, TILE_SIZE=tile_size)
    if use_3d:
        reduce_segments[(1,)](output_ptr=out, TILE_SIZE=TILE_SIZE_DECODE)
'''

VERSION = "9.9.9"


def edit(old: str, new: str, source: str = VLLM_LIKE_SOURCE) -> str:
    assert source.count(old) == 1, old
    return source.replace(old, new)


def test_current_shape_is_accepted_with_its_lines() -> None:
    site = locate(VLLM_LIKE_SOURCE, VERSION)
    lines = VLLM_LIKE_SOURCE.splitlines()
    assert site.state == "unpatched"
    assert lines[site.function_line - 1] == "def _get_tile_size("
    assert lines[site.function_end_line - 1] == "    return 16 if element_size >= 2 else 32"
    assert site.returned_tiles == (16, 32)
    assert lines[site.caller_lines["TILE_SIZE_PREFILL"] - 1].lstrip().startswith("TILE_SIZE_PREFILL = _get_tile")
    assert lines[site.caller_lines["TILE_SIZE_DECODE"] - 1].lstrip().startswith("TILE_SIZE_DECODE = _get_tile")


def test_positional_is_prefill_is_the_same_shape() -> None:
    source = edit("q.element_size(), is_prefill=True", "q.element_size(), True")
    assert locate(source, VERSION).state == "unpatched"


DRIFTS = {
    "function missing": (
        VLLM_LIKE_SOURCE.replace("_get_tile_size", "_choose_tile"),
        "_get_tile_size is missing",
    ),
    "parameter added": (
        edit("    is_prefill: bool,\n) -> int:", "    is_prefill: bool,\n    num_queries_per_kv: int,\n) -> int:"),
        "signature of _get_tile_size changed",
    ),
    "default added": (
        edit("    is_prefill: bool,\n) -> int:", "    is_prefill: bool = False,\n) -> int:"),
        "signature of _get_tile_size changed",
    ),
    "decode tile no longer from _get_tile_size": (
        edit(
            "TILE_SIZE_DECODE = _get_tile_size(\n        head_size, sliding_window_val, q.element_size(), "
            "is_prefill=False\n    )",
            "TILE_SIZE_DECODE = 16",
        ),
        "callers of _get_tile_size moved",
    ),
    "a third caller elsewhere": (
        VLLM_LIKE_SOURCE + "\n\ndef other():\n    return _get_tile_size(512, 0, 2, True)\n",
        "callers of _get_tile_size moved",
    ),
    "caller renamed": (
        edit("def unified_attention(", "def unified_attention_v2("),
        "caller unified_attention moved",
    ),
    "is_prefill flipped": (
        edit("q.element_size(), is_prefill=False", "q.element_size(), is_prefill=True"),
        "TILE_SIZE_DECODE no longer passes is_prefill=False",
    ),
    "reduce kernel tile from elsewhere": (
        edit(
            "reduce_segments[(1,)](output_ptr=out, TILE_SIZE=TILE_SIZE_DECODE)",
            "reduce_segments[(1,)](output_ptr=out, TILE_SIZE=32)",
        ),
        "no longer launches reduce_segments with the tile",
    ),
    "main kernel tile from elsewhere": (
        edit(
            "kernel_unified_attention[(1,)](output_ptr=out, TILE_SIZE=tile_size)",
            "kernel_unified_attention[(1,)](output_ptr=out, TILE_SIZE=64)",
        ),
        "no longer launches kernel_unified_attention with the tile",
    ),
    "already clamped upstream": (
        edit(
            "    # Default behavior\n",
            "    props = torch.cuda.get_device_properties()\n"
            "    if head_size >= 512 and props.shared_memory_per_block_optin < 98304:\n"
            "        return 16\n",
        ),
        "already limits the attention tile by shared memory",
    ),
    "new tile size": (
        edit("    if is_prefill:\n        return 32", "    if is_prefill:\n        return 64"),
        "chooses tiles the clamp was not written for",
    ),
    "computed tile": (
        edit("    if is_prefill:\n        return 32", "    if is_prefill:\n        return min(32, head_size)"),
        "computes its tile instead of choosing a constant",
    ),
    "kernel gone": (
        VLLM_LIKE_SOURCE.replace("def reduce_segments(", "def reduce_segments_v2("),
        "the kernel reduce_segments is gone",
    ),
    "does not parse": (VLLM_LIKE_SOURCE + "\ndef broken(:\n", "does not parse"),
}


@pytest.mark.parametrize("kind", sorted(DRIFTS))
def test_drift_is_refused_naming_the_version_and_what_moved(kind: str) -> None:
    source, moved = DRIFTS[kind]
    with pytest.raises(PatchError) as caught:
        locate(source, VERSION)
    message = caught.value.message()
    assert moved in message
    assert f"vLLM {VERSION}" in message
    assert caught.value.exit_code == 4
    assert caught.value.found and caught.value.required and caught.value.fix


def test_patched_source_reads_back_as_patched() -> None:
    patched, site = patch_source(VLLM_LIKE_SOURCE, VERSION)
    assert site.state == "patched"
    assert locate(patched, VERSION).state == "patched"


def test_edited_clamp_is_caught() -> None:
    patched, _ = patch_source(VLLM_LIKE_SOURCE, VERSION)
    tampered = patched.replace(
        "return 16\n" + "\n\n@_t4serve_functools.cache", "return 32\n\n\n@_t4serve_functools.cache"
    )
    assert tampered != patched
    with pytest.raises(PatchError, match="was edited after it was applied"):
        locate(tampered, VERSION)


def test_clamp_of_another_t4serve_version_is_caught() -> None:
    patched, _ = patch_source(VLLM_LIKE_SOURCE, VERSION)
    other = CLAMP_SOURCE.replace("(t4serve)", "(t4serve, older)")
    replaced = patched.replace(marked_block(), marked_block(other))
    assert replaced != patched
    with pytest.raises(PatchError, match="carries a different Turing clamp"):
        locate(replaced, VERSION)


def test_half_patched_file_is_caught() -> None:
    renamed_only = edit("def _get_tile_size(", "def _t4serve_unclamped_get_tile_size(") + (
        "\n\ndef _get_tile_size(head_size, sliding_window, element_size, is_prefill):\n    return 16\n"
    )
    with pytest.raises(PatchError, match="half patched"):
        locate(renamed_only, VERSION)


def test_missing_end_marker_is_an_edit() -> None:
    patched, _ = patch_source(VLLM_LIKE_SOURCE, VERSION)
    with pytest.raises(PatchError, match="edited"):
        locate(patched.replace(MARKER_END, "# end"), VERSION)
