"""The Docker Engine as the host-side tools see it (`t4serve host-check`, `t4serve mcp`): the `Engine` interface, the
records it answers with, and how a caller withdraws its request.

`Engine` is what the tools use; t4serve.host.docker implements it through the `docker` and compose command-line
clients, and tests fake it. A caller that may withdraw its request (an MCP tool the client cancelled) runs its engine
calls inside `cancelled_by(event)`: setting the event stops them (a throwaway container is removed too) and raises
`Cancelled`. No argument carries a secret: the HF token stays in compose's secret file, and the API key is not passed
to the engine at all. `RedactedEngine` is any engine with the secrets a caller knows taken out of everything it
answers (outputs, logs, build lines, the files it copies out) before the caller reads, cuts, stores or shows it.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar

from t4serve.config.settings import default_of
from t4serve.errors import EngineError
from t4serve.untrusted import Untrusted, loads_json, printable, redact

# The image's defaults (compose.yaml publishes that port; the image's build writes the manifest there).
API_PORT = int(default_of("T4SERVE_PORT"))
MANIFEST_PATH = default_of("T4SERVE_MANIFEST")
# The bound of an image build (scripts/build-image: minutes on a warm cache, up to an hour cold).
BUILD_TIMEOUT_S = 3600.0


class Cancelled(Exception):
    """The caller withdrew its request: the clients started for it were stopped (and a throwaway container removed)."""


_CANCEL: contextvars.ContextVar[threading.Event | None] = contextvars.ContextVar("t4serve_engine_cancel", default=None)


@contextlib.contextmanager
def cancelled_by(event: threading.Event) -> Iterator[None]:
    """Engine calls made inside this block (in this thread or context) stop, raising `Cancelled`, once `event` is
    set: the client's process group gets SIGTERM, then SIGKILL after KILL_GRACE_S."""
    token = _CANCEL.set(event)
    try:
        yield
    finally:
        _CANCEL.reset(token)


def cancel_event() -> threading.Event | None:
    """The event of the `cancelled_by` block this call runs in, or None outside one."""
    return _CANCEL.get()


def cancel_requested() -> bool:
    event = _CANCEL.get()
    return event is not None and event.is_set()


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
    # How often Docker restarted it (restart: unless-stopped): above 0, it exited at least once.
    restart_count: int = 0


@dataclass(frozen=True)
class Mount:
    """A host folder bound read-only into the service's container."""

    source: str
    target: str


# Compose v2.20 is the first to copy a secret from the environment readable by a non-root user (mode 0444; before it
# 0400, root's), as compose.yaml's hf_token is; docker-compose 1.29 refuses such a secret.
COMPOSE_ENV_SECRET_VERSION = (2, 20, 0)
COMPOSE_TOO_OLD_FIX = (
    "install Compose v2.20 or later (Docker's docker-compose-plugin package, or the distribution's Compose v2 "
    "package), or use the file route: `DOCKER_BUILDKIT=1 docker-compose -f compose.token-file.yaml up` with "
    "the token in secrets/hf_token (that file's second line writes it)"
)


class Engine(Protocol):
    """What the host-side tools need from the Docker Engine."""

    @property
    def image_ref(self) -> str: ...

    @property
    def project_directory(self) -> Path: ...

    @property
    def project(self) -> str | None: ...

    def info(self) -> EngineInfo: ...

    def compose_version(self) -> tuple[str, str]:
        """The compose client (its command, as words) and its version as it answers `version --short`."""
        ...

    def image(self) -> ImageInfo | None: ...

    def run_in_image(self, args: Sequence[str], timeout: float) -> Completed: ...

    def build_image(self, on_line: Callable[[str], None], timeout: float = BUILD_TIMEOUT_S) -> Completed: ...

    def up(
        self, environment: Mapping[str, str], compose_env: Mapping[str, str], mounts: Sequence[Mount] = ()
    ) -> ServiceContainer: ...

    def service(self) -> ServiceContainer | None: ...

    def stop(self, timeout: int) -> None: ...

    def down(self, timeout: int) -> ServiceContainer | None: ...

    def logs(self, container: str, tail: int, since: str | None) -> str: ...

    def exec(self, container: str, args: Sequence[str], detach: bool = False) -> Completed: ...

    def published_port(self, container: str, port: int) -> tuple[str, int] | None: ...

    def copy_out(self, container: str, source: str, destination: Path) -> None: ...


