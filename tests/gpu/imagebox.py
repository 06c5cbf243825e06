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


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(4 * MIB):
            h.update(chunk)
    return h.hexdigest()


def write_json(path: Path, data: Any) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    tmp.replace(path)


def read_json(path: Path, what: str) -> Any:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise BoxError(f"{what} is missing", str(path), f"the file {path.name}",
                       "copy it with the first part (imagebox.py make wrote it beside the parts)") from None
    except (OSError, ValueError) as exc:
        raise BoxError(f"{what} cannot be read", f"{path}: {exc}", "the JSON imagebox.py make wrote",
                       "copy it again from the make folder") from None


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


def part_index(name: str) -> int:
    return int(name[len(PART_PREFIX):])


def receive(inbox: Path, parts_dir: Path) -> dict[str, Any]:
    """Move what arrived in inbox (the manifest, parts) into parts_dir, each part checked against the manifest.
    The parts in parts_dir must always be 000 ... k-1 with none missing."""
    parts_dir.mkdir(parents=True, exist_ok=True)
    if (inbox / MANIFEST).is_file():
        shutil.copyfile(inbox / MANIFEST, parts_dir / MANIFEST)
    if not (parts_dir / MANIFEST).is_file():
        arrived = sorted(p.name for p in inbox.glob(PART_PREFIX + "*"))
        raise BoxError("fresh machine: the manifest (sent with part 000) is not here",
                       f"{parts_dir} has no {MANIFEST}; arrived now: {', '.join(arrived) or 'nothing'}",
                       "every part from 000 on, on one machine",
                       "the device gave the machine back between calls: send part 000 and the manifest again",
                       code=3)
    manifest = read_json(parts_dir / MANIFEST, "the manifest")
    for wheel in inbox.glob("*.whl"):  # helpers (the zstandard wheel, for a host without the zstd program)
        shutil.move(str(wheel), parts_dir / wheel.name)
    expected = {p["name"]: p for p in manifest["parts"]}
    for path in sorted(inbox.glob(PART_PREFIX + "*")):
        entry = expected.get(path.name)
        if entry is None:
            raise BoxError(f"{path.name} is not in the manifest", f"{len(expected)} parts listed",
                           "parts made with this manifest", "make the parts and the manifest again, together")
        digest = sha256_file(path)
        if digest != entry["sha256"] or path.stat().st_size != entry["bytes"]:
            raise BoxError(f"{path.name} arrived damaged", f"{path.stat().st_size} B, sha256 {digest}",
                           f"{entry['bytes']} B, sha256 {entry['sha256']}", f"send {path.name} again")
        tmp = parts_dir / (path.name + ".partial")
        shutil.copyfile(path, tmp)
        tmp.replace(parts_dir / path.name)
        path.unlink()  # moved: a later call that finds it still in the inbox does not check it twice
        (parts_dir / (path.name + ".ok")).write_text(f"{entry['bytes']} {entry['sha256']}\n")
    have = sorted(part_index(p.name) for p in parts_dir.glob(PART_PREFIX + "*") if not p.name.endswith((".ok",
                                                                                                      ".partial")))
    missing = [i for i in range(max(have) + 1 if have else 0) if i not in have]
    if missing:
        names = ", ".join(f"{PART_PREFIX}{i:03d}" for i in missing[:8]) + (" ..." if len(missing) > 8 else "")
        code = 3 if 0 in missing else 2
        raise BoxError("a part is missing before the last one that arrived (out of order, or a fresh machine)",
                       f"have {len(have)} of {len(expected)}; missing {names}", "parts 000 ... in order",
                       "send the missing parts" + (" (part 000 missing: a fresh machine; start over)" if code == 3
                                                   else ""), code=code)
    status = {"have": len(have), "of": len(expected), "next": f"{PART_PREFIX}{len(have):03d}"
              if len(have) < len(expected) else None, "image": manifest["image"]["id"]}
    return status


def check(parts_dir: Path) -> dict[str, Any]:
    """Every part present and whole (checked on arrival by receive, else here); the manifest."""
    manifest = read_json(parts_dir / MANIFEST, "the manifest")
    if manifest.get("format") != FORMAT:
        raise BoxError("the manifest is of another format", f"format {manifest.get('format')}", f"format {FORMAT}",
                       "make the parts with this imagebox.py")
    for entry in manifest["parts"]:
        path = parts_dir / entry["name"]
        if not path.is_file():
            raise BoxError(f"{entry['name']} is missing", f"{len(list(parts_dir.glob(PART_PREFIX + '*')))} part "
                           f"files in {parts_dir}", f"all {len(manifest['parts'])} parts", f"send {entry['name']}")
        ok = parts_dir / (entry["name"] + ".ok")
        mark = f"{entry['bytes']} {entry['sha256']}\n"
        if path.stat().st_size == entry["bytes"] and ok.is_file() and ok.read_text() == mark:
            continue
        digest = sha256_file(path)
        if digest != entry["sha256"] or path.stat().st_size != entry["bytes"]:
            raise BoxError(f"{entry['name']} is damaged", f"{path.stat().st_size} B, sha256 {digest}",
                           f"{entry['bytes']} B, sha256 {entry['sha256']}", f"send {entry['name']} again")
        ok.write_text(mark)
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
    manifest = check(parts_dir)
    done = rootfs / ".imagebox-image"
    if done.is_file() and done.read_text().strip() == manifest["image"]["id"]:
        return {"rootfs": str(rootfs), "image": manifest["image"]["id"], "unpacked_seconds": 0.0, "reused": True}
    need = int(manifest["image"].get("size_bytes") or 0) * 11 // 10 + GIB
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
    try:
        for entry in manifest["parts"]:
            with open(parts_dir / entry["name"], "rb") as f:
                while chunk := f.read(4 * MIB):
                    whole.update(chunk)
                    dec.stdin.write(chunk)
        dec.stdin.close()
    except BrokenPipeError:
        pass
    rc_dec, rc_tar = dec.wait(), tar.wait()
    if rc_dec or rc_tar:
        shutil.rmtree(partial, ignore_errors=True)
        raise BoxError("unpacking failed", f"decompressor exit {rc_dec}, tar exit {rc_tar}", "both exit 0",
                       "check the disk (df) and run assemble again")
    if whole.hexdigest() != manifest["stream"]["sha256"]:
        shutil.rmtree(partial, ignore_errors=True)
        raise BoxError("the parts together are not the stream that was made", whole.hexdigest(),
                       manifest["stream"]["sha256"], "make and send the parts again")
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
    manifest = read_json(rootfs / ".imagebox-manifest.json", "the unpacked image's manifest")
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
    import stat

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
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except BoxError as exc:  # from _init/_enter, inside the namespaces
        print(exc.render(), file=sys.stderr, flush=True)
        sys.exit(exc.code)
    except KeyboardInterrupt:
        sys.exit(130)
