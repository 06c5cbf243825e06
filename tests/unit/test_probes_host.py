"""t4serve.probes.host on sample /proc and /sys trees (tests/unit/data/probes: cgroup v1, v2, nested, hybrid) and, for
disks, /dev/shm and ports, on this machine's real filesystems and sockets."""

from __future__ import annotations

import errno
import os
import socket
from dataclasses import replace
from pathlib import Path

import pytest
from sample_facts import no_gpu

from t4serve.config.settings import Settings
from t4serve.errors import PreflightError
from t4serve.preflight import check_disks, check_host_memory, has_failures
from t4serve.probes.host import (
    CgroupLimits,
    Mount,
    count_cpus,
    filesystem_type,
    nearest_existing_folder,
    parse_meminfo,
    parse_mountinfo,
    parse_proc_cgroup,
    probe_cgroup,
    probe_disk,
    probe_host,
    probe_ports,
    probe_shm,
    read_meminfo,
    read_mountinfo,
)
from t4serve.units import GIB

DATA = Path(__file__).parent / "data" / "probes"


def scenario(name: str) -> tuple[str, str]:
    return str(DATA / name / "proc"), str(DATA / name / "sys")


def cgroup_of(name: str) -> CgroupLimits:
    proc, sys_root = scenario(name)
    return probe_cgroup(proc, sys_root, read_mountinfo(proc, []))


# --- meminfo ------------------------------------------------------------------------------------------------------


def test_meminfo_is_read_in_bytes() -> None:
    values, unreadable = read_meminfo(scenario("cgroup-v2-container")[0])
    assert unreadable is None
    assert values["MemTotal"] == 8178892 * 1024
    assert values["MemAvailable"] == 7654604 * 1024
    assert values["SwapTotal"] == 16777212 * 1024
    assert values["SwapFree"] == 16700000 * 1024
    assert values["HugePages_Total"] == 0  # unit-less counts stay counts


def test_meminfo_missing_is_recorded_naming_the_file_and_preflight_fails_on_it(tmp_path: Path) -> None:
    values, unreadable = read_meminfo(str(tmp_path))
    assert values == {} and unreadable is not None and str(tmp_path / "meminfo") in unreadable
    host = probe_host(disk_paths={}, ports=[], proc_root=str(tmp_path), affinity=[0])
    assert host.mem_total_bytes is None and host.swap_free_bytes is None
    assert host.meminfo_unreadable == unreadable
    finding = check_host_memory(replace(no_gpu(), host=host), Settings.from_environ({}))
    assert finding.level == "fail" and str(tmp_path / "meminfo") in finding.found
    assert "/proc/meminfo" in finding.required and "MemAvailable" in finding.required and finding.fix
    # A failed finding is what makes `preflight` and `serve` exit 3.
    assert has_failures([finding]) and PreflightError.exit_code == 3


def test_meminfo_without_memavailable_names_what_is_missing(tmp_path: Path) -> None:
    (tmp_path / "meminfo").write_text("MemTotal: 1000 kB\nSwapTotal: 0 kB\nSwapFree: 0 kB\n")
    values, unreadable = read_meminfo(str(tmp_path))
    assert unreadable is not None and unreadable.endswith("has no MemAvailable")
    assert values["MemTotal"] == 1000 * 1024
    host = probe_host(disk_paths={}, ports=[], proc_root=str(tmp_path), affinity=[0])
    assert host.mem_total_bytes == 1000 * 1024 and host.mem_available_bytes is None
    assert host.meminfo_unreadable is not None and host.meminfo_unreadable.endswith("has no MemAvailable")


def test_parse_meminfo_skips_lines_that_are_not_figures() -> None:
    assert parse_meminfo("garbage\nMemTotal:\nSwapFree:  12 kB\nX: abc kB\n") == {"SwapFree": 12 * 1024}


# --- mountinfo and /proc/self/cgroup ------------------------------------------------------------------------------


