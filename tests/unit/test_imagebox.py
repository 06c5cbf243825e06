"""tests/gpu/imagebox.py's parts, run for real without Docker or a GPU: a small filesystem tarred and compressed
with the zstd program (as `imagebox.py make` does with `docker export`), cut into parts with a manifest of the same
shape, then received one by one, checked and unpacked as on the GPU host. And the host checks that refuse to start
a container: no /dev/nvidia*, no driver libraries (a folder named by IMAGEBOX_DRIVER_DIR that lacks them), too
little disk.

The container itself (namespaces, mounts, HEALTHCHECK, stop) needs root and an image: tests/image/test_imagebox.py.
"""

from __future__ import annotations

import hashlib
import importlib.util
import io
import json
import os
import random
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path
from types import ModuleType

import pytest

IMAGEBOX = Path(__file__).resolve().parents[1] / "gpu" / "imagebox.py"


def load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("imagebox", IMAGEBOX)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules["imagebox"] = module
    spec.loader.exec_module(module)
    return module


box = load()
pytestmark = pytest.mark.skipif(shutil.which("zstd") is None, reason="the zstd program makes the parts")


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(IMAGEBOX), *args], capture_output=True, text=True, timeout=120)


def make_parts(tmp_path: Path, part_bytes: int = 4096, size_bytes: int = 1 << 20) -> tuple[Path, dict]:
    """A 'rootfs' tar (a folder, a file of random bytes, a symlink), zstd-compressed, cut into parts + manifest."""
    buf = io.BytesIO()
    payload = random.Random(0).randbytes(32 * 1024)  # random: still several parts once compressed
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in (("etc/hostname", b""), ("opt/data.bin", payload)):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        link = tarfile.TarInfo("opt/link")
        link.type = tarfile.SYMTYPE
        link.linkname = "data.bin"
        tar.addfile(link)
    stream = subprocess.run(["zstd", "-q", "-1", "-c"], input=buf.getvalue(), capture_output=True, check=True).stdout
    out = tmp_path / "made"
    out.mkdir()
    parts = []
    for i in range(0, len(stream), part_bytes):
        chunk = stream[i:i + part_bytes]
        name = f"{box.PART_PREFIX}{i // part_bytes:03d}"
        (out / name).write_bytes(chunk)
        parts.append({"name": name, "bytes": len(chunk), "sha256": hashlib.sha256(chunk).hexdigest()})
    manifest = {
        "format": box.FORMAT,
        "image": {"ref": "t", "id": "sha256:" + "ab" * 32, "repo_tags": [], "size_bytes": size_bytes,
                  "labels": {"org.opencontainers.image.revision": "abc"}, "config": {}},
        "compression": "zstd -1",
        "stream": {"bytes": len(stream), "sha256": hashlib.sha256(stream).hexdigest()},
        "parts": parts,
    }
    (out / box.MANIFEST).write_text(json.dumps(manifest))
    assert len(parts) >= 3, "the test needs several parts"
    return out, manifest


def send(made: Path, inbox: Path, *names: str) -> None:
    inbox.mkdir(exist_ok=True)
    for name in names:
        shutil.copyfile(made / name, inbox / name)


def part(i: int) -> str:
    return f"{box.PART_PREFIX}{i:03d}"


def test_parts_received_in_order_then_unpacked_whole(tmp_path: Path) -> None:
    made, manifest = make_parts(tmp_path)
    inbox, parts = tmp_path / "inbox", tmp_path / "parts"
    n = len(manifest["parts"])
    send(made, inbox, box.MANIFEST, part(0))
    r = cli("receive", str(inbox), str(parts))
    assert r.returncode == 0, r.stderr
    assert f"have 1 of {n} parts; next {part(1)}" in r.stdout
    assert not (inbox / part(0)).exists(), "a received part is moved out of the inbox"
    for i in range(1, n):
        send(made, inbox, part(i))
        r = cli("receive", str(inbox), str(parts))
        assert r.returncode == 0, r.stderr
    assert "complete" in r.stdout
    r = cli("assemble", str(parts), str(tmp_path / "rootfs"))
    assert r.returncode == 0, r.stderr
    rootfs = tmp_path / "rootfs"
    assert (rootfs / "opt/data.bin").stat().st_size == 32 * 1024
    assert (rootfs / "opt/link").is_symlink()
    assert (rootfs / ".imagebox-image").read_text().strip() == manifest["image"]["id"]
    assert not (tmp_path / "rootfs.partial").exists()
    # A second assemble of the same image reuses the unpacked tree.
    again = cli("assemble", str(parts), str(rootfs))
    assert json.loads(again.stdout)["reused"] is True


