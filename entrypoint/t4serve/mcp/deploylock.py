"""One state-changing MCP tool at a time on one deployment: the lock `t4serve mcp` takes for start, stop, the image
build and a benchmark's start.

Two calls that both change a deployment race: two concurrent `compose up`s made two compose networks and left every
tool broken. So each state-changing tool holds an exclusive lock for the whole call, on a file in t4serve mcp's data
folder named after the deployment (its compose project on its Docker engine). The lock is the kernel's (`flock` on an
open file), not the file's existence: an MCP process that crashes or is killed holds nothing afterwards, and there is
no stale file to clean. MCP processes that share the data folder (two clients on one host) exclude each other the
same way, and so do two calls in one process (each opens the file anew). Who holds the lock (tool, process, client,
since when) is written into the file, so a second caller is answered at once, "busy: start_vllm_server (pid 1234,
client claude-code) since 10:00:00 UTC", and never waits or races.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import stat
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from t4serve.atomic import LockError, open_lock
from t4serve.errors import EngineError
from t4serve.untrusted import Untrusted, check_finite, check_int, loads_json, shown

# A holder record is a few hundred bytes; anything longer in the file is not ours.
MAX_RECORD_BYTES = 4096
# What a "busy" message quotes of a record's text fields, and the times it can show (1970 to the year 9999).
MAX_NAME_CHARS = 80
MAX_SINCE = 253402300799.0


class DeploymentBusy(EngineError):
    """Another state-changing tool holds the deployment's lock."""


@dataclass(frozen=True)
class Holder:
    """Who holds the lock: the tool, its process, the MCP client that called it, and since when (epoch seconds)."""

    tool: str
    pid: int
    client: str
    since: float

    def describe(self) -> str:
        """The holder as a message shows it: names escaped and cut, a time only when it is one."""
        since = self.since if 0 <= self.since <= MAX_SINCE else None  # NaN and out-of-range times fail both tests
        when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(since)) if since is not None else "an unknown time"
        return (f"{shown(self.tool, MAX_NAME_CHARS)} (pid {self.pid}, client {shown(self.client, MAX_NAME_CHARS)}) "
                f"since {when}")


def lock_file(data_dir: Path, deployment: str) -> Path:
    """The lock file of one deployment: a readable slug of its name plus a digest (names may hold any character)."""
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "-", deployment)[:60].strip("-.") or "deployment"
    digest = hashlib.sha256(deployment.encode("utf-8")).hexdigest()[:12]
    return data_dir / "locks" / f"{slug}-{digest}.lock"


def read_holder(path: Path) -> Holder | None:
    """The holder written in the lock file, or None when there is none (a call just beginning or ending) or the file
    is not a lock file t4serve wrote (a link, not a regular file, a record of the wrong shape)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY | os.O_NOFOLLOW)
    except OSError:
        return None
    try:
        return _record(fd)
    finally:
        os.close(fd)


def _record(fd: int) -> Holder | None:
    """The holder record of an open lock file: bounded, JSON of bounded depth, each field checked; else None."""
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        raw = os.pread(fd, MAX_RECORD_BYTES + 1, 0)
        if not raw or len(raw) > MAX_RECORD_BYTES:
            return None
        data = loads_json(raw, "the deployment's lock record", max_depth=2)
        if not isinstance(data, dict) or not all(isinstance(data.get(k), str) for k in ("tool", "client")):
            return None
        return Holder(data["tool"], check_int(data.get("pid"), "pid", 0, 2**31 - 1), data["client"],
                      check_finite(data.get("since"), "since", 0.0, MAX_SINCE))
    except (OSError, Untrusted):
        return None


@contextlib.contextmanager
def hold(path: Path, holder: Holder) -> Iterator[None]:
    """Hold the deployment's lock for the block, or raise DeploymentBusy naming who holds it. Never waits."""
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = open_lock(path, 0o600, private=True)
    except OSError as exc:
        raise EngineError(
            "cannot take the deployment's lock",
            found=f"{exc.filename or path}: {exc.strerror or exc}",
            required="a writable data folder for t4serve mcp (its locks and benchmark copies)",
            fix="point T4SERVE_MCP_DATA_DIR at a writable folder",
        ) from None
    except LockError as exc:
        raise EngineError(
            "cannot take the deployment's lock",
            found=exc.reason,
            required="a regular file t4serve mcp creates, or none, at the lock's path, in a folder of this user's "
            "that no one else can write",
            fix=f"remove {path} (no call holds it then: state-changing tools make it again), or point "
            "T4SERVE_MCP_DATA_DIR at a folder of your own (mode 0700)",
        ) from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            other = _record(fd)
            raise DeploymentBusy(
                f"{holder.tool}: busy: "
                + (f"{other.describe()} is changing this deployment" if other else "another call is changing it"),
                found=f"the deployment's lock {path} is held",
                required="one state-changing tool (start, stop, image build, benchmark start) at a time",
                fix="wait for that call to finish (server_status shows where the server is), then call again",
            ) from None
        record = json.dumps(asdict(holder)).encode("utf-8")
        os.ftruncate(fd, 0)
        os.pwrite(fd, record, 0)
        try:
            yield
        finally:
            os.ftruncate(fd, 0)
    finally:
        # Closing the descriptor releases the lock; so does the process's end, however it ends.
        os.close(fd)
