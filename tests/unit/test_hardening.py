"""Issue 12's nine defects, one named regression test each: secrets that stay secret, and no input that reaches a
traceback (settings, T4SERVE_VLLM_ARGS, checkpoint files, state files, the healthcheck's server, bench options)."""

from __future__ import annotations

import json
import os
import struct
import time
from pathlib import Path
from typing import Any

import pytest
from e2b_checkpoint import e2b_config, write_checkpoint, write_hf_cache
from hardening import (
    SENTINEL,
    SENTINEL_TOKEN,
    Outcome,
    Script,
    base_environ,
    files_text,
    misbehaving_server,
    ready_state,
    record,
    run_cli,
    tried,
    write_state,
)

from t4serve.bench.runner import served_model_name
from t4serve.commands import serve
from t4serve.config.settings import Settings
from t4serve.errors import BenchError, ConfigError
from t4serve.probes.checkpoint import probe_model
from t4serve.supervise.canary import run_canary
from t4serve.supervise.render import conf_value

AREA = "issue 12 regressions"


def _check(outcome: Outcome, allowed: set[int], label: str, **kwargs: Any) -> Outcome:
    tried(AREA)
    record(AREA, outcome, allowed, secrets=(SENTINEL, SENTINEL_TOKEN), label=label, **kwargs)
    return outcome


# 1. A whitespace-only secret counted as set, and the server ran with no key.


@pytest.mark.parametrize("name", ["T4SERVE_API_KEY", "HF_TOKEN"])
@pytest.mark.parametrize("blank", ["   ", "\t", " \n "])
def test_1_blank_secret_is_refused_not_taken_as_no_key(tmp_path: Path, name: str, blank: str) -> None:
    outcome = _check(run_cli(["env"], {**base_environ(tmp_path), name: blank}), {2}, f"{name}={blank!r}")
    assert f"{name}=<redacted>: must be one" in outcome.err and "not blank" in outcome.err
    with pytest.raises(ConfigError):
        Settings.from_environ({name: blank})


# 2. T4SERVE_VLLM_ARGS messages showed the secret when the first problem was something else.


@pytest.mark.parametrize(
    "args",
    [
        f"--port 1 --api-key {SENTINEL}",
        f"--api-key '{SENTINEL}",
        f"--api-key -{SENTINEL}",
        f"--enforce-eager --hf-token={SENTINEL} --dtype half",
        f"--api_key {SENTINEL} --port 2",
        f"-pp 2 --api-k {SENTINEL}",
        f"--load-format dummy --api-key={SENTINEL}",
        f'--chat-template "x --hf-token {SENTINEL}',
    ],
)
@pytest.mark.parametrize("command", [["env"], ["plan", "--gpu", "t4"], ["plan", "--gpu", "t4", "--json"],
                                     ["preflight"]])  # fmt: skip
def test_2_vllm_args_messages_never_show_a_secret_value(tmp_path: Path, args: str, command: list[str]) -> None:
    outcome = _check(run_cli(command, {**base_environ(tmp_path), "T4SERVE_VLLM_ARGS": args}), {2}, args)
    assert "T4SERVE_VLLM_ARGS" in outcome.err


# 3. healthcheck and bench followed redirects and sent the key wherever the server pointed.


def test_3_clients_never_follow_a_redirect_with_the_key(tmp_path: Path) -> None:
    with misbehaving_server() as server:
        server.scripts["/v1/models"] = Script("redirect")
        server.scripts["/v1/completions"] = Script("redirect")
        write_state(tmp_path / "state", ready_state(server.port))
        env = {**base_environ(tmp_path), "T4SERVE_API_KEY": SENTINEL}
        outcome = _check(run_cli(["healthcheck"], env), {1}, "healthcheck redirect")
        assert "redirect" in outcome.err and "not followed" in outcome.err
        with pytest.raises(BenchError, match="not followed"):
            served_model_name(f"http://127.0.0.1:{server.port}", timeout=2, api_key=SENTINEL)
        record_ = run_canary(f"http://127.0.0.1:{server.port}", "m", None, api_key=SENTINEL, timeout=2)
        assert not record_.ok and "HTTP 302" in (record_.reason or "")
        time.sleep(0.2)
        assert not any(b"Authorization" in head or SENTINEL.encode() in head for head in server.witnessed)


