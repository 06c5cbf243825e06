"""The one module that talks to the Docker Engine, for the host-side commands (`t4serve host-check`, `t4serve mcp`):
`DockerCli`, the `Engine` of t4serve.host.engine.

It drives the engine through its command-line clients, `docker` and compose (`docker compose`, else
`docker-compose`), not the `docker` Python SDK. compose.yaml *is* the deployment: the GPU reservation, /dev/shm, the
loopback ports, the cache volumes, the HF token secret, the healthcheck and the stop grace period live there, and
only compose reads that file. Through the SDK each of those would be re-stated in Python and would drift from the
file users run `docker compose up` with; through compose, `start_vllm_server` and `docker compose up` start the same
service, and a user can take over with plain compose at any point. The `docker` client covers what compose does not
(engine info, image inspect, a throwaway container of the image, exec, logs, copying a folder out), with the same
client and configuration (contexts, DOCKER_HOST) the user's own commands use, and no new dependency.

Every call is bounded by a timeout and checked; a failure is an `EngineError` with what was found and the fix (the
client's error block, bounded, not only its last line). Every client runs in its own process group, so a timeout or a
cancellation (t4serve.host.engine.cancelled_by) stops it with whatever it started. This module checks that compose's
HF token secret file exists, and never reads it.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from t4serve.atomic import write_atomic
from t4serve.errors import EngineError
from t4serve.host.engine import (
    BUILD_TIMEOUT_S,
    COMPOSE_TOO_OLD_FIX,
    MANIFEST_PATH,
    Cancelled,
    Completed,
    EngineInfo,
    ImageInfo,
    Mount,
    ServiceContainer,
    cancel_event,
    cancel_requested,
    client_json,
)
from t4serve.supervise.children import stop_child
from t4serve.untrusted import Untrusted, check_host, check_path, parse_int, printable

SERVICE = "t4serve"
# Bounds for one engine call: a quick query, compose up/down (stop grace 90 s in compose.yaml); an image build's is
# engine.BUILD_TIMEOUT_S.
QUICK_TIMEOUT_S = 60.0
COMPOSE_TIMEOUT_S = 180.0
# Variables compose.yaml interpolates (not settings of the container): passed to compose from this environment.
COMPOSE_VARIABLES = (
    "T4SERVE_IMAGE",
    "T4SERVE_GPU",
    "T4SERVE_PUBLISH_PORT",
    "T4SERVE_TELEMETRY_PUBLISH_PORT",
    "T4SERVE_VOLUME_PREFIX",
    "HF_TOKEN_SECRET_FILE",
)
# An engine refusal's error block: its last lines, at most this many and this many characters.
ERROR_LINES = 20
ERROR_CHARS = 2000
# How often a running client is checked for a cancellation, and how long it has to end after SIGTERM.
POLL_S = 0.2
KILL_GRACE_S = 5.0
# A label on every throwaway container of the image, so a leftover one can be found (`docker ps -af label=...`).
THROWAWAY_LABEL = "org.t4serve.throwaway=1"
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


def _stop_group(process: subprocess.Popen[Any]) -> None:
    """SIGTERM to the client's process group (it and everything it started), SIGKILL after a grace."""
    stop_child(process, KILL_GRACE_S, group=True, reap_s=KILL_GRACE_S)


def error_block(done: Completed) -> str:
    """The client's error output as the user would read it: its last ERROR_LINES lines, at most ERROR_CHARS."""
    text = done.stderr.strip() or done.stdout.strip() or "no output"
    block = "\n".join(text.splitlines()[-ERROR_LINES:])
    return block if len(block) <= ERROR_CHARS else "..." + block[-ERROR_CHARS:]


def inside_a_container() -> str | None:
    """Which marker says this process runs in a container (the t4serve image or any other), or None."""
    return next((marker for marker in CONTAINER_MARKERS if os.path.exists(marker)), None)