def test_a_fresh_machine_is_named_and_exits_3(tmp_path: Path) -> None:
    made, _ = make_parts(tmp_path)
    send(made, tmp_path / "inbox", part(2))
    r = cli("receive", str(tmp_path / "inbox"), str(tmp_path / "parts"))
    assert r.returncode == 3
    assert "fresh machine" in r.stderr and "send part 000 and the manifest again" in r.stderr
    assert "Traceback" not in r.stderr


def test_a_part_out_of_order_names_the_missing_ones(tmp_path: Path) -> None:
    made, _ = make_parts(tmp_path)
    inbox, parts = tmp_path / "inbox", tmp_path / "parts"
    send(made, inbox, box.MANIFEST, part(0))
    assert cli("receive", str(inbox), str(parts)).returncode == 0
    send(made, inbox, part(2))
    r = cli("receive", str(inbox), str(parts))
    assert r.returncode == 4
    assert f"missing {part(1)}" in r.stderr and "send the missing parts" in r.stderr


def test_a_damaged_part_is_refused_on_arrival_and_not_kept(tmp_path: Path) -> None:
    made, manifest = make_parts(tmp_path)
    inbox, parts = tmp_path / "inbox", tmp_path / "parts"
    send(made, inbox, box.MANIFEST, part(0))
    assert cli("receive", str(inbox), str(parts)).returncode == 0
    bad = bytearray((made / part(1)).read_bytes())
    bad[10] ^= 0xFF
    (inbox / part(1)).write_bytes(bytes(bad))
    r = cli("receive", str(inbox), str(parts))
    assert r.returncode == 4
    assert f"{part(1)} is damaged" in r.stderr and manifest["parts"][1]["sha256"] in r.stderr
    assert f"send {part(1)} again" in r.stderr
    assert not (parts / part(1)).exists()


def test_assemble_names_a_missing_part_and_a_part_damaged_after_arrival(tmp_path: Path) -> None:
    made, _ = make_parts(tmp_path)
    parts = tmp_path / "parts"
    shutil.copytree(made, parts)
    (parts / part(1)).unlink()
    r = cli("assemble", str(parts), str(tmp_path / "rootfs"))
    assert r.returncode == 4 and f"{part(1)} is missing" in r.stderr
    shutil.copyfile(made / part(1), parts / part(1))
    (parts / part(2)).write_bytes(b"not the part")
    r = cli("assemble", str(parts), str(tmp_path / "rootfs"))
    assert r.returncode == 4 and f"{part(2)} is damaged" in r.stderr
    assert not (tmp_path / "rootfs").exists() and not (tmp_path / "rootfs.partial").exists()


def test_too_little_disk_is_refused_before_unpacking(tmp_path: Path) -> None:
    made, _ = make_parts(tmp_path, size_bytes=1 << 60)  # an image of an exbibyte: no disk holds it
    r = cli("assemble", str(made), str(tmp_path / "rootfs"))
    assert r.returncode == 2
    assert "too little disk to unpack the image" in r.stderr and "GiB free at" in r.stderr
    assert not (tmp_path / "rootfs.partial").exists()


def test_a_host_without_nvidia_devices_is_refused(tmp_path: Path) -> None:
    if list(Path("/dev").glob("nvidia[0-9]*")):
        pytest.skip("this host has an NVIDIA device")
    with pytest.raises(box.BoxError) as err:
        box.gpu_devices()
    assert "shows no NVIDIA device" in err.value.what and "--no-gpu" in err.value.fix


