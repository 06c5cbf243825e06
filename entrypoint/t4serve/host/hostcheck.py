"""Host checks: can this host run the t4serve container? The same `Finding` type as preflight, for the host side.

Preflight runs inside the container and sees what the container sees; these run on the host, before any container:
the NVIDIA driver (NVML on the host), the NVIDIA Container Toolkit and its Docker runtime, free space on Docker's data
root for the image and the cache volumes (named volumes live there), RAM + swap against the checkpoint's load need
(within compose's memory limit when one is set), and the /dev/shm compose gives the service. `t4serve host-check`
prints them; the MCP tool `check_host_capacity` returns them. The engine is reached only through t4serve.host.engine;
the image's build manifest is read from a throwaway container of the image.
"""

from __future__ import annotations

import dataclasses
import re
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path

from t4serve.config.settings import Settings
from t4serve.config.variables import MAX_SIZE_BYTES
from t4serve.contract import ManifestAnswer, read_answer
from t4serve.errors import EngineError
from t4serve.facts import BuildManifest, Facts, GpuFacts
from t4serve.host.engine import (
    COMPOSE_ENV_SECRET_VERSION,
    COMPOSE_TOO_OLD_FIX,
    MANIFEST_PATH,
    Engine,
    EngineInfo,
    ImageInfo,
)
from t4serve.pipeline import probe_settings_model
from t4serve.planning.derived import format_bytes
from t4serve.preflight import (
    DATA_ROOT_FIX,
    DISK_NEED_BY_ROLE,
    HF_CACHE_HEADROOM,
    IMAGE_BYTES,
    SHM_RECOMMENDED,
    Finding,
    check_capability,
    check_driver,
    check_host_memory,
    check_torch_arch,
    check_torch_cuda,
    unreadable_disk,
)
from t4serve.probes import recorded_now
from t4serve.probes.gpu import Nvml, probe_gpu
from t4serve.probes.host import probe_host
from t4serve.units import GIB, KIB, MIB, TIB
from t4serve.untrusted import Untrusted, parse_float, read_text_bounded

# The image's need on Docker's data root when it is not local yet: its measured size (preflight.IMAGE_BYTES) plus 5%
# for the layers' extraction overhead.
IMAGE_SIZE_ESTIMATE = IMAGE_BYTES * 105 // 100
TOOLKIT_FIX = (
    "install the NVIDIA Container Toolkit (https://docs.nvidia.com/datacenter/cloud-native/container-toolkit/"
    "latest/install-guide.html), then `sudo nvidia-ctk runtime configure --runtime=docker && "
    "sudo systemctl restart docker`"
)
DOCKER_SIZE_UNITS = {"": 1, "b": 1, "k": KIB, "m": MIB, "g": GIB, "t": TIB}
DRIVER_FIX = "install the NVIDIA driver 580 or newer on the host (`nvidia-smi` then shows it)"
# t4serve's compose.yaml is 5 KB; a file past this is not a compose file.
MAX_COMPOSE_BYTES = 1 << 20


# What the host runs in a throwaway container of the image to read its build manifest (t4serve.contract).
MANIFEST_ARGV = ("probe", "--manifest-only", "--json")
MANIFEST_TIMEOUT_S = 120.0


def image_manifest(engine: Engine, image: ImageInfo | None) -> BuildManifest:
    """The image's build manifest as the image's own t4serve reads it (`t4serve probe --manifest-only --json` in a
    throwaway container); absent (with why) when the image is not local."""
    label = f"{engine.image_ref}:{MANIFEST_PATH}"
    if image is None:
        return BuildManifest(
            path=label,
            present=False,
            error=f"the image {engine.image_ref} is not on this host (apply_turing_patch or scripts/build-image "
            "builds it)",
        )
    done = engine.run_in_image(list(MANIFEST_ARGV), MANIFEST_TIMEOUT_S)
    manifest = read_answer(ManifestAnswer, ["t4serve", *MANIFEST_ARGV], done.returncode, done.stdout, done.stderr,
                           engine.image_ref).manifest  # fmt: skip
    error = manifest.error.replace(manifest.path, label) if manifest.error else None
    return dataclasses.replace(manifest, path=label, error=error)


def host_gpu(environ: Mapping[str, str], nvml: Nvml | None = None) -> GpuFacts:
    """NVML on the host: the driver and every GPU it sees (NVIDIA_VISIBLE_DEVICES does not apply here)."""
    return probe_gpu({k: v for k, v in environ.items() if k not in ("NVIDIA_VISIBLE_DEVICES",)}, nvml, on_host=True)


