"""t4serve.patch.apply: patching a vLLM-shaped tree on disk, twice (no-op), on drift, and when the write fails."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from test_patch_locate import VLLM_LIKE_SOURCE

from t4serve.atomic import write_atomic
from t4serve.errors import PatchError
from t4serve.patch.apply import apply_clamp, find_vllm_root, read_vllm_version
from t4serve.patch.clamp import UNCLAMPED_FUNCTION, clamp_namespace, clamp_sha256
from t4serve.patch.locate import TARGET_PATH


def make_tree(tmp_path: Path, source: str = VLLM_LIKE_SOURCE, version: str = "0.33.0") -> Path:
    root = tmp_path / "site-packages" / "vllm"
    target = root / TARGET_PATH
    target.parent.mkdir(parents=True)
    target.write_text(source)
    target.chmod(0o640)
    (root / "_version.py").write_text(f"__version__ = version = {version!r}\n__version_tuple__ = (0, 33, 0)\n")
    return root


def test_apply_then_apply_again_is_a_no_op(tmp_path: Path) -> None:
    root = make_tree(tmp_path)
    target = root / TARGET_PATH
    first = apply_clamp(root)
    assert first.action == "applied" and first.vllm_version == "0.33.0" and first.root == root
    patched = target.read_bytes()
    assert f"sha256={clamp_sha256()}".encode() in patched
    assert stat.S_IMODE(target.stat().st_mode) == 0o640
    assert list((target.parent / "__pycache__").glob("triton_unified_attention.*.pyc"))
    before = target.stat().st_mtime_ns
    second = apply_clamp(root)
    assert second.action == "already-applied"
    assert target.read_bytes() == patched and target.stat().st_mtime_ns == before


def test_patched_file_runs_the_clamp_on_vllms_own_body(tmp_path: Path) -> None:
    root = make_tree(tmp_path)
    apply_clamp(root)
    ns = clamp_namespace()
    # Execute the patched module's functions (the kernels' decorator is stubbed: no triton here).
    text = (root / TARGET_PATH).read_text().replace("from vllm.triton_utils import tl, triton\n", "")
    ns.update(triton=type("T", (), {"jit": staticmethod(lambda f: f)}), tl=type("L", (), {"constexpr": int}))
    exec(compile(text, "patched", "exec"), ns)
    ns["T4SERVE_SHARED_MEMORY_OVERRIDE"] = 65_536
    assert ns[UNCLAMPED_FUNCTION](512, 0, 2, True) == 32
    assert ns["_get_tile_size"](512, 0, 2, True) == 16
    assert ns["_get_tile_size"](256, 512, 2, True) == 32
    ns["T4SERVE_SHARED_MEMORY_OVERRIDE"] = 98_304
    assert ns["_get_tile_size"](512, 0, 2, True) == 32


def test_drift_fails_and_leaves_the_file_alone(tmp_path: Path) -> None:
    drifted = VLLM_LIKE_SOURCE.replace(
        "    is_prefill: bool,\n) -> int:", "    is_prefill: bool,\n    x: int,\n) -> int:"
    )
    root = make_tree(tmp_path, drifted, version="0.35.0")
    with pytest.raises(PatchError, match=r"vLLM 0\.35\.0: the signature of _get_tile_size changed") as caught:
        apply_clamp(root)
    assert caught.value.exit_code == 4
    assert (root / TARGET_PATH).read_text() == drifted


def test_failed_write_leaves_the_old_file_and_no_temp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = make_tree(tmp_path)
    target = root / TARGET_PATH

    def refuse(src: str, dst: str) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", refuse)
    with pytest.raises(PatchError, match="cannot write the patched") as caught:
        apply_clamp(root)
    assert "No space left on device" in (caught.value.found or "")
    assert target.read_text() == VLLM_LIKE_SOURCE
    assert sorted(p.name for p in target.parent.iterdir()) == ["triton_unified_attention.py"]


def test_atomic_write_interrupted_mid_write_keeps_the_old_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "f.py"
    path.write_text("old\n")

    def interrupted(fd: int) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "fsync", interrupted)
    with pytest.raises(KeyboardInterrupt):
        write_atomic(path, "new\n" * 1000)
    assert path.read_text() == "old\n"
    assert [p.name for p in tmp_path.iterdir()] == ["f.py"]


def test_vllm_root_accepts_the_package_or_its_parent(tmp_path: Path) -> None:
    root = make_tree(tmp_path)
    assert find_vllm_root(root) == root
    assert find_vllm_root(root.parent) == root
    assert read_vllm_version(root) == "0.33.0"
    with pytest.raises(PatchError, match="no vLLM attention kernel") as caught:
        find_vllm_root(tmp_path / "elsewhere")
    assert "--vllm-root" in (caught.value.fix or "")


def test_missing_version_file_is_a_patch_error(tmp_path: Path) -> None:
    root = make_tree(tmp_path)
    (root / "_version.py").unlink()
    with pytest.raises(PatchError, match="cannot read vLLM's version"):
        apply_clamp(root)
