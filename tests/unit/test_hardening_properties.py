"""Property-based hardening suite (Hypothesis): whatever a user, a checkpoint, a state file or a server gives t4serve,
no traceback, only the exit codes each command promises, no sentinel secret in any output or written file, and every
healthcheck within its deadline. Since issue 21 also: MCP JSON-RPC over stdio and HTTP, host-check with hostile
clients and files, the compile ladder's record and lock with the state files, and bench result folders. Examples are
derandomized, so every run tries the same inputs and the figures the session summary prints (inputs per area,
tracebacks, leaks, late checks) are reproducible.
"""

from __future__ import annotations

import contextlib
import dataclasses
import http.client
import io
import itertools
import json
import os
import socket
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from e2b_checkpoint import e2b_config, write_checkpoint
from hardening import (
    HOSTILE_FILES,
    INITIALIZE,
    REPO,
    SCRIPT_KINDS,
    SENTINEL,
    SENTINEL_TOKEN,
    TOKEN,
    MisbehavingServer,
    Outcome,
    Script,
    StdioServer,
    base_environ,
    files_text,
    hostile_file,
    mcp_env,
    misbehaving_server,
    ready_state,
    record,
    run_cli,
    tried,
    wait_listening,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from t4serve.atomic import LockError
from t4serve.commands import serve
from t4serve.config import settings as settings_table
from t4serve.config.settings import VARIABLES
from t4serve.config.variables import Variable
from t4serve.mcp.server import TOOL_ANNOTATIONS
from t4serve.probes.checkpoint import DTYPE_BITS, TEXT_INTS, probe_model

SECRETS = (SENTINEL, SENTINEL_TOKEN)


def _settings(examples: int) -> Any:
    return settings(
        max_examples=examples,
        deadline=None,
        derandomize=True,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture, HealthCheck.data_too_large],
    )


# What an environment variable can hold: any text but NUL, including the surrogate escapes Python makes of bytes
# that are not UTF-8, plus the values that broke things before.
NASTY_VALUES = [
    "", " ", "\t \n", "nan", "NaN", "inf", "-inf", "1e309", "-1", "0", "1.5", "0x10", "9" * 400, "9" * 5000, "1_000",
    "auto", "profile", "/" + "a" * 300, "/tmp/x\n[program:evil]\ncommand=/bin/sh", "a\rb", "\x01", "\x7f", "\x9b",
    "\udcff\udcfe", "héllo", "/etc/passwd", "../../..", "~", "~/x", "--api-key", "-sk-lookalike",
    "1.0.0.5", "user:pw@host", "%(here)s", "2.5GiB", "1.5B", "16384", "1 PiB", "qat", "a/b", "./x",
    # Issue 21: numbers in other scripts and bases, underscores, numeric host names.
    "\u0663", "\u0662.\u0665GiB", "\uff18", "1_0", "0x7f000001", "017.1", "0.9_0", "\u0660.\u0669", "gpu.0x1f",
]  # fmt: skip
env_text = st.one_of(
    st.sampled_from(NASTY_VALUES),
    st.text(alphabet=st.characters(blacklist_characters="\x00", blacklist_categories=("Cs",)), max_size=40),
    st.builds(lambda a, b: a + b, st.sampled_from(NASTY_VALUES), st.sampled_from(NASTY_VALUES)),
)


@pytest.fixture(scope="module")
def serve_recorder() -> Iterator[None]:
    """`serve` runs up to starting supervisord (replaced by a no-op), so what it writes can be searched. A value that
    means "unset" (an empty T4SERVE_STATE_DIR) takes the table's default, which here is a folder of the test's own:
    the host's /tmp/t4serve is never written (issue 45: a later `t4serve status` there read "starting")."""
    with tempfile.TemporaryDirectory(prefix="t4serve-state-default-") as folder:
        state = dataclasses.replace(settings_table.VARIABLES_BY_NAME["T4SERVE_STATE_DIR"], default=folder)
        table = tuple(state if v.name == state.name else v for v in settings_table.VARIABLES)
        with mock.patch.object(serve.shutil, "which", lambda name: f"/usr/bin/{name}"), \
                mock.patch.object(serve.pid1, "run", lambda argv, state, env: 0), \
                mock.patch.object(settings_table, "VARIABLES", table), \
                mock.patch.dict(settings_table.VARIABLES_BY_NAME, {state.name: state}):  # fmt: skip
            yield


