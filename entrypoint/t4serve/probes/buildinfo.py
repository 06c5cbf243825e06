"""The build manifest: what the image holds, read once at build time and checked, so the entrypoint never imports torch.

`collect()` reads versions (distribution metadata) and torch's CUDA version and compiled arch list (the only torch
import, inside a function, at build time); `check_claims()` fails the build when the image could not run on Turing;
`write_manifest()` stores it as JSON and loads it back through the runtime's reader (`probes.manifest`).
"""

from __future__ import annotations

import json
import platform
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path

from t4serve.atomic import write_atomic
from t4serve.errors import ConfigError
from t4serve.facts import BuildManifest, ClampProof
from t4serve.gpus import TURING
from t4serve.probes.manifest import probe_manifest
from t4serve.serde import from_dict, to_dict

# The compute capability the image exists for (Tesla T4, RTX 20xx) and the CUDA major its torch wheels are built for.
REQUIRED_ARCH = f"sm_{TURING[0]}{TURING[1]}"
REQUIRED_CUDA_MAJOR = "13"

# Names accepted by `--expect NAME=VERSION`, mapped to the manifest field that must equal the version.
EXPECTABLE_FIELDS: Mapping[str, str] = {
    "t4serve": "t4serve_version",
    "vllm": "vllm_version",
    "torch": "torch_version",
    "triton": "triton_version",
    "transformers": "transformers_version",
    "python": "python_version",
    "base-image": "base_image",
}


@dataclass(frozen=True)
class TorchBuild:
    """What the installed torch was compiled for, as torch itself reports it."""

    cuda_version: str | None
    arch_list: list[str]


def read_torch_build() -> TorchBuild:
    """Import torch (build time only) and read its CUDA version and compiled arch list.

    `torch.cuda.get_arch_list()` answers from the compiled-in list without a GPU on CUDA builds; a CPU build
    answers an empty list, which `check_claims` then reports.
    """
    import torch

    return TorchBuild(cuda_version=torch.version.cuda, arch_list=list(torch.cuda.get_arch_list()))


def distribution_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def collect(
    *,
    path: str,
    base_image: str | None,
    clamp: ClampProof | None,
    torch_build: Callable[[], TorchBuild] = read_torch_build,
    version_of: Callable[[str], str | None] = distribution_version,
    now: Callable[[], datetime] = lambda: datetime.now(UTC),
) -> BuildManifest:
    """The manifest of the environment this runs in. Versions are distribution versions, the same strings the lock
    pins, so labels taken from the lock compare equal."""
    torch = torch_build()
    return BuildManifest(
        path=path,
        present=True,
        base_image=base_image or None,
        python_version=platform.python_version(),
        torch_version=version_of("torch"),
        torch_cuda_version=torch.cuda_version,
        torch_arch_list=torch.arch_list,
        vllm_version=version_of("vllm"),
        triton_version=version_of("triton"),
        transformers_version=version_of("transformers"),
        t4serve_version=version_of("t4serve"),
        built_at=now().astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        clamp=clamp,
    )


