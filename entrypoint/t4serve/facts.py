"""What the probes found on a machine, as plain frozen dataclasses that serialize to JSON and back.

This module is the contract between probes (which read the machine) and plan/preflight (which decide). It holds no
logic that reads anything: `Facts.to_json()` records a machine, `Facts.from_json()` replays it.
Sizes are bytes, clocks MHz, power watts. `None` means "could not be read", with the reason beside it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from t4serve.serde import from_dict, to_dict

FACTS_SCHEMA = 1


# vLLM's own variables that change what the plan may ask of it, recorded so a replayed machine plans alike:
# VLLM_ALLOW_LONG_MAX_MODEL_LEN lets max_model_len exceed the model's derived maximum (vllm/envs.py).
VLLM_ENV_FOR_PLAN = ("VLLM_ALLOW_LONG_MAX_MODEL_LEN",)


def vllm_env_true(value: str | None) -> bool:
    """vllm/envs.py's reading of a switch such as VLLM_ALLOW_LONG_MAX_MODEL_LEN: "1" or "true", trimmed, any case."""
    return value is not None and value.strip().lower() in ("1", "true")


# HostFacts.port_bind_errors' reason for a port another listener holds (any other reason is the address's).
ADDRESS_IN_USE = "address already in use"


@dataclass(frozen=True)
class GpuDevice:
    index: int
    name: str
    uuid: str
    compute_capability: tuple[int, int]
    memory_total_bytes: int
    memory_free_bytes: int
    # Opt-in shared memory per block: NVML does not report it, so the probe derives it from the compute capability
    # (t4serve.gpus.shared_memory_per_block_optin); it decides whether the Turing clamp is needed.
    shared_memory_per_block: int
    power_limit_w: float | None
    power_max_limit_w: float | None
    sm_clock_max_mhz: int | None
    memory_clock_max_mhz: int | None
    pci_bus_id: str | None = None
    # Field name -> why NVML could not read it (e.g. power limits "Not Supported" on some boards), for each None above.
    unreadable: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class GpuFacts:
    nvml_available: bool
    # Why NVML or the devices could not be read (library missing, no device visible, driver error), else None.
    error: str | None
    driver_version: str | None
    # The newest CUDA version the driver supports, e.g. (13, 0).
    cuda_driver_version: tuple[int, int] | None
    devices: list[GpuDevice] = field(default_factory=list)
    # NVIDIA_VISIBLE_DEVICES / CUDA_VISIBLE_DEVICES as seen, to explain an empty device list.
    visible_devices_env: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class DiskFacts:
    # What the server writes there: "hf_cache", "compile_cache", "triton_cache", "inductor_cache", "tmp", "state".
    role: str
    path: str
    # The nearest existing folder at or above `path`, which is where free space was measured.
    measured_at: str
    free_bytes: int | None
    total_bytes: int | None
    writable: bool
    # Device id of the filesystem, so two roles on one filesystem are not counted twice.
    filesystem_id: int | None
    fs_type: str | None = None
    # Why the sizes and device id above are None: the folder could not be measured (statvfs or stat failed).
    unreadable: str | None = None


@dataclass(frozen=True)
class HostFacts:
    cpu_count: int
    # From /proc/meminfo; None when it could not be read, with the reason in meminfo_unreadable.
    mem_total_bytes: int | None
    mem_available_bytes: int | None
    swap_total_bytes: int | None
    swap_free_bytes: int | None
    # The container's memory limit from cgroup v2 memory.max or v1 memory.limit_in_bytes; None when unlimited.
    cgroup_version: int | None
    cgroup_memory_limit_bytes: int | None
    cgroup_swap_limit_bytes: int | None
    shm_total_bytes: int | None
    shm_free_bytes: int | None
    disks: list[DiskFacts] = field(default_factory=list)
    # Ports that could not be bound when probed (each once), for the port-in-use finding.
    ports_in_use: list[int] = field(default_factory=list)
    # How cpu_count was reached: the affinity mask and the cgroup CPU quota that capped it.
    cpu_count_how: str | None = None
    # The cgroup file whose limit became cgroup_memory_limit_bytes (the tightest on the path up), for messages.
    cgroup_memory_limit_file: str | None = None
    # "host:port" -> why binding it failed (ADDRESS_IN_USE, permission denied), for each port in ports_in_use.
    port_bind_errors: dict[str, str] = field(default_factory=dict)
    # What the probe could not read (a cgroup file, mountinfo), so a None above comes with its reason.
    probe_notes: list[str] = field(default_factory=list)
    # Why a memory figure above is None: /proc/meminfo unreadable, or lacking the key (Linux before 3.14).
    meminfo_unreadable: str | None = None


