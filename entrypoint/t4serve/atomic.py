"""One way to replace a file: write a temp file in the same folder, fsync, rename; and one lock for the
read-modify-writes of files several servers share.

Readers see the old file or the new one, never a partial one; a failure (full disk, interrupt) leaves the old file
and no temp behind. Used for state, history, the supervisord config, the build manifest and the patched vLLM source.
`locked` guards the start history's and the compile ladder's read-modify-write in the shared cache volume: bounded in
time and refusing a lock path that is not a regular file, so a hostile or stuck lock never blocks a server.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import stat
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from t4serve.untrusted import file_kind


def write_atomic(path: Path, text: str, mode: int | None = None) -> None:
    """Replace `path` by `text`. `mode` is set before the rename; None keeps an existing file's mode (else 0o644)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if mode is None:
        mode = path.stat().st_mode & 0o7777 if path.exists() else 0o644
    fd, temp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".t4serve-tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as handle:
            os.fchmod(handle.fileno(), mode)
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temp_name, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temp_name)
        raise


# How long a read-modify-write waits for another holder of its lock: the holders (servers of one host finishing a
# start together) keep it for milliseconds, so a lock still held after this is held by something stuck or hostile.
LOCK_TIMEOUT_S = 5.0
_LOCK_POLL_S = 0.05


class LockError(Exception):
    """A lock that could not be taken: `reason` names the lock file and why (not a regular file, still held)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def open_lock(path: Path, mode: int = 0o644, *, private: bool = False) -> int:
    """A descriptor of the lock file `path` (created with `mode` when absent), opened read-write for flock. The one
    way t4serve opens a lock file.

    Opened non-blocking, without following a symlink (O_NOFOLLOW: a link at the lock's path, dangling or not, is
    refused, never its target opened or created), and only as a regular file, so a FIFO, a device or a folder at the
    lock's path is refused at once (LockError) instead of blocking open() or failing later in a write. `private` (a
    lock whose file is written, as the MCP deployment lock's holder record): the folder must be a real folder of this
    user that no one else can write, and the file this user's with one link, so a file planted there (a hard link to
    another file) is never truncated."""
    if private:
        _check_private_folder(path)
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY | os.O_NOFOLLOW, mode)
    except IsADirectoryError:
        raise LockError(f"the lock {path} must be a regular file (it is a directory)") from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise LockError(f"the lock {path} must be a regular file (it is a symbolic link)") from None
        raise LockError(f"the lock {path} cannot be opened: {exc.strerror or type(exc).__name__}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise LockError(f"the lock {path} must be a regular file (it is {file_kind(info.st_mode)})")
        if private and (info.st_uid != os.geteuid() or info.st_nlink != 1):
            raise LockError(
                f"the lock {path} must be a file of this user (uid {os.geteuid()}) with one link (it is uid "
                f"{info.st_uid}'s, with {info.st_nlink} links)"
            )
    except BaseException:
        os.close(fd)
        raise
    return fd


def _check_private_folder(path: Path) -> None:
    """The folder of a private lock: a folder (not a link to one) owned by this user, writable by no one else."""
    folder = path.parent
    try:
        info = os.lstat(folder)
    except OSError as exc:
        raise LockError(f"the lock's folder {folder} cannot be read: {exc.strerror or type(exc).__name__}") from None
    if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode):
        kind = "a symbolic link" if stat.S_ISLNK(info.st_mode) else file_kind(info.st_mode)
        raise LockError(f"the lock's folder {folder} must be a folder (it is {kind})")
    if info.st_uid != os.geteuid() or info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise LockError(
            f"the lock's folder {folder} must be this user's (uid {os.geteuid()}) and writable by no one else (it is "
            f"uid {info.st_uid}'s, mode {stat.S_IMODE(info.st_mode):o})"
        )


@contextlib.contextmanager
def locked(path: Path, timeout_s: float = LOCK_TIMEOUT_S, stop: threading.Event | None = None) -> Iterator[None]:
    """An exclusive flock on `path` (`open_lock`) for a read-modify-write, taken within `timeout_s`.

    Polled with LOCK_NB, so a holder that never lets go costs `timeout_s`, not forever; `stop` set (the caller
    received a signal) gives up at the next poll. Failures raise LockError."""
    fd = open_lock(path)
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                pass
            if stop is not None and stop.is_set():
                raise LockError(f"gave up waiting for the lock {path}: a stop signal came")
            if time.monotonic() >= deadline:
                raise LockError(f"the lock {path} is still held by another process after {timeout_s:g} s")
            time.sleep(_LOCK_POLL_S)
        yield
    finally:
        os.close(fd)
