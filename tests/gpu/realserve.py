"""The real-serve test bed: `t4serve serve` driving a real vLLM on a real NVIDIA GPU, optionally made a T4 in memory.

Pieces, each usable from pytest (tests/gpu/test_real_serve.py) and from the command line of a GPU host:
- `Ballast(leave_bytes)`: a process that holds all of the device's free memory but `leave_bytes`, so a bigger card
  offers vLLM what a T4 offers (15,360 MiB) and an out-of-memory on a cold start is real, not absorbed.
- `Server`: one `t4serve serve` with its own state, cache, compile caches, ports and log file; reads state.json,
  runs `t4serve healthcheck` and `t4serve status`, finds vLLM's engine core in its process tree, stops it.
- `probe_records(dir)`: what tests/gpu/probe_hook/sitecustomize.py recorded in each server process (torch's peak
  reserved memory, the device's lowest free memory, the packages imported).
- `complete(...)`: one completion request with its latency, token count and TTFT (streamed).

Nothing here stands in for anything: the server, vLLM, the GPU and the checkpoints (tests/unit/e2b_checkpoint.py,
zero weights) are real. Requires t4serve, supervisord and vllm on PATH (tests/gpu/offline-host.sh makes them so on a
host without the image).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ballast import T4_MEMORY_BYTES, Ballast  # noqa: F401 - re-exported: the tests take them from here

from t4serve.supervise.children import descendants, kill_tree

HERE = Path(__file__).resolve().parent
PROBE_HOOK = HERE / "probe_hook"


def vllm_version() -> str | None:
    """The vLLM on this Python's path, without importing it (importing initialises far too much)."""
    from importlib import metadata

    try:
        return metadata.version("vllm")
    except metadata.PackageNotFoundError:
        return None


# --- processes -----------------------------------------------------------------------------------------------------


def process_tree(root: int) -> list[int]:
    return [root, *descendants(root)]


def comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


# --- one server ----------------------------------------------------------------------------------------------------


@dataclass
class Server:
    """`t4serve serve` with everything of its own under `root`; `env` is added to the caller's environment."""

    name: str
    root: Path
    model: str
    port: int
    env: Mapping[str, str] = field(default_factory=dict)
    proc: subprocess.Popen[bytes] | None = None
    started_at: float = 0.0

    @property
    def state_dir(self) -> Path:
        return self.root / "state"

    @property
    def log_path(self) -> Path:
        return self.root / "serve.log"

    @property
    def probe_dir(self) -> Path:
        return self.root / "probe"

    def environment(self) -> dict[str, str]:
        compile_root = self.root / "compile"
        env = dict(os.environ)
        env.update(
            {
                "T4SERVE_MODEL": self.model,
                "T4SERVE_PORT": str(self.port),
                "T4SERVE_TELEMETRY_PORT": str(self.port + 1000),
                "T4SERVE_STATE_DIR": str(self.state_dir),
                "T4SERVE_CACHE_DIR": str(self.root / "cache"),
                "HF_HOME": str(self.root / "hf"),
                "HF_HUB_OFFLINE": "1",
                # Outside the image there is no build manifest: preflight reports it and starts anyway.
                "T4SERVE_PREFLIGHT": "warn",
                "VLLM_CACHE_ROOT": str(compile_root / "vllm"),
                "TORCHINDUCTOR_CACHE_DIR": str(compile_root / "inductor"),
                "TRITON_CACHE_DIR": str(compile_root / "triton"),
                "T4SERVE_GPU_PROBE_DIR": str(self.probe_dir),
                "PYTHONPATH": os.pathsep.join([str(PROBE_HOOK), os.environ.get("PYTHONPATH", "")]),
            }
        )
        env.update(self.environment_added())
        return env

    def environment_added(self) -> dict[str, str]:
        """This server's own settings, with the host's extra vLLM flags (T4SERVE_GPU_VLLM_ARGS, set by
        tests/gpu/gpu-host.sh where the host needs one for every server) after the server's T4SERVE_VLLM_ARGS."""
        added = dict(self.env)
        extra = os.environ.get("T4SERVE_GPU_VLLM_ARGS", "").strip()
        if extra:
            added["T4SERVE_VLLM_ARGS"] = " ".join(filter(None, [added.get("T4SERVE_VLLM_ARGS", ""), extra]))
        return added

    def start(self) -> Server:
        for d in (self.state_dir, self.probe_dir, self.root / "cache", self.root / "hf"):
            d.mkdir(parents=True, exist_ok=True)
        # A second start in the same root (the warm half of a cold-then-warm test) must not read the first one's
        # "ready" in the instant before serve replaces it (seen on the GPU host: the warm start "ready" in 0.3 s),
        # nor count the first start's peaks as its own.
        (self.state_dir / "state.json").unlink(missing_ok=True)
        for old in self.probe_dir.glob("*.json"):
            old.unlink()
        log = open(self.log_path, "ab")  # noqa: SIM115 - the child owns it for its life
        self.started_at = time.time()
        self.proc = subprocess.Popen(
            [shutil.which("t4serve") or "t4serve", "serve"],
            env=self.environment(),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        log.close()
        return self

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def state(self) -> dict[str, Any]:
        try:
            data: dict[str, Any] = json.loads((self.state_dir / "state.json").read_text())
            return data
        except (OSError, ValueError):
            return {}

    def phase(self) -> str:
        return str(self.state().get("phase", "absent"))

    def wait_phase(self, wanted: tuple[str, ...], timeout: float, attempt: int | None = None) -> str:
        """Wait until the phase is one of `wanted` (in attempt `attempt` if given) or serve exits; the phase seen."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            state = self.state()
            phase = str(state.get("phase", "absent"))
            if phase in wanted and (attempt is None or state.get("attempt") == attempt):
                return phase
            if self.proc is not None and self.proc.poll() is not None:
                return f"exited {self.proc.returncode} in {phase}"
            time.sleep(0.5)
        return f"timeout in {self.phase()}"

    def run_t4serve(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [shutil.which("t4serve") or "t4serve", *args, "--state-dir", str(self.state_dir)],
            env=self.environment(),
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def healthcheck(self) -> int:
        return self.run_t4serve("healthcheck").returncode

    def engine_core_pids(self) -> list[int]:
        """vLLM's engine core process(es): vLLM titles them VLLM::EngineCore (comm is cut at 15 characters)."""
        if self.proc is None:
            return []
        return [p for p in process_tree(self.proc.pid) if comm(p).startswith("VLLM::EngineCor")]

    def signal(self, sig: int) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)

    def wait(self, timeout: float) -> int | None:
        if self.proc is None:
            return None
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def kill(self) -> None:
        """Everything this server started, at once (its own session)."""
        if self.proc is None:
            return
        # The tree first: once serve dies, vLLM's engine core is re-parented to init and would hold its GPU memory
        # on (seen on the GPU host: six 14 GB engine cores outlived a measurement and starved the next test).
        kill_tree(self.proc.pid)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(30)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@contextlib.contextmanager
