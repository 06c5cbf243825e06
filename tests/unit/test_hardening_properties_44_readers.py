"""Property-based hardening suite over issue 44's readers, items 6 to 9 (Hypothesis, derandomized): T4SERVE_VLLM_ARGS
as vLLM's parser reads it, scripts/publish's kustomization edit, tests/gpu/imagebox.py's manifest and parts, and one
refusal of a checkpoint or a setting by every command. Each input mutates a leaf of a valid value (another type, NaN
and Infinity, huge integers, long strings, control characters, deep nesting, a key removed or added): no traceback,
only the promised exit codes, no sentinel secret shown, on time; counted in the session's figures
(docs/verification-hardening.md).
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from e2b_checkpoint import e2b_config, write_checkpoint
from hardening import REPO, SENTINEL, SENTINEL_TOKEN, Outcome, base_environ, record, run_cli, tried
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_imagebox import box, make_parts

from t4serve.config.vllmargv import flag_table, read_vllm_args

SECRETS = (SENTINEL, SENTINEL_TOKEN)


def _settings(examples: int) -> Any:
    return settings(max_examples=examples, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                           HealthCheck.data_too_large])  # fmt: skip


def _nested(depth: int) -> list[Any]:
    value: list[Any] = []
    for _ in range(depth):
        value = [value]
    return value


def _short(value: Any) -> str:
    """A label's view of a leaf: its repr cut short (a leaf nested thousands deep has no repr)."""
    try:
        return repr(value)[:60]
    except RecursionError:
        return f"<{type(value).__name__} nested past the recursion limit>"


# Hostile leaves: what replaces one value of a valid document.
HOSTILE = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(10**30), max_value=10**30),
    st.sampled_from([float("nan"), float("inf"), float("-inf"), -1, 0, 2**63, 1.5, -0.0, "", "0", "NaN", "Infinity",
                     "a\x00b", "\x1b[31mred", "line\nbreak", "\u0663\u0662", "1_0", "../../etc/passwd", [], {},
                     [[[[[]]]]], {"a": {"b": {"c": [1]}}}]),
    st.builds(lambda: 10**400), st.builds(lambda: "x" * 100_000), st.text(max_size=30),
    st.integers(min_value=1, max_value=3000).map(_nested),
)  # fmt: skip


