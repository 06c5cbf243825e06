"""The host probe: RAM and swap, the container's cgroup limits, /dev/shm, free disk per write path, CPUs, busy ports.

Every input is explicit (the /proc and /sys roots, the paths, the ports) so tests can point the probe at sample files.
It records what it finds and how it found it, and what it could not read and why (an unreadable /proc/meminfo, a
folder statvfs refuses): what is enough, and whether an unreadable figure stops the start, is the preflight's question.
"""

from __future__ import annotations

import errno
import ipaddress
import math
import os
import socket
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from t4serve.facts import ADDRESS_IN_USE, DiskFacts, HostFacts

# cgroup v1 has no "max": an unlimited memory.limit_in_bytes reads as LONG_MAX rounded down to the page size
# (9223372036854771712 with 4 KiB pages). Anything this large is no limit on any real machine.
V1_UNLIMITED_THRESHOLD = 2**62
MEMINFO_KEYS = ("MemTotal", "MemAvailable", "SwapTotal", "SwapFree")


@dataclass(frozen=True)
class Mount:
    """One line of /proc/self/mountinfo (proc(5)): the fields the probes use."""

    device: tuple[int, int]
    # The path inside the mounted filesystem that appears at mount_point (not "/" for bind mounts and cgroup views).
    root: str
    mount_point: str
    fs_type: str
    super_options: tuple[str, ...]


@dataclass(frozen=True)
class CgroupLimits:
    # The cgroup version of the memory controller (None: no memory controller found).
    version: int | None = None
    memory_limit_bytes: int | None = None
    memory_limit_file: str | None = None
    # Swap alone: v2 memory.swap.max; on v1, memory.memsw.limit_in_bytes (memory + swap) minus the memory limit.
    swap_limit_bytes: int | None = None
    # CPU quota as (quota, period) microseconds, the tightest on the path up, and the file it came from.
    cpu_quota: tuple[int, int] | None = None
    cpu_quota_file: str | None = None
    notes: list[str] = field(default_factory=list)


def probe_host(
    *,
    disk_paths: Mapping[str, str],
    ports: Iterable[tuple[str, int]],
    proc_root: str = "/proc",
    sys_root: str = "/sys",
    shm_path: str = "/dev/shm",
    affinity: Collection[int] | None = None,
) -> HostFacts:
    """Everything about the host that planning and preflight use. `affinity=None` reads this process's CPU mask."""
    meminfo, meminfo_unreadable = read_meminfo(proc_root)
    notes: list[str] = []
    mounts = read_mountinfo(proc_root, notes)
    limits = probe_cgroup(proc_root, sys_root, mounts)
    cpus = list(os.sched_getaffinity(0)) if affinity is None else list(affinity)
    cpu_count, cpu_how = count_cpus(len(cpus), limits)
    shm_total, shm_free = probe_shm(shm_path)
    ports_in_use, port_errors = probe_ports(ports)
    return HostFacts(
        cpu_count=cpu_count,
        mem_total_bytes=meminfo.get("MemTotal"),
        mem_available_bytes=meminfo.get("MemAvailable"),
        swap_total_bytes=meminfo.get("SwapTotal"),
        swap_free_bytes=meminfo.get("SwapFree"),
        cgroup_version=limits.version,
        cgroup_memory_limit_bytes=limits.memory_limit_bytes,
        cgroup_swap_limit_bytes=limits.swap_limit_bytes,
        shm_total_bytes=shm_total,
        shm_free_bytes=shm_free,
        disks=[probe_disk(role, path, mounts) for role, path in disk_paths.items()],
        ports_in_use=ports_in_use,
        cpu_count_how=cpu_how,
        cgroup_memory_limit_file=limits.memory_limit_file,
        port_bind_errors=port_errors,
        probe_notes=notes + limits.notes,
        meminfo_unreadable=meminfo_unreadable,
    )


# --- memory -----------------------------------------------------------------------------------------------------


def parse_meminfo(text: str) -> dict[str, int]:
    """/proc/meminfo as bytes per key ("MemTotal:  8178892 kB" -> 8375185408)."""
    values: dict[str, int] = {}
    for line in text.splitlines():
        key, sep, rest = line.partition(":")
        parts = rest.split()
        if not sep or not parts or not parts[0].isdigit():
            continue
        unit = parts[1] if len(parts) > 1 else ""
        values[key.strip()] = int(parts[0]) * (1024 if unit == "kB" else 1)
    return values