@dataclass(frozen=True)
class ClampProof:
    """What the build proved about the Turing attention clamp (see t4serve.patch)."""

    # "applied" (patched and proven), "not-needed" (vLLM already clamps), "absent" (not applied).
    state: str
    vllm_version: str
    target: str
    source_sha256: str
    # kernel label -> shared memory bytes compiled for sm_75, e.g. {"2d/prefill/head512/tile16": 65536}.
    shared_memory: dict[str, int] = field(default_factory=dict)
    # The unpatched choice's need for head 512 prefill (98,304 on vLLM 0.34): the proof the clamp mattered.
    unpatched_shared_memory: int | None = None
    interpreter_max_abs_error: float | None = None


@dataclass(frozen=True)
class TuringAttentionProof:
    """What the image build proved about t4serve's Turing attention (t4serve.turing.proof), as the probe read it from
    the proof file beside the build manifest."""

    path: str
    present: bool
    error: str | None = None
    vllm_version: str | None = None
    # The table's launches proven for sm_75, and those on tensor cores (HMMA in their SASS).
    launches: int = 0
    tensor_core_launches: int = 0
    # Padded head sizes and KV caches ("16-bit", "int8") every phase of the table covers.
    padded_heads: list[int] = field(default_factory=list)
    kv_caches: list[str] = field(default_factory=list)
    largest_shared_memory_bytes: int = 0
    most_spill_bytes: int = 0


@dataclass(frozen=True)
class BuildManifest:
    path: str
    present: bool
    error: str | None = None
    base_image: str | None = None
    python_version: str | None = None
    torch_version: str | None = None
    torch_cuda_version: str | None = None
    torch_arch_list: list[str] = field(default_factory=list)
    vllm_version: str | None = None
    triton_version: str | None = None
    transformers_version: str | None = None
    t4serve_version: str | None = None
    built_at: str | None = None
    clamp: ClampProof | None = None


@dataclass(frozen=True)
class TensorGroup:
    """Bytes of the checkpoint's tensors in one part of the model, by dtype."""

    part: str
    tensors: int
    bytes_by_dtype: dict[str, int]

    @property
    def total_bytes(self) -> int:
        return sum(self.bytes_by_dtype.values())


@dataclass(frozen=True)
class ModelFacts:
    # What the user asked for (alias expanded): an HF repo id or a local path.
    requested: str
    # Local directory holding config.json when found (a plain folder or an HF cache snapshot), else None.
    local_path: str | None
    # "local-dir", "hf-cache", "not-local" (will be downloaded), or "invalid" with `error`.
    source: str
    error: str | None = None
    # The parts of config.json that planning uses, copied verbatim (text_config flattened under "text").
    config: dict[str, Any] = field(default_factory=dict)
    # "compressed-tensors" etc., from config.json's quantization_config.quant_method; None for plain weights.
    quantization: str | None = None
    safetensors_files: int = 0
    weights: list[TensorGroup] = field(default_factory=list)

    @property
    def weight_bytes(self) -> int:
        return sum(g.total_bytes for g in self.weights)


@dataclass(frozen=True)
class Facts:
    schema: int
    t4serve_version: str
    recorded_at: str
    hostname: str
    gpu: GpuFacts
    host: HostFacts
    manifest: BuildManifest
    model: ModelFacts | None = None
    # How this record came to be: "probed" on this machine, or e.g. "constructed from published-t4-run.md" for a shipped
    # file.
    provenance: str = "probed"
    # The variables of VLLM_ENV_FOR_PLAN set in the environment the server inherits, as found (never a secret).
    vllm_env: dict[str, str] = field(default_factory=dict)
    # The image's proof of its Turing attention launches (None where not probed: a record made before it existed).
    turing_attention: TuringAttentionProof | None = None

    def to_json(self) -> str:
        return json.dumps(to_dict(self), indent=2, sort_keys=False) + "\n"

    @classmethod
    def from_json(cls, text: str) -> Facts:
        return from_dict(cls, json.loads(text))
