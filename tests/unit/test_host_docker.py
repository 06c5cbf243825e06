"""t4serve.host.docker.DockerCli against a stand-in for the docker and compose clients: a script (written per test) that
records its argv, the compose variables of its environment and any `-f` override file's content, and answers from a
table keyed by words of its argv (the longest key found in it); an answer with a fourth item plays a client that
hangs: it starts a `sleep` of its own (as a client's helper would be) and sleeps that many seconds. It stands for
`docker` and `docker-compose`; the real clients run in tests/image/test_mcp_image.py."""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from t4serve.errors import EngineError
from t4serve.host.docker import DockerCli, engine_from_environ, find_compose
from t4serve.host.engine import Cancelled, Mount, cancelled_by

CLIENT = r"""#!PYTHON
import json, os, sys
here = os.path.dirname(os.path.abspath(__file__))
argv = sys.argv[1:]
overrides = {}
for i, a in enumerate(argv):
    if a == "-f" and argv[i + 1].endswith(".json"):
        with open(argv[i + 1]) as f:
            overrides[argv[i + 1]] = json.load(f)
env = {k: v for k, v in os.environ.items()
       if k.startswith(("T4SERVE_", "HF_"))}
with open(os.path.join(here, "calls.jsonl"), "a") as f:
    record = {"prog": os.path.basename(sys.argv[0]), "argv": argv, "env": env, "overrides": overrides}
    f.write(json.dumps(record) + "\n")
with open(os.path.join(here, "answers.json")) as f:
    answers = json.load(f)
words = [a for a in argv if not a.startswith("-") and "/" not in a]
line = " " + " ".join(words) + " "
keys = sorted((k for k in answers if " " + k + " " in line), key=len, reverse=True)
if keys:
    code, out, err, *hang = answers[keys[0]]
    sys.stdout.write(out); sys.stdout.flush(); sys.stderr.write(err); sys.stderr.flush()
    if hang:
        import subprocess, time
        helper = subprocess.Popen(["sleep", str(hang[0])])
        with open(os.path.join(here, "pids.jsonl"), "a") as f:
            f.write(json.dumps([os.getpid(), helper.pid]) + "\n")
        time.sleep(hang[0])
    sys.exit(code)
sys.exit(0)
"""

INSPECT = [{"Id": "c0ffee1234567890", "Name": "/t4serve-t4serve-1", "Config": {"Image": "t4serve:dev"},
            "State": {"Status": "running", "ExitCode": 0, "StartedAt": "2026-12-03T10:00:00Z",
                      "Health": {"Status": "starting"}}}]  # fmt: skip


def make_clients(folder: Path, answers: dict[str, Any]) -> tuple[Path, Path]:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "answers.json").write_text(json.dumps(answers))
    paths = []
    for name in ("docker", "docker-compose"):
        path = folder / name
        path.write_text(CLIENT.replace("PYTHON", sys.executable))
        path.chmod(0o755)
        paths.append(path)
    return paths[0], paths[1]


