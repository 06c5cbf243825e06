"""Preflight checks of the host as the container sees it: /dev/shm, RAM + swap to load, free disk per write path,
the ports and the telemetry address."""

from __future__ import annotations

import math

from t4serve.config.aliases import QAT_REPO
from t4serve.config.settings import Settings
from t4serve.facts import ADDRESS_IN_USE, DiskFacts, Facts, HostFacts
from t4serve.planning import hostmem
from t4serve.planning.derived import format_bytes
from t4serve.planning.plan import Plan
from t4serve.preflight.findings import Finding
from t4serve.preflight.model import NOT_LOCAL_SOURCES
from t4serve.probes.checkpoint import builtin_facts
from t4serve.probes.host import MEMINFO_KEYS
from t4serve.units import GIB, MIB
from t4serve.untrusted import Untrusted, check_host, printable

SHM_FIX = "give the container more /dev/shm: `docker run --shm-size 2g ...`, or `shm_size: 2g` / `ipc: host` in compose"


# Docker's default /dev/shm is 64 MiB. At tensor-parallel 1 vLLM runs its model in the engine process (the "uni"
# executor: no shared-memory message queue), so little is used; below this much free, even that fails with SIGBUS.
SHM_MIN_FREE = 64 * MIB


# vLLM's multi-process executor's queue alone takes VLLM_MQ_MAX_CHUNK_BYTES_MB (16) x 10 chunks = 160 MiB; 1 GiB
# leaves room for that and for torch's shared tensors, and is what the warning asks for.
SHM_RECOMMENDED = GIB


# Free space each write path needs besides the checkpoint. Estimates for one Gemma 4 E2B server (not measured on a
# T4): vLLM's torch.compile cache, Triton's kernels, inductor's artefacts, scratch and state files.
DISK_NEED_BY_ROLE = {
    "compile_cache": 512 * MIB,
    "triton_cache": 256 * MIB,
    "inductor_cache": 256 * MIB,
    "tmp": 512 * MIB,
    "state": MIB,
}
HF_CACHE_HEADROOM = 256 * MIB
PROC_FIX = "run t4serve on Linux with /proc mounted (inside the t4serve image it always is)"


# The image on Docker's data root: IMAGE_BYTES measured for t4serve:dev by scripts/bench-image (docs/image.md's
# figures). Every host that pulls the image needs this much there before it can serve; compose's cache volumes are
# named volumes on the same disk.
IMAGE_BYTES = 6_310_000_000
DATA_ROOT_FIX = (
    "move Docker's data root to a larger disk: stop Docker, copy its folder (`docker info -f '{{.DockerRootDir}}'`, "
    'usually /var/lib/docker) there, set "data-root": "/new/path" in /etc/docker/daemon.json, start Docker '
    "(docs/operations.md: Moving Docker's data root)"
)


def check_shm(host: HostFacts) -> Finding:
    required = f"/dev/shm >= {format_bytes(SHM_RECOMMENDED)} (at least {format_bytes(SHM_MIN_FREE)} free)"
    if host.shm_total_bytes is None or host.shm_free_bytes is None:
        return Finding("shm", "warn", "/dev/shm could not be read", required, SHM_FIX)
    found = f"/dev/shm {format_bytes(host.shm_total_bytes)}, {format_bytes(host.shm_free_bytes)} free"
    if host.shm_free_bytes < SHM_MIN_FREE:
        return Finding("shm", "fail", found, required, SHM_FIX)
    if host.shm_total_bytes < SHM_RECOMMENDED:
        return Finding(
            "shm",
            "warn",
            found + " (enough for one GPU at tensor-parallel 1; vLLM's multi-process paths need more)",
            required,
            SHM_FIX,
        )
    return Finding("shm", "ok", found, required, "")


