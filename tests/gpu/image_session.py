#!/usr/bin/env python3
"""The image itself on a GPU host without Docker: its own rootfs, entrypoint, supervisord and HEALTHCHECK, started by
tests/gpu/imagebox.py as Docker with the NVIDIA container toolkit starts it. The standard library only (the host's
Python runs it; the ballast alone uses the host's torch).

    image_session.py STEP OUT [--parts DIR]

Steps (tests/gpu/session.sh queues them through tests/gpu/image-host.sh; each writes OUT as it goes, so a hold cut
short still leaves what was seen):
    prepare   check and unpack the parts (imagebox assemble), write the zero-weight E2B checkpoints, image.json (the
              manifest's image id and labels, Python and t4serve read inside the image), nvidia-smi
    qat       the QAT checkpoint at T4 memory (a ballast), T4SERVE_SIZE_AS=t4, a new cache volume: the cold start to
              ready with the image's HEALTHCHECK run every 2 s, the plan beside vLLM's figures, the telemetry
              sidecar's /metrics, `t4serve status`, one completion; SIGTERM with a 3,000-token request in flight
              (drained, exit 0); the warm restart (the same container: its writable layer and volume); kill -9 of
              the engine core (restarted, ready again); stopped
    patch     `t4serve patch verify` in the image on the card
    bf16      bf16 at T4 memory, a new cache volume, the canary on (zero weights: canary_failed, unhealthy, the
              canary's own words); then the warm start with the canary off to ready; stopped

Where: the rootfs in /tmp/t4serve-image/rootfs (T4SERVE_IMAGE_ROOT), containers' state in IMAGEBOX_ROOT.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import imagebox  # noqa: E402 - beside this file
from ballast import T4_MEMORY_BYTES, Ballast  # noqa: E402

ROOT = Path(os.environ.get("T4SERVE_IMAGE_ROOT", "/tmp/t4serve-image"))
ROOTFS = ROOT / "rootfs"
CHECKPOINTS = ROOT / "checkpoints"
PORT = 8000
TELEMETRY_PORT = 9400
# compose.yaml's stop_grace_period: what `docker compose stop` waits before SIGKILL.
STOP_GRACE_S = 90
HEALTH_EVERY_S = 2.0
READY_TIMEOUT_S = 540
BOX = [sys.executable, str(HERE / "imagebox.py")]


def now() -> float:
    return round(time.time(), 3)


class Record:
    """One step's JSON record, written out after every change."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.data: dict[str, Any] = {"started_at": now()}
        path.parent.mkdir(parents=True, exist_ok=True)
        self.save()

    def __setitem__(self, key: str, value: Any) -> None:
        self.data[key] = value
        self.save()

    def save(self) -> None:
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(json.dumps(self.data, indent=2, sort_keys=True, default=str) + "\n")
        tmp.replace(self.path)


def box(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*BOX, *args], capture_output=True, text=True, timeout=timeout)


def container_file(name: str, path: str) -> Path | None:
    """A file of the running container, through /proc/PID/root (its mounts, as the container sees them)."""
    pid = imagebox.host_pid(name)
    return Path(f"/proc/{pid}/root{path}") if pid else None


def state(name: str) -> dict[str, Any]:
    f = container_file(name, "/tmp/t4serve/state.json")
    if f is None:
        return {}
    try:
        data: dict[str, Any] = json.loads(f.read_text())
        return data
    except (OSError, ValueError):
        return {}


def health(name: str) -> dict[str, Any]:
    t = now()
    try:
        code, out = imagebox.health(name)
    except imagebox.BoxError as exc:
        code, out = -2, exc.render()
    return {"t": t, "exit": code, "output": out.strip()[-400:], "phase": state(name).get("phase", "absent")}


def copy_log(name: str, out: Path) -> None:
    src = imagebox.state_dir(name) / "log"
    if src.is_file():
        (out / f"{name}.log").write_bytes(src.read_bytes())