def alive(pid: int) -> bool:
    """The process runs (a zombie, killed and not yet reaped by its new parent, does not)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    return "State:\tZ" not in status


def hung_pids(folder: Path) -> list[int]:
    file = folder / "pids.jsonl"
    return [pid for line in file.read_text().splitlines() for pid in json.loads(line)] if file.exists() else []


def wait_gone(pids: list[int], within: float = 10.0) -> list[int]:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline and any(alive(p) for p in pids):
        time.sleep(0.05)
    return [p for p in pids if alive(p)]


def calls(folder: Path) -> list[dict[str, Any]]:
    file = folder / "calls.jsonl"
    return [json.loads(line) for line in file.read_text().splitlines()] if file.exists() else []


def engine(tmp_path: Path, answers: dict[str, Any], **environ: str) -> tuple[DockerCli, Path]:
    bin_dir = tmp_path / "bin"
    docker, compose = make_clients(bin_dir, answers)
    project = tmp_path / "project"
    project.mkdir(exist_ok=True)
    (project / "compose.yaml").write_text("services: {}\n")
    cli = DockerCli(compose_file=project / "compose.yaml", project="t4s", image="t4serve:dev", docker=str(docker),
                    compose=[str(compose)], environ={"PATH": "/usr/bin:/bin", **environ})  # fmt: skip
    return cli, bin_dir


def test_up_passes_settings_in_an_override_file_and_compose_variables_in_the_environment(tmp_path: Path) -> None:
    cli, bin_dir = engine(tmp_path, {"ps": [0, "c0ffee1234567890\n", ""], "inspect": [0, json.dumps(INSPECT), ""]},
                          HF_TOKEN_SECRET_FILE="/srv/secrets/hf_token")  # fmt: skip
    container = cli.up({"T4SERVE_MODEL": "qat", "T4SERVE_MAX_MODEL_LEN": "8192"}, {"T4SERVE_PUBLISH_PORT": "8001"})
    assert container.id == "c0ffee123456" and container.state == "running" and container.health == "starting"
    up = calls(bin_dir)[0]
    assert up["prog"] == "docker-compose"
    project = str(tmp_path / "project")
    override = next(iter(up["overrides"]))
    assert up["argv"] == ["--project-directory", project, "-f", f"{project}/compose.yaml", "-f", override,
                          "-p", "t4s", "up", "-d", "--no-build", "t4serve"]  # fmt: skip
    assert up["overrides"][override] == {"services": {"t4serve": {"environment": {
        "T4SERVE_MODEL": "qat", "T4SERVE_MAX_MODEL_LEN": "8192"}}}}  # fmt: skip
    assert not Path(override).exists()
    assert up["env"] == {"T4SERVE_IMAGE": "t4serve:dev", "T4SERVE_PUBLISH_PORT": "8001",
                         "HF_TOKEN_SECRET_FILE": "/srv/secrets/hf_token"}  # fmt: skip


def test_down_stops_removes_with_anonymous_volumes_then_the_network(tmp_path: Path) -> None:
    cli, bin_dir = engine(tmp_path, {"ps": [0, "c0ffee1234567890\n", ""], "inspect": [0, json.dumps(INSPECT), ""]})
    before = cli.down(45)
    assert before is not None and before.name == "t4serve-t4serve-1"
    compose_tails = [c["argv"][6:] for c in calls(bin_dir) if c["prog"] == "docker-compose"]
    assert compose_tails == [["ps", "-a", "-q", "t4serve"], ["stop", "-t", "45", "t4serve"],
                             ["rm", "-f", "-v", "t4serve"], ["down", "--remove-orphans"]]  # fmt: skip


def test_service_absent_image_absent_and_logs(tmp_path: Path) -> None:
    cli, bin_dir = engine(tmp_path, {"ps": [0, "", ""], "image inspect": [1, "", "Error: No such image: t4serve:dev"],
                                     "logs": [0, "out line\n", "err line\n"]})  # fmt: skip
    assert cli.service() is None
    assert cli.image() is None
    assert sorted(cli.logs("c0ffee", 50, "10m").splitlines()) == ["err line", "out line"]
    assert calls(bin_dir)[-1]["argv"] == ["logs", "--tail", "50", "--since", "10m", "c0ffee"]


def test_throwaway_container_has_no_network_and_is_removed(tmp_path: Path) -> None:
    cli, bin_dir = engine(tmp_path, {"run": [0, '{"manifest": {}, "contract": 1}', ""]})
    assert cli.run_in_image(["probe", "--manifest-only", "--json"], 60).stdout == '{"manifest": {}, "contract": 1}'
    assert cli.run_in_image(["patch", "verify"], 60).returncode == 0
    argvs = [c["argv"] for c in calls(bin_dir)]
    names = [a[3] for a in argvs]
    assert all(n.startswith("t4serve-run-") for n in names) and len(set(names)) == 2
    assert argvs[0] == ["run", "--rm", "--name", names[0], "--label", "org.t4serve.throwaway=1", "--network", "none",
                        "--entrypoint", "t4serve", "t4serve:dev", "probe", "--manifest-only", "--json"]  # fmt: skip
    assert argvs[1] == ["run", "--rm", "--name", names[1], "--label", "org.t4serve.throwaway=1", "--network", "none",
                        "--entrypoint", "t4serve", "t4serve:dev", "patch", "verify"]  # fmt: skip


def test_published_port_and_info(tmp_path: Path) -> None:
    info = {"ServerVersion": "27.3.1", "DockerRootDir": "/data/docker", "Runtimes": {"runc": {}, "nvidia": {}},
            "DefaultRuntime": "runc"}  # fmt: skip
    cli, _ = engine(tmp_path, {"port": [0, "127.0.0.1:32768\n[::1]:32768\n", ""], "info": [0, json.dumps(info), ""]})
    assert cli.published_port("c0ffee", 8000) == ("127.0.0.1", 32768)
    got = cli.info()
    assert got.data_root == "/data/docker" and got.runtimes == ["nvidia", "runc"]


@pytest.mark.parametrize(
    ("stderr", "fix"),
    [
        ('could not select device driver "nvidia" with capabilities: [[gpu]]', "nvidia-ctk runtime configure"),
        ("Cannot connect to the Docker daemon at unix:///var/run/docker.sock. Is the docker daemon running?",
         "systemctl start docker"),
        ("Bind for 127.0.0.1:8000 failed: port is already allocated", "publish_port"),
        # docker-compose 1.29 on compose.yaml, whose token secret comes from the environment (issue 45).
        ("The Compose file './compose.yaml' is invalid because:\nsecrets.hf_token value 'environment' does not match "
         "any of the regexes: '^x-'", "compose.token-file.yaml"),
        ('environment variable "HF_TOKEN" required by secret "t4serve_hf_token" is not set', "HF_TOKEN=hf_..."),
    ],
)  # fmt: skip
def test_a_refusal_is_an_engine_error_with_the_fix(tmp_path: Path, stderr: str, fix: str) -> None:
    cli, _ = engine(tmp_path, {"up": [1, "", f"Creating t4serve ... error\n{stderr}\n"]})
    with pytest.raises(EngineError) as info:
        cli.up({}, {})
    assert info.value.exit_code == 5 and stderr in (info.value.found or "") and fix in (info.value.fix or "")


def test_a_missing_client_is_an_engine_error(tmp_path: Path) -> None:
    cli = DockerCli(compose_file=tmp_path / "compose.yaml", project=None, image="t4serve:dev",
                    docker=str(tmp_path / "nothing"), compose=[str(tmp_path / "nothing")], environ={})  # fmt: skip
    with pytest.raises(EngineError) as info:
        cli.info()
    assert "no such command" in (info.value.found or "") and info.value.fix


def test_a_missing_client_inside_a_container_says_host_check_runs_on_the_host(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`docker run IMAGE host-check`: not "install Docker on this host", but where the command runs and how."""
    marker = tmp_path / ".dockerenv"
    marker.touch()
    monkeypatch.setattr("t4serve.host.docker.CONTAINER_MARKERS", (str(tmp_path / "absent"), str(marker)))
    cli = DockerCli(compose_file=tmp_path / "compose.yaml", project=None, image="t4serve:dev",
                    docker=str(tmp_path / "nothing"), environ={})  # fmt: skip
    with pytest.raises(EngineError) as info:
        cli.info()
    message = info.value.message()
    assert f"this is a container ({marker})" in message and "are host-side commands" in message
    assert f"no such command inside this container ({marker})" in message
    assert "are host-side commands: run them on the host, not in the image" in message
    assert "`pip install .`" in message
    assert "install Docker" not in message
    monkeypatch.setattr("t4serve.host.docker.CONTAINER_MARKERS", (str(tmp_path / "absent"),))
    with pytest.raises(EngineError) as info:
        cli.info()
    assert "install Docker (docker.io or docker-ce) on this host" in info.value.message()