def check_host_memory(facts: Facts, settings: Settings) -> Finding:
    """RAM + swap (within the cgroup limit) against the loading peak, from t4serve.planning.hostmem: the same estimate
    the plan's sizing shows, computed here too so a machine without a visible GPU still learns what it must add."""
    model = facts.model
    available, swap_free = facts.host.mem_available_bytes, facts.host.swap_free_bytes
    if available is None or swap_free is None:
        return Finding(
            "host-memory",
            "fail",
            f"the host's memory figures could not be read: {facts.host.meminfo_unreadable or 'no reason recorded'}",
            "a readable /proc/meminfo with " + ", ".join(MEMINFO_KEYS) + " (Linux 3.14 or newer)",
            PROC_FIX,
        )
    if model is None or not model.weights:
        return Finding(
            "host-memory",
            "warn",
            f"RAM available {format_bytes(available)}, free swap {format_bytes(swap_free)}",
            "not computed: the checkpoint's size is unknown" + (f" ({model.error})" if model and model.error else ""),
            "point T4SERVE_MODEL at a readable checkpoint, or use an alias (qat, bf16) whose facts are built in",
        )
    drafter = facts.drafter if settings.speculative == "mtp" else None
    estimate = hostmem.estimate(model, facts.host, drafter)
    need = estimate.need_bytes
    usable = estimate.available_bytes
    found = f"{usable.format_value()} usable ({usable.how})" if usable else "host memory not read"
    loaded = model.requested + (f" and its drafter {drafter.requested}" if drafter is not None else "")
    required = f"{need.format_value()} to load {loaded} ({need.how})"
    add = int(estimate.swap_to_add_bytes.value)
    if add <= 0:
        return Finding("host-memory", "ok", found, required, "")
    host = facts.host
    limit = host.cgroup_memory_limit_bytes
    limited = limit is not None and limit + (host.cgroup_swap_limit_bytes or 0) < need.value
    if limited:
        # Swap on the host does not help past the container's own limit.
        fix = (
            f"raise the container's memory limit to at least {_gib_ceil(int(need.value))}G "
            "(`docker run --memory/--memory-swap`, compose `mem_limit`/`memswap_limit`)"
        )
    else:
        fix = f"add swap on the host: `sudo scripts/setup-swap {_gib_ceil(add)}G`"
    fix += _qat_instead(settings, host, limited)
    short = int(need.value) - int(usable.value) if usable else int(need.value)
    return Finding("host-memory", "fail", found + f"; {format_bytes(short)} short", required, fix)


def _qat_instead(settings: Settings, host: HostFacts, limited: bool) -> str:
    """The QAT checkpoint as the other fix, with what it needs here: less than the others, but on a small host not
    nothing (the published T4 VM: 5 GiB of swap to add for QAT too). `limited`: the container's memory limit, not the
    host's swap, is what falls short."""
    qat = builtin_facts(QAT_REPO, "its size is known without a download")
    if settings.model.target == QAT_REPO or qat is None:
        return ""
    estimate = hostmem.estimate(qat, host)
    if limited:
        need = int(estimate.need_bytes.value)
        if need <= (host.cgroup_memory_limit_bytes or 0) + (host.cgroup_swap_limit_bytes or 0):
            return ", or set T4SERVE_MODEL=qat (its int4 weights load within this limit)"
        return f", or set T4SERVE_MODEL=qat, which needs less but a limit of at least {_gib_ceil(need)}G too"
    add = int(estimate.swap_to_add_bytes.value)
    if add <= 0:
        return ", or set T4SERVE_MODEL=qat (its int4 weights load within this host's RAM + swap)"
    return f", or set T4SERVE_MODEL=qat, which needs less but swap too (`sudo scripts/setup-swap {_gib_ceil(add)}G`)"


def _gib_ceil(n: int) -> int:
    return max(1, math.ceil(n / GIB))


def disk_needs(facts: Facts, plan: Plan) -> dict[str, tuple[int, str]]:
    """Bytes each write role needs, with why. The HF cache needs the checkpoint only when it is not local yet."""
    needs = {role: (n, "estimate for one server") for role, n in DISK_NEED_BY_ROLE.items()}
    model = facts.model
    if model is not None and model.source in NOT_LOCAL_SOURCES:
        weights = model.weight_bytes
        what = f"checkpoint {format_bytes(weights)}" if weights else "checkpoint of unknown size (headers unread)"
        needs["hf_cache"] = (
            weights + HF_CACHE_HEADROOM,
            f"{what} to download + {format_bytes(HF_CACHE_HEADROOM)} for tokenizer and config",
        )
    else:
        needs["hf_cache"] = (0, "checkpoint already local" if model is not None else "model not probed")
    drafter = facts.drafter
    if drafter is not None and plan.speculative.startswith("mtp") and drafter.source in NOT_LOCAL_SOURCES:
        bytes_, why = needs["hf_cache"]
        needs["hf_cache"] = (bytes_ + drafter.weight_bytes,
                             f"{why} + drafter {format_bytes(drafter.weight_bytes)} to download")
    return needs


