"""compose.yaml: validates with docker-compose 1.29, and `up` without a GPU ends with the preflight's no-GPU message
(exit 3), not a stack trace. The daemon itself refuses the nvidia reservation on this machine (see
published-t4-run.md): the up test runs a copy of compose.yaml with the `deploy:` block cut out and `restart: "no"` (no
restart loop in a test)."""

from __future__ import annotations

import re
import subprocess
import uuid
from pathlib import Path

import pytest

from .conftest import REPO

pytestmark = pytest.mark.image

COMPOSE = "/usr/bin/docker-compose"


def without_gpu(text: str) -> str:
    """compose.yaml minus the service's deploy block (its lines until the next key at the same indent)."""
    lines = text.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith("    deploy:"))
    end = next(i for i in range(start + 1, len(lines)) if re.match(r"^ {0,4}\S", lines[i]))
    kept = lines[:start] + lines[end:]
    return "\n".join(kept).replace("restart: unless-stopped", 'restart: "no"') + "\n"


def test_compose_config_validates(tmp_path: Path) -> None:
    out = subprocess.run([COMPOSE, "-f", "compose.yaml", "config"], cwd=REPO, capture_output=True, text=True,
                         timeout=60)  # fmt: skip
    assert out.returncode == 0, out.stderr
    for needle in ("driver: nvidia", "shm_size: 2gb", "start_period: 1350s", "stop_grace_period: 90s",
                   "127.0.0.1:8000:8000", "HF_TOKEN_FILE: /run/secrets/hf_token", "T4SERVE_MODEL: qat",
                   "restart: unless-stopped"):  # fmt: skip
        assert needle in out.stdout, needle
    derived = without_gpu((REPO / "compose.yaml").read_text())
    assert "deploy:" not in derived and "driver: nvidia" not in derived and "shm_size" in derived


def test_compose_config_for_one_gpu_of_several(tmp_path: Path) -> None:
    """docs/operations.md's several-GPU recipe: per project, T4SERVE_GPU picks the device and the publish ports move;
    the cache volumes keep one name across projects, so the servers share one download."""
    env = {"PATH": "/usr/bin:/bin", "T4SERVE_GPU": "2", "T4SERVE_PUBLISH_PORT": "8002",
           "T4SERVE_TELEMETRY_PUBLISH_PORT": "9402"}  # fmt: skip
    outs = []
    for project, project_env in (("t4serve-gpu0", {"PATH": "/usr/bin:/bin"}), ("t4serve-gpu2", env)):
        out = subprocess.run([COMPOSE, "-p", project, "-f", "compose.yaml", "config"], cwd=REPO, capture_output=True,
                             text=True, timeout=60, env=project_env)  # fmt: skip
        assert out.returncode == 0, out.stderr
        outs.append(out.stdout)
    default, second = outs
    assert re.search(r"device_ids:\n\s*- '0'", default) and re.search(r"device_ids:\n\s*- '2'", second)
    assert "127.0.0.1:8002:8000" in second and "127.0.0.1:9402:9400" in second
    for text in outs:
        for volume in ("t4serve-hf-cache", "t4serve-compile-cache", "t4serve-cache"):
            assert f"name: {volume}" in text, volume


def test_compose_up_without_gpu_fails_with_preflight_message(tmp_path: Path, docker_bin: str, image_ref: str) -> None:
    compose_file = tmp_path / "compose.nogpu.yaml"
    compose_file.write_text(without_gpu((REPO / "compose.yaml").read_text()))
    token = tmp_path / "hf_token"
    token.write_text("hf_testtokennotreal\n")
    token.chmod(0o644)
    project = f"t4stest{uuid.uuid4().hex[:6]}"
    # Port 0: Docker picks free host ports, so the test never collides with a server already on 8000/9400.
    # The volume prefix keeps this project's volumes apart from a real server's, so `down -v` drops only its own.
    env = {"PATH": "/usr/bin:/bin", "T4SERVE_IMAGE": image_ref, "HF_TOKEN_SECRET_FILE": str(token),
           "T4SERVE_PUBLISH_PORT": "0", "T4SERVE_TELEMETRY_PUBLISH_PORT": "0",
           "T4SERVE_VOLUME_PREFIX": project}  # fmt: skip
    base = [COMPOSE, "-p", project, "--project-directory", str(REPO), "-f", str(compose_file)]
    try:
        up = subprocess.run([*base, "up", "--no-build", "--exit-code-from", "t4serve"], capture_output=True,
                            text=True, timeout=300, env=env)  # fmt: skip
        text = up.stdout + up.stderr
        print(f"\ncompose up exit {up.returncode}; last lines:\n{text[-1500:]}")
        assert up.returncode == 3, text[-3000:]
        assert "preflight failed" in text and "NVML" in text
        assert "Traceback" not in text
    finally:
        subprocess.run([*base, "down", "-v"], capture_output=True, timeout=120, env=env)