def wait_ready(name: str, rec: Record, key: str, out: Path, until: tuple[str, ...] = ("ready",),
               attempt: int | None = None, timeout: float = READY_TIMEOUT_S) -> dict[str, Any]:
    """Run the HEALTHCHECK every 2 s until the phase is one of `until` (in `attempt`, if given) or the container
    exits; record each result; the outcome."""
    t0 = time.time()
    checks: list[dict[str, Any]] = []
    outcome: dict[str, Any] = {"waited_for": list(until)}
    while time.time() - t0 < timeout:
        h = health(name)
        checks.append(h)
        st = state(name)
        rec[key] = {**outcome, "healthchecks": checks, "state": st}
        if st.get("phase") in until and (attempt is None or st.get("attempt") == attempt):
            h2 = health(name)  # the verdict once there
            checks.append(h2)
            outcome.update({"reached": st.get("phase"), "seconds": round(time.time() - t0, 1),
                            "healthcheck_then": h2["exit"]})
            break
        if (imagebox.state_dir(name) / "exit").is_file():
            outcome.update({"reached": "exited", "exit": (imagebox.state_dir(name) / "exit").read_text().strip(),
                            "seconds": round(time.time() - t0, 1)})
            break
        time.sleep(HEALTH_EVERY_S)
    else:
        outcome.update({"reached": f"timeout in {state(name).get('phase')}", "seconds": round(time.time() - t0, 1)})
    rec[key] = {**outcome, "healthchecks": checks, "state": state(name)}
    copy_log(name, out)
    return outcome


def exec_text(name: str, *argv: str, timeout: float = 120) -> dict[str, Any]:
    try:
        r = imagebox.exec_in(name, list(argv), None, [], timeout=timeout, capture=True)
        return {"argv": list(argv), "exit": r.returncode, "stdout": r.stdout.decode(errors="replace"),
                "stderr": r.stderr.decode(errors="replace")[-4000:]}
    except (imagebox.BoxError, subprocess.TimeoutExpired) as exc:
        return {"argv": list(argv), "error": str(exc)}


def http(url: str, body: dict[str, Any] | None = None, timeout: float = 60) -> dict[str, Any]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, headers={"content-type": "application/json"} if data else {})
    t0 = time.time()
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            text = r.read().decode(errors="replace")
            return {"status": r.status, "seconds": round(time.time() - t0, 3), "body": text}
    except urllib.error.HTTPError as exc:
        return {"status": exc.code, "seconds": round(time.time() - t0, 3), "body": exc.read().decode(errors="replace")}
    except (OSError, ValueError) as exc:
        return {"status": 0, "seconds": round(time.time() - t0, 3), "error": f"{type(exc).__name__}: {exc}"}


def completion(model: str, prompt: str, max_tokens: int, timeout: float = 600) -> dict[str, Any]:
    r = http(f"http://127.0.0.1:{PORT}/v1/completions",
             {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True},
             timeout=timeout)
    with contextlib.suppress(ValueError, KeyError, TypeError):
        body = json.loads(r.pop("body"))
        r["completion_tokens"] = body["usage"]["completion_tokens"]
        r["prompt_tokens"] = body["usage"]["prompt_tokens"]
    return r


def descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            text = stat.read_text()
            children.setdefault(int(text[text.rindex(")") + 2:].split()[1]), []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            found.append(c)
            todo.append(c)
    return found


def engine_cores(name: str) -> list[int]:
    pid = imagebox.host_pid(name)
    if pid is None:
        return []
    out = []
    for p in descendants(pid):
        with contextlib.suppress(OSError):
            if Path(f"/proc/{p}/comm").read_text().startswith("VLLM::EngineCor"):
                out.append(p)
    return out


def log_size(name: str) -> int:
    log = imagebox.state_dir(name) / "log"
    return log.stat().st_size if log.is_file() else 0


def kv_lines(name: str, since: int = 0) -> list[str]:
    """vLLM's figure lines in the container's log after byte `since` (the log of a restarted container grows)."""
    text = ""
    with contextlib.suppress(OSError), open(imagebox.state_dir(name) / "log", "rb") as f:
        f.seek(since)
        text = f.read().decode(errors="replace")
    return [line for line in text.splitlines()
            if re.search(r"GPU KV cache size|Maximum concurrency|reserved .* for KV Cache|torch.compile took|"
                         r"Model loading took|Loading weights took", line)]


def serve_env(model_dir: str, *extra: str) -> list[str]:
    env = [f"T4SERVE_MODEL=/models/{model_dir}", "T4SERVE_SIZE_AS=t4", "HF_HUB_OFFLINE=1",
           f"T4SERVE_SERVED_MODEL_NAME={model_dir}", *extra]
    return [a for e in env for a in ("-e", e)]


# --standin DIR: no GPU, and DIR's `vllm` (tests/standin/vllm_standin.py) first on the image's PATH: a check of this
# script's own flow on a machine without a GPU, not of the image on one.
STANDIN: Path | None = None


def standin_args() -> list[str]:
    if STANDIN is None:
        return []
    path = "/opt/standin/bin:/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    return ["--no-gpu", "-v", f"{STANDIN}:/opt/standin/bin:ro", "-e", f"PATH={path}", "-e", "T4SERVE_PREFLIGHT=warn",
            "-e", "T4SERVE_DTYPE=float16"]


