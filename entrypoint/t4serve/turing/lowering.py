"""Lower PTX that Triton generated with its sm_80 code generator to what a Turing GPU (sm_75) runs.

Triton >= 3.3 compiles `tl.dot` to FMA below compute capability 8.0. Generated for 8.0 instead, at one pipeline stage
(no `cp.async`), vLLM's attention kernel needs one instruction Turing lacks: `mma.sync` m16n8k16 with f16 inputs and
f32 accumulators. It is exactly two m16n8k8 (Turing's own shape) over the two halves of k, fragment for fragment.
Every other instruction known to need sm_80 or later is refused by name; ptxas for sm_75 is the final judge.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

# mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {d0..d3}, {a0..a3}, {b0, b1}, {c0..c3};
# A's registers 0-1 hold k 0-7 of rows g and g+8, registers 2-3 hold k 8-15; B's register 0 holds k 0-7, register 1
# k 8-15 (PTX ISA, "Matrix Fragments for mma.m16n8k16"); m16n8k8 takes A's first two and B's first (m16n8k8).
_MMA_K16 = re.compile(
    r"^(?P<indent>[ \t]*)(?P<guard>@!?%\w+[ \t]+)?mma\.sync\.aligned\.m16n8k16\.row\.col\.f32\.f16\.f16\.f32[ \t]*"
    r"\{(?P<d>[^}]*)\}[ \t]*,[ \t]*\{(?P<a>[^}]*)\}[ \t]*,[ \t]*\{(?P<b>[^}]*)\}[ \t]*,[ \t]*\{(?P<c>[^}]*)\}[ \t]*;"
    r"[ \t]*$",
    re.MULTILINE,
)
_MMA_K8 = "mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32"
_OPCODE = re.compile(r"^[ \t]*(?:@!?%\w+[ \t]+)?([a-z][\w.:]*)", re.MULTILINE)
_TARGET = re.compile(r"^\.target[ \t]+(\S+)", re.MULTILINE)

# Instructions (by opcode prefix) that need sm_80 or later (PTX ISA, "Target ISA notes"), and what they are. A Turing
# kernel must contain none of them once the m16n8k16 mma are split.
SM80_ONLY: tuple[tuple[str, str], ...] = (
    ("cp.async", "asynchronous copy to shared memory (Triton's pipeliner emits it at num_stages > 1)"),
    ("cp.reduce.async", "asynchronous bulk reduction"),
    ("mma.sync.aligned.m16n8k16", "16-deep matrix multiply-accumulate of a kind this lowering does not split"),
    ("mma.sync.aligned.m16n8k8.row.col.f32.bf16", "bf16 matrix multiply-accumulate"),
    ("mma.sync.aligned.m16n8k8.row.col.f32.tf32", "tf32 matrix multiply-accumulate"),
    ("mma.sync.aligned.m16n8k32", "integer matrix multiply-accumulate of depth 32"),
    ("wgmma", "warpgroup matrix multiply-accumulate (sm_90)"),
    ("tcgen05", "fifth-generation tensor core instructions (sm_100)"),
    ("cvt.rn.f16x2.f32", "paired float-to-half conversion"),
    ("cvt.rn.bf16", "bf16 conversion"),
    ("cvt.rna.tf32", "tf32 conversion"),
    ("redux.sync", "warp-wide reduction"),
    ("createpolicy", "cache eviction policy"),
    ("mbarrier", "shared-memory barrier objects"),
    ("elect.sync", "leader election (sm_90)"),
    ("setmaxnreg", "register reallocation (sm_90)"),
    ("griddepcontrol", "programmatic dependent launch (sm_90)"),
    ("fence.proxy.async", "async proxy fence (sm_90)"),
)


class LoweringError(Exception):
    """The PTX holds an instruction Turing cannot run and this lowering cannot rewrite."""


@dataclass(frozen=True)
class Lowered:
    """PTX for sm_75 and what was changed to get it."""

    ptx: str
    # m16n8k16 instructions split into two m16n8k8 each.
    mma_split: int
    # Opcodes of the result with their counts, for the proof's record.
    opcodes: dict[str, int]

    @property
    def tensor_core_instructions(self) -> int:
        """`mma.sync` instructions in the lowered PTX (each runs on the tensor cores: HMMA.1688 in Turing's SASS)."""
        return sum(count for opcode, count in self.opcodes.items() if opcode.startswith("mma.sync"))


def _split(match: re.Match[str]) -> str:
    a = [r.strip() for r in match["a"].split(",")]
    b = [r.strip() for r in match["b"].split(",")]
    if len(a) != 4 or len(b) != 2 or len(match["d"].split(",")) != 4 or len(match["c"].split(",")) != 4:
        raise LoweringError(f"an m16n8k16 mma with unexpected operands: {match.group(0).strip()}")
    lead = f"{match['indent']}{match['guard'] or ''}{_MMA_K8}"
    d, c = match["d"].strip(), match["c"].strip()
    # The second half accumulates onto the first's result, so the sum runs over k 0-15 as the m16n8k16 did.
    first = f"{lead} {{{d}}}, {{{a[0]}, {a[1]}}}, {{{b[0]}}}, {{{c}}};"
    second = f"{lead} {{{d}}}, {{{a[2]}, {a[3]}}}, {{{b[1]}}}, {{{d}}};"
    return f"{first}\n{second}"


def opcode_counts(ptx: str) -> dict[str, int]:
    """Each instruction's opcode (with its type suffixes) and how often it appears."""
    return dict(Counter(_OPCODE.findall(_strip_comments(ptx))))


def _strip_comments(ptx: str) -> str:
    return re.sub(r"//[^\n]*", "", ptx)


def sm80_only(opcodes: dict[str, int]) -> list[str]:
    """The opcodes that need sm_80 or later, each with what it is."""
    found = []
    for opcode in sorted(opcodes):
        for prefix, what in SM80_ONLY:
            if opcode.startswith(prefix):
                found.append(f"{opcode} ({what})")
                break
    return found


def lower_to_sm75(ptx: str) -> Lowered:
    """The PTX with each f16 m16n8k16 mma split into two m16n8k8; LoweringError when an instruction that needs sm_80
    or later remains, or when the module does not target sm_75."""
    target = _TARGET.search(ptx)
    if target is None or target.group(1) != "sm_75":
        found = target.group(1) if target else "no .target line"
        raise LoweringError(f"the PTX targets {found}, not sm_75: compile it for a Turing card (target capability 75)")
    lowered, split = _MMA_K16.subn(_split, ptx)
    opcodes = opcode_counts(lowered)
    remaining = sm80_only(opcodes)
    if remaining:
        raise LoweringError("the PTX needs instructions Turing lacks after lowering: " + ", ".join(remaining))
    return Lowered(ptx=lowered, mma_split=split, opcodes=opcodes)

