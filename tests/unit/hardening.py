"""Helpers of the hardening tests: run the CLI in-process on a given environment, find tracebacks and leaked
sentinel secrets in what it printed and wrote, count inputs per area, a scripted misbehaving HTTP server, files that
are not what they claim (`hostile_file`), and `t4serve mcp` over stdio as an assistant starts it (`StdioServer`).

`Tally` stands in for nothing: it is the record the session-finish summary (tests/unit/conftest.py) prints.
`MisbehavingServer` stands in for a vLLM server gone wrong (or a hostile one on the port): per path it trickles bytes,
sends huge or broken answers, closes mid-body or redirects to another port, scripted per test.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import queue
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from unittest import mock

from t4serve.cli import main

REPO = Path(__file__).resolve().parents[2]

# Never a real secret: a string that must not appear in any output or file.
SENTINEL = "sk-SENTINEL-4b1d9e77"
SENTINEL_TOKEN = "hf_SENTINELtoken4b1d9e77"


@dataclass
class AreaFigures:
    # Distinct inputs tried, and the command runs over them (an input is run through one or more commands).
    inputs: int = 0
    runs: int = 0
    tracebacks: int = 0
    leaks: int = 0
    over_deadline: int = 0
    bad_exit_codes: int = 0
    # The most any timed check ran past its own deadline (negative: it ended before), seconds.
    worst_overshoot: float | None = None
    examples: list[str] = field(default_factory=list)


class Tally:
    """Inputs tried and failures found per area, over the whole test session."""

    areas: dict[str, AreaFigures] = {}  # noqa: RUF012 (one tally per session, shared by the tests)

    @classmethod
    def area(cls, name: str) -> AreaFigures:
        return cls.areas.setdefault(name, AreaFigures())


@dataclass(frozen=True)
class Outcome:
    code: int
    out: str
    err: str

    @property
    def text(self) -> str:
        return self.out + self.err


def run_cli(args: list[str], environ: Mapping[str, str]) -> Outcome:
    """`t4serve ARGS` in this process with exactly `environ` as its environment; output captured."""
    out, err = io.StringIO(), io.StringIO()
    # Relative paths in a setting resolve against the working directory: the test's own folder, never the checkout.
    home = Path(environ.get("HOME", "/nonexistent"))
    cwd = home if home.is_dir() else Path(tempfile.gettempdir())
    with mock.patch.dict(os.environ, dict(environ), clear=True), contextlib.redirect_stdout(out), \
            contextlib.redirect_stderr(err), contextlib.chdir(cwd):  # fmt: skip
        code = main(args)
    return Outcome(code, out.getvalue(), err.getvalue())


def files_text(root: Path) -> str:
    """Every regular file under `root`, decoded loosely, for a sentinel search."""
    parts = []
    for path in root.rglob("*"):
        with contextlib.suppress(OSError):
            if path.is_file() and not path.is_symlink():
                parts.append(path.read_bytes()[: 1 << 20].decode("utf-8", errors="replace"))
    return "\n".join(parts)


# What a timed check may take past its deadline: printing its line and the thread hand-off, on a loaded machine.
DEADLINE_SLACK_S = 0.5


def tried(area: str) -> None:
    """Count one input of `area` (before its runs are recorded)."""
    Tally.area(area).inputs += 1


def record(area: str, outcome: Outcome, allowed: set[int], *, secrets: tuple[str, ...] = (SENTINEL,),
           written: str = "", seconds: float | None = None, deadline: float | None = None, label: str = "") -> None:
    """Count one run of `area` and assert the promises: an allowed exit code, no traceback, no secret, on time."""
    figures = Tally.area(area)
    figures.runs += 1
    problems = []
    if "Traceback" in outcome.text or outcome.code == 70:
        figures.tracebacks += 1
        problems.append("traceback")
    if any(s in outcome.text or s in written for s in secrets):
        figures.leaks += 1
        problems.append("secret leaked")
    if outcome.code not in allowed:
        figures.bad_exit_codes += 1
        problems.append(f"exit {outcome.code} not in {sorted(allowed)}")
    if seconds is not None and deadline is not None:
        over = seconds - deadline
        figures.worst_overshoot = over if figures.worst_overshoot is None else max(figures.worst_overshoot, over)
    if seconds is not None and deadline is not None and seconds > deadline + DEADLINE_SLACK_S:
        figures.over_deadline += 1
        problems.append(f"took {seconds:.2f} s, deadline {deadline:.2f} s")
    if problems:
        figures.examples.append(f"{label}: {', '.join(problems)}")
    assert not problems, f"{label}: {', '.join(problems)}\n{outcome.text[-3000:]}"


def base_environ(tmp: Path) -> dict[str, str]:
    """An environment that keeps the CLI off the network and away from the machine's own settings."""
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(tmp),
        "HF_HOME": str(tmp / "hf"),
        "HF_HUB_OFFLINE": "1",
        "T4SERVE_MANIFEST": str(tmp / "no-manifest.json"),
        "T4SERVE_STATE_DIR": str(tmp / "state"),
        "T4SERVE_CACHE_DIR": str(tmp / "cache"),
        "TMPDIR": str(tmp),
    }