@pytest.mark.parametrize("var", VARIABLES, ids=[v.name for v in VARIABLES])
@_settings(20)
@given(value=env_text)
def test_every_setting_any_value(serve_recorder: None, var: Variable, value: str) -> None:
    tried("settings")
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        env = {**base_environ(tmp), "T4SERVE_PREFLIGHT": "warn"}
        if var.secret:
            # The secret itself, somewhere in the value: it must never be shown.
            value = value[:20] + SENTINEL + value[20:]
        else:
            env["T4SERVE_API_KEY"] = SENTINEL
            env["HF_TOKEN"] = SENTINEL_TOKEN
        env[var.name] = value
        for command, allowed in ((["env"], {0, 2}), (["plan", "--gpu", "t4", "--json"], {0, 2, 3}),
                                 (["serve"], {0, 2, 3})):  # fmt: skip
            outcome = run_cli(command, env)
            label = f"{var.name}={value!r}"
            record("settings", outcome, allowed, secrets=SECRETS, written=files_text(tmp), label=label)


# T4SERVE_VLLM_ARGS with secrets in it: flags in every spelling, secret values anywhere, broken quoting.

SECRET_FLAG_SPELLINGS = ["--api-key", "--api_key", "--api-k", "--hf-token", "--hf_token", "--hf-tok", "--API-KEY"]
OTHER_TOKENS = [
    "--port", "1", "--enforce-eager", "-pp", "2", "-dp", "--quantization", "awq", "--load-format", "dummy", "-tp2",
    "--dtype", "half", "--config", "x.yaml", "'", '"', "\\", "--", "-", "--attention-backend", "TRITON_ATTN", "=",
    "--max-model-len=9", "-q", "--kv-cache-dtype", "--cpu-offload-gb", "1",
]  # fmt: skip


@st.composite
def vllm_args_with_secret(draw: st.DrawFn) -> str:
    before = draw(st.lists(st.sampled_from(OTHER_TOKENS), max_size=4))
    after = draw(st.lists(st.sampled_from(OTHER_TOKENS), max_size=4))
    flag = draw(st.sampled_from(SECRET_FLAG_SPELLINGS))
    secret = draw(st.sampled_from([SENTINEL, "-" + SENTINEL, "'" + SENTINEL, SENTINEL + "'", '"' + SENTINEL]))
    glue = draw(st.sampled_from([" ", "="]))
    return " ".join([*before, flag + glue + secret, *after])


@_settings(200)
@given(args=vllm_args_with_secret())
def test_vllm_args_never_show_a_secret(args: str) -> None:
    tried("T4SERVE_VLLM_ARGS")
    with tempfile.TemporaryDirectory() as d:
        env = {**base_environ(Path(d)), "T4SERVE_VLLM_ARGS": args}
        for command, allowed in ((["env"], {2}), (["plan", "--gpu", "t4", "--json"], {2}), (["preflight"], {2})):
            record("T4SERVE_VLLM_ARGS", run_cli(command, env), allowed, label=args)


# config.json and safetensors headers


json_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(10**20), max_value=10**20), st.floats(allow_nan=False),
    st.sampled_from([0, 1, -1, 2**31, 10**18, 0.5, 1e300]), st.text(max_size=8),
)  # fmt: skip
json_values = st.recursive(json_scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
    st.text(max_size=6), inner, max_size=4), max_leaves=12)  # fmt: skip
RAW_CONFIGS = ["[" * 50000 + "]" * 50000, '{"text_config": {"num_hidden_layers": NaN}}', "\xff", "", "null", "[]",
               '{"num_hidden_layers": 1e999}', '{"num_hidden_layers": ' + "9" * 400 + "}"]  # fmt: skip


@pytest.fixture(scope="module")
def checkpoint_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_checkpoint(tmp_path_factory.mktemp("ckpt") / "c", "qat")


@_settings(150)
@given(
    edits=st.dictionaries(st.sampled_from([*TEXT_INTS, "layer_types", "rope_parameters", "torch_dtype"]), json_values,
                          max_size=3),
    raw=st.one_of(st.none(), st.sampled_from(RAW_CONFIGS)),
)  # fmt: skip
def test_any_config_json(checkpoint_dir: Path, edits: dict[str, Any], raw: str | None) -> None:
    config = e2b_config("qat")
    config["text_config"].update(edits)
    (checkpoint_dir / "config.json").write_text(raw if raw is not None else json.dumps(config))
    _probe_and_plan("config.json", checkpoint_dir, f"edits={edits!r} raw={(raw or '')[:40]!r}")


def _probe_and_plan(area: str, directory: Path, label: str) -> None:
    tried(area)
    with tempfile.TemporaryDirectory() as d:
        env = base_environ(Path(d))
        try:
            probe_model(str(directory), hf_home=env["HF_HOME"], offline=True)
            probed = Outcome(0, "", "")
        except Exception as exc:  # the probe promises never to raise on a checkpoint's content
            probed = Outcome(70, "", f"Traceback: {type(exc).__name__}: {exc}")
        record(area, probed, {0}, label=f"probe {label}")
        for command in (["plan", "--gpu", "t4", "--model", str(directory)], ["roofline", str(directory)]):
            record(area, run_cli(command, env), {0, 2, 3}, label=f"{command[0]} {label}")


