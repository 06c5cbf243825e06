"""t4serve.patch.proof: the verdicts over the proof's figures, the child-process protocol, and the proof file.

The child here is a fake Python that answers with given figures (vLLM cannot run on the host's 3.11): these tests
check what verify concludes from figures, not the figures themselves (tests/image/test_patch.py runs the real one).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from test_patch_apply import make_tree

from t4serve.errors import PatchError
from t4serve.facts import ClampProof
from t4serve.patch.apply import apply_clamp
from t4serve.patch.clamp import clamp_sha256
from t4serve.patch.proof import check_compile, check_interpreter, verify
from t4serve.patch.worker import RESULT_PREFIX
from t4serve.serde import from_dict

COMPILED: dict[str, Any] = {
    "target": "cuda:75",
    "shared_memory": {
        "2d/prefill/head256/tile32": 49_152,
        "3d/decode/head256/tile16": 32_768,
        "reduce/decode/head256/tile16": 2_048,
        "2d/prefill/head512/tile16": 65_536,
        "3d/decode/head512/tile16": 65_536,
        "reduce/decode/head512/tile16": 0,
    },
    "unpatched_label": "2d/prefill/head512/tile32",
    "unpatched_shared_memory": 98_304,
    "decisions_checked": 1056,
    "decisions_differing": [],
    "changed_on_t4": ["head 512 window 0 element 2 prefill: 32 -> 16"],
    "seconds": 1.0,
}
INTERPRETED: dict[str, Any] = {
    "cases": [
        {"layer": "sliding", "phase": "prefill", "launches": ["2d/prefill/head256/tile32"], "max_abs_error": 9.7e-4},
        {"layer": "global", "phase": "prefill", "launches": ["2d/prefill/head512/tile16"], "max_abs_error": 1.0e-3},
    ],
    "max_abs_error": 1.0e-3,
    "seconds": 1.0,
}


def lines() -> tuple[list[str], Any]:
    said: list[str] = []
    return said, said.append


def test_good_figures_pass_and_are_printed() -> None:
    said, echo = lines()
    check_compile(COMPILED, echo)
    assert check_interpreter(INTERPRETED, echo) == pytest.approx(1.0e-3)
    assert any("98,304 B" in line and "the clamp matters" in line for line in said)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"shared_memory": {**COMPILED["shared_memory"], "2d/prefill/head512/tile16": 98_304}}, "more shared memory"),
        ({"shared_memory": {"2d/prefill/head256/tile32": 49_152}}, "did not cover every kernel"),
        ({"unpatched_shared_memory": 65_536}, "premise no longer holds"),
        ({"decisions_differing": ["98304:(512, 0, 2, True)"]}, "enough shared memory"),
        ({"changed_on_t4": []}, "changes no tile"),
    ],
)
def test_bad_compile_figures_fail(change: dict[str, Any], message: str) -> None:
    with pytest.raises(PatchError, match=message) as caught:
        check_compile(COMPILED | change, lines()[1])
    assert caught.value.exit_code == 4


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"max_abs_error": 0.2}, "disagrees with the float32 reference"),
        ({"max_abs_error": float("nan")}, "disagrees with the float32 reference"),
        ({"cases": [{**INTERPRETED["cases"][1], "launches": ["2d/prefill/head512/tile32"]}]}, "clamped tile"),
    ],
)
def test_bad_interpreter_figures_fail(change: dict[str, Any], message: str) -> None:
    with pytest.raises(PatchError, match=message):
        check_interpreter(INTERPRETED | change, lines()[1])


def fake_python(tmp_path: Path, compiled: Any, interpreted: Any, exit_code: int = 0) -> str:
    """An executable that answers `python -m t4serve.patch MODE TARGET ...` like the worker, and records the
    environment it was given."""
    script = tmp_path / "fake-python"
    script.write_text(
        f"#!{sys.executable}\n"
        "import json, os, sys\n"
        "mode = sys.argv[3]\n"
        f"results = {{'compile': {json.dumps(compiled)!r}, 'interpret': {json.dumps(interpreted)!r}}}\n"
        f"env_log = {str(tmp_path / 'env.jsonl')!r}\n"
        "with open(env_log, 'a') as f:\n"
        "    f.write(json.dumps({'mode': mode, 'target': sys.argv[4], 'argv': sys.argv[5:],\n"
        "        'CUDA_VISIBLE_DEVICES': os.environ.get('CUDA_VISIBLE_DEVICES'),\n"
        "        'TRITON_INTERPRET': os.environ.get('TRITON_INTERPRET'),\n"
        "        'TRITON_CACHE_DIR': os.environ.get('TRITON_CACHE_DIR')}) + '\\n')\n"
        "print('figure line for', mode)\n"
        f"if {exit_code}:\n"
        "    print('Traceback: vLLM exploded', file=sys.stderr)\n"
        f"    sys.exit({exit_code})\n"
        f"print({RESULT_PREFIX!r} + results[mode])\n"
    )
    script.chmod(0o755)
    return str(script)


def test_verify_runs_both_children_and_writes_the_proof(tmp_path: Path) -> None:
    root = make_tree(tmp_path)
    apply_clamp(root)
    said, echo = lines()
    proof_path = tmp_path / "etc" / "clamp-proof.json"
    proof = verify(root, proof_out=proof_path, python=fake_python(tmp_path, COMPILED, INTERPRETED), echo=echo)
    assert proof.state == "applied" and proof.vllm_version == "0.33.0"
    assert proof.source_sha256 == clamp_sha256()
    assert proof.unpatched_shared_memory == 98_304
    assert proof.interpreter_max_abs_error == pytest.approx(1.0e-3)
    assert from_dict(ClampProof, json.loads(proof_path.read_text())) == proof
    assert "figure line for compile" in said and "figure line for interpret" in said
    runs = [json.loads(line) for line in (tmp_path / "env.jsonl").read_text().splitlines()]
    assert [r["mode"] for r in runs] == ["compile", "interpret"]
    assert all(r["CUDA_VISIBLE_DEVICES"] == "" for r in runs)
    assert [r["TRITON_INTERPRET"] for r in runs] == [None, "1"]
    assert runs[0]["argv"] == ["--shared-memory", "65536"]
    # Each child compiled into a fresh cache that is gone afterwards.
    assert all(r["TRITON_CACHE_DIR"] and not Path(r["TRITON_CACHE_DIR"]).exists() for r in runs)


def test_verify_skip_interpreter_runs_only_the_compile_child(tmp_path: Path) -> None:
    root = make_tree(tmp_path)
    apply_clamp(root)
    proof = verify(root, skip_interpreter=True, python=fake_python(tmp_path, COMPILED, INTERPRETED), echo=lines()[1])
    assert proof.interpreter_max_abs_error is None
    assert len((tmp_path / "env.jsonl").read_text().splitlines()) == 1


def test_verify_refuses_an_unpatched_vllm(tmp_path: Path) -> None:
    root = make_tree(tmp_path)
    with pytest.raises(PatchError, match="not applied") as caught:
        verify(root, python=fake_python(tmp_path, COMPILED, INTERPRETED), echo=lines()[1])
    assert "t4serve patch apply" in (caught.value.fix or "")


def test_a_failing_child_is_a_patch_error_with_its_stderr(tmp_path: Path) -> None:
    root = make_tree(tmp_path)
    apply_clamp(root)
    with pytest.raises(PatchError, match=r"compile step failed .*exit 3") as caught:
        verify(root, python=fake_python(tmp_path, COMPILED, INTERPRETED, exit_code=3), echo=lines()[1])
    assert "vLLM exploded" in (caught.value.found or "")
