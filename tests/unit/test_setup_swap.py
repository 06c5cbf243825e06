"""scripts/setup-swap against scratch paths: refusals with found/required/fix, a real swapfile, idempotence.

The swapfile test creates a 16 MiB swapfile in a temp folder, enables it with swapon, and swapoffs it afterwards;
/etc/fstab is never touched (SETUP_SWAP_FSTAB points at a scratch copy). Skipped when not root or when the sandbox
refuses swapon (then every step before swapon was still run and checked by the refusal tests).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).parents[2] / "scripts" / "setup-swap"


def run(*args: str, fstab: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "SETUP_SWAP_FSTAB": str(fstab)}
    return subprocess.run([str(SCRIPT), *args], capture_output=True, text=True, env=env, timeout=60, check=False)


def refusal(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 1, result.stdout + result.stderr
    for word in ("found:", "required:", "fix:"):
        assert word in result.stderr
    return result.stderr


def test_bad_size_and_usage(tmp_path: Path) -> None:
    assert "bad SIZE" in refusal(run("lots", str(tmp_path / "s"), fstab=tmp_path / "fstab"))
    assert "usage" in refusal(run(fstab=tmp_path / "fstab"))
    assert "too small" in refusal(run("1K", str(tmp_path / "s"), fstab=tmp_path / "fstab"))


needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="setup-swap refuses to run without root (swapon needs it)")


@needs_root
def test_refuses_tmpfs(tmp_path: Path) -> None:
    # A scratch tmpfs of our own, unmounted afterwards.
    mnt = tmp_path / "tmpfs"
    mnt.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1M", "tmpfs", str(mnt)], capture_output=True,
                             text=True, check=False)
    if mounted.returncode != 0:
        pytest.skip("cannot mount a scratch tmpfs here: " + mounted.stderr.strip())
    try:
        err = refusal(run("1M", str(mnt / "swap"), fstab=tmp_path / "fstab"))
        assert "cannot put swap on tmpfs" in err
        assert not (mnt / "swap").exists()
    finally:
        subprocess.run(["umount", str(mnt)], capture_output=True, check=False)


@needs_root
def test_refuses_too_little_disk(tmp_path: Path) -> None:
    err = refusal(run("1000T", str(tmp_path / "swap"), fstab=tmp_path / "fstab"))
    assert "not enough free disk" in err and "1000T + 512 MiB" in err
    assert not (tmp_path / "swap").exists()


@needs_root
def test_refuses_an_existing_non_swap_file(tmp_path: Path) -> None:
    (tmp_path / "data").write_text("precious")
    assert "already exists" in refusal(run("1M", str(tmp_path / "data"), fstab=tmp_path / "fstab"))
    assert (tmp_path / "data").read_text() == "precious"


@needs_root
def test_creates_enables_and_is_idempotent(tmp_path: Path) -> None:
    if shutil.which("swapon") is None:
        pytest.skip("swapon is not installed")
    fstab = tmp_path / "fstab"
    fstab.write_text("# scratch fstab\n")
    swap = tmp_path / "swapfile"
    first = run("16M", str(swap), fstab=fstab)
    try:
        if first.returncode != 0 and "swapon refused" in first.stderr:
            pytest.skip("this sandbox refuses swapon; every step before it ran: " + first.stderr.strip())
        assert first.returncode == 0, first.stderr
        assert swap.stat().st_size == 16 * 1024 * 1024
        assert oct(swap.stat().st_mode & 0o777) == "0o600"
        shown = subprocess.run(["swapon", "--show=NAME", "--noheadings"], capture_output=True, text=True,
                               check=True).stdout.split()
        assert str(swap) in shown
        assert fstab.read_text().count(f"{swap} none swap sw 0 0") == 1
        second = run("16M", str(swap), fstab=fstab)
        assert second.returncode == 0 and "nothing to do" in second.stdout
        assert fstab.read_text().count(f"{swap} none swap sw 0 0") == 1
        other = run("32M", str(swap), fstab=fstab)
        assert "active with another size" in refusal(other)
    finally:
        subprocess.run(["swapoff", str(swap)], capture_output=True, check=False)


def test_help_is_help_not_a_size(tmp_path: Path) -> None:
    """Issue 45: `setup-swap --help` read `--help` as a SIZE ("bad SIZE")."""
    result = run("--help", fstab=tmp_path / "fstab")
    assert result.returncode == 0 and "sudo scripts/setup-swap SIZE [PATH]" in result.stdout
    assert "bad SIZE" not in result.stderr
    assert "unknown option -x" in refusal(run("-x", fstab=tmp_path / "fstab"))