def check_claims(manifest: BuildManifest) -> None:
    """Fail unless the image can run on Turing: torch compiled for sm_75, built for CUDA 13, vLLM present, and the
    clamp proof made against this very vLLM."""
    fix_torch = (
        "pin a CUDA 13 build of torch in docker/requirements.in (PyPI's Linux torch 2.14.0 wheel is cu130), "
        "run scripts/lock, rebuild with scripts/build-image"
    )
    if not manifest.torch_version:
        raise ConfigError(
            "the image has no torch installed",
            found="no 'torch' distribution in the venv",
            required="torch from docker/requirements.lock",
            fix=fix_torch,
        )
    if REQUIRED_ARCH not in manifest.torch_arch_list:
        raise ConfigError(
            f"torch {manifest.torch_version} was not compiled for Turing ({REQUIRED_ARCH})",
            found=f"torch.cuda.get_arch_list() = {manifest.torch_arch_list} (empty means a CPU-only torch)",
            required=f"{REQUIRED_ARCH} in the compiled arch list",
            fix=fix_torch,
        )
    cuda = manifest.torch_cuda_version or ""
    if cuda.split(".")[0] != REQUIRED_CUDA_MAJOR:
        raise ConfigError(
            f"torch {manifest.torch_version} is not a CUDA {REQUIRED_CUDA_MAJOR} build",
            found=f"torch.version.cuda = {manifest.torch_cuda_version!r}",
            required=f"CUDA {REQUIRED_CUDA_MAJOR}.x (the lock's nvidia-*-cu13 libraries and vLLM's kernels need it)",
            fix=fix_torch,
        )
    if not manifest.vllm_version:
        raise ConfigError(
            "the image has no vLLM installed",
            found="no 'vllm' distribution in the venv",
            required="vllm from docker/requirements.lock",
            fix="check docker/requirements.in pins vllm, run scripts/lock, rebuild with scripts/build-image",
        )
    if manifest.clamp is not None and manifest.clamp.vllm_version != manifest.vllm_version:
        raise ConfigError(
            "the clamp proof was made against another vLLM than the one installed",
            found=f"proof for vLLM {manifest.clamp.vllm_version}, installed vLLM {manifest.vllm_version}",
            required="the proof written by `t4serve patch apply` in this build, after the last vLLM install",
            fix="rebuild with scripts/build-image (the build stage applies the clamp after installing the lock)",
        )


def parse_expectations(pairs: list[str]) -> dict[str, str]:
    """`NAME=VERSION` pairs into a dict; an empty VERSION means "not given" and is dropped."""
    expected: dict[str, str] = {}
    for pair in pairs:
        name, sep, version = pair.partition("=")
        if not sep or name not in EXPECTABLE_FIELDS:
            raise ConfigError(
                f"bad --expect value {pair!r}",
                found=pair,
                required=f"NAME=VERSION with NAME one of {', '.join(EXPECTABLE_FIELDS)}",
                fix="for example --expect vllm=0.33.0",
            )
        if version:
            expected[name] = version
    return expected


def check_expectations(manifest: BuildManifest, expected: Mapping[str, str]) -> None:
    """Fail when a value the image is labelled with differs from what is installed, so labels cannot lie."""
    wrong = []
    for name, version in sorted(expected.items()):
        actual = getattr(manifest, EXPECTABLE_FIELDS[name])
        if actual != version:
            wrong.append(f"{name}: labelled {version}, installed {actual}")
    if wrong:
        raise ConfigError(
            "the image's labels disagree with what is installed",
            found="; ".join(wrong),
            required="the label build args equal the versions in docker/requirements.lock and pyproject.toml",
            fix="build with scripts/build-image, which reads the label values from the lock",
        )


def read_clamp_proof(path: Path) -> ClampProof:
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(
            "cannot read the clamp proof",
            found=f"{path}: {exc.strerror or exc}",
            required="the JSON written by `t4serve patch apply --proof-out FILE`",
            fix="run `t4serve patch apply --proof-out FILE` first (the Dockerfile's build stage does)",
        ) from exc
    try:
        return from_dict(ClampProof, json.loads(text), where=str(path))
    except json.JSONDecodeError as exc:
        raise ConfigError(
            "the clamp proof is not JSON",
            found=f"{path}: {exc}",
            required="the JSON written by `t4serve patch apply --proof-out FILE`",
            fix="rerun `t4serve patch apply --proof-out FILE`",
        ) from exc


def manifest_json(manifest: BuildManifest) -> str:
    return json.dumps(to_dict(manifest), indent=2) + "\n"


def write_manifest(manifest: BuildManifest, path: Path) -> None:
    """Write atomically (temp file + rename), then load it back: a manifest that cannot be replayed fails here."""
    write_atomic(path, manifest_json(manifest), mode=0o644)  # 0o644: read by the non-root runtime user
    # The same reader the entrypoint uses at start, so a manifest that passes here is one it can read.
    loaded = probe_manifest(str(path))
    if loaded != manifest:
        raise ConfigError(
            "the build manifest does not load back as written",
            found=f"{path} reloads as {loaded}",
            required="a manifest that round-trips through t4serve.serde",
            fix="this is a t4serve bug: report it with the manifest file",
        )