@st.composite
def safetensors_files(draw: st.DrawFn) -> tuple[bytes, str]:
    names = draw(st.lists(st.sampled_from(["model.embed_tokens.weight", "lm_head.weight", "a", "b.c", "__metadata__"]),
                          min_size=1, max_size=4, unique=True))  # fmt: skip
    header: dict[str, Any] = {}
    offset = 0
    for name in names:
        dtype = draw(st.sampled_from([*DTYPE_BITS, "Q7", "", "bf16"]))
        shape = draw(st.lists(st.one_of(st.integers(0, 8), st.sampled_from([100000, -1, 2**40])), max_size=3))
        size = (DTYPE_BITS.get(dtype, 16) * max(1, _prod(shape))) // 8
        lie = draw(st.sampled_from([0, 0, 0, 1, -1, 2**40]))
        begin = draw(st.sampled_from([offset, offset, 0, offset + 2]))
        entry: Any = {"dtype": dtype, "shape": shape, "data_offsets": [begin, begin + max(0, size + lie)]}
        entry = draw(st.one_of(st.just(entry), json_values)) if draw(st.integers(0, 9)) == 0 else entry
        header[name] = entry
        offset = begin + max(0, size + lie)
    blob = json.dumps(header).encode()
    extra = draw(st.sampled_from([0, 0, 1, -1]))
    data = max(0, min(offset, 1 << 16) + extra)
    declared = draw(st.sampled_from([len(blob), len(blob), len(blob) + 1, 2**63, 0]))
    return struct.pack("<Q", declared) + blob + b"\0" * data, json.dumps(header)[:120]


def _prod(shape: list[int]) -> int:
    total = 1
    for d in shape:
        total *= max(d, 0)
    return total


@_settings(200)
@given(file=safetensors_files())
def test_any_safetensors_header(checkpoint_dir: Path, file: tuple[bytes, str]) -> None:
    (checkpoint_dir / "config.json").write_text(json.dumps(e2b_config("qat")))
    data, label = file
    (checkpoint_dir / "model.safetensors").write_bytes(data)
    facts = probe_model(str(checkpoint_dir), hf_home="/nonexistent", offline=True)
    if facts.source != "invalid":
        # Accepted: then the header told the truth (the probe's own checks, restated).
        header = json.loads(data[8 : 8 + struct.unpack("<Q", data[:8])[0]])
        entries = sorted((v["data_offsets"] for k, v in header.items() if k != "__metadata__"))
        assert entries[0][0] == 0 and all(a[1] == b[0] for a, b in itertools.pairwise(entries))
        assert 8 + struct.unpack("<Q", data[:8])[0] + entries[-1][1] == len(data)
    _probe_and_plan("safetensors header", checkpoint_dir, label)


# state.json: healthcheck exits 0 or 1 within its deadline, status 0 or 2.

STATE_FIELDS = ["schema", "phase", "started_at", "attempt_started_at", "updated_at", "attempt", "model",
                "served_model_name", "host", "port", "gpu_name", "phases", "figures", "reason", "last_lines",
                "estimate_seconds", "estimate_phases", "canary"]  # fmt: skip
STATE_VALUES = st.one_of(json_values, st.sampled_from(["ready", "starting", "failed", "exploded", "127.0.0.1\r\nX: 1",
                                                       "user:pw@127.0.0.1", [], [{"phase": "ready", "began_at": 1}]]))


@_settings(150)
@given(
    edits=st.dictionaries(st.sampled_from(STATE_FIELDS), STATE_VALUES, max_size=3),
    raw=st.one_of(st.none(), st.binary(max_size=64), st.sampled_from([b"[" * 100000, b'{"phase": -Infinity}'])),
    special=st.sampled_from(["file", "file", "file", "dir", "fifo", "loop", "state-dir-is-file"]),
)
def test_any_state_json(edits: dict[str, Any], raw: bytes | None, special: str) -> None:
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        state = tmp / "state"
        if special == "state-dir-is-file":
            state.write_text("x")
        else:
            state.mkdir()
            path = state / "state.json"
            if special == "dir":
                path.mkdir()
            elif special == "fifo":
                os.mkfifo(path)
            elif special == "loop":
                path.symlink_to(path)
            else:
                body = ready_state(9)
                body.update(edits)
                path.write_bytes(raw if raw is not None else json.dumps(body).encode())
        env = base_environ(tmp)
        tried("state.json")
        label = f"{special} edits={edits!r} raw={raw!r}"[:200]
        for liveness in ([], ["--liveness"]):
            began = time.monotonic()
            outcome = run_cli(["healthcheck", *liveness, "--timeout", "0.5"], env)
            record("state.json", outcome, {0, 1}, seconds=time.monotonic() - began, deadline=0.5, label=label)
        record("state.json", run_cli(["status"], env), {0, 2}, label=label)


