"""Issue 33's report, one named test (or a few) per item: the MCP deployment lock (links, folders and files that are
not its own, hostile holder records, one lock per deployment however it is spelled), clients whose output holds NUL
bytes, vLLM flags the plan and vLLM read differently, `plan` exit codes, the work across a checkpoint's files, and
secrets inside JSON-valued vLLM flags. The MCP frames and bench doors are in test_hardening_33_doors.py. Each failed
on the code before the fix (the commit that added it says how it failed).
"""

from __future__ import annotations

import json
import os
import struct
import time
from pathlib import Path
from typing import Any

import pytest
from e2b_checkpoint import e2b_config, write_checkpoint
from hardening import SENTINEL, SENTINEL_TOKEN, Outcome, base_environ, record, run_cli, tried

from t4serve.errors import EngineError
from t4serve.mcp.deploylock import DeploymentBusy, Holder, hold, lock_file, read_holder

AREA = "issue 33 regressions"
REPO = Path(__file__).resolve().parents[2]
HOLDER = Holder("start_vllm_server", os.getpid(), "x", 1_790_000_000.0)


def _check(outcome: Outcome, allowed: set[int], label: str, **kwargs: Any) -> Outcome:
    tried(AREA)
    record(AREA, outcome, allowed, secrets=(SENTINEL, SENTINEL_TOKEN), label=label, **kwargs)
    return outcome


# 1. The MCP deployment lock: a link at its path (to a file, dangling), a folder of someone else's or writable by
# others, a file with two links: refused, and the file behind never emptied or created.


@pytest.mark.parametrize("kind", ["link-to-file", "dangling-link", "hard-link"])
def test_the_deployment_lock_never_follows_a_link_or_truncates_another_file(tmp_path: Path, kind: str) -> None:
    victim = tmp_path / "victim.txt"
    path = lock_file(tmp_path / "data", "t4serve@local")
    path.parent.mkdir(parents=True, mode=0o700)
    if kind == "dangling-link":
        path.symlink_to(victim)
    else:
        victim.write_text("precious\n")
        path.symlink_to(victim) if kind == "link-to-file" else os.link(victim, path)
    tried(AREA)
    with pytest.raises(EngineError) as info, hold(path, HOLDER):
        pytest.fail("held a lock that is not its own file")
    message = info.value.message()
    record(AREA, Outcome(2, message, ""), {2}, label=f"deployment lock: {kind}")
    assert not isinstance(info.value, DeploymentBusy) and f"remove {path}" in message
    assert ("symbolic link" in message) if kind != "hard-link" else ("2 links" in message)
    if kind == "dangling-link":
        assert not victim.exists()
    else:
        assert victim.read_text() == "precious\n"


@pytest.mark.parametrize("kind", ["writable-by-others", "a-link-to-a-folder"])
def test_a_locks_folder_others_can_write_is_refused(tmp_path: Path, kind: str) -> None:
    path = lock_file(tmp_path / "data", "t4serve@local")
    if kind == "writable-by-others":
        path.parent.mkdir(parents=True)
        path.parent.chmod(0o777)
    else:
        (tmp_path / "elsewhere").mkdir(mode=0o700)
        path.parent.parent.mkdir()
        path.parent.symlink_to(tmp_path / "elsewhere")
    tried(AREA)
    with pytest.raises(EngineError) as info, hold(path, HOLDER):
        pytest.fail("held a lock in a folder others control")
    message = info.value.message()
    record(AREA, Outcome(2, message, ""), {2}, label=f"locks/ {kind}")
    assert "the lock's folder" in message and "T4SERVE_MCP_DATA_DIR" in message
    assert not list((tmp_path / "elsewhere").glob("*")) if kind == "a-link-to-a-folder" else True


# 3. A live holder's record, whatever it holds, gives a "busy" answer of bounded, printable text.

HOSTILE_RECORDS = {
    "since 1e300": {"tool": "t", "pid": 1, "client": "c", "since": 1e300},
    "since nan": '{"tool": "t", "pid": 1, "client": "c", "since": "nan"}',
    "since -1e18": {"tool": "t", "pid": 1, "client": "c", "since": -1e18},
    "deep": "[" * 2000 + "]" * 2000,
    "long tool": {"tool": "\x1b[31m\n" + "x" * 3000, "pid": 1, "client": "c\nd", "since": 0},
    "not json": "\x00\xff garbage",
}