def read_meminfo(proc_root: str) -> tuple[dict[str, int], str | None]:
    """The figures of /proc/meminfo in bytes, and why any of MEMINFO_KEYS is not among them (None: all there)."""
    path = os.path.join(proc_root, "meminfo")
    try:
        values = parse_meminfo(Path(path).read_text())
    except OSError as exc:
        return {}, f"{path}: {exc.strerror or exc}"
    missing = [key for key in MEMINFO_KEYS if key not in values]
    return values, f"{path} has no {', '.join(missing)}" if missing else None


# --- mounts and cgroups -----------------------------------------------------------------------------------------


def _unescape(field_text: str) -> str:
    # mountinfo escapes space, tab, newline and backslash as \ooo octal.
    out, i = [], 0
    while i < len(field_text):
        chunk = field_text[i : i + 4]
        if len(chunk) == 4 and chunk[0] == "\\" and chunk[1:].isdigit():
            out.append(chr(int(chunk[1:], 8)))
            i += 4
        else:
            out.append(field_text[i])
            i += 1
    return "".join(out)


def parse_mountinfo(text: str) -> list[Mount]:
    """proc(5): `id parent major:minor root mount-point options [optional...] - fstype source super-options`."""
    mounts = []
    for line in text.splitlines():
        left, sep, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if not sep or len(fields) < 5 or not tail:
            continue
        major, _, minor = fields[2].partition(":")
        if not (major.isdigit() and minor.isdigit()):
            continue
        mounts.append(
            Mount(
                device=(int(major), int(minor)),
                root=_unescape(fields[3]),
                mount_point=_unescape(fields[4]),
                fs_type=tail[0],
                super_options=tuple(tail[2].split(",")) if len(tail) > 2 else (),
            )
        )
    return mounts


def read_mountinfo(proc_root: str, notes: list[str]) -> list[Mount]:
    path = os.path.join(proc_root, "self", "mountinfo")
    try:
        return parse_mountinfo(Path(path).read_text())
    except OSError as exc:
        # Without mountinfo only the filesystem types and cgroup limits are unknown; sizes still come from statvfs.
        notes.append(f"{path} unreadable ({exc.strerror or exc}): filesystem types and cgroup limits unknown")
        return []


def parse_proc_cgroup(text: str) -> list[tuple[str, tuple[str, ...], str]]:
    """/proc/self/cgroup lines `hierarchy-id:controllers:path` -> (id, controllers, path); v2 is `0::path`."""
    entries = []
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3:
            hierarchy, controllers, path = parts
            entries.append((hierarchy, tuple(c for c in controllers.split(",") if c), path))
    return entries


def _under_sys_root(path: str, sys_root: str) -> str:
    # Cgroup filesystems are mounted under /sys/fs/cgroup; tests replace /sys with a sample tree.
    if path == "/sys" or path.startswith("/sys/"):
        return sys_root.rstrip("/") + path[len("/sys") :]
    return path


def _cgroup_dirs(mount: Mount, cgroup_path: str, sys_root: str) -> list[str]:
    """The process's cgroup folder and each parent up to the mount's own root, innermost first.

    Limits are hierarchical: a parent's memory.max caps its children, so the tightest on the path is the one in force.
    """
    top = _under_sys_root(mount.mount_point, sys_root).rstrip("/") or "/"
    root = mount.root.rstrip("/")
    if cgroup_path == mount.root or cgroup_path.startswith(root + "/"):
        relative = cgroup_path[len(root) :].strip("/")
    else:
        # A cgroup namespace shows the container its own cgroup as the mount's root: the path is not under it.
        relative = ""
    parts = [p for p in relative.split("/") if p]
    if ".." in parts:
        # A process outside the namespace's root cgroup sees "/../.."; its own folder is not in this view.
        parts = []
    return [os.path.join(top, *parts[:depth]) for depth in range(len(parts), -1, -1)]


def _read_first_line(path: str) -> str | None:
    try:
        with open(path) as handle:
            return handle.readline().strip()
    except OSError:
        return None


def _limit(value: str, version: int) -> int | None:
    """A memory limit in bytes; None for unlimited ("max" on v2, a value near LONG_MAX on v1)."""
    if version == 2 and value == "max":
        return None
    number = int(value)
    if version == 1 and (number < 0 or number >= V1_UNLIMITED_THRESHOLD):
        return None
    return number