# The healthcheck against a scripted misbehaving server on 127.0.0.1.


NEVER_USABLE = {"huge_body", "huge_chunked", "bad_status", "garbage", "closed_mid_body", "closed_at_once", "redirect",
                "hang", "status_500", "long_header", "many_headers"}


@pytest.fixture(scope="module")
def server() -> Iterator[MisbehavingServer]:
    with misbehaving_server() as s:
        yield s


@_settings(60)
@given(
    health=st.sampled_from(SCRIPT_KINDS),
    models=st.sampled_from(SCRIPT_KINDS),
    pause=st.sampled_from([0.01, 0.05, 0.2]),
    size=st.sampled_from([2 << 20, 1 << 30]),
    timeout=st.sampled_from([0.3, 0.5, 1.0]),
    key_from_file=st.booleans(),
)
def test_healthcheck_against_a_misbehaving_server(
    server: MisbehavingServer, health: str, models: str, pause: float, size: int, timeout: float, key_from_file: bool
) -> None:
    server.scripts = {"/health": Script(health, size=size, pause=pause),
                      "/v1/models": Script(models, size=size, pause=pause)}  # fmt: skip
    server.witnessed.clear()
    tried("healthcheck vs server")
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        (tmp / "state").mkdir()
        (tmp / "state" / "state.json").write_text(json.dumps(ready_state(server.port)))
        env = base_environ(tmp)
        if key_from_file:
            (tmp / "key").write_text(SENTINEL + "\n")
            env["T4SERVE_API_KEY_FILE"] = str(tmp / "key")
        else:
            env["T4SERVE_API_KEY"] = SENTINEL
        began = time.monotonic()
        outcome = run_cli(["healthcheck", "--timeout", str(timeout)], env)
        took = time.monotonic() - began
        witnessed = b"".join(server.witnessed).decode("latin-1")
        # Both answers right: healthy. Either one unusable: unhealthy. Else (a 200 with an odd header, a trickle that
        # may finish in time) either verdict is honest; the promise is 0 or 1, in time, without the key leaving.
        expected = {0} if health == models == "ok" else {1} if {health, models} & NEVER_USABLE else {0, 1}
        record("healthcheck vs server", outcome, expected, written=witnessed, seconds=took, deadline=timeout,
               label=f"/health {health}, /v1/models {models}, pause {pause}, timeout {timeout}")  # fmt: skip
        assert "authorization" not in witnessed.lower()
        # The liveness probe of the same server: 0 or 1, in time (it asks /health only, with no key).
        began = time.monotonic()
        outcome = run_cli(["healthcheck", "--liveness", "--timeout", str(timeout)], env)
        record("healthcheck vs server", outcome, {0, 1}, seconds=time.monotonic() - began, deadline=timeout,
               label=f"--liveness: /health {health}, timeout {timeout}")  # fmt: skip


# ----- issue 21: the newer doors ------------------------------------------------------------------------------------
# MCP JSON-RPC over stdio and HTTP, host-check with hostile clients and files, the compile ladder's record and lock
# with the state files, bench result folders. The promises are the same: no traceback (nor an MCP "internal error"),
# the documented exit code or JSON-RPC answer within its deadline, no sentinel secret in any answer.

TOOL_NAMES = sorted(TOOL_ANNOTATIONS)
PARAMETER_NAMES = ["model", "settings", "gpu", "tail", "since", "timeout_s", "prompt", "messages", "max_tokens",
                   "temperature", "inputs", "concurrency", "repeats", "output_len", "num_prompts", "run_id",
                   "publish_port", "wait_s", "skip_interpreter"]  # fmt: skip
HUGE = "x" * (1 << 20)


def _nested(depth: int) -> str:
    return '{"a":' * depth + "1" + "}" * depth


argument_values = st.one_of(
    json_values, st.sampled_from(["1_0", "\u0663", "0x10", "nan", "-1", HUGE, "", "\x00", "qat", "../../etc",
                                  "T4SERVE_API_KEY", "--headless", 10**30, -(10**30), 1e308, True, [], {}]),
)  # fmt: skip