def test_find_compose_prefers_the_setting_then_the_plugin(tmp_path: Path) -> None:
    docker, _ = make_clients(tmp_path / "bin", {"compose version": [0, "Docker Compose version v2.29.7\n", ""]})
    assert find_compose(str(docker), {"T4SERVE_MCP_COMPOSE": "podman-compose --verbose"}) == ("podman-compose",
                                                                                             "--verbose")  # fmt: skip
    assert find_compose(str(docker), {}) == (str(docker), "compose")


def test_engine_from_environ_defaults(tmp_path: Path) -> None:
    cli = engine_from_environ({}, compose_file=tmp_path / "compose.yaml")
    assert cli.image_ref == "t4serve:dev" and cli.docker == "docker" and cli.project is None
    assert cli.project_directory == tmp_path.resolve()
    named = engine_from_environ({"T4SERVE_IMAGE": "t4serve:1", "T4SERVE_COMPOSE_PROJECT": "gpu1", "DOCKER": "/x/d",
                                 "T4SERVE_COMPOSE_FILE": str(tmp_path / "c.yaml")})  # fmt: skip
    assert (named.image_ref, named.project, named.docker) == ("t4serve:1", "gpu1", "/x/d")
    assert named.compose_file == (tmp_path / "c.yaml").resolve()
    assert os.path.basename(str(named.compose_file)) == "c.yaml"


