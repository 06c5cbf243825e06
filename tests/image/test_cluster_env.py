"""What the image's environment does on a Kubernetes node: GKE's driver location and vLLM's usage statistics.

GKE's device plugin does not inject the driver as the NVIDIA Container Toolkit does: it mounts the node's driver
folder at /usr/local/nvidia (lib64, bin), and the image must look there. The test mounts a folder of its own at that
path, as the device plugin's hostPath mount would appear, with a shared library under libcuda's and libnvidia-ml's
names (a copy of the image's own libz: any ELF library shows where the loader looks) and an `nvidia-smi` script, and
checks that the loader and the shell find them through the image's LD_LIBRARY_PATH and PATH alone."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from .conftest import RunInImage

pytestmark = pytest.mark.image

GKE_DRIVER = "/usr/local/nvidia"
# Run in the image with a folder mounted at /usr/local/nvidia: lay out the driver as GKE's installer does, then load
# each library by its bare name (as torch loads libcuda and pynvml libnvidia-ml) and report where it came from.
LAYOUT = r"""
set -eu
mkdir -p /usr/local/nvidia/lib64 /usr/local/nvidia/bin
src=$(ldconfig -p | awk '/libz\.so\.1 /{print $NF; exit}')
cp "$src" /usr/local/nvidia/lib64/libcuda.so.1
cp "$src" /usr/local/nvidia/lib64/libnvidia-ml.so.1
printf '#!/bin/sh\necho nvidia-smi from the node driver\n' > /usr/local/nvidia/bin/nvidia-smi
chmod 0755 /usr/local/nvidia/bin/nvidia-smi
python3 - <<'EOF'
import ctypes
for name in ("libcuda.so.1", "libnvidia-ml.so.1"):
    ctypes.CDLL(name)
    maps = open("/proc/self/maps").read()
    print(name, "loaded from /usr/local/nvidia/lib64" if "/usr/local/nvidia/lib64/" + name in maps else "NOT FOUND")
EOF
command -v nvidia-smi
nvidia-smi
"""


def test_the_gke_driver_mount_is_found_without_any_pod_setting(run_in_image: RunInImage, tmp_path: Path) -> None:
    node = tmp_path / "nvidia"
    node.mkdir()
    node.chmod(0o777)
    out = run_in_image("-c", LAYOUT, entrypoint="sh", extra=["-v", f"{node}:{GKE_DRIVER}"])
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    assert "libcuda.so.1 loaded from /usr/local/nvidia/lib64" in lines, out.stdout
    assert "libnvidia-ml.so.1 loaded from /usr/local/nvidia/lib64" in lines, out.stdout
    assert "/usr/local/nvidia/bin/nvidia-smi" in lines and "nvidia-smi from the node driver" in lines


def test_without_the_mount_nothing_changes(run_in_image: RunInImage, image_config: dict[str, Any]) -> None:
    """Docker with the Container Toolkit: /usr/local/nvidia is absent; the image's own programs come first on PATH."""
    env = dict(item.split("=", 1) for item in image_config["Env"])
    assert env["PATH"].split(":")[0] == "/opt/venv/bin" and env["PATH"].endswith(":/usr/local/nvidia/bin")
    out = run_in_image("-c", "test ! -e /usr/local/nvidia && command -v t4serve && command -v python3", entrypoint="sh")
    assert out.returncode == 0 and out.stdout.split() == ["/opt/venv/bin/t4serve", "/opt/venv/bin/python3"]


def test_vllm_sends_no_usage_statistics(run_in_image: RunInImage, image_config: dict[str, Any]) -> None:
    env = dict(item.split("=", 1) for item in image_config["Env"])
    assert env["VLLM_NO_USAGE_STATS"] == "1" and env["DO_NOT_TRACK"] == "1" and env["HF_HUB_DISABLE_TELEMETRY"] == "1"
    # vLLM's own decision, from its own code (vllm/usage/usage_lib.py).
    code = "from vllm.usage.usage_lib import is_usage_stats_enabled; print(is_usage_stats_enabled())"
    out = run_in_image("-c", code, entrypoint="python3", timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "False"