def test_mountinfo_fields_and_octal_escapes() -> None:
    mounts = read_mountinfo(scenario("cgroup-v2-container")[0], [])
    by_point = {m.mount_point: m for m in mounts}
    assert by_point["/"].fs_type == "overlay"
    assert by_point["/sys/fs/cgroup"] == Mount(
        (0, 30), "/", "/sys/fs/cgroup", "cgroup2", ("rw", "nsdelegate", "memory_recursiveprot")
    )
    assert by_point["/cache"].device == (8, 33) and by_point["/cache"].root == "/volumes/t4serve-cache/_data"
    assert by_point["/tmp"].fs_type == "tmpfs"
    # A space in a bind-mounted folder name is written \040 in mountinfo.
    assert by_point["/models"].root == "/home/user/my models"


def test_unreadable_mountinfo_is_noted(tmp_path: Path) -> None:
    notes: list[str] = []
    assert read_mountinfo(str(tmp_path), notes) == []
    assert len(notes) == 1 and "mountinfo unreadable" in notes[0]


def test_proc_cgroup_lines() -> None:
    text = (DATA / "cgroup-v1-docker" / "proc" / "self" / "cgroup").read_text()
    entries = parse_proc_cgroup(text)
    assert ("11", ("memory",), "/docker/8a1d") in entries
    assert ("4", ("cpu", "cpuacct"), "/docker/8a1d") in entries
    assert ("0", (), "/system.slice/containerd.service") in entries


# --- cgroup limits ------------------------------------------------------------------------------------------------


def test_cgroup_v2_container_limits() -> None:
    # docker run --memory 6g --memory-swap 8g --cpus 1.5, with its own cgroup namespace
    limits = cgroup_of("cgroup-v2-container")
    assert limits.version == 2
    assert limits.memory_limit_bytes == 6 * GIB
    assert limits.memory_limit_file == str(DATA / "cgroup-v2-container" / "sys" / "fs" / "cgroup" / "memory.max")
    assert limits.swap_limit_bytes == 2 * GIB
    assert limits.cpu_quota == (150000, 100000)
    assert limits.notes == []


def test_cgroup_v2_the_tightest_limit_on_the_path_up_wins() -> None:
    # The scope says "max"; its parent slice caps it at 4 GiB and 4 CPUs.
    limits = cgroup_of("cgroup-v2-nested")
    assert limits.version == 2
    assert limits.memory_limit_bytes == 4 * GIB
    assert limits.memory_limit_file is not None and limits.memory_limit_file.endswith("system.slice/memory.max")
    assert limits.swap_limit_bytes is None
    assert limits.cpu_quota == (400000, 100000)


def test_cgroup_v1_docker_limits_and_swap_is_memsw_minus_memory() -> None:
    # docker run --memory 4g --memory-swap 6g --cpus 2 on a v1 host: the mount root is the container's cgroup.
    limits = cgroup_of("cgroup-v1-docker")
    assert limits.version == 1
    assert limits.memory_limit_bytes == 4 * GIB
    assert limits.memory_limit_file == str(DATA / "cgroup-v1-docker/sys/fs/cgroup/memory/memory.limit_in_bytes")
    assert limits.swap_limit_bytes == 2 * GIB
    assert limits.cpu_quota == (200000, 100000)
    assert limits.cpu_quota_file is not None and limits.cpu_quota_file.endswith("cpu,cpuacct/cpu.cfs_quota_us")


def test_cgroup_v1_huge_values_and_no_quota_are_unlimited() -> None:
    # The hybrid layout of the GPU-less CI machine: memory on v1 (LONG_MAX rounded to a page), empty cgroup2 tree.
    limits = cgroup_of("cgroup-v1-hybrid-unlimited")
    assert limits.version == 1
    assert (limits.memory_limit_bytes, limits.swap_limit_bytes, limits.cpu_quota) == (None, None, None)
    assert limits.notes == []


def _v2_tree(tmp_path: Path, controllers: str, files: dict[str, str], cgroup_path: str = "/") -> CgroupLimits:
    proc = tmp_path / "proc" / "self"
    proc.mkdir(parents=True)
    (proc / "cgroup").write_text(f"0::{cgroup_path}\n")
    (proc / "mountinfo").write_text("30 20 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n")
    root = tmp_path / "sys" / "fs" / "cgroup"
    root.mkdir(parents=True)
    (root / "cgroup.controllers").write_text(controllers + "\n")
    for name, text in files.items():
        (root / name).write_text(text + "\n")
    return probe_cgroup(str(tmp_path / "proc"), str(tmp_path / "sys"), read_mountinfo(str(tmp_path / "proc"), []))


