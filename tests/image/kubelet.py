"""A test double for the kubelet, where no cluster exists: it runs one rendered pod's container with docker and drives
its probes and its termination the way the kubelet does.

What it stands for (Kubernetes 1.32's kubelet, pkg/kubelet/prober and the container runtime's kill path):
- the container: the pod spec's image, command and args, environment (its envFrom ConfigMaps and env values),
  volumes (a PVC as a fresh docker volume, an emptyDir of medium Memory at /dev/shm as --shm-size of its sizeLimit,
  any other emptyDir as the kubelet makes it, an empty folder of mode 0777 on the node's disk (here a folder of this
  machine, bind-mounted; its sizeLimit is the kubelet's eviction threshold, which is not reproduced), Secrets and
  projected Secrets as
  read-only bind mounts of files written here) and security context (runAsUser and runAsGroup as --user, fsGroup as
  a supplementary group, allowPrivilegeEscalation: false as no-new-privileges, dropped capabilities as --cap-drop,
  readOnlyRootFilesystem as --read-only). Anything in the spec it cannot reproduce is refused, never ignored.
- probes: exec probes run with `docker exec` inside the container, each bounded by its timeoutSeconds (a timeout is
  a failure); one worker per probe, a probe every periodSeconds (a slow probe delays the next, as the kubelet's
  worker does); the startupProbe alone until it succeeds, then readiness and liveness on their own periods; a probe
  is failed after failureThreshold consecutive failures, ready after successThreshold successes. A failed startup
  or liveness probe ends the run (the kubelet would restart the container; the test only needs to know when).
- termination: the preStop hook runs to completion (bounded by the grace period), then SIGTERM, then SIGKILL when
  terminationGracePeriodSeconds has passed since termination began.
What it leaves out: scheduling, restarts, the Service and its endpoints, resource limits (a GPU cannot be requested
here; ephemeral-storage too), initialDelaySeconds other than 0.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

Obj = dict[str, Any]


class Unsupported(Exception):
    """The pod spec asks for something this double cannot reproduce faithfully."""


@dataclass
class ProbeResult:
    probe: str
    started: float
    ended: float
    ok: bool
    output: str


@dataclass
class Verdict:
    """When a probe worker crossed its thresholds (monotonic seconds), and every result it saw."""

    results: list[ProbeResult] = field(default_factory=list)
    started_at: float | None = None
    startup_succeeded_at: float | None = None
    startup_failed_at: float | None = None
    liveness_failed_at: float | None = None
    ready_changes: list[tuple[float, bool]] = field(default_factory=list)

    def of(self, probe: str) -> list[ProbeResult]:
        return [r for r in self.results if r.probe == probe]

    def first_ready(self) -> float | None:
        return next((t for t, ready in self.ready_changes if ready), None)


@dataclass
class Termination:
    began: float
    prestop_ended: float
    prestop_rc: int
    sigterm_at: float
    exited_at: float
    killed: bool
    exit_code: int


def _docker_run_args(
    pod: Obj, scratch: Path, image: str, secrets: dict[str, dict[str, str]]
) -> tuple[list[str], list[str]]:
    """`docker run` options and the command after the image, from the pod spec (its one container)."""
    spec = pod["spec"]
    (ctr,) = spec["containers"]
    opts: list[str] = []
    sc = spec.get("securityContext", {})
    csc = ctr.get("securityContext", {})
    user, group = csc.get("runAsUser", sc.get("runAsUser")), csc.get("runAsGroup", sc.get("runAsGroup"))
    if csc.get("runAsNonRoot", sc.get("runAsNonRoot")) and not user:
        raise Unsupported("runAsNonRoot without a numeric runAsUser: the kubelet would check the image's USER")
    if user is not None:
        opts += ["--user", f"{user}:{group if group is not None else user}"]
    if sc.get("fsGroup") is not None:
        opts += ["--group-add", str(sc["fsGroup"])]
    if csc.get("allowPrivilegeEscalation") is False:
        opts += ["--security-opt", "no-new-privileges"]
    if csc.get("privileged"):
        raise Unsupported("privileged containers")
    for cap in csc.get("capabilities", {}).get("drop", []):
        opts += ["--cap-drop", cap]
    for cap in csc.get("capabilities", {}).get("add", []):
        opts += ["--cap-add", cap]
    if csc.get("readOnlyRootFilesystem"):
        opts += ["--read-only"]
    volumes = {v["name"]: v for v in spec.get("volumes", [])}
    for mount in ctr.get("volumeMounts", []):
        volume = volumes[mount["name"]]
        path = mount["mountPath"]
        if "persistentVolumeClaim" in volume:
            # A fresh, empty claim: an anonymous volume, removed with the container (`docker rm -v`).
            opts += ["--mount", f"type=volume,dst={path}"]
        elif "emptyDir" in volume and volume["emptyDir"].get("medium") == "Memory":
            size = volume["emptyDir"].get("sizeLimit")
            if path != "/dev/shm" or size is None:
                raise Unsupported(f"memory emptyDir at {path} (size {size})")
            opts += ["--shm-size", str(_bytes(size))]
        elif "emptyDir" in volume and not volume["emptyDir"].get("medium"):
            # Docker's own tmpfs copies the image's folder (and its mode: /home/t4serve is 0700) into it; an emptyDir
            # starts empty and world-writable.
            folder = scratch / "empty-dir" / mount["name"]
            folder.mkdir(parents=True)
            folder.chmod(0o777)
            opts += ["--mount", f"type=bind,src={folder},dst={path}"]
        elif "projected" in volume or "secret" in volume:
            opts += ["-v", f"{_secret_dir(volume, scratch / mount['name'], sc.get('fsGroup'), secrets)}:{path}:ro"]
        else:
            raise Unsupported(f"volume {mount['name']}: {sorted(volume)}")
    if ctr.get("envFrom") and any("configMapRef" not in src for src in ctr["envFrom"]):
        raise Unsupported("envFrom other than configMapRef")
    for port in ctr.get("ports", []):
        opts += ["-p", f"127.0.0.1::{port['containerPort']}"]
    if "command" in ctr:
        opts += ["--entrypoint", ctr["command"][0]]
        after = [*ctr["command"][1:], *ctr.get("args", [])]
    else:
        raise Unsupported("a container without command (the image's ENTRYPOINT would be used)")
    return opts, [image, *after]


_UNITS = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}


def _bytes(quantity: str | int) -> int:
    text = str(quantity)
    for unit, factor in _UNITS.items():
        if text.endswith(unit):
            return int(float(text[: -len(unit)]) * factor)
    return int(text)


def _secret_dir(volume: Obj, folder: Path, fs_group: int | None, store: dict[str, dict[str, str]]) -> Path:
    """The Secret files a (projected) secret volume shows, written under `folder`; `store` is each Secret's data."""
    folder.mkdir(parents=True, exist_ok=True)
    sources = volume.get("projected", {}).get("sources", []) or [{"secret": volume.get("secret")}]
    mode = volume.get("projected", volume.get("secret", {})).get("defaultMode", 0o644)
    for source in sources:
        secret = source.get("secret")
        if secret is None:
            raise Unsupported(f"projected source {sorted(source)}")
        for item in secret.get("items", []):
            target = folder / item["path"]
            target.write_text(store[secret["name"]][item["key"]])
            # The kubelet gives the files group fsGroup and defaultMode; where this process cannot chown to that group
            # the files are made world-readable instead, so the container's user can read them either way.
            try:
                if fs_group is None:
                    raise PermissionError
                os.chown(target, -1, fs_group)
                target.chmod(mode)
            except PermissionError:
                target.chmod(mode | 0o444)
    folder.chmod(0o755)
    return folder