@st.composite
def mcp_lines(draw: st.DrawFn, request_id: str) -> tuple[bytes, bool]:
    """One stdio line of a hostile client, and whether it is a well-formed request that must be answered by id."""
    kind = draw(st.sampled_from(["tool", "tool", "tool", "method", "json", "bytes", "deep", "huge", "lax"]))
    if kind in ("tool", "lax"):
        name = draw(st.sampled_from([*TOOL_NAMES, "nope", "", "x" * 5000]))
        if kind == "tool":
            arguments: Any = draw(st.dictionaries(st.sampled_from([*PARAMETER_NAMES, "", "zz"]), argument_values,
                                                  max_size=4) | json_values)  # fmt: skip
        else:
            arguments = {draw(st.sampled_from(PARAMETER_NAMES)): draw(st.sampled_from(["1_0", True, 5.0, "3"]))}
        body = {"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": {"name": name,
                                                                                         "arguments": arguments}}
        return json.dumps(body).encode(), True
    if kind == "method":
        body = {"jsonrpc": draw(st.sampled_from(["2.0", "1.0", 2])), "id": request_id,
                "method": draw(st.sampled_from(["tools/list", "ping", "resources/read", "nope", "", "initialize"])),
                "params": draw(json_values)}  # fmt: skip
        return json.dumps(body).encode(), False
    if kind == "json":
        return json.dumps(draw(json_values)).encode(), False
    if kind == "bytes":
        return draw(st.binary(max_size=200)).replace(b"\n", b" "), False
    if kind == "deep":
        depth = draw(st.sampled_from([65, 300, 5000, 100000]))
        return (f'{{"jsonrpc":"2.0","id":"{request_id}","method":"tools/call","params":{{"name":"plan",'
                f'"arguments":{{"settings":{_nested(depth)}}}}}}}').encode(), False
    return b'{"jsonrpc":"2.0","id":"' + request_id.encode() + b'","method":"ping","params":{"x":"' + \
        b"y" * draw(st.sampled_from([5 << 20, 9 << 20])) + b'"}}', False


@pytest.fixture(scope="module")
def mcp_stdio(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StdioServer]:
    # compose.yaml without the repository around it: apply_turing_patch finds no scripts/build-image to run.
    folder = tmp_path_factory.mktemp("mcp-stdio")
    (folder / "project").mkdir()
    (folder / "project" / "compose.yaml").write_text((REPO / "compose.yaml").read_text())
    server = StdioServer(folder, folder / "project" / "compose.yaml", T4SERVE_API_KEY=SENTINEL,
                         HF_TOKEN=SENTINEL_TOKEN)  # fmt: skip
    yield server
    if server.proc.poll() is None:
        server.close()


def _answered(lines: list[bytes], label: str, area: str, seconds: float, deadline: float, alive: bool) -> None:
    problems = []
    for line in lines:
        try:
            answer = json.loads(line)
        except ValueError:
            problems.append(f"not JSON: {line[:100]!r}")
            continue
        text = json.dumps(answer)
        if "internal error" in text or "Traceback" in text:
            problems.append(f"internal error: {text[:300]}")
        if len(line) > 256 * 1024:
            problems.append(f"an answer of {len(line):,} bytes")
    code = 0 if alive and not problems else 70
    record(area, Outcome(code, "\n".join(problems), ""), {0}, secrets=SECRETS,
           written=b"".join(lines).decode("utf-8", "replace"), seconds=seconds, deadline=deadline, label=label)


@_settings(200)
@given(data=st.data())
def test_mcp_stdio_answers_whatever_a_client_sends(mcp_stdio: StdioServer, data: st.DataObject) -> None:
    n = next(_counter)
    line, must_answer = data.draw(mcp_lines(f"h-{n}"))
    tried("MCP stdio")
    began = time.monotonic()
    mcp_stdio.send(line)
    mcp_stdio.send(json.dumps({"jsonrpc": "2.0", "id": f"ping-{n}", "method": "ping"}).encode())
    lines: list[bytes] = []
    waiting = {f"ping-{n}", *([f"h-{n}"] if must_answer else [])}
    deadline = 10.0
    while waiting and time.monotonic() - began < deadline:
        try:
            got = mcp_stdio.answer(max(0.1, deadline - (time.monotonic() - began)))
        except AssertionError:
            break
        lines.append(got)
        with contextlib.suppress(ValueError, AttributeError):
            waiting.discard(json.loads(got).get("id"))
    took = time.monotonic() - began if not waiting else deadline + 10
    _answered(lines, f"stdio {line[:80]!r}", "MCP stdio", took, deadline, mcp_stdio.proc.poll() is None)


_counter = itertools.count()


