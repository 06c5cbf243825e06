"""What the probes found on a machine, as plain frozen dataclasses that serialize to JSON and back.

This module is the contract between probes (which read the machine) and plan/preflight (which decide). It holds no
logic that reads anything: `Facts.to_json()` records a machine, `Facts.from_json()` replays it.
Sizes are bytes, clocks MHz, power watts. `None` means "could not be read", with the reason beside it. Each field
declares the bounds a machine gives it (t4serve.serde's marks), so a recording is read back only within them; the
model's config inside a recording is checked as a checkpoint's is (t4serve.pipeline.load_facts).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Annotated, Any

from t4serve.serde import Items, OneOf, Range, Text, from_dict, to_dict
from t4serve.untrusted import PATH_MAX_BYTES, loads_json

FACTS_SCHEMA = 1
# The bounds of what a machine reports: a size up to 1 EiB, a count of CPUs or GPUs, power, clocks, a port.
Bytes = Annotated[int, Range(0, 1 << 60)]
Watts = Annotated[float, Range(0.0, 100_000.0)]
Mhz = Annotated[int, Range(0, 1_000_000)]
Port = Annotated[int, Range(0, 65535)]
Version = Annotated[tuple[Annotated[int, Range(0, 999)], Annotated[int, Range(0, 999)]], Items(2, 2)]
Name = Annotated[str, Text(256, lines=False)]
PathText = Annotated[str, Text(PATH_MAX_BYTES, lines=False)]
Note = Annotated[str, Text(8000, lines=True)]


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
    index: Annotated[int, Range(0, 1023)]
    name: Name
    uuid: Name
    compute_capability: Version
    memory_total_bytes: Bytes
    memory_free_bytes: Bytes
    # Opt-in shared memory per block: NVML does not report it, so the probe derives it from the compute capability
    # (t4serve.gpus.shared_memory_per_block_optin); it decides whether the Turing clamp is needed.
    shared_memory_per_block: Annotated[int, Range(0, 1 << 24)]
    power_limit_w: Watts | None
    power_max_limit_w: Watts | None
    sm_clock_max_mhz: Mhz | None
    memory_clock_max_mhz: Mhz | None
    pci_bus_id: Name | None = None
    # Field name -> why NVML could not read it (e.g. power limits "Not Supported" on some boards), for each None above.
    unreadable: Annotated[dict[Name, Note], Items(0, 64)] = field(default_factory=dict)


@dataclass(frozen=True)
class GpuFacts:
    nvml_available: bool
    # Why NVML or the devices could not be read (library missing, no device visible, driver error), else None.
    error: Note | None
    driver_version: Name | None
    # The newest CUDA version the driver supports, e.g. (13, 0).
    cuda_driver_version: Version | None
    devices: Annotated[list[GpuDevice], Items(0, 64)] = field(default_factory=list)
    # NVIDIA_VISIBLE_DEVICES / CUDA_VISIBLE_DEVICES as seen, to explain an empty device list.
    visible_devices_env: Annotated[dict[Name, Note], Items(0, 16)] = field(default_factory=dict)


@dataclass(frozen=True)
class DiskFacts:
    # What the server writes there: "hf_cache", "compile_cache", "triton_cache", "inductor_cache", "tmp", "state".
    role: Name
    path: PathText
    # The nearest existing folder at or above `path`, which is where free space was measured.
    measured_at: PathText
    free_bytes: Bytes | None
    total_bytes: Bytes | None
    writable: bool
    # Device id of the filesystem, so two roles on one filesystem are not counted twice.
    filesystem_id: Annotated[int, Range(0, (1 << 63) - 1)] | None
    fs_type: Name | None = None
    # Why the sizes and device id above are None: the folder could not be measured (statvfs or stat failed).
    unreadable: Note | None = None


@dataclass(frozen=True)
class HostFacts:
    cpu_count: Annotated[int, Range(0, 1 << 20)]
    # From /proc/meminfo; None when it could not be read, with the reason in meminfo_unreadable.
    mem_total_bytes: Bytes | None
    mem_available_bytes: Bytes | None
    swap_total_bytes: Bytes | None
    swap_free_bytes: Bytes | None
    # The container's memory limit from cgroup v2 memory.max or v1 memory.limit_in_bytes; None when unlimited.
    cgroup_version: Annotated[int, OneOf((1, 2))] | None
    cgroup_memory_limit_bytes: Bytes | None
    cgroup_swap_limit_bytes: Bytes | None
    shm_total_bytes: Bytes | None
    shm_free_bytes: Bytes | None
    disks: Annotated[list[DiskFacts], Items(0, 64)] = field(default_factory=list)
    # Ports that could not be bound when probed (each once), for the port-in-use finding.
    ports_in_use: Annotated[list[Port], Items(0, 64)] = field(default_factory=list)
    # How cpu_count was reached: the affinity mask and the cgroup CPU quota that capped it.
    cpu_count_how: Note | None = None
    # The cgroup file whose limit became cgroup_memory_limit_bytes (the tightest on the path up), for messages.
    cgroup_memory_limit_file: PathText | None = None
    # "host:port" -> why binding it failed (ADDRESS_IN_USE, permission denied), for each port in ports_in_use.
    port_bind_errors: Annotated[dict[Name, Note], Items(0, 64)] = field(default_factory=dict)
    # What the probe could not read (a cgroup file, mountinfo), so a None above comes with its reason.
    probe_notes: Annotated[list[Note], Items(0, 256)] = field(default_factory=list)
    # Why a memory figure above is None: /proc/meminfo unreadable, or lacking the key (Linux before 3.14).
    meminfo_unreadable: Note | None = None


@dataclass(frozen=True)
class ClampProof:
    """What the build proved about the Turing attention clamp (see t4serve.patch)."""

    # "applied" (patched and proven), "not-needed" (vLLM already clamps), "absent" (not applied).
    state: Annotated[str, OneOf(("applied", "not-needed", "absent"))]
    vllm_version: Name
    target: PathText
    source_sha256: Name
    # kernel label -> shared memory bytes compiled for sm_75, e.g. {"2d/prefill/head512/tile16": 65536}.
    shared_memory: Annotated[dict[Name, Annotated[int, Range(0, 1 << 24)]], Items(0, 1000)] = field(
        default_factory=dict)
    # The unpatched choice's need for head 512 prefill (98,304 on vLLM 0.34): the proof the clamp mattered.
    unpatched_shared_memory: Annotated[int, Range(0, 1 << 24)] | None = None
    interpreter_max_abs_error: Annotated[float, Range(0.0, 1e6)] | None = None


@dataclass(frozen=True)
class TuringAttentionProof:
    """What the image build proved about t4serve's Turing attention (t4serve.turing.proof), as the probe read it from
    the proof file beside the build manifest."""

    path: PathText
    present: bool
    error: Note | None = None
    vllm_version: Name | None = None
    # The table's launches proven for sm_75, and those on tensor cores (HMMA in their SASS).
    launches: Annotated[int, Range(0, 1 << 20)] = 0
    tensor_core_launches: Annotated[int, Range(0, 1 << 20)] = 0
    # Padded head sizes and KV caches ("16-bit", "int8") every phase of the table covers.
    padded_heads: Annotated[list[Annotated[int, Range(1, 1 << 20)]], Items(0, 64)] = field(default_factory=list)
    kv_caches: Annotated[list[Name], Items(0, 16)] = field(default_factory=list)
    largest_shared_memory_bytes: Annotated[int, Range(0, 1 << 24)] = 0
    most_spill_bytes: Annotated[int, Range(0, 1 << 30)] = 0


@dataclass(frozen=True)
class BuildManifest:
    path: PathText
    present: bool
    error: Note | None = None
    base_image: Name | None = None
    python_version: Name | None = None
    torch_version: Name | None = None
    torch_cuda_version: Name | None = None
    torch_arch_list: Annotated[list[Name], Items(0, 64)] = field(default_factory=list)
    vllm_version: Name | None = None
    triton_version: Name | None = None
    transformers_version: Name | None = None
    t4serve_version: Name | None = None
    built_at: Name | None = None
    clamp: ClampProof | None = None


@dataclass(frozen=True)
class TensorGroup:
    """Bytes of the checkpoint's tensors in one part of the model, by dtype."""

    part: Name
    tensors: Annotated[int, Range(0, 1 << 31)]
    bytes_by_dtype: Annotated[dict[Name, Annotated[int, Range(0, 1 << 50)]], Items(0, 64)]

    @property
    def total_bytes(self) -> int:
        return sum(self.bytes_by_dtype.values())


