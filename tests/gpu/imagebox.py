#!/usr/bin/env python3
"""Run a built t4serve image on a GPU host that has no Docker, as Docker with the NVIDIA container toolkit runs it.

Here, with Docker (the image's exported filesystem, in checksummed parts that travel one per device call):
    imagebox.py make IMAGE OUTDIR [--part-mib N] [--level L]

On the GPU host (root; Python 3.11+, the standard library only; util-linux's unshare, nsenter and mount):
    imagebox.py receive INBOX PARTS     move the parts that arrived in INBOX to PARTS, each checked; exit 3 on a
                                        machine that lacks the earlier parts (a fresh one: start over from part 000)
    imagebox.py assemble PARTS ROOTFS   check every part, then unpack the filesystem (into ROOTFS.partial, renamed
                                        into place once whole)
    imagebox.py run NAME --rootfs ROOTFS [-e K=V]... [-v HOST:CTR[:ro]]... [--shm-size 2g] [--no-gpu]
                    [--entrypoint PROG] [--detach] [-- ARGS...]
    imagebox.py exec NAME [--user U] [-e K=V]... -- CMD...
    imagebox.py health NAME             the image's HEALTHCHECK command, run inside as Docker runs it; its exit code
    imagebox.py stop NAME [--time S]    SIGTERM to the container's PID 1, SIGKILL after S seconds (Docker's stop)
    imagebox.py inspect NAME            pids, exit code, mounts

A container is the image's filesystem under an overlay (its writable layer: NAME/upper, kept across a restart of the
same NAME, as `docker restart` keeps it), in its own mount, PID, UTS, IPC and cgroup namespaces (the entrypoint is PID
1), with what Docker gives it: /proc, a read-only /sys, a minimal /dev with /dev/shm (2 GB, compose's shm_size),
/etc/hosts, /etc/resolv.conf and /etc/hostname, the image's Env, WorkingDir, User (its uid, gid and groups from the
image's /etc/passwd and /etc/group) and Entrypoint/Cmd, and an anonymous volume for each VOLUME the image declares
(initialised from the image's content, as Docker does). The GPU as the NVIDIA container toolkit gives it for the
compute and utility capabilities: /dev/nvidiactl, /dev/nvidia-uvm(-tools), /dev/nvidiaN, the driver's libraries
(libcuda, libnvidia-ml, libnvidia-ptxjitcompiler, libnvidia-nvvm, ...) bound into /usr/lib/x86_64-linux-gnu with
ldconfig run inside, and nvidia-smi. The network is the host's (as `--network host`). Nothing else of Docker's is
emulated: no seccomp profile, no capability set beyond what dropping to a non-root user drops, no cgroup limits.

State: IMAGEBOX_ROOT (default /tmp/imagebox)/NAME/: config.json, log (the container's stdout and stderr), pid (the
container's PID 1 as the host sees it), exit (its exit code, as Docker reports it: 128+N for signal N).

Exit codes of make, receive, check and assemble (each refusal prints what it found, what is required and the fix):
    0  done
    2  refused: a manifest of the wrong shape, a file in the inbox or the parts folder that is not a part (a stray
       name such as rootfs.tar.zst.000.bak, a FIFO, a symbolic link, a device), a usage error; nothing was moved
    3  a fresh machine: the parts before this one are not here; start over from part 000 and the manifest
    4  a part arrived or lies damaged (size or sha256), or is missing: send that part again
Every part is opened without following links and without blocking and must be a regular file of the manifest's size;
`check` and `assemble` hash every byte (nothing is taken on trust from an earlier call).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

FORMAT = 1
MIB = 1 << 20
GIB = 1 << 30
PART_PREFIX = "rootfs.tar.zst."
MANIFEST = "manifest.json"
STATE_ROOT = Path(os.environ.get("IMAGEBOX_ROOT", "/tmp/imagebox"))
LAYER_FALLBACK = Path("/dev/shm/imagebox-layers")
HERE = Path(__file__).resolve()
# What the NVIDIA container toolkit injects for NVIDIA_DRIVER_CAPABILITIES=compute,utility (libnvidia-container's
# library and binary lists for those two capabilities): the file-name stems looked for in the driver's folder.
DRIVER_LIBS = (
    "libnvidia-ml", "libnvidia-cfg", "libcuda", "libcudadebugger", "libnvidia-opencl", "libnvidia-gpucomp",
    "libnvidia-ptxjitcompiler", "libnvidia-fatbinaryloader", "libnvidia-allocator", "libnvidia-compiler",
    "libnvidia-pkcs11", "libnvidia-pkcs11-openssl3", "libnvidia-nvvm",
)
DRIVER_BINS = ("nvidia-smi", "nvidia-debugdump", "nvidia-persistenced", "nvidia-cuda-mps-control",
               "nvidia-cuda-mps-server")
REQUIRED_LIBS = ("libcuda.so.1", "libnvidia-ml.so.1")
DRIVER_DIRS = ("/usr/local/nvidia/lib64", "/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib")
BIN_DIRS = ("/usr/local/nvidia/bin", "/usr/bin", "/usr/local/bin")
CONTAINER_LIB_DIR = "/usr/lib/x86_64-linux-gnu"


class BoxError(Exception):
    """A failure a user can act on: what was found, what is required, the fix. `code` is the exit code."""

    def __init__(self, what: str, found: str = "", required: str = "", fix: str = "", code: int = 2) -> None:
        super().__init__(what)
        self.what, self.found, self.required, self.fix, self.code = what, found, required, fix, code

    def render(self) -> str:
        lines = [f"imagebox: {self.what}"]
        parts = (("found", self.found), ("required", self.required), ("fix", self.fix))
        lines += [f"  {k}: {v}" for k, v in parts if v]
        return "\n".join(lines)


def say(msg: str) -> None:
    print(msg, flush=True)


def need_tool(name: str) -> str:
    path = shutil.which(name)
    if not path:
        raise BoxError(f"{name} is not on PATH", "no executable named " + name, f"util-linux's {name}",
                       "install util-linux (apt-get install util-linux)")
    return path


# Exit codes (the module docstring's table).
REFUSED, FRESH, RESEND = 2, 3, 4
PART_NAME = re.compile(re.escape(PART_PREFIX) + r"([0-9]{3,6})")
SHA256_HEX = re.compile(r"[0-9a-f]{64}")
IMAGE_ID = re.compile(r"sha256:[0-9a-f]{64}")
# Bounds on what a manifest may say: far past any image (t4serve's is 6.3 GB in 54 parts of 64 MiB).
MANIFEST_MAX_BYTES = 4 * MIB
MAX_PARTS = 100_000
MAX_PART_BYTES = 1 << 40
MAX_IMAGE_BYTES = 1 << 62
MAX_JSON_DEPTH = 32


def write_json(path: Path, data: Any) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    tmp.replace(path)


def open_regular(path: Path, what: str, fix: str) -> int:
    """A descriptor on `path`, which must be a regular file itself: a symbolic link (to /dev/zero or anywhere), a FIFO
    or a device is refused without blocking on it."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        found = "a symbolic link" if path.is_symlink() else (exc.strerror or str(exc))
        raise BoxError(f"{what} is not a regular file", f"{path}: {found}", "a regular file (not a link, FIFO or "
                       "device)", fix, code=REFUSED) from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        kind = ("a FIFO" if stat.S_ISFIFO(st.st_mode) else "a folder" if stat.S_ISDIR(st.st_mode)
                else "a device" if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode) else "not a regular file")
        raise BoxError(f"{what} is not a regular file", f"{path}: {kind}", "a regular file (not a link, FIFO or "
                       "device)", fix, code=REFUSED)
    return fd


