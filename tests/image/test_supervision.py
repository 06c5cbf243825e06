"""Supervision in the image, with the stand-in server as `vllm` (t4serve:standin, built here from standin.Dockerfile):
phases and figures, ready only after the canary, canary failure, crash -> restart -> give up, hang, SIGTERM drain,
telemetry without NVML. No GPU here: T4SERVE_PREFLIGHT=warn lets serve start past the no-GPU finding."""

from __future__ import annotations

import json
import os
import random
import subprocess
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from t4serve.contract import StatusAnswer, read_answer
from t4serve.serde import to_dict

from .conftest import REPO

pytestmark = pytest.mark.image

# A private tag (T4SERVE_STANDIN_IMAGE) lets a run build its own stand-in image beside one another run is using.
STANDIN = os.environ.get("T4SERVE_STANDIN_IMAGE", "t4serve:standin")
BASE_ENV = {"T4SERVE_PREFLIGHT": "warn", "HF_HUB_OFFLINE": "1", "T4SERVE_DTYPE": "float16"}


@pytest.fixture(scope="module")
def standin(docker_bin: str, image_ref: str) -> str:
    build = subprocess.run(
        [docker_bin, "build", "-q", "-f", "tests/image/standin.Dockerfile", "--build-arg", f"BASE={image_ref}",
         "-t", STANDIN, "."],
        cwd=REPO, capture_output=True, text=True, timeout=600, env={"DOCKER_BUILDKIT": "1", "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert build.returncode == 0, build.stdout + build.stderr
    return STANDIN


Start = Callable[..., str]


@pytest.fixture
def start(docker_bin: str, standin: str) -> Iterator[Start]:
    names: list[str] = []

    def run(env: dict[str, str], *extra: str) -> str:
        name = f"t4s-test-{uuid.uuid4().hex[:8]}"
        cmd = [docker_bin, "run", "-d", "--name", name, *extra]
        for k, v in {**BASE_ENV, **env}.items():
            cmd += ["-e", f"{k}={v}"]
        subprocess.run([*cmd, standin], check=True, capture_output=True, timeout=60)
        names.append(name)
        return name

    yield run
    for name in names:
        # -v: the image declares VOLUME /cache, and without it every test container would leave an anonymous volume.
        subprocess.run([docker_bin, "rm", "-f", "-v", name], capture_output=True, timeout=60)


def dexec(docker: str, name: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([docker, "exec", name, *args], capture_output=True, text=True, timeout=30)


def state(docker: str, name: str) -> dict[str, Any]:
    """The server's state as the host reads it: `t4serve status --json`'s typed answer (t4serve.contract)."""
    argv = ["t4serve", "status", "--json"]
    out = dexec(docker, name, *argv)
    if out.returncode != 0:
        return {}
    answer = read_answer(StatusAnswer, argv, out.returncode, out.stdout, out.stderr, name)
    return to_dict(answer.state) if answer.state is not None else {"phase": answer.phase}


def wait_phase(docker: str, name: str, phases: set[str], timeout: float = 60.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        s = state(docker, name)
        if s.get("phase") in phases:
            return s
        time.sleep(0.5)
    logs = subprocess.run([docker, "logs", name], capture_output=True, text=True).stdout
    pytest.fail(f"{name} never reached {phases}; last state {state(docker, name).get('phase')}; logs:\n{logs[-3000:]}")


def wait_exit(docker: str, name: str, timeout: float) -> int:
    out = subprocess.run([docker, "wait", name], capture_output=True, text=True, timeout=timeout)
    return int(out.stdout.strip())


def logs(docker: str, name: str) -> str:
    out = subprocess.run([docker, "logs", name], capture_output=True, text=True, timeout=30)
    return out.stdout + out.stderr


def test_phases_figures_and_ready_only_after_canary(docker_bin: str, start: Start) -> None:
    name = start({"T4SERVE_STANDIN_LOAD_SECONDS": "3"})
    s = wait_phase(docker_bin, name, {"ready", "canary_failed", "failed"})
    assert s["phase"] == "ready"
    phases = [m["phase"] for m in s["phases"]]
    assert phases == ["starting", "loading_weights", "profiling", "compiling", "canary", "ready"]
    times = [m["began_at"] for m in s["phases"]]
    assert times == sorted(times)
    assert s["canary"]["ok"] and "391" in s["canary"]["text"]
    figures = {k: v["value"] for k, v in s["figures"].items()}
    assert figures["model_memory_gib"] == 8.02 and figures["model_load_seconds"] == 98.7
    assert figures["kv_tokens"] == 315974 and figures["max_model_len"] == 16384 and figures["max_concurrency"] == 19.29
    hc = dexec(docker_bin, name, "t4serve", "healthcheck")
    assert hc.returncode == 0, hc.stderr
    status = dexec(docker_bin, name, "t4serve", "status").stdout
    assert "phase:    ready" in status and "max_concurrency: 19.29 x" in status


def test_an_arbitrary_uid_in_group_0_serves_to_ready(docker_bin: str, start: Start) -> None:
    """OpenShift's way (a random uid, group 0; Kubernetes' runAsUser alike): serve writes its state, supervisord runs
    the stand-in, the canary passes and the healthcheck (docker exec runs as the same uid) says ready."""
    uid = str(random.randint(100_000, 2_000_000_000))
    name = start({"T4SERVE_STANDIN_LOAD_SECONDS": "2"}, "--user", f"{uid}:0")
    s = wait_phase(docker_bin, name, {"ready", "canary_failed", "failed"})
    assert s["phase"] == "ready", logs(docker_bin, name)[-3000:]
    who = dexec(docker_bin, name, "sh", "-c", "id -u; id -g; echo $HOME; stat -c %u /tmp/t4serve/state.json")
    assert who.stdout.split() == [uid, "0", "/home/t4serve", uid], who
    hc = dexec(docker_bin, name, "t4serve", "healthcheck")
    assert hc.returncode == 0, hc.stderr
    assert "Traceback" not in logs(docker_bin, name)


def test_healthcheck_reports_phase_during_slow_load(docker_bin: str, start: Start) -> None:
    name = start({"T4SERVE_STANDIN_MODE": "slow-load", "T4SERVE_STANDIN_LOAD_SECONDS": "30"})
    wait_phase(docker_bin, name, {"loading_weights", "profiling"}, timeout=30)
    hc = dexec(docker_bin, name, "t4serve", "healthcheck")
    print(f"\nhealthcheck during load: {hc.stderr.strip()}")
    assert hc.returncode == 1
    assert hc.stderr.startswith("t4serve healthcheck: not ready: ") and "since vLLM started" in hc.stderr


def test_canary_failure_is_unhealthy_with_reason_and_fp16_hint(docker_bin: str, start: Start) -> None:
    name = start({"T4SERVE_STANDIN_MODE": "garbage", "T4SERVE_STANDIN_GARBAGE": "pad"})
    s = wait_phase(docker_bin, name, {"ready", "canary_failed", "failed"})
    assert s["phase"] == "canary_failed"
    assert "wrong answer" in s["reason"] and "float16 overflow" in s["fix"]
    hc = dexec(docker_bin, name, "t4serve", "healthcheck")
    assert hc.returncode == 1 and "canary failed" in hc.stderr and "hint: float16 overflow" in hc.stderr


def test_crash_on_load_goes_fatal_and_the_container_exits_non_zero(docker_bin: str, start: Start) -> None:
    name = start({"T4SERVE_STANDIN_MODE": "crash-on-load", "T4SERVE_STANDIN_CRASH_LOG": "clamp",
                  "T4SERVE_MAX_RESTARTS": "1"})  # fmt: skip
    code = wait_exit(docker_bin, name, timeout=120)
    text = logs(docker_bin, name)
    assert code == 1, text[-3000:]
    assert "diagnosis: vLLM's Triton attention asked for more shared memory" in text
    assert "Hardware limit: 65536" in text and "went FATAL" in text
    assert "t4serve: exiting 1: vLLM went FATAL" in text


def test_crash_restart_repeated_crash_exits_non_zero(docker_bin: str, start: Start) -> None:
    # Each attempt lives past startsecs (10 s), so supervisord counts real exits and restarts; the listener gives up
    # on the second exit with T4SERVE_MAX_RESTARTS=1.
    name = start({"T4SERVE_STANDIN_MODE": "crash-after-ready", "T4SERVE_STANDIN_CRASH_AFTER": "11",
                  "T4SERVE_MAX_RESTARTS": "1"})  # fmt: skip
    code = wait_exit(docker_bin, name, timeout=120)
    text = logs(docker_bin, name)
    assert code == 1, text[-3000:]
    # supervisord may respawn once more before the listener's SIGTERM lands; the give-up is what ends it.
    assert text.count("spawned: 'vllm'") >= 2
    assert "attempt 2: starting" in text
    assert "vLLM exited 2 times within 300 s" in text
    assert "illegal memory access" in text


def test_hang_makes_healthcheck_unhealthy(docker_bin: str, start: Start) -> None:
    name = start({"T4SERVE_STANDIN_MODE": "hang", "T4SERVE_STANDIN_HANG_AFTER": "2"})
    wait_phase(docker_bin, name, {"ready"})
    time.sleep(3)
    began = time.monotonic()
    hc = dexec(docker_bin, name, "t4serve", "healthcheck")
    took = time.monotonic() - began
    print(f"\nhealthcheck on a hung server took {took:.1f} s: {hc.stderr.strip()}")
    assert hc.returncode == 1 and "did not answer within 6 s" in hc.stderr and took < 10


def test_sigterm_drains_in_flight_request_within_grace(docker_bin: str, start: Start) -> None:
    name = start(
        {"T4SERVE_STANDIN_TOKEN_DELAY": "0.25", "T4SERVE_SHUTDOWN_TIMEOUT": "15"}, "-p", "127.0.0.1::8000"
    )
    s = wait_phase(docker_bin, name, {"ready"})
    port = subprocess.run([docker_bin, "port", name, "8000/tcp"], capture_output=True, text=True).stdout.split(":")[-1]
    result: dict[str, Any] = {}

    def request() -> None:
        body = json.dumps({"model": s["served_model_name"], "prompt": "hello", "max_tokens": 20, "temperature": 0})
        req = urllib.request.Request(f"http://127.0.0.1:{port.strip()}/v1/completions", data=body.encode(),
                                     headers={"Content-Type": "application/json"})  # fmt: skip
        try:
            with urllib.request.urlopen(req, timeout=60) as response:
                result["status"] = response.status
                result["body"] = json.loads(response.read())
        except Exception as exc:  # recorded for the assertion message
            result["error"] = repr(exc)

    client = threading.Thread(target=request)
    client.start()
    time.sleep(1.0)  # the request is in flight: 20 tokens x 0.25 s
    began = time.monotonic()
    subprocess.run([docker_bin, "stop", "-t", "90", name], check=True, capture_output=True, timeout=120)
    stopped = time.monotonic() - began
    client.join(timeout=60)
    code = wait_exit(docker_bin, name, timeout=10)
    print(f"\ndocker stop took {stopped:.1f} s (grace 90 s); in-flight request: {result.get('status')}")
    assert result.get("status") == 200, result
    assert result["body"]["usage"]["completion_tokens"] == 20
    assert stopped < 90 and code == 0
    assert "passing SIGTERM to vLLM" in logs(docker_bin, name)


def test_telemetry_without_nvml_exits_cleanly_once(docker_bin: str, start: Start) -> None:
    name = start({"T4SERVE_STANDIN_LOAD_SECONDS": "1"})
    wait_phase(docker_bin, name, {"ready"})
    text = logs(docker_bin, name)
    assert text.count("telemetry: no GPU telemetry") == 1
    assert "exited: telemetry (exit status 0; expected)" in text
    assert text.count("spawned: 'telemetry'") == 1


API_KEY = "sk-image-test-SECRET-0f9e8d7c6b5a"
CMDLINES = (
    "import pathlib\n"
    "for p in pathlib.Path('/proc').glob('[0-9]*/cmdline'):\n"
    "    try: print(p.read_bytes().replace(b'\\0', b' ').decode(errors='replace'))\n"
    "    except OSError: pass\n"
)


def test_api_key_from_a_secret_file_guards_v1_and_shows_nowhere(docker_bin: str, start: Start, tmp_path: Any) -> None:
    key_file = tmp_path / "api_key"
    key_file.write_text(API_KEY + "\n")
    key_file.chmod(0o644)  # the container's user (uid 1000) reads the bind-mounted file
    name = start({"T4SERVE_API_KEY_FILE": "/run/secrets/api_key", "T4SERVE_STANDIN_LOAD_SECONDS": "1"},
                 "-v", f"{key_file}:/run/secrets/api_key:ro", "-p", "127.0.0.1::8000")  # fmt: skip
    s = wait_phase(docker_bin, name, {"ready", "canary_failed", "failed"})
    assert s["phase"] == "ready" and s["canary"]["ok"], s.get("reason")
    port = subprocess.run([docker_bin, "port", name, "8000/tcp"], capture_output=True, text=True).stdout
    base = f"http://127.0.0.1:{port.strip().split(':')[-1]}"

    def get(path: str, headers: dict[str, str]) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(urllib.request.Request(base + path, headers=headers), timeout=10) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()

    assert get("/v1/models", {}) == (401, json.dumps({"error": "Unauthorized"}))
    assert get("/v1/models", {"Authorization": "Bearer sk-wrong"})[0] == 401
    status, body = get("/v1/models", {"Authorization": f"Bearer {API_KEY}"})
    assert status == 200 and s["served_model_name"] in body
    assert get("/health", {})[0] == 200
    hc = dexec(docker_bin, name, "t4serve", "healthcheck")
    assert hc.returncode == 0, hc.stderr
    # What `ps` shows is each process's /proc/PID/cmdline (the image has no ps): read them all, as the container user.
    cmdlines = dexec(docker_bin, name, "python3", "-c", CMDLINES).stdout
    assert "vllm serve" in cmdlines and "run-vllm" in cmdlines, cmdlines
    assert API_KEY not in cmdlines
    host_ps = subprocess.run(["ps", "-eww", "-o", "args"], capture_output=True, text=True).stdout
    if f"--served-model-name {s['served_model_name']}" in host_ps:  # a local engine: the host sees the processes
        assert API_KEY not in host_ps
    else:
        print("\nthe host's ps does not see the container's processes (remote engine); checked inside only")
    files = dexec(docker_bin, name, "sh", "-c", "cat /tmp/t4serve/*").stdout
    assert "vllm" in files and API_KEY not in files
    inspect = subprocess.run([docker_bin, "inspect", name], capture_output=True, text=True).stdout
    assert "/run/secrets/api_key" in inspect and API_KEY not in inspect
    assert API_KEY not in logs(docker_bin, name)


# Issue 21: the compile ladder's files in the cache volume are untrusted. A record of the wrong shape and a FIFO where
# the lock belongs, in the real image under supervisord: the server still gets ready, the failure to record is said,
# and `docker stop` ends the container promptly (a FIFO lock once blocked the wrapper in open(), deaf to SIGTERM).


def _hostile_cache(tmp_path: Any) -> str:
    cache = tmp_path / "cache-t4serve"
    cache.mkdir()
    cache.chmod(0o777)  # the image's user (uid 1000) renames and writes here
    (cache / "compile-ladder.json").write_text(json.dumps({"k": {"rung": "lean", "failed": 5}}))
    for lock in ("compile-ladder.lock", "start-history.lock"):
        os.mkfifo(cache / lock)
        (cache / lock).chmod(0o666)  # mkfifo's mode passes through the umask
    return str(cache)


def test_a_hostile_compile_record_and_lock_neither_stop_the_server_nor_its_stop(
    docker_bin: str, start: Start, tmp_path: Any
) -> None:
    cache = _hostile_cache(tmp_path)
    name = start({}, "-v", f"{cache}:/cache/t4serve")
    ready = wait_phase(docker_bin, name, {"ready", "failed"})
    text = logs(docker_bin, name)
    assert ready["phase"] == "ready", text[-3000:]
    assert "compile record unusable" in text and "compile-ladder.lock must be a regular file (it is a FIFO)" in text
    began = time.monotonic()
    subprocess.run([docker_bin, "stop", "-t", "60", name], capture_output=True, timeout=90, check=True)
    took = time.monotonic() - began
    print(f"\ndocker stop with a FIFO lock in the cache volume took {took:.1f} s")
    assert took < 30, logs(docker_bin, name)[-3000:]


def test_a_compile_oom_that_cannot_be_recorded_says_so_in_the_state(
    docker_bin: str, start: Start, tmp_path: Any
) -> None:
    cache = _hostile_cache(tmp_path)
    name = start({"T4SERVE_STANDIN_COMPILE_OOM_WITHOUT": "--enforce-eager", "T4SERVE_MAX_RESTARTS": "0"},
                 "-v", f"{cache}:/cache/t4serve")  # fmt: skip
    code = wait_exit(docker_bin, name, timeout=180)
    text = logs(docker_bin, name)
    assert code != 0, text[-3000:]
    assert "could not record compile rung lean" in text and "T4SERVE_COMPILE=lean" in text, text[-3000:]
    assert "Traceback (most recent call last)" not in text.split("[vllm]")[0]