def test_a_host_without_the_driver_libraries_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if shutil.which("nvidia-smi"):
        pytest.skip("this host has the NVIDIA driver")
    empty = tmp_path / "nvidia-lib64"
    empty.mkdir()
    (empty / "libcuda.so.1").write_bytes(b"")  # one of the two only
    monkeypatch.setenv("IMAGEBOX_DRIVER_DIR", str(empty))
    with pytest.raises(box.BoxError) as err:
        box.driver_dir()
    assert "driver's libraries are not on this host" in err.value.what
    assert str(empty) in err.value.found and "libnvidia-ml.so.1" in err.value.found
    (empty / "libnvidia-ml.so.1").write_bytes(b"")
    assert box.driver_dir() == empty


# Issue 44, item 9: what imagebox.py refuses, each with its message and exit code, never a traceback or a hang.


def test_a_stray_file_named_like_a_part_is_refused_in_the_inbox_and_the_parts(tmp_path: Path) -> None:
    made, _ = make_parts(tmp_path)
    inbox, parts = tmp_path / "inbox", tmp_path / "parts"
    send(made, inbox, box.MANIFEST, part(0))
    shutil.copyfile(made / part(1), inbox / (part(1) + ".bak"))
    r = cli("receive", str(inbox), str(parts))
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert f"{part(1)}.bak is named like a part but is not one" in r.stderr and "move it out of" in r.stderr
    assert (inbox / part(0)).exists(), "nothing is moved while a stray lies beside the parts"
    (inbox / (part(1) + ".bak")).unlink()
    assert cli("receive", str(inbox), str(parts)).returncode == 0
    (parts / (part(0) + ".bak")).write_bytes(b"x")
    rootfs = str(tmp_path / "rootfs")
    for args in (("receive", str(inbox), str(parts)), ("check", str(parts)), ("assemble", str(parts), rootfs)):
        r = cli(*args)
        assert r.returncode == 2 and f"{part(0)}.bak is named like a part" in r.stderr, (args, r.stderr)


@pytest.mark.parametrize("kind", ["fifo", "dev-zero", "link-to-part", "folder"])
def test_a_part_that_is_not_a_regular_file_is_refused_at_once(tmp_path: Path, kind: str) -> None:
    made, _ = make_parts(tmp_path)
    inbox, parts = tmp_path / "inbox", tmp_path / "parts"
    send(made, inbox, box.MANIFEST, part(0))
    assert cli("receive", str(inbox), str(parts)).returncode == 0
    odd = inbox / part(1)
    if kind == "fifo":
        os.mkfifo(odd)
    elif kind == "dev-zero":
        odd.symlink_to("/dev/zero")
    elif kind == "link-to-part":
        odd.symlink_to(made / part(1))
    else:
        odd.mkdir()
    r = subprocess.run([sys.executable, str(IMAGEBOX), "receive", str(inbox), str(parts)], capture_output=True,
                       text=True, timeout=20)  # before the fix: no end (a FIFO, /dev/zero)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert f"{part(1)} is not a regular file" in r.stderr
    assert not (parts / part(1)).exists()
    # The same thing lying in the parts folder: check and assemble refuse it too.
    odd.rename(parts / part(1)) if kind != "folder" else shutil.move(str(odd), parts / part(1))
    for args in (("check", str(parts)), ("assemble", str(parts), str(tmp_path / "rootfs"))):
        r = subprocess.run([sys.executable, str(IMAGEBOX), *args], capture_output=True, text=True, timeout=20)
        assert r.returncode == 2 and f"{part(1)} is not a regular file" in r.stderr, (args, r.stderr)