def start(name: str, volume: str, *env: str) -> dict[str, Any]:
    offset = log_size(name)
    r = box("run", name, "--rootfs", str(ROOTFS), "-d", "-v", f"{CHECKPOINTS}:/models:ro",
            "-v", f"{volume}:/cache", *standin_args(), *env)
    return {"at": now(), "exit": r.returncode, "out": (r.stdout + r.stderr).strip(), "log_offset": offset}


def stop(name: str, grace: float = STOP_GRACE_S) -> dict[str, Any]:
    t0 = time.time()
    code = imagebox.stop(name, grace)
    return {"exit": code, "seconds": round(time.time() - t0, 1)}


class NoBallast:
    device_free, line = None, "no ballast (--standin: no GPU)"

    def __enter__(self) -> NoBallast:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


def ballast() -> Ballast | NoBallast:
    return NoBallast() if STANDIN is not None else Ballast(T4_MEMORY_BYTES)


# --- steps ---------------------------------------------------------------------------------------------------------


def host_text(*argv: str) -> str:
    """A host command's output, or what stopped it."""
    try:
        r = subprocess.run(list(argv), capture_output=True, text=True, timeout=60)
        return r.stdout + r.stderr
    except (OSError, subprocess.SubprocessError) as exc:
        return f"{argv[0]}: {exc}"


def step_prepare(out: Path, parts: Path) -> int:
    rec = Record(out / "prepare.json")
    t0 = time.time()
    rec["assemble"] = imagebox.assemble(parts, ROOTFS)
    manifest = json.loads((ROOTFS / ".imagebox-manifest.json").read_text())
    rec["assemble_seconds"] = round(time.time() - t0, 1)
    if not (CHECKPOINTS / "qat" / "config.json").is_file():
        w = subprocess.run([sys.executable, str(HERE / "write_checkpoints.py"), str(CHECKPOINTS)],
                           capture_output=True, text=True)
        rec["checkpoints"] = {"exit": w.returncode, "out": (w.stdout + w.stderr)[-2000:]}
    (out / "nvidia-smi.txt").write_text(host_text("nvidia-smi"))
    gpu = host_text("nvidia-smi", "--query-gpu=name,memory.total,driver_version,compute_cap", "--format=csv,noheader")
    # Read inside the image: its Python, t4serve's version, the build manifest, nvidia-smi as the toolkit gives it.
    probe = box("run", "probe", "--rootfs", str(ROOTFS), *standin_args(), "--entrypoint", "/bin/sh", "--", "-c",
                "python3 --version; t4serve --version; id; cat /etc/t4serve/build-manifest.json; "
                "echo; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; "
                "ls /usr/lib/x86_64-linux-gnu | grep -E '^lib(cuda|nvidia)' | tr '\\n' ' '", timeout=120)
    image = {
        "id": manifest["image"]["id"],
        "repo_tags": manifest["image"]["repo_tags"],
        "labels": manifest["image"]["labels"],
        "config": manifest["image"]["config"],
        "transfer": {"parts": len(manifest["parts"]), "bytes": manifest["stream"]["bytes"],
                     "compression": manifest["compression"]},
        "read_inside": {"exit": probe.returncode, "stdout": probe.stdout, "stderr": probe.stderr[-2000:]},
        "host_gpu": gpu.strip(),
    }
    (out / "image.json").write_text(json.dumps(image, indent=2, sort_keys=True) + "\n")
    rec["image"] = image["id"]
    rec["read_inside_exit"] = probe.returncode
    print(probe.stdout + probe.stderr)
    return 0 if probe.returncode == 0 else 1


