"""t4serve.turing.hook: the PTX stage is lowered only for a kernel generated for 8.0 that runs below it, any earlier
hook still runs, and the cache key carries the lowering's version. `Backend` stands for Triton's CUDABackend (its
target's arch); the stages are the compile pipeline's dict of callables."""

from __future__ import annotations

from typing import Any

from t4serve.turing.hook import HOOK_VERSION, make_hook, needs_lowering

MMA = ("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%r1, %r2, %r3, %r4}, {%r5, %r6, %r7, %r8}, "
       "{%r9, %r10}, {%r1, %r2, %r3, %r4};")
PTX = f".version 8.8\n.target sm_75\n.visible .entry k()\n{{\n\t{MMA}\n}}\n"


class Backend:
    """Stands for Triton's CUDABackend: only its target's arch is read."""

    def __init__(self, arch: int) -> None:
        self.target = type("Target", (), {"arch": arch})()


def stages() -> dict[str, Any]:
    return {"ptx": lambda src, metadata: PTX, "cubin": lambda src, metadata: b"cubin"}


def test_sm80_code_for_a_turing_device_is_lowered() -> None:
    s = stages()
    make_hook(None)(Backend(75), s, None, None, 80)
    assert "m16n8k8" in s["ptx"]("llir", {}) and "m16n8k16" not in s["ptx"]("llir", {})


def test_code_for_the_devices_own_capability_passes() -> None:
    for target, codegen in ((75, 75), (90, 80), (90, 90), (80, 80)):
        s = stages()
        make_hook(None)(Backend(target), s, None, None, codegen)
        assert s["ptx"]("llir", {}) == PTX, (target, codegen)
    assert needs_lowering(80, 75) and not needs_lowering(75, 75) and not needs_lowering(80, 80)


def test_an_earlier_hook_runs_and_both_keys_enter_the_cache_key() -> None:
    seen: list[int] = []

    def earlier(*args: Any) -> Any:
        if not args:
            return "earlier-key", "earlier-hash"
        seen.append(args[4])
        return None

    hook = make_hook(earlier)
    assert hook() == (f"earlier-key+{HOOK_VERSION}", f"earlier-hash+{HOOK_VERSION}")
    assert make_hook(None)() == (HOOK_VERSION, HOOK_VERSION)
    hook(Backend(75), stages(), None, None, 80)
    assert seen == [80]