def ready_state(port: int, host: str = "127.0.0.1", served: str = "m") -> dict[str, object]:
    """A state.json body of a ready server on `host:port`."""
    now = time.time()
    return {
        "schema": 1, "phase": "ready", "started_at": now - 60, "attempt_started_at": now - 60, "updated_at": now,
        "attempt": 1, "model": "org/m", "served_model_name": served, "host": host, "port": port, "gpu_name": "T4",
        "phases": [{"phase": "starting", "began_at": now - 60}, {"phase": "ready", "began_at": now - 5}],
    }  # fmt: skip


def write_state(state_dir: Path, body: object) -> None:
    state_dir.mkdir(parents=True, exist_ok=True)
    (state_dir / "state.json").write_text(json.dumps(body))


# A scripted misbehaving server


MODELS_OK = json.dumps({"object": "list", "data": [{"id": "m"}]}).encode()


@dataclass
class Script:
    """What the server does for one path: `kind` names the behaviour, the rest tunes it."""

    kind: str
    size: int = 0
    pause: float = 0.0
    target_port: int = 0


class MisbehavingServer:
    """A raw-socket HTTP/1.1 server on 127.0.0.1 that answers each path by its script (see Script.kind in `_act`).
    A second listener (`witness`) is where redirects point: it records any Authorization header that reaches it."""

    def __init__(self) -> None:
        self.scripts: dict[str, Script] = {}
        self.stop = threading.Event()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.witness = socket.create_server(("127.0.0.1", 0))
        self.witness_port = self.witness.getsockname()[1]
        self.witnessed: list[bytes] = []
        for sock, handler in ((self.listener, self._serve), (self.witness, self._witness)):
            sock.settimeout(0.1)
            threading.Thread(target=self._accept, args=(sock, handler), daemon=True).start()

    def close(self) -> None:
        self.stop.set()
        self.listener.close()
        self.witness.close()

    def _accept(self, sock: socket.socket, handler: object) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=handler, args=(conn,), daemon=True).start()  # type: ignore[arg-type]

    @staticmethod
    def _head(conn: socket.socket) -> bytes:
        conn.settimeout(5)
        data = b""
        while b"\r\n\r\n" not in data and len(data) < 65536:
            chunk = conn.recv(4096)
            if not chunk:
                break
            data += chunk
        return data

    def _witness(self, conn: socket.socket) -> None:
        with contextlib.suppress(OSError), conn:
            head = self._head(conn)
            self.witnessed.append(head)
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}")

    def _serve(self, conn: socket.socket) -> None:
        with contextlib.suppress(OSError), conn:
            head = self._head(conn)
            path = head.split(b" ", 2)[1].decode("latin-1") if head.count(b" ") >= 2 else "/"
            script = self.scripts.get(path, Script("ok"))
            self._act(conn, path, script)

    def _trickle(self, conn: socket.socket, data: bytes, pause: float) -> None:
        began = time.monotonic()
        for i in range(len(data)):
            if self.stop.is_set() or time.monotonic() - began > 30:
                return
            conn.sendall(data[i : i + 1])
            time.sleep(pause)

    def _act(self, conn: socket.socket, path: str, script: Script) -> None:
        body = MODELS_OK if path == "/v1/models" else b""
        ok = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body) + body
        kind = script.kind
        if kind == "ok":
            conn.sendall(ok)
        elif kind == "trickle_head":
            self._trickle(conn, ok, script.pause)
        elif kind == "trickle_body":
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n")
            self._trickle(conn, b"x" * 100000, script.pause)
        elif kind == "huge_body":
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % script.size)
            self._send_zeros(conn, script.size)
        elif kind == "huge_chunked":
            conn.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
            chunk = b"%x\r\n" % 65536 + b"0" * 65536 + b"\r\n"
            sent = 0
            while sent < script.size and not self.stop.is_set():
                conn.sendall(chunk)
                sent += 65536
        elif kind == "bad_status":
            conn.sendall(b"HTTP/1.1 abc Nonsense\r\n\r\n")
        elif kind == "garbage":
            conn.sendall(b"\x00\xff garbage without a status line\r\n\r\n")
        elif kind == "closed_mid_body":
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n{\"data\": [")
        elif kind == "closed_at_once":
            return
        elif kind == "long_header":
            conn.sendall(b"HTTP/1.1 200 OK\r\nX-Long: " + b"a" * 70000 + b"\r\nContent-Length: 0\r\n\r\n")
        elif kind == "many_headers":
            conn.sendall(b"HTTP/1.1 200 OK\r\n" + b"".join(b"X-%d: 1\r\n" % i for i in range(150)) + b"\r\n")
        elif kind == "deep_json":
            deep = b"[" * 100000 + b"]" * 100000
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(deep) + deep)
        elif kind == "nan_json":
            data = b'{"data": [{"id": NaN}], "x": 1e999, "n": ' + b"9" * 5000 + b"}"
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(data) + data)
        elif kind == "redirect":
            location = f"http://127.0.0.1:{script.target_port or self.witness_port}{path}".encode()
            conn.sendall(b"HTTP/1.1 302 Found\r\nLocation: " + location + b"\r\nContent-Length: 0\r\n\r\n")
        elif kind == "hang":
            self.stop.wait(30)
        elif kind == "status_500":
            conn.sendall(b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 0\r\n\r\n")
        elif kind == "gzip_claim":
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: 4\r\n\r\nabcd")
        elif kind == "wrong_length":
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: -5\r\n\r\n{}")
        else:
            raise AssertionError(f"unknown script {kind}")

    def _send_zeros(self, conn: socket.socket, size: int) -> None:
        block = b"0" * 65536
        sent = 0
        while sent < size and not self.stop.is_set():
            conn.sendall(block)
            sent += len(block)


SCRIPT_KINDS = (
    "ok", "trickle_head", "trickle_body", "huge_body", "huge_chunked", "bad_status", "garbage", "closed_mid_body",
    "closed_at_once", "long_header", "many_headers", "deep_json", "nan_json", "redirect", "hang", "status_500",
    "gzip_claim", "wrong_length",
)  # fmt: skip


@contextlib.contextmanager
def misbehaving_server() -> Iterator[MisbehavingServer]:
    server = MisbehavingServer()
    try:
        yield server
    finally:
        server.close()


# Files that are not what they claim, and `t4serve mcp` over stdio


HOSTILE_FILES = ("fifo", "dev-zero", "directory", "sparse-1g", "not-utf8", "loop")


def hostile_file(path: Path, kind: str) -> Path:
    """`path` made into a file that is not what it claims to be."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "dev-zero":
        path.symlink_to("/dev/zero")
    elif kind == "directory":
        path.mkdir()
    elif kind == "sparse-1g":
        with path.open("wb") as handle:
            handle.truncate(1 << 30)
    elif kind == "not-utf8":
        path.write_bytes(b"\xff\xfe\x00token\x80")
    elif kind == "loop":
        path.symlink_to(path)
    return path


TOKEN = "mcp-test-token-0123456789abcdef"
INITIALIZE = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": "2025-06-18",
              "capabilities": {}, "clientInfo": {"name": "t4serve-test", "version": "0"}}}  # fmt: skip


def wait_listening(port: int, proc: subprocess.Popen[Any] | None = None, timeout: float = 30.0) -> bool:
    """Whether something listens on 127.0.0.1:`port` within `timeout` s (False also once `proc` has exited)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            return False
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return True
        time.sleep(0.1)
    return False


def mcp_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """`t4serve mcp` kept off any engine: DOCKER and compose name programs that do not exist."""
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp_path), "HF_HUB_OFFLINE": "1",
            "DOCKER": str(tmp_path / "no-docker-here"), "T4SERVE_MCP_COMPOSE": str(tmp_path / "no-compose-here"),
            "T4SERVE_MCP_DATA_DIR": str(tmp_path / "data"), **extra}  # fmt: skip