def read_json(path: Path, what: str, limit: int = MANIFEST_MAX_BYTES) -> Any:
    """JSON from a regular file of at most `limit` bytes: UTF-8, no NaN or Infinity, no repeated key, bounded
    nesting."""
    fix = f"copy {path.name} again from the make folder (imagebox.py make wrote it beside the parts)"
    if not path.exists() and not path.is_symlink():
        raise BoxError(f"{what} is missing", str(path), f"the file {path.name}", fix, code=REFUSED)
    fd = open_regular(path, what, fix)
    with os.fdopen(fd, "rb") as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise BoxError(f"{what} is too large", f"{path}: more than {limit:,} bytes", f"at most {limit:,} bytes", fix,
                       code=REFUSED)

    def constant(word: str) -> Any:
        raise ValueError(f"{word} is not a JSON number")

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        keys = [k for k, _ in items]
        if len(set(keys)) != len(keys):
            raise ValueError("a key is repeated")
        return dict(items)

    try:
        text = data.decode("utf-8")
        if _nesting(text) > MAX_JSON_DEPTH:
            raise ValueError(f"nested deeper than {MAX_JSON_DEPTH} levels")
        return json.loads(text, parse_constant=constant, object_pairs_hook=pairs)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise BoxError(f"{what} cannot be read", f"{path}: {str(exc)[:200]}", "the JSON imagebox.py make wrote", fix,
                       code=REFUSED) from None


def _nesting(text: str) -> int:
    """The deepest nesting of brackets outside strings, counted without recursion."""
    depth = deepest = 0
    in_string = escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            if depth > deepest:
                deepest = depth
                if deepest > MAX_JSON_DEPTH:
                    return deepest
        elif ch in "]}":
            depth -= 1
    return deepest


def _shape(found: str, path: Path) -> BoxError:
    return BoxError("the manifest is of the wrong shape", f"{path}: {found}",
                    f"the manifest imagebox.py make writes (format {FORMAT})",
                    "make the parts and the manifest again, together (imagebox.py make), and send the manifest",
                    code=REFUSED)


