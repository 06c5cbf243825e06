"""`t4serve serve` against a real vLLM on a real NVIDIA GPU, sized as a T4 (T4SERVE_SIZE_AS=t4).

Skipped, with the reason, where no GPU or no vLLM is importable. Each test starts real servers on Gemma 4 E2B-shaped
checkpoints with zero weights (tests/unit/e2b_checkpoint.py): the canary is off except where its failure is the point.
Results (phases, figures beside predictions, peaks, timings) go to T4SERVE_GPU_RESULTS (default: a temp folder) as
JSON, for docs/verified/. On a GPU larger than a T4 the cold-start tests first make the card a T4 in memory: a ballast
holds all but 15,360 MiB, so an out-of-memory during a cold torch.compile is real, not absorbed by the bigger card.

    T4SERVE_GPU_RESULTS=out python -m pytest -s tests/gpu/test_real_serve.py -k cold
"""

from __future__ import annotations

import os
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))

from realserve import (
    T4_MEMORY_BYTES,
    Ballast,
    Completion,
    Server,
    complete,
    imported_packages,
    min_device_free,
    peak_reserved,
    random_prompt,
    vllm_version,
    write_json,
)

pytestmark = pytest.mark.gpu

# Seconds a start may take here: a cold compile of E2B took about 150 s on an H200, a warm start about 80 s.
COLD_START_S = 540
WARM_START_S = 300


@pytest.fixture(scope="session")
def vllm_available(gpu_facts: Any) -> str:
    version = vllm_version()
    if version is None:
        pytest.skip("vLLM is not importable here (see tests/gpu/offline-host.sh for a host without the image)")
    return version


@pytest.fixture(scope="session")
def results_dir() -> Path:
    path = Path(os.environ.get("T4SERVE_GPU_RESULTS") or tempfile.mkdtemp(prefix="t4serve-gpu-"))
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture(scope="session")
def work_dir() -> Path:
    return Path(os.environ.get("T4SERVE_GPU_WORK") or tempfile.mkdtemp(prefix="t4serve-gpu-work-"))


@pytest.fixture(scope="session")
def checkpoints(vllm_available: str, work_dir: Path) -> Path:
    """bf16/ and qat/ E2B checkpoints (sparse zero weights, tokenizer and processor files), written once."""
    from write_checkpoints import write_all

    root = Path(os.environ.get("T4SERVE_GPU_CHECKPOINTS") or work_dir / "checkpoints")
    if not (root / "bf16" / "config.json").exists() or not (root / "qat" / "config.json").exists():
        write_all(root)
    return root


def new_server(work_dir: Path, name: str, model_dir: Path, port: int, **env: str) -> Server:
    base = {"T4SERVE_SIZE_AS": "t4", "T4SERVE_CANARY": "off", "T4SERVE_SERVED_MODEL_NAME": model_dir.name}
    return Server(name, work_dir / name, str(model_dir), port, env={**base, **env})


def _free(gpu_facts: Any) -> int:
    import pynvml

    pynvml.nvmlInit()
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        return int(pynvml.nvmlDeviceGetMemoryInfo(handle).free)
    finally:
        pynvml.nvmlShutdown()


def comparisons(state: dict[str, Any]) -> dict[str, dict[str, float]]:
    figures = state.get("figures") or {}
    out = {}
    for name, p in (state.get("predictions") or {}).items():
        logged = figures.get(name, {}).get("value")
        out[name] = {"predicted": p["value"], "logged": logged}
    return out


def summary(server: Server, phase: str, **extra: Any) -> dict[str, Any]:
    state = server.state()
    return {
        "phase": phase,
        "attempt": state.get("attempt"),
        "phases": state.get("phases"),
        "figures": {k: v.get("value") for k, v in (state.get("figures") or {}).items()},
        "predicted_vs_logged": comparisons(state),
        "peak_reserved_bytes": peak_reserved(server.probe_dir),
        "min_device_free_bytes": min_device_free(server.probe_dir),
        "diagnosis": state.get("diagnosis"),
        "reason": state.get("reason"),
        **extra,
    }


def watch_healthcheck(server: Server, until: tuple[str, ...], timeout: float) -> tuple[list[tuple[str, int]], str]:
    """(phase, healthcheck exit) pairs while the server starts, and the phase it ended in."""
    seen: list[tuple[str, int]] = []
    deadline = time.time() + timeout
    phase = server.phase()
    while time.time() < deadline:
        phase = server.phase()
        if phase in until or (server.proc is not None and server.proc.poll() is not None):
            break
        rc = server.healthcheck()
        if not seen or seen[-1] != (phase, rc):
            seen.append((phase, rc))
        time.sleep(3)
    return seen, phase