def check_disks(facts: Facts, plan: Plan) -> list[Finding]:
    """One finding per filesystem: the roles sharing it add up, and its free space counts once."""
    needs = disk_needs(facts, plan)
    by_fs: dict[int, list[DiskFacts]] = {}
    findings = []
    for disk in facts.host.disks:
        if disk.filesystem_id is None or disk.free_bytes is None:
            findings.append(unreadable_disk(disk))
        else:
            by_fs.setdefault(disk.filesystem_id, []).append(disk)
    for disks in by_fs.values():
        roles = ", ".join(f"{d.role} {d.path}" for d in disks)
        total = sum(needs.get(d.role, (0, ""))[0] for d in disks)
        parts = " + ".join(
            f"{d.role} {format_bytes(needs.get(d.role, (0, ''))[0])} ({needs.get(d.role, (0, 'unknown role'))[1]})"
            for d in disks
        )
        free = disks[0].free_bytes or 0
        found = f"{format_bytes(free)} free on {disks[0].measured_at} ({roles})"
        required = f"{format_bytes(total)} = {parts}" if len(disks) > 1 else f"{parts}"
        unwritable = [d for d in disks if not d.writable]
        if unwritable:
            findings.append(
                Finding(
                    "disk",
                    "fail",
                    found + "; not writable: " + ", ".join(d.measured_at for d in unwritable),
                    required,
                    "mount a volume writable by uid 1000 (the image's t4serve user) at "
                    + ", ".join(d.path for d in unwritable),
                )
            )
        elif free < total:
            findings.append(
                Finding(
                    "disk",
                    "fail",
                    found,
                    required,
                    f"free {format_bytes(total - free)} on {disks[0].measured_at}, or mount a larger volume at "
                    + ", ".join(d.path for d in disks)
                    + f"; compose's cache volumes are named volumes on Docker's data root, which also holds the "
                    f"image ({format_bytes(IMAGE_BYTES)}): {DATA_ROOT_FIX}",
                )
            )
        else:
            findings.append(Finding("disk", "ok", found, required, ""))
    return findings


def unreadable_disk(disk: DiskFacts) -> Finding:
    """The finding for a write path whose free space could not be measured (the probe recorded why)."""
    return Finding(
        "disk",
        "fail",
        f"cannot measure free disk for {disk.role}: {disk.unreadable or 'no reason recorded'}",
        "a folder t4serve can stat on the filesystem that will hold it",
        f"mount a readable volume at {disk.path}, or point the variable that sets it elsewhere",
    )


def check_ports(host: HostFacts, settings: Settings) -> list[Finding]:
    ports = [("T4SERVE_PORT", settings.port)]
    if settings.telemetry_port:
        ports.append(("T4SERVE_TELEMETRY_PORT", settings.telemetry_port))
    findings = []
    for variable, port in ports:
        required = f"port {port} free"
        if port in host.ports_in_use:
            findings.append(
                Finding(
                    "port",
                    "fail",
                    f"port {port} ({variable}) is already in use",
                    required,
                    f"stop what listens on {port}, or set {variable} to a free port",
                )
            )
        else:
            findings.append(Finding("port", "ok", f"port {port} ({variable}) is free", required, ""))
    return findings


def check_telemetry(plan: Plan, host: HostFacts) -> Finding:
    """The address and port the plan gives GPU telemetry's /metrics: a valid address this host can bind, on a port
    other than the API's. A port already taken is check_ports' finding, not repeated here."""
    required = "an address of this host (0.0.0.0: all of them) and a port other than T4SERVE_PORT's, or port 0 (off)"
    if not plan.telemetry_port:
        return Finding("telemetry", "ok", plan.telemetry_summary(), required, "")
    where = f"{plan.telemetry_host}:{plan.telemetry_port}"
    try:
        check_host(plan.telemetry_host)
    except Untrusted as exc:
        return Finding(
            "telemetry",
            "fail",
            f"T4SERVE_TELEMETRY_HOST={printable(plan.telemetry_host)}: {exc.reason}",
            required,
            "set T4SERVE_TELEMETRY_HOST=0.0.0.0 (all addresses) or 127.0.0.1 (this host only)",
        )
    if plan.telemetry_port == plan.port:
        return Finding(
            "telemetry",
            "fail",
            f"T4SERVE_TELEMETRY_PORT={plan.telemetry_port} is the API's port (T4SERVE_PORT={plan.port})",
            required,
            "set T4SERVE_TELEMETRY_PORT=9400 (or another free port), or 0 to turn telemetry off",
        )
    error = host.port_bind_errors.get(where)
    if error is not None and error != ADDRESS_IN_USE:
        return Finding(
            "telemetry",
            "fail",
            f"/metrics cannot bind {where}: {error}",
            required,
            "set T4SERVE_TELEMETRY_HOST to an address of this host (0.0.0.0: all of them), or "
            "T4SERVE_TELEMETRY_PORT=0 to turn telemetry off",
        )
    return Finding("telemetry", "ok", f"/metrics on {where}", required, "")