def _whole(value: Any, low: int, high: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


def _strings(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def check_image_config(config: Any, path: Path) -> None:
    """The image's configuration fields `run` reads, each of the type Docker's inspect gives it."""
    if not isinstance(config, dict):
        raise _shape("image.config is not an object", path)
    for key in ("Env", "Entrypoint", "Cmd"):
        if config.get(key) is not None and not _strings(config[key]):
            raise _shape(f"image.config.{key} is not a list of strings", path)
    for key in ("WorkingDir", "User", "StopSignal"):
        if config.get(key) is not None and not isinstance(config[key], str):
            raise _shape(f"image.config.{key} is not a string", path)
    for key in ("Volumes", "ExposedPorts"):
        if config.get(key) is not None and not isinstance(config[key], dict):
            raise _shape(f"image.config.{key} is not an object", path)
    hc = config.get("Healthcheck")
    if hc is not None:
        test = hc.get("Test") if isinstance(hc, dict) else None
        if not isinstance(hc, dict) or (test is not None and not (_strings(test) and test and
                                                                  (test[0] == "NONE" or len(test) >= 2))):
            raise _shape("image.config.Healthcheck is not {Test: [CMD or CMD-SHELL, ...], ...}", path)
        for key in ("Timeout", "Interval", "StartPeriod", "Retries"):
            if hc.get(key) is not None and not _whole(hc[key], 0, 1 << 62):
                raise _shape(f"image.config.Healthcheck.{key} is not a whole number", path)


def read_manifest(path: Path) -> dict[str, Any]:
    """The manifest `make` wrote, every field `receive`, `check`, `assemble` and `run` read checked for type and
    bounds: parts named 000, 001, ... in order, sizes that add up to the stream, sha256s of 64 hex digits."""
    m = read_json(path, "the manifest")
    if not isinstance(m, dict):
        raise _shape(f"a JSON {type(m).__name__}, not an object", path)
    known = {"format", "image", "compression", "stream", "parts", "made_seconds"}
    if set(m) - known or not {"format", "image", "stream", "parts"} <= set(m):
        raise _shape(f"keys {', '.join(sorted(m))[:200]} (required format, image, stream, parts; also allowed "
                     "compression, made_seconds)", path)
    if m["format"] != FORMAT or isinstance(m["format"], bool):
        raise _shape(f"format {str(m['format'])[:40]}, not {FORMAT} (made by another imagebox.py)", path)
    image = m["image"]
    if not isinstance(image, dict) or not isinstance(image.get("id"), str) or not IMAGE_ID.fullmatch(image["id"]):
        raise _shape("image.id is not sha256:<64 hex digits>", path)
    size = image.get("size_bytes")
    if size is not None and not _whole(size, 0, MAX_IMAGE_BYTES):
        raise _shape(f"image.size_bytes {str(size)[:40]} is not a whole number of bytes up to {MAX_IMAGE_BYTES:,}",
                     path)
    labels = image.get("labels", {})
    if not isinstance(labels, dict) or not all(isinstance(v, str) for v in labels.values()):
        raise _shape("image.labels is not an object of strings", path)
    for key in ("ref", "created"):
        if image.get(key) is not None and not isinstance(image[key], str):
            raise _shape(f"image.{key} is not a string", path)
    if image.get("repo_tags") is not None and not _strings(image["repo_tags"]):
        raise _shape("image.repo_tags is not a list of strings", path)
    check_image_config(image.get("config", {}), path)
    stream = m["stream"]
    if (not isinstance(stream, dict) or not _whole(stream.get("bytes"), 1, MAX_PART_BYTES * MAX_PARTS)
            or not isinstance(stream.get("sha256"), str) or not SHA256_HEX.fullmatch(stream["sha256"])):
        raise _shape("stream is not {bytes: a whole number above 0, sha256: 64 hex digits}", path)
    parts = m["parts"]
    if not isinstance(parts, list) or not 1 <= len(parts) <= MAX_PARTS:
        raise _shape(f"parts is not a list of 1 to {MAX_PARTS:,} parts", path)
    for i, entry in enumerate(parts):
        name = f"{PART_PREFIX}{i:03d}"
        if (not isinstance(entry, dict) or set(entry) != {"name", "bytes", "sha256"} or entry["name"] != name
                or not _whole(entry["bytes"], 1, MAX_PART_BYTES) or not isinstance(entry["sha256"], str)
                or not SHA256_HEX.fullmatch(entry["sha256"])):
            raise _shape(f"parts[{i}] is not {{name: {name}, bytes: a whole number above 0, sha256: 64 hex digits}}",
                         path)
    if sum(p["bytes"] for p in parts) != stream["bytes"]:
        raise _shape(f"the parts add up to {sum(p['bytes'] for p in parts):,} bytes, the stream is "
                     f"{stream['bytes']:,}", path)
    if m.get("compression") is not None and not isinstance(m["compression"], str):
        raise _shape("compression is not a string", path)
    seconds = m.get("made_seconds")
    if seconds is not None and (isinstance(seconds, bool) or not isinstance(seconds, int | float)):
        raise _shape("made_seconds is not a number", path)
    return m


def copy_part(path: Path, entry: dict[str, Any], out: Path | None, fix: str) -> None:
    """Read the part at `path` (a regular file, never followed through a link), check its size and sha256 against
    the manifest's entry, and write it to `out` when given. Exit 4 (send it again) when it differs."""
    fd = open_regular(path, f"{path.name}", fix)
    h = hashlib.sha256()
    with os.fdopen(fd, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size != entry["bytes"]:
            raise BoxError(f"{path.name} is damaged", f"{path}: {size:,} B", f"{entry['bytes']:,} B, sha256 "
                           f"{entry['sha256']}", f"send {path.name} again", code=RESEND)
        sink = open(out, "wb") if out is not None else None  # noqa: SIM115 - closed below, removed on failure
        try:
            read = 0
            while read <= entry["bytes"] and (chunk := f.read(4 * MIB)):
                h.update(chunk)
                read += len(chunk)
                if sink is not None:
                    sink.write(chunk)
        finally:
            if sink is not None:
                sink.close()
    if read != entry["bytes"] or h.hexdigest() != entry["sha256"]:
        if out is not None:
            out.unlink(missing_ok=True)
        raise BoxError(f"{path.name} is damaged", f"{path}: {read:,} B, sha256 {h.hexdigest()}",
                       f"{entry['bytes']:,} B, sha256 {entry['sha256']}", f"send {path.name} again", code=RESEND)


# --- make (here, with Docker) --------------------------------------------------------------------------------------


def make(image: str, outdir: Path, part_mib: int, level: int, docker: str) -> dict[str, Any]:
    """Export a container of IMAGE, compress it with zstd, cut it in parts of part_mib MiB; write the manifest."""
    if not shutil.which("zstd"):
        raise BoxError("zstd is not on PATH", "no zstd", "the zstd compressor", "apt-get install zstd")
    inspect = subprocess.run([docker, "image", "inspect", image], capture_output=True, text=True)
    if inspect.returncode != 0:
        raise BoxError(f"no image {image}", inspect.stderr.strip(), "a built image", "run scripts/build-image")
    info = json.loads(inspect.stdout)[0]
    config = info["Config"]
    outdir.mkdir(parents=True, exist_ok=True)
    for old in outdir.glob(PART_PREFIX + "*"):
        old.unlink()
    (outdir / MANIFEST).unlink(missing_ok=True)
    cid = subprocess.run([docker, "create", image], capture_output=True, text=True, check=True).stdout.strip()
    part_bytes = part_mib * MIB
    parts: list[dict[str, Any]] = []
    whole = hashlib.sha256()
    started = time.time()
    try:
        export = subprocess.Popen([docker, "export", cid], stdout=subprocess.PIPE)
        zstd = subprocess.Popen(["zstd", "-q", f"-{level}", "-T0", "-c"], stdin=export.stdout, stdout=subprocess.PIPE)
        assert export.stdout is not None and zstd.stdout is not None
        export.stdout.close()
        index = 0
        while True:
            name = f"{PART_PREFIX}{index:03d}"
            h, size = hashlib.sha256(), 0
            with open(outdir / name, "wb") as f:
                while size < part_bytes:
                    chunk = zstd.stdout.read(min(4 * MIB, part_bytes - size))
                    if not chunk:
                        break
                    f.write(chunk)
                    h.update(chunk)
                    whole.update(chunk)
                    size += len(chunk)
            if size == 0:
                (outdir / name).unlink()
                break
            parts.append({"name": name, "bytes": size, "sha256": h.hexdigest()})
            index += 1
        if export.wait() != 0 or zstd.wait() != 0:
            raise BoxError("docker export | zstd failed", f"export exit {export.returncode}, zstd exit "
                           f"{zstd.returncode}", "both exit 0", "check the disk and the engine, then run make again")
    finally:
        subprocess.run([docker, "rm", "-v", cid], capture_output=True)
    manifest = {
        "format": FORMAT,
        "image": {
            "ref": image,
            "id": info["Id"],
            "repo_tags": info.get("RepoTags") or [],
            "created": info.get("Created"),
            "size_bytes": info.get("Size"),
            "labels": config.get("Labels") or {},
            "config": {k: config.get(k) for k in ("Env", "Entrypoint", "Cmd", "WorkingDir", "User", "Healthcheck",
                                                  "Volumes", "ExposedPorts", "StopSignal")},
        },
        "compression": f"zstd -{level}",
        "stream": {"bytes": sum(p["bytes"] for p in parts), "sha256": whole.hexdigest()},
        "parts": parts,
        "made_seconds": round(time.time() - started, 1),
    }
    write_json(outdir / MANIFEST, manifest)
    return manifest


# --- receive, check, assemble (on the GPU host) --------------------------------------------------------------------


def part_files(folder: Path, own: tuple[str, ...] = ()) -> dict[int, Path]:
    """The parts in `folder` by index. A file named like a part that is not one (`rootfs.tar.zst.000.bak`) is
    refused: nothing is guessed about it. Names ending in `own` (imagebox's own temporary files) are left aside."""
    found: dict[int, Path] = {}
    for path in sorted(folder.glob(PART_PREFIX + "*")):
        if path.name.endswith(own):
            continue
        match = PART_NAME.fullmatch(path.name)
        if match is None:
            raise BoxError(f"{path.name} is named like a part but is not one", str(path),
                           f"only parts ({PART_PREFIX}000, {PART_PREFIX}001, ...) under that name in {folder}",
                           f"move it out of {folder} (rename it without the {PART_PREFIX} prefix) and run this again",
                           code=REFUSED)
        found[int(match.group(1))] = path
    return found


def receive(inbox: Path, parts_dir: Path) -> dict[str, Any]:
    """Move what arrived in inbox (the manifest, parts) into parts_dir, each part checked against the manifest.
    The parts in parts_dir must always be 000 ... k-1 with none missing. A refused file is never moved, and the
    manifest in parts_dir is replaced only by one that passes (its parts removed when it names another stream)."""
    parts_dir.mkdir(parents=True, exist_ok=True)
    # Refused before anything is moved: a stray or odd file in either folder.
    arrived = part_files(inbox)
    for leftover in parts_dir.glob(PART_PREFIX + "*.partial"):  # a receive cut short: its copy, never a part
        leftover.unlink()
    part_files(parts_dir, own=(".ok",))
    manifest = None
    if (inbox / MANIFEST).exists() or (inbox / MANIFEST).is_symlink():
        manifest = read_manifest(inbox / MANIFEST)
        previous = parts_dir / MANIFEST
        if previous.exists():
            try:
                old = read_manifest(previous)
            except BoxError:
                old = None
            if old is None or old["stream"] != manifest["stream"]:
                # Parts of another stream (another make): they would never fit this manifest.
                for stale in part_files(parts_dir, own=(".ok",)).values():
                    stale.unlink()
        write_json(parts_dir / MANIFEST, manifest)
    if not (parts_dir / MANIFEST).exists():
        names = ", ".join(p.name for p in arrived.values())
        raise BoxError("fresh machine: the manifest (sent with part 000) is not here",
                       f"{parts_dir} has no {MANIFEST}; arrived now: {names or 'nothing'}",
                       "every part from 000 on, on one machine",
                       "the device gave the machine back between calls: send part 000 and the manifest again",
                       code=FRESH)
    if manifest is None:
        manifest = read_manifest(parts_dir / MANIFEST)
    for wheel in inbox.glob("*.whl"):  # helpers (the zstandard wheel, for a host without the zstd program)
        shutil.move(str(wheel), parts_dir / wheel.name)
    expected = manifest["parts"]
    for index, path in sorted(arrived.items()):
        if index >= len(expected):
            raise BoxError(f"{path.name} is not in the manifest", f"{len(expected)} parts listed",
                           "parts made with this manifest", "make the parts and the manifest again, together",
                           code=REFUSED)
        tmp = parts_dir / (path.name + ".partial")
        copy_part(path, expected[index], tmp, f"send {path.name} again as a regular file")
        tmp.replace(parts_dir / path.name)
        path.unlink()  # moved: a later call that finds it still in the inbox does not check it twice
    have = sorted(part_files(parts_dir, own=(".ok",)))
    missing = [i for i in range(max(have) + 1 if have else 0) if i not in have]
    if missing:
        names = ", ".join(f"{PART_PREFIX}{i:03d}" for i in missing[:8]) + (" ..." if len(missing) > 8 else "")
        fresh = 0 in missing
        raise BoxError("a part is missing before the last one that arrived (out of order, or a fresh machine)",
                       f"have {len(have)} of {len(expected)}; missing {names}", "parts 000 ... in order",
                       "send the missing parts" + (" (part 000 missing: a fresh machine; start over)" if fresh
                                                   else ""), code=FRESH if fresh else RESEND)
    return {"have": len(have), "of": len(expected), "next": f"{PART_PREFIX}{len(have):03d}"
            if len(have) < len(expected) else None, "image": manifest["image"]["id"]}


def present(parts_dir: Path) -> dict[str, Any]:
    """The manifest, and every part it lists in parts_dir as a regular file of its size (not yet hashed)."""
    manifest = read_manifest(parts_dir / MANIFEST)
    files = part_files(parts_dir, own=(".ok", ".partial"))
    for i, entry in enumerate(manifest["parts"]):
        path = files.get(i)
        if path is None:
            raise BoxError(f"{entry['name']} is missing", f"{len(files)} part files in {parts_dir}",
                           f"all {len(manifest['parts'])} parts", f"send {entry['name']}", code=RESEND)
        fd = open_regular(path, entry["name"], f"send {entry['name']} again as a regular file")
        size = os.fstat(fd).st_size
        os.close(fd)
        if size != entry["bytes"]:
            raise BoxError(f"{entry['name']} is damaged", f"{path}: {size:,} B",
                           f"{entry['bytes']:,} B, sha256 {entry['sha256']}", f"send {entry['name']} again",
                           code=RESEND)
    extra = sorted(i for i in files if i >= len(manifest["parts"]))
    if extra:
        raise BoxError(f"{files[extra[0]].name} is not in the manifest", f"{len(manifest['parts'])} parts listed",
                       "parts made with this manifest", f"remove {files[extra[0]].name} from {parts_dir}",
                       code=REFUSED)
    return manifest


def check(parts_dir: Path) -> dict[str, Any]:
    """Every part present and whole: each byte hashed now, whatever an earlier call found."""
    manifest = present(parts_dir)
    for entry in manifest["parts"]:
        copy_part(parts_dir / entry["name"], entry, None, f"send {entry['name']} again as a regular file")
    return manifest


def decompressor(parts_dir: Path) -> list[str]:
    """The zstd decompressor: the zstd program, else the zstandard wheel sent beside the parts (helpers/)."""
    if shutil.which("zstd"):
        return ["zstd", "-dc"]
    wheels = sorted(parts_dir.glob("zstandard-*.whl"))
    if not wheels:
        raise BoxError("no zstd decompressor on this host", "no zstd program, no zstandard-*.whl beside the parts",
                       "either", "send the wheel imagebox.py make wrote (zstandard-*.whl) with a part")
    site = parts_dir / "helpers-site"
    if not (site / "zstandard").is_dir():
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--target",
                        str(site), str(wheels[-1])], check=True)
    code = ("import sys, zstandard; zstandard.ZstdDecompressor().copy_stream(sys.stdin.buffer, sys.stdout.buffer, "
            "read_size=4194304, write_size=4194304)")
    return ["env", f"PYTHONPATH={site}", sys.executable, "-c", code]


def assemble(parts_dir: Path, rootfs: Path) -> dict[str, Any]:
    """Unpack the parts into rootfs (through rootfs.partial): each part hashed as it streams to the decompressor, a
    damaged one stops the unpacking and removes what was unpacked."""
    manifest = present(parts_dir)
    done = rootfs / ".imagebox-image"
    if done.is_file() and done.read_text().strip() == manifest["image"]["id"]:
        return {"rootfs": str(rootfs), "image": manifest["image"]["id"], "unpacked_seconds": 0.0, "reused": True}
    need = (manifest["image"].get("size_bytes") or 0) * 11 // 10 + GIB
    rootfs.parent.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(rootfs.parent).free
    if free < need:
        raise BoxError("too little disk to unpack the image", f"{free / GIB:.1f} GiB free at {rootfs.parent}",
                       f"{need / GIB:.1f} GiB (the image's size plus a tenth and 1 GiB)",
                       "free disk there, or unpack elsewhere (ROOTFS on a larger filesystem)")
    partial = rootfs.with_name(rootfs.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    shutil.rmtree(rootfs, ignore_errors=True)
    partial.mkdir(parents=True)
    started = time.time()
    dec = subprocess.Popen(decompressor(parts_dir), stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    tar = subprocess.Popen(["tar", "-x", "--numeric-owner", "--same-owner", "-p", "-f", "-", "-C", str(partial)],
                           stdin=dec.stdout)
    assert dec.stdin is not None and dec.stdout is not None
    dec.stdout.close()
    whole = hashlib.sha256()
    damaged: BoxError | None = None
    try:
        for entry in manifest["parts"]:
            path = parts_dir / entry["name"]
            fd = open_regular(path, entry["name"], f"send {entry['name']} again as a regular file")
            h, read = hashlib.sha256(), 0
            with os.fdopen(fd, "rb") as f:
                while read < entry["bytes"] and (chunk := f.read(min(4 * MIB, entry["bytes"] - read))):
                    h.update(chunk)
                    read += len(chunk)
                    # Streamed as read (each part is read once); a damaged part is known at its end, and then
                    # what tar unpacked so far is removed.
                    whole.update(chunk)
                    dec.stdin.write(chunk)
            if read != entry["bytes"] or h.hexdigest() != entry["sha256"]:
                damaged = BoxError(f"{entry['name']} is damaged", f"{path}: {read:,} B read, sha256 {h.hexdigest()}",
                                   f"{entry['bytes']:,} B, sha256 {entry['sha256']}", f"send {entry['name']} again",
                                   code=RESEND)
                break
        dec.stdin.close()
    except BrokenPipeError:
        pass
    except BoxError as exc:
        damaged = exc
    if damaged is not None:
        for proc in (dec, tar):
            proc.kill()
        dec.wait(), tar.wait()
        shutil.rmtree(partial, ignore_errors=True)
        raise damaged
    rc_dec, rc_tar = dec.wait(), tar.wait()
    if rc_dec or rc_tar:
        shutil.rmtree(partial, ignore_errors=True)
        # The decompressor may stop on a damaged part before that part was read to its end: name it if so.
        check(parts_dir)
        raise BoxError("unpacking failed", f"decompressor exit {rc_dec}, tar exit {rc_tar}", "both exit 0",
                       "check the disk (df) and run assemble again")
    if whole.hexdigest() != manifest["stream"]["sha256"]:
        shutil.rmtree(partial, ignore_errors=True)
        raise BoxError("the parts together are not the stream that was made", whole.hexdigest(),
                       manifest["stream"]["sha256"], "make and send the parts again", code=REFUSED)
    (partial / ".imagebox-image").write_text(manifest["image"]["id"] + "\n")
    write_json(partial / ".imagebox-manifest.json", manifest)
    partial.rename(rootfs)
    return {"rootfs": str(rootfs), "image": manifest["image"]["id"],
            "unpacked_seconds": round(time.time() - started, 1), "reused": False}


# --- the container -------------------------------------------------------------------------------------------------


def gpu_devices() -> list[str]:
    devs = sorted(str(p) for p in Path("/dev").glob("nvidia*") if not p.is_dir())
    caps = Path("/dev/nvidia-caps")
    if caps.is_dir():
        devs += sorted(str(p) for p in caps.iterdir())
    cards = [d for d in devs if re.fullmatch(r"/dev/nvidia[0-9]+", d)]
    if "/dev/nvidiactl" not in devs or not cards:
        raise BoxError("this host shows no NVIDIA device", f"/dev/nvidia*: {', '.join(devs) or 'none'}",
                       "/dev/nvidiactl and at least one /dev/nvidiaN (the NVIDIA kernel driver loaded)",
                       "load the driver (nvidia-smi must work on the host), or run with --no-gpu")
    return [d for d in devs if not d.endswith("nvidia-modeset")]


def driver_dir() -> Path:
    """The folder holding the host driver's user-space libraries (libcuda.so.1 and libnvidia-ml.so.1)."""
    candidates = [os.environ["IMAGEBOX_DRIVER_DIR"]] if os.environ.get("IMAGEBOX_DRIVER_DIR") else []
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        out = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True, timeout=20).stdout
        candidates += [str(Path(line.split("=>")[-1].strip()).parent) for line in out.splitlines()
                       if "libcuda.so.1 " in line and "=>" in line]
    candidates += list(DRIVER_DIRS)
    for d in candidates:
        if all((Path(d) / lib).exists() for lib in REQUIRED_LIBS):
            return Path(d)
    raise BoxError("the NVIDIA driver's libraries are not on this host",
                   f"no folder with {' and '.join(REQUIRED_LIBS)} among {', '.join(dict.fromkeys(candidates))}",
                   "the driver's user-space libraries (what the container toolkit injects)",
                   "install the driver's libraries, or name their folder in IMAGEBOX_DRIVER_DIR")


def driver_files(libdir: Path) -> tuple[list[Path], list[Path]]:
    libs = [p for p in sorted(libdir.iterdir())
            if any(p.name.startswith(stem + ".so") for stem in DRIVER_LIBS)]
    bins = []
    for name in DRIVER_BINS:
        for d in (libdir.parent / "bin", *map(Path, BIN_DIRS)):
            if (d / name).is_file():
                bins.append(d / name)
                break
    return libs, bins


def parse_user(rootfs: Path, user: str) -> tuple[int, int, list[int], str]:
    """uid, gid, supplementary groups and home of USER (name or uid[:gid]) as the image's passwd and group say."""
    name, _, group = (user or "0").partition(":")
    passwd = {}
    with contextlib.suppress(OSError):
        for line in (rootfs / "etc/passwd").read_text().splitlines():
            f = line.split(":")
            if len(f) >= 7:
                passwd[f[0]] = (int(f[2]), int(f[3]), f[5])
    if name.isdigit():
        uid = int(name)
        match = [(n, v) for n, v in passwd.items() if v[0] == uid]
        login, (gid, home) = (match[0][0], match[0][1][1:]) if match else (None, (0, "/"))
    elif name in passwd:
        login = name
        uid, gid, home = passwd[name]
    else:
        raise BoxError(f"the image has no user {name}", "not in the image's /etc/passwd", "a user it defines",
                       "pass --user UID")
    if group:
        gid = int(group)
    groups = [gid]
    if login:
        with contextlib.suppress(OSError):
            for line in (rootfs / "etc/group").read_text().splitlines():
                f = line.split(":")
                if len(f) >= 4 and login in f[3].split(","):
                    groups.append(int(f[2]))
    return uid, gid, sorted(set(groups)), home


def container_env(image_config: dict[str, Any], extra: list[str], hostname: str, home: str) -> dict[str, str]:
    env: dict[str, str] = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
    for item in image_config.get("Env") or []:
        k, _, v = item.partition("=")
        env[k] = v
    env["HOSTNAME"] = hostname
    env.setdefault("HOME", home)
    for item in extra:
        k, sep, v = item.partition("=")
        if not sep:
            if k in os.environ:
                env[k] = os.environ[k]
            continue
        env[k] = v
    return env


def state_dir(name: str) -> Path:
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}", name):
        raise BoxError(f"bad container name {name!r}", name, "letters, digits, '_', '.', '-'", "pick another name")
    return STATE_ROOT / name


def load_config(name: str) -> dict[str, Any]:
    config: dict[str, Any] = read_json(state_dir(name) / "config.json", f"container {name}'s config")
    return config


def host_pid(name: str) -> int | None:
    try:
        pid = int((state_dir(name) / "pid").read_text())
    except (OSError, ValueError):
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    return pid


def init_volume(rootfs: Path, dst: str, volume: Path) -> None:
    """Make `volume` a copy of the image's content at `dst` (owners and modes kept), or an empty folder."""
    tmp = volume.with_name(volume.name + ".init")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.parent.mkdir(parents=True, exist_ok=True)
    content = rootfs / dst.lstrip("/")
    if content.is_dir():
        subprocess.run(["cp", "-a", str(content), str(tmp)], check=True)
    else:
        tmp.mkdir()
    tmp.rename(volume)


def run(args: argparse.Namespace) -> int:
    rootfs = Path(args.rootfs).resolve()
    manifest = read_manifest(rootfs / ".imagebox-manifest.json")
    image_config = manifest["image"]["config"]
    sd = state_dir(args.name)
    if host_pid(args.name):
        raise BoxError(f"container {args.name} is running", f"pid {host_pid(args.name)}", "a stopped container",
                       f"imagebox.py stop {args.name}")
    need_tool("unshare")
    need_tool("mount")
    devices = [] if args.no_gpu else gpu_devices()
    libs, bins = ([], []) if args.no_gpu else driver_files(driver_dir())
    user = args.user if args.user is not None else (image_config.get("User") or "0")
    uid, gid, groups, home = parse_user(rootfs, user)
    for name in ("upper", "work", "volumes"):
        (sd / name).mkdir(parents=True, exist_ok=True)
    hostname = hashlib.sha256(f"{args.name}{manifest['image']['id']}".encode()).hexdigest()[:12]
    volumes = []
    for spec in args.volume:
        src, _, rest = spec.partition(":")
        dst, _, mode = rest.partition(":")
        if not src or not dst.startswith("/"):
            raise BoxError(f"bad volume {spec!r}", spec, "HOST:/CONTAINER[:ro]", "fix the -v argument")
        if not Path(src).exists():
            # A new volume: made and filled with the image's content at its path, as Docker fills a new named volume.
            init_volume(rootfs, dst, Path(src))
        volumes.append({"src": str(Path(src).resolve()), "dst": dst, "ro": mode == "ro"})
    named = {v["dst"].rstrip("/") for v in volumes}
    for dst in sorted(image_config.get("Volumes") or {}):
        if dst.rstrip("/") in named:
            continue
        anon = sd / "volumes" / dst.strip("/").replace("/", "_")
        if not anon.exists():
            init_volume(rootfs, dst, anon)
        volumes.append({"src": str(anon), "dst": dst, "ro": False})
    argv = list(args.args)
    entrypoint = [args.entrypoint] if args.entrypoint else list(image_config.get("Entrypoint") or [])
    cmd = argv if (argv or args.entrypoint) else list(image_config.get("Cmd") or [])
    env = container_env(image_config, args.env, hostname, home)
    (sd / "hostname").write_text(hostname + "\n")
    (sd / "hosts").write_text(
        f"127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n127.0.1.1\t{hostname}\n")
    resolv = Path("/etc/resolv.conf")
    (sd / "resolv.conf").write_text(resolv.read_text() if resolv.is_file() else "")
    config = {
        "name": args.name, "rootfs": str(rootfs), "image": manifest["image"]["id"], "hostname": hostname,
        "uid": uid, "gid": gid, "groups": groups, "workdir": image_config.get("WorkingDir") or "/",
        "argv": entrypoint + cmd, "env": env, "volumes": volumes, "devices": devices,
        "driver_libs": [str(p) for p in libs], "driver_bins": [str(p) for p in bins], "shm_bytes": args.shm_size,
        "healthcheck": image_config.get("Healthcheck"), "stop_signal": image_config.get("StopSignal") or "SIGTERM",
        "started_at": time.time(),
    }
    write_json(sd / "config.json", config)
    for stale in ("pid", "exit", "ready"):
        (sd / stale).unlink(missing_ok=True)
    unshare = ["unshare", "--mount", "--pid", "--uts", "--ipc", "--cgroup", "--fork", "--propagation", "private",
               "--kill-child=SIGKILL", sys.executable, str(HERE), "_init", args.name]
    log = open(sd / "log", "ab")  # noqa: SIM115 - the container's stdout and stderr for its life
    if args.detach:
        # A shim waits for the container and writes its exit code, as containerd's shim does for Docker.
        subprocess.Popen([sys.executable, str(HERE), "_shim", args.name, *unshare], stdin=subprocess.DEVNULL,
                         stdout=log, stderr=log, start_new_session=True)
        log.close()
        deadline = time.time() + 60
        while time.time() < deadline:
            if (sd / "ready").is_file():
                say(f"{args.name} started: pid {(sd / 'pid').read_text().strip()}")
                return 0
            if (sd / "exit").is_file():
                raise BoxError(f"{args.name} exited while starting", f"exit {(sd / 'exit').read_text().strip()}",
                               "a running container", f"read {sd / 'log'}")
            time.sleep(0.1)
        raise BoxError(f"{args.name} did not start within 60 s", f"see {sd / 'log'}", "a running container",
                       f"read {sd / 'log'}")
    log.close()
    return shim(args.name, unshare, foreground=True)


def shim(name: str, unshare: list[str], foreground: bool = False) -> int:
    sd = state_dir(name)
    # The container's stdout and stderr are one pipe, as Docker's are pipes: copied to the terminal (foreground) or to
    # the log the shim was started with (detached).
    proc = subprocess.Popen(unshare, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    (sd / "unshare.pid").write_text(f"{proc.pid}\n")
    assert proc.stdout is not None
    pipe = proc.stdout

    def copy() -> None:
        sink = sys.stdout.buffer
        while chunk := pipe.read1(65536):
            sink.write(chunk)
            sink.flush()

    copier = threading.Thread(target=copy, daemon=True)
    copier.start()

    def forward(sig: int, _frame: Any) -> None:
        pid = host_pid(name)
        with contextlib.suppress(ProcessLookupError, TypeError):
            os.kill(pid or proc.pid, sig)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, forward)
    # The container's PID 1 as the host sees it: unshare's one child.
    deadline = time.time() + 30
    while time.time() < deadline and proc.poll() is None:
        with contextlib.suppress(OSError):
            kids = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
            if kids:
                (sd / "pid").write_text(kids[0] + "\n")
                break
        time.sleep(0.02)
    rc = proc.wait()
    copier.join(10)
    code = 128 - rc if rc < 0 else rc
    write_json(sd / "exit.json", {"exit": code, "at": time.time()})
    (sd / "exit").write_text(f"{code}\n")
    return code


def mount(*args: str) -> None:
    r = subprocess.run(["mount", *args], capture_output=True, text=True)
    if r.returncode != 0:
        raise BoxError("a mount failed", f"mount {' '.join(args)}: {r.stderr.strip()}", "root with CAP_SYS_ADMIN",
                       "run as root on a host that allows mounts")


def bind_file(src: str, dst: Path, ro: bool = True) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    if dst.is_symlink():
        dst.unlink()
    if not dst.exists():
        dst.touch()
    mount("--bind", src, str(dst))
    if ro:
        mount("-o", "remount,bind,ro", str(dst))


def init(name: str) -> None:
    """PID 1 of the new namespaces, as root: lay the container's mounts, then become its entrypoint."""
    sd = state_dir(name)
    c = json.loads((sd / "config.json").read_text())
    rootfs, merged = Path(c["rootfs"]), sd / "merged"
    merged.mkdir(exist_ok=True)
    mode = f"overlay, writable layer in {sd / 'upper'}"
    try:
        mount("-t", "overlay", "overlay", "-o",
              f"lowerdir={rootfs},upperdir={sd / 'upper'},workdir={sd / 'work'}", str(merged))
    except BoxError:
        # An overlay upper on an overlay filesystem is refused (a host that is itself a container): the writable
        # layer then lives in the host's /dev/shm, where it outlives this container as it would on disk.
        layer = LAYER_FALLBACK / name
        (layer / "upper").mkdir(parents=True, exist_ok=True)
        (layer / "work").mkdir(parents=True, exist_ok=True)
        try:
            mount("-t", "overlay", "overlay", "-o",
                  f"lowerdir={rootfs},upperdir={layer / 'upper'},workdir={layer / 'work'}", str(merged))
            mode = f"overlay, writable layer in {layer / 'upper'} (the host refused one in {sd / 'upper'})"
        except BoxError as exc:
            # No overlay at all: the unpacked tree itself, written in place (a later container sees the changes).
            mount("--bind", str(rootfs), str(merged))
            mode = f"the unpacked tree itself, no writable layer (overlay refused: {exc.found})"
    m = merged
    mount("-t", "proc", "-o", "nosuid,nodev,noexec", "proc", str(m / "proc"))
    try:
        mount("-t", "sysfs", "-o", "ro,nosuid,nodev,noexec", "sysfs", str(m / "sys"))
    except BoxError:
        mount("--rbind", "/sys", str(m / "sys"))
        mount("-o", "remount,bind,ro", str(m / "sys"))
    with contextlib.suppress(BoxError):
        mount("-t", "cgroup2", "-o", "ro,nosuid,nodev,noexec", "cgroup", str(m / "sys/fs/cgroup"))
    mount("-t", "tmpfs", "-o", "nosuid,mode=755,size=65536k", "tmpfs", str(m / "dev"))
    for dev in ("null", "zero", "full", "random", "urandom", "tty"):
        bind_file(f"/dev/{dev}", m / "dev" / dev, ro=False)
    (m / "dev/pts").mkdir()
    with contextlib.suppress(BoxError):
        mount("-t", "devpts", "-o", "newinstance,ptmxmode=0666,mode=0620", "devpts", str(m / "dev/pts"))
        os.symlink("pts/ptmx", m / "dev/ptmx")
    (m / "dev/shm").mkdir()
    mount("-t", "tmpfs", "-o", f"nosuid,nodev,noexec,mode=1777,size={c['shm_bytes']}", "shm", str(m / "dev/shm"))
    for link, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1"),
                         ("stderr", "/proc/self/fd/2"), ("core", "/proc/kcore")):
        os.symlink(target, m / "dev" / link)
    for dev in c["devices"]:
        bind_file(dev, m / dev.lstrip("/"), ro=False)
    # The driver as the container toolkit gives it: each library file bound into the image's library folder, the
    # links beside it made anew, then ldconfig inside.
    for lib in map(Path, c["driver_libs"]):
        dst = m / CONTAINER_LIB_DIR.lstrip("/") / lib.name
        if lib.is_symlink():
            if dst.exists() or dst.is_symlink():
                dst.unlink()
            os.symlink(Path(os.readlink(lib)).name, dst)  # beside it in the container, wherever it was here
        else:
            bind_file(str(lib), dst)
    for b in c["driver_bins"]:
        bind_file(b, m / "usr/bin" / Path(b).name)
    for fname in ("hostname", "hosts", "resolv.conf"):
        bind_file(str(sd / fname), m / "etc" / fname, ro=False)
    for v in c["volumes"]:
        dst = m / v["dst"].lstrip("/")
        dst.mkdir(parents=True, exist_ok=True)
        mount("--bind", v["src"], str(dst))
        if v["ro"]:
            mount("-o", "remount,bind,ro", str(dst))
    if c["driver_libs"]:
        subprocess.run(["chroot", str(m), "/sbin/ldconfig"], check=False)
    import socket

    socket.sethostname(c["hostname"])
    c["rootfs_mode"] = mode
    write_json(sd / "mounted.json", {"rootfs_mode": mode, "merged": str(m)})
    (sd / "ready").write_text(f"{time.time()}\n")
    enter(c, c["argv"], c["uid"], c["gid"], c["groups"], c["env"])