@dataclass(frozen=True)
class ModelFacts:
    # What the user asked for (alias expanded): an HF repo id or a local path.
    requested: PathText
    # Local directory holding config.json when found (a plain folder or an HF cache snapshot), else None.
    local_path: PathText | None
    # "local-dir", "hf-cache", "not-local" (will be downloaded), "builtin" (an alias's shipped facts), or "invalid"
    # with `error`.
    source: Annotated[str, OneOf(("local-dir", "hf-cache", "not-local", "builtin", "invalid"))]
    error: Note | None = None
    # The parts of config.json that planning uses, copied verbatim (text_config flattened under "text").
    config: dict[str, Any] = field(default_factory=dict)
    # "compressed-tensors" etc., from config.json's quantization_config.quant_method; None for plain weights.
    quantization: Name | None = None
    safetensors_files: Annotated[int, Range(0, 1 << 20)] = 0
    weights: Annotated[list[TensorGroup], Items(0, 64)] = field(default_factory=list)

    @property
    def weight_bytes(self) -> int:
        return sum(g.total_bytes for g in self.weights)


@dataclass(frozen=True)
class Facts:
    schema: Annotated[int, OneOf((FACTS_SCHEMA,))]
    t4serve_version: Name
    recorded_at: Name
    hostname: Name
    gpu: GpuFacts
    host: HostFacts
    manifest: BuildManifest
    model: ModelFacts | None = None
    # How this record came to be: "probed" on this machine, or e.g. "constructed from published-t4-run.md" for a shipped
    # file.
    provenance: Note = "probed"
    # The variables of VLLM_ENV_FOR_PLAN set in the environment the server inherits, as found (never a secret).
    vllm_env: Annotated[dict[Annotated[str, OneOf(VLLM_ENV_FOR_PLAN)], Name], Items(0, 16)] = field(
        default_factory=dict)
    # The image's proof of its Turing attention launches (None where not probed: a record made before it existed).
    turing_attention: TuringAttentionProof | None = None
    # The drafter T4SERVE_SPECULATIVE=mtp drafts with (t4serve.probes.drafter), probed in its role; None without one.
    drafter: ModelFacts | None = None

    def to_json(self) -> str:
        return json.dumps(to_dict(self), indent=2, sort_keys=False) + "\n"

    @classmethod
    def from_json(cls, text: str) -> Facts:
        return from_dict(cls, loads_json(text, "the facts"))