# 4. The timeout bounded each read, not the check; huge bodies were read whole; a FIFO blocked forever.


@pytest.mark.parametrize("kind", ["trickle_head", "trickle_body", "huge_body", "huge_chunked", "hang"])
def test_4_healthcheck_ends_within_its_deadline_whatever_the_server_sends(tmp_path: Path, kind: str) -> None:
    with misbehaving_server() as server:
        server.scripts["/health"] = Script(kind, size=1 << 30, pause=0.05)
        write_state(tmp_path / "state", ready_state(server.port))
        began = time.monotonic()
        outcome = run_cli(["healthcheck", "--timeout", "1"], base_environ(tmp_path))
        took = time.monotonic() - began
        _check(outcome, {1}, kind, seconds=took, deadline=1.0)


def test_4_fifo_state_and_key_files_do_not_block(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    os.mkfifo(state / "state.json")
    began = time.monotonic()
    _check(run_cli(["healthcheck"], base_environ(tmp_path)), {1}, "fifo state", seconds=time.monotonic() - began,
           deadline=1.0)  # fmt: skip
    _check(run_cli(["status"], base_environ(tmp_path)), {2}, "fifo state (status)")
    os.mkfifo(tmp_path / "key")
    env = {**base_environ(tmp_path), "T4SERVE_API_KEY_FILE": str(tmp_path / "key")}
    began = time.monotonic()
    outcome = _check(run_cli(["healthcheck"], env), {1}, "fifo key", seconds=time.monotonic() - began, deadline=1.0)
    assert "regular file" in outcome.err


# 5. healthcheck and status exited 70 with a traceback on broken answers, bad options and bad state files.


@pytest.mark.parametrize(
    "kind", ["closed_mid_body", "bad_status", "long_header", "many_headers", "deep_json", "nan_json", "garbage"]
)
def test_5_healthcheck_is_unhealthy_not_a_traceback_on_broken_answers(tmp_path: Path, kind: str) -> None:
    with misbehaving_server() as server:
        server.scripts["/v1/models"] = Script(kind)
        write_state(tmp_path / "state", ready_state(server.port))
        _check(run_cli(["healthcheck"], base_environ(tmp_path)), {1}, kind)


@pytest.mark.parametrize("timeout", ["nan", "inf", "1e309", "-1", "0", "x", "1e3"])
def test_5_healthcheck_bad_timeout_exits_1(tmp_path: Path, timeout: str) -> None:
    outcome = _check(run_cli(["healthcheck", "--timeout", timeout], base_environ(tmp_path)), {1}, timeout)
    assert "--timeout" in outcome.err


def _bad_state(kind: str, state: Path, port: int) -> None:
    good = ready_state(port)
    if kind == "state dir is a file":
        state.write_text("x")
        return
    state.mkdir()
    path = state / "state.json"
    if kind == "invalid utf-8":
        path.write_bytes(b'{"schema": 1, "phase": "\xff"}')
    elif kind == "a directory":
        path.mkdir()
    elif kind == "symlink loop":
        path.symlink_to(path)
    elif kind == "-Infinity":
        path.write_text(json.dumps(good).replace('"updated_at": ', '"updated_at": -Infinity, "x": '))
    elif kind == "deep":
        path.write_text("[" * 100000 + "]" * 100000)
    elif kind == "400 digits":
        path.write_text(json.dumps({**good, "updated_at": 0}).replace('"updated_at": 0', '"updated_at": ' + "9" * 400))
    else:
        body = {
            "CR-LF host": {**good, "host": "127.0.0.1\r\nX-Evil: 1"},
            "user:pw@ host": {**good, "host": "user:pw@127.0.0.1"},
            "unknown phase": {**good, "phase": "exploded"},
            "empty phases": {**good, "phases": []},
            "port 0": {**good, "port": 0},
        }[kind]
        write_state(state, body)


@pytest.mark.parametrize(
    "kind",
    ["invalid utf-8", "a directory", "symlink loop", "-Infinity", "400 digits", "CR-LF host", "user:pw@ host",
     "unknown phase", "empty phases", "state dir is a file", "deep", "port 0"],
)  # fmt: skip
def test_5_bad_state_files_are_reported_not_tracebacks(tmp_path: Path, kind: str) -> None:
    _bad_state(kind, tmp_path / "state", 9)
    _check(run_cli(["healthcheck"], base_environ(tmp_path)), {1}, f"healthcheck: {kind}")
    _check(run_cli(["status"], base_environ(tmp_path)), {2}, f"status: {kind}")


# 6. Bad checkpoint contents reached tracebacks; lying headers and escaping paths were accepted.


def _header_file(path: Path, header: dict[str, Any], data_bytes: int) -> None:
    blob = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(blob)) + blob + b"\0" * data_bytes)