def fix_stdio(uid: int, gid: int) -> None:
    """What runc does before it drops to the container's user (fixStdioPermissions): stdin, stdout and stderr that
    are not a device are given to that user, so it may open /dev/stdout (supervisord logs there)."""
    for fd in (0, 1, 2):
        with contextlib.suppress(OSError):
            st = os.fstat(fd)
            if not stat.S_ISCHR(st.st_mode) and st.st_uid != uid:
                os.fchown(fd, uid, gid)


def enter(c: dict[str, Any], argv: list[str], uid: int, gid: int, groups: list[int], env: dict[str, str]) -> None:
    """chroot into the container, take its user and working directory, exec argv (looked up on the env's PATH)."""
    merged = state_dir(c["name"]) / "merged"
    os.chroot(merged)
    os.chdir("/")
    with contextlib.suppress(OSError):
        os.chdir(c["workdir"])
    fix_stdio(uid, gid)
    os.setgroups(groups)
    os.setgid(gid)
    os.setuid(uid)
    if not argv:
        raise BoxError("nothing to run", "no entrypoint and no command", "an ENTRYPOINT or CMD", "pass a command")
    prog = argv[0] if "/" in argv[0] else shutil.which(argv[0], path=env.get("PATH", ""))
    if not prog:
        print(f"imagebox: exec: {argv[0]!r}: executable file not found in $PATH", file=sys.stderr, flush=True)
        os._exit(127)
    os.execve(prog, argv, env)