def step_qat(out: Path) -> int:
    rec = Record(out / "qat.json")
    name, model = "qat", "qat"
    volume = str(ROOT / "volumes" / "qat-cache")
    with ballast() as b:
        rec["ballast"] = {"device_free": b.device_free, "line": b.line}
        rec["start_cold"] = start(name, volume, *serve_env(model, "T4SERVE_CANARY=off"))
        cold = wait_ready(name, rec, "cold", out)
        if cold.get("reached") != "ready":
            rec["stop"] = stop(name, 30)
            copy_log(name, out)
            return 1
        rec["kv_lines_cold"] = kv_lines(name)
        rec["status"] = exec_text(name, "t4serve", "status")
        rec["status_json"] = exec_text(name, "t4serve", "status", "--json")
        rec["plan"] = exec_text(name, "t4serve", "plan")
        rec["metrics"] = http(f"http://127.0.0.1:{TELEMETRY_PORT}/metrics")
        rec["completion"] = completion(model, "t1 t2 t3 t4", 16)
        # SIGTERM (docker stop) with a 3,000-token request in flight: drained, exit 0.
        result: dict[str, Any] = {}

        def long_request() -> None:
            result.update(completion(model, "t5 t6 t7", 3000))

        th = threading.Thread(target=long_request)
        th.start()
        time.sleep(3)
        rec["drain_stop"] = stop(name)
        th.join(60)
        rec["drain_request"] = result
        rec["drain_phases"] = state_from_upper(name)
        copy_log(name, out)
        # The warm restart: the same container (writable layer and volume kept, as `docker restart`).
        rec["start_warm"] = start(name, volume, *serve_env(model, "T4SERVE_CANARY=off"))
        warm = wait_ready(name, rec, "warm", out)
        rec["kv_lines_warm"] = kv_lines(name, rec.data["start_warm"]["log_offset"])
        if warm.get("reached") == "ready":
            cores = engine_cores(name)
            rec["engine_cores"] = cores
            if not cores:  # the stand-in has no engine core process
                rec["final_stop"] = stop(name)
                copy_log(name, out)
                return 0
            attempt = int(state(name).get("attempt") or 1)
            for p in cores:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(p, signal.SIGKILL)
            rec["killed_at"] = now()
            wait_ready(name, rec, "after_kill", out, attempt=attempt + 1)
            rec["completion_after_kill"] = completion(model, "t1 t2 t3 t4", 16)
        rec["final_stop"] = stop(name)
        copy_log(name, out)
    return 0


def state_from_upper(name: str) -> dict[str, Any]:
    """A stopped container's state file, from its writable layer."""
    for f in (imagebox.state_dir(name) / "upper/tmp/t4serve/state.json",
              imagebox.LAYER_FALLBACK / name / "upper/tmp/t4serve/state.json"):
        with contextlib.suppress(OSError, ValueError):
            data: dict[str, Any] = json.loads(f.read_text())
            return data
    return {}


def step_patch(out: Path) -> int:
    rec = Record(out / "patch.json")
    t0 = time.time()
    extra = ["--no-gpu"] if STANDIN is not None else []
    r = box("run", "patch", "--rootfs", str(ROOTFS), *extra, "--", "patch", "verify", timeout=540)
    rec["verify"] = {"exit": r.returncode, "seconds": round(time.time() - t0, 1), "stdout": r.stdout,
                     "stderr": r.stderr[-6000:]}
    copy_log("patch", out)
    return 0 if r.returncode == 0 else 1


def step_bf16(out: Path) -> int:
    rec = Record(out / "bf16.json")
    name, model = "bf16", "bf16"
    volume = str(ROOT / "volumes" / "bf16-cache")
    with ballast() as b:
        rec["ballast"] = {"device_free": b.device_free, "line": b.line}
        rec["start_cold"] = start(name, volume, *serve_env(model, "T4SERVE_CANARY=on"))
        wait_ready(name, rec, "cold", out, until=("ready", "canary_failed", "failed"))
        rec["kv_lines_cold"] = kv_lines(name)
        rec["status"] = exec_text(name, "t4serve", "status")
        rec["stop_cold"] = stop(name)
        copy_log(name, out)
        (out / "bf16-cold.log").write_bytes((imagebox.state_dir(name) / "log").read_bytes())
        # Warm: a new container on the same cache volume (compose after a change of settings), the canary off.
        rec["start_warm"] = start("bf16w", volume, *serve_env(model, "T4SERVE_CANARY=off"))
        wait_ready("bf16w", rec, "warm", out)
        rec["kv_lines_warm"] = kv_lines("bf16w")
        rec["completion"] = completion(model, "t1 t2 t3 t4", 16)
        rec["stop_warm"] = stop("bf16w")
        copy_log("bf16w", out)
    return 0


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("step", choices=("prepare", "qat", "patch", "bf16"))
    p.add_argument("out")
    p.add_argument("--parts", default="/tmp/t4serve-image/parts")
    p.add_argument("--standin", help="no GPU: the stand-in vLLM in this folder (a check of this script only)")
    a = p.parse_args(argv)
    global STANDIN
    STANDIN = Path(a.standin).resolve() if a.standin else None
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    try:
        if a.step == "prepare":
            return step_prepare(out, Path(a.parts))
        if a.step == "qat":
            return step_qat(out)
        if a.step == "patch":
            return step_patch(out)
        return step_bf16(out)
    except imagebox.BoxError as exc:
        print(exc.render(), file=sys.stderr)
        (out / f"{a.step}-error.txt").write_text(exc.render() + "\n")
        return exc.code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
