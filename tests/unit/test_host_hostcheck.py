"""Host checks (t4serve.host.hostcheck) and `t4serve host-check`: the Docker side is FakeEngine
(tests/unit/fake_engine.py), the host's NVML FakeNvml; /proc, /sys and the disk are this machine's own."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest
from fake_engine import FakeEngine
from sample_facts import MANIFEST
from test_probes_gpu import FakeDevice, FakeNvml

from t4serve import cli
from t4serve.config.settings import Settings
from t4serve.host.engine import EngineInfo
from t4serve.host.hostcheck import (
    IMAGE_SIZE_ESTIMATE,
    check_compose_client,
    check_compose_shm,
    check_docker_disk,
    check_host,
    check_toolkit,
    compose_limits,
    compose_token_route,
    host_facts,
    image_manifest,
)
from t4serve.planning.derived import format_bytes
from t4serve.preflight import IMAGE_BYTES
from t4serve.serde import to_dict
from t4serve.units import GIB

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def engine(tmp_path: Path) -> FakeEngine:
    manifest = {k: v for k, v in to_dict(MANIFEST).items() if k not in ("path", "present", "error")}
    return FakeEngine(tmp_path, manifest=manifest)


def settings(**env: str) -> Settings:
    return Settings.from_environ({"HF_HUB_OFFLINE": "1", **env})


def test_compose_limits_read_docker_sizes() -> None:
    assert compose_limits((REPO / "compose.yaml").read_text()) == (2 * GIB, None, False)
    text = "services:\n  t4serve:\n    shm_size: '512m'\n    mem_limit: 8g\n    ipc: host\n"
    assert compose_limits(text) == (512 * 2**20, 8 * GIB, True)
    assert compose_limits("services:\n  t4serve:\n    image: x\n") == (None, None, False)


def test_shm_levels(tmp_path: Path) -> None:
    compose = tmp_path / "compose.yaml"
    assert check_compose_shm(2 * GIB, False, compose).level == "ok"
    assert check_compose_shm(None, True, compose).level == "ok"
    low = check_compose_shm(256 * 2**20, False, compose)
    assert low.level == "warn" and "2gb" in low.fix
    missing = check_compose_shm(None, False, compose)
    assert missing.level == "fail" and "64 MiB" in missing.found and "shm_size: 2gb" in missing.fix


def test_toolkit_configured_installed_or_missing() -> None:
    configured = EngineInfo("27.0", "/var/lib/docker", ["nvidia", "runc"], "runc")
    assert check_toolkit(configured, lambda name: None).level == "ok"
    bare = EngineInfo("27.0", "/var/lib/docker", ["runc"], "runc")
    installed = check_toolkit(bare, lambda name: "/usr/bin/nvidia-ctk" if name == "nvidia-ctk" else None)
    assert installed.level == "fail" and installed.fix.startswith("`sudo nvidia-ctk runtime configure")
    missing = check_toolkit(bare, lambda name: None)
    assert missing.level == "fail" and "install the NVIDIA Container Toolkit" in missing.fix


def test_docker_disk_counts_the_image_only_when_absent(engine: FakeEngine) -> None:
    s = settings()
    facts = host_facts(s, {}, engine, info=engine.info(), image=engine.image(), nvml=FakeNvml([FakeDevice()]))
    disk = facts.host.disks[0]
    present = check_docker_disk(facts, engine.image(), s)
    absent = check_docker_disk(facts, None, s)
    assert f"image {format_bytes(0)} (t4serve:dev present)" in present.required
    assert f"image {format_bytes(IMAGE_SIZE_ESTIMATE)} (to pull or build" in absent.required
    tight = dataclasses.replace(facts, host=dataclasses.replace(facts.host, disks=[
        dataclasses.replace(disk, free_bytes=5 * GIB)]))  # fmt: skip
    short = check_docker_disk(tight, None, s)
    assert short.level == "fail" and "docker system df" in short.fix and "free " in short.fix
    # How much the image needs there, and how to move the data root to a larger disk.
    assert f"{format_bytes(IMAGE_BYTES)} measured + 5% to unpack" in short.required
    assert IMAGE_SIZE_ESTIMATE == IMAGE_BYTES * 105 // 100
    assert '"data-root": "/new/path" in /etc/docker/daemon.json' in short.fix
    assert "5.000 GiB free" in short.found and "(Docker's data root " in short.found


def test_docker_disk_that_could_not_be_measured_fails_with_the_reason(engine: FakeEngine) -> None:
    s = settings()
    facts = host_facts(s, {}, engine, info=engine.info(), image=engine.image(), nvml=FakeNvml([FakeDevice()]))
    unread = dataclasses.replace(facts.host.disks[0], free_bytes=None, total_bytes=None, filesystem_id=None,
                                 unreadable="/var/lib/docker (measured at /var/lib/docker): Permission denied")
    unread_facts = dataclasses.replace(facts, host=dataclasses.replace(facts.host, disks=[unread]))
    finding = check_docker_disk(unread_facts, None, s)
    disk_path = facts.host.disks[0].path
    assert (finding.check, finding.level) == ("docker-disk", "fail")
    assert "Permission denied" in finding.found and "image" in finding.required and disk_path in finding.fix


def test_image_manifest_read_from_the_image_or_says_why_not(engine: FakeEngine) -> None:
    manifest = image_manifest(engine, engine.image())
    assert manifest.present and manifest.torch_arch_list == MANIFEST.torch_arch_list
    assert manifest.path == "t4serve:dev:/etc/t4serve/build-manifest.json"
    # Read by the image's own t4serve, as the typed answer of the host/container contract.
    assert ("run_in_image", ["probe", "--manifest-only", "--json"]) in engine.calls
    absent = image_manifest(engine, None)
    assert not absent.present and "apply_turing_patch" in (absent.error or "")
    engine.manifest = {"torch_arch_list": "sm_75"}  # a wrong shape
    broken = image_manifest(engine, engine.image())
    assert not broken.present and "t4serve:dev:/etc/t4serve/build-manifest.json" in (broken.error or "")
    assert "/tmp/" not in (broken.error or "")


def test_check_host_with_a_memory_limit_in_compose(engine: FakeEngine, tmp_path: Path) -> None:
    compose = tmp_path / "compose.yaml"
    compose.write_text((REPO / "compose.yaml").read_text().replace("shm_size: 2gb", "shm_size: 2gb\n    mem_limit: 1g"))
    findings = {f.check: f for f in check_host(settings(), {}, engine, compose, nvml=FakeNvml([FakeDevice()]))}
    memory = findings["host-memory"]
    assert memory.level == "fail" and "memory limit" in memory.fix and "mem_limit" in memory.fix
    assert [f for f in findings] == ["docker", "host-gpu", "driver", "container-toolkit", "docker-disk",
                                     "host-memory", "shm", "compose-client"]  # fmt: skip


def test_check_host_without_a_compose_file(engine: FakeEngine, tmp_path: Path) -> None:
    findings = check_host(settings(), {}, engine, tmp_path / "nowhere.yaml", nvml=FakeNvml([FakeDevice()]))
    assert findings[-1].check == "compose" and findings[-1].level == "fail" and "--compose-file" in findings[-1].fix


def test_host_check_command(engine: FakeEngine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                            capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    """The command's own wiring, with the engine faked and NVML real: this machine has no GPU, so exit 3."""
    shutil.copy(REPO / "compose.yaml", tmp_path / "compose.yaml")
    monkeypatch.setattr("t4serve.host.docker.engine_from_environ", lambda environ, **kw: _with_file(engine, kw))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    code = cli.main(["host-check", "--json", "--compose-file", str(tmp_path / "compose.yaml")])
    out = json.loads(capsys.readouterr().out)
    levels = {f["check"]: f["level"] for f in out}
    assert levels["container-toolkit"] == "ok" and levels["shm"] == "ok"
    assert code == (3 if "fail" in levels.values() else 0)
    code = cli.main(["host-check", "--compose-file", str(tmp_path / "compose.yaml")])
    assert "container-toolkit" in capsys.readouterr().out