class PodRun:
    """One container of `pod` (a rendered Deployment's pod template) run with docker and watched like the kubelet."""

    def __init__(self, docker: str, pod: Obj, configmaps: dict[str, dict[str, str]], image: str,
                 secrets: dict[str, dict[str, str]], extra_env: dict[str, str]) -> None:  # fmt: skip
        self.docker = docker
        self.pod = pod
        self.ctr: Obj = pod["spec"]["containers"][0]
        self.name = f"t4s-kubelet-{uuid.uuid4().hex[:8]}"
        self.scratch = Path(tempfile.mkdtemp(prefix="kubelet-double-"))
        env: dict[str, str] = {}
        for src in self.ctr.get("envFrom", []):
            env.update(configmaps[src["configMapRef"]["name"]])
        for entry in self.ctr.get("env", []):
            if "value" not in entry:
                raise Unsupported(f"env {entry['name']} from {sorted(entry.get('valueFrom', {}))}")
            env[entry["name"]] = entry["value"]
        # What the test adds (a no-GPU machine needs T4SERVE_PREFLIGHT=warn; the stand-in's knobs), over the pod's.
        env.update(extra_env)
        opts, after = _docker_run_args(pod, self.scratch, image, secrets)
        cmd = [docker, "run", "-d", "--name", self.name, *opts]
        for key, value in env.items():
            cmd += ["-e", f"{key}={value}"]
        self.verdict = Verdict()
        self._stop = threading.Event()
        self._ready = False
        self._lock = threading.Lock()
        subprocess.run([*cmd, *after], check=True, capture_output=True, timeout=60)
        self.verdict.started_at = time.monotonic()
        self._workers: list[threading.Thread] = []

    # ------------------------------------------------------------------------------------------------------ probes

    def exec_probe(self, probe: str, spec: Obj) -> ProbeResult:
        command = spec["exec"]["command"]
        timeout = float(spec.get("timeoutSeconds", 1))
        started = time.monotonic()
        try:
            out = subprocess.run([self.docker, "exec", self.name, *command], capture_output=True, text=True,
                                 timeout=timeout)  # fmt: skip
            ok, output = out.returncode == 0, (out.stdout + out.stderr).strip()
        except subprocess.TimeoutExpired:
            ok, output = False, f"probe timed out after {timeout:g} s"
        result = ProbeResult(probe, started, time.monotonic(), ok, output)
        with self._lock:
            self.verdict.results.append(result)
        return result

    def _worker(self, probe: str, spec: Obj) -> None:
        period = float(spec.get("periodSeconds", 10))
        failures_needed = int(spec.get("failureThreshold", 3))
        successes_needed = int(spec.get("successThreshold", 1))
        failures = successes = 0
        next_at = time.monotonic() + float(spec.get("initialDelaySeconds", 0))
        while not self._stop.wait(max(0.0, next_at - time.monotonic())):
            next_at += period
            result = self.exec_probe(probe, spec)
            # A probe that took longer than its period delays the next one instead of overlapping it.
            next_at = max(next_at, time.monotonic())
            failures, successes = (0, successes + 1) if result.ok else (failures + 1, 0)
            if probe == "startup":
                if result.ok:
                    self.verdict.startup_succeeded_at = result.ended
                    self._start_after_startup()
                    return
                if failures >= failures_needed:
                    self.verdict.startup_failed_at = result.ended
                    self._stop.set()
                    return
            elif probe == "readiness":
                ready = self._ready
                if result.ok and successes >= successes_needed:
                    ready = True
                elif not result.ok and failures >= failures_needed:
                    ready = False
                if ready != self._ready:
                    self._ready = ready
                    with self._lock:
                        self.verdict.ready_changes.append((result.ended, ready))
            elif probe == "liveness" and failures >= failures_needed:
                self.verdict.liveness_failed_at = result.ended
                self._stop.set()
                return

    def _spawn(self, probe: str, key: str) -> None:
        spec = self.ctr.get(key)
        if spec is None:
            return
        thread = threading.Thread(target=self._worker, args=(probe, spec), daemon=True)
        self._workers.append(thread)
        thread.start()

    def _start_after_startup(self) -> None:
        self._spawn("readiness", "readinessProbe")
        self._spawn("liveness", "livenessProbe")

    def start_probing(self) -> None:
        if "startupProbe" in self.ctr:
            self._spawn("startup", "startupProbe")
        else:
            self.verdict.startup_succeeded_at = time.monotonic()
            self._start_after_startup()

    def wait_until(self, condition: Any, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if condition():
                return True
            if self._stop.is_set():
                return bool(condition())
            time.sleep(0.2)
        return bool(condition())

    def stop_probing(self) -> None:
        self._stop.set()
        for thread in self._workers:
            thread.join(timeout=30)

    # ------------------------------------------------------------------------------------------------- termination

    def terminate(self) -> Termination:
        """preStop, then SIGTERM, then SIGKILL at the end of the grace period; the container's exit code."""
        grace = float(self.pod["spec"].get("terminationGracePeriodSeconds", 30))
        began = time.monotonic()
        hook = self.ctr.get("lifecycle", {}).get("preStop")
        rc = 0
        if hook is not None:
            if "exec" not in hook:
                raise Unsupported(f"preStop {sorted(hook)}")
            try:
                rc = subprocess.run([self.docker, "exec", self.name, *hook["exec"]["command"]], capture_output=True,
                                    timeout=grace).returncode  # fmt: skip
            except subprocess.TimeoutExpired:
                rc = -1
        prestop_ended = time.monotonic()
        subprocess.run([self.docker, "kill", "--signal", "TERM", self.name], capture_output=True, timeout=30)
        sigterm_at = time.monotonic()
        left = max(1.0, grace - (sigterm_at - began))
        killed = False
        try:
            out = subprocess.run([self.docker, "wait", self.name], capture_output=True, text=True, timeout=left)
        except subprocess.TimeoutExpired:
            killed = True
            subprocess.run([self.docker, "kill", self.name], capture_output=True, timeout=30)
            out = subprocess.run([self.docker, "wait", self.name], capture_output=True, text=True, timeout=30)
        return Termination(began, prestop_ended, rc, sigterm_at, time.monotonic(), killed, int(out.stdout.strip()))

    # ---------------------------------------------------------------------------------------------------- helpers

    def host_port(self, container_port: int) -> int:
        out = subprocess.run([self.docker, "port", self.name, f"{container_port}/tcp"], capture_output=True, text=True,
                             check=True, timeout=30)  # fmt: skip
        return int(out.stdout.splitlines()[0].rsplit(":", 1)[1])

    def state(self) -> Obj:
        """The server's state file, also from a stopped container."""
        target = self.scratch / "state.json"
        subprocess.run([self.docker, "cp", f"{self.name}:/tmp/t4serve/state.json", str(target)], check=True,
                       capture_output=True, timeout=30)  # fmt: skip
        data: Obj = json.loads(target.read_text())
        return data

    def logs(self) -> str:
        out = subprocess.run([self.docker, "logs", self.name], capture_output=True, text=True, timeout=30)
        return out.stdout + out.stderr

    def remove(self) -> None:
        self.stop_probing()
        subprocess.run([self.docker, "rm", "-f", "-v", self.name], capture_output=True, timeout=60)
        shutil.rmtree(self.scratch, ignore_errors=True)