def exec_in(name: str, argv: list[str], user: str | None, extra_env: list[str], timeout: float | None,
            capture: bool = False) -> subprocess.CompletedProcess[bytes]:
    """`docker exec`: a process in the container's namespaces and root, as its user, with its environment."""
    pid = host_pid(name)
    if pid is None:
        raise BoxError(f"container {name} is not running", f"no live pid in {state_dir(name)}", "a running container",
                       f"imagebox.py run {name} ...")
    need_tool("nsenter")
    spec = {"argv": argv, "env": extra_env, "user": user}
    cmd = ["nsenter", "-t", str(pid), "-m", "-p", "-u", "-i", "--", sys.executable, str(HERE), "_enter", name,
           json.dumps(spec)]
    return subprocess.run(cmd, capture_output=capture, timeout=timeout)


def enter_from_exec(name: str, spec_text: str) -> None:
    spec = json.loads(spec_text)
    c = json.loads((state_dir(name) / "config.json").read_text())
    env = dict(c["env"])
    for item in spec["env"]:
        k, _, v = item.partition("=")
        env[k] = v
    if spec["user"] is not None:
        uid, gid, groups, _home = parse_user(state_dir(name) / "merged", spec["user"])
    else:
        uid, gid, groups = c["uid"], c["gid"], c["groups"]
    enter(c, spec["argv"], uid, gid, groups, env)