CONFIG_DAMAGE = {
    "non-integer layers": ("num_hidden_layers", 35.5),
    "string heads": ("num_attention_heads", "8"),
    "zero heads": ("num_attention_heads", 0),
    "huge vocab": ("vocab_size", 10**18),
    "short layer_types": ("layer_types", ["sliding_attention"] * 3),
    "bool layers": ("num_hidden_layers", True),
}


@pytest.mark.parametrize("damage", [*CONFIG_DAMAGE, "NaN", "deep config", "400 digits"])
def test_6_bad_config_numbers_are_invalid_facts(tmp_path: Path, damage: str) -> None:
    d = write_checkpoint(tmp_path / "ckpt", "bf16")
    config = e2b_config("bf16")
    if damage in CONFIG_DAMAGE:
        key, value = CONFIG_DAMAGE[damage]
        config["text_config"][key] = value
        (d / "config.json").write_text(json.dumps(config))
    elif damage == "NaN":
        (d / "config.json").write_text(json.dumps(config).replace('"rms_norm_eps": 1e-06', '"rms_norm_eps": NaN'))
        assert "NaN" in (d / "config.json").read_text()
    elif damage == "deep config":
        (d / "config.json").write_text("[" * 100000 + "]" * 100000)
    else:
        (d / "config.json").write_text(json.dumps(config).replace('"vocab_size": 262144', '"vocab_size": ' + "9" * 400))
    facts = probe_model(str(d), hf_home=str(tmp_path), offline=True)
    assert facts.source == "invalid", damage
    for command in (["plan", "--gpu", "t4", "--model", str(d)], ["probe", "--model", str(d)],
                    ["roofline", str(d)]):  # fmt: skip
        _check(run_cli(command, base_environ(tmp_path)), {0, 2, 3}, f"{damage}: {command[0]}")


