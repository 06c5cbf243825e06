"""Property-based hardening suite for the doors issue 33 opened (Hypothesis, derandomized): the MCP deployment lock's
path and holder record, the bytes a Docker or compose client prints, JSON-valued vLLM flags holding secrets,
checkpoint headers and indexes at and past the bounds on work, and MCP frames and arguments. Each input: no
traceback, only the promised outcomes, no sentinel secret shown, on time; counted in the session's figures.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import struct
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from e2b_checkpoint import e2b_config
from hardening import SENTINEL, SENTINEL_TOKEN, Outcome, StdioServer, base_environ, record, run_cli, tried
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from t4serve.errors import EngineError
from t4serve.mcp.deploylock import DeploymentBusy, Holder, hold, lock_file

SECRETS = (SENTINEL, SENTINEL_TOKEN)


def _settings(examples: int) -> Any:
    return settings(max_examples=examples, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                           HealthCheck.data_too_large])  # fmt: skip


# Lock paths and holder records

LOCK_KINDS = ("absent", "regular", "link-to-file", "dangling-link", "hard-link", "fifo", "folder", "link-to-folder")
RECORD_VALUES = st.one_of(st.floats(), st.integers(min_value=-(10**30), max_value=10**30), st.text(max_size=3000),
                          st.none(), st.booleans(), st.just("nan"))  # fmt: skip
RECORDS = st.one_of(
    st.fixed_dictionaries({"tool": RECORD_VALUES, "pid": RECORD_VALUES, "client": RECORD_VALUES,
                           "since": RECORD_VALUES}).map(lambda d: json.dumps(d).encode()),
    st.binary(max_size=5000),
    st.integers(min_value=1, max_value=5000).map(lambda n: b"[" * n + b"]" * n),
)  # fmt: skip


@_settings(150)
@given(kind=st.sampled_from(LOCK_KINDS), folder_mode=st.sampled_from([0o700, 0o700, 0o755, 0o775, 0o777]),
       body=RECORDS)  # fmt: skip
def test_the_deployment_lock_with_any_path_and_record(kind: str, folder_mode: int, body: bytes) -> None:
    tried("lock paths and records")
    with tempfile.TemporaryDirectory() as d:
        root = Path(d)
        victim = root / "victim"
        victim.write_bytes(b"precious")
        path = lock_file(root / "data", "t4serve@local")
        path.parent.mkdir(parents=True)
        path.parent.chmod(folder_mode)
        if kind == "regular":
            path.write_bytes(body)
        elif kind == "link-to-file":
            path.symlink_to(victim)
        elif kind == "dangling-link":
            path.symlink_to(root / "made-by-the-lock")
        elif kind == "hard-link":
            os.link(victim, path)
        elif kind == "fifo":
            os.mkfifo(path)
        elif kind in ("folder", "link-to-folder"):
            (root / "other").mkdir()
            path.mkdir() if kind == "folder" else path.symlink_to(root / "other")
        outcome = Outcome(0, "", "")
        began = time.monotonic()
        try:
            with hold(path, Holder("start_vllm_server", os.getpid(), "x", 0.0)):
                # A second caller while held, after the record was replaced by hostile bytes.
                with open(path, "r+b") as handle:
                    handle.truncate(0)
                    handle.write(body[:4096])
                with contextlib.suppress(DeploymentBusy), hold(path, Holder("stop_vllm_server", 1, "y", 0.0)):
                    outcome = Outcome(70, "a second holder got the lock", "")
        except DeploymentBusy as exc:
            outcome = Outcome(70, f"busy with no holder: {exc.message()}", "")
        except EngineError as exc:
            outcome = Outcome(2, exc.message(), "")
        except Exception as exc:  # counted as a traceback by record
            outcome = Outcome(70, f"Traceback: {type(exc).__name__}: {exc}", "")
        took = time.monotonic() - began
        safe = victim.read_bytes() == b"precious" and not (root / "made-by-the-lock").exists()
        if not safe:
            outcome = Outcome(70, "Traceback-free, but the file behind the lock path was changed", "")
        expect_refused = kind not in ("absent", "regular") or folder_mode & 0o022
        allowed = {2} if expect_refused else {0}
        record("lock paths and records", outcome, allowed, secrets=SECRETS, seconds=took, deadline=5.0,
               label=f"{kind} in mode {folder_mode:o} with {body[:40]!r}")


# Client output bytes

OUTPUT = st.one_of(st.binary(max_size=300), st.sampled_from([b"c0ffee\x00\n", b"\x00", b"\xff\xfe\n", b"a\x00b\nc\n"]))


@_settings(60)
@given(ps=OUTPUT, logs=OUTPUT, inspect=OUTPUT)
def test_clients_printing_any_bytes(ps: bytes, logs: bytes, inspect: bytes) -> None:
    from test_host_docker import calls, make_clients

    from t4serve.host.docker import DockerCli

    tried("client output bytes")
    with tempfile.TemporaryDirectory() as d:
        folder = Path(d)
        text = {k: v.decode("latin-1") for k, v in (("ps", ps), ("logs", logs), ("inspect", inspect))}
        docker, compose = make_clients(folder / "bin", {k: [0, v, ""] for k, v in text.items()})
        # The stand-in client writes text; latin-1 code points above 0x7f come out as their UTF-8 bytes, NULs as NULs.
        (folder / "compose.yaml").write_text("services: {}\n")
        engine = DockerCli(compose_file=folder / "compose.yaml", project="t4s", image="t4serve:dev",
                           docker=str(docker), compose=[str(compose)], environ={"PATH": "/usr/bin:/bin"})  # fmt: skip
        outcome = Outcome(0, "", "")
        for step in (engine.service, lambda: engine.logs("c0ffee", 10, None)):
            try:
                result = step()
                if "\x00" in json.dumps(str(result)).encode().decode("unicode_escape", "replace"):
                    outcome = Outcome(70, "a NUL came back", "")
            except EngineError as exc:
                if "found:" not in exc.message():
                    outcome = Outcome(70, exc.message(), "")
            except Exception as exc:
                outcome = Outcome(70, f"Traceback: {type(exc).__name__}: {exc}", "")
        if any("\x00" in arg for c in calls(folder / "bin") for arg in c["argv"]):
            outcome = Outcome(70, "a NUL reached a command line", "")
        record("client output bytes", outcome, {0}, secrets=SECRETS, label=f"ps {ps[:30]!r} inspect {inspect[:30]!r}")


# JSON-valued vLLM flags holding secrets

SECRET_KEYS = ["hf_token", "s3_secret_access_key", "apiKey", "password", "client_secret", "Authorization",
               "aws-access-key", "private_key", "token"]  # fmt: skip
PLAIN_KEYS = ["method", "num_speculative_tokens", "tokenizer", "max_tokens", "model", "author", "keyword"]
JSON_FLAGS = ["--model-loader-extra-config", "--speculative-config", "--kv-transfer-config", "--compilation-config",
              "--override-generation-config", "--limit-mm-per-prompt"]  # fmt: skip


@st.composite
def json_flag(draw: st.DrawFn) -> tuple[str, bool]:
    """A JSON-valued flag and whether it holds the sentinel under a secret key."""
    secret = draw(st.booleans())
    keys = draw(st.lists(st.sampled_from(PLAIN_KEYS), max_size=3, unique=True))
    value: dict[str, Any] = {k: draw(st.sampled_from([3, "ngram_gpu", "x", True])) for k in keys}
    if secret:
        holder = {draw(st.sampled_from(SECRET_KEYS)): SENTINEL}
        if draw(st.booleans()):  # nested under a plain key
            value[draw(st.sampled_from([*PLAIN_KEYS, "extra"]))] = holder
        else:
            value.update(holder)
    flag = draw(st.sampled_from(JSON_FLAGS))
    text = json.dumps(value, separators=draw(st.sampled_from([(",", ":"), (", ", ": "), (" , ", " : ")])))
    form = draw(st.sampled_from(["space", "equals", "dotted"]))
    if form == "dotted" and secret:
        return f"{flag}.{draw(st.sampled_from(SECRET_KEYS))} {SENTINEL}", True
    quoted = "'" + text + "'"
    return (f"{flag}={quoted}" if form == "equals" else f"{flag} {quoted}"), secret


@_settings(100)
@given(flag=json_flag(), before=st.sampled_from(["", "--enforce-eager ", "--max-loras 2 "]))
def test_json_valued_flags_never_show_a_secret(flag: tuple[str, bool], before: str) -> None:
    args, secret = flag
    tried("JSON-valued vLLM flags")
    with tempfile.TemporaryDirectory() as d:
        env = {**base_environ(Path(d)), "T4SERVE_VLLM_ARGS": before + args}
        for command in (["env"], ["plan", "--gpu", "t4", "--json"]):
            # Without a secret, vLLM flags t4serve does not own pass, or are refused for their own reason.
            record("JSON-valued vLLM flags", run_cli(command, env), {2} if secret else {0, 2}, secrets=SECRETS,
                   label=before + args)


# Checkpoint headers and indexes, at and past the bounds on work


@st.composite
def checkpoint_case(draw: st.DrawFn) -> dict[str, Any]:
    from t4serve.probes.checkpoint import MAX_SHARDS, MAX_TENSORS

    shards = draw(st.sampled_from([1, 1, 2, 7, MAX_SHARDS, MAX_SHARDS + 1]))
    total = draw(st.sampled_from([1, 100, MAX_TENSORS - 1, MAX_TENSORS, MAX_TENSORS + 1, 3 * MAX_TENSORS]))
    return {"shards": shards, "tensors": max(total, shards), "index": shards > 1 or draw(st.booleans()),
            "metadata": draw(st.sampled_from([0, 1000, 20_000_000, 40_000_000])),
            "deep": draw(st.sampled_from([0, 0, 0, 10_000_000])), "extra_index": draw(st.sampled_from([0, 0, 60]))}


def _header(path: Path, names: list[str], metadata: int, deep: int) -> None:
    header: dict[str, Any] = {"__metadata__": {"m": "x" * metadata}} if metadata else {}
    header.update({n: {"dtype": "U8", "shape": [1], "data_offsets": [i, i + 1]} for i, n in enumerate(names)})
    raw = json.dumps(header, separators=(",", ":")).encode()
    if deep:
        raw = b"[" * deep + b"]" * deep
    with path.open("wb") as handle:
        handle.write(struct.pack("<Q", len(raw)) + raw)
        handle.truncate(8 + len(raw) + len(names))


@_settings(40)
@given(case=checkpoint_case())
def test_plan_answers_on_any_checkpoint_within_10_s(case: dict[str, Any]) -> None:
    tried("checkpoint files")
    with tempfile.TemporaryDirectory() as d:
        model = Path(d) / "m"
        model.mkdir()
        (model / "config.json").write_text(json.dumps(e2b_config("bf16")))
        per = case["tensors"] // case["shards"]
        weight_map: dict[str, str] = {}
        for shard in range(case["shards"]):
            name = f"model-{shard:05d}.safetensors"
            names = [f"model.language_model.layers.0.s{shard}_{i}.weight" for i in range(per)]
            _header(model / name, names, case["metadata"] if shard == 0 else 0, case["deep"] if shard == 0 else 0)
            weight_map.update(dict.fromkeys(names, name))
        weight_map.update({f"x{i}": f"missing-{i}.safetensors" for i in range(case["extra_index"])})
        if case["index"]:
            (model / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
        env = {**base_environ(Path(d)), "T4SERVE_MODEL": str(model)}
        began = time.monotonic()
        outcome = run_cli(["plan", "--gpu", "t4", "--json"], env)
        record("checkpoint files", outcome, {0, 2}, secrets=SECRETS, seconds=time.monotonic() - began,
               deadline=10.0, label=json.dumps(case))


# MCP frames and arguments


@pytest.fixture(scope="module")
def mcp_stdio(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StdioServer]:
    server = StdioServer(tmp_path_factory.mktemp("mcp-stdio-33"))
    yield server
    if server.proc.poll() is None:
        server.close()


ODD_IDS = st.one_of(st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
                    st.lists(st.integers(), max_size=2), st.none(), st.booleans(), st.floats(allow_nan=False),
                    st.integers(min_value=10**20))  # fmt: skip
TOOLS_ARGS = st.sampled_from(["server_logs", "plan", "server_status", "start_vllm_server", "query", "benchmark_status"])
_counter = itertools.count()


@st.composite
def frame(draw: st.DrawFn, n: int) -> tuple[bytes, Any]:
    """A line and the id its answer must carry (None: id null), or `...` when no answer is owed."""
    kind = draw(st.sampled_from(["odd id", "unknown argument", "huge with id", "huge id last"]))
    if kind == "odd id":
        return json.dumps({"jsonrpc": "2.0", "id": draw(ODD_IDS), "method": "ping"}).encode(), None
    if kind == "unknown argument":
        name = draw(st.text(alphabet="abcdefghijklmnopqrstuvwxyz_", min_size=1, max_size=12))
        call = {"jsonrpc": "2.0", "id": f"a-{n}", "method": "tools/call",
                "params": {"name": draw(TOOLS_ARGS), "arguments": {name + "_x": draw(st.integers())}}}  # fmt: skip
        return json.dumps(call).encode(), f"a-{n}"
    big = "z" * draw(st.sampled_from([5 << 20, 9 << 20]))
    if kind == "huge with id":
        call = {"jsonrpc": "2.0", "id": f"h-{n}", "method": "tools/call", "params": {"name": "plan",
                                                                                     "arguments": {"model": big}}}
        return json.dumps(call).encode(), f"h-{n}"
    return json.dumps({"jsonrpc": "2.0", "method": "ping", "params": {"p": big}, "id": f"h-{n}"}).encode(), None


@_settings(80)
@given(data=st.data())
def test_mcp_frames_are_answered_with_their_id(mcp_stdio: StdioServer, data: st.DataObject) -> None:
    n = next(_counter)
    line, owed = data.draw(frame(n))
    tried("MCP frames and arguments")
    began = time.monotonic()
    mcp_stdio.send(line)
    mcp_stdio.send(json.dumps({"jsonrpc": "2.0", "id": f"ping-{n}", "method": "ping"}).encode())
    answers: list[dict[str, Any]] = []
    while time.monotonic() - began < 10.0 and not any(a.get("id") == f"ping-{n}" for a in answers):
        try:
            answers.append(json.loads(mcp_stdio.answer(max(0.1, 10.0 - (time.monotonic() - began)))))
        except AssertionError:
            break
    took = time.monotonic() - began
    first = answers[0] if answers else {}
    text = json.dumps(answers)[:3000]
    ok = bool(answers) and first.get("id") == owed and any(a.get("id") == f"ping-{n}" for a in answers)
    if ok and "result" in first and first["result"].get("isError"):
        ok = "found:" in text and "fix:" in text
    bad = "internal error" in text or "Traceback" in text or not ok
    record("MCP frames and arguments", Outcome(70 if bad else 0, text, ""), {0}, secrets=SECRETS,
           seconds=took if ok else 20.0, deadline=10.0, label=f"{line[:100]!r}")
