"""compose.yaml (the token from HF_TOKEN) with Compose v2, compose.token-file.yaml (the token from a file) with
docker-compose 1.29: each validates, and `up` without a GPU ends with the preflight's no-GPU message (exit 3), not a
stack trace. The daemon itself refuses the nvidia reservation on this machine (see published-t4-run.md): the up tests
run a copy with the `deploy:` block cut out and `restart: "no"` (no restart loop in a test). With compose.yaml the
token reaches the container as /run/secrets/hf_token only: never its environment, never `docker inspect`."""

from __future__ import annotations

import json
import re
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from .conftest import REPO

pytestmark = pytest.mark.image

COMPOSE = "/usr/bin/docker-compose"
# What docker-compose 1.29 reads: compose.yaml's service with the token from a file (scripts/compose-token-file).
TOKEN_FILE_COMPOSE = REPO / "compose.token-file.yaml"


def without_gpu(text: str, restart: bool = False) -> str:
    """compose.yaml minus the service's deploy block (its lines until the next key at the same indent); its restart
    policy kept only when `restart`."""
    lines = text.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith("    deploy:"))
    end = next(i for i in range(start + 1, len(lines)) if re.match(r"^ {0,4}\S", lines[i]))
    kept = "\n".join(lines[:start] + lines[end:]) + "\n"
    return kept if restart else kept.replace("restart: unless-stopped", 'restart: "no"')