def host_facts(
    settings: Settings,
    environ: Mapping[str, str],
    engine: Engine,
    *,
    info: EngineInfo | None,
    image: ImageInfo | None,
    manifest: BuildManifest | None = None,
    nvml: Nvml | None = None,
    proc_root: str = "/proc",
    sys_root: str = "/sys",
) -> Facts:
    """Facts as the host sees them: its GPU and memory, Docker's data root as the one disk (none without an engine,
    `info` None, which alone knows where that is), the image's manifest."""
    disks = {"docker_data_root": info.data_root} if info is not None else {}
    host = probe_host(disk_paths=disks, ports=[], proc_root=proc_root, sys_root=sys_root, affinity=())
    return recorded_now(
        gpu=host_gpu(environ, nvml),
        host=host,
        manifest=manifest if manifest is not None else image_manifest(engine, image),
        model=probe_settings_model(settings),
        provenance="probed on the host by t4serve host-check",
    )


def compose_limits(compose_text: str) -> tuple[int | None, int | None, bool]:
    """(shm_size, mem_limit, ipc host) of the service, read from compose.yaml's own lines; Untrusted for a size that
    is not one (`1.2.3gb`, a 400-digit number)."""

    def size(key: str) -> int | None:
        match = re.search(
            rf"^\s+{key}:\s*['\"]?([0-9.]+)\s*([bkmgt]?)b?['\"]?\s*$",
            compose_text,
            re.MULTILINE | re.IGNORECASE | re.ASCII,
        )
        if not match:
            return None
        try:
            number = parse_float(match.group(1), 0.0, float(MAX_SIZE_BYTES))
        except Untrusted as exc:
            raise Untrusted(f"the compose file's {key} {match.group(1)[:40]!r} {exc.reason}") from None
        # Docker's units are binary: 2gb is 2 GiB, 512m is 512 MiB.
        return min(int(number * DOCKER_SIZE_UNITS[match.group(2).lower()]), MAX_SIZE_BYTES)

    ipc_host = re.search(r"^\s+ipc:\s*['\"]?host['\"]?\s*$", compose_text, re.MULTILINE) is not None
    return size("shm_size"), size("mem_limit"), ipc_host


def compose_token_route(compose_text: str) -> str | None:
    """How the compose file gives the HF token: "environment" (compose.yaml: its hf_token secret reads HF_TOKEN),
    "file" (compose.token-file.yaml: a host file), or None (no hf_token secret found in its lines)."""
    match = re.search(r"^secrets:\n(?:[ \t]*#.*\n|\n)*  hf_token:\n(?:[ \t]*#.*\n)*    (environment|file):",
                      compose_text, re.MULTILINE)  # fmt: skip
    return match.group(1) if match else None


def _version(text: str) -> tuple[int, ...] | None:
    match = re.match(r"v?([0-9]{1,4})\.([0-9]{1,4})\.([0-9]{1,4})", text.strip())
    return tuple(int(part) for part in match.groups()) if match else None


def check_compose_client(engine: Engine, compose_text: str, compose_file: Path) -> Finding:
    """The compose client can read the compose file's token secret: one from the environment (compose.yaml) needs
    Compose v2.20 or later; docker-compose 1.29 refuses the whole file."""
    route = compose_token_route(compose_text)
    needs = COMPOSE_ENV_SECRET_VERSION if route == "environment" else None
    required = (
        "Compose v" + ".".join(map(str, needs)) + f" or later, which reads {compose_file.name}'s token from HF_TOKEN"
        if needs
        else "a compose client (`docker compose`, else docker-compose)"
    )
    try:
        client, version = engine.compose_version()
    except EngineError as exc:
        return Finding("compose-client", "fail", exc.found or exc.what, required, exc.fix or "")
    found = f"{client} {version}"
    parsed = _version(version)
    if needs is None:
        return Finding("compose-client", "ok", f"{found}; {compose_file.name} reads the token from a file", required,
                       "")  # fmt: skip
    if parsed is None:
        return Finding("compose-client", "warn", f"{found}: a version t4serve cannot read", required,
                       COMPOSE_TOO_OLD_FIX)  # fmt: skip
    if parsed < needs:
        return Finding(
            "compose-client",
            "fail",
            f"{found}, which cannot read {compose_file.name}'s hf_token secret from HF_TOKEN",
            required,
            COMPOSE_TOO_OLD_FIX,
        )
    return Finding("compose-client", "ok", f"{found}; {compose_file.name} reads the token from HF_TOKEN", required, "")


