"""`t4serve probe [--json]`: read this machine and the checkpoint, print every fact.

`--json` prints exactly what `plan --facts FILE` and `preflight --facts FILE` replay; without it, a readable summary.
"""

from __future__ import annotations

import os

import click

from t4serve.config.options import settings_options
from t4serve.config.settings import Settings
from t4serve.facts import BuildManifest, Facts
from t4serve.pipeline import gather_facts
from t4serve.planning.derived import format_bytes


def _size(n: int | None) -> str:
    return "?" if n is None else format_bytes(n)


def describe_manifest(manifest: BuildManifest) -> str:
    if manifest.present:
        clamp = f", clamp {manifest.clamp.state}" if manifest.clamp else ", no clamp record"
        return (
            f"image:    torch {manifest.torch_version} (CUDA {manifest.torch_cuda_version}, "
            f"{' '.join(manifest.torch_arch_list)}), vLLM {manifest.vllm_version}{clamp}"
        )
    if manifest.error and manifest.path in manifest.error:
        return f"image:    {manifest.error}"  # the reason names the file already
    return f"image:    no build manifest at {manifest.path} ({manifest.error or 'missing'})"


def describe_facts(facts: Facts) -> str:
    """A human summary of the facts, one topic per line; `--json` is the complete record."""
    lines = [f"recorded {facts.recorded_at} on {facts.hostname} ({facts.provenance})"]
    gpu = facts.gpu
    if not gpu.nvml_available:
        lines.append(f"gpu:      NVML unavailable: {gpu.error}")
    elif not gpu.devices:
        lines.append(f"gpu:      driver {gpu.driver_version}, no device visible ({gpu.error or 'no reason given'})")
    for device in gpu.devices:
        cuda = f"CUDA {gpu.cuda_driver_version[0]}.{gpu.cuda_driver_version[1]}" if gpu.cuda_driver_version else ""
        lines.append(
            f"gpu {device.index}:    {device.name}, capability {device.compute_capability[0]}."
            f"{device.compute_capability[1]}, {format_bytes(device.memory_total_bytes)} "
            f"({format_bytes(device.memory_free_bytes)} free), {device.shared_memory_per_block:,} B shared memory "
            f"per block, power limit {device.power_limit_w} W, driver {gpu.driver_version} {cuda}".rstrip()
        )
    host = facts.host
    cgroup = (
        f", cgroup v{host.cgroup_version} limit {format_bytes(host.cgroup_memory_limit_bytes)}"
        if host.cgroup_memory_limit_bytes is not None
        else ""
    )
    lines.append(
        f"host:     {host.cpu_count} CPUs, RAM {_size(host.mem_total_bytes)} "
        f"({_size(host.mem_available_bytes)} available), swap {_size(host.swap_total_bytes)} "
        f"({_size(host.swap_free_bytes)} free){cgroup}"
        + (f"; memory unreadable: {host.meminfo_unreadable}" if host.meminfo_unreadable else "")
    )
    shm = format_bytes(host.shm_total_bytes) if host.shm_total_bytes is not None else "unreadable"
    lines.append(f"/dev/shm: {shm}")
    for disk in host.disks:
        if disk.unreadable is not None:
            lines.append(f"disk:     {disk.role} {disk.path}: unreadable: {disk.unreadable}")
            continue
        lines.append(
            f"disk:     {disk.role} {disk.path}: {_size(disk.free_bytes)} free of "
            f"{_size(disk.total_bytes)} at {disk.measured_at}{'' if disk.writable else ' (not writable)'}"
        )
    if host.ports_in_use:
        lines.append("ports in use: " + ", ".join(str(p) for p in host.ports_in_use))
    lines.append(describe_manifest(facts.manifest))
    model = facts.model
    if model is not None:
        where = model.local_path or model.error or "not local"
        quant = f", {model.quantization}" if model.quantization else ""
        lines.append(
            f"model:    {model.requested} ({model.source}: {where}), {format_bytes(model.weight_bytes)} of "
            f"weights{quant}"
        )
    return "\n".join(lines)


@click.command("probe")
@click.option("--json", "as_json", is_flag=True, help="Print the facts as JSON (replay with --facts FILE).")
@click.option("--manifest-only", "manifest_only", is_flag=True,
              help="Only the image's build manifest (T4SERVE_MANIFEST); with --json, the answer the host reads.")
@settings_options
def command(as_json: bool, manifest_only: bool, settings: Settings) -> int:
    """Read the GPU, host, disks, build manifest and checkpoint; print every fact."""
    if manifest_only:
        from t4serve.contract import ManifestAnswer, emit
        from t4serve.probes.manifest import probe_manifest

        manifest = probe_manifest(settings.manifest)
        if as_json:
            emit(ManifestAnswer(manifest))
        else:
            click.echo(describe_manifest(manifest))
        return 0
    facts = gather_facts(settings, os.environ)
    click.echo(facts.to_json() if as_json else describe_facts(facts), nl=not as_json)
    return 0