def _tightest(dirs: list[str], name: str, version: int, notes: list[str]) -> tuple[int | None, str | None]:
    best: tuple[int | None, str | None] = (None, None)
    for folder in dirs:
        path = os.path.join(folder, name)
        raw = _read_first_line(path)
        if raw is None:
            continue
        try:
            value = _limit(raw, version)
        except ValueError:
            notes.append(f"{path}: unreadable value {raw!r}")
            continue
        if value is not None and (best[0] is None or value < best[0]):
            best = (value, path)
    return best


def _tightest_cpu(dirs: list[str], version: int, notes: list[str]) -> tuple[tuple[int, int] | None, str | None]:
    best: tuple[tuple[int, int] | None, str | None] = (None, None)
    for folder in dirs:
        quota: tuple[int, int] | None = None
        if version == 2:
            path = os.path.join(folder, "cpu.max")
            raw = _read_first_line(path)
            if raw is None:
                continue
            parts = raw.split()
            if len(parts) == 2 and parts[0] != "max" and parts[0].isdigit() and parts[1].isdigit():
                quota = (int(parts[0]), int(parts[1]))
            elif not (len(parts) >= 1 and parts[0] == "max"):
                notes.append(f"{path}: unreadable value {raw!r}")
        else:
            path = os.path.join(folder, "cpu.cfs_quota_us")
            raw, period = _read_first_line(path), _read_first_line(os.path.join(folder, "cpu.cfs_period_us"))
            if raw is None or period is None:
                continue
            try:
                if int(raw) > 0 and int(period) > 0:  # -1 means no quota
                    quota = (int(raw), int(period))
            except ValueError:
                notes.append(f"{path}: unreadable value {raw!r}")
        if quota is not None and quota[1] > 0 and (best[0] is None or quota[0] / quota[1] < best[0][0] / best[0][1]):
            best = (quota, path)
    return best


def probe_cgroup(proc_root: str, sys_root: str, mounts: list[Mount]) -> CgroupLimits:
    """The memory, swap and CPU limits of this process's cgroup (v1, v2 or a hybrid of both)."""
    text = _read_text(os.path.join(proc_root, "self", "cgroup"))
    if text is None:
        return CgroupLimits(notes=[f"{proc_root}/self/cgroup unreadable: cgroup limits unknown"])
    entries = parse_proc_cgroup(text)
    notes: list[str] = []

    def locate(controller: str) -> tuple[int, list[str]] | None:
        # A controller bound to a v1 hierarchy wins over the v2 tree (on hybrid hosts v2 then holds no controllers).
        for _hierarchy, controllers, path in entries:
            if controller in controllers:
                for mount in mounts:
                    if mount.fs_type == "cgroup" and controller in mount.super_options:
                        return 1, _cgroup_dirs(mount, path, sys_root)
                notes.append(f"the cgroup v1 {controller} controller is not mounted: its limits are unknown")
                return None
        for hierarchy, controllers, path in entries:
            if hierarchy == "0" and not controllers:
                for mount in mounts:
                    if mount.fs_type == "cgroup2":
                        dirs = _cgroup_dirs(mount, path, sys_root)
                        enabled = _read_first_line(os.path.join(dirs[-1], "cgroup.controllers"))
                        if enabled is not None and controller not in enabled.split():
                            return None
                        return 2, dirs
        return None

    memory = locate("memory")
    version: int | None = None
    memory_limit: tuple[int | None, str | None] = (None, None)
    swap_limit: int | None = None
    if memory is not None:
        version, dirs = memory
        if version == 2:
            memory_limit = _tightest(dirs, "memory.max", 2, notes)
            swap_limit = _tightest(dirs, "memory.swap.max", 2, notes)[0]
        else:
            memory_limit = _tightest(dirs, "memory.limit_in_bytes", 1, notes)
            memsw = _tightest(dirs, "memory.memsw.limit_in_bytes", 1, notes)[0]
            if memsw is not None:
                swap_limit = memsw if memory_limit[0] is None else memsw - memory_limit[0]
    cpu = locate("cpu")
    cpu_quota: tuple[tuple[int, int] | None, str | None] = (None, None)
    if cpu is not None:
        cpu_quota = _tightest_cpu(cpu[1], cpu[0], notes)
    return CgroupLimits(
        version=version,
        memory_limit_bytes=memory_limit[0],
        memory_limit_file=memory_limit[1],
        swap_limit_bytes=swap_limit,
        cpu_quota=cpu_quota[0],
        cpu_quota_file=cpu_quota[1],
        notes=notes,
    )


def _read_text(path: str) -> str | None:
    try:
        return Path(path).read_text()
    except OSError:
        return None