@pytest.fixture(scope="module")
def mcp_http(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, str]]:
    folder = tmp_path_factory.mktemp("mcp-http")
    (folder / "project").mkdir()
    (folder / "project" / "compose.yaml").write_text((REPO / "compose.yaml").read_text())
    (folder / "token").write_text(TOKEN + "\n")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, "-m", "t4serve", "mcp", "--http", f"127.0.0.1:{port}",
         "--compose-file", str(folder / "project" / "compose.yaml")],
        env=mcp_env(folder, T4SERVE_MCP_TOKEN_FILE=str(folder / "token"), T4SERVE_API_KEY=SENTINEL,
                    HF_TOKEN=SENTINEL_TOKEN), cwd=folder, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    wait_listening(port, proc)
    status, headers, _ = _http_post(port, json.dumps(INITIALIZE).encode(), {"Authorization": f"Bearer {TOKEN}"})
    assert status == 200
    session = headers.get("mcp-session-id", "")
    _http_post(port, b'{"jsonrpc": "2.0", "method": "notifications/initialized"}',
               {"Authorization": f"Bearer {TOKEN}", "mcp-session-id": session})
    yield port, session
    proc.terminate()
    proc.wait(timeout=10)


def _http_post(port: int, body: bytes, extra: dict[str, str] | list[tuple[str, str]],
               timeout: float = 20.0) -> tuple[int, dict[str, str], bytes]:  # fmt: skip
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.putrequest("POST", "/mcp", skip_accept_encoding=True)
        headers = [("Content-Type", "application/json"), ("Accept", "application/json, text/event-stream"),
                   ("Content-Length", str(len(body)))]  # fmt: skip
        for name, value in [*headers, *(extra.items() if isinstance(extra, dict) else extra)]:
            conn.putheader(name, value)
        conn.endheaders(body)
        response = conn.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read(1 << 20)
    finally:
        conn.close()


HTTP_STATUSES = {200, 202, 400, 401, 404, 405, 406, 413, 415, 421, 403}


@_settings(150)
@given(data=st.data(), auth=st.sampled_from(["good", "good", "good", "none", "wrong", "two", "lowercase", "huge"]))
def test_mcp_http_answers_whatever_a_client_sends(mcp_http: tuple[int, str], data: st.DataObject, auth: str) -> None:
    port, session = mcp_http
    n = next(_counter)
    body, _must = data.draw(mcp_lines(f"h-{n}"))
    tried("MCP HTTP")
    headers: list[tuple[str, str]] = [("mcp-session-id", session)]
    good = f"Bearer {TOKEN}"
    headers += {"good": [("Authorization", good)], "none": [], "wrong": [("Authorization", "Bearer nope-0123")],
                "two": [("Authorization", "Bearer nope-0123"), ("Authorization", good)],
                "lowercase": [("authorization", good)], "huge": [("Authorization", "Bearer " + "x" * 60000)]}[auth]
    began = time.monotonic()
    try:
        status, _headers, answer = _http_post(port, body, headers)
    except (ConnectionError, http.client.HTTPException) as exc:
        # Only a body past the 4 MiB cap may be cut off mid-send (the server answers 413 and closes).
        status, answer = (413, b"") if len(body) > (4 << 20) else (-1, repr(exc).encode())
    took = time.monotonic() - began
    alive = _http_post(port, json.dumps({"jsonrpc": "2.0", "id": "alive", "method": "ping"}).encode(),
                       [("mcp-session-id", session), ("Authorization", good)])[0] == 200  # fmt: skip
    lines = [ln[5:].strip() for ln in answer.splitlines() if ln.startswith(b"data:")] or \
            ([answer] if answer.startswith(b"{") else [])
    _answered(lines, f"HTTP {auth} {body[:60]!r}", "MCP HTTP", took, 15.0, alive and status in HTTP_STATUSES)
    if auth in ("none", "wrong", "two", "huge"):
        assert status in (401, 413, 431) or status >= 400


# host-check with hostile clients and files

DOCKER_ANSWERS = st.one_of(
    st.just(json.dumps({"ServerVersion": "27.3.1", "DockerRootDir": "/var/lib/docker", "Runtimes": {"runc": {}}})),
    st.builds(json.dumps, json_values), st.text(max_size=200),
    st.sampled_from(["[" * 50000 + "]" * 50000, '{"Runtimes": NaN}', "\x00\xff", "{}", "null",
                     json.dumps({"DockerRootDir": "/x\n[evil]", "Runtimes": {"a\nb": {}}})]),
    st.builds(lambda d: json.dumps({"ServerVersion": "1", "DockerRootDir": "/var/lib/docker", **d}),
              st.dictionaries(st.sampled_from(["Runtimes", "DockerRootDir", "DefaultRuntime", "CDISpecDirs",
                                               "ServerVersion"]), json_values, max_size=3)),
)  # fmt: skip
COMPOSE_TEXTS = st.one_of(
    st.just(None), st.text(max_size=300),
    st.sampled_from(["services:\n  t4serve:\n    shm_size: 1.2.3gb\n", "    shm_size: " + "9" * 400 + "\n",
                     "    mem_limit: 0.0000001k\n", "    shm_size: '\u0662gb'\n",
                     "    ipc: host\n    shm_size: 1e9\n"]),
)  # fmt: skip