def health(name: str) -> tuple[int, str]:
    """The image's HEALTHCHECK, as Docker runs it: CMD argv or CMD-SHELL via /bin/sh -c, bounded by its Timeout."""
    c = load_config(name)
    hc = c.get("healthcheck") or {}
    test = list(hc.get("Test") or [])
    if not test or test[0] == "NONE":
        raise BoxError("the image has no HEALTHCHECK", json.dumps(hc), "a HEALTHCHECK in the image", "")
    argv = test[1:] if test[0] == "CMD" else ["/bin/sh", "-c", test[1]]
    timeout = (hc.get("Timeout") or 30 * 10**9) / 1e9
    try:
        r = exec_in(name, argv, None, [], timeout=timeout, capture=True)
    except subprocess.TimeoutExpired:
        return -1, f"Health check exceeded timeout ({timeout:g}s)"
    return r.returncode, (r.stdout + r.stderr).decode(errors="replace")


def stop(name: str, grace: float) -> int | None:
    """`docker stop`: the image's stop signal (SIGTERM) to PID 1, SIGKILL after `grace` seconds; the exit code."""
    sd = state_dir(name)
    pid = host_pid(name)
    if pid is not None:
        c = load_config(name)
        sig = getattr(signal, str(c.get("stop_signal") or "SIGTERM"), signal.SIGTERM)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
        deadline = time.time() + grace
        while time.time() < deadline and not (sd / "exit").is_file():
            time.sleep(0.1)
        if not (sd / "exit").is_file():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    deadline = time.time() + 30
    while time.time() < deadline and not (sd / "exit").is_file():
        time.sleep(0.1)
    try:
        return int((sd / "exit").read_text())
    except (OSError, ValueError):
        return None


