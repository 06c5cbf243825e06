"""The README's first-run commands, run as written (read from README.md, not copied here) in a copy of the checkout,
on this machine: no GPU and no NVIDIA Container Toolkit, as a newcomer's first host may be.

- The newcomer's block, in order: the host tool installed into a venv (pip, from the checkout), then
  `.venv/bin/t4serve host-check && HF_TOKEN=... docker compose up`. host-check names the missing driver and toolkit,
  each with found / required / fix, and exits 3, so compose never runs: the block ends in t4serve's own message, not
  Docker's `could not select device driver "nvidia"`.
- Its compose part alone, with Compose v2 (compose.yaml's token from HF_TOKEN): what a host without the toolkit gives
  when host-check is skipped, Docker's refusal of the GPU reservation, which the README's troubleshooting names.
- The file route for docker-compose 1.29 (compose.token-file.yaml): the secret file written as the README writes it,
  then `up`, which builds the image (on the base the image under test was built on, as a host that cannot pull does;
  most layers come from the build cache) and meets the same refusal.

Each runs with the environment a user would have plus what keeps it apart from a real server on this engine: a fresh
image tag (the build) or the image under test, its own volume names and free host ports. Like the README's `chown
1000`, the file route runs as root (CI) or as uid 1000."""

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
INSTALL_TIMEOUT_S = 900
# The README's placeholder for the user's token.
TOKEN_PLACEHOLDER = "hf_YOURTOKEN"
DOCKERS_REFUSAL = 'could not select device driver "nvidia"'


def first_run_blocks() -> tuple[list[str], list[str]]:
    """The first run's two command blocks (one command a line): the newcomer's, and the file route's."""
    section = README[README.index("## First run\n") : README.index("\n## ", README.index("## First run\n") + 1)]
    blocks = [[line for line in b.splitlines() if line.strip()] for b in re.findall(r"```\n(.*?)```", section, re.S)]
    assert len(blocks) == 2, blocks
    return blocks[0], blocks[1]


def test_the_readme_names_the_commands_this_test_runs() -> None:
    newcomer, file_route = first_run_blocks()
    assert newcomer == ["python3 -m venv .venv && .venv/bin/pip install -q .",
                        f".venv/bin/t4serve host-check && HF_TOKEN={TOKEN_PLACEHOLDER} docker compose up"]  # fmt: skip
    assert len(file_route) == 2 and "secrets/hf_token" in file_route[0] and "umask 077" in file_route[0]
    assert file_route[1] == "DOCKER_BUILDKIT=1 docker-compose -f compose.token-file.yaml up"


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


def user_env(tmp_path: Path, docker_bin: str, clone: Path, image: str, **extra: str) -> dict[str, str]:
    """A user's environment, and what keeps this project apart from a real server on this engine."""
    return {
        "PATH": f"{Path(docker_bin).parent}:/usr/bin:/bin",
        "HOME": str(tmp_path),
        "T4SERVE_IMAGE": image,
        "T4SERVE_VOLUME_PREFIX": clone.name,
        "T4SERVE_PUBLISH_PORT": "0",
        "T4SERVE_TELEMETRY_PUBLISH_PORT": "0",
        **extra,
    }


def bash(command: str, clone: Path, env: dict[str, str], timeout: float) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(["bash", "-c", command], cwd=clone, env=env, capture_output=True, text=True,
                          timeout=timeout)  # fmt: skip
    print(f"\n$ {command}\nexit {done.returncode}; last lines:\n{(done.stdout + done.stderr)[-2500:]}")
    return done