WRONG_MANIFESTS = {
    "a list": lambda m: [m],
    "parts an object": lambda m: {**m, "parts": {"0": m["parts"][0]}},
    "a part without sha256": lambda m: {**m, "parts": [{"name": p["name"], "bytes": p["bytes"]} for p in m["parts"]]},
    "parts out of order": lambda m: {**m, "parts": m["parts"][::-1]},
    "size_bytes NaN": lambda m: {**m, "image": {**m["image"], "size_bytes": float("nan")}},
    "size_bytes a string": lambda m: {**m, "image": {**m["image"], "size_bytes": "6G"}},
    "bytes a float": lambda m: {**m, "parts": [{**p, "bytes": p["bytes"] + 0.5} for p in m["parts"]]},
    "format a string": lambda m: {**m, "format": "1"},
    "format true": lambda m: {**m, "format": True},
    "image id not a digest": lambda m: {**m, "image": {**m["image"], "id": "../../etc"}},
    "Env not strings": lambda m: {**m, "image": {**m["image"], "config": {"Env": [1]}}},
    "stream sum differs": lambda m: {**m, "stream": {**m["stream"], "bytes": m["stream"]["bytes"] + 1}},
    "unknown key": lambda m: {**m, "extra": 1},
}


@pytest.mark.parametrize("label", sorted(WRONG_MANIFESTS))
def test_a_manifest_of_the_wrong_shape_is_refused_and_keeps_the_last_good_one(tmp_path: Path, label: str) -> None:
    made, manifest = make_parts(tmp_path)
    inbox, parts = tmp_path / "inbox", tmp_path / "parts"
    send(made, inbox, box.MANIFEST, part(0))
    assert cli("receive", str(inbox), str(parts)).returncode == 0
    good = (parts / box.MANIFEST).read_bytes()
    (inbox / box.MANIFEST).write_text(json.dumps(WRONG_MANIFESTS[label](manifest)))
    send(made, inbox, part(1))
    r = cli("receive", str(inbox), str(parts))
    # NaN is no JSON number: "cannot be read"; every other case reads, then fails its shape.
    says = "the manifest cannot be read" if label == "size_bytes NaN" else "the manifest is of the wrong shape"
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert says in r.stderr and "again" in r.stderr
    assert (parts / box.MANIFEST).read_bytes() == good and not (parts / part(1)).exists()
    (parts / box.MANIFEST).write_text(json.dumps(WRONG_MANIFESTS[label](manifest)))
    for args in (("check", str(parts)), ("assemble", str(parts), str(tmp_path / "rootfs"))):
        r = cli(*args)
        assert r.returncode == 2 and says in r.stderr, (args, r.stderr)


@pytest.mark.parametrize(("label", "body"), [
    ("not UTF-8", b"\xff\xfe{}"), ("NaN", b'{"format": NaN}'), ("a repeated key", b'{"format": 1, "format": 1}'),
    ("nested 100,000 deep", b"[" * 100_000 + b"]" * 100_000), ("5 MB", b" " * (5 << 20) + b"{}"),
])  # fmt: skip
def test_a_manifest_that_is_no_json_imagebox_wrote_cannot_be_read(tmp_path: Path, label: str, body: bytes) -> None:
    parts = tmp_path / "parts"
    parts.mkdir()
    (parts / box.MANIFEST).write_bytes(body)
    r = cli("check", str(parts))
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert "the manifest cannot be read" in r.stderr or "the manifest is too large" in r.stderr


def test_check_finds_a_byte_changed_after_receive(tmp_path: Path) -> None:
    made, manifest = make_parts(tmp_path)
    inbox, parts = tmp_path / "inbox", tmp_path / "parts"
    send(made, inbox, box.MANIFEST, *(part(i) for i in range(len(manifest["parts"]))))
    assert cli("receive", str(inbox), str(parts)).returncode == 0
    assert cli("check", str(parts)).returncode == 0
    target = parts / part(1)
    stamp = target.stat()
    data = bytearray(target.read_bytes())
    data[100] ^= 0x01
    target.write_bytes(bytes(data))
    os.utime(target, ns=(stamp.st_atime_ns, stamp.st_mtime_ns))  # the same size and time: only the byte differs
    r = cli("check", str(parts))
    assert r.returncode == 4 and f"{part(1)} is damaged" in r.stderr and f"send {part(1)} again" in r.stderr
    r = cli("assemble", str(parts), str(tmp_path / "rootfs"))
    assert r.returncode == 4 and f"{part(1)} is damaged" in r.stderr
    assert not (tmp_path / "rootfs").exists() and not (tmp_path / "rootfs.partial").exists()
