"""t4serve.probes.manifest reads what the image's `t4serve build-manifest` writes (t4serve.probes.buildinfo, the real
writer), and turns a missing or malformed file into an absent manifest with the reason."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

from t4serve.facts import BuildManifest, ClampProof
from t4serve.probes.buildinfo import manifest_json
from t4serve.probes.manifest import probe_manifest

WRITTEN = BuildManifest(
    path="/etc/t4serve/build-manifest.json",
    present=True,
    base_image="debian:trixie-slim",
    python_version="3.13.5",
    torch_version="2.14.0",
    torch_cuda_version="13.0",
    torch_arch_list=["sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120"],
    vllm_version="0.33.0",
    triton_version="3.8.0",
    transformers_version="5.20.2",
    t4serve_version="0.1.0",
    built_at="2026-12-02T19:00:00Z",
    clamp=ClampProof(
        state="applied",
        vllm_version="0.33.0",
        target="vllm/v1/attention/ops/triton_unified_attention.py:_get_tile_size",
        source_sha256="0" * 64,
        shared_memory={"2d/prefill/head512/tile16": 65536, "3d/decode/head512/tile16": 65536},
        unpatched_shared_memory=98304,
        interpreter_max_abs_error=0.00098,
    ),
)


def test_the_image_writers_manifest_reads_back_whole(tmp_path: Path) -> None:
    path = tmp_path / "build-manifest.json"
    path.write_text(manifest_json(WRITTEN))
    manifest = probe_manifest(str(path))
    # The reader records where it read the file; everything else is what the build wrote.
    assert manifest == replace(WRITTEN, path=str(path))
    assert manifest.present and manifest.error is None
    assert manifest.clamp is not None and manifest.clamp.shared_memory["2d/prefill/head512/tile16"] == 65536


def test_a_manifest_without_reader_fields_reads_too(tmp_path: Path) -> None:
    path = tmp_path / "m.json"
    path.write_text(json.dumps({"torch_version": "2.14.0", "torch_arch_list": ["sm_75"], "vllm_version": "0.33.0"}))
    manifest = probe_manifest(str(path))
    assert manifest.present and manifest.torch_arch_list == ["sm_75"] and manifest.clamp is None


def test_missing_manifest_says_what_it_means(tmp_path: Path) -> None:
    path = str(tmp_path / "build-manifest.json")
    manifest = probe_manifest(path)
    assert not manifest.present
    assert manifest.error == (
        f"no build manifest at {path}: not running in the t4serve image, or the image was built without its manifest"
    )
    assert manifest.path == path and manifest.torch_version is None


def test_malformed_json_is_absent_with_the_parse_error(tmp_path: Path) -> None:
    path = tmp_path / "m.json"
    path.write_text('{"torch_version": "2.14.0",')
    manifest = probe_manifest(str(path))
    assert not manifest.present
    assert manifest.error is not None and manifest.error.startswith(f"the build manifest {path} is not valid JSON: ")
    assert "line 1" in manifest.error


def test_a_json_list_is_not_a_manifest(tmp_path: Path) -> None:
    path = tmp_path / "m.json"
    path.write_text("[]")
    manifest = probe_manifest(str(path))
    assert not manifest.present and manifest.error == f"the build manifest {path} is not a JSON object: list"


def test_unknown_fields_or_wrong_types_are_absent_not_half_loaded(tmp_path: Path) -> None:
    path = tmp_path / "m.json"
    path.write_text(json.dumps({"torch_version": "2.14.0", "cuda_arch": "sm_75"}))
    manifest = probe_manifest(str(path))
    assert not manifest.present and manifest.torch_version is None
    assert manifest.error is not None and "unknown keys ['cuda_arch']" in manifest.error
    path.write_text(json.dumps({"torch_arch_list": "sm_75"}))
    manifest = probe_manifest(str(path))
    assert not manifest.present and manifest.error is not None and "expected a list" in manifest.error


def test_an_unreadable_path_is_absent_with_the_reason(tmp_path: Path) -> None:
    manifest = probe_manifest(str(tmp_path))  # a folder, not a file
    assert not manifest.present
    assert manifest.error == f"the build manifest {tmp_path} must be a regular file (it is a directory)"
    # A FIFO (or /dev/zero) is refused at once by the shared bounded reader: never waited on, never read whole.
    os.mkfifo(tmp_path / "fifo")
    for path, kind in ((tmp_path / "fifo", "a FIFO"), (Path("/dev/zero"), "a character device")):
        manifest = probe_manifest(str(path))
        assert not manifest.present
        assert manifest.error == f"the build manifest {path} must be a regular file (it is {kind})"


def test_probing_imports_neither_torch_nor_vllm_nor_pynvml(tmp_path: Path) -> None:
    path = tmp_path / "m.json"
    path.write_text(manifest_json(WRITTEN))
    code = (
        "import sys; from t4serve.probes import probe_manifest; "
        f"assert probe_manifest({str(path)!r}).present; "
        "print(sorted(m for m in ('torch', 'vllm', 'pynvml', 'triton') if m in sys.modules))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert result.stdout.strip() == "[]"