def test_cgroup_v2_max_is_unlimited(tmp_path: Path) -> None:
    limits = _v2_tree(tmp_path, "cpu memory", {"memory.max": "max", "memory.swap.max": "max", "cpu.max": "max 100000"})
    assert (limits.version, limits.memory_limit_bytes, limits.swap_limit_bytes, limits.cpu_quota) == (
        2,
        None,
        None,
        None,
    )


def test_cgroup_v2_a_path_outside_the_namespace_reads_the_visible_root(tmp_path: Path) -> None:
    # Followed literally, "/../.." would climb out of the cgroup mount and read an unrelated file.
    stray = tmp_path / "sys" / "system.slice" / "x.scope"
    stray.mkdir(parents=True)
    (stray / "memory.max").write_text("536870912\n")
    limits = _v2_tree(tmp_path, "memory", {"memory.max": "1073741824"}, cgroup_path="/../../system.slice/x.scope")
    assert limits.memory_limit_bytes == GIB
    assert limits.memory_limit_file == str(tmp_path / "sys" / "fs" / "cgroup" / "memory.max")


def test_cgroup_v2_without_the_memory_controller_has_no_version(tmp_path: Path) -> None:
    limits = _v2_tree(tmp_path, "cpu pids", {"memory.max": "1073741824", "cpu.max": "50000 100000"})
    assert limits.version is None and limits.memory_limit_bytes is None
    assert limits.cpu_quota == (50000, 100000)


def test_cgroup_garbage_values_are_noted_not_raised(tmp_path: Path) -> None:
    limits = _v2_tree(tmp_path, "cpu memory", {"memory.max": "lots", "cpu.max": "half"})
    assert limits.memory_limit_bytes is None and limits.cpu_quota is None
    assert any("memory.max: unreadable value 'lots'" in note for note in limits.notes)
    assert any("cpu.max: unreadable value 'half'" in note for note in limits.notes)


def test_cgroup_v1_controller_without_a_mount_is_noted(tmp_path: Path) -> None:
    proc = tmp_path / "proc" / "self"
    proc.mkdir(parents=True)
    (proc / "cgroup").write_text("4:memory:/docker/1\n")
    (proc / "mountinfo").write_text("")
    limits = probe_cgroup(str(tmp_path / "proc"), str(tmp_path / "sys"), [])
    assert limits.version is None
    assert limits.notes == ["the cgroup v1 memory controller is not mounted: its limits are unknown"]


def test_no_proc_cgroup_is_noted(tmp_path: Path) -> None:
    limits = probe_cgroup(str(tmp_path), str(tmp_path), [])
    assert limits.version is None and limits.notes == [f"{tmp_path}/self/cgroup unreadable: cgroup limits unknown"]


# --- CPUs ---------------------------------------------------------------------------------------------------------


def test_cpu_count_is_capped_by_the_quota_rounded_up() -> None:
    quota = CgroupLimits(cpu_quota=(150000, 100000), cpu_quota_file="/sys/fs/cgroup/cpu.max")
    assert count_cpus(16, quota) == (
        2,
        "min(16 CPUs in the affinity mask, /sys/fs/cgroup/cpu.max 150000/100000 = 1.5 -> 2) = 2",
    )
    assert count_cpus(1, quota)[0] == 1  # the affinity mask is tighter
    assert count_cpus(2, CgroupLimits()) == (2, "2 CPUs in the affinity mask")
    assert count_cpus(8, CgroupLimits(cpu_quota=(10000, 100000), cpu_quota_file="q"))[0] == 1  # never 0


# --- /dev/shm and disks -------------------------------------------------------------------------------------------


def test_shm_is_measured_and_absent_shm_is_none(tmp_path: Path) -> None:
    total, free = probe_shm("/dev/shm")
    stat = os.statvfs("/dev/shm")
    assert total == stat.f_blocks * stat.f_frsize and total > 0
    assert free is not None and 0 <= free <= total
    assert probe_shm(str(tmp_path / "no-shm")) == (None, None)