@pytest.mark.parametrize("case", sorted(HOSTILE_RECORDS))
def test_a_hostile_holder_record_gives_a_clean_busy_answer(tmp_path: Path, case: str) -> None:
    path = lock_file(tmp_path, "t4serve@local")
    body = HOSTILE_RECORDS[case]
    raw = body if isinstance(body, str) else json.dumps(body)
    tried(AREA)
    with hold(path, HOLDER):
        with path.open("r+b") as handle:  # the holder's record replaced by a hostile one, while held
            handle.truncate(0)
            handle.write(raw.encode("utf-8", "surrogateescape")[:4096])
        with pytest.raises(DeploymentBusy) as info, hold(path, HOLDER):
            pytest.fail("two holders")
    message = info.value.message()
    record(AREA, Outcome(2, message, ""), {2}, label=f"holder record {case}")
    first = message.splitlines()[0]
    assert first.startswith("start_vllm_server: busy: ") and len(message) < 1500 and "\x1b" not in message
    if case == "long tool":
        assert "3,006 characters in all" in first
    assert read_holder(path) is None or case == "long tool"


# 8. One lock per deployment, however it is spelled: DOCKER_HOST the default socket or unset; COMPOSE_PROJECT_NAME
# naming the project whichever folder the compose file is in.


def _deployment(tmp_path: Path, folder: str, **environ: str) -> str:
    from t4serve.host.docker import engine_from_environ
    from t4serve.mcp.calls import ToolEnv

    compose = tmp_path / folder / "compose.yaml"
    compose.parent.mkdir(parents=True, exist_ok=True)
    compose.write_text("services: {}\n")
    engine = engine_from_environ(environ, compose_file=compose)
    return ToolEnv(engine=engine, environ=environ, data_dir=tmp_path, compose_file=compose).deployment()


def test_the_lock_is_one_per_deployment_as_compose_sees_it(tmp_path: Path) -> None:
    tried(AREA)
    assert _deployment(tmp_path, "a") == _deployment(tmp_path, "a", DOCKER_HOST="unix:///var/run/docker.sock")
    assert _deployment(tmp_path, "a", DOCKER_HOST="tcp://gpu:2375/") == _deployment(tmp_path, "a",
                                                                                      DOCKER_HOST="tcp://gpu:2375")
    one = _deployment(tmp_path, "a", COMPOSE_PROJECT_NAME="prod")
    assert one == _deployment(tmp_path, "b", COMPOSE_PROJECT_NAME="prod") == "prod@local"
    assert _deployment(tmp_path, "a") != _deployment(tmp_path, "b")
    record(AREA, Outcome(0, "", ""), {0}, label="deployment names")


# 2. A Docker or compose client whose output holds NUL bytes: a tool error or a result, never "internal error".