def count_cpus(affinity_count: int, limits: CgroupLimits) -> tuple[int, str]:
    """CPUs this process may use: its affinity mask, capped by the cgroup CPU quota rounded up; with the arithmetic."""
    how = f"{affinity_count} CPUs in the affinity mask"
    if limits.cpu_quota is None:
        return max(1, affinity_count), how
    quota, period = limits.cpu_quota
    by_quota = max(1, math.ceil(quota / period))
    count = max(1, min(affinity_count, by_quota))
    return count, f"min({how}, {limits.cpu_quota_file} {quota}/{period} = {quota / period:g} -> {by_quota}) = {count}"


# --- /dev/shm, disks, ports -------------------------------------------------------------------------------------


def probe_shm(path: str) -> tuple[int | None, int | None]:
    """Size and free bytes of the shared-memory filesystem; (None, None) when it is absent."""
    try:
        stat = os.statvfs(path)
    except OSError:
        return None, None
    return stat.f_blocks * stat.f_frsize, stat.f_bavail * stat.f_frsize


def nearest_existing_folder(path: str) -> str:
    """`path` or its closest existing parent folder: where a write to `path` would land once the folders exist."""
    current = Path(os.path.abspath(path))
    while not current.is_dir() and current != current.parent:
        current = current.parent
    return str(current)


def _blocked(path: str, folder: str) -> bool:
    """Something that is not a folder sits on the way from `folder` (the nearest existing one) down to `path`."""
    relative = os.path.relpath(os.path.abspath(path), folder)
    if relative == ".":
        return False
    return os.path.lexists(os.path.join(folder, relative.split(os.sep, 1)[0]))


def filesystem_type(folder: str, device: int, mounts: list[Mount]) -> str | None:
    """The mount holding `folder`: the deepest mount point above it, preferring mounts of the same device."""
    real = os.path.realpath(folder)

    def contains(mount: Mount) -> bool:
        point = mount.mount_point.rstrip("/")
        return real == point or real.startswith(point + "/")

    dev = (os.major(device), os.minor(device))
    candidates = [m for m in mounts if contains(m) and m.device == dev] or [m for m in mounts if contains(m)]
    if not candidates:
        return None
    return max(candidates, key=lambda m: len(m.mount_point)).fs_type


def probe_disk(role: str, path: str, mounts: list[Mount]) -> DiskFacts:
    """Free space where `role`'s writes land: measured on the filesystem of the nearest existing folder."""
    folder = nearest_existing_folder(path)
    try:
        stat = os.statvfs(folder)
        device = os.stat(folder).st_dev
    except OSError as exc:
        # Recorded, not raised: preflight turns it into a failed disk finding with the fix.
        return DiskFacts(
            role=role,
            path=path,
            measured_at=folder,
            free_bytes=None,
            total_bytes=None,
            writable=False,
            filesystem_id=None,
            unreadable=f"{path} (measured at {folder}): {exc.strerror or exc}",
        )
    return DiskFacts(
        role=role,
        path=path,
        measured_at=folder,
        # f_bavail, not f_bfree: the blocks reserved for root are not there for the non-root server.
        free_bytes=stat.f_bavail * stat.f_frsize,
        total_bytes=stat.f_blocks * stat.f_frsize,
        # A file (or a dangling link) where a folder of `path` must go blocks the write however free the disk is.
        writable=os.access(folder, os.W_OK) and not _blocked(path, folder),
        filesystem_id=device,
        fs_type=filesystem_type(folder, device, mounts),
    )


def probe_ports(ports: Iterable[tuple[str, int]]) -> tuple[list[int], dict[str, str]]:
    """Ports that cannot be bound on their host, and why. Binds exactly as vLLM's `create_server_socket` does
    (address family from the host, SO_REUSEADDR on): a port only in TIME_WAIT after a restart is free to vLLM,
    so it must not be reported busy, while any listener on an overlapping address still is."""
    in_use: list[int] = []
    errors: dict[str, str] = {}
    for host, port in ports:
        try:
            family = socket.AF_INET6 if ipaddress.ip_address(host).version == 6 else socket.AF_INET
        except ValueError:
            family = socket.AF_INET  # a host name, resolved by bind() the way vLLM's socket resolves it
        try:
            with socket.socket(family, socket.SOCK_STREAM) as sock:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                sock.bind((host, port))
        except OSError as exc:
            reason = ADDRESS_IN_USE if exc.errno == errno.EADDRINUSE else str(exc)
            errors[f"{host}:{port}"] = reason
            if port not in in_use:
                in_use.append(port)
    return in_use, errors
