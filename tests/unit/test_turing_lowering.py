"""t4serve.turing.lowering on PTX shaped as Triton writes it: the m16n8k16 split fragment for fragment, and every
instruction Turing lacks refused by name. (The image test compiles vLLM's real kernel through it and has ptxas for
sm_75 assemble the result: tests/image/test_turing_attention.py.)"""

from __future__ import annotations

import pytest

from t4serve.turing.lowering import LoweringError, lower_to_sm75, opcode_counts, sm80_only

HEADER = ".version 8.8\n.target sm_75\n.address_size 64\n\n.visible .entry k(\n)\n.reqntid 128\n{\n"
MMA = ("\tmma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 { %r324, %r325, %r326, %r327 }, "
       "{ %r318, %r319, %r320, %r321 }, { %r322, %r323 }, { %r1, %r2, %r3, %r4 };\n")


def ptx(body: str, target: str = "sm_75") -> str:
    return HEADER.replace("sm_75", target) + body + "\tret;\n}\n"


def test_an_m16n8k16_is_two_m16n8k8_over_the_halves_of_k() -> None:
    lowered = lower_to_sm75(ptx(MMA))
    assert lowered.mma_split == 1
    k8 = [line.strip() for line in lowered.ptx.splitlines() if "m16n8k8" in line]
    # A's registers 0-1 with B's 0 (k 0-7) from C; then A's 2-3 with B's 1 (k 8-15) onto that result.
    assert k8 == [
        "mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 {%r324, %r325, %r326, %r327}, {%r318, %r319}, {%r322}, "
        "{%r1, %r2, %r3, %r4};",
        "mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 {%r324, %r325, %r326, %r327}, {%r320, %r321}, {%r323}, "
        "{%r324, %r325, %r326, %r327};",
    ]
    assert "m16n8k16" not in lowered.ptx and lowered.tensor_core_instructions == 2


def test_a_guard_predicate_guards_both_halves() -> None:
    lowered = lower_to_sm75(ptx(MMA.replace("\tmma", "\t@%p7 mma")))
    assert [line.strip()[:6] for line in lowered.ptx.splitlines() if "m16n8k8" in line] == ["@%p7 m", "@%p7 m"]


def test_fma_code_passes_unchanged() -> None:
    body = "\tfma.rn.f32 %f1, %f2, %f3, %f4;\n\tldmatrix.sync.aligned.m8n8.x4.shared.b16 {%r1, %r2, %r3, %r4}, [%r5];\n"
    lowered = lower_to_sm75(ptx(body))
    assert lowered.ptx == ptx(body) and lowered.mma_split == 0
    assert lowered.opcodes["fma.rn.f32"] == 1 and lowered.tensor_core_instructions == 0


@pytest.mark.parametrize(
    ("line", "named"),
    [
        ("\tcp.async.ca.shared.global [%r1], [%rd1], 16;\n", "cp.async.ca.shared.global (asynchronous copy"),
        ("\tcvt.rn.f16x2.f32 %r1, %f1, %f2;\n", "cvt.rn.f16x2.f32 (paired"),
        ("\tmma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%r1, %r2, %r3, %r4}, {%r5, %r6, %r7, %r8}, "
         "{%r9, %r10}, {%r1, %r2, %r3, %r4};\n", "m16n8k16.row.col.f32.bf16.bf16.f32 (16-deep"),
        ("\tredux.sync.add.s32 %r1, %r2, -1;\n", "redux.sync.add.s32 (warp-wide"),
    ],
)
def test_an_instruction_turing_lacks_is_refused_by_name(line: str, named: str) -> None:
    with pytest.raises(LoweringError, match="Turing lacks") as caught:
        lower_to_sm75(ptx(line))
    assert named in str(caught.value)


def test_ptx_for_another_target_is_refused() -> None:
    with pytest.raises(LoweringError, match="targets sm_80, not sm_75"):
        lower_to_sm75(ptx(MMA, target="sm_80"))


def test_comments_are_not_instructions() -> None:
    counts = opcode_counts(ptx("\t// cp.async.ca.shared.global in a comment\n\tadd.s32 %r1, %r2, %r3;\n"))
    assert "cp.async.ca.shared.global" not in counts and counts["add.s32"] == 1
    assert sm80_only(counts) == []
