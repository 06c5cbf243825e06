"""The Triton compile hook that makes a tensor-core kernel for a Turing GPU: PTX from Triton's sm_80 code generator,
lowered to sm_75 (t4serve.turing.lowering) before ptxas assembles it for the card.

A kernel launched with `arch="sm80"` (t4serve.turing.launch) on a device below 8.0 gets its TTGIR and LLVM IR from
Triton's 8.0 code generator and its PTX for the device's own target; this hook rewrites that PTX's stage. Kernels
compiled for their own capability pass untouched. Installed through Triton's `add_stages_inspection_hook`, chained
after any hook already there; its key enters every kernel's cache key, so no binary built without it is reused.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from t4serve.turing.lowering import lower_to_sm75

# Enters Triton's cache key for every kernel compiled while the hook is installed: raise it when the lowering changes.
HOOK_VERSION = "t4serve-turing-lowering-1"


def needs_lowering(codegen_capability: int, device_capability: int) -> bool:
    """A kernel generated for 8.0 or later that must run on a device below 8.0."""
    return codegen_capability >= 80 > device_capability


def make_hook(previous: Callable[..., Any] | None) -> Callable[..., Any]:
    """Triton's stages hook: called with no arguments it returns (key, hash) for the cache key; with (backend,
    stages, options, language, capability) it rewrites the PTX stage where `needs_lowering`."""

    def hook(*args: Any) -> Any:
        if not args:
            if previous is None:
                return HOOK_VERSION, HOOK_VERSION
            key, digest = previous()
            return f"{key}+{HOOK_VERSION}", f"{digest}+{HOOK_VERSION}"
        if previous is not None:
            previous(*args)
        backend, stages, _options, _language, capability = args
        if needs_lowering(int(capability), int(backend.target.arch)):
            make_ptx = stages["ptx"]
            stages["ptx"] = lambda src, metadata: lower_to_sm75(make_ptx(src, metadata)).ptx
        return None

    hook.t4serve_turing = True  # type: ignore[attr-defined]
    return hook


def install() -> bool:
    """Install the hook in this process's Triton (once); True when it was installed now."""
    from triton import knobs

    current = knobs.runtime.add_stages_inspection_hook
    if current is not None and getattr(current, "t4serve_turing", False):
        return False
    knobs.runtime.add_stages_inspection_hook = make_hook(current)
    return True