def main(argv: list[str]) -> int:
    if argv[:1] == ["_init"]:
        init(argv[1])
        return 0
    if argv[:1] == ["_shim"]:
        return shim(argv[1], argv[2:])
    if argv[:1] == ["_enter"]:
        enter_from_exec(argv[1], argv[2])
        return 0
    # What follows the first "--" is the container's: arguments to its entrypoint (run) or the command (exec).
    rest: list[str] = []
    if "--" in argv:
        at = argv.index("--")
        argv, rest = argv[:at], argv[at + 1:]
    p = argparse.ArgumentParser(prog="imagebox.py", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    mk = sub.add_parser("make")
    mk.add_argument("image")
    mk.add_argument("outdir")
    mk.add_argument("--part-mib", type=int, default=50)
    mk.add_argument("--level", type=int, default=6)
    mk.add_argument("--docker", default=os.environ.get("DOCKER", "/usr/bin/docker"))
    rc = sub.add_parser("receive")
    rc.add_argument("inbox")
    rc.add_argument("parts")
    ck = sub.add_parser("check")
    ck.add_argument("parts")
    asm = sub.add_parser("assemble")
    asm.add_argument("parts")
    asm.add_argument("rootfs")
    r = sub.add_parser("run")
    r.add_argument("name")
    r.add_argument("--rootfs", required=True)
    r.add_argument("-e", "--env", action="append", default=[])
    r.add_argument("-v", "--volume", action="append", default=[])
    r.add_argument("--shm-size", type=lambda s: int(float(s.rstrip("gG")) * GIB) if s[-1] in "gG" else int(s),
                   default=2 * GIB)
    r.add_argument("--no-gpu", action="store_true")
    r.add_argument("--user")
    r.add_argument("--entrypoint")
    r.add_argument("--detach", "-d", action="store_true")
    ex = sub.add_parser("exec")
    ex.add_argument("name")
    ex.add_argument("--user")
    ex.add_argument("-e", "--env", action="append", default=[])
    hc = sub.add_parser("health")
    hc.add_argument("name")
    st = sub.add_parser("stop")
    st.add_argument("name")
    st.add_argument("--time", type=float, default=10.0)
    ins = sub.add_parser("inspect")
    ins.add_argument("name")
    a = p.parse_args(argv)
    a.args = a.argv = rest
    try:
        if a.cmd == "make":
            m = make(a.image, Path(a.outdir), a.part_mib, a.level, a.docker)
            say(f"{len(m['parts'])} parts, {m['stream']['bytes'] / GIB:.2f} GiB ({m['compression']}) of image "
                f"{m['image']['id']} (revision {m['image']['labels'].get('org.opencontainers.image.revision')}) "
                f"in {m['made_seconds']} s")
        elif a.cmd == "receive":
            s = receive(Path(a.inbox), Path(a.parts))
            say(f"have {s['have']} of {s['of']} parts" + (f"; next {s['next']}" if s["next"] else "; complete"))
        elif a.cmd == "check":
            m = check(Path(a.parts))
            say(f"all {len(m['parts'])} parts present and whole: image {m['image']['id']}")
        elif a.cmd == "assemble":
            say(json.dumps(assemble(Path(a.parts), Path(a.rootfs))))
        elif a.cmd == "run":
            return run(a)
        elif a.cmd == "exec":
            return exec_in(a.name, a.argv, a.user, a.env, timeout=None).returncode
        elif a.cmd == "health":
            code, out = health(a.name)
            sys.stdout.write(out)
            return code
        elif a.cmd == "stop":
            code = stop(a.name, a.time)
            say(f"{a.name} exited {code}")
        elif a.cmd == "inspect":
            sd = state_dir(a.name)
            info = {"pid": host_pid(a.name), "exit": (sd / "exit").read_text().strip() if (sd / "exit").is_file()
                    else None}
            with contextlib.suppress(OSError, ValueError):
                info.update(json.loads((sd / "mounted.json").read_text()))
            say(json.dumps(info))
    except BoxError as exc:
        print(exc.render(), file=sys.stderr, flush=True)
        return exc.code
    except OSError as exc:
        # The disk or a folder, not a part: a full disk, a folder that cannot be written.
        print(BoxError(f"{a.cmd} failed on the file system", f"{exc.filename or ''}: {exc.strerror or exc}",
                       "a writable folder with room", "free the disk or fix the folder's permissions, then run this "
                       "again").render(), file=sys.stderr, flush=True)
        return REFUSED
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except BoxError as exc:  # from _init/_enter, inside the namespaces
        print(exc.render(), file=sys.stderr, flush=True)
        sys.exit(exc.code)
    except KeyboardInterrupt:
        sys.exit(130)