def check_gpu_driver(gpu: GpuFacts) -> Finding:
    required = "the NVIDIA driver loaded on the host, with at least one GPU"
    if not gpu.nvml_available:
        return Finding(
            "host-gpu", "fail", f"NVML unavailable on the host: {gpu.error or 'no reason given'}", required, DRIVER_FIX
        )
    if not gpu.devices:
        return Finding(
            "host-gpu",
            "fail",
            f"driver {gpu.driver_version} but no GPU ({gpu.error or 'none listed'})",
            required,
            "check `nvidia-smi`; reseat or re-enable the GPU",
        )
    names = ", ".join(f"{d.index}: {d.name}" for d in gpu.devices)
    return Finding("host-gpu", "ok", f"driver {gpu.driver_version}; {names}", required, "")


def check_toolkit(info: EngineInfo | None, which: Callable[[str], str | None] = shutil.which) -> Finding:
    """The nvidia runtime in Docker's runtimes; without an engine (`info` None) only whether the toolkit's programs are
    installed can be told."""
    required = "the NVIDIA Container Toolkit, configured as a Docker runtime (or CDI specs for the engine)"
    ctk = which("nvidia-ctk") or which("nvidia-container-runtime")
    if info is None:
        if ctk:
            return Finding(
                "container-toolkit",
                "warn",
                f"{ctk} is installed; whether Docker has the nvidia runtime needs the engine, which did not answer",
                required,
                "start the Docker engine, then run host-check again",
            )
        return Finding("container-toolkit", "fail", "no nvidia-ctk on PATH (and no Docker engine to ask)", required,
                       TOOLKIT_FIX)  # fmt: skip
    if "nvidia" in info.runtimes:
        default = " (the default runtime)" if info.default_runtime == "nvidia" else ""
        return Finding(
            "container-toolkit", "ok", f"Docker {info.server_version} has the nvidia runtime{default}", required, ""
        )
    if ctk:
        return Finding(
            "container-toolkit",
            "fail",
            f"{ctk} is installed, but Docker's runtimes are {', '.join(info.runtimes) or 'none'}",
            required,
            "`sudo nvidia-ctk runtime configure --runtime=docker && sudo systemctl restart docker`",
        )
    return Finding(
        "container-toolkit",
        "fail",
        f"no nvidia runtime in Docker ({', '.join(info.runtimes) or 'none'}) and no nvidia-ctk on PATH",
        required,
        TOOLKIT_FIX,
    )


def check_docker_disk(facts: Facts, image: ImageInfo | None, settings: Settings) -> Finding:
    """Docker's data root holds the image and the named cache volumes: the image when absent, the checkpoint (the
    first start downloads it into the hf-cache volume) and the compile caches."""
    disk = next(d for d in facts.host.disks if d.role == "docker_data_root")
    model = facts.model
    weights = model.weight_bytes if model is not None else 0
    parts = [
        (
            "image",
            0 if image is not None else IMAGE_SIZE_ESTIMATE,
            f"{image.ref} present"
            if image is not None
            else f"to pull or build, {format_bytes(IMAGE_BYTES)} measured + 5% to unpack"
            " (a local build also keeps BuildKit's cache there)",
        ),
        (
            "checkpoint",
            weights + HF_CACHE_HEADROOM,
            f"{model.requested if model else settings.model.target} into the hf-cache volume"
            + ("" if weights else "; its size is unknown, only the tokenizer and config are counted"),
        ),
        (
            "compile caches",
            sum(DISK_NEED_BY_ROLE[r] for r in ("compile_cache", "triton_cache", "inductor_cache")),
            "the compile-cache volume, estimate",
        ),
    ]
    need = sum(n for _, n, _ in parts)
    required = f"{format_bytes(need)} = " + " + ".join(f"{what} {format_bytes(n)} ({why})" for what, n, why in parts)
    if disk.free_bytes is None:
        return dataclasses.replace(
            unreadable_disk(disk),
            check="docker-disk",
            required=required,
            fix=f"run host-check as a user who can read Docker's data root {disk.path} (e.g. with sudo)",
        )
    found = f"{format_bytes(disk.free_bytes)} free at {disk.measured_at} (Docker's data root {disk.path})"
    if disk.free_bytes < need:
        return Finding(
            "docker-disk",
            "fail",
            found,
            required,
            f"free {format_bytes(need - disk.free_bytes)} on {disk.measured_at} (`docker system df`, "
            f"`docker image prune`), or {DATA_ROOT_FIX}",
        )
    return Finding("docker-disk", "ok", found, required, "")