def find_compose(docker: str, environ: Mapping[str, str]) -> tuple[str, ...]:
    """The compose client: T4SERVE_MCP_COMPOSE (shell words), else `docker compose` when the plugin answers, else,
    only for the default `docker` client whose answer says it has no compose command, `docker-compose` on PATH.

    Never a silent fallback to another engine's client: when DOCKER names a client of its own (another engine, a
    context wrapper) or the client cannot run or fails in any other way, the system docker-compose would manage the
    default engine instead, so that is an EngineError naming the client and the fix."""
    try:
        chosen = shlex.split(environ.get("T4SERVE_MCP_COMPOSE", ""))
    except ValueError as exc:
        raise EngineError(
            "T4SERVE_MCP_COMPOSE is not a shell-quoted command",
            found=f"{printable(environ.get('T4SERVE_MCP_COMPOSE', '')[:200])}: {exc}",
            required="the compose command, shell-quoted (e.g. docker compose, or /usr/bin/docker-compose)",
            fix="set T4SERVE_MCP_COMPOSE='docker compose'",
        ) from None
    if chosen:
        return tuple(chosen)
    done = _run_client([docker, "compose", "version"], QUICK_TIMEOUT_S, dict(environ), None)
    if done.returncode == 0:
        return (docker, "compose")
    output = done.stderr.strip() or done.stdout.strip() or "no output"
    # Docker 20.10 and 28.2 print "'compose' is not a docker command." above their usage lines: any line says it.
    plugin_missing = "is not a docker command" in output or "unknown command" in output.lower()
    answer = next((line for line in output.splitlines() if "is not a docker command" in line
                   or "unknown command" in line.lower()), output.splitlines()[-1])[:300]
    standalone = shutil.which("docker-compose", path=environ.get("PATH"))
    if plugin_missing and not environ.get("DOCKER") and standalone:
        return (standalone,)
    configured = f"DOCKER={docker}" if environ.get("DOCKER") else f"`{docker}`"
    raise EngineError(
        "no compose client for this Docker client",
        found=f"`{docker} compose version` exited {done.returncode}: {printable(answer)}"
        + ("" if standalone or environ.get("DOCKER") else "; docker-compose is not on PATH"),
        required=f"the compose plugin of {configured} (Docker Compose v2), or T4SERVE_MCP_COMPOSE naming the compose "
        "command for the same engine" + ("" if environ.get("DOCKER") else " (docker-compose 1.29 is used only with the "
        "default docker client)"),
        fix="install the compose plugin (`sudo apt-get install docker-compose-plugin`), or set T4SERVE_MCP_COMPOSE to "
        "the compose command that talks to the same engine",
    )


# What one client call may print that is kept: logs are cut to their tail, JSON past this is refused.
MAX_OUTPUT_BYTES = 16 << 20


def _run_client(argv: Sequence[str], timeout: float, env: Mapping[str, str], cwd: Path | None,
                merge: bool = False, on_stop: Callable[[], None] | None = None) -> Completed:
    """Run a client in its own process group with its output in temporary files, keeping at most MAX_OUTPUT_BYTES of
    each (the end), so a client that prints without end cannot fill this process's memory. A program that cannot run
    (missing, a folder, not executable, not a program) is an EngineError naming it. A timeout or a cancellation
    (`cancelled_by`) stops the group, then calls `on_stop` (cleanup of what the client had made the engine start):
    a timeout is an EngineError, a cancellation `Cancelled`."""
    name = argv[0]
    held = next((arg for arg in argv if "\x00" in arg), None)
    if held is not None:
        # Only another client's answer can put a NUL here (output is read with NULs replaced; this is the backstop).
        raise EngineError(
            f"cannot run {printable(name)}: an argument holds a NUL byte",
            found=f"`{printable(' '.join(argv[:3]))} ...` with the argument {printable(held[:80])}",
            required="arguments without NUL bytes (an answer of the Docker client holds none)",
            fix="check that DOCKER (or PATH's docker) and the compose client are Docker's own, and run them by hand",
        )
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        try:
            process = subprocess.Popen(list(argv), stdout=out, stderr=out if merge else err, env=dict(env), cwd=cwd,
                                       stdin=subprocess.DEVNULL, start_new_session=True)
        except FileNotFoundError:
            container = inside_a_container()
            if container is not None:
                raise EngineError(
                    f"cannot run {printable(name)}: this is a container ({container}), and `t4serve host-check` and "
                    "`t4serve mcp` are host-side commands",
                    found=f"{printable(name)}: no such command inside this container ({container})",
                    required="the host's Docker client and engine, and its NVIDIA driver, which they check",
                    fix=HOST_SIDE_FIX,
                ) from None
            raise EngineError(
                f"cannot run {printable(name)}",
                found=f"{printable(name)}: no such command",
                required="the Docker client on PATH (or DOCKER naming it)",
                fix="install Docker (docker.io or docker-ce) on this host",
            ) from None
        except OSError as exc:  # a folder, a file without the x bit, a file that is no program
            raise EngineError(
                f"cannot run {printable(name)}",
                found=f"{printable(name)}: {exc.strerror or type(exc).__name__}"
                + (" (a folder)" if os.path.isdir(name) else ""),
                required="DOCKER (or PATH's docker) naming the Docker client program, executable by this user",
                fix="set DOCKER to the docker client's path (`command -v docker`), or unset it",
            ) from None
        deadline = time.monotonic() + timeout
        with process:
            while True:
                try:
                    process.wait(timeout=POLL_S)
                    break
                except subprocess.TimeoutExpired:
                    pass
                cancelled = cancel_requested()
                if cancelled or time.monotonic() >= deadline:
                    _stop_group(process)
                    if on_stop is not None:
                        on_stop()
                    if cancelled:
                        raise Cancelled(f"`{printable(' '.join(argv[:3]))} ...` stopped: the request was cancelled")
                    raise EngineError(
                        f"`{printable(' '.join(argv[:3]))} ...` did not finish",
                        found=f"no answer within {timeout:g} s (stopped)",
                        required="an engine that answers",
                        fix=ENGINE_FIX,
                    )
        return Completed(process.returncode, _tail_text(out), "" if merge else _tail_text(err))