def client_json(text: str, what: str, argv: Sequence[str]) -> Any:
    """What a client printed as JSON, read as untrusted (bounded depth, finite numbers): an EngineError naming the
    command and the start of what it printed when it is not JSON."""
    try:
        return loads_json(text, "its output")
    except Untrusted as exc:
        raise EngineError(
            f"{what}: the client did not answer with JSON",
            found=f"`{printable(' '.join(argv[:4]))}` printed {printable(text.strip()[:200])!r}: {exc.reason}",
            required="the Docker client's JSON output (`--format '{{json .}}'`)",
            fix="check that DOCKER (or PATH's docker) is the Docker client, and run the command by hand",
        ) from None


D = TypeVar("D")
# A file copied out of a container is searched for secrets up to this size (a benchmark's folder holds KB to MB);
# a larger one is removed rather than kept unsearched.
MAX_REDACTED_FILE_BYTES = 64 << 20


class RedactedEngine:
    """`inner` with every secret `secrets()` names redacted from what it answers, before the caller sees it: the
    output of a command run in a container or the image, logs, the build's lines, the container's fields, and each
    file `copy_out` wrote (rewritten, or removed when too large to search, before the caller moves the folder into
    place). The one redaction step of the host side: what a caller then cuts, stores or shows holds no whole secret
    and no cut one."""

    def __init__(self, inner: Engine, secrets: Callable[[], Sequence[str]]) -> None:
        self.inner = inner
        self.secrets = secrets

    def _text(self, text: str) -> str:
        return redact(text, self.secrets())

    def _fields(self, record: D) -> D:
        secrets = self.secrets()
        changes = {f.name: redact(value, secrets) for f in dataclasses.fields(record)  # type: ignore[arg-type]
                   if isinstance(value := getattr(record, f.name), str)}  # fmt: skip
        return dataclasses.replace(record, **changes)  # type: ignore[type-var]

    def _completed(self, done: Completed) -> Completed:
        return Completed(done.returncode, self._text(done.stdout), self._text(done.stderr))

    @property
    def image_ref(self) -> str:
        return self.inner.image_ref

    @property
    def project_directory(self) -> Path:
        return self.inner.project_directory

    @property
    def project(self) -> str | None:
        return self.inner.project

    def info(self) -> EngineInfo:
        return self.inner.info()

    def compose_version(self) -> tuple[str, str]:
        return self.inner.compose_version()

    def image(self) -> ImageInfo | None:
        return self.inner.image()

    def run_in_image(self, args: Sequence[str], timeout: float) -> Completed:
        return self._completed(self.inner.run_in_image(args, timeout))

    def build_image(self, on_line: Callable[[str], None], timeout: float = BUILD_TIMEOUT_S) -> Completed:
        return self._completed(self.inner.build_image(lambda line: on_line(self._text(line)), timeout))

    def up(
        self, environment: Mapping[str, str], compose_env: Mapping[str, str], mounts: Sequence[Mount] = ()
    ) -> ServiceContainer:
        return self._fields(self.inner.up(environment, compose_env, mounts))

    def service(self) -> ServiceContainer | None:
        found = self.inner.service()
        return None if found is None else self._fields(found)

    def stop(self, timeout: int) -> None:
        self.inner.stop(timeout)

    def down(self, timeout: int) -> ServiceContainer | None:
        before = self.inner.down(timeout)
        return None if before is None else self._fields(before)

    def logs(self, container: str, tail: int, since: str | None) -> str:
        return self._text(self.inner.logs(container, tail, since))

    def exec(self, container: str, args: Sequence[str], detach: bool = False) -> Completed:
        return self._completed(self.inner.exec(container, args, detach))

    def published_port(self, container: str, port: int) -> tuple[str, int] | None:
        return self.inner.published_port(container, port)

    def copy_out(self, container: str, source: str, destination: Path) -> None:
        self.inner.copy_out(container, source, destination)
        redact_files(destination, self.secrets())


def redact_files(root: Path, secrets: Sequence[str]) -> None:
    """Every regular file under `root` (or `root` itself) with `secrets` redacted in place; a link is removed (it
    would point out of the copy), and so is a file too large to search."""
    secrets = [s for s in secrets if s]
    paths = [root] if root.is_file() or root.is_symlink() else sorted(root.rglob("*"))
    for path in paths:
        if path.is_symlink():
            path.unlink()
            continue
        if not path.is_file():
            continue
        if path.stat().st_size > MAX_REDACTED_FILE_BYTES:
            path.unlink()
            continue
        data = path.read_bytes()
        text = data.decode("utf-8", "surrogateescape")
        cleaned = redact(text, secrets)
        if cleaned != text:
            # In place: the folder is the caller's staging copy, moved into place only after this.
            path.write_bytes(cleaned.encode("utf-8", "surrogateescape"))
