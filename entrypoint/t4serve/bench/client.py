"""The `vllm bench serve` client a sweep measures with, and what its time went to.

- `SweepClient` (`t4serve bench --client sweep`, the default): one process for the whole sweep,
  t4serve/bench/clientworker.py under a Python with vLLM (this one by default: the image's, the GPU host's), started
  by the first run. vLLM and torch are imported once (about 20-35 s on the GPU hosts so far, where each run of the
  earlier process-per-run client paid it: 20 s of start-up behind 2-7 s measured); each run then is vLLM's own
  `vllm.benchmarks.serve.main` called in that process with the arguments `vllm bench serve` would parse. A run past
  its timeout stops the process; the next run starts another, and records that start-up as its own.
- `PerRunClient` (`--client per-run`): `--vllm CMD bench serve ...`, a process per run: a vLLM in another
  environment than t4serve's, or one this Python cannot import.

Both send the API key as OPENAI_API_KEY in the client's environment (vllm/benchmarks/lib/endpoint_request_func.py
reads it), never on a command line; both append the run's output to its log in raw/.
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import shlex
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from t4serve.supervise.children import stop_child
from t4serve.units import fmt_duration

WORKER = Path(__file__).resolve().with_name("clientworker.py")
# Seconds the sweep's client may take to import vLLM (a cold page cache on a small host: a minute or two).
START_TIMEOUT_S = 600.0
CLIENT_LOG = "client.log"


@dataclass(frozen=True)
class ClientRun:
    """What one run in the client came to: its exit status (None: stopped at the timeout), its time in the client,
    the start-up paid before it (None: not separable, a process per run), or why it could not run at all."""

    rc: int | None
    wall_s: float
    client_start_s: float | None
    error: str | None = None


class Client(Protocol):
    kind: str

    def run(self, args: list[str], log: Path, timeout: float) -> ClientRun: ...

    def close(self) -> None: ...


def client_env(api_key: str | None, environ: Mapping[str, str]) -> dict[str, str]:
    """The client's environment: bench's own (`run_bench`'s environ), with the API key as OPENAI_API_KEY."""
    env = dict(environ)
    if api_key:
        env["OPENAI_API_KEY"] = api_key
    return env


class PerRunClient:
    """`CMD bench serve ARGS` as a process per run."""

    kind = "per-run"

    def __init__(self, vllm: str, api_key: str | None, environ: Mapping[str, str]) -> None:
        self.command = shlex.split(vllm)
        self.env = client_env(api_key, environ)

    def argv(self, args: list[str]) -> list[str]:
        return [*self.command, "bench", "serve", *args]

    def run(self, args: list[str], log: Path, timeout: float) -> ClientRun:
        argv = self.argv(args)
        began = time.monotonic()
        with log.open("w", encoding="utf-8") as out:
            out.write("$ " + shlex.join(argv) + "\n")
            out.flush()
            try:
                rc: int | None = subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT, timeout=timeout,
                                                check=False, env=self.env).returncode
            except subprocess.TimeoutExpired:
                rc = None
            except OSError as exc:
                return ClientRun(None, time.monotonic() - began, None, f"cannot run {argv[0]}: {exc}")
        return ClientRun(rc, time.monotonic() - began, None)

    def close(self) -> None:
        pass