def _with_file(engine: FakeEngine, options: dict[str, object]) -> FakeEngine:
    engine.compose_file = options["compose_file"]  # type: ignore[attr-defined]
    return engine


def test_docker_disk_says_when_the_checkpoint_size_is_unknown(engine: FakeEngine) -> None:
    s = settings(T4SERVE_MODEL="org/not-local")
    facts = host_facts(s, {}, engine, info=engine.info(), image=None, nvml=FakeNvml([FakeDevice()]))
    finding = check_docker_disk(facts, None, s)
    assert "org/not-local into the hf-cache volume; its size is unknown" in finding.required


def test_without_a_docker_engine_the_checks_that_need_none_are_still_made(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`host-check` on a host whose engine is down (issue 45: it said only "Cannot connect to the Docker daemon", 0
    ok): the real docker client path, with a stand-in for a docker client that finds no engine; NVML is this
    machine's (no GPU)."""
    client = tmp_path / "docker"
    client.write_text(
        "#!/bin/sh\n# Stands for the docker client on a host whose engine is not running.\n"
        "echo 'Cannot connect to the Docker daemon at unix:///var/run/docker.sock. Is the docker daemon running?' >&2\n"
        "exit 1\n"
    )
    client.chmod(0o755)
    shutil.copy(REPO / "compose.yaml", tmp_path / "compose.yaml")
    monkeypatch.setenv("DOCKER", str(client))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    code = cli.main(["host-check", "--json", "--compose-file", str(tmp_path / "compose.yaml")])
    findings = {f["check"]: f for f in json.loads(capsys.readouterr().out)}
    assert code == 3
    docker = findings["docker"]
    assert docker["level"] == "fail" and "Cannot connect to the Docker daemon" in docker["found"]
    assert "start the Docker engine" in findings["docker"]["fix"]
    assert {"host-gpu", "container-toolkit", "host-memory", "shm"} <= set(findings)
    assert "not installed on this host" in findings["host-gpu"]["found"] or findings["host-gpu"]["level"] == "ok"
    assert "container" not in findings["host-gpu"]["found"], "on the host no container is involved"
    assert findings["shm"]["level"] == "ok"
    assert "docker-disk" not in findings, "Docker's data root is known only to the engine"


def test_the_toolkit_without_an_engine() -> None:
    missing = check_toolkit(None, lambda name: None)
    assert missing.level == "fail" and "no Docker engine to ask" in missing.found
    installed = check_toolkit(None, lambda name: "/usr/bin/nvidia-ctk" if name == "nvidia-ctk" else None)
    assert installed.level == "warn" and "needs the engine" in installed.found


def test_host_check_help_is_short_and_takes_the_model(
    engine: FakeEngine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 45: its --help was 180 lines of every serve setting; the host check needs only the model."""
    assert cli.main(["host-check", "--help"]) == 0
    assert len(capsys.readouterr().out.splitlines()) <= 30
    shutil.copy(REPO / "compose.yaml", tmp_path / "compose.yaml")
    monkeypatch.setattr("t4serve.host.docker.engine_from_environ", lambda environ, **kw: _with_file(engine, kw))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    cli.main(["host-check", "--json", "--model", "bf16", "--compose-file", str(tmp_path / "compose.yaml")])
    disk = next(f for f in json.loads(capsys.readouterr().out) if f["check"] == "docker-disk")
    assert "google/gemma-4-E2B-it into the hf-cache volume" in disk["required"]


@pytest.mark.parametrize(
    ("compose_file", "client", "level"),
    [
        ("compose.yaml", ("docker compose", "5.6.1"), "ok"),
        ("compose.yaml", ("docker compose", "v2.20.0"), "ok"),
        ("compose.yaml", ("docker compose", "2.19.1"), "fail"),
        ("compose.yaml", ("/usr/bin/docker-compose", "1.29.2"), "fail"),
        ("compose.token-file.yaml", ("/usr/bin/docker-compose", "1.29.2"), "ok"),
        ("compose.yaml", ("docker compose", "dev"), "warn"),
    ],
)
def test_the_compose_client_reads_the_token_route_of_the_file(
    compose_file: str, client: tuple[str, str], level: str, engine: FakeEngine
) -> None:
    """compose.yaml takes the token from HF_TOKEN, which docker-compose 1.29 refuses and Compose v2 before 2.20
    copies readable by root alone; compose.token-file.yaml (the file route) reads it from a file (issue 45)."""
    engine.compose = client
    path = REPO / compose_file
    finding = check_compose_client(engine, path.read_text(), path)
    assert finding.level == level, finding
    if level == "fail":
        assert "compose.token-file.yaml" in finding.fix and "Compose v2.20 or later" in finding.fix


def test_the_token_route_of_each_compose_file() -> None:
    assert compose_token_route((REPO / "compose.yaml").read_text()) == "environment"
    assert compose_token_route((REPO / "compose.token-file.yaml").read_text()) == "file"
    assert compose_token_route("services:\n  t4serve:\n    image: x\n") is None