@pytest.mark.parametrize(
    ("damage", "expect"),
    [
        ("shape lies", "hold"),
        ("overlap", "overlaps"),
        ("unknown dtype", "unknown dtype"),
        ("deep header", "nest"),
        ("index invalid utf-8", "UTF-8"),
        ("index to /etc/passwd", "plain relative name"),
        ("index to ../../", "plain relative name"),
    ],
)
def test_6_lying_headers_and_escaping_paths_are_refused(tmp_path: Path, damage: str, expect: str) -> None:
    d = write_checkpoint(tmp_path / "ckpt", "bf16")
    f = d / "model.safetensors"
    if damage == "shape lies":
        _header_file(f, {"a": {"dtype": "BF16", "shape": [100000, 100000], "data_offsets": [0, 2]}}, 2)
    elif damage == "overlap":
        _header_file(f, {"a": {"dtype": "BF16", "shape": [2], "data_offsets": [0, 4]},
                         "b": {"dtype": "BF16", "shape": [2], "data_offsets": [2, 6]}}, 6)  # fmt: skip
    elif damage == "unknown dtype":
        _header_file(f, {"a": {"dtype": "Q7", "shape": [2], "data_offsets": [0, 4]}}, 4)
    elif damage == "deep header":
        blob = b"[" * 50000 + b"]" * 50000
        f.write_bytes(struct.pack("<Q", len(blob)) + blob)
    else:
        target = {"index invalid utf-8": None, "index to /etc/passwd": "/etc/passwd", "index to ../../": "../../x"}
        index = d / "model.safetensors.index.json"
        if target[damage] is None:
            index.write_bytes(b'{"weight_map": {"a": "\xff.safetensors"}}')
        else:
            index.write_text(json.dumps({"weight_map": {"a": target[damage]}}))
    facts = probe_model(str(d), hf_home=str(tmp_path), offline=True)
    assert facts.source == "invalid" and facts.error is not None and expect in facts.error, facts.error
    _check(run_cli(["plan", "--gpu", "t4", "--model", str(d)], base_environ(tmp_path)), {0, 2, 3}, damage)


@pytest.mark.parametrize("ref", [b"../../../../etc", b"\xff\xfe", b"/etc"])
def test_6_refs_main_cannot_leave_the_cache(tmp_path: Path, ref: bytes) -> None:
    hf = tmp_path / "hf"
    snapshot = write_hf_cache(hf, "org/model", "bf16")
    (snapshot.parent.parent / "refs" / "main").write_bytes(ref)
    facts = probe_model("org/model", hf_home=str(hf), offline=True)
    # A bad ref is ignored: the newest snapshot inside the cache is used, never a folder outside it.
    assert facts.local_path == str(snapshot), facts


# 7. A newline in T4SERVE_STATE_DIR injected sections into supervisord.conf; a state dir that is a file crashed serve.


def test_7_state_dir_with_a_newline_is_refused_and_conf_values_stay_one_line(tmp_path: Path) -> None:
    env = {**base_environ(tmp_path), "T4SERVE_STATE_DIR": f"{tmp_path}/s\n[program:evil]\ncommand=/bin/sh"}
    outcome = _check(run_cli(["env"], env), {2}, "newline state dir")
    assert "T4SERVE_STATE_DIR" in outcome.err and "control characters" in outcome.err
    assert "\n[program:evil]" not in outcome.err
    with pytest.raises(ConfigError):
        conf_value("/x\n[program:evil]")


def test_7_state_dir_that_is_a_file_fails_serve_cleanly_and_preflight_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocker = tmp_path / "state"
    blocker.write_text("a file where the state folder goes")
    env = {**base_environ(tmp_path), "T4SERVE_PREFLIGHT": "warn", "T4SERVE_STATE_DIR": str(blocker / "sub")}
    preflight = _check(run_cli(["preflight"], env), {3}, "state dir is a file: preflight")
    assert "not writable" in preflight.text
    monkeypatch.setattr(serve.shutil, "which", lambda name: f"/usr/bin/{name}")
    monkeypatch.setattr(serve.pid1, "run", lambda argv, state, env: 0)
    outcome = _check(run_cli(["serve"], env), {3}, "state dir is a file: serve")
    assert "cannot write t4serve's state folder" in outcome.err


