"""The README's first-run commands, run as written (read from README.md, not copied here), with the compose client
this machine has: in CI, Debian's docker-compose 1.29 and docker.io's client, so the fallback line
`DOCKER_BUILDKIT=1 docker-compose -f compose.yaml up` (and `docker compose up` only where the v2 plugin answers).

They run in a copy of the checkout (never the working tree's secrets/), with the environment a user would have plus
what keeps a test apart from a real server on this engine: a fresh image tag, so compose really builds (on the base
the image under test was built on, as a host that cannot pull does; most layers come from the build cache), its own
volume names and free host ports. No GPU here: `up` builds, then the engine refuses the nvidia reservation with the
message the README's troubleshooting names first. Like the README's `chown 1000` line, it runs as root (CI) or as
uid 1000; another user needs the `sudo` the README names."""

from __future__ import annotations

import json
import re
import shutil
import stat
import subprocess
import uuid
from pathlib import Path
from typing import Any

import pytest

from .conftest import REPO

pytestmark = pytest.mark.image

README = (REPO / "README.md").read_text()
COMPOSE_V1 = "/usr/bin/docker-compose"
BUILD_TIMEOUT_S = 1800


def first_run_blocks() -> tuple[list[str], str]:
    """The first run's command block (one command a line) and the docker-compose fallback's line."""
    section = README[README.index("## First run\n") : README.index("\n## ", README.index("## First run\n") + 1)]
    blocks = re.findall(r"```\n(.*?)```", section, re.DOTALL)
    assert len(blocks) == 2, blocks
    commands = [line for line in blocks[0].splitlines() if line.strip()]
    fallback = [line for line in blocks[1].splitlines() if line.strip()]
    assert len(fallback) == 1, fallback
    return commands, fallback[0]


def test_the_readme_names_the_commands_this_test_runs() -> None:
    commands, fallback = first_run_blocks()
    assert commands[-1] == "docker compose up"
    assert any("secrets/hf_token" in c and "umask 077" in c for c in commands)
    assert "docker-compose -f compose.yaml up" in fallback and "DOCKER_BUILDKIT=1" in fallback


def checkout_copy(dest: Path) -> Path:
    """The tracked files of this checkout (as they are in the working tree), as a user's clone would hold them."""
    files = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout.split(b"\0")
    for raw in filter(None, files):
        rel = raw.decode()
        source = REPO / rel
        if source.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / rel)
    return dest


def has_compose_v2(env: dict[str, str]) -> bool:
    try:
        done = subprocess.run(["docker", "compose", "version"], capture_output=True, env=env, timeout=60)
    except OSError:
        return False
    return done.returncode == 0


def test_the_first_run_commands_as_written(tmp_path: Path, docker_bin: str, image_config: dict[str, Any]) -> None:
    commands, fallback = first_run_blocks()
    clone = checkout_copy(tmp_path / f"t4s-readme-{uuid.uuid4().hex[:6]}")
    tag = f"t4serve-readme-{uuid.uuid4().hex[:8]}:test"
    token = f"hf_readme{uuid.uuid4().hex}"
    env = {
        "PATH": f"{Path(docker_bin).parent}:/usr/bin:/bin",
        "HOME": str(tmp_path),
        "HF_TOKEN": token,
        "T4SERVE_IMAGE": tag,
        "T4SERVE_BASE_IMAGE": image_config["Labels"]["org.opencontainers.image.base.name"],
        "T4SERVE_VOLUME_PREFIX": clone.name,
        "T4SERVE_PUBLISH_PORT": "0",
        "T4SERVE_TELEMETRY_PUBLISH_PORT": "0",
    }
    serve = commands[-1] if has_compose_v2(env) else fallback
    compose = ["docker", "compose"] if serve == commands[-1] else [COMPOSE_V1]
    try:
        for command in commands[:-1]:
            done = subprocess.run(["bash", "-c", command], cwd=clone, env=env, capture_output=True, text=True,
                                  timeout=60)  # fmt: skip
            assert done.returncode == 0, f"{command}\n{done.stdout}{done.stderr}"
        secret = clone / "secrets" / "hf_token"
        info = secret.stat()
        assert secret.read_text() == token
        assert stat.S_IMODE(info.st_mode) == 0o600 and info.st_uid == 1000
        up = subprocess.run(["bash", "-c", serve], cwd=clone, env=env, capture_output=True, text=True,
                            timeout=BUILD_TIMEOUT_S)  # fmt: skip
        text = up.stdout + up.stderr
        print(f"\n$ {serve}\nexit {up.returncode}; last lines:\n{text[-2500:]}")
        assert "requires BuildKit" not in text and "the --mount option requires" not in text
        built = subprocess.run([docker_bin, "image", "inspect", tag], capture_output=True, text=True)
        assert built.returncode == 0, f"compose built no {tag}:\n{text[-3000:]}"
        labels = json.loads(built.stdout)[0]["Config"]["Labels"]
        assert labels["org.opencontainers.image.title"] == "t4serve"
        assert labels["org.opencontainers.image.base.name"] == env["T4SERVE_BASE_IMAGE"]
        # No GPU on this machine: the engine refuses the reservation (README, Troubleshooting, first entry).
        assert up.returncode != 0
        assert 'could not select device driver "nvidia"' in text, text[-3000:]
    finally:
        subprocess.run([*compose, "-f", "compose.yaml", "down", "-v", "--rmi", "all"], cwd=clone, env=env,
                       capture_output=True, timeout=300)  # fmt: skip
        subprocess.run([docker_bin, "rmi", "-f", tag], capture_output=True, timeout=120)
