"""The probes: the only code that reads the machine. `collect_facts(...)` runs them all and returns one `Facts`.

Each probe takes its inputs explicitly (environment mapping, /proc and /sys roots, paths, ports, the NVML module) and
records; none decides. The model probe lives in t4serve.probes.checkpoint: its `ModelFacts` is passed in.
"""

from __future__ import annotations

import socket
from collections.abc import Collection, Mapping
from datetime import UTC, datetime

from t4serve import __version__
from t4serve.facts import (
    FACTS_SCHEMA,
    VLLM_ENV_FOR_PLAN,
    BuildManifest,
    Facts,
    GpuFacts,
    HostFacts,
    ModelFacts,
    TuringAttentionProof,
)
from t4serve.probes.gpu import Nvml, probe_gpu
from t4serve.probes.host import probe_host
from t4serve.probes.manifest import probe_manifest, probe_turing_proof

__all__ = ["collect_facts", "probe_gpu", "probe_host", "probe_manifest", "probe_turing_proof", "recorded_now"]


def recorded_now(
    *, gpu: GpuFacts, host: HostFacts, manifest: BuildManifest, model: ModelFacts | None, provenance: str,
    vllm_env: Mapping[str, str] | None = None, turing_attention: TuringAttentionProof | None = None,
) -> Facts:
    """A Facts record of this machine, now: the schema, t4serve's version, the time and the host name stamped."""
    return Facts(
        schema=FACTS_SCHEMA,
        t4serve_version=__version__,
        recorded_at=datetime.now(UTC).isoformat(timespec="seconds"),
        hostname=socket.gethostname(),
        gpu=gpu,
        host=host,
        manifest=manifest,
        model=model,
        provenance=provenance,
        vllm_env=dict(vllm_env or {}),
        turing_attention=turing_attention,
    )


def collect_facts(
    *,
    environ: Mapping[str, str],
    disk_paths: Mapping[str, str],
    ports: list[tuple[str, int]],
    manifest_path: str,
    model: ModelFacts | None,
    proc_root: str = "/proc",
    sys_root: str = "/sys",
    shm_path: str = "/dev/shm",
    nvml: Nvml | None = None,
    affinity: Collection[int] | None = None,
) -> Facts:
    """Probe this machine. `disk_paths` maps a write role ("hf_cache", "compile_cache", "tmp", "state") to the path
    the server writes; `ports` are the (host, port) pairs it will bind; `nvml=None` imports pynvml."""
    return recorded_now(
        gpu=probe_gpu(environ, nvml),
        host=probe_host(
            disk_paths=disk_paths,
            ports=ports,
            proc_root=proc_root,
            sys_root=sys_root,
            shm_path=shm_path,
            affinity=affinity,
        ),
        manifest=probe_manifest(manifest_path),
        model=model,
        provenance="probed",
        vllm_env={name: environ[name] for name in VLLM_ENV_FOR_PLAN if name in environ},
        turing_attention=probe_turing_proof(manifest_path),
    )