@_settings(80)
@given(info=DOCKER_ANSWERS, inspect=DOCKER_ANSWERS, info_code=st.sampled_from([0, 0, 0, 1, 127]),
       inspect_code=st.sampled_from([0, 1]), compose=COMPOSE_TEXTS,
       compose_kind=st.sampled_from(["text", "text", "text", *HOSTILE_FILES]))  # fmt: skip
def test_host_check_with_any_client_and_compose_file(
    info: str, inspect: str, info_code: int, inspect_code: int, compose: str | None, compose_kind: str
) -> None:
    from test_host_docker import make_clients

    tried("host-check")
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        docker, _ = make_clients(tmp / "bin", {"info": [info_code, info, "engine says no\n"],
                                               "image inspect": [inspect_code, inspect, "No such image\n"]})
        compose_file = tmp / "compose.yaml"
        if compose_kind == "text":
            compose_file.write_text(compose if compose is not None else (REPO / "compose.yaml").read_text())
        else:
            hostile_file(compose_file, compose_kind)
        env = {**base_environ(tmp), "DOCKER": str(docker), "T4SERVE_API_KEY": SENTINEL}
        for json_form in ([], ["--json"]):
            began = time.monotonic()
            outcome = run_cli(["host-check", *json_form, "--compose-file", str(compose_file)], env)
            # A folder given to --compose-file is click's usage error (2); any other file is read, refused or not.
            allowed = {2} if compose_kind == "directory" else {3, 5}
            record("host-check", outcome, allowed, seconds=time.monotonic() - began, deadline=30.0,
                   label=f"info {info[:60]!r} ({info_code}), inspect {inspect[:40]!r}, compose {compose_kind}")


# The compile ladder's record and lock, the start history and the state files, as the vLLM wrapper meets them at start
# and when it records an outcome.

CACHE_FILE = st.one_of(
    st.just(None), st.builds(json.dumps, json_values), st.binary(max_size=100),
    st.sampled_from(HOSTILE_FILES),
    st.builds(lambda k, e: json.dumps({k: e}), st.text(max_size=20),
              st.fixed_dictionaries({}, optional={"rung": argument_values, "failed": argument_values,
                                                  "model": argument_values, "gpu": argument_values})),
    st.builds(lambda records: json.dumps(records), st.lists(st.fixed_dictionaries(
        {"model": st.text(max_size=5), "gpu_name": st.none() | st.text(max_size=5),
         "finished_at": argument_values, "total_seconds": argument_values, "phases": argument_values}), max_size=3)),
)  # fmt: skip


def _place(path: Path, content: str | bytes | None) -> None:
    if content is None:
        return
    if isinstance(content, str) and content in HOSTILE_FILES:
        hostile_file(path, content)
    else:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content if isinstance(content, bytes) else content.encode())


@_settings(200)
@given(record_file=CACHE_FILE, history_file=CACHE_FILE, lock=st.sampled_from([None, *HOSTILE_FILES]),
       history_lock=st.sampled_from([None, "fifo", "directory"]), state=CACHE_FILE, exit_request=CACHE_FILE)
def test_the_wrapper_with_any_record_lock_and_state(
    record_file: Any, history_file: Any, lock: str | None, history_lock: str | None, state: Any, exit_request: Any
) -> None:
    from t4serve.config import compilation
    from t4serve.supervise import compilerecord, history
    from t4serve.supervise.run_vllm import Wrapper
    from t4serve.supervise.state import EXIT_REQUEST_FILE, STATE_FILE, RunSpec

    tried("compile ladder and state")
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        cache, state_dir = tmp / "cache", tmp / "state"
        state_dir.mkdir()
        _place(cache / compilerecord.RECORD_FILE, record_file)
        _place(cache / history.HISTORY_FILE, history_file)
        _place(cache / compilerecord.LOCK_FILE, lock)
        _place(cache / history.LOCK_FILE, history_lock)
        _place(state_dir / STATE_FILE, state)
        _place(state_dir / EXIT_REQUEST_FILE, exit_request)
        spec = RunSpec(argv=["vllm", "serve", "m"], env={}, model="org/m", served_model_name="m", host="127.0.0.1",
                       port=8000, dtype="float16", shutdown_timeout=0, canary=False, gpu_name="Tesla T4",
                       hf_hub_cache=str(tmp / "hub"), cache_dir=str(cache),
                       compile_ladder=[[r.name, *r.flags] for r in compilation.LADDER])  # fmt: skip
        out = io.StringIO()
        began = time.monotonic()
        try:
            wrapper = Wrapper(spec, state_dir, out=out)
            wrapper._announce()
            wrapper._save()
            wrapper._given_up()
            problem = wrapper._record_rung("lean", failed="full")
            history.append(cache, history.StartRecord("org/m", "Tesla T4", 1.0, 2.0, {}))
            outcome = Outcome(0, out.getvalue(), problem or "")
        except (OSError, LockError) as exc:  # history.append's documented failures (the wrapper catches them)
            outcome = Outcome(0, out.getvalue(), str(exc))
        except Exception as exc:
            outcome = Outcome(70, out.getvalue(), f"Traceback: {type(exc).__name__}: {exc}")
        record("compile ladder and state", outcome, {0}, seconds=time.monotonic() - began, deadline=8.0,
               label=f"record {str(record_file)[:60]!r} lock {lock} state {str(state)[:40]!r}")