def test_compose_without_its_file_says_which_option_fixes_it(tmp_path: Path) -> None:
    cli, bin_dir = engine(tmp_path, {})
    cli.compose_file.unlink()
    with pytest.raises(EngineError) as info:
        cli.service()
    assert "no such file" in (info.value.found or "") and "--compose-file" in (info.value.fix or "")
    assert calls(bin_dir) == []


def test_up_binds_a_model_folder_read_only_in_the_override(tmp_path: Path) -> None:
    cli, bin_dir = engine(tmp_path, {"ps": [0, "c0ffee1234567890\n", ""], "inspect": [0, json.dumps(INSPECT), ""]})
    cli.up({"T4SERVE_MODEL": "/models/gemma"}, {}, [Mount("/srv/ckpt/gemma", "/models/gemma")])
    up = calls(bin_dir)[0]
    service = next(iter(up["overrides"].values()))["services"]["t4serve"]
    assert service["volumes"] == [{"type": "bind", "source": "/srv/ckpt/gemma", "target": "/models/gemma",
                                   "read_only": True}]  # fmt: skip


def test_a_refusal_keeps_the_error_block_bounded_not_only_its_last_line(tmp_path: Path) -> None:
    block = "ERROR: for t4serve  Cannot start service t4serve: driver failed\n" + "".join(
        f"detail line {i}\n" for i in range(60)
    )
    cli, _ = engine(tmp_path, {"up": [1, "", block]})
    with pytest.raises(EngineError) as info:
        cli.up({}, {})
    found = info.value.found or ""
    assert "detail line 59" in found and "detail line 40" in found and "detail line 39" not in found
    assert len(found) < 2200


def test_restarts_are_read_from_the_container(tmp_path: Path) -> None:
    restarting = [{**INSPECT[0], "RestartCount": 3, "State": {"Status": "restarting", "ExitCode": 2}}]
    cli, _ = engine(tmp_path, {"ps": [0, "c0ffee1234567890\n", ""], "inspect": [0, json.dumps(restarting), ""]})
    container = cli.service()
    assert container is not None and container.restart_count == 3 and container.exit_code == 2


def test_a_client_past_its_timeout_is_stopped_with_what_it_started(tmp_path: Path) -> None:
    cli, bin_dir = engine(tmp_path, {"logs": [0, "", "", 60]})
    began = time.monotonic()
    with pytest.raises(EngineError) as info:
        cli._run([cli.docker, "logs", "c0ffee"], 1.0)
    assert time.monotonic() - began < 15 and "no answer within 1 s" in (info.value.found or "")
    pids = hung_pids(bin_dir)
    assert len(pids) == 2 and wait_gone(pids) == []


def test_a_cancelled_throwaway_container_is_stopped_and_removed(tmp_path: Path) -> None:
    cli, bin_dir = engine(tmp_path, {"run": [0, "step 1\n", "", 60]})
    event = threading.Event()
    threading.Timer(1.0, event.set).start()
    began = time.monotonic()
    with cancelled_by(event), pytest.raises(Cancelled):
        cli.run_in_image(["patch", "verify"], 600)
    assert time.monotonic() - began < 15
    pids = hung_pids(bin_dir)
    assert len(pids) == 2 and wait_gone(pids) == []
    run, remove = (c["argv"] for c in calls(bin_dir))
    assert remove == ["rm", "-f", "-v", run[3]]


def test_a_cancelled_build_stops_the_build_script_and_its_children(tmp_path: Path) -> None:
    cli, bin_dir = engine(tmp_path, {})
    script = cli.project_directory / "scripts" / "build-image"
    script.parent.mkdir()
    # A stand-in for scripts/build-image: a line, then a child that outlives it unless its group is stopped.
    script.write_text(f"#!/bin/sh\necho '#1 [base] FROM debian'\nsleep 300 &\necho $$ $! >{bin_dir}/build.pids\nwait\n")
    script.chmod(0o755)
    lines: list[str] = []
    event = threading.Event()
    threading.Timer(1.0, event.set).start()
    with cancelled_by(event), pytest.raises(Cancelled):
        cli.build_image(lines.append)
    assert lines == ["#1 [base] FROM debian"]
    pids = [int(p) for p in (bin_dir / "build.pids").read_text().split()]
    assert len(pids) == 2 and wait_gone(pids) == []


def test_the_compose_version_is_the_clients_short_answer(tmp_path: Path) -> None:
    cli, bin_dir = engine(tmp_path, {"version": [0, "1.29.2\n", ""]})
    assert cli.compose_version() == (str(bin_dir / "docker-compose"), "1.29.2")
    assert calls(bin_dir)[-1]["argv"] == ["version", "--short"]