class StdioServer:
    """`python -m t4serve mcp` as an assistant starts it, spoken to line by line; its answers collected by a thread
    (a select() on the pipe misses a line already read into the reader's buffer), stderr kept in a file."""

    def __init__(self, tmp_path: Path, compose_file: Path = REPO / "compose.yaml", **extra_env: str) -> None:
        self.err_path = tmp_path / "mcp-stderr.log"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "t4serve", "mcp", "--compose-file", str(compose_file)],
            env=mcp_env(tmp_path, **extra_env), cwd=tmp_path, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=self.err_path.open("wb"),
        )  # fmt: skip
        self.answers: queue.Queue[bytes] = queue.Queue()
        threading.Thread(target=self._collect, daemon=True).start()
        self.send(json.dumps(INITIALIZE).encode())
        assert b'"serverInfo"' in self.answer(30)
        self.send(b'{"jsonrpc": "2.0", "method": "notifications/initialized"}')

    def _collect(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.answers.put(line)

    def send(self, line: bytes) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + b"\n")
        self.proc.stdin.flush()

    def answer(self, timeout: float = 10.0) -> bytes:
        try:
            return self.answers.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"no answer from t4serve mcp within {timeout:g} s") from None

    def close(self) -> str:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(timeout=20)
        return self.err_path.read_text(errors="replace")