def running(*servers: Server) -> Iterator[tuple[Server, ...]]:
    try:
        yield tuple(s.start() for s in servers)
    finally:
        for s in servers:
            s.kill()


# --- what the probe hook recorded ----------------------------------------------------------------------------------


def probe_records(probe_dir: Path) -> list[dict[str, Any]]:
    out = []
    for path in sorted(probe_dir.glob("mem-*.json")):
        with contextlib.suppress(OSError, ValueError):
            out.append(json.loads(path.read_text()))
    return out


def peak_reserved(probe_dir: Path) -> int:
    """Torch's peak reserved bytes over this server's processes (the engine core holds nearly all of it)."""
    return sum(int(r.get("max_reserved", 0)) for r in probe_records(probe_dir))


def min_device_free(probe_dir: Path) -> int | None:
    values = [int(r["min_device_free"]) for r in probe_records(probe_dir) if "min_device_free" in r]
    return min(values) if values else None


def imported_packages(probe_dir: Path) -> dict[str, list[str]]:
    """cmdline -> the top-level packages that process had imported (last record)."""
    out = {}
    cmdlines = {str(r["pid"]): str(r.get("cmdline", "")) for r in probe_records(probe_dir)}
    for path in sorted(probe_dir.glob("modules-*.txt")):
        pid = path.stem.split("-", 1)[1]
        out[cmdlines.get(pid) or pid] = path.read_text().split()
    return out


# --- requests ------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Completion:
    status: int
    tokens: int
    seconds: float
    ttft_seconds: float | None
    text: str
    error: str | None = None


def complete(base_url: str, model: str, prompt: str, max_tokens: int, *, timeout: float = 600,
             stream: bool = False) -> Completion:
    """One greedy completion that never stops early (ignore_eos), timed; streamed to time the first token."""
    body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": stream,
    }
    if stream:
        body["stream_options"] = {"include_usage": True}
    request = urllib.request.Request(
        f"{base_url}/v1/completions", data=json.dumps(body).encode(), headers={"content-type": "application/json"}
    )
    start = time.perf_counter()
    ttft = None
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            if not stream:
                data = json.loads(response.read())
                return Completion(response.status, int(data["usage"]["completion_tokens"]),
                                  time.perf_counter() - start, None, data["choices"][0]["text"])
            tokens, text = 0, []
            for raw in response:
                line = raw.decode().strip()
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if chunk.get("choices"):
                    if ttft is None:
                        ttft = time.perf_counter() - start
                    text.append(chunk["choices"][0].get("text", ""))
                if chunk.get("usage"):
                    tokens = int(chunk["usage"]["completion_tokens"])
            return Completion(response.status, tokens, time.perf_counter() - start, ttft, "".join(text))
    except (urllib.error.URLError, OSError, ValueError, KeyError) as exc:
        status = exc.code if isinstance(exc, urllib.error.HTTPError) else 0
        return Completion(status, 0, time.perf_counter() - start, ttft, "", f"{type(exc).__name__}: {exc}")


def random_prompt(tokens: int, seed: int = 0) -> str:
    """`tokens` words of the test tokenizer's vocabulary (`t0` ... `t262143`): exactly that many tokens."""
    import random

    rng = random.Random(seed)
    return " ".join(f"t{rng.randrange(10, 262_000)}" for _ in range(tokens))


def write_json(path: Path, data: object) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")
    tmp.replace(path)
