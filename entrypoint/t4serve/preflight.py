"""Preflight: pure checks over Facts + Plan + Settings, each a Finding (ok / warn / fail) with the fix.

`run_checks(facts, plan, settings)` reads nothing but its arguments, so a recorded machine is checked exactly as the
live one. Every check names what it found, what is required and the command or variable that fixes it. Checks that
need a GPU are left out when none is visible: the no-GPU finding says everything there is to say.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable
from dataclasses import asdict, dataclass

from t4serve.config.aliases import QAT_REPO
from t4serve.config.settings import Settings
from t4serve.facts import ADDRESS_IN_USE, BuildManifest, DiskFacts, Facts, GpuDevice, HostFacts, ModelFacts
from t4serve.gpus import BF16_MIN_CAPABILITY, MIN_CAPABILITY, arch_supported, format_capability
from t4serve.planning import hostmem
from t4serve.planning.derived import format_bytes
from t4serve.planning.plan import Plan, float16_refusal, model_type
from t4serve.probes.host import MEMINFO_KEYS
from t4serve.units import GIB, MIB
from t4serve.untrusted import Untrusted, check_host, printable

LEVELS = ("ok", "warn", "fail")
# The image's torch is the CUDA 13.0 build (published-t4-run.md); CUDA 13 needs driver 580 or newer.
DEFAULT_TORCH_CUDA = (13, 0)
MIN_DRIVER_FOR_CUDA = {13: 580, 12: 525, 11: 450}

NO_GPU_FIX = (
    "start the container with a GPU: `docker run --gpus all ...`, or in compose.yaml "
    "`deploy.resources.reservations.devices: [{driver: nvidia, device_ids: ['0'], capabilities: [gpu]}]`; "
    'if Docker answers `could not select device driver "nvidia"`, install the NVIDIA Container Toolkit on the host '
    "and run `sudo nvidia-ctk runtime configure --runtime=docker && sudo systemctl restart docker`"
)
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
# ModelFacts.source values meaning "vLLM will download it": read remotely, or the aliases' built-in facts.
NOT_LOCAL_SOURCES = ("not-local", "builtin")


@dataclass(frozen=True)
class Finding:
    check: str
    level: str
    found: str
    required: str
    fix: str

    def __post_init__(self) -> None:
        if self.level not in LEVELS:
            raise ValueError(f"level {self.level!r} is not one of {LEVELS}")


def has_failures(findings: Iterable[Finding]) -> bool:
    return any(f.level == "fail" for f in findings)


def run_checks(facts: Facts, plan: Plan, settings: Settings) -> list[Finding]:
    findings = [check_gpu_visible(facts)]
    gpu = plan.gpu
    if gpu is not None:
        findings += [
            check_driver(facts),
            check_capability(gpu),
            check_dtype(plan, gpu, facts.model),
            check_gpu_memory_free(gpu, settings),
            check_sizing(plan),
        ]
        if plan.sized_as is not None and facts.gpu.devices:
            findings.append(check_size_as(facts.gpu.devices[0], gpu, plan.sized_as))
    findings.append(check_manifest(facts.manifest))
    if facts.manifest.present:
        findings.append(check_torch_cuda(facts.manifest))
        # An empty arch list is a CPU build, which torch-cuda reports with its fix.
        if gpu is not None and facts.manifest.torch_arch_list:
            findings.append(check_torch_arch(facts.manifest, gpu))
    if gpu is not None:
        findings.append(check_clamp(facts.manifest, plan, gpu))
    findings += [
        check_shm(facts.host),
        check_host_memory(facts, settings),
        *check_disks(facts, plan),
        check_model(facts, settings),
        *check_ports(facts.host, settings),
        check_telemetry(plan, facts.host),
    ]
    return findings


def check_gpu_visible(facts: Facts) -> Finding:
    gpu = facts.gpu
    visible = ", ".join(f"{k}={v}" for k, v in sorted(gpu.visible_devices_env.items())) or (
        "NVIDIA_VISIBLE_DEVICES and CUDA_VISIBLE_DEVICES not set"
    )
    required = "one NVIDIA GPU visible in the container through NVML"
    if not gpu.nvml_available:
        return Finding("gpu", "fail", f"NVML unavailable: {gpu.error or 'no reason given'} ({visible})", required,
                       NO_GPU_FIX)  # fmt: skip
    if not gpu.devices:
        why = f": {gpu.error}" if gpu.error else ""
        return Finding(
            "gpu",
            "fail",
            f"NVML loaded (driver {gpu.driver_version}) but no device is visible{why} ({visible})",
            required,
            NO_GPU_FIX + "; check that NVIDIA_VISIBLE_DEVICES / CUDA_VISIBLE_DEVICES name an existing GPU",
        )
    first = gpu.devices[0]
    more = f" (device 0 of {len(gpu.devices)})" if len(gpu.devices) > 1 else ""
    return Finding("gpu", "ok", f"{first.name}{more}", required, "")


def _version_tuple(text: str | None) -> tuple[int, ...] | None:
    if not text:
        return None
    parts = re.findall(r"\d+", text)
    return tuple(int(p) for p in parts[:2]) if parts else None


def check_driver(facts: Facts) -> Finding:
    torch_cuda = _version_tuple(facts.manifest.torch_cuda_version) or DEFAULT_TORCH_CUDA
    need_cuda = f"{torch_cuda[0]}.{torch_cuda[1] if len(torch_cuda) > 1 else 0}"
    min_driver = MIN_DRIVER_FOR_CUDA.get(torch_cuda[0], MIN_DRIVER_FOR_CUDA[13])
    required = f"driver >= {min_driver} (torch is built for CUDA {need_cuda})"
    driver = facts.gpu.driver_version
    cuda = facts.gpu.cuda_driver_version
    found = f"driver {driver or 'unknown'}" + (f", supports CUDA up to {cuda[0]}.{cuda[1]}" if cuda else "")
    fix = f"upgrade the host's NVIDIA driver to {min_driver} or newer (`nvidia-smi` shows the running one)"
    major = _version_tuple(driver)
    if major is None and cuda is None:
        return Finding("driver", "warn", found, required, "check `nvidia-smi` on the host")
    too_old = (major is not None and major[0] < min_driver) or (cuda is not None and cuda < torch_cuda[:2])
    return Finding("driver", "fail" if too_old else "ok", found, required, fix if too_old else "")


def check_capability(gpu: GpuDevice) -> Finding:
    found = f"{gpu.name}: compute capability {format_capability(gpu.compute_capability)}"
    required = f"compute capability >= {format_capability(MIN_CAPABILITY)} (Turing or newer)"
    if gpu.compute_capability < MIN_CAPABILITY:
        return Finding(
            "capability",
            "fail",
            found,
            required,
            "use a Turing or newer GPU (T4, RTX 20xx, Quadro RTX, A10G, L4, ...): torch's CUDA 13 build and vLLM's "
            "kernels start at sm_75",
        )
    return Finding("capability", "ok", found, required, "")


def check_dtype(plan: Plan, gpu: GpuDevice, model: ModelFacts | None = None) -> Finding:
    found = f"--dtype {plan.dtype} ({plan.dtype_reason}) on capability {format_capability(gpu.compute_capability)}"
    required = f"bfloat16 only on capability >= {format_capability(BF16_MIN_CAPABILITY)}"
    if plan.dtype == "bfloat16" and gpu.compute_capability < BF16_MIN_CAPABILITY:
        return Finding(
            "dtype",
            "fail",
            found,
            required + f": {format_capability(gpu.compute_capability)} has no bfloat16 datapath",
            "set T4SERVE_DTYPE=auto (float16 on Turing) or T4SERVE_DTYPE=float16",
        )
    refusal = float16_refusal(model)
    if plan.dtype == "float16" and refusal is not None:
        return Finding(
            "dtype",
            "fail",
            found + f", model type {model_type(model)}",
            f"a dtype vLLM runs this model in: {refusal} (vLLM's words)",
            f"set T4SERVE_DTYPE=auto (bfloat16 from capability {format_capability(BF16_MIN_CAPABILITY)}, float32 "
            "below) or T4SERVE_DTYPE=float32",
        )
    return Finding("dtype", "ok", found, required, "")


def check_gpu_memory_free(gpu: GpuDevice, settings: Settings) -> Finding:
    # vLLM refuses to start when free memory is below total x utilization (vllm/v1/worker/utils.py).
    want = math.ceil(gpu.memory_total_bytes * settings.gpu_memory_utilization)
    found = f"{format_bytes(gpu.memory_free_bytes)} free of {format_bytes(gpu.memory_total_bytes)}"
    required = (
        f"free >= total x T4SERVE_GPU_MEMORY_UTILIZATION = {format_bytes(gpu.memory_total_bytes)} x "
        f"{settings.gpu_memory_utilization} = {format_bytes(want)}"
    )
    if gpu.memory_free_bytes < want:
        fits = math.floor(gpu.memory_free_bytes / gpu.memory_total_bytes * 100) / 100
        return Finding(
            "gpu-memory",
            "fail",
            found,
            required,
            f"stop the other processes on the GPU (`nvidia-smi` lists them), or set "
            f"T4SERVE_GPU_MEMORY_UTILIZATION={fits:.2f}",
        )
    return Finding("gpu-memory", "ok", found, required, "")


def check_size_as(real: GpuDevice, planned: GpuDevice, key: str) -> Finding:
    """T4SERVE_SIZE_AS shrinks a card to a smaller one; it cannot grow one."""
    found = f"T4SERVE_SIZE_AS={key}: {format_bytes(planned.memory_total_bytes)} on {real.name} with " \
            f"{format_bytes(real.memory_total_bytes)}"
    required = "the real card at least as large as the card it is sized as"
    if real.memory_total_bytes < planned.memory_total_bytes:
        return Finding("size-as", "fail", found, required,
                       "unset T4SERVE_SIZE_AS, or name a card no larger than this one (e.g. t4)")
    return Finding("size-as", "ok", found, required, "")


# Cards up to this size (a T4's 15 GiB, the 16 GiB class) are where vLLM's profile run itself reached the card's limit
# on the GPU host (docs/verification.md, "the profiled pool at a T4's memory").
PROFILE_RISK_MAX_BYTES = 16 * GIB


def check_sizing(plan: Plan) -> Finding:
    required = "weights, activations and a KV cache that holds one max-length request within the GPU budget"
    if plan.sizing is None:
        return Finding(
            "sizing",
            "fail",
            plan.sizing_error or "sizing did not run",
            required,
            "lower T4SERVE_MAX_MODEL_LEN, use T4SERVE_MODEL=qat, or raise T4SERVE_GPU_MEMORY_UTILIZATION",
        )
    s = plan.sizing
    memory = plan.gpu.memory_total_bytes if plan.gpu is not None else 0
    if s.kv_cache_memory_bytes is None and 0 < memory <= PROFILE_RISK_MAX_BYTES:
        return Finding(
            "sizing",
            "warn",
            f"T4SERVE_KV_CACHE_MEMORY_BYTES=profile on {memory / GIB:.1f} GiB: vLLM measures the pool during a "
            "profile run that can reach this card's limit, and then sizes the pool too large (GPU host, vLLM 0.33.0, "
            "a T4's 15 GiB: 271 allocator out-of-memory retries, a measured activation peak of 0.29 GiB against "
            "0.57 GiB with memory to spare, a pool of 3.20 GiB against t4serve's 2.81, and 8 MB of the card left "
            f"free); t4serve's own plan: {s.kv_tokens.format_value()} tokens",
            f"a KV pool that leaves the card headroom at its peak (t4serve's explicit pool left 1.1 GB on the same "
            f"card); on cards above {PROFILE_RISK_MAX_BYTES / GIB:.0f} GiB profiling is as safe as vLLM makes it",
            "unset T4SERVE_KV_CACHE_MEMORY_BYTES (t4serve passes its planned pool), or give an explicit size "
            "(e.g. 2.5GiB)",
        )
    return Finding(
        "sizing",
        "ok",
        f"KV cache {s.kv_tokens.format_value()} tokens, {s.concurrency.format_value()}x at "
        f"{s.max_model_len.format_value()} tokens",
        required,
        "",
    )


def check_manifest(manifest: BuildManifest) -> Finding:
    required = "the build manifest the t4serve image writes (torch, CUDA, arch list, vLLM, clamp proof)"
    if not manifest.present or manifest.error:
        return Finding(
            "manifest",
            "fail",
            manifest.error
            if manifest.error and manifest.path in manifest.error
            else f"{manifest.path}: " + (manifest.error or "missing"),
            required,
            "run t4serve inside the t4serve image, or set T4SERVE_MANIFEST to the image's build manifest",
        )
    return Finding(
        "manifest",
        "ok",
        f"{manifest.path}: torch {manifest.torch_version}, vLLM {manifest.vllm_version}",
        required,
        "",
    )


def check_torch_cuda(manifest: BuildManifest) -> Finding:
    found = f"torch {manifest.torch_version}, CUDA {manifest.torch_cuda_version or 'none'}, arch list " + (
        " ".join(manifest.torch_arch_list) or "empty"
    )
    required = "a CUDA build of torch (torch.version.cuda set, a non-empty arch list)"
    if not manifest.torch_cuda_version or not manifest.torch_arch_list:
        return Finding(
            "torch-cuda",
            "fail",
            found + ": a CPU build of torch (vLLM's CUDA kernels then fail on libcudart.so.13)",
            required,
            "rebuild the image from docker/ (its lock pins PyPI's CUDA 13.0 torch); never install torch from the "
            "CPU index or with --no-deps",
        )
    return Finding("torch-cuda", "ok", found, required, "")


def check_torch_arch(manifest: BuildManifest, gpu: GpuDevice) -> Finding:
    cap = gpu.compute_capability
    found = f"torch arch list {' '.join(manifest.torch_arch_list) or '(empty)'}; GPU sm_{cap[0]}{cap[1]}"
    required = f"a kernel image for sm_{cap[0]}{cap[1]} (sm_{cap[0]}x with x <= {cap[1]}, or PTX at or below it)"
    if not arch_supported(manifest.torch_arch_list, cap):
        return Finding(
            "torch-arch",
            "fail",
            found,
            required,
            "rebuild the image with a torch compiled for this GPU (PyPI's torch 2.14.0 cu130 wheel covers sm_75 to "
            "sm_120)",
        )
    return Finding("torch-arch", "ok", found, required, "")


def check_clamp(manifest: BuildManifest, plan: Plan, gpu: GpuDevice) -> Finding:
    required = "the Turing clamp applied to vLLM's Triton attention where the device needs it"
    rebuild = (
        "rebuild the image (its build applies the clamp and proves it); never `pip install vllm` inside it: "
        "reinstalling vLLM silently removes the clamp"
    )
    if not plan.clamp_needed:
        return Finding("clamp", "ok", f"not needed: {plan.clamp_reason}", required, "")
    clamp = manifest.clamp
    needed = f"needed ({plan.clamp_reason})"
    if not manifest.present or clamp is None:
        return Finding("clamp", "fail", f"{needed}; the build manifest records no clamp", required, rebuild)
    if clamp.state not in ("applied", "not-needed"):
        return Finding(
            "clamp",
            "fail",
            f"{needed}; clamp state {clamp.state!r} (vLLM fails with 'Hardware limit: 65536')",
            required,
            rebuild,
        )
    if manifest.vllm_version and clamp.vllm_version != manifest.vllm_version:
        return Finding(
            "clamp",
            "fail",
            f"{needed}; clamp proven for vLLM {clamp.vllm_version} but vLLM {manifest.vllm_version} is installed",
            required,
            rebuild,
        )
    over = {k: v for k, v in clamp.shared_memory.items() if v > gpu.shared_memory_per_block}
    if over:
        worst = max(over, key=lambda k: over[k])
        return Finding(
            "clamp",
            "fail",
            f"{needed}; the proof's kernel {worst} needs {over[worst]:,} B > {gpu.shared_memory_per_block:,} B "
            "per block on this device: the clamp is not effective here",
            required,
            rebuild,
        )
    proof = f", kernels proven at {max(clamp.shared_memory.values()):,} B max" if clamp.shared_memory else ""
    return Finding("clamp", "ok", f"{needed}; state {clamp.state} for vLLM {clamp.vllm_version}{proof}", required, "")


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
    estimate = hostmem.estimate(model, facts.host)
    need = estimate.need_bytes
    usable = estimate.available_bytes
    found = f"{usable.format_value()} usable ({usable.how})" if usable else "host memory not read"
    required = f"{need.format_value()} to load {model.requested} ({need.how})"
    add = int(estimate.swap_to_add_bytes.value)
    if add <= 0:
        return Finding("host-memory", "ok", found, required, "")
    host = facts.host
    limit = host.cgroup_memory_limit_bytes
    if limit is not None and limit + (host.cgroup_swap_limit_bytes or 0) < need.value:
        # Swap on the host does not help past the container's own limit.
        fix = (
            f"raise the container's memory limit to at least {_gib_ceil(int(need.value))}G "
            "(`docker run --memory/--memory-swap`, compose `mem_limit`/`memswap_limit`)"
        )
    else:
        fix = f"add swap on the host: `sudo scripts/setup-swap {_gib_ceil(add)}G`"
    if settings.model.target != QAT_REPO:
        fix += ", or set T4SERVE_MODEL=qat (int4 weights need less host memory to load)"
    short = int(need.value) - int(usable.value) if usable else int(need.value)
    return Finding("host-memory", "fail", found + f"; {format_bytes(short)} short", required, fix)


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


def check_model(facts: Facts, settings: Settings) -> Finding:
    model = facts.model
    required = "the checkpoint local, or downloadable (HF_HUB_OFFLINE=0)"
    if model is None:
        return Finding("model", "warn", "model not probed", required, "run `t4serve probe` to read the checkpoint")
    if model.source == "invalid":
        return Finding(
            "model",
            "fail",
            f"{model.requested}: {model.error}",
            "a readable checkpoint (config.json and safetensors)",
            "point T4SERVE_MODEL at a complete checkpoint directory, or at a repo id to download",
        )
    if model.source not in NOT_LOCAL_SOURCES:
        return Finding("model", "ok", f"{model.requested}: local at {model.local_path}", required, "")
    if settings.hf_hub_offline:
        return Finding(
            "model",
            "fail",
            f"{model.requested} is not in {settings.hf_home} and HF_HUB_OFFLINE=1",
            required,
            "set HF_HUB_OFFLINE=0 for the first start (it downloads once into HF_HOME's volume), or mount a "
            "checkpoint and set T4SERVE_MODEL=/path/to/it",
        )
    if settings.hf_token is None and model.requested.startswith("google/gemma"):
        return Finding(
            "model",
            "warn",
            f"{model.requested} will be downloaded, and no HF_TOKEN / HF_TOKEN_FILE is set",
            "a token for gated checkpoints (Gemma's license must be accepted on huggingface.co)",
            "set HF_TOKEN_FILE to a file holding your token (compose: the hf_token secret)",
        )
    return Finding("model", "ok", f"{model.requested}: will be downloaded into {settings.hf_home}", required, "")


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


def format_table(findings: list[Finding]) -> str:
    """Human table: one line per finding; failures and warnings add what is required and the fix."""
    width = max((len(f.check) for f in findings), default=5)
    lines = []
    for f in findings:
        lines.append(f"{f.level.upper():<4}  {f.check:<{width}}  {f.found}")
        if f.level != "ok":
            pad = " " * (6 + width + 2)
            lines.append(f"{pad}required: {f.required}")
            if f.fix:
                lines.append(f"{pad}fix: {f.fix}")
    fails = sum(f.level == "fail" for f in findings)
    warns = sum(f.level == "warn" for f in findings)
    lines.append(f"{fails} failed, {warns} warnings, {len(findings) - fails - warns} ok")
    return "\n".join(lines)


def to_json(findings: list[Finding]) -> str:
    return json.dumps([asdict(f) for f in findings], indent=2) + "\n"