# Every leaf of a valid value, mutated


# What a leaf (or a whole list or object) of a valid JSON value is replaced by: each kind once. A `RawJson` is written
# into the text as it is (what json.dumps never writes: NaN, 400 digits, 100,000 levels, a lone surrogate).
@dataclass(frozen=True)
class RawJson:
    text: str


DEEP = RawJson("[" * 100_000 + "]" * 100_000)
MUTATIONS: dict[str, object] = {
    "null": None, "true": True, "text": "x", "empty text": "", "list": [1], "empty list": [], "object": {"k": 1},
    "empty object": {}, "-1": -1, "0": 0, "1.5": 1.5, "2**63": 2**63, "400 digits": RawJson("9" * 400),
    "-10**19": RawJson("-1" + "0" * 19), "1e308": 1e308, "NaN": RawJson("NaN"), "Infinity": RawJson("Infinity"),
    "-Infinity": RawJson("-Infinity"), "deep": DEEP, "unknown enum": "zz-unknown-value", "long text": "y" * 200_000,
    "control characters": f"\x1b[31mred\x1b[0m\x00\x07\x9b2J\u202e{SENTINEL}\r\nnext",
    "lone surrogate": RawJson('"\\ud800"'), "path": "../../../../etc/passwd",
}  # fmt: skip


def node_paths(value: object, prefix: tuple[object, ...] = ()) -> list[tuple[object, ...]]:
    """The path (keys and indexes) of every node of a JSON value below its root: leaves, lists and objects."""
    paths: list[tuple[object, ...]] = []
    children = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, child in children:
        paths.append((*prefix, key))
        paths += node_paths(child, (*prefix, key))
    return paths


def mutated(value: object, path: tuple[object, ...], kind: str) -> str:
    """`value` as JSON text with the node at `path` replaced by MUTATIONS[kind]."""
    import copy

    copied = copy.deepcopy(value)
    parent: Any = copied
    for key in path[:-1]:
        parent = parent[key]
    replacement = MUTATIONS[kind]
    parent[path[-1]] = "@RAW@" if isinstance(replacement, RawJson) else replacement
    text = json.dumps(copied)
    return text.replace('"@RAW@"', replacement.text, 1) if isinstance(replacement, RawJson) else text


def label_of(path: tuple[object, ...], kind: str) -> str:
    return ".".join(map(str, path)) + f" = {kind}"