# 8. Settings: huge numbers, long path components, huge or NUL-holding token files, 1.5 bytes, numeric hosts, flags
# that break one-GPU sizing.


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("T4SERVE_KV_CACHE_MEMORY_BYTES", "9" * 400),
        ("T4SERVE_KV_CACHE_MEMORY_BYTES", "1.5"),
        ("T4SERVE_MAX_NUM_SEQS", "9" * 400),
        ("T4SERVE_MAX_MODEL_LEN", "9" * 400),
        ("T4SERVE_PORT", "9" * 5000),
        ("T4SERVE_CACHE_DIR", "/tmp/" + "a" * 300),
        ("T4SERVE_MODEL", "/tmp/" + "a" * 300),
        ("T4SERVE_HOST", "1.5"),
        ("T4SERVE_HOST", "NaN"),
        ("T4SERVE_SERVED_MODEL_NAME", "a\x01b"),
        ("T4SERVE_VLLM_ARGS", "-pp 2"),
        ("T4SERVE_VLLM_ARGS", "--pipeline-parallel-size=2"),
        ("T4SERVE_VLLM_ARGS", "-dp 2"),
        ("T4SERVE_VLLM_ARGS", "--quantization awq"),
        ("T4SERVE_VLLM_ARGS", "--load-format dummy"),
        ("T4SERVE_VLLM_ARGS", "--load_format=DUMMY"),
    ],
)
def test_8_settings_refuse_unbounded_numbers_paths_and_sizing_flags(tmp_path: Path, name: str, value: str) -> None:
    outcome = _check(run_cli(["plan", "--gpu", "t4"], {**base_environ(tmp_path), name: value}), {2}, name)
    assert name in outcome.err


@pytest.mark.parametrize("content", [b"hf_" + b"a" * (10 << 20), b"hf_abc\x00def", b"hf_\xff\xfe"])
def test_8_token_files_are_bounded_and_clean(tmp_path: Path, content: bytes) -> None:
    (tmp_path / "token").write_bytes(content)
    env = {**base_environ(tmp_path), "HF_TOKEN_FILE": str(tmp_path / "token")}
    outcome = _check(run_cli(["plan", "--gpu", "t4"], env), {2}, "token file")
    assert "HF_TOKEN_FILE" in outcome.err


# 9. bench: bad outputs, an unbalanced --vllm quote, huge or non-positive numbers, NaN ceilings, a model with a
# space, an existing results folder overwritten.


@pytest.mark.parametrize(
    "args",
    [
        ["--output", "{file}"],
        ["--output", "{file}/sub"],
        ["--output", "/tmp/" + "b" * 300],
        ["--output", "{full}"],
        ["--vllm", "'unbalanced"],
        ["--inputs", "1" * 100],
        ["--inputs", "0,-5"],
        ["--output-len", "0"],
        ["--repeats", "-1"],
        ["--num-prompts", "0"],
        ["--ready-timeout", "nan"],
        ["--cell-timeout", "-1"],
        ["--cell-timeout", "inf"],
        ["--ceiling", "qat=nan,bf16=inf"],
        ["--models", "qat,bf 16"],
        ["--concurrency", "1" * 100],
    ],
)
def test_9_bench_options_are_validated_before_anything_runs(tmp_path: Path, args: list[str]) -> None:
    (tmp_path / "file").write_text("x")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "runs.json").write_text("{}")
    args = [a.format(file=tmp_path / "file", full=tmp_path / "full") for a in args]
    env = {**base_environ(tmp_path), "T4SERVE_API_KEY": SENTINEL}
    outcome = _check(run_cli(["bench", "--base-url", "http://127.0.0.1:9", *args], env), {2}, " ".join(args)[:80])
    assert outcome.err
    assert (tmp_path / "full" / "runs.json").read_text() == "{}"
    assert SENTINEL not in files_text(tmp_path)


def test_8_a_default_made_from_the_environment_is_checked_too(tmp_path: Path) -> None:
    env = {**base_environ(tmp_path), "XDG_CACHE_HOME": f"{tmp_path}/a\nb"}
    del env["HF_HOME"]
    outcome = _check(run_cli(["env"], env), {2}, "XDG_CACHE_HOME with a newline")
    assert "HF_HOME=" in outcome.err and "control characters" in outcome.err