# Bench result folders through `bench report` and `bench compare`.

RUN_FIELDS = ["model", "input_len", "concurrency", "repeat", "num_prompts", "raw_file", "error"]
FIGURE_FIELDS = ["completed", "failed", "output_throughput", "median_tpot_ms", "median_ttft_ms", "mean_ttft_ms",
                 "total_output_tokens", "duration_s"]  # fmt: skip
TOP_FIELDS = ["schema", "models", "inputs", "concurrencies", "repeats", "output_len", "ceilings", "planned_runs"]
# Plausible figures (the report must render them) as often as hostile ones (it must refuse or render them safely).
PLAUSIBLE = st.floats(min_value=0, max_value=1e6, allow_nan=False) | st.integers(0, 10**6)
FIGURE_VALUES = st.one_of(PLAUSIBLE, PLAUSIBLE, PLAUSIBLE, argument_values,
                          st.sampled_from([1e308, -1e-9, 0, 0.0, 1e9, 1e10, 2**63, "qat|x", "a\nb", "| --- |"]))


@_settings(100)
@given(top=st.dictionaries(st.sampled_from(TOP_FIELDS), FIGURE_VALUES, max_size=1) | st.just({}),
       run_edits=st.dictionaries(st.sampled_from(RUN_FIELDS), FIGURE_VALUES, max_size=2),
       figure_edits=st.dictionaries(st.sampled_from(FIGURE_FIELDS), FIGURE_VALUES, max_size=2),
       which=st.integers(0, 7), duplicate=st.booleans())  # fmt: skip
def test_bench_report_and_compare_on_any_result_folder(
    top: dict[str, Any], run_edits: dict[str, Any], figure_edits: dict[str, Any], which: int, duplicate: bool
) -> None:
    from test_hardening_21 import runs_json

    tried("bench folders")
    body = runs_json()
    body.update(top)
    if isinstance(body.get("runs"), list):
        body["runs"][which].update(run_edits)
        if isinstance(body["runs"][which].get("figures"), dict):
            body["runs"][which]["figures"].update(figure_edits)
        if duplicate:
            body["runs"].append(body["runs"][which])
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        for name, content in (("a", body), ("b", runs_json())):
            (tmp / name / "raw").mkdir(parents=True)
            (tmp / name / "runs.json").write_text(json.dumps(content))
        env = base_environ(tmp)
        label = f"top {top!r} run {run_edits!r} figures {figure_edits!r} dup {duplicate}"[:300]
        report = run_cli(["bench", "report", str(tmp / "a")], env)
        record("bench folders", report, {0, 2}, label=f"report: {label}")
        record("bench folders", run_cli(["bench", "compare", str(tmp / "b"), str(tmp / "a")], env), {0, 2},
               label=f"compare: {label}")
        if report.code == 0:
            # Rendered: every table keeps its header's columns, and the plots were drawn.
            for block in report.out.split("\n\n"):
                rows = [ln.replace("\\|", "") for ln in block.splitlines() if ln.startswith("|")]
                assert len({row.count("|") for row in rows}) <= 1, block
            assert len(list((tmp / "a").glob("*.png"))) == 3


def test_an_empty_state_dir_writes_into_the_tests_own_folder(serve_recorder: None) -> None:
    """Issue 45: `T4SERVE_STATE_DIR=` (unset) made `serve` write state.json, run-spec.json and supervisord.conf into
    the host's /tmp/t4serve, where a later `t4serve status` read a server that did not exist."""
    default = Path(settings_table.default_of("T4SERVE_STATE_DIR"))
    assert default != Path("/tmp/t4serve") and default.is_relative_to(tempfile.gettempdir())
    with tempfile.TemporaryDirectory() as d:
        outcome = run_cli(["serve"], {**base_environ(Path(d)), "T4SERVE_PREFLIGHT": "warn", "T4SERVE_STATE_DIR": ""})
    assert outcome.code == 0, outcome.err
    assert {p.name for p in default.iterdir()} >= {"state.json", "run-spec.json", "supervisord.conf"}
