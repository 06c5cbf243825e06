"""scripts/publish against a real registry on this machine: Debian's docker-registry (the CNCF distribution registry)
listening on 127.0.0.1, started and stopped here. The image under test is pushed once per session (6.3 GB: minutes),
then checked from the registry's side (the manifest by digest and every blob it names), pinned in a kustomization of
its own, pulled back by digest and run: `t4serve plan` from the pulled image.

The engine already holds the image's layers, so the pull fetches the manifest and config by digest and finds every
layer in place: what it proves is that the digest names this image in that registry; the blobs' presence and sizes
are checked over the registry's HTTP API instead. Only references this test makes are removed (`docker rmi` of a
second reference removes the reference, never the image)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from .conftest import REPO

pytestmark = pytest.mark.image

REGISTRY_BIN = os.environ.get("T4SERVE_REGISTRY_BIN", "docker-registry")
NAME = "t4serve-test/t4serve"
TAG = "publish-test"
# Bounds: the registry's start, one push of the whole image, a pull and a run.
REGISTRY_START_S = 30
PUSH_TIMEOUT_S = 1800
RUN_TIMEOUT_S = 300
MANIFEST_TYPES = ", ".join([
    "application/vnd.docker.distribution.manifest.v2+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.oci.image.index.v1+json",
])  # fmt: skip


@dataclass(frozen=True)
class Registry:
    host: str  # 127.0.0.1:PORT

    def url(self, path: str) -> str:
        return f"http://{self.host}/v2/{path}"


@dataclass(frozen=True)
class Published:
    repo: str
    digest: str
    stdout: str
    kustomization: Path
    push_s: float


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@pytest.fixture(scope="session")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    """docker-registry on 127.0.0.1:PORT with its storage in a temporary folder, stopped (and its storage removed)
    at the end of the session."""
    binary = shutil.which(REGISTRY_BIN)
    if binary is None:
        pytest.fail(f"{REGISTRY_BIN} not found (T4SERVE_REGISTRY_BIN); scripts/publish's image test pushes to it. Fix: "
                    "apt-get install docker-registry (.ci/run installs it)")  # fmt: skip
    folder = tmp_path_factory.mktemp("registry")
    host = f"127.0.0.1:{free_port()}"
    storage = {"filesystem": {"rootdirectory": str(folder / "storage")}, "delete": {"enabled": True}}
    config = {"version": 0.1, "log": {"level": "warn"}, "http": {"addr": host}, "storage": storage}
    (folder / "config.yml").write_text(yaml.safe_dump(config))
    log = (folder / "registry.log").open("w")
    process = subprocess.Popen([binary, "serve", str(folder / "config.yml")], stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + REGISTRY_START_S
        while True:
            try:
                with urllib.request.urlopen(f"http://{host}/v2/", timeout=2) as answer:
                    if answer.status == 200:
                        break
            except (urllib.error.URLError, OSError):
                pass
            if process.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"docker-registry did not answer on {host} within {REGISTRY_START_S} s (exit "
                            f"{process.poll()}):\n{(folder / 'registry.log').read_text()[-2000:]}")  # fmt: skip
            time.sleep(0.2)
        yield Registry(host)
    finally:
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=15)
        log.close()
        shutil.rmtree(folder / "storage", ignore_errors=True)


def publish(args: list[str], docker_bin: str, image: str, timeout: float) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "T4SERVE_IMAGE": image, "DOCKER": docker_bin, "T4SERVE_PUSH_TIMEOUT_S": str(int(timeout))}
    return subprocess.run([str(REPO / "scripts" / "publish"), *args], capture_output=True, text=True, env=env,
                          timeout=timeout + 120)  # fmt: skip


def kustomization_beside_deploy(folder: Path) -> Path:
    """A user's kustomization over the GKE overlay, beside a link to this repository's deploy/, as docs/kubernetes.md
    lays it out; scripts/publish pins into it (the repository's own files stay untouched)."""
    (folder / "deploy").symlink_to(REPO / "deploy")
    (folder / "mine").mkdir()
    path = folder / "mine" / "kustomization.yaml"
    path.write_text("# my t4serve\nresources:\n  - ../deploy/kubernetes/overlays/gke-t4\nimages:\n  - name: t4serve\n"
                    "    newName: REGISTRY/t4serve\n    newTag: \"0.1.0\"\n")  # fmt: skip
    return path


@pytest.fixture(scope="session")
def published(registry: Registry, docker_bin: str, image_ref: str,
              tmp_path_factory: pytest.TempPathFactory) -> Iterator[Published]:  # fmt: skip
    """One push of the image under test per session."""
    kustomization = kustomization_beside_deploy(tmp_path_factory.mktemp("publish"))
    repo = f"{registry.host}/{NAME}"
    began = time.monotonic()
    out = publish(["--kustomization", str(kustomization), f"{repo}:{TAG}"], docker_bin, image_ref, PUSH_TIMEOUT_S)
    push_s = time.monotonic() - began
    try:
        assert out.returncode == 0, out.stdout + out.stderr[-4000:]
        digest = out.stdout.strip().rpartition("@")[2]
        size = subprocess.run([docker_bin, "image", "inspect", "-f", "{{.Size}}", image_ref], capture_output=True,
                              text=True).stdout.strip()  # fmt: skip
        print(f"\nscripts/publish pushed {image_ref} ({int(size) / 1e9:.2f} GB) to {repo}:{TAG} in {push_s:.0f} s")
        yield Published(repo, digest, out.stdout, kustomization, push_s)
    finally:
        for ref in (f"{repo}:{TAG}", *(f"{repo}@{d}" for d in _digests_here(docker_bin, repo))):
            subprocess.run([docker_bin, "rmi", ref], capture_output=True, timeout=120)


def _digests_here(docker_bin: str, repo: str) -> list[str]:
    out = subprocess.run([docker_bin, "image", "ls", "--digests", "--format", "{{.Repository}} {{.Digest}}"],
                         capture_output=True, text=True)  # fmt: skip
    return [line.split()[1] for line in out.stdout.splitlines() if line.split()[:1] == [repo] and "sha256:" in line]


def fetch(registry: Registry, path: str, method: str = "GET") -> tuple[int, dict[str, str], bytes]:
    request = urllib.request.Request(registry.url(path), method=method, headers={"Accept": MANIFEST_TYPES})
    try:
        with urllib.request.urlopen(request, timeout=60) as answer:
            return answer.status, dict(answer.headers), answer.read() if method == "GET" else b""
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), b""