def leaves(value: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every path to a leaf (and to every container: replacing one is a leaf mutation too)."""
    found = [path] if path else []
    if isinstance(value, dict):
        for k, v in value.items():
            found += leaves(v, (*path, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            found += leaves(v, (*path, i))
    return found


def mutated(document: Any, path: tuple[Any, ...], action: str, leaf: Any) -> Any:
    """`document` with the value at `path` replaced by `leaf`, removed, or given an unknown sibling."""
    out = copy.deepcopy(document)
    parent = out
    for key in path[:-1]:
        parent = parent[key]
    last = path[-1]
    if action == "remove":
        del parent[last]
    elif action == "add" and isinstance(parent, dict):
        parent["unknown-key"] = leaf
    else:
        parent[last] = leaf
    return out


# 6. T4SERVE_VLLM_ARGS: any of vLLM's flags, in any spelling, with any value


def _options() -> list[str]:
    return sorted(flag_table().by_option)


VALUES = st.one_of(
    st.sampled_from(["1", "0", "-1", "16", "auto", "TRITON_ATTN", "FLASH_ATTN", '{"method": "ngram_gpu"}', "[1, 2]",
                     "9" * 400, "NaN", "Infinity", "1e999", "\u0663", "1_0", "-x", "--", "a b", "'", "=", "x" * 3000,
                     '{"hf_token": "' + SENTINEL_TOKEN + '"}', "[" * 2000 + "]" * 2000]),
    st.text(max_size=12),
)  # fmt: skip


@st.composite
def spelled(draw: st.DrawFn) -> list[str]:
    option = draw(st.sampled_from(_options()))
    how = draw(st.sampled_from(["exact", "underscores", "prefix", "capitals", "equals", "dotted", "no value"]))
    name = option
    if how == "underscores" and option.startswith("--"):
        name = "--" + option[2:].replace("-", "_")
    elif how == "prefix":
        name = option[: draw(st.integers(min_value=2, max_value=len(option)))]
    elif how == "capitals":
        name = option.upper()
    elif how == "dotted":
        name = option + "." + draw(st.sampled_from(["method", "x.y", "hf_token", "mode", "a+"]))
    if how == "no value":
        return [name]
    value = draw(VALUES)
    return [f"{name}={value}"] if how == "equals" else [name, value]


@st.composite
def vllm_argv(draw: st.DrawFn) -> list[str]:
    args = [a for _ in range(draw(st.integers(min_value=1, max_value=5))) for a in draw(spelled())]
    if draw(st.booleans()):
        at = draw(st.integers(min_value=0, max_value=len(args)))
        secret = draw(st.sampled_from(["--api-key", "--api_key", "--hf-tok", "--API-KEY"]))
        args[at:at] = [secret, SENTINEL]
    return args


@_settings(300)
@given(args=vllm_argv())
def test_any_vllm_args_are_read_or_refused(args: list[str]) -> None:
    import shlex

    tried("vLLM argv reader")
    began = time.monotonic()
    try:
        read = read_vllm_args(args)
        outcome = Outcome(0, repr(read.problem), "")
    except Exception as exc:  # the reader promises an answer for any arguments
        outcome = Outcome(70, "", f"Traceback: {type(exc).__name__}: {exc}")
    record("vLLM argv reader", outcome, {0}, seconds=time.monotonic() - began, deadline=2.0, label=f"read {args!r}")
    if read.problem is not None:
        assert SENTINEL not in read.problem.written + read.problem.reason
    with tempfile.TemporaryDirectory() as d:
        # An environment variable cannot hold a NUL: another control character stands in for it there.
        env = {**base_environ(Path(d)), "T4SERVE_VLLM_ARGS": shlex.join(args).replace("\x00", "\x01")}
        for command in (["env"], ["plan", "--gpu", "t4", "--json"]):
            began = time.monotonic()
            outcome = run_cli(command, env)
            record("vLLM argv reader", outcome, {0, 2}, secrets=SECRETS, seconds=time.monotonic() - began,
                   deadline=20.0, label=f"{command[0]} {args!r}"[:300])  # fmt: skip


# 7. scripts/publish's kustomization edit


def _pin_module() -> Any:
    import importlib.util

    spec = importlib.util.spec_from_file_location("pin_kustomization", REPO / "scripts" / "pin_kustomization.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


PIN = _pin_module()
DIGEST = "sha256:" + "ab" * 32
KUSTOMIZATION = {
    "resources": ["../deploy/kubernetes/overlays/gke-t4"],
    "namePrefix": "my-",
    "images": [{"name": "t4serve", "newName": "REGISTRY/t4serve", "newTag": "0.1.0"}, {"name": "other", "newTag": "1"}],
    "labels": [{"pairs": {"app": "t4serve"}, "includeSelectors": False}],
    "patches": [{"path": "patch.yaml", "target": {"kind": "Deployment"}}],
}


def _as_yaml(data: Any, rng: random.Random) -> str:
    text = yaml.safe_dump(data, default_flow_style=rng.choice([False, None, True]), indent=rng.choice([2, 4]),
                          sort_keys=rng.random() < 0.3, allow_unicode=rng.random() < 0.5, width=rng.choice([40, 80,
                          4096]))  # fmt: skip
    lines = text.splitlines()
    for _ in range(rng.randint(0, 3)):  # comments: whole lines (at the indentation of the line after) and line ends
        at = rng.randrange(len(lines) + 1)
        lines.insert(at, " " * rng.choice([0, 2, 4]) + "# a comment " + rng.choice(["", "images:", "- name: t4serve"]))
    if rng.random() < 0.3 and lines:
        at = rng.randrange(len(lines))
        if "#" not in lines[at] and not lines[at].rstrip().endswith((":", "|", ">")):
            lines[at] += "  # kept"
    newline = "\r\n" if rng.random() < 0.15 else "\n"
    return newline.join(lines) + newline


def _pin(path: Path, repo: str) -> Outcome:
    out, err = io.StringIO(), io.StringIO()
    code = 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = PIN.main([str(path), repo, DIGEST])
        except SystemExit as exc:
            code = int(exc.code or 0)
        except Exception as exc:  # the edit promises an exit code, never a traceback
            code = 70
            err.write(f"Traceback: {type(exc).__name__}: {exc}")
    return Outcome(code, out.getvalue(), err.getvalue())


@_settings(250)
@given(seed=st.integers(min_value=0, max_value=2**32), leaf=HOSTILE,
       action=st.sampled_from(["replace", "remove", "add", "none"]),
       repo=st.sampled_from(["ghcr.io/o/t4serve", "[::1]:5000/t4serve", "127.0.0.1:5000/a/b/t4serve"]),
       raw=st.one_of(st.none(), st.binary(max_size=200), st.sampled_from([b"\xff\xfe", b"{", b"- a\n", b"a: [\n",
                                                                          b"images: *x\n", b"\t", b""])))  # fmt: skip
def test_any_kustomization_is_pinned_or_refused_and_left_whole(seed: int, leaf: Any, action: str, repo: str,
                                                               raw: bytes | None) -> None:
    tried("kustomization edits")
    rng = random.Random(seed)
    document: Any = KUSTOMIZATION
    if action != "none":
        path = rng.choice(leaves(KUSTOMIZATION))
        document = mutated(KUSTOMIZATION, path, action, leaf)
    try:
        body = raw if raw is not None else _as_yaml(document, rng).encode()
    except (yaml.YAMLError, RecursionError, ValueError):
        body = b"x: 1\n"
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "kustomization.yaml"
        path.write_bytes(body)
        began = time.monotonic()
        outcome = _pin(path, repo)
        record("kustomization edits", outcome, {0, 2}, seconds=time.monotonic() - began, deadline=10.0,
               label=f"seed {seed} {action} {_short(leaf)} raw {raw!r:.40}")  # fmt: skip
        assert sorted(p.name for p in Path(d).iterdir()) == ["kustomization.yaml"]
        if outcome.code != 0:
            assert path.read_bytes() == body, "a refused kustomization is left as it was"
            return
        after = yaml.safe_load(path.read_bytes())
        ours = [e for e in after["images"] if isinstance(e, dict) and e.get("name") == "t4serve"]
        assert ours == [{"name": "t4serve", "newName": repo, "digest": DIGEST}]
        before = yaml.safe_load(body) or {}
        assert {k: v for k, v in after.items() if k != "images"} == {k: v for k, v in before.items() if k != "images"}


# 9. tests/gpu/imagebox.py: any manifest, through receive, check and assemble


def _box(*args: str) -> Outcome:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = box.main(list(args))
        except SystemExit as exc:
            code = int(exc.code or 0)
        except Exception as exc:  # imagebox promises its own message and exit code, never a traceback
            code = 70
            err.write(f"Traceback: {type(exc).__name__}: {exc}")
    return Outcome(code, out.getvalue(), err.getvalue())


@pytest.fixture(scope="module")
def made_parts(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    return make_parts(tmp_path_factory.mktemp("imagebox"))


@pytest.mark.skipif(shutil.which("zstd") is None, reason="the zstd program makes the parts (.ci/run installs it)")
@_settings(150)
@given(seed=st.integers(min_value=0, max_value=2**32), leaf=HOSTILE,
       action=st.sampled_from(["replace", "remove", "add"]))  # fmt: skip
def test_any_manifest_is_refused_with_its_own_code(made_parts: tuple[Path, dict[str, Any]], seed: int, leaf: Any,
                                                   action: str) -> None:
    made, manifest = made_parts
    tried("imagebox manifests")
    path = random.Random(seed).choice(leaves(manifest))
    bad = mutated(manifest, path, action, leaf)
    with tempfile.TemporaryDirectory() as d:
        inbox, parts = Path(d) / "inbox", Path(d) / "parts"
        inbox.mkdir()
        try:
            text = json.dumps(bad)
        except (ValueError, RecursionError):
            text = "[" * 100_000
        (inbox / box.MANIFEST).write_text(text)
        shutil.copyfile(made / f"{box.PART_PREFIX}000", inbox / f"{box.PART_PREFIX}000")
        for args in (("receive", str(inbox), str(parts)), ("check", str(parts)),
                     ("assemble", str(parts), str(Path(d) / "rootfs"))):
            began = time.monotonic()
            outcome = _box(*args)
            record("imagebox manifests", outcome, {0, 2, 3, 4}, seconds=time.monotonic() - began, deadline=10.0,
                   label=f"{args[0]} {path} {action} {_short(leaf)}")  # fmt: skip
        written = parts / box.MANIFEST
        if written.exists():
            box.read_manifest(written)  # only a manifest that passes the reader is ever kept


# 8. One checkpoint, one setting: the same exit code from every command


TEXT_FIELDS = ("max_position_embeddings", "hidden_size", "num_hidden_layers", "num_attention_heads",
               "num_key_value_heads", "head_dim", "vocab_size", "sliding_window", "layer_types", "intermediate_size")


@pytest.fixture(scope="module")
def e2b_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_checkpoint(tmp_path_factory.mktemp("e2b44") / "c", "bf16")


@_settings(60)
@given(field=st.sampled_from(TEXT_FIELDS), leaf=HOSTILE)
def test_a_checkpoint_is_refused_alike_by_every_command(e2b_dir: Path, field: str, leaf: Any) -> None:
    from t4serve.probes.checkpoint import probe_model

    tried("one checkpoint, every command")
    config = e2b_config("bf16")
    config["text_config"][field] = leaf
    try:
        (e2b_dir / "config.json").write_text(json.dumps(config))
    except (ValueError, RecursionError):
        (e2b_dir / "config.json").write_text("[" * 100_000)
    with tempfile.TemporaryDirectory() as d:
        env = {**base_environ(Path(d)), "T4SERVE_MODEL": str(e2b_dir)}
        invalid = probe_model(str(e2b_dir), hf_home=env["HF_HOME"], offline=True).source == "invalid"
        for command, readable in ((["plan", "--gpu", "t4", "--json"], {0, 2}), (["profiles", "--gpu", "t4", "--json"],
                                  {0}), (["roofline"], {0}), (["preflight", "--json"], {0, 3})):  # fmt: skip
            began = time.monotonic()
            outcome = run_cli(command, env)
            record("one checkpoint, every command", outcome, {2} if invalid else readable,
                   seconds=time.monotonic() - began, deadline=30.0, label=f"{field}={_short(leaf)}: {command[0]}")
    (e2b_dir / "config.json").write_text(json.dumps(e2b_config("bf16")))


LONG_NAMES = ("T4SERVE_SERVED_MODEL_NAME", "T4SERVE_VLLM_ARGS", "T4SERVE_MODEL", "T4SERVE_HOST", "HF_HOME",
              "T4SERVE_API_KEY", "T4SERVE_KV_CACHE_MEMORY_BYTES", "T4SERVE_STATE_DIR")


@_settings(40)
@given(name=st.sampled_from(LONG_NAMES), size=st.integers(min_value=8193, max_value=300_000),
       fill=st.sampled_from(["x", "-", "a b ", "\u00e9"]))  # fmt: skip
def test_an_over_long_setting_is_refused_alike_by_every_command(name: str, size: int, fill: str) -> None:
    """The sentinel key is set beside every other setting, and is the over-long key's start."""
    tried("one checkpoint, every command")
    value = (fill * (size // len(fill) + 1))[:size]
    with tempfile.TemporaryDirectory() as d:
        env = {**base_environ(Path(d)), "T4SERVE_API_KEY": SENTINEL}
        env[name] = SENTINEL + value if name == "T4SERVE_API_KEY" else value
        for command in (["env"], ["plan", "--gpu", "t4", "--json"], ["profiles", "--gpu", "t4", "--json"]):
            outcome = run_cli(command, env)
            record("one checkpoint, every command", outcome, {2}, secrets=SECRETS,
                   label=f"{name} of {size:,} characters: {command[0]}")
            assert len(outcome.text) < 8000, (name, command, len(outcome.text))


def test_no_leftover_environment() -> None:
    """The suite ran its commands in-process with their own environments only."""
    assert "T4SERVE_VLLM_ARGS" not in os.environ and sys.modules.get("pin_kustomization") is None
