"""The Turing attention clamp: patch vLLM's Triton attention tile choice so head-512 layers fit 64 KiB of shared memory.

`apply_clamp()` splices the clamp into vLLM's triton_unified_attention.py (located by syntax tree, written
atomically, a no-op when present); `verify()` proves it by compiling vLLM's real kernels for sm_75 and running them
under the Triton interpreter, returning a ClampProof. Nothing here imports torch or vLLM (the proof's child does).
"""

from t4serve.patch.apply import ApplyResult, apply_clamp, find_vllm_root, read_vllm_version
from t4serve.patch.locate import TARGET_PATH, TileSite, locate
from t4serve.patch.proof import verify

__all__ = [
    "TARGET_PATH",
    "ApplyResult",
    "TileSite",
    "apply_clamp",
    "find_vllm_root",
    "locate",
    "read_vllm_version",
    "verify",
]