def test_publish_prints_the_digest_the_registry_serves_with_every_blob(published: Published,
                                                                       registry: Registry) -> None:  # fmt: skip
    assert published.stdout == f"{published.repo}@{published.digest}\n"
    status, _, body = fetch(registry, f"{NAME}/manifests/{published.digest}")
    assert status == 200
    # A digest names the bytes: the manifest the registry serves under it hashes to it.
    assert "sha256:" + hashlib.sha256(body).hexdigest() == published.digest
    manifest = json.loads(body)
    manifests = [manifest]
    for entry in manifest.get("manifests", []):  # an index (the containerd image store pushes one)
        status, _, sub = fetch(registry, f"{NAME}/manifests/{entry['digest']}")
        assert status == 200 and "sha256:" + hashlib.sha256(sub).hexdigest() == entry["digest"]
        manifests.append(json.loads(sub))
    blobs = [b for m in manifests for b in ([m["config"]] if "config" in m else []) + m.get("layers", [])]
    assert len(blobs) > 5, "expected the config and the image's layers"
    for blob in blobs:
        status, headers, _ = fetch(registry, f"{NAME}/blobs/{blob['digest']}", method="HEAD")
        assert status == 200, blob
        assert int(headers["Content-Length"]) == blob["size"], blob
    # And the tag points at the same digest.
    status, headers, _ = fetch(registry, f"{NAME}/manifests/{TAG}", method="HEAD")
    assert status == 200 and headers["Docker-Content-Digest"] == published.digest


def test_publish_pins_that_digest_in_the_kustomization(published: Published) -> None:
    text = published.kustomization.read_text()
    assert text.startswith("# my t4serve\n") and "newTag" not in text
    rendered = subprocess.run(["kubectl", "kustomize", str(published.kustomization.parent)], capture_output=True,
                              text=True, timeout=120)  # fmt: skip
    assert rendered.returncode == 0, rendered.stderr
    deployment = next(d for d in yaml.safe_load_all(rendered.stdout) if d and d["kind"] == "Deployment")
    assert deployment["spec"]["template"]["spec"]["containers"][0]["image"] == f"{published.repo}@{published.digest}"


def test_the_image_pulled_by_digest_plans(published: Published, docker_bin: str) -> None:
    ref = f"{published.repo}@{published.digest}"
    pull = subprocess.run([docker_bin, "pull", ref], capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    assert pull.returncode == 0, pull.stderr
    out = subprocess.run([docker_bin, "run", "--rm", "--network", "none", "-e", "HF_HUB_OFFLINE=1", ref, "plan",
                          "--gpu", "t4"], capture_output=True, text=True, timeout=RUN_TIMEOUT_S)  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    assert "vllm serve" in out.stdout and "--max-model-len" in out.stdout


def test_a_push_that_fails_pins_nothing(docker_bin: str, image_ref: str, tmp_path: Path) -> None:
    """Nothing listens on the port: docker push fails, publish says so with the fix, and the kustomization is as it
    was (no half-written file beside it either)."""
    kustomization = kustomization_beside_deploy(tmp_path)
    before = kustomization.read_text()
    repo = f"127.0.0.1:{free_port()}/{NAME}"
    try:
        out = publish(["--kustomization", str(kustomization), f"{repo}:{TAG}"], docker_bin, image_ref, 300)
    finally:
        subprocess.run([docker_bin, "rmi", f"{repo}:{TAG}"], capture_output=True, timeout=120)
    assert out.returncode == 5 and out.stdout == ""  # the engine's failure, as t4serve's EngineError
    assert f"docker push {repo}:{TAG} failed" in out.stderr and "nothing was pinned" in out.stderr
    assert "docker login 127.0.0.1:" in out.stderr
    assert kustomization.read_text() == before
    assert sorted(p.name for p in kustomization.parent.iterdir()) == ["kustomization.yaml"]
