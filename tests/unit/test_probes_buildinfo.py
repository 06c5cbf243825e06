"""t4serve.probes.buildinfo: the manifest's claims, label checks and JSON round trip, without torch (it is injected)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest
from click.testing import CliRunner

from t4serve.commands.build_manifest import command as build_manifest_command
from t4serve.errors import ConfigError
from t4serve.facts import BuildManifest, ClampProof
from t4serve.probes import buildinfo
from t4serve.probes.manifest import probe_manifest
from t4serve.serde import from_dict, to_dict

# torch 2.14.0's cu130 wheel reports these (published-t4-run.md, "Packages").
CU130 = buildinfo.TorchBuild(cuda_version="13.0", arch_list=["sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120"])
VERSIONS = {"torch": "2.14.0", "vllm": "0.33.0", "triton": "3.8.0", "transformers": "5.20.2", "t4serve": "0.1.0"}
PROOF = ClampProof(
    state="applied",
    vllm_version="0.33.0",
    target="vllm/v1/attention/ops/triton_unified_attention.py:_get_tile_size",
    source_sha256="0" * 64,
    shared_memory={"2d/prefill/head512/tile16": 65536},
    unpatched_shared_memory=98304,
    interpreter_max_abs_error=0.001,
)


def make(
    build: buildinfo.TorchBuild = CU130, clamp: ClampProof | None = PROOF, **versions: str | None
) -> BuildManifest:
    table: dict[str, str | None] = {**VERSIONS, **versions}
    return buildinfo.collect(
        path="/etc/t4serve/build-manifest.json",
        base_image="debian:trixie-slim",
        clamp=clamp,
        torch_build=lambda: build,
        version_of=table.get,
        now=lambda: datetime(2026, 12, 2, 19, 5, 7, tzinfo=UTC),
    )


def test_collect_takes_versions_from_distributions_and_torch() -> None:
    m = make()
    assert (m.torch_version, m.vllm_version, m.triton_version) == ("2.14.0", "0.33.0", "3.8.0")
    assert m.torch_cuda_version == "13.0"
    assert "sm_75" in m.torch_arch_list
    assert m.built_at == "2026-12-02T19:05:07Z"
    assert m.present and m.base_image == "debian:trixie-slim" and m.clamp == PROOF
    buildinfo.check_claims(m)


def test_empty_base_image_is_recorded_as_unknown() -> None:
    m = buildinfo.collect(path="p", base_image="", clamp=None, torch_build=lambda: CU130, version_of=VERSIONS.get)
    assert m.base_image is None


def test_cpu_torch_fails_with_its_empty_arch_list() -> None:
    with pytest.raises(ConfigError) as exc:
        buildinfo.check_claims(make(build=buildinfo.TorchBuild(cuda_version=None, arch_list=[])))
    assert "sm_75" in exc.value.message() and "CPU-only" in exc.value.message()
    assert exc.value.exit_code == 2


def test_torch_without_turing_in_its_arch_list_fails() -> None:
    with pytest.raises(ConfigError, match="not compiled for Turing"):
        buildinfo.check_claims(make(build=buildinfo.TorchBuild(cuda_version="13.0", arch_list=["sm_80", "sm_90"])))


def test_cuda_12_torch_fails() -> None:
    with pytest.raises(ConfigError) as exc:
        buildinfo.check_claims(make(build=buildinfo.TorchBuild(cuda_version="12.8", arch_list=["sm_75"])))
    assert "'12.8'" in exc.value.message()
    # "13" must be the major, not a prefix of something else.
    with pytest.raises(ConfigError):
        buildinfo.check_claims(make(build=buildinfo.TorchBuild(cuda_version="130.1", arch_list=["sm_75"])))


@pytest.mark.parametrize("missing", ["torch", "vllm"])
def test_missing_distribution_fails(missing: str) -> None:
    with pytest.raises(ConfigError, match=f"no {'torch' if missing == 'torch' else 'vLLM'}"):
        buildinfo.check_claims(make(**{missing: None}))


def test_clamp_proof_for_another_vllm_fails() -> None:
    with pytest.raises(ConfigError) as exc:
        buildinfo.check_claims(make(vllm="0.34.0"))
    assert "proof for vLLM 0.33.0, installed vLLM 0.34.0" in exc.value.message()


def test_expectations_parse_and_drop_empty_values() -> None:
    assert buildinfo.parse_expectations(["vllm=0.33.0", "torch=", "base-image=debian:trixie-slim"]) == {
        "vllm": "0.33.0",
        "base-image": "debian:trixie-slim",
    }
    for bad in ["vllm", "flash=1.0"]:
        with pytest.raises(ConfigError, match="bad --expect"):
            buildinfo.parse_expectations([bad])


def test_labels_must_equal_what_is_installed() -> None:
    m = make()
    buildinfo.check_expectations(m, {"vllm": "0.33.0", "torch": "2.14.0", "t4serve": "0.1.0"})
    with pytest.raises(ConfigError) as exc:
        buildinfo.check_expectations(m, {"vllm": "0.34.0", "triton": "3.8.0"})
    assert "vllm: labelled 0.34.0, installed 0.33.0" in exc.value.message()
    assert "triton" not in exc.value.found  # type: ignore[operator]


def test_manifest_round_trips_through_serde(tmp_path: Path) -> None:
    m = make()
    out = tmp_path / "etc" / "build-manifest.json"
    m = BuildManifest(**{**to_dict(m), "path": str(out), "clamp": PROOF})
    buildinfo.write_manifest(m, out)
    assert from_dict(BuildManifest, json.loads(out.read_text())) == m
    assert probe_manifest(str(out)) == m
    assert oct(out.stat().st_mode & 0o777) == "0o644"
    assert list(out.parent.iterdir()) == [out]  # no temp file left behind


def test_clamp_proof_file_errors_name_the_fix(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as exc:
        buildinfo.read_clamp_proof(tmp_path / "missing.json")
    assert "t4serve patch apply --proof-out" in exc.value.message()
    bad = tmp_path / "proof.json"
    bad.write_text("[")
    with pytest.raises(ConfigError, match="not JSON"):
        buildinfo.read_clamp_proof(bad)
    good = tmp_path / "good.json"
    good.write_text(json.dumps(to_dict(PROOF)))
    assert buildinfo.read_clamp_proof(good) == PROOF


def test_command_refuses_bad_input_before_importing_torch(tmp_path: Path) -> None:
    # Both failures happen before collect(), so they run on a host without torch.
    runner = CliRunner()
    missing = runner.invoke(build_manifest_command, ["--out", str(tmp_path / "m.json"), "--clamp-proof", "nope.json"])
    assert isinstance(missing.exception, ConfigError) and "cannot read the clamp proof" in str(missing.exception)
    bad = runner.invoke(build_manifest_command, ["--clamp-proof", "x", "--expect", "cuda"])
    assert isinstance(bad.exception, ConfigError) and "bad --expect" in str(bad.exception)
    assert not (tmp_path / "m.json").exists()