def test_compose_config_validates(tmp_path: Path, docker_bin: str, compose_v2: dict[str, str]) -> None:
    v2 = subprocess.run([docker_bin, "compose", "-f", "compose.yaml", "config"], cwd=REPO, capture_output=True,
                        text=True, timeout=60, env={"PATH": "/usr/bin:/bin", **compose_v2})  # fmt: skip
    assert v2.returncode == 0, v2.stderr
    assert "environment: HF_TOKEN" in v2.stdout and "HF_TOKEN_FILE: /run/secrets/hf_token" in v2.stdout
    assert "not supported" not in v2.stderr, v2.stderr  # no warning a newcomer meets on every command
    # docker-compose 1.29 refuses compose.yaml whole (what host-check and the README say), and reads the token file's.
    old = subprocess.run([COMPOSE, "-f", "compose.yaml", "config"], cwd=REPO, capture_output=True, text=True,
                         timeout=60)  # fmt: skip
    assert old.returncode != 0 and "secrets.hf_token value 'environment' does not match" in old.stderr, old.stderr
    out = subprocess.run([COMPOSE, "-f", TOKEN_FILE_COMPOSE.name, "config"], cwd=REPO, capture_output=True, text=True,
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
        out = subprocess.run([COMPOSE, "-p", project, "-f", TOKEN_FILE_COMPOSE.name, "config"], cwd=REPO,
                             capture_output=True, text=True, timeout=60, env=project_env)  # fmt: skip
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
    compose_file.write_text(without_gpu(TOKEN_FILE_COMPOSE.read_text()))
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


def test_a_config_error_under_compose_waits_instead_of_restarting(tmp_path: Path, docker_bin: str,
                                                                  image_ref: str) -> None:  # fmt: skip
    """compose.yaml's own `restart: unless-stopped` and T4SERVE_ON_CONFIG_ERROR=wait: a setting that cannot work is
    printed once and the container stays up, not restarted (before, 8 restarts in 25 s); the healthcheck says why,
    and `down` stops it at once with exit 2."""
    compose_file = tmp_path / "compose.nogpu.yaml"
    compose_file.write_text(without_gpu(TOKEN_FILE_COMPOSE.read_text(), restart=True))
    token = tmp_path / "hf_token"
    token.write_text("hf_testtokennotreal\n")
    token.chmod(0o644)
    project = f"t4stest{uuid.uuid4().hex[:6]}"
    env = {"PATH": "/usr/bin:/bin", "T4SERVE_IMAGE": image_ref, "HF_TOKEN_SECRET_FILE": str(token),
           "T4SERVE_PUBLISH_PORT": "0", "T4SERVE_TELEMETRY_PUBLISH_PORT": "0", "T4SERVE_VOLUME_PREFIX": project,
           "T4SERVE_VLLM_ARGS": "--max-model-len 4096"}  # fmt: skip
    base = [COMPOSE, "-p", project, "--project-directory", str(REPO), "-f", str(compose_file)]
    try:
        up = subprocess.run([*base, "up", "-d", "--no-build"], capture_output=True, text=True, timeout=300, env=env)
        assert up.returncode == 0, up.stderr
        ids = subprocess.run([*base, "ps", "-q"], capture_output=True, text=True, timeout=60, env=env).stdout.split()
        assert len(ids) == 1, ids
        container = ids[0]
        time.sleep(15)  # the restart loop this replaces restarted 8 times in 25 s
        state = json.loads(subprocess.run([docker_bin, "inspect", container], capture_output=True, text=True,
                                          timeout=60).stdout)[0]  # fmt: skip
        logs = subprocess.run([docker_bin, "logs", container], capture_output=True, text=True, timeout=60)
        text = logs.stdout + logs.stderr
        print(f"\nafter 15 s: running={state['State']['Running']} restarts={state['RestartCount']}\n{text[-1500:]}")
        assert state["HostConfig"]["RestartPolicy"]["Name"] == "unless-stopped"
        assert state["State"]["Running"] and state["RestartCount"] == 0
        assert text.count("t4serve: T4SERVE_VLLM_ARGS=--max-model-len 4096: must not contain") == 1, text
        assert "use T4SERVE_MAX_MODEL_LEN instead" in text and "waiting for a stop signal" in text
        hc = subprocess.run([docker_bin, "exec", container, "t4serve", "healthcheck"], capture_output=True,
                            text=True, timeout=60)  # fmt: skip
        assert hc.returncode == 1 and "stopped on a configuration error and waits" in hc.stderr, hc
        started = time.monotonic()
        stop = subprocess.run([docker_bin, "stop", container], capture_output=True, text=True, timeout=120)
        assert stop.returncode == 0 and time.monotonic() - started < 10
        exited = json.loads(subprocess.run([docker_bin, "inspect", container], capture_output=True, text=True,
                                           timeout=60).stdout)[0]["State"]  # fmt: skip
        assert exited["ExitCode"] == 2
    finally:
        subprocess.run([*base, "down", "-v"], capture_output=True, timeout=120, env=env)


def test_the_token_from_the_environment_reaches_the_container_as_a_file_only(
    tmp_path: Path, docker_bin: str, image_ref: str, compose_v2: dict[str, str]
) -> None:
    """compose.yaml's env-secret route with Compose v2 (issue 45): `HF_TOKEN=... docker compose up` copies the token in
    as /run/secrets/hf_token, which serve (uid 1000) reads (it gets past the settings to the preflight's no-GPU
    failure, exit 3, where an unreadable file would be exit 2); the token is in neither the container's environment
    nor `docker inspect`. Without HF_TOKEN compose refuses, naming it."""
    compose_file = tmp_path / "compose.nogpu.yaml"
    compose_file.write_text(without_gpu((REPO / "compose.yaml").read_text()))
    token = f"hf_envroute{uuid.uuid4().hex}"
    project = f"t4stest{uuid.uuid4().hex[:6]}"
    env = {"PATH": "/usr/bin:/bin", **compose_v2, "T4SERVE_IMAGE": image_ref, "T4SERVE_PUBLISH_PORT": "0",
           "T4SERVE_TELEMETRY_PUBLISH_PORT": "0", "T4SERVE_VOLUME_PREFIX": project}  # fmt: skip
    base = [docker_bin, "compose", "-p", project, "--project-directory", str(REPO), "-f", str(compose_file)]
    try:
        refused = subprocess.run([*base, "up", "--no-build"], capture_output=True, text=True, timeout=300, env=env)
        assert refused.returncode != 0 and 'environment variable "HF_TOKEN" required by secret' in refused.stderr
        up = subprocess.run([*base, "up", "--no-build", "--exit-code-from", "t4serve"], capture_output=True,
                            text=True, timeout=300, env={**env, "HF_TOKEN": token})  # fmt: skip
        text = up.stdout + up.stderr
        print(f"\ncompose up exit {up.returncode}; last lines:\n{text[-1500:]}")
        assert up.returncode == 3, text[-3000:]
        assert "preflight failed" in text and "HF_TOKEN_FILE" not in text and token not in text
        ids = subprocess.run([*base, "ps", "-a", "-q"], capture_output=True, text=True, timeout=60, env=env)
        container = ids.stdout.split()[0]
        inspect = subprocess.run([docker_bin, "inspect", container], capture_output=True, text=True, timeout=60)
        assert inspect.returncode == 0 and token not in inspect.stdout
        assert "HF_TOKEN_FILE=/run/secrets/hf_token" in inspect.stdout
        copied = subprocess.run([docker_bin, "cp", f"{container}:/run/secrets/hf_token", "-"], capture_output=True,
                                timeout=60)  # fmt: skip
        assert copied.returncode == 0 and token.encode() in copied.stdout
    finally:
        subprocess.run([*base, "down", "-v"], capture_output=True, timeout=120, env=env)