def assert_figures_match_plan(state: dict[str, Any], explicit_pool: bool) -> None:
    comp = comparisons(state)
    for name in ("kv_tokens", "max_concurrency", "max_model_len", "model_memory_gib"):
        assert comp.get(name, {}).get("logged") is not None, f"vLLM's log gave no {name}: {state.get('figures')}"
    if explicit_pool:
        # The pool is passed in whole blocks: vLLM's KV tokens and concurrency are exactly the plan's.
        assert comp["kv_tokens"]["logged"] == comp["kv_tokens"]["predicted"]
        assert comp["max_concurrency"]["logged"] == pytest.approx(comp["max_concurrency"]["predicted"], abs=0.011)
    assert comp["max_model_len"]["logged"] == comp["max_model_len"]["predicted"]


@pytest.mark.parametrize("kind", ["bf16", "qat"])
def test_cold_then_warm_start_at_t4_memory(
    kind: str, checkpoints: Path, work_dir: Path, results_dir: Path, gpu_facts: Any
) -> None:
    """A first start on an empty compile cache becomes ready within a T4's memory, then a warm one does too; the pool
    is t4serve's explicit one, so vLLM's KV figures equal the plan's."""
    cold_then_warm(kind, f"start-{kind}", {}, checkpoints, work_dir, results_dir, gpu_facts, explicit_pool=True)


def test_profile_pool_cold_then_warm_at_t4_memory(
    checkpoints: Path, work_dir: Path, results_dir: Path, gpu_facts: Any
) -> None:
    """T4SERVE_KV_CACHE_MEMORY_BYTES=profile (vLLM measures the pool) at a T4's memory, cold then warm: a cold compile's
    transient memory counts against a profiled pool, so the first start's pool may be smaller than later ones'.
    Both are recorded beside t4serve's explicit prediction; both must still become ready."""
    cold_then_warm("bf16", "start-bf16-profile", {"T4SERVE_KV_CACHE_MEMORY_BYTES": "profile"}, checkpoints, work_dir,
                   results_dir, gpu_facts, explicit_pool=False)


def cold_then_warm(kind: str, name: str, env: dict[str, str], checkpoints: Path, work_dir: Path, results_dir: Path,
                   gpu_facts: Any, explicit_pool: bool) -> None:  # fmt: skip
    device_total = gpu_facts.devices[0].memory_total_bytes
    ballast_needed = device_total > T4_MEMORY_BYTES + 1024**3
    record: dict[str, Any] = {"vllm": vllm_version(), "gpu": gpu_facts.devices[0].name, "ballast": ballast_needed,
                              "env": env}
    # T4SERVE_GPU_STARTS=cold runs the first start alone (tests/gpu/gpu-host.sh's cold-profile-first step).
    starts = os.environ.get("T4SERVE_GPU_STARTS", "cold,warm").split(",")
    for temperature in [s for s in ("cold", "warm") if s in starts]:
        server = new_server(work_dir, name, checkpoints / kind, 8200, **env)
        ballast = Ballast(T4_MEMORY_BYTES) if ballast_needed else None
        try:
            server.start()
            seen, phase = watch_healthcheck(server, ("ready", "failed", "canary_failed"), COLD_START_S)
            status = server.run_t4serve("status").stdout
            result = summary(server, phase, healthchecks=seen, ready_seconds=round(time.time() - server.started_at, 1),
                             device_free_with_ballast=ballast.device_free if ballast else None, status=status)
            if phase == "ready":
                answer = complete(server.base_url, kind, random_prompt(64), 16)
                result["completion"] = {"status": answer.status, "tokens": answer.tokens, "error": answer.error}
                result["healthcheck_when_ready"] = server.healthcheck()
                result["imported_packages"] = imported_packages(server.probe_dir)
            record[temperature] = result
        finally:
            server.kill()
            if ballast:
                ballast.close()
        write_json(results_dir / f"{name}.json", record)
        why = f"{temperature} start of {name}: {phase}; {result.get('diagnosis')}"
        assert phase == "ready", f"{why}\n{server.log()[-4000:]}"
        assert result["completion"]["status"] == 200 and result["completion"]["tokens"] == 16
        assert result["healthcheck_when_ready"] == 0
        assert any(rc == 1 for _, rc in seen), f"healthcheck never said 1 while loading: {seen}"
        loading = [p for p, _ in seen]
        assert "loading_weights" in loading or "profiling" in loading or "compiling" in loading, seen
        assert "not yet logged" not in status.split("predictions not yet logged")[0]
        assert_figures_match_plan(server.state(), explicit_pool=explicit_pool)


