"""pipeline: facts files load or fail with exit 2, known GPUs replace the probed one, models re-probed on demand,
and gather_facts probes this machine for real."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from sample_facts import BF16_REPO, QAT_REPO, t4

from t4serve.config.settings import Settings
from t4serve.errors import ConfigError
from t4serve.facts import Facts
from t4serve.pipeline import (
    ensure_model,
    gather_facts,
    listen_ports,
    load_facts,
    prepare,
    with_known_gpu,
    write_paths,
)
from t4serve.planning.plan import plan
from t4serve.preflight import run_checks


def settings(**env: str) -> Settings:
    return Settings.from_environ({"HF_HOME": "/nonexistent-hf-home", "HF_HUB_OFFLINE": "1", **env})


def test_load_facts_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "t4.json"
    path.write_text(t4().to_json())
    assert load_facts(path) == t4()


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (None, "cannot read the facts file"),
        ("{not json", "is not a facts file"),
        ('{"schema": 1}', "is not a facts file of this t4serve version"),
        ("[]", "is not a facts file"),
    ],
)
def test_load_facts_errors_exit_2(tmp_path: Path, content: str | None, expected: str) -> None:
    path = tmp_path / "facts.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(ConfigError) as info:
        load_facts(path)
    assert info.value.exit_code == 2
    assert expected in info.value.message() and "t4serve probe --json" in info.value.message()


def test_with_known_gpu_replaces_the_device_and_keeps_the_driver() -> None:
    facts = with_known_gpu(t4(), "H100")
    (device,) = facts.gpu.devices
    assert device.uuid == "known:h100" and device.compute_capability == (9, 0)
    assert device.memory_free_bytes == device.memory_total_bytes
    assert facts.gpu.driver_version == t4().gpu.driver_version
    assert "known table" in facts.provenance
    with pytest.raises(ConfigError, match="not a known GPU"):
        with_known_gpu(t4(), "gtx1080")


def test_ensure_model_keeps_a_matching_model_and_reprobes_another() -> None:
    facts = t4()
    assert ensure_model(settings(), facts) is facts
    bf16 = ensure_model(settings(T4SERVE_MODEL="bf16"), facts)
    assert bf16.model is not None and bf16.model.requested == BF16_REPO
    missing = ensure_model(settings(), dataclasses.replace(facts, model=None))
    assert missing.model is not None and missing.model.requested == QAT_REPO


def test_prepare_is_plan_then_checks() -> None:
    s = settings()
    facts = ensure_model(s, t4())
    the_plan, findings = prepare(s, facts)
    assert the_plan == plan(s, facts)
    assert findings == run_checks(facts, the_plan, s)


def test_write_paths_and_ports() -> None:
    s = settings(T4SERVE_STATE_DIR="/run/t4", HF_HOME="/cache/huggingface", T4SERVE_TELEMETRY_PORT="0")
    env = {
        "TRITON_CACHE_DIR": "/cache/compile/triton",
        "VLLM_CACHE_ROOT": "/cache/compile/vllm",
        "TORCHINDUCTOR_CACHE_DIR": "/cache/compile/inductor",
        "TMPDIR": "/scratch",
    }
    assert write_paths(s, env) == {
        "hf_cache": "/cache/huggingface",
        "compile_cache": "/cache/compile/vllm",
        "triton_cache": "/cache/compile/triton",
        "inductor_cache": "/cache/compile/inductor",
        "tmp": "/scratch",
        "state": "/run/t4",
    }
    defaults = write_paths(s, {"HOME": "/home/u", "USER": "u"})
    assert defaults["compile_cache"] == "/home/u/.cache/vllm" and defaults["triton_cache"] == "/home/u/.triton/cache"
    assert defaults["inductor_cache"] == "/tmp/torchinductor_u" and defaults["tmp"] == "/tmp"
    assert listen_ports(s) == [("0.0.0.0", 8000)]
    assert listen_ports(settings()) == [("0.0.0.0", 8000), ("0.0.0.0", 9400)]


def test_gather_facts_probes_this_machine(tmp_path: Path) -> None:
    s = settings(T4SERVE_MANIFEST=str(tmp_path / "absent.json"), T4SERVE_STATE_DIR=str(tmp_path / "state"))
    facts = gather_facts(s, {"TMPDIR": str(tmp_path), "HOME": str(tmp_path)})
    assert isinstance(facts, Facts) and facts.provenance == "probed"
    assert facts.model is not None and facts.model.requested == QAT_REPO
    assert facts.manifest.present is False
    assert {d.role for d in facts.host.disks} == set(write_paths(s, {"HOME": str(tmp_path)}))
    assert facts.host.mem_total_bytes > 0
    assert Facts.from_json(facts.to_json()) == facts
    assert facts.vllm_env == {}


def test_vllms_long_max_model_len_switch_is_recorded_and_replayed(tmp_path: Path) -> None:
    """VLLM_ALLOW_LONG_MAX_MODEL_LEN in the server's environment lets vLLM take a max_model_len above the model's
    maximum: the probe records it, so a replayed machine plans alike, and the plan accepts such a length only then."""
    s = settings(T4SERVE_MANIFEST=str(tmp_path / "absent.json"), T4SERVE_STATE_DIR=str(tmp_path / "state"))
    env = {"TMPDIR": str(tmp_path), "HOME": str(tmp_path), "VLLM_ALLOW_LONG_MAX_MODEL_LEN": "True "}
    facts = gather_facts(s, env)
    assert facts.vllm_env == {"VLLM_ALLOW_LONG_MAX_MODEL_LEN": "True "}
    replayed = Facts.from_json(facts.to_json())
    assert replayed.vllm_env == facts.vllm_env
    long = settings(T4SERVE_MAX_MODEL_LEN="262144", T4SERVE_KV_CACHE_MEMORY_BYTES="40GiB")
    on_h200 = with_known_gpu(replayed, "h200")
    assert plan(long, ensure_model(long, on_h200)).sizing is not None
    refused = plan(long, ensure_model(long, dataclasses.replace(on_h200, vllm_env={})))
    assert refused.sizing is None and refused.sizing_error is not None
    assert "VLLM_ALLOW_LONG_MAX_MODEL_LEN=1" in refused.sizing_error
