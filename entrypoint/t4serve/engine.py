"""The one module that talks to the Docker Engine, for the host-side commands (`t4serve host-check`, `t4serve mcp`).

It drives the engine through its command-line clients, `docker` and compose (`docker compose`, else
`docker-compose`), not the `docker` Python SDK. compose.yaml *is* the deployment: the GPU reservation, /dev/shm, the
loopback ports, the cache volumes, the HF token secret, the healthcheck and the stop grace period live there, and
only compose reads that file. Through the SDK each of those would be re-stated in Python and would drift from the
file users run `docker compose up` with; through compose, `start_vllm_server` and `docker compose up` start the same
service, and a user can take over with plain compose at any point. The `docker` client covers what compose does not
(engine info, image inspect, a throwaway container of the image, exec, logs, copying a folder out), with the same
client and configuration (contexts, DOCKER_HOST) the user's own commands use, and no new dependency.

Every call is bounded by a timeout and checked; a failure is an `EngineError` with what was found and the fix. No
argument carries a secret: the HF token stays in compose's secret file (this module checks the file exists, never
reads it), and the API key is not passed to the engine at all. `Engine` is the interface the tools use; tests fake it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from t4serve.atomic import write_atomic
from t4serve.errors import EngineError

SERVICE = "t4serve"
API_PORT = 8000
MANIFEST_PATH = "/etc/t4serve/build-manifest.json"
# Bounds for one engine call: a quick query, compose up/down (stop grace 90 s in compose.yaml), an image build.
QUICK_TIMEOUT_S = 60.0
COMPOSE_TIMEOUT_S = 180.0
BUILD_TIMEOUT_S = 3600.0
# Variables compose.yaml interpolates (not settings of the container): passed to compose from this environment.
COMPOSE_VARIABLES = (
    "T4SERVE_IMAGE",
    "T4SERVE_GPU",
    "T4SERVE_PUBLISH_PORT",
    "T4SERVE_TELEMETRY_PUBLISH_PORT",
    "T4SERVE_VOLUME_PREFIX",
    "HF_TOKEN_SECRET_FILE",
)
HOST_SIDE_FIX = (
    "`t4serve host-check` and `t4serve mcp` are host-side commands: run them on the host, not in the image. From a "
    "checkout of t4serve, `pip install .` (Python >= 3.11; a venv keeps it apart), then `t4serve host-check "
    "--compose-file compose.yaml` (docs/mcp.md, Install and run)"
)
# Files a container runtime leaves at the root of a container, and the t4serve image's own manifest.
CONTAINER_MARKERS = ("/.dockerenv", "/run/.containerenv", MANIFEST_PATH)
ENGINE_FIX = (
    "start the Docker engine (`sudo systemctl start docker`) and check that this user may use it (`docker info`)"
)


@dataclass(frozen=True)
class Completed:
    """A finished command: exit code and its text output."""

    returncode: int
    stdout: str
    stderr: str


@dataclass(frozen=True)
class ImageInfo:
    ref: str
    id: str
    size_bytes: int
    created: str


@dataclass(frozen=True)
class EngineInfo:
    """What `docker info` says that the host checks need."""

    server_version: str
    data_root: str
    runtimes: list[str]
    default_runtime: str
    cdi_spec_dirs: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class ServiceContainer:
    """The compose service's container as the engine reports it."""

    id: str
    name: str
    state: str  # created, running, restarting, exited, ...
    health: str | None  # starting, healthy, unhealthy; None without a healthcheck
    exit_code: int
    started_at: str
    image: str


class Engine(Protocol):
    """What the host-side tools need from the Docker Engine."""

    @property
    def image_ref(self) -> str: ...

    @property
    def project_directory(self) -> Path: ...

    def info(self) -> EngineInfo: ...

    def image(self) -> ImageInfo | None: ...

    def read_image_file(self, path: str) -> str | None: ...

    def run_in_image(self, args: Sequence[str], timeout: float) -> Completed: ...

    def build_image(self, on_line: Callable[[str], None], timeout: float = BUILD_TIMEOUT_S) -> Completed: ...

    def up(self, environment: Mapping[str, str], compose_env: Mapping[str, str]) -> ServiceContainer: ...

    def service(self) -> ServiceContainer | None: ...

    def down(self, timeout: int) -> ServiceContainer | None: ...

    def logs(self, container: str, tail: int, since: str | None) -> str: ...

    def exec(self, container: str, args: Sequence[str], detach: bool = False) -> Completed: ...

    def published_port(self, container: str, port: int) -> tuple[str, int] | None: ...

    def copy_out(self, container: str, source: str, destination: Path) -> None: ...


