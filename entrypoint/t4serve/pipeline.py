"""The steps every command shares: Settings -> Facts (probed or replayed) -> Plan + preflight findings.

`gather_facts(settings, environ)` is the only step that reads the machine (through t4serve.probes and
t4serve.probes.checkpoint); `prepare(settings, facts)` is pure. `serve`, `plan`, `preflight` and `probe` all call these,
so what `preflight` checks is exactly what `serve` would run. Both signatures are stable.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from pathlib import Path

from t4serve.config.settings import Settings
from t4serve.errors import ConfigError
from t4serve.facts import Facts, GpuFacts, ModelFacts
from t4serve.gpus import KNOWN_GPUS, known_device, known_gpu
from t4serve.planning.plan import Plan, plan
from t4serve.preflight import Finding, run_checks
from t4serve.serde import from_dict
from t4serve.untrusted import Untrusted, loads_json, printable, read_bounded, shown

# Each compile cache by role: the variable that moves it and its owner's default when unset. Measured one by one, so
# caches left on the root filesystem are not mistaken for the roomy volume the image mounts at /cache.
COMPILE_CACHES = {
    "compile_cache": ("VLLM_CACHE_ROOT", "~/.cache/vllm"),
    "triton_cache": ("TRITON_CACHE_DIR", "~/.triton/cache"),
    "inductor_cache": ("TORCHINDUCTOR_CACHE_DIR", "/tmp/torchinductor_{user}"),
}
# A facts file holds one machine's probes and a checkpoint's config: tens of KB.
MAX_FACTS_BYTES = 16 << 20


def write_paths(settings: Settings, environ: Mapping[str, str]) -> dict[str, str]:
    """Each path the server writes, by role, for the per-filesystem disk check."""
    user = environ.get("USER") or environ.get("LOGNAME") or "root"
    home = environ.get("HOME") or os.path.expanduser("~")
    paths = {"hf_cache": settings.hf_home}
    for role, (variable, default) in COMPILE_CACHES.items():
        path = environ.get(variable) or default.format(user=user)
        paths[role] = home + path[1:] if path.startswith("~") else path
    paths["tmp"] = environ.get("TMPDIR") or "/tmp"
    paths["state"] = settings.state_dir
    return paths


def listen_ports(settings: Settings) -> list[tuple[str, int]]:
    ports = [(settings.host, settings.port)]
    if settings.telemetry_port:
        ports.append((settings.telemetry_host, settings.telemetry_port))
    return ports


def probe_settings_model(settings: Settings) -> ModelFacts:
    """The checkpoint T4SERVE_MODEL names, read where the settings say (HF_HOME, HF_HUB_OFFLINE)."""
    from t4serve.probes.checkpoint import probe_model

    return probe_model(settings.model.target, hf_home=settings.hf_home, offline=settings.hf_hub_offline)


def gather_facts(settings: Settings, environ: Mapping[str, str]) -> Facts:
    """Probe this machine (GPU, host, disks, build manifest), the checkpoint the settings name and its drafter."""
    from t4serve.probes import collect_facts
    from t4serve.probes.drafter import probe_drafter

    model = probe_settings_model(settings)
    facts = collect_facts(
        environ=environ,
        disk_paths=write_paths(settings, environ),
        ports=listen_ports(settings),
        manifest_path=settings.manifest,
        model=model,
    )
    return dataclasses.replace(facts, drafter=probe_drafter(settings, model))


def ensure_model(settings: Settings, facts: Facts) -> Facts:
    """Facts whose model and drafter are the ones the settings ask for: a recorded machine keeps its own facts of
    each when they match, and gets the requested checkpoint probed (local files, or built-in facts for the aliases and
    E2B's drafter) when not."""
    from t4serve.probes.drafter import choose_drafter, probe_drafter

    if facts.model is None or facts.model.requested != settings.model.target:
        facts = dataclasses.replace(facts, model=probe_settings_model(settings))
    wanted = choose_drafter(settings, facts.model).target if settings.speculative == "mtp" else None
    have = facts.drafter.requested if facts.drafter is not None else None
    if wanted != have:
        facts = dataclasses.replace(facts, drafter=probe_drafter(settings, facts.model))
    return facts


def load_facts(path: str | Path) -> Facts:
    """Facts recorded by `t4serve probe --json`; a missing, unreadable or malformed file is a ConfigError (exit 2).
    The one reader of a facts file (`plan`, `profiles`, `preflight --facts`): bounded and non-blocking (a FIFO or
    /dev/zero is refused), JSON of bounded depth, every field within its type and bounds (t4serve.facts), and the
    model's config read as a checkpoint's config.json is (probes.checkpoint.read_recorded)."""
    file = Path(path)
    required = "JSON written by `t4serve probe --json` of this t4serve version"
    fix = "record one with `t4serve probe --json > facts.json`"
    try:
        raw = read_bounded(file, MAX_FACTS_BYTES, "the facts file")
    except (FileNotFoundError, Untrusted) as exc:
        raise ConfigError(
            f"cannot read the facts file {printable(str(file))}",
            found=exc.reason if isinstance(exc, Untrusted) else f"{file}: no such file",
            required=f"a regular file of at most {MAX_FACTS_BYTES:,} bytes holding {required}",
            fix=fix,
        ) from None
    try:
        data = loads_json(raw, "the facts file")
    except Untrusted as exc:
        raise ConfigError(f"{printable(str(file))} is not a facts file", found=exc.reason, required=required,
                          fix=fix) from None
    try:
        facts = from_dict(Facts, data)
    except ConfigError as exc:
        raise ConfigError(
            f"{printable(str(file))} is not a facts file of this t4serve version",
            found=exc.what,
            required=required,
            fix="record it again with `t4serve probe --json > facts.json`",
        ) from None
    from t4serve.probes.checkpoint import read_recorded

    for role, recorded in (("model", facts.model), ("drafter", facts.drafter)):
        if recorded is None:
            continue
        try:
            checked = read_recorded(recorded)
        except Untrusted as exc:
            raise ConfigError(
                f"{printable(str(file))}: the {role} it records cannot be planned",
                found=f"{shown(recorded.requested, 120)}: {exc.reason}",
                required="a model config that passes the checks a checkpoint's config.json passes (the probe "
                "records one)",
                fix="record it again with `t4serve probe --json > facts.json`, or fix the field named",
            ) from None
        facts = (dataclasses.replace(facts, model=checked) if role == "model"
                 else dataclasses.replace(facts, drafter=checked))
    return facts


def with_known_gpu(facts: Facts, key: str) -> Facts:
    """Facts with the GPU replaced by a card from the known-GPU table (`plan --gpu t4`, t4serve.gpus.known_device),
    the recorded driver kept."""
    gpu = known_gpu(key)
    if gpu is None:
        raise ConfigError(
            f"--gpu {key}: not a known GPU",
            found=key,
            required="one of " + ", ".join(sorted(KNOWN_GPUS)),
            fix="pick one of those, or plan on the real machine without --gpu",
        )
    device = known_device(gpu)
    gpu_facts = GpuFacts(
        nvml_available=True,
        error=None,
        driver_version=facts.gpu.driver_version,
        cuda_driver_version=facts.gpu.cuda_driver_version,
        devices=[device],
        visible_devices_env=facts.gpu.visible_devices_env,
    )
    return dataclasses.replace(facts, gpu=gpu_facts, provenance=f"{facts.provenance}; GPU from the known table: {key}")


def prepare(settings: Settings, facts: Facts) -> tuple[Plan, list[Finding]]:
    """The plan for these facts and the preflight findings about it. Pure: the same inputs give the same output."""
    the_plan = plan(settings, facts)
    return the_plan, run_checks(facts, the_plan, settings)
