"""tests/gpu/imagebox.py against a real image, as root, without a GPU (`--no-gpu`): `make` exports it with Docker and
cuts the parts, `receive` and `assemble` lay it down as on the GPU host, and `run` starts it with no Docker involved;
what the container sees is checked from inside (PID 1, its user and groups, working directory, environment,
hostname, /dev, /dev/shm, the volume filled from the image), then `health`, `exec` and `stop` as Docker's.

The image is small and made here, on the base t4serve:dev was built on, with a HEALTHCHECK, a VOLUME, a USER and an
ENTRYPOINT that traps SIGTERM: the mechanics are the image's declarations, whatever runs inside. t4serve's own image
under imagebox ran on the GPU host (docs/verified/gpu-host-image-vllm-0.33.0/).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.image

REPO = Path(__file__).resolve().parents[2]
IMAGEBOX = REPO / "tests" / "gpu" / "imagebox.py"
DOCKERFILE = """\
ARG BASE
FROM ${BASE}
RUN useradd --uid 1000 --user-group --create-home app && groupadd -g 2000 extra && usermod -aG extra app \\
    && mkdir -p /cache/sub && echo from-the-image > /cache/sub/seed && chown -R app /cache
ENV GREETING=hello
VOLUME ["/cache"]
USER app
WORKDIR /home/app
HEALTHCHECK --interval=5s --timeout=3s CMD ["sh", "-c", "test -f /tmp/ready"]
ENTRYPOINT ["sh", "-c", "trap 'echo got TERM; exit 7' TERM; echo started; sleep 1; touch /tmp/ready; \\
while :; do sleep 0.1; done"]
"""


def box(*args: str, env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(IMAGEBOX), *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **env})


@pytest.fixture(scope="module")
def made(docker_bin: str, image_config: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    if os.geteuid() != 0 or shutil.which("unshare") is None or shutil.which("zstd") is None:
        pytest.fail("imagebox needs root, util-linux's unshare and the zstd program (scripts/test runs as root; "
                    "apt-get install zstd)")
    base = image_config["Labels"]["org.opencontainers.image.base.name"]
    tag = f"t4serve-imagebox-test:{uuid.uuid4().hex[:8]}"
    build = subprocess.run([docker_bin, "build", "-q", "--build-arg", f"BASE={base}", "-t", tag, "-"],
                           input=DOCKERFILE, capture_output=True, text=True, timeout=300,
                           env={"DOCKER_BUILDKIT": "1", "PATH": "/usr/bin:/bin"})
    assert build.returncode == 0, build.stdout + build.stderr
    out = tmp_path_factory.mktemp("imagebox-parts")
    r = box("make", tag, str(out), "--part-mib", "4", env={"DOCKER": docker_bin}, timeout=300)
    subprocess.run([docker_bin, "rmi", tag], capture_output=True, timeout=60)
    assert r.returncode == 0, r.stderr
    yield out


@pytest.fixture(scope="module")
def rootfs(made: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The parts received one at a time, as the device calls deliver them, then unpacked."""
    root = tmp_path_factory.mktemp("imagebox-host")
    manifest = json.loads((made / "manifest.json").read_text())
    assert len(manifest["parts"]) >= 2
    inbox, parts = root / "inbox", root / "parts"
    inbox.mkdir()
    shutil.copyfile(made / "manifest.json", inbox / "manifest.json")
    for entry in manifest["parts"]:
        shutil.copyfile(made / entry["name"], inbox / entry["name"])
        r = box("receive", str(inbox), str(parts), env={})
        assert r.returncode == 0, r.stderr
    assert "complete" in r.stdout
    r = box("assemble", str(parts), str(root / "rootfs"), env={})
    assert r.returncode == 0, r.stderr
    return root / "rootfs"


@pytest.fixture
def state_root(tmp_path: Path) -> Iterator[dict[str, str]]:
    env = {"IMAGEBOX_ROOT": str(tmp_path / "state")}
    yield env
    for sd in (tmp_path / "state").glob("*"):
        box("stop", sd.name, "--time", "2", env=env)


def inside(name: str, env: dict[str, str], script: str) -> str:
    r = box("exec", name, "--", "sh", "-c", script, env=env)
    assert r.returncode == 0, r.stderr
    return r.stdout


def wait_healthy(name: str, env: dict[str, str], timeout: float = 30) -> list[int]:
    codes = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        codes.append(box("health", name, env=env).returncode)
        if codes[-1] == 0:
            return codes
        time.sleep(0.2)
    pytest.fail(f"{name} never became healthy: {codes}")


def test_the_container_is_what_the_image_declares(rootfs: Path, state_root: dict[str, str]) -> None:
    r = box("run", "c1", "--rootfs", str(rootfs), "--no-gpu", "-d", "-e", "EXTRA=1", env=state_root)
    assert r.returncode == 0, r.stderr
    codes = wait_healthy("c1", state_root)
    assert codes[-1] == 0
    seen = inside("c1", state_root, "echo pid1=$(cat /proc/1/comm); id -u; id -g; id -G; pwd; echo $GREETING $EXTRA;"
                  " hostname; ls /dev; df -k /dev/shm | tail -n 1; cat /cache/sub/seed; ls /proc | grep -c '^[0-9]'")
    lines = seen.splitlines()
    assert lines[0] == "pid1=sh"  # the entrypoint is PID 1 in its own PID namespace
    assert lines[1:4] == ["1000", "1000", "1000 2000"]  # USER app with its groups from the image's /etc/group
    assert lines[4] == "/home/app" and lines[5] == "hello 1"
    assert len(lines[6]) == 12  # a hostname of its own
    assert {"null", "zero", "urandom", "shm", "pts"} <= set(lines[7:-3])
    assert not any(name.startswith("nvidia") for name in lines[7:-3])  # --no-gpu
    assert lines[-3].split()[1] == str(2 * 1024 * 1024)  # /dev/shm: 2 GiB, compose's shm_size
    assert lines[-2] == "from-the-image"  # a new volume is filled with the image's content
    assert int(lines[-1]) < 10  # only the container's processes
    # Docker's stop: SIGTERM to PID 1 (its trap exits 7), the exit code kept.
    r = box("stop", "c1", "--time", "10", env=state_root)
    assert r.returncode == 0 and "exited 7" in r.stdout
    log = (Path(state_root["IMAGEBOX_ROOT"]) / "c1" / "log").read_text()
    assert "started" in log and "got TERM" in log


def test_health_is_the_images_command_and_a_restart_keeps_the_writable_layer(
    rootfs: Path, state_root: dict[str, str]
) -> None:
    assert box("run", "c2", "--rootfs", str(rootfs), "--no-gpu", "-d", env=state_root).returncode == 0
    codes = wait_healthy("c2", state_root)
    assert codes[0] == 1 or len(codes) == 1  # unhealthy until the entrypoint touched /tmp/ready
    inside("c2", state_root, "echo kept > /home/app/note; echo v > /cache/v")
    assert box("stop", "c2", env=state_root).returncode == 0
    assert box("run", "c2", "--rootfs", str(rootfs), "--no-gpu", "-d", env=state_root).returncode == 0
    assert inside("c2", state_root, "cat /home/app/note /cache/v").split() == ["kept", "v"]
    # The unpacked image itself is untouched: the write went to the container's layer.
    assert not (rootfs / "home/app/note").exists()


def test_a_host_without_nvidia_devices_is_told_so(rootfs: Path, state_root: dict[str, str]) -> None:
    if list(Path("/dev").glob("nvidia[0-9]*")):
        pytest.skip("this host has an NVIDIA device")
    r = box("run", "c3", "--rootfs", str(rootfs), "-d", env=state_root)
    assert r.returncode == 2
    assert "this host shows no NVIDIA device" in r.stderr and "fix:" in r.stderr
    assert "Traceback" not in r.stderr