class SweepClient:
    """One client process for the sweep (the module's docstring says how); started by the first run."""

    kind = "sweep"

    def __init__(self, python: str, log_dir: Path, api_key: str | None, environ: Mapping[str, str],
                 start_timeout: float = START_TIMEOUT_S) -> None:
        self.python = python
        self.log_dir = log_dir
        self.env = client_env(api_key, environ)
        self.start_timeout = start_timeout
        self.proc: subprocess.Popen[bytes] | None = None
        self.buffer = b""
        self.broken: str | None = None  # why the client cannot start: every later run fails with it, at once
        self.starts: list[float] = []

    def _start(self) -> float:
        """Start the process and wait for its "ready"; seconds it took. Sets self.broken where it cannot."""
        began = time.monotonic()
        with (self.log_dir / CLIENT_LOG).open("ab") as err:
            self.proc = subprocess.Popen([self.python, str(WORKER)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=err, env=self.env, start_new_session=True)
        self.buffer = b""
        hello = self._answer(self.start_timeout)
        took = time.monotonic() - began
        if hello is None or not hello.get("ready"):
            why = hello.get("error") if hello else (
                f"it did not say it was ready within {fmt_duration(self.start_timeout)}" if self.proc.poll() is None
                else f"it exited {self.proc.returncode} before it was ready")
            self.broken = (f"the sweep's client ({self.python} {WORKER.name}) cannot run `vllm bench serve`: {why}; "
                           f"see raw/{CLIENT_LOG}; --client per-run --vllm CMD runs a vLLM of another environment")
            self._stop()
        else:
            self.starts.append(took)
        return took

    def _answer(self, timeout: float) -> dict[str, Any] | None:
        """The next line the process writes, as JSON; None at the timeout or when it ends first."""
        proc = self.proc
        assert proc is not None and proc.stdout is not None
        deadline = time.monotonic() + timeout
        with selectors.DefaultSelector() as sel:
            sel.register(proc.stdout, selectors.EVENT_READ)
            while b"\n" not in self.buffer:
                left = deadline - time.monotonic()
                if left <= 0 or not sel.select(left):
                    return None
                chunk = os.read(proc.stdout.fileno(), 65536)
                if not chunk:
                    return None
                self.buffer += chunk
        line, _, self.buffer = self.buffer.partition(b"\n")
        try:
            data = json.loads(line)
        except ValueError:
            return None
        return data if isinstance(data, dict) else None

    def run(self, args: list[str], log: Path, timeout: float) -> ClientRun:
        start_s = 0.0
        if self.proc is None and self.broken is None:
            start_s = self._start()
        if self.broken is not None or self.proc is None or self.proc.stdin is None:
            with log.open("w", encoding="utf-8") as out:
                out.write(f"{self.broken}\n")
            return ClientRun(None, 0.0, start_s, self.broken)
        with log.open("w", encoding="utf-8") as out:
            out.write(f"$ vllm bench serve {shlex.join(args)}  (in the sweep's client, pid {self.proc.pid})\n")
        began = time.monotonic()
        try:
            self.proc.stdin.write((json.dumps({"args": args, "log": str(log)}) + "\n").encode())
            self.proc.stdin.flush()
            reply = self._answer(timeout)
        except OSError:
            reply = None
        wall = time.monotonic() - began
        if reply is not None:
            return ClientRun(int(reply.get("rc", 1)), wall, start_s)
        timed_out = self.proc.poll() is None
        code = self._stop(kill=timed_out)
        if timed_out:
            return ClientRun(None, wall, start_s)
        return ClientRun(code if code else 1, wall, start_s,
                         f"the sweep's client exited {code} during the run (see raw/{CLIENT_LOG})")

    def _stop(self, kill: bool = False) -> int | None:
        """End the process: its stdin closed (it exits at the end of input), then, if it lingers (or at once with
        `kill`: a run past its timeout), SIGKILL to its group (it runs in a session of its own)."""
        proc, self.proc = self.proc, None
        if proc is None:
            return None
        with contextlib.suppress(OSError):
            if proc.stdin is not None:
                proc.stdin.close()
        try:
            return proc.wait(timeout=0 if kill else 5)
        except subprocess.TimeoutExpired:
            stop_child(proc, 0.0, group=True)  # asked already (its stdin closed): killed with its group
            return proc.returncode
        finally:
            if proc.stdout is not None:
                proc.stdout.close()

    def close(self) -> None:
        self._stop()


def make_client(kind: str, vllm: str, log_dir: Path, api_key: str | None, environ: Mapping[str, str]) -> Client:
    """`--client per-run`: --vllm's command per run; `sweep`: one process of this Python for the sweep. Either runs in
    bench's environment (`environ`)."""
    if kind == "per-run":
        return PerRunClient(vllm, api_key, environ)
    return SweepClient(sys.executable, log_dir, api_key, environ)