def test_a_newcomer_on_a_host_without_gpu_or_toolkit_ends_at_host_checks_fix(
    tmp_path: Path, docker_bin: str, image_ref: str
) -> None:
    newcomer, _ = first_run_blocks()
    clone = checkout_copy(tmp_path / f"t4s-newcomer-{uuid.uuid4().hex[:6]}")
    token = f"hf_readme{uuid.uuid4().hex}"
    env = user_env(tmp_path, docker_bin, clone, image_ref)
    install = bash(newcomer[0], clone, env, INSTALL_TIMEOUT_S)
    assert install.returncode == 0, install.stderr[-3000:]
    done = bash(newcomer[1].replace(TOKEN_PLACEHOLDER, token), clone, env, 600)
    text = done.stdout + done.stderr
    assert done.returncode == 3, text[-3000:]
    # t4serve's own words, each failure with what is required and the fix; compose never ran.
    assert re.search(r"^FAIL  host-gpu +NVML unavailable on the host", done.stdout, re.M), done.stdout
    assert re.search(r"^FAIL  container-toolkit ", done.stdout, re.M), done.stdout
    assert "required: the NVIDIA Container Toolkit" in done.stdout and "fix: install the NVIDIA Container" in text
    assert DOCKERS_REFUSAL not in text and "Traceback" not in text and token not in text
    assert re.fullmatch(r"\d+ failed, \d+ warnings, \d+ ok", done.stdout.strip().splitlines()[-1])
    project = f"label=com.docker.compose.project={clone.name}"
    listed = subprocess.run([docker_bin, "ps", "-a", "-q", "--filter", project], capture_output=True, text=True,
                            timeout=60)  # fmt: skip
    assert listed.stdout.strip() == "", "compose ran after a failed host-check"


def test_the_env_secret_route_without_host_check_meets_dockers_refusal(
    tmp_path: Path, docker_bin: str, image_ref: str, compose_v2: dict[str, str]
) -> None:
    """The block's compose part alone with Compose v2: compose.yaml (its token from HF_TOKEN) is accepted, and the
    engine without the toolkit refuses the GPU reservation: the sentence host-check spares a newcomer."""
    newcomer, _ = first_run_blocks()
    compose_part = newcomer[1].split(" && ", 1)[1]
    clone = checkout_copy(tmp_path / f"t4s-envroute-{uuid.uuid4().hex[:6]}")
    token = f"hf_readme{uuid.uuid4().hex}"
    env = user_env(tmp_path, docker_bin, clone, image_ref, **compose_v2)
    try:
        done = bash(compose_part.replace(TOKEN_PLACEHOLDER, token), clone, env, 600)
        text = done.stdout + done.stderr
        assert done.returncode != 0 and DOCKERS_REFUSAL in text, text[-3000:]
        assert "is invalid" not in text and token not in text
    finally:
        subprocess.run([docker_bin, "compose", "-f", "compose.yaml", "down", "-v"], cwd=clone, env=env,
                       capture_output=True, timeout=300)  # fmt: skip


def test_the_file_route_with_docker_compose_1_29(tmp_path: Path, docker_bin: str, image_config: dict[str, Any]) -> None:
    _, (write_secret, serve) = first_run_blocks()
    clone = checkout_copy(tmp_path / f"t4s-readme-{uuid.uuid4().hex[:6]}")
    tag = f"t4serve-readme-{uuid.uuid4().hex[:8]}:test"
    token = f"hf_readme{uuid.uuid4().hex}"
    env = user_env(tmp_path, docker_bin, clone, tag, HF_TOKEN=token,
                   T4SERVE_BASE_IMAGE=image_config["Labels"]["org.opencontainers.image.base.name"])  # fmt: skip
    compose = [COMPOSE_V1, "-f", "compose.token-file.yaml"]
    try:
        done = bash(write_secret, clone, env, 60)
        assert done.returncode == 0, done.stderr
        secret = clone / "secrets" / "hf_token"
        info = secret.stat()
        assert secret.read_text() == token
        assert stat.S_IMODE(info.st_mode) == 0o600 and info.st_uid == 1000
        up = bash(serve, clone, env, BUILD_TIMEOUT_S)
        text = up.stdout + up.stderr
        assert "requires BuildKit" not in text and "the --mount option requires" not in text
        built = subprocess.run([docker_bin, "image", "inspect", tag], capture_output=True, text=True)
        assert built.returncode == 0, f"compose built no {tag}:\n{text[-3000:]}"
        labels = json.loads(built.stdout)[0]["Config"]["Labels"]
        assert labels["org.opencontainers.image.title"] == "t4serve"
        assert labels["org.opencontainers.image.base.name"] == env["T4SERVE_BASE_IMAGE"]
        # No GPU on this machine: the engine refuses the reservation (README, Troubleshooting, first entry).
        assert up.returncode != 0
        assert DOCKERS_REFUSAL in text, text[-3000:]
    finally:
        subprocess.run([*compose, "down", "-v", "--rmi", "all"], cwd=clone, env=env, capture_output=True,
                       timeout=300)  # fmt: skip
        subprocess.run([docker_bin, "rmi", "-f", tag], capture_output=True, timeout=120)