def test_nearest_existing_folder_walks_up(tmp_path: Path) -> None:
    assert nearest_existing_folder(str(tmp_path / "a" / "b" / "c")) == str(tmp_path)
    (tmp_path / "a").mkdir()
    assert nearest_existing_folder(str(tmp_path / "a" / "b")) == str(tmp_path / "a")
    assert nearest_existing_folder(str(tmp_path)) == str(tmp_path)
    # A file in the way: the write would land in its folder (and fail there, which writability then tells).
    (tmp_path / "file").write_text("x")
    assert nearest_existing_folder(str(tmp_path / "file" / "sub")) == str(tmp_path)


def test_disk_is_measured_where_the_write_lands(tmp_path: Path) -> None:
    disk = probe_disk("hf_cache", str(tmp_path / "huggingface" / "hub"), [])
    stat = os.statvfs(tmp_path)
    assert (disk.role, disk.path, disk.measured_at) == (
        "hf_cache",
        str(tmp_path / "huggingface" / "hub"),
        str(tmp_path),
    )
    assert disk.total_bytes == stat.f_blocks * stat.f_frsize
    # Free space moves as other processes write; the same filesystem at the same moment is close to it.
    assert abs(disk.free_bytes - stat.f_bavail * stat.f_frsize) < 256 * 2**20
    assert disk.filesystem_id == os.stat(tmp_path).st_dev
    assert disk.writable is True
    assert disk.fs_type is None  # no mountinfo given


def test_a_disk_statvfs_refuses_is_recorded_and_preflight_fails_on_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refused(path: str) -> os.statvfs_result:
        """Stands for a filesystem that refuses statvfs (a stale NFS handle, a FUSE mount without permission)."""
        raise OSError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(os, "statvfs", refused)
    disk = probe_disk("hf_cache", str(tmp_path / "hub"), [])
    assert (disk.free_bytes, disk.total_bytes, disk.filesystem_id, disk.writable) == (None, None, None, False)
    assert disk.unreadable == f"{tmp_path / 'hub'} (measured at {tmp_path}): Permission denied"
    monkeypatch.undo()
    facts = no_gpu()
    facts = replace(facts, host=replace(facts.host, disks=[disk, *facts.host.disks]))
    from t4serve.planning.plan import plan

    settings = Settings.from_environ({})
    findings = check_disks(facts, plan(settings, facts))
    failed = [f for f in findings if f.level == "fail" and "hf_cache" in f.found]
    assert len(failed) == 1 and "Permission denied" in failed[0].found
    assert failed[0].required and str(tmp_path / "hub") in failed[0].fix
    assert len(findings) == 1 + len({d.filesystem_id for d in no_gpu().host.disks})


def test_two_roles_on_one_filesystem_share_its_id(tmp_path: Path) -> None:
    a = probe_disk("tmp", str(tmp_path / "x"), [])
    b = probe_disk("state", str(tmp_path / "y" / "z"), [])
    assert a.filesystem_id == b.filesystem_id == os.stat(tmp_path).st_dev


