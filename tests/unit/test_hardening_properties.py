"""Property-based hardening suite (Hypothesis): whatever a user, a checkpoint, a state file or a server gives t4serve,
no traceback, only the exit codes each command promises, no sentinel secret in any output or written file, and every
healthcheck within its deadline. Examples are derandomized, so every run tries the same inputs and the figures the
session summary prints (inputs per area, tracebacks, leaks, late checks) are reproducible.
"""

from __future__ import annotations

import itertools
import json
import os
import struct
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from e2b_checkpoint import e2b_config, write_checkpoint
from hardening import (
    SCRIPT_KINDS,
    SENTINEL,
    SENTINEL_TOKEN,
    MisbehavingServer,
    Outcome,
    Script,
    base_environ,
    files_text,
    misbehaving_server,
    ready_state,
    record,
    run_cli,
    tried,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from t4serve.checkpoint import DTYPE_BITS, TEXT_INTS, probe_model
from t4serve.commands import serve
from t4serve.settings import VARIABLES
from t4serve.variables import Variable

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
]  # fmt: skip
env_text = st.one_of(
    st.sampled_from(NASTY_VALUES),
    st.text(alphabet=st.characters(blacklist_characters="\x00", blacklist_categories=("Cs",)), max_size=40),
    st.builds(lambda a, b: a + b, st.sampled_from(NASTY_VALUES), st.sampled_from(NASTY_VALUES)),
)


@pytest.fixture(scope="module")
def serve_recorder() -> Iterator[None]:
    """`serve` runs up to starting supervisord (replaced by a no-op), so what it writes can be searched."""
    with mock.patch.object(serve.shutil, "which", lambda name: f"/usr/bin/{name}"), \
            mock.patch.object(serve.pid1, "run", lambda argv, state, env: 0):  # fmt: skip
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