def check_compose_shm(shm: int | None, ipc_host: bool, compose_file: Path) -> Finding:
    required = f"shm_size >= {format_bytes(SHM_RECOMMENDED)} (or ipc: host) for the service"
    if ipc_host:
        return Finding("shm", "ok", f"{compose_file.name}: ipc: host (the host's /dev/shm)", required, "")
    if shm is None:
        return Finding(
            "shm",
            "fail",
            f"{compose_file.name} sets no shm_size: Docker's 64 MiB default",
            required,
            f"add `shm_size: 2gb` to the service in {compose_file}",
        )
    found = f"{compose_file.name}: shm_size {format_bytes(shm)}"
    if shm < SHM_RECOMMENDED:
        return Finding("shm", "warn", found, required, f"raise shm_size to 2gb in {compose_file}")
    return Finding("shm", "ok", found, required, "")


def check_host(
    settings: Settings,
    environ: Mapping[str, str],
    engine: Engine,
    compose_file: Path,
    *,
    nvml: Nvml | None = None,
    proc_root: str = "/proc",
    sys_root: str = "/sys",
    which: Callable[[str], str | None] = shutil.which,
) -> list[Finding]:
    """Every host check, in the order their failures get more expensive to find later. Without a Docker engine the
    checks that need none (driver, GPU, memory, compose's /dev/shm) are still made, beside the engine's failure."""
    info: EngineInfo | None
    try:
        info = engine.info()
        docker = Finding(
            "docker", "ok", f"Docker {info.server_version}, data root {info.data_root}", "a Docker engine", ""
        )
    except EngineError as exc:
        info = None
        docker = Finding("docker", "fail", exc.found or exc.what, "a Docker engine this user can reach", exc.fix or "")
    image = engine.image() if info is not None else None
    # Without an engine no image can be read: the manifest is absent for that reason, not looked for.
    manifest = None if info is not None else BuildManifest(path=MANIFEST_PATH, present=False, error="no Docker engine")
    facts = host_facts(
        settings, environ, engine, info=info, image=image, manifest=manifest, nvml=nvml, proc_root=proc_root,
        sys_root=sys_root,
    )  # fmt: skip
    findings = [docker, check_gpu_driver(facts.gpu)]
    if facts.gpu.nvml_available:
        findings.append(check_driver(facts))
    findings.append(check_toolkit(info, which))
    if info is not None:
        findings.append(check_docker_disk(facts, image, settings))
    try:
        # The shared bounded reader: a FIFO, /dev/zero or a huge file is refused at once, never waited on or read whole.
        compose_text = read_text_bounded(compose_file, MAX_COMPOSE_BYTES, "the compose file")
        shm, mem_limit, ipc_host = compose_limits(compose_text)
    except (OSError, Untrusted) as exc:
        reason = exc.reason if isinstance(exc, Untrusted) else f"{compose_file}: {exc.strerror or exc}"
        findings.append(
            Finding(
                "compose",
                "fail",
                reason,
                f"the t4serve compose.yaml: a regular UTF-8 file of at most {MAX_COMPOSE_BYTES:,} bytes",
                "pass --compose-file PATH to t4serve's compose.yaml",
            )
        )
        return findings
    if mem_limit is not None:
        # compose's mem_limit becomes the container's cgroup limit: the load must fit inside it.
        facts = dataclasses.replace(facts, host=dataclasses.replace(facts.host, cgroup_memory_limit_bytes=mem_limit))
    findings.append(check_host_memory(facts, settings))
    findings.append(check_compose_shm(shm, ipc_host, compose_file))
    findings.append(check_compose_client(engine, compose_text, compose_file))
    return findings


def arch_findings(facts: Facts) -> list[Finding]:
    """verify_gpu_arch: each host GPU's capability, the driver against the image's CUDA, the image's torch build and
    arch list against each GPU."""
    findings = [check_gpu_driver(facts.gpu)]
    if not facts.gpu.nvml_available or not facts.gpu.devices:
        return findings
    findings.append(check_driver(facts))
    manifest = facts.manifest
    if manifest.present:
        findings.append(check_torch_cuda(manifest))
    else:
        findings.append(
            Finding(
                "manifest",
                "fail",
                manifest.error or "missing",
                "the image's build manifest",
                "build the image (apply_turing_patch, or scripts/build-image)",
            )
        )
    for device in facts.gpu.devices:
        cap = check_capability(device)
        findings.append(dataclasses.replace(cap, found=f"GPU {device.index}: {cap.found}"))
        if manifest.present and manifest.torch_arch_list:
            arch = check_torch_arch(manifest, device)
            findings.append(dataclasses.replace(arch, found=f"GPU {device.index}: {arch.found}"))
    return findings