def inside_a_container() -> str | None:
    """Which marker says this process runs in a container (the t4serve image or any other), or None."""
    return next((marker for marker in CONTAINER_MARKERS if os.path.exists(marker)), None)


def find_compose(docker: str, environ: Mapping[str, str]) -> tuple[str, ...]:
    """The compose client: T4SERVE_MCP_COMPOSE (shell words), else `docker compose` when the plugin answers, else
    `docker-compose` on PATH."""
    chosen = environ.get("T4SERVE_MCP_COMPOSE", "").split()
    if chosen:
        return tuple(chosen)
    try:
        plugin = subprocess.run([docker, "compose", "version"], capture_output=True, text=True, timeout=QUICK_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired):
        plugin = None
    if plugin is not None and plugin.returncode == 0:
        return (docker, "compose")
    standalone = shutil.which("docker-compose")
    if standalone:
        return (standalone,)
    raise EngineError(
        "no compose client found",
        found=f"`{docker} compose` is not a command here and docker-compose is not on PATH",
        required="Docker Compose v2 (`docker compose`) or docker-compose 1.29",
        fix="install the compose plugin (`sudo apt-get install docker-compose-plugin`), or set T4SERVE_MCP_COMPOSE to "
        "the compose command",
    )


class DockerCli:
    """`Engine` through the `docker` and compose command-line clients."""

    def __init__(
        self,
        *,
        compose_file: Path,
        project: str | None,
        image: str,
        docker: str = "docker",
        compose: Sequence[str] | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        self.compose_file = compose_file.resolve()
        self.project = project
        self._image = image
        self.docker = docker
        self.environ = dict(os.environ if environ is None else environ)
        self._compose = tuple(compose) if compose else None

    @property
    def image_ref(self) -> str:
        return self._image

    @property
    def project_directory(self) -> Path:
        return self.compose_file.parent

    # ----- plumbing
    def _run(
        self, argv: Sequence[str], timeout: float, env: Mapping[str, str] | None = None, merge: bool = False
    ) -> Completed:
        """Run a client; `merge` puts stderr into stdout, in the order the client wrote them."""
        try:
            done = subprocess.run(
                list(argv),
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT if merge else subprocess.PIPE,
                text=True,
                errors="replace",
                timeout=timeout,
                env=dict(env if env is not None else self.environ),
                cwd=self.project_directory,
                stdin=subprocess.DEVNULL,
            )
        except FileNotFoundError:
            container = inside_a_container()
            if container is not None:
                raise EngineError(
                    f"cannot run {argv[0]}: this is a container ({container}), and `t4serve host-check` and "
                    "`t4serve mcp` are host-side commands",
                    found=f"{argv[0]}: no such command inside this container ({container})",
                    required="the host's Docker client and engine, and its NVIDIA driver, which they check",
                    fix=HOST_SIDE_FIX,
                ) from None
            raise EngineError(
                f"cannot run {argv[0]}",
                found=f"{argv[0]}: no such command",
                required="the Docker client on PATH (or DOCKER naming it)",
                fix="install Docker (docker.io or docker-ce) on this host",
            ) from None
        except subprocess.TimeoutExpired:
            raise EngineError(
                f"`{' '.join(argv[:3])} ...` did not finish",
                found=f"no answer within {timeout:g} s",
                required="an engine that answers",
                fix=ENGINE_FIX,
            ) from None
        return Completed(done.returncode, done.stdout, done.stderr or "")

    def _checked(self, argv: Sequence[str], what: str, timeout: float, env: Mapping[str, str] | None = None) -> str:
        done = self._run(argv, timeout, env)
        if done.returncode != 0:
            last = (done.stderr.strip() or done.stdout.strip() or "no output").splitlines()[-1]
            raise EngineError(
                f"{what} failed",
                found=f"`{' '.join(argv[:4])} ...` exited {done.returncode}: {last}",
                required="the Docker engine to accept the request",
                fix=_fix_for(last),
            )
        return done.stdout

    def _compose_argv(self, *args: str, override: Path | None = None) -> list[str]:
        if not self.compose_file.is_file():
            raise EngineError(
                "no compose file for the t4serve service",
                found=f"{self.compose_file}: no such file",
                required="t4serve's compose.yaml (the repository's, next to scripts/)",
                fix="start t4serve mcp with --compose-file /path/to/t4serve/compose.yaml (or T4SERVE_COMPOSE_FILE)",
            )
        if self._compose is None:
            self._compose = find_compose(self.docker, self.environ)
        argv = [*self._compose, "--project-directory", str(self.project_directory), "-f", str(self.compose_file)]
        if override is not None:
            argv += ["-f", str(override)]
        if self.project:
            argv += ["-p", self.project]
        return [*argv, *args]

    def _compose_env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        env = {**self.environ, "T4SERVE_IMAGE": self._image}
        env.update(extra or {})
        return env

    # ----- engine and image
    def info(self) -> EngineInfo:
        raw = json.loads(self._checked([self.docker, "info", "--format", "{{json .}}"], "docker info", QUICK_TIMEOUT_S))
        return EngineInfo(
            server_version=str(raw.get("ServerVersion") or "unknown"),
            data_root=str(raw.get("DockerRootDir") or "/var/lib/docker"),
            runtimes=sorted((raw.get("Runtimes") or {}).keys()),
            default_runtime=str(raw.get("DefaultRuntime") or "runc"),
            cdi_spec_dirs=list(raw.get("CDISpecDirs") or []),
        )

    def image(self) -> ImageInfo | None:
        done = self._run([self.docker, "image", "inspect", "--format", "{{json .}}", self._image], QUICK_TIMEOUT_S)
        if done.returncode != 0:
            if "No such image" in done.stderr or "no such image" in done.stderr.lower():
                return None
            self._checked([self.docker, "image", "inspect", self._image], "docker image inspect", QUICK_TIMEOUT_S)
        raw: dict[str, Any] = json.loads(done.stdout)
        return ImageInfo(self._image, str(raw.get("Id", "")), int(raw.get("Size") or 0), str(raw.get("Created", "")))

    def read_image_file(self, path: str) -> str | None:
        done = self.run_in_image_entrypoint("cat", [path], QUICK_TIMEOUT_S)
        return done.stdout if done.returncode == 0 else None

    def run_in_image_entrypoint(self, entrypoint: str, args: Sequence[str], timeout: float) -> Completed:
        """A throwaway container of the image (removed with its anonymous volumes, no network, no GPU)."""
        return self._run(
            [self.docker, "run", "--rm", "--network", "none", "--entrypoint", entrypoint, self._image, *args], timeout
        )

    def run_in_image(self, args: Sequence[str], timeout: float) -> Completed:
        return self.run_in_image_entrypoint("t4serve", args, timeout)

    def build_image(self, on_line: Callable[[str], None], timeout: float = BUILD_TIMEOUT_S) -> Completed:
        script = self.project_directory / "scripts" / "build-image"
        if not os.access(script, os.X_OK):
            raise EngineError(
                "cannot build the image",
                found=f"{script}: missing or not executable",
                required="the t4serve repository next to the compose file (its scripts/build-image)",
                fix="point --compose-file at compose.yaml in a checkout of the t4serve repository",
            )
        env = {**self.environ, "T4SERVE_IMAGE": self._image, "DOCKER": self.docker}
        lines: list[str] = []
        with subprocess.Popen(
            [str(script)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
            errors="replace",
            env=env,
            cwd=self.project_directory,
        ) as process:
            assert process.stdout is not None
            for line in process.stdout:
                lines.append(line.rstrip("\n"))
                on_line(lines[-1])
            try:
                code = process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                process.kill()
                code = -9
        return Completed(code, "\n".join(lines[-200:]), "")

    # ----- the compose service
    def up(self, environment: Mapping[str, str], compose_env: Mapping[str, str]) -> ServiceContainer:
        """`compose up -d --no-build` with `environment` added to the service's (an override file, so any setting can
        be given, not only those compose.yaml interpolates) and `compose_env` for compose's own interpolation."""
        override = {"services": {SERVICE: {"environment": dict(environment)}}} if environment else None
        with tempfile.TemporaryDirectory(prefix="t4serve-mcp-") as folder:
            path = None
            if override is not None:
                path = Path(folder) / "compose.override.json"
                # JSON is YAML: compose reads it as an override file.
                write_atomic(path, json.dumps(override, indent=2) + "\n", mode=0o600)
            argv = self._compose_argv("up", "-d", "--no-build", SERVICE, override=path)
            self._checked(argv, "compose up", COMPOSE_TIMEOUT_S, self._compose_env(compose_env))
        container = self.service()
        if container is None:
            raise EngineError(
                "compose up returned, but the service has no container",
                found=f"no container for service {SERVICE} in project {self.project or '(default)'}",
                required="the container compose just created",
                fix="run `docker compose ps -a` and `docker compose logs` in " + str(self.project_directory),
            )
        return container

    def service(self) -> ServiceContainer | None:
        # -a: Compose v2 lists only running containers without it; an exited one must be seen to say why it exited.
        ids = self._checked(
            self._compose_argv("ps", "-a", "-q", SERVICE), "compose ps", QUICK_TIMEOUT_S, self._compose_env()
        )
        first = next((line.strip() for line in ids.splitlines() if line.strip()), None)
        if first is None:
            return None
        raw = json.loads(self._checked([self.docker, "inspect", first], "docker inspect", QUICK_TIMEOUT_S))
        if not raw:
            return None
        item = raw[0]
        state = item.get("State") or {}
        health = (state.get("Health") or {}).get("Status")
        return ServiceContainer(
            id=str(item.get("Id", first))[:12],
            name=str(item.get("Name", "")).lstrip("/"),
            state=str(state.get("Status", "unknown")),
            health=str(health) if health else None,
            exit_code=int(state.get("ExitCode") or 0),
            started_at=str(state.get("StartedAt", "")),
            image=str((item.get("Config") or {}).get("Image", "")),
        )

    def down(self, timeout: int) -> ServiceContainer | None:
        """Stop and remove the service's container with its anonymous volumes, then the project's network; the named
        cache volumes stay (they hold the download and compile caches)."""
        before = self.service()
        env = self._compose_env()
        self._checked(self._compose_argv("stop", "-t", str(timeout), SERVICE), "compose stop", timeout + 60.0, env)
        self._checked(self._compose_argv("rm", "-f", "-v", SERVICE), "compose rm", COMPOSE_TIMEOUT_S, env)
        self._checked(self._compose_argv("down", "--remove-orphans"), "compose down", COMPOSE_TIMEOUT_S, env)
        return before

    def logs(self, container: str, tail: int, since: str | None) -> str:
        argv = [self.docker, "logs", "--tail", str(tail)]
        if since:
            argv += ["--since", since]
        # The container's two streams come back on the client's two; one pipe keeps the order they arrive in.
        done = self._run([*argv, container], QUICK_TIMEOUT_S, merge=True)
        if done.returncode != 0:
            self._checked([*argv, container], "docker logs", QUICK_TIMEOUT_S)
        return done.stdout

    def exec(self, container: str, args: Sequence[str], detach: bool = False) -> Completed:
        return self._run([self.docker, "exec", *(["-d"] if detach else []), container, *args], QUICK_TIMEOUT_S)

    def published_port(self, container: str, port: int) -> tuple[str, int] | None:
        done = self._run([self.docker, "port", container, f"{port}/tcp"], QUICK_TIMEOUT_S)
        for line in done.stdout.splitlines():
            host, _, number = line.strip().rpartition(":")
            if number.isdigit():
                host = host.strip("[]")
                return ("127.0.0.1" if host in ("0.0.0.0", "") else host, int(number))
        return None

    def copy_out(self, container: str, source: str, destination: Path) -> None:
        destination.parent.mkdir(parents=True, exist_ok=True)
        self._checked([self.docker, "cp", f"{container}:{source}", str(destination)], "docker cp", COMPOSE_TIMEOUT_S)


def _fix_for(last_line: str) -> str:
    """The fix for the engine's most common refusals, from its last line of output."""
    text = last_line.lower()
    if "could not select device driver" in text:
        return (
            "install the NVIDIA Container Toolkit and run `sudo nvidia-ctk runtime configure --runtime=docker && "
            "sudo systemctl restart docker` (check_host_capacity says what is missing)"
        )
    if "permission denied" in text and "docker" in text:
        return "add this user to the docker group (`sudo usermod -aG docker $USER`, then log in again)"
    if "cannot connect to the docker daemon" in text or "is the docker daemon running" in text:
        return ENGINE_FIX
    if "secret" in text and ("not found" in text or "no such file" in text):
        return "write the HF token to the secret file compose.yaml names (README: First run)"
    if "port is already allocated" in text or "address already in use" in text:
        return "stop what holds the port, or start with another publish_port"
    return "run the same command by hand to see its whole output"


def engine_from_environ(
    environ: Mapping[str, str],
    *,
    compose_file: Path | None = None,
    project: str | None = None,
    image: str | None = None,
) -> DockerCli:
    """The engine as the host commands configure it: the compose file (--compose-file, T4SERVE_COMPOSE_FILE, else
    ./compose.yaml), the project (-p, T4SERVE_COMPOSE_PROJECT, else compose's default: the file's folder name), the
    image (T4SERVE_IMAGE, else t4serve:dev, as compose.yaml), the docker client (DOCKER, else `docker`)."""
    return DockerCli(
        compose_file=compose_file or Path(environ.get("T4SERVE_COMPOSE_FILE") or "compose.yaml"),
        project=project or environ.get("T4SERVE_COMPOSE_PROJECT") or None,
        image=image or environ.get("T4SERVE_IMAGE") or "t4serve:dev",
        docker=environ.get("DOCKER") or "docker",
        environ=environ,
    )