def test_an_unwritable_folder_is_recorded(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        folder = tmp_path / "ro"
        folder.mkdir()
        folder.chmod(0o555)
        target = str(folder / "cache")
    elif not os.access("/proc/sys", os.W_OK):
        target = "/proc/sys/t4serve-cache"  # root ignores modes; a read-only mount still refuses it
    else:
        pytest.skip("running as root with no read-only folder to point at")
    assert probe_disk("hf_cache", target, []).writable is False


def test_fs_type_prefers_the_mount_of_the_same_device(tmp_path: Path) -> None:
    dev = os.stat(tmp_path).st_dev
    major, minor = os.major(dev), os.minor(dev)
    text = (
        f"1 0 {major + 1}:{minor} / / rw - ext4 /dev/other rw\n"
        # A bind mount of another device at a deeper point would win by prefix alone; the device decides.
        f"2 1 {major + 7}:99 / {tmp_path} rw - overlay overlay rw\n"
        f"3 1 {major}:{minor} / {tmp_path.parent} rw - sampletype /dev/sample rw\n"
    )
    mounts = parse_mountinfo(text)
    assert filesystem_type(str(tmp_path), dev, mounts) == "sampletype"
    assert probe_disk("tmp", str(tmp_path / "new"), mounts).fs_type == "sampletype"
    # No mount of that device: the deepest mount point above the folder.
    assert filesystem_type(str(tmp_path), dev, mounts[:2]) == "overlay"
    assert filesystem_type(str(tmp_path), dev, []) is None


# --- ports --------------------------------------------------------------------------------------------------------


def _listener(host: str = "127.0.0.1") -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as vLLM's own listener
    sock.bind((host, 0))
    sock.listen(1)
    return sock


def test_a_listening_port_is_in_use_on_its_address_and_on_the_wildcard() -> None:
    with _listener() as listener:
        port = listener.getsockname()[1]
        in_use, errors = probe_ports([("127.0.0.1", port), ("0.0.0.0", port)])
    assert in_use == [port]  # once, though two addresses failed
    assert errors == {f"127.0.0.1:{port}": "address already in use", f"0.0.0.0:{port}": "address already in use"}


def test_a_free_port_is_free() -> None:
    with _listener() as listener:
        port = listener.getsockname()[1]
    assert probe_ports([("127.0.0.1", port)]) == ([], {})


def test_a_port_left_in_time_wait_is_free_as_vllm_would_find_it() -> None:
    # The server side closes first, so its end of the connection sits in TIME_WAIT on the listening port, as after a
    # restart. vLLM binds with SO_REUSEADDR and succeeds there; a plain bind does not, which this test also shows.
    with _listener() as listener:
        port = listener.getsockname()[1]
        client = socket.create_connection(("127.0.0.1", port))
        conn, _ = listener.accept()
        conn.close()
        client.recv(1)
        client.close()
    plain = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        plain.bind(("127.0.0.1", port))
    except OSError as exc:
        assert exc.errno == errno.EADDRINUSE
    else:
        pytest.skip("this kernel let a plain bind reuse a TIME_WAIT port: nothing to tell apart")
    finally:
        plain.close()
    assert probe_ports([("127.0.0.1", port)]) == ([], {})


def test_an_address_that_cannot_be_bound_is_recorded_with_the_reason() -> None:
    in_use, errors = probe_ports([("192.0.2.1", 8000)])  # TEST-NET-1: never an address of this machine
    assert in_use == [8000]
    assert "192.0.2.1:8000" in errors and "assign" in errors["192.0.2.1:8000"].lower()


# --- the whole host -----------------------------------------------------------------------------------------------


def test_probe_host_on_the_container_sample(tmp_path: Path) -> None:
    proc, sys_root = scenario("cgroup-v2-container")
    with _listener() as listener:
        port = listener.getsockname()[1]
        host = probe_host(
            disk_paths={"tmp": str(tmp_path / "t4serve"), "state": str(tmp_path)},
            ports=[("127.0.0.1", port)],
            proc_root=proc,
            sys_root=sys_root,
            shm_path=str(tmp_path),
            affinity={0, 1, 2, 3},
        )
    assert host.mem_total_bytes == 8178892 * 1024 and host.mem_available_bytes == 7654604 * 1024
    assert host.swap_total_bytes == 16777212 * 1024 and host.swap_free_bytes == 16700000 * 1024
    assert (host.cgroup_version, host.cgroup_memory_limit_bytes, host.cgroup_swap_limit_bytes) == (2, 6 * GIB, 2 * GIB)
    assert host.cgroup_memory_limit_file is not None and host.cgroup_memory_limit_file.endswith("memory.max")
    assert host.cpu_count == 2 and host.cpu_count_how is not None and "1.5 -> 2" in host.cpu_count_how
    assert host.shm_total_bytes == os.statvfs(tmp_path).f_blocks * os.statvfs(tmp_path).f_frsize
    assert [d.role for d in host.disks] == ["tmp", "state"]
    assert [d.measured_at for d in host.disks] == [str(tmp_path), str(tmp_path)]
    assert host.ports_in_use == [port] and host.port_bind_errors == {f"127.0.0.1:{port}": "address already in use"}
    assert host.probe_notes == []


def test_probe_host_for_real_on_this_machine(tmp_path: Path) -> None:
    host = probe_host(disk_paths={"tmp": str(tmp_path)}, ports=[])
    assert host.mem_total_bytes > 0 and 0 < host.mem_available_bytes <= host.mem_total_bytes
    assert 0 <= host.swap_free_bytes <= host.swap_total_bytes
    assert 1 <= host.cpu_count <= len(os.sched_getaffinity(0))
    assert host.disks[0].fs_type is not None  # this machine's mountinfo names the filesystem of /tmp