def _tail_text(handle: Any) -> str:
    """A client's output as text: its last MAX_OUTPUT_BYTES, undecodable bytes and NULs as U+FFFD, so no byte it
    printed can end an argument of the next command or a string of a message early."""
    size = handle.seek(0, os.SEEK_END)
    handle.seek(max(0, size - MAX_OUTPUT_BYTES))
    return str(handle.read().replace(b"\x00", b"\xef\xbf\xbd").decode("utf-8", errors="replace"))


def _shape_error(what: str, argv: Sequence[str], problem: str) -> EngineError:
    return EngineError(
        f"{what}: the client's answer is not of the shape Docker gives",
        found=f"`{printable(' '.join(argv[:4]))}`: {problem}",
        required="the Docker Engine's own JSON (docker info / docker inspect)",
        fix="check that DOCKER (or PATH's docker) is the Docker client, and run the command by hand",
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
        # realpath, not Path.resolve: a symlink loop at the path is a compose file to report missing, no RuntimeError.
        self.compose_file = Path(os.path.realpath(compose_file))
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
        self,
        argv: Sequence[str],
        timeout: float,
        env: Mapping[str, str] | None = None,
        merge: bool = False,
        on_stop: Callable[[], None] | None = None,
    ) -> Completed:
        """Run a client (`_run_client`); `merge` puts stderr into stdout, in the order the client wrote them. A timeout
        or a cancellation (`cancelled_by`) stops its process group, then calls `on_stop` (cleanup of what the client
        had made the engine start)."""
        cwd = self.project_directory if self.project_directory.is_dir() else None
        return _run_client(argv, timeout, env if env is not None else self.environ, cwd, merge, on_stop)

    def _checked(self, argv: Sequence[str], what: str, timeout: float, env: Mapping[str, str] | None = None) -> str:
        done = self._run(argv, timeout, env)
        if done.returncode != 0:
            block = error_block(done)
            raise EngineError(
                f"{what} failed",
                found=f"`{printable(' '.join(argv[:4]))} ...` exited {done.returncode}:\n{block}",
                required="the Docker engine to accept the request",
                fix=_fix_for(block),
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
    def compose_version(self) -> tuple[str, str]:
        self._compose = self._compose or find_compose(self.docker, self.environ)
        answer = self._checked([*self._compose, "version", "--short"], "compose version", QUICK_TIMEOUT_S)
        return " ".join(self._compose), printable((answer.strip().splitlines() or [""])[0])[:40]

    def info(self) -> EngineInfo:
        argv = [self.docker, "info", "--format", "{{json .}}"]
        raw = client_json(self._checked(argv, "docker info", QUICK_TIMEOUT_S), "docker info", argv)
        if not isinstance(raw, dict):
            raise _shape_error("docker info", argv, f"a JSON {type(raw).__name__}, not an object")
        runtimes = raw.get("Runtimes") or {}
        cdi = raw.get("CDISpecDirs") or []
        text_fields = {k: raw.get(k) for k in ("ServerVersion", "DockerRootDir", "DefaultRuntime")}
        problems = [f"{k} is {type(v).__name__}, not text" for k, v in text_fields.items()
                    if v is not None and not isinstance(v, str)]  # fmt: skip
        if not isinstance(runtimes, dict):
            problems.append(f"Runtimes is {type(runtimes).__name__}, not an object of runtimes")
        if not isinstance(cdi, list) or not all(isinstance(d, str) for d in cdi):
            problems.append("CDISpecDirs is not a list of folders")
        root = raw.get("DockerRootDir") or "/var/lib/docker"
        if isinstance(root, str):
            try:
                check_path(root, "DockerRootDir")
            except Untrusted as exc:
                problems.append(exc.reason)
        if problems:
            raise _shape_error("docker info", argv, "; ".join(problems))
        return EngineInfo(
            server_version=printable(str(raw.get("ServerVersion") or "unknown"))[:100],
            data_root=str(root),
            runtimes=sorted(printable(str(k))[:100] for k in runtimes),
            default_runtime=printable(str(raw.get("DefaultRuntime") or "runc"))[:100],
            cdi_spec_dirs=list(cdi),
        )

    def image(self) -> ImageInfo | None:
        done = self._run([self.docker, "image", "inspect", "--format", "{{json .}}", self._image], QUICK_TIMEOUT_S)
        if done.returncode != 0:
            if "No such image" in done.stderr or "no such image" in done.stderr.lower():
                return None
            self._checked([self.docker, "image", "inspect", self._image], "docker image inspect", QUICK_TIMEOUT_S)
        argv = [self.docker, "image", "inspect", self._image]
        raw = client_json(done.stdout, "docker image inspect", argv)
        if not isinstance(raw, dict):
            raise _shape_error("docker image inspect", argv, f"a JSON {type(raw).__name__}, not an object")
        size = raw.get("Size") or 0
        if isinstance(size, bool) or not isinstance(size, int) or not 0 <= size <= 1 << 50:
            raise _shape_error("docker image inspect", argv, f"Size is {str(size)[:40]!r}, not a count of bytes")
        return ImageInfo(self._image, printable(str(raw.get("Id", "")))[:100], size,
                         printable(str(raw.get("Created", "")))[:100])

    def run_in_image_entrypoint(self, entrypoint: str, args: Sequence[str], timeout: float) -> Completed:
        """A throwaway container of the image (removed with its anonymous volumes, no network, no GPU). It has a
        name, so a timeout or a cancellation removes it too: stopping the client alone would leave it running."""
        name = f"t4serve-run-{uuid.uuid4().hex[:12]}"

        def remove() -> None:
            with contextlib.suppress(OSError, subprocess.TimeoutExpired):
                subprocess.run([self.docker, "rm", "-f", "-v", name], capture_output=True, timeout=QUICK_TIMEOUT_S,
                               env=self.environ, stdin=subprocess.DEVNULL)  # fmt: skip

        argv = [self.docker, "run", "--rm", "--name", name, "--label", THROWAWAY_LABEL, "--network", "none",
                "--entrypoint", entrypoint, self._image, *args]  # fmt: skip
        return self._run(argv, timeout, on_stop=remove)

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
        cancel = cancel_event()
        finished = threading.Event()
        stopped: list[str] = []
        try:
            process = subprocess.Popen(
                [str(script)],
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                text=True,
                errors="replace",
                env=env,
                cwd=self.project_directory,
                start_new_session=True,
            )
        except OSError as exc:
            raise EngineError(
                "cannot build the image",
                found=f"{script}: {exc.strerror or type(exc).__name__}",
                required="scripts/build-image of the t4serve repository, runnable by this user",
                fix="run scripts/build-image by hand to see why it does not start",
            ) from None
        with process:
            deadline = time.monotonic() + timeout

            def watch() -> None:
                # Reading the build's output blocks; this thread ends the build on a timeout or a cancellation.
                while not finished.wait(POLL_S):
                    if cancel is not None and cancel.is_set():
                        stopped.append("cancelled")
                    elif time.monotonic() >= deadline:
                        stopped.append(f"stopped: no end within {timeout:g} s")
                    else:
                        continue
                    _stop_group(process)
                    return

            watcher = threading.Thread(target=watch, name="t4serve-build-watch", daemon=True)
            watcher.start()
            try:
                assert process.stdout is not None
                for line in process.stdout:
                    lines.append(line.rstrip("\n"))
                    on_line(lines[-1])
                code = process.wait()
            finally:
                finished.set()
                watcher.join()
        if stopped == ["cancelled"]:
            raise Cancelled("scripts/build-image stopped: the request was cancelled")
        if stopped:
            lines.append(f"scripts/build-image {stopped[0]}")
        return Completed(code, "\n".join(lines[-200:]), "")

    # ----- the compose service
    def up(
        self, environment: Mapping[str, str], compose_env: Mapping[str, str], mounts: Sequence[Mount] = ()
    ) -> ServiceContainer:
        """`compose up -d --no-build` with `environment` added to the service's and `mounts` bound read-only into it
        (an override file, so any setting can be given, not only those compose.yaml interpolates) and `compose_env`
        for compose's own interpolation."""
        service: dict[str, Any] = {}
        if environment:
            service["environment"] = dict(environment)
        if mounts:
            service["volumes"] = [
                {"type": "bind", "source": m.source, "target": m.target, "read_only": True} for m in mounts
            ]
        override = {"services": {SERVICE: service}} if service else None
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
        argv = [self.docker, "inspect", first]
        raw = client_json(self._checked(argv, "docker inspect", QUICK_TIMEOUT_S), "docker inspect", argv)
        if not raw:
            return None
        item = raw[0] if isinstance(raw, list) else None
        state = (item.get("State") or {}) if isinstance(item, dict) else None
        health = (state.get("Health") or {}) if isinstance(state, dict) else None
        code = (state.get("ExitCode") or 0) if isinstance(state, dict) else None
        config = (item.get("Config") or {}) if isinstance(item, dict) else None
        restarts = (item.get("RestartCount") or 0) if isinstance(item, dict) else None
        if not (isinstance(item, dict) and isinstance(state, dict) and isinstance(health, dict)
                and isinstance(config, dict) and isinstance(code, int) and not isinstance(code, bool)
                and isinstance(restarts, int) and not isinstance(restarts, bool)):
            raise _shape_error("docker inspect", argv, "not a list holding one container with State and Config")
        return ServiceContainer(
            id=printable(str(item.get("Id", first)))[:12],
            name=printable(str(item.get("Name", ""))).lstrip("/")[:200],
            state=printable(str(state.get("Status", "unknown")))[:40],
            health=printable(str(health.get("Status")))[:40] if health.get("Status") else None,
            exit_code=code,
            started_at=printable(str(state.get("StartedAt", "")))[:60],
            image=printable(str(config.get("Image", "")))[:200],
            restart_count=restarts,
        )

    def stop(self, timeout: int) -> None:
        """Stop the service's container and keep it (its exit code and logs stay readable; a stopped container is not
        restarted by `restart: unless-stopped`)."""
        argv = self._compose_argv("stop", "-t", str(timeout), SERVICE)
        self._checked(argv, "compose stop", timeout + 60.0, self._compose_env())

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
            try:
                port_number = parse_int(number, 1, 65535)
                host = host.strip("[]")
                return ("127.0.0.1" if host in ("0.0.0.0", "") else check_host(host), port_number)
            except Untrusted:
                continue
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
    if "'environment' does not match" in text:  # docker-compose 1.29 on compose.yaml's hf_token secret
        return f"{COMPOSE_TOO_OLD_FIX}; or --compose-file compose.token-file.yaml (or T4SERVE_COMPOSE_FILE)"
    if "secret" in text and ("not found" in text or "no such file" in text):
        return "write the HF token to the secret file compose.token-file.yaml names (its second line)"
    if "environment variable" in text and "hf_token" in text:
        return "give compose the token: HF_TOKEN=hf_... in the environment it runs in (compose.yaml's hf_token secret)"
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
