"""FakeEngine: a test double of t4serve.host.engine.Engine, standing for the Docker Engine reached through the docker
and compose CLIs (docker info / image inspect / run --rm / compose up, ps, stop, rm, down / logs / exec / port / cp).

It keeps the engine's state in memory: whether the image exists (and its build manifest), the compose service's one
container, its log lines and the server's state (`state`, written as the state file the container's t4serve reads).
`up` sets `state_on_up` as the state, as t4serve in a started container does within seconds; with `exit_on_up` the
container exits at once instead, with that code and `log_lines`, as one with a bad setting does; with
`config_error` it runs and waits, as such a container does under compose.yaml's T4SERVE_ON_CONFIG_ERROR=wait (the
state folder then holds that error, as `serve` leaves it). `exec` of `t4serve ...` runs this checkout's real t4serve
in a child process, with the container's state folder and cache volume as folders under `root` (and `pythonpath`,
for a stand-in of what bench's client imports of vLLM), so every answer the host reads is the real command's, unless
`canned` gives the bytes a container of another image (an older, newer or hostile one) prints for that command. Every
call is recorded in `calls`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from t4serve.errors import EngineError
from t4serve.host.engine import Completed, EngineInfo, ImageInfo, Mount, ServiceContainer
from t4serve.supervise.state import (
    CONFIG_ERROR_FILE,
    STATE_FILE,
    ConfigErrorRecord,
    ServeState,
    write_config_error,
    write_state,
)

# The container's T4SERVE_STATE_DIR and T4SERVE_CACHE_DIR (the image's defaults).
STATE_DIR = "/tmp/t4serve"
CACHE_DIR = "/cache/t4serve"


@dataclass
class FakeEngine:
    root: Path
    image_ref: str = "t4serve:dev"
    project: str | None = "t4serve"
    image_present: bool = True
    manifest: dict[str, object] | None = None
    runtimes: list[str] = field(default_factory=lambda: ["io.containerd.runc.v2", "nvidia", "runc"])
    verify_code: int = 0
    build_code: int = 0
    build_lines: list[str] = field(default_factory=lambda: ["#1 [base] FROM debian:trixie-slim", "#9 DONE 1.2s"])
    container: ServiceContainer | None = None
    state: ServeState | None = None
    state_on_up: ServeState | None = None
    exit_on_up: int | None = None
    # A configuration error t4serve waits after (T4SERVE_ON_CONFIG_ERROR=wait, compose.yaml's): the container runs,
    # `t4serve status` answers exit 2 with it, and a stop ends it with exit 2.
    config_error: str | None = None
    log_lines: list[str] = field(default_factory=list)
    api_port: int | None = None
    published_container_port: int = 8000
    calls: list[tuple[str, object]] = field(default_factory=list)
    # A folder on the container's PYTHONPATH (a stand-in for what bench's client imports of vLLM), or None.
    pythonpath: Path | None = None
    # The compose client and the version it answers (`docker compose version --short`).
    compose: tuple[str, str] = ("docker compose", "2.29.1")
    # `t4serve ARGS...` -> what it prints in the container instead (exit code, stdout, stderr as given), for the
    # longest key that begins the command's arguments.
    canned: dict[tuple[str, ...], Completed] = field(default_factory=dict)

    @property
    def project_directory(self) -> Path:
        return self.root / "project"

    def in_container(self, path: str) -> Path:
        """Where a container path lives in this double's file system (a path already under it stays as it is)."""
        if Path(path).is_relative_to(self.root):
            return Path(path)
        return self.root / "container" / path.lstrip("/")

    def info(self) -> EngineInfo:
        self.calls.append(("info", None))
        return EngineInfo("27.3.1-fake", str(self.root), sorted(self.runtimes), "runc")

    def compose_version(self) -> tuple[str, str]:
        return self.compose

    def image(self) -> ImageInfo | None:
        if not self.image_present:
            return None
        return ImageInfo(self.image_ref, "sha256:" + "ab" * 32, 9_960_000_000, "2026-12-03T10:00:00Z")

    def run_in_image(self, args: Sequence[str], timeout: float) -> Completed:
        self.calls.append(("run_in_image", list(args)))
        if list(args[:1]) == ["patch"]:
            # `patch verify` needs vLLM and Triton: its output as the image's prints it.
            out = "step 1: clamp located\nstep 2: compiled for sm_75: 65,536 B\nstep 3: interpreter max abs error 0.0"
            return Completed(self.verify_code, out if self.verify_code == 0 else "step 2: FAILED", "")
        # Anything else is this checkout's t4serve, with the image's build manifest at T4SERVE_MANIFEST.
        manifest = self.in_container("/etc/t4serve/build-manifest.json")
        manifest.parent.mkdir(parents=True, exist_ok=True)
        manifest.unlink(missing_ok=True)
        if self.manifest is not None:
            manifest.write_text(json.dumps(self.manifest))
        return self._t4serve(args, {"T4SERVE_MANIFEST": str(manifest)})

    def build_image(self, on_line: Callable[[str], None], timeout: float = 3600.0) -> Completed:
        self.calls.append(("build_image", None))
        for line in self.build_lines:
            on_line(line)
        if self.build_code == 0:
            self.image_present = True
        return Completed(self.build_code, "\n".join(self.build_lines), "")

    def up(
        self, environment: Mapping[str, str], compose_env: Mapping[str, str], mounts: Sequence[Mount] = ()
    ) -> ServiceContainer:
        detail: dict[str, object] = {"environment": dict(environment), "compose_env": dict(compose_env)}
        if mounts:
            detail["mounts"] = [(m.source, m.target) for m in mounts]
        self.calls.append(("up", detail))
        self.container = ServiceContainer("c0ffee123456", "t4serve-t4serve-1", "running", "starting", 0,
                                          "2026-12-03T10:00:00Z", self.image_ref)  # fmt: skip
        if self.exit_on_up is not None:
            self.container = ServiceContainer("c0ffee123456", "t4serve-t4serve-1", "exited", None, self.exit_on_up,
                                              "2026-12-03T10:00:00Z", self.image_ref)  # fmt: skip
        elif self.state_on_up is not None:
            self.state = self.state_on_up
        return self.container

    def service(self) -> ServiceContainer | None:
        return self.container

    def stop(self, timeout: int) -> None:
        """The container stops and is kept: with a configuration error t4serve then exits 2 (`config_error`)."""
        self.calls.append(("stop", timeout))
        if self.container is not None:
            code = 2 if self.config_error is not None else 0
            self.container = dataclasses.replace(self.container, state="exited", health=None, exit_code=code)
            self.state = None

    def down(self, timeout: int) -> ServiceContainer | None:
        self.calls.append(("down", timeout))
        before, self.container, self.state = self.container, None, None
        return before

    def logs(self, container: str, tail: int, since: str | None) -> str:
        self.calls.append(("logs", (container, tail, since)))
        return "".join(line + "\n" for line in self.log_lines[-tail:])

    def exec(self, container: str, args: Sequence[str], detach: bool = False) -> Completed:
        self.calls.append(("exec", (list(args), detach)))
        if args[0] != "t4serve":
            return Completed(127, "", f"{args[0]}: not found")
        self._write_state_folder()
        return self._t4serve(args[1:], {})

    def _t4serve(self, args: Sequence[str], extra: Mapping[str, str]) -> Completed:
        """This checkout's `t4serve ARGS` as the container runs it: its folders under `root`, `bin` first on PATH (or
        what `canned` says it prints)."""
        given = [key for key in self.canned if tuple(args[: len(key)]) == key]
        if given:
            return self.canned[max(given, key=len)]
        keep = {k: v for k, v in os.environ.items() if not k.startswith(("T4SERVE_", "HF_"))}
        env = {**keep, "T4SERVE_STATE_DIR": str(self.in_container(STATE_DIR)),
               "T4SERVE_CACHE_DIR": str(self.in_container(CACHE_DIR)), "HF_HUB_OFFLINE": "1",
               "PATH": f"{self.root / 'bin'}{os.pathsep}{keep.get('PATH', '')}", **extra}  # fmt: skip
        if self.pythonpath is not None:
            env["PYTHONPATH"] = str(self.pythonpath)
        done = subprocess.run([sys.executable, "-m", "t4serve", *args], capture_output=True, text=True,
                              timeout=60, env=env, stdin=subprocess.DEVNULL)  # fmt: skip
        return Completed(done.returncode, done.stdout, done.stderr)

    def _write_state_folder(self) -> None:
        """The container's state folder as this double's state says: state.json, or the configuration error."""
        folder = self.in_container(STATE_DIR)
        folder.mkdir(parents=True, exist_ok=True)
        waiting = self.config_error is not None and self.container is not None and self.container.state == "running"
        for name, wanted in ((STATE_FILE, self.state is not None and not waiting), (CONFIG_ERROR_FILE, waiting)):
            if not wanted:
                (folder / name).unlink(missing_ok=True)
        if waiting:
            assert self.config_error is not None
            write_config_error(folder, ConfigErrorRecord(self.config_error, "T4SERVE_PORT=x (from env)",
                                                         "a port number", "unset T4SERVE_PORT", 1_790_000_000.0))
        elif self.state is not None:
            write_state(folder, self.state)

    def published_port(self, container: str, port: int) -> tuple[str, int] | None:
        # `api_port` publishes the container's `published_container_port` (compose.yaml's 8000), nothing else.
        if self.api_port is None or port != self.published_container_port:
            return None
        return ("127.0.0.1", self.api_port)

    def copy_out(self, container: str, source: str, destination: Path) -> None:
        self.calls.append(("copy_out", (source, str(destination))))
        if not self.in_container(source).is_dir():
            # As `docker cp` of a path the container lacks: the client's refusal, as DockerCli raises it.
            raise EngineError("docker cp failed", found=f"Error response from daemon: Could not find the file {source} "
                              f"in container {container}", required="the Docker engine to accept the request",
                              fix="run the same command by hand to see its whole output")  # fmt: skip
        shutil.copytree(self.in_container(source), destination)