def test_lifecycle_crash_restart_give_up_drain_canary_profile(
    checkpoints: Path, work_dir: Path, results_dir: Path
) -> None:
    """Four bf16 servers side by side (warm compile cache where one exists; no ballast: no cold compile here):
    crash: the engine core killed with -9 restarts and is ready again; a second kill in the window gives up (exit 1);
    drain: SIGTERM with a 3,000-token request in flight lets it finish, then serve exits 0;
    canary: with the canary on, zero weights cannot say 391: "canary failed", healthcheck 1;
    profile: T4SERVE_KV_CACHE_MEMORY_BYTES=profile, vLLM sizes the pool; logged beside the prediction."""
    ckpt = checkpoints / "bf16"
    warm = work_dir / "start-bf16" / "compile"
    servers = {
        "crash": new_server(work_dir, "crash", ckpt, 8300, T4SERVE_MAX_RESTARTS="1", T4SERVE_RESTART_WINDOW="900"),
        "drain": new_server(work_dir, "drain", ckpt, 8301, T4SERVE_SHUTDOWN_TIMEOUT="120"),
        "canary": new_server(work_dir, "canary", ckpt, 8302, T4SERVE_CANARY="on"),
        "profile": new_server(work_dir, "profile", ckpt, 8303, T4SERVE_KV_CACHE_MEMORY_BYTES="profile"),
    }
    import shutil

    for s in servers.values():
        if warm.is_dir() and not (s.root / "compile").exists():
            shutil.copytree(warm, s.root / "compile")
    record: dict[str, Any] = {"vllm": vllm_version()}
    try:
        # The profiling server measures free memory: start it first and alone, so the others cannot move it.
        servers["profile"].start()
        record["profile_phase"] = servers["profile"].wait_phase(("ready", "failed"), WARM_START_S)
        for name in ("crash", "drain", "canary"):
            servers[name].start()
        phases = {n: servers[n].wait_phase(("ready", "failed", "canary_failed"), WARM_START_S)
                  for n in ("crash", "drain", "canary")}
        record["start_phases"] = phases

        # canary
        canary = servers["canary"]
        record["canary"] = summary(canary, phases["canary"], healthcheck=canary.healthcheck(),
                                   status=canary.run_t4serve("status").stdout)

        # drain: a long request in flight, then SIGTERM to serve (as docker stop does)
        drain = servers["drain"]
        holder: dict[str, Completion] = {}
        worker = threading.Thread(
            target=lambda: holder.setdefault("r", complete(drain.base_url, "bf16", random_prompt(32), 3000)))
        if phases["drain"] == "ready":
            worker.start()
            time.sleep(3)
            t0 = time.time()
            drain.signal(signal.SIGTERM)
            code = drain.wait(240)
            worker.join(60)
            r = holder.get("r")
            record["drain"] = {"exit": code, "seconds_after_sigterm": round(time.time() - t0, 1),
                               "request": None if r is None else {"status": r.status, "tokens": r.tokens,
                                                                  "error": r.error}}

        # crash: kill -9 the engine core, expect a restart, then give up on the second
        crash = servers["crash"]
        kills = []
        if phases["crash"] == "ready":
            for n in (1, 2):
                pids = crash.engine_core_pids()
                kills.append({"kill": n, "engine_core_pids": pids})
                for pid in pids:
                    os.kill(pid, signal.SIGKILL)
                if n == 1:
                    kills[-1]["after"] = crash.wait_phase(("ready",), WARM_START_S, attempt=2)
                    kills[-1]["state"] = summary(crash, kills[-1]["after"])
            kills.append({"serve_exit": crash.wait(180), "state": summary(crash, crash.phase())})
        record["crash"] = kills

        profile = servers["profile"]
        record["profile"] = summary(profile, profile.phase())
    finally:
        for s in servers.values():
            s.kill()
        write_json(results_dir / "lifecycle.json", record)

    assert record["profile_phase"] == "ready", servers["profile"].log()[-3000:]
    assert record["profile"]["figures"].get("kv_tokens"), record["profile"]
    assert phases["canary"] == "canary_failed", servers["canary"].log()[-3000:]
    assert record["canary"]["healthcheck"] == 1
    assert "canary failed" in (record["canary"]["reason"] or "")
    assert record["drain"]["exit"] == 0, servers["drain"].log()[-3000:]
    assert record["drain"]["request"] == {"status": 200, "tokens": 3000, "error": None}
    assert kills[0]["engine_core_pids"], "no VLLM::EngineCore process found"
    assert kills[0]["after"] == "ready", servers["crash"].log()[-3000:]
    assert kills[-1]["serve_exit"] not in (None, 0), servers["crash"].log()[-3000:]