@pytest.mark.parametrize("tool", ["server_status", "server_logs", "start_vllm_server", "run_benchmark"])
def test_a_client_printing_nul_bytes_is_no_internal_error(tmp_path: Path, tool: str) -> None:
    from test_host_docker import INSPECT, make_clients
    from test_mcp_tools import call

    from t4serve.host.docker import DockerCli
    from t4serve.mcp.calls import ToolEnv

    answers = {"ps": [0, "c0ffee\u0000\n", ""], "logs": [0, "line\u0000one\n", ""], "up": [0, "", "\u0000"],
               "inspect": [0, json.dumps(INSPECT).replace("running", "run\u0000ning"), ""],
               "image inspect": [0, "{\"Size\": 1}", ""]}  # fmt: skip
    docker, compose = make_clients(tmp_path / "bin", answers)
    project = tmp_path / "project"
    project.mkdir()
    (project / "compose.yaml").write_text("services: {}\n")
    environ = {"PATH": os.environ["PATH"], "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}
    engine = DockerCli(compose_file=project / "compose.yaml", project="t4s", image="t4serve:dev", docker=str(docker),
                       compose=[str(compose)], environ=environ)  # fmt: skip
    env = ToolEnv(engine=engine, environ=environ, data_dir=tmp_path / "data", compose_file=engine.compose_file)
    tried(AREA)
    result = call(env, tool, {"model": "qat"} if tool == "start_vllm_server" else {})
    text = "\n".join(getattr(c, "text", "") for c in result.content)
    record(AREA, Outcome(70 if "internal error" in text else 0, text, ""), {0}, label=f"{tool} with NUL output")
    assert "internal error" not in text and "null byte" not in text and "\x00" not in text


def test_no_argument_holding_a_nul_reaches_a_client(tmp_path: Path) -> None:
    from test_host_docker import calls, make_clients

    from t4serve.host.docker import DockerCli

    docker, compose = make_clients(tmp_path / "bin", {"ps": [0, "c0ffee\u0000\n", ""]})
    (tmp_path / "compose.yaml").write_text("services: {}\n")
    engine = DockerCli(compose_file=tmp_path / "compose.yaml", project="t4s", image="t4serve:dev", docker=str(docker),
                       compose=[str(compose)], environ={"PATH": "/usr/bin:/bin"})  # fmt: skip
    tried(AREA)
    try:
        engine.service()
    except EngineError as exc:
        assert "found:" in exc.message()
    record(AREA, Outcome(0, "", ""), {0}, label="NUL never on a command line")
    assert all("\x00" not in arg for c in calls(tmp_path / "bin") for arg in c["argv"])


# 4. Flags vLLM reads one way and the plan another: refused, or sized as vLLM reads them.


@pytest.mark.parametrize(
    ("args", "words"),
    [
        ("--block-size 3_2", "ASCII digits"),
        ("--block-size=\u0663\u0662", "ASCII digits"),
        ("--block-size", "--block-size needs a value"),
        ("--block-size --enforce-eager", "--block-size needs a value"),
        ("--no-async-scheduling=true", "switch"),
        ("--async-scheduling=0", "switch"),
        ("--tokenizer other/tok", "tokenizer"),
        ("--max-loras \u0663", "ASCII decimal"),
        ("--max-loras=\uff18", "ASCII decimal"),
        ("--max-cpu-loras 1_0", "ASCII decimal"),
    ],
)
def test_flags_vllm_would_read_otherwise_are_refused(tmp_path: Path, args: str, words: str) -> None:
    env = {**base_environ(tmp_path), "T4SERVE_VLLM_ARGS": args}
    outcome = _check(run_cli(["plan", "--gpu", "t4"], env), {2}, f"T4SERVE_VLLM_ARGS={args}")
    assert words in outcome.err and "fix:" in outcome.err


@pytest.mark.parametrize(("args", "size"), [("--block-size +32", 32), ("--block-size=+64", 64),
                                            ("--block-size ' 32 '", 32), ("--block-size 64", 64)])  # fmt: skip
def test_the_plan_sizes_the_block_vllm_takes(tmp_path: Path, args: str, size: int) -> None:
    env = {**base_environ(tmp_path), "T4SERVE_VLLM_ARGS": args}
    outcome = _check(run_cli(["plan", "--gpu", "t4", "--json"], env), {0}, f"T4SERVE_VLLM_ARGS={args}")
    plan = json.loads(outcome.out)["plan"]
    assert plan["sizing"]["block_size"] == size
    # The plan passes no block size of its own: vLLM reads the user's, the one sized.
    assert plan["argv"].count("--block-size") + sum(a.startswith("--block-size=") for a in plan["argv"]) == 1


# 5. `plan` exits 2 on a plan that cannot run, in both forms, as roofline does for the same checkpoint.


@pytest.mark.parametrize("as_json", [False, True])
def test_plan_exits_2_when_vllm_would_refuse_the_settings(tmp_path: Path, as_json: bool) -> None:
    env = {**base_environ(tmp_path), "T4SERVE_MAX_NUM_BATCHED_TOKENS": "128", "T4SERVE_MAX_NUM_SEQS": "256"}
    outcome = _check(run_cli(["plan", "--gpu", "t4", *(["--json"] if as_json else [])], env), {2},
                     f"batched below seqs json={as_json}")
    assert "cannot run" in outcome.err and "fix:" in outcome.err


@pytest.mark.parametrize("command", [["plan", "--gpu", "t4"], ["plan", "--gpu", "t4", "--json"], ["roofline"]])
def test_an_unknown_layer_type_exits_2_in_plan_and_roofline(tmp_path: Path, command: list[str]) -> None:
    model = tmp_path / "m"
    write_checkpoint(model, "bf16")
    config = e2b_config("bf16")
    text = config["text_config"]
    text["layer_types"] = ["mystery_attention"] * text["num_hidden_layers"]
    (model / "config.json").write_text(json.dumps(config))
    env = {**base_environ(tmp_path), "T4SERVE_MODEL": str(model)}
    args = [*command, str(model)] if command == ["roofline"] else command
    outcome = _check(run_cli(args, env), {2}, f"unknown layer type: {' '.join(command)}")
    assert "fix:" in outcome.err


# 6. The work across a checkpoint's files is bounded: refused within seconds, whatever the files hold.


def _one_byte_tensors(path: Path, count: int, prefix: str = "t") -> dict[str, str]:
    header = {f"model.language_model.layers.0.{prefix}{i}.weight": {"dtype": "U8", "shape": [1],
                                                                      "data_offsets": [i, i + 1]}
              for i in range(count)}  # fmt: skip
    raw = json.dumps(header).encode()
    with path.open("wb") as handle:
        handle.write(struct.pack("<Q", len(raw)) + raw)
        handle.truncate(8 + len(raw) + count)
    return dict.fromkeys(header, path.name)


@pytest.mark.parametrize("case", ["one header past the tensors", "shards past the tensors", "too many shards"])
def test_a_checkpoint_past_the_bounds_is_refused_at_once(tmp_path: Path, case: str) -> None:
    from t4serve.probes.checkpoint import MAX_SHARDS, MAX_TENSORS

    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(e2b_config("bf16")))
    if case == "one header past the tensors":
        _one_byte_tensors(model / "model.safetensors", MAX_TENSORS + 1)
    else:
        shards = MAX_SHARDS + 1 if case == "too many shards" else 4
        per = 1 if case == "too many shards" else MAX_TENSORS // 4 + 1
        weight_map: dict[str, str] = {}
        for shard in range(shards):
            weight_map.update(_one_byte_tensors(model / f"model-{shard:05d}.safetensors", per, f"s{shard}_"))
        (model / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    env = {**base_environ(tmp_path), "T4SERVE_MODEL": str(model)}
    began = time.monotonic()
    outcome = _check(run_cli(["plan", "--gpu", "t4"], env), {2}, f"checkpoint: {case}")
    print(f"{case}: refused in {time.monotonic() - began:.2f} s")
    assert "t4serve reads for one checkpoint" in outcome.err


# 7. A secret inside a JSON-valued vLLM flag: refused, and redacted wherever the flags are shown.


@pytest.mark.parametrize(
    "args",
    [
        f"--model-loader-extra-config '{{\"s3_secret_access_key\": \"{SENTINEL}\"}}'",
        f"--model-loader-extra-config='{{\"s3_secret_access_key\" : \"{SENTINEL}\"}}'",
        f"--speculative-config '{{\"method\": \"ngram_gpu\", \"hf_token\": \"{SENTINEL}\"}}'",
        f"--model-loader-extra-config.apiKey {SENTINEL}",
        f"--enforce-eager --kv-transfer-config '{{\"kv_connector_extra_config\": {{\"password\": \"{SENTINEL}\"}}}}'",
    ],
)
def test_a_secret_in_a_json_valued_flag_is_refused_and_never_shown(tmp_path: Path, args: str) -> None:
    env = {**base_environ(tmp_path), "T4SERVE_VLLM_ARGS": args}
    for command in (["plan", "--gpu", "t4", "--json"], ["env"], ["preflight"]):
        outcome = _check(run_cli(command, env), {2}, f"{command[0]} with {args[:40]}")
        assert "fix:" in outcome.err


def test_keys_that_only_look_like_secrets_pass(tmp_path: Path) -> None:
    args = "--model-loader-extra-config '{\"num_speculative_tokens\": 3, \"tokenizer\": \"x\"}'"
    env = {**base_environ(tmp_path), "T4SERVE_VLLM_ARGS": args}
    _check(run_cli(["plan", "--gpu", "t4"], env), {0}, "num_speculative_tokens")
