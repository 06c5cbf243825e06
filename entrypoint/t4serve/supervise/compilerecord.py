"""What worked before on the compile ladder (t4serve.config.compilation): a record per server configuration in
T4SERVE_CACHE_DIR, shared by the servers of a host, that the vLLM wrapper reads at start and writes after an
out-of-memory inside torch.compile.

`choose_rung` is pure; `load_record` and `record_outcome` are the only I/O (a JSON file under a lock in
T4SERVE_CACHE_DIR).
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from t4serve.atomic import LockError, locked, write_atomic
from t4serve.config.compilation import RUNGS_BY_NAME, Rung
from t4serve.untrusted import Untrusted, load_json_file

RECORD_FILE = "compile-ladder.json"
LOCK_FILE = "compile-ladder.lock"
# One small entry per server configuration; far more than a host ever writes.
MAX_RECORD_BYTES = 1 << 20


def record_key(model: str, gpu_name: str | None, argv: Sequence[str]) -> str:
    """One server configuration: the same model, GPU and flags compile the same graphs."""
    text = json.dumps([model, gpu_name, list(argv)])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def choose_rung(ladder: Sequence[Rung], record: dict[str, Any] | None) -> Rung | None:
    """The rung to start: the recorded one when it is on the ladder, else the first; None for an empty ladder."""
    if not ladder:
        return None
    if record is not None:
        recorded = record.get("rung")
        for rung in ladder:
            if rung.name == recorded:
                return rung
    return ladder[0]


def next_rung(ladder: Sequence[Rung], current: Rung) -> Rung | None:
    names = [r.name for r in ladder]
    if current.name not in names:
        return None
    i = names.index(current.name)
    return ladder[i + 1] if i + 1 < len(ladder) else None


def load_record(cache_dir: Path, key: str) -> tuple[dict[str, Any] | None, str | None]:
    """This configuration's record, and why the file could not be used (None when fine or absent). A file that is
    unreadable, or holds an entry of the wrong shape, gives no record and its reason: `set_aside` moves it away."""
    records, problem = _load(cache_dir)
    return records.get(key), problem


def _load(cache_dir: Path) -> tuple[dict[str, dict[str, Any]], str | None]:
    # The cache volume is shared and writable by whatever runs there: read it as untrusted, bounded and non-blocking,
    # and check every entry's shape, since a wrong one (a number where the list of failed rungs belongs) would
    # otherwise surface as a TypeError in the wrapper before vLLM starts.
    path = cache_dir / RECORD_FILE
    try:
        data = load_json_file(path, MAX_RECORD_BYTES, "the compile record")
    except FileNotFoundError:
        return {}, None
    except Untrusted as exc:
        return {}, exc.reason
    if not isinstance(data, dict):
        return {}, f"the compile record {path} must be a JSON object of entries (found {type(data).__name__})"
    for key, entry in data.items():
        problem = _entry_problem(entry)
        if problem is not None:
            return {}, f"the compile record {path}: entry {key[:40]!r} {problem}"
    return data, None


def _entry_problem(entry: object) -> str | None:
    """Why one entry of the record is not of the shape `record_outcome` writes, or None."""
    if not isinstance(entry, dict):
        return f"must be an object (found {type(entry).__name__})"
    rung = entry.get("rung")
    if not isinstance(rung, str) or rung not in RUNGS_BY_NAME:
        return f"must name a rung of {', '.join(RUNGS_BY_NAME)} (found {str(rung)[:40]!r})"
    failed = entry.get("failed", [])
    if not isinstance(failed, list) or not all(isinstance(f, str) and f in RUNGS_BY_NAME for f in failed):
        return f"must list the failed rungs by name (found {str(failed)[:60]!r})"
    for name in ("model", "gpu"):
        if entry.get(name) is not None and not isinstance(entry.get(name), str):
            return f"must hold {name} as text (found {str(entry.get(name))[:40]!r})"
    return None


def set_aside(cache_dir: Path, problem: str, now: float | None = None) -> str:
    """Move an unusable record out of the way (renamed `compile-ladder.json.bad-STAMP`, under the lock), so the
    ladder starts over and the next outcome is recorded in a fresh file; what happened, for the log."""
    path = cache_dir / RECORD_FILE
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(time.time() if now is None else now))
    target = cache_dir / f"{RECORD_FILE}.bad-{stamp}"
    try:
        with locked(cache_dir / LOCK_FILE):
            if _load(cache_dir)[1] is None:  # another server replaced it with a good one meanwhile
                return f"compile record unreadable ({problem}); a good one replaced it meanwhile"
            os.replace(path, target)
    except (OSError, LockError) as exc:
        reason = exc.reason if isinstance(exc, LockError) else (exc.strerror or str(exc))
        return f"compile record unusable ({problem}); could not set it aside ({reason}); starting from the top"
    return f"compile record unusable ({problem}); set aside as {target.name}; starting from the top of the ladder"


class RecordError(Exception):
    """The outcome could not be recorded: `reason` says why (the lock, the folder)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def record_outcome(cache_dir: Path, key: str, *, rung: str, failed: str | None, model: str,
                   gpu_name: str | None, stop: threading.Event | None = None) -> None:
    """Remember `rung` as the one to start with next time (and `failed` as one that ran out of memory), under the
    shared lock (taken within seconds, given up when `stop` is set); RecordError when it cannot be written. An
    unusable record is replaced by a fresh one holding this entry."""
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
        with locked(cache_dir / LOCK_FILE, stop=stop):
            records, _problem = _load(cache_dir)
            entry = records.get(key, {})
            failures = list(entry.get("failed", []))
            if failed is not None and failed not in failures:
                failures.append(failed)
            records[key] = {"model": model, "gpu": gpu_name, "rung": rung, "failed": failures,
                            "updated_at": time.time()}
            write_atomic(cache_dir / RECORD_FILE, json.dumps(records, indent=1, sort_keys=True) + "\n")
    except LockError as exc:
        raise RecordError(exc.reason) from None
    except OSError as exc:
        raise RecordError(f"cannot write {cache_dir / RECORD_FILE}: {exc.strerror or exc}") from None
