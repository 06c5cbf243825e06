"""t4serve.atomic: a replaced file is the old one or the new one, never partial; modes; no temp file left behind."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from t4serve import atomic
from t4serve.atomic import write_atomic


def _leftovers(folder: Path) -> list[str]:
    return [p.name for p in folder.iterdir() if p.name.endswith(".t4serve-tmp")]


def test_writes_creates_folders_and_replaces(tmp_path: Path) -> None:
    path = tmp_path / "a" / "b" / "state.json"
    write_atomic(path, "one\n")
    assert path.read_text() == "one\n"
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    write_atomic(path, "two\r\n")
    assert path.read_bytes() == b"two\r\n"  # written as given: no newline translation
    assert _leftovers(path.parent) == []


def test_mode_is_set_or_kept(tmp_path: Path) -> None:
    path = tmp_path / "secret"
    write_atomic(path, "x", mode=0o600)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    write_atomic(path, "y")  # None keeps the existing file's mode
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and path.read_text() == "y"


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "state.json"
    write_atomic(path, "old")

    def full_disk(fd: int) -> None:
        """Stands for fsync failing on a full disk."""
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(atomic.os, "fsync", full_disk)
    with pytest.raises(OSError, match="No space left"):
        write_atomic(path, "new")
    assert path.read_text() == "old"
    assert _leftovers(tmp_path) == []


def test_an_interrupt_leaves_no_temp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def interrupted(src: str, dst: str) -> None:
        """Stands for Ctrl-C arriving between the write and the rename."""
        raise KeyboardInterrupt

    monkeypatch.setattr(atomic.os, "replace", interrupted)
    with pytest.raises(KeyboardInterrupt):
        write_atomic(tmp_path / "f", "x")
    assert os.listdir(tmp_path) == []
