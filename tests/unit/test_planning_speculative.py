"""T4SERVE_SPECULATIVE: the settings, the drafter chosen and probed, the `--speculative-config` the plan passes and
what the drafter adds to the plan's memory (tests/image/test_speculative_oracle.py checks the figures against vLLM
0.34's own planner and the drafter's bytes against what it allocates)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from e2b_checkpoint import ASSISTANT_CONFIG, assistant_tensors, write_assistant_checkpoint, write_checkpoint
from family_checkpoints import write_family
from sample_facts import t4

from t4serve.config.aliases import E2B_ASSISTANT_REPO
from t4serve.config.settings import Settings
from t4serve.errors import ConfigError
from t4serve.facts import Facts
from t4serve.pipeline import ensure_model, load_facts, prepare, with_known_gpu
from t4serve.planning.plan import Plan, plan
from t4serve.planning.profiles import profiles, summary
from t4serve.planning.speculative import drafter_rotary
from t4serve.preflight import disk_needs
from t4serve.probes.checkpoint import ROLE_DRAFTER, probe_model
from t4serve.probes.drafter import choose_drafter
from t4serve.serde import to_dict

# google/gemma-4-E2B-it-assistant's safetensors bytes (tests/unit/e2b_checkpoint.py: its tensors as transformers saves
# them); vLLM holds them in float16 on a T4, so as many bytes on the card (tests/image/test_speculative_oracle.py
# finds vLLM 0.34 allocating 98 B more: an attention layer's scales and a scalar no checkpoint holds).
ASSISTANT_BYTES = 157_559_816


def settings(**env: str) -> Settings:
    return Settings.from_environ({"HF_HOME": "/nonexistent-hf-home", **env})


def plan_for(facts: Facts, **env: str) -> Plan:
    s = settings(**env)
    return plan(s, ensure_model(s, facts))


def spec_config(p: Plan) -> dict[str, Any]:
    argv = list(p.argv)
    return dict(json.loads(argv[argv.index("--speculative-config") + 1]))


def test_assistant_bytes_are_its_tensors() -> None:
    element = {"BF16": 2, "I64": 8}
    assert sum(element[dtype] * math.prod(shape) for _name, dtype, shape in assistant_tensors()) == ASSISTANT_BYTES


def test_settings_default_off_and_parse() -> None:
    s = settings()
    assert (s.speculative, s.draft_model, s.num_speculative_tokens) == ("off", None, 2)
    s = settings(T4SERVE_SPECULATIVE="MTP", T4SERVE_DRAFT_MODEL="e2b-assistant", T4SERVE_NUM_SPECULATIVE_TOKENS="3")
    assert s.speculative == "mtp" and s.num_speculative_tokens == 3
    assert s.draft_model is not None and s.draft_model.target == E2B_ASSISTANT_REPO
    with pytest.raises(ConfigError, match="must be one of off, mtp, ngram"):
        settings(T4SERVE_SPECULATIVE="eagle3")
    with pytest.raises(ConfigError, match="T4SERVE_NUM_SPECULATIVE_TOKENS=0"):
        settings(T4SERVE_SPECULATIVE="mtp", T4SERVE_NUM_SPECULATIVE_TOKENS="0")


@pytest.mark.parametrize(("env", "words"), [
    ({"T4SERVE_DRAFT_MODEL": "e2b-assistant"}, "only `mtp` drafts with a draft model"),
    ({"T4SERVE_SPECULATIVE": "ngram", "T4SERVE_DRAFT_MODEL": "org/drafter"}, "only `mtp` drafts with a draft model"),
    ({"T4SERVE_NUM_SPECULATIVE_TOKENS": "3"}, "nothing drafts tokens"),
])
def test_a_setting_that_would_change_nothing_is_refused(env: dict[str, str], words: str) -> None:
    with pytest.raises(ConfigError, match=words) as exc:
        settings(**env)
    assert exc.value.fix is not None and "T4SERVE_SPECULATIVE=mtp" in exc.value.fix


@pytest.mark.parametrize(("args", "variable"), [
    ("--speculative-config '{\"method\": \"ngram_gpu\", \"num_speculative_tokens\": 3}'", "T4SERVE_SPECULATIVE"),
    ("-sc '{\"method\": \"mtp\"}'", "T4SERVE_SPECULATIVE"),
    ("--speculative-config.method=ngram", "T4SERVE_SPECULATIVE"),
    ("--speculative_config.num_speculative_tokens 3", "T4SERVE_SPECULATIVE"),
    ("--spec-method ngram_gpu", "T4SERVE_SPECULATIVE"),
    ("--spec-model org/draft", "T4SERVE_DRAFT_MODEL"),
    ("--spec-tokens 3", "T4SERVE_NUM_SPECULATIVE_TOKENS"),
])
def test_speculative_flags_in_vllm_args_are_refused_with_the_variable(args: str, variable: str) -> None:
    with pytest.raises(ConfigError) as exc:
        settings(T4SERVE_VLLM_ARGS=args)
    assert f"use {variable} instead" in str(exc.value)
    assert exc.value.fix is not None and f"set {variable} instead" in exc.value.fix


def test_the_published_checkpoints_draft_with_e2bs_assistant() -> None:
    for alias in ("qat", "bf16"):
        s = settings(T4SERVE_MODEL=alias, T4SERVE_SPECULATIVE="mtp")
        facts = ensure_model(s, t4())
        assert choose_drafter(s, facts.model).target == E2B_ASSISTANT_REPO
        assert facts.drafter is not None and facts.drafter.source == "builtin"
        assert facts.drafter.weight_bytes == ASSISTANT_BYTES


def test_a_local_e2b_is_known_by_its_config(tmp_path: Path) -> None:
    model = write_checkpoint(tmp_path / "my-e2b", kind="qat")
    p = plan_for(t4(), T4SERVE_MODEL=str(model), T4SERVE_SPECULATIVE="mtp")
    assert p.sizing is not None, p.sizing_error
    assert spec_config(p) == {"method": "mtp", "model": E2B_ASSISTANT_REPO, "num_speculative_tokens": 2}
    assert "Gemma 4 E2B's architecture" in p.speculative


def test_a_model_without_a_drafter_is_refused_by_name(tmp_path: Path) -> None:
    qwen = write_family(tmp_path / "qwen3", "qwen3")
    p = plan_for(t4(), T4SERVE_MODEL=str(qwen), T4SERVE_SPECULATIVE="mtp")
    assert p.sizing is None and p.sizing_error is not None
    assert f"{qwen} has no drafter" in p.sizing_error and "T4SERVE_DRAFT_MODEL" in p.sizing_error
    assert "--speculative-config" not in p.argv
    # Its own drafter named, it is still not a Gemma 4 model the assistant drafts for.
    drafter = write_assistant_checkpoint(tmp_path / "assistant")
    p = plan_for(t4(), T4SERVE_MODEL=str(qwen), T4SERVE_SPECULATIVE="mtp", T4SERVE_DRAFT_MODEL=str(drafter))
    assert p.sizing is None and p.sizing_error is not None and "drafts for Gemma 4 models only" in p.sizing_error
    # ngram needs no drafter.
    assert plan_for(t4(), T4SERVE_MODEL=str(qwen), T4SERVE_SPECULATIVE="ngram").sizing is not None


def test_mtp_plan_passes_the_drafter_and_sizes_it() -> None:
    plain = plan_for(t4(), T4SERVE_MODEL="qat")
    mtp = plan_for(t4(), T4SERVE_MODEL="qat", T4SERVE_SPECULATIVE="mtp")
    assert plain.sizing is not None and mtp.sizing is not None, mtp.sizing_error
    assert spec_config(mtp) == {"method": "mtp", "model": E2B_ASSISTANT_REPO, "num_speculative_tokens": 2}
    assert "--speculative-config" not in plain.argv
    # vLLM's "Model loading" counts the drafter's weights; its rotary caches are the target's.
    assert mtp.sizing.gpu_weights_bytes.value - plain.sizing.gpu_weights_bytes.value == ASSISTANT_BYTES
    # The pool loses the drafter's weights and activations; the KV layout is the target's.
    lost = plain.sizing.kv_pool_bytes.value - mtp.sizing.kv_pool_bytes.value
    assert ASSISTANT_BYTES < lost < ASSISTANT_BYTES + 80 * 2**20 + 98_304
    assert "drafter" in mtp.sizing.kv_pool_bytes.how
    assert mtp.sizing.concurrency.how.split(" / ", 1)[1] == plain.sizing.concurrency.how.split(" / ", 1)[1]
    assert mtp.sizing.host_memory_need_bytes.value > plain.sizing.host_memory_need_bytes.value
    assert "the drafter's 0.158" in mtp.sizing.host_memory_need_bytes.how
    assert any("owns none" in n for n in mtp.sizing.notes)
    assert "speculative:       mtp: google/gemma-4-E2B-it-assistant" in mtp.summary()


def test_a_local_drafter_is_passed_by_its_directory_and_its_tokens_per_step(tmp_path: Path) -> None:
    drafter = write_assistant_checkpoint(tmp_path / "assistant")
    p = plan_for(t4(), T4SERVE_MODEL="bf16", T4SERVE_SPECULATIVE="mtp", T4SERVE_DRAFT_MODEL=str(drafter),
                 T4SERVE_NUM_SPECULATIVE_TOKENS="4")
    assert p.sizing is not None, p.sizing_error
    assert spec_config(p) == {"method": "mtp", "model": str(drafter), "num_speculative_tokens": 4}
    assert "T4SERVE_DRAFT_MODEL" in p.speculative


def test_ngram_is_vllms_ngram_gpu_sized_as_the_model_alone() -> None:
    plain = plan_for(with_known_gpu(t4(), "l4"), T4SERVE_MODEL="qat")
    ngram = plan_for(with_known_gpu(t4(), "l4"), T4SERVE_MODEL="qat", T4SERVE_SPECULATIVE="ngram",
                     T4SERVE_NUM_SPECULATIVE_TOKENS="3")
    assert plain.sizing is not None and ngram.sizing is not None
    assert spec_config(ngram) == {"method": "ngram_gpu", "num_speculative_tokens": 3}
    assert ngram.sizing.kv_tokens.value == plain.sizing.kv_tokens.value
    assert ngram.sizing.gpu_weights_bytes.value == plain.sizing.gpu_weights_bytes.value


def test_an_assistant_is_no_model_to_serve_and_only_an_assistant_drafts(tmp_path: Path) -> None:
    drafter = write_assistant_checkpoint(tmp_path / "assistant")
    served = probe_model(str(drafter), hf_home=str(tmp_path), offline=True)
    assert served.source == "invalid" and served.error is not None
    assert "not a model to serve" in served.error and "T4SERVE_DRAFT_MODEL" in served.error
    as_drafter = probe_model(str(drafter), hf_home=str(tmp_path), offline=True, role=ROLE_DRAFTER)
    assert as_drafter.source == "local-dir", as_drafter.error
    # vLLM sets num_kv_shared_layers to 0 for the assistant: its speculator shares the target's cache instead.
    assert as_drafter.config["text"]["num_kv_shared_layers"] == 0
    assert as_drafter.config["backbone_hidden_size"] == 1536
    assert probe_model(E2B_ASSISTANT_REPO, hf_home=str(tmp_path), offline=True).source == "invalid"
    model = write_checkpoint(tmp_path / "e2b", kind="bf16")
    p = plan_for(t4(), T4SERVE_MODEL="bf16", T4SERVE_SPECULATIVE="mtp", T4SERVE_DRAFT_MODEL=str(model))
    assert p.sizing is None and p.sizing_error is not None and "is not a drafter t4serve sizes" in p.sizing_error


def test_a_drafter_for_another_width_is_refused(tmp_path: Path) -> None:
    config = json.loads(json.dumps(ASSISTANT_CONFIG))
    config["backbone_hidden_size"] = 2560
    drafter = write_assistant_checkpoint(tmp_path / "e4b-assistant", config=config)
    p = plan_for(t4(), T4SERVE_MODEL="qat", T4SERVE_SPECULATIVE="mtp", T4SERVE_DRAFT_MODEL=str(drafter))
    assert p.sizing is None and p.sizing_error is not None
    assert "made for a model 2560 wide" in p.sizing_error and "hidden size 1536" in p.sizing_error


def test_rotary_caches_are_shared_only_with_the_same_parameters_in_the_same_order() -> None:
    target = ensure_model(settings(T4SERVE_MODEL="bf16"), t4()).model
    assert target is not None
    text = json.loads(json.dumps(ASSISTANT_CONFIG["text_config"]))
    text["num_kv_shared_layers"] = 0
    assert drafter_rotary(target.config["text"], text, 16384, 2)[0] == 0
    # Listed in another order, vLLM's get_rope keys differ: the drafter gets caches of its own, per attention type.
    text["rope_parameters"] = {kind: dict(reversed(list(params.items())))
                               for kind, params in text["rope_parameters"].items()}
    assert drafter_rotary(target.config["text"], text, 16384, 2)[0] == 131072 * (256 + 512) * 2
    # A shorter drafter maximum is raised to the target's max_model_len (vLLM's cache-only rope types).
    text["max_position_embeddings"] = 4096
    assert drafter_rotary(target.config["text"], text, 16384, 2)[0] == 16384 * (256 + 512) * 2


def test_facts_record_the_drafter_and_replay_it(tmp_path: Path) -> None:
    s = settings(T4SERVE_MODEL="qat", T4SERVE_SPECULATIVE="mtp")
    facts = ensure_model(s, t4())
    (tmp_path / "facts.json").write_text(json.dumps(to_dict(facts)))
    replayed = load_facts(tmp_path / "facts.json")
    assert replayed.drafter == facts.drafter
    assert plan(s, replayed).argv == plan(s, facts).argv
    # Without the drafter recorded, a replayed plan says so rather than sizing without it.
    bare = json.loads((tmp_path / "facts.json").read_text())
    bare["drafter"] = None
    (tmp_path / "bare.json").write_text(json.dumps(bare))
    p = plan(s, load_facts(tmp_path / "bare.json"))
    assert p.sizing is None and p.sizing_error is not None and "was not probed" in p.sizing_error
    # Off, the drafter is not probed at all.
    assert ensure_model(settings(T4SERVE_MODEL="qat"), facts).drafter is None


def test_preflight_checks_the_drafter_its_download_and_its_host_memory(tmp_path: Path) -> None:
    s = settings(T4SERVE_MODEL="qat", T4SERVE_SPECULATIVE="mtp")
    the_plan, findings = prepare(s, ensure_model(s, t4()))
    drafter = [f for f in findings if f.check == "drafter"]
    assert len(drafter) == 1 and drafter[0].level == "warn" and E2B_ASSISTANT_REPO in drafter[0].found
    assert "HF_TOKEN" in drafter[0].fix
    memory = next(f for f in findings if f.check == "host-memory")
    assert f"and its drafter {E2B_ASSISTANT_REPO}" in memory.required
    assert "drafter 150.261 MiB to download" in disk_needs(ensure_model(s, t4()), the_plan)["hf_cache"][1]
    offline = settings(T4SERVE_MODEL="qat", T4SERVE_SPECULATIVE="mtp", HF_HUB_OFFLINE="1")
    _plan, findings = prepare(offline, ensure_model(offline, t4()))
    assert next(f for f in findings if f.check == "drafter").level == "fail"
    # Off: no drafter finding at all.
    _plan, findings = prepare(settings(T4SERVE_MODEL="qat"), ensure_model(settings(T4SERVE_MODEL="qat"), t4()))
    assert not [f for f in findings if f.check == "drafter"]
    # A drafter that cannot be read fails, naming it.
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text("{")
    s = settings(T4SERVE_MODEL="qat", T4SERVE_SPECULATIVE="mtp", T4SERVE_DRAFT_MODEL=str(broken))
    _plan, findings = prepare(s, ensure_model(s, t4()))
    found = next(f for f in findings if f.check == "drafter")
    assert found.level == "fail" and str(broken) in found.found


def test_profiles_show_the_speculative_setting() -> None:
    s = settings(T4SERVE_MODEL="qat", T4SERVE_SPECULATIVE="mtp")
    rows = profiles([(s, ensure_model(s, t4()))])
    assert {r.speculative.split(":")[0] for r in rows} == {"mtp"}
    text = summary(rows, "Tesla T4")
    assert "speculative decoding mtp: google/gemma-4-E2B-it-assistant" in text
    plain = profiles([(settings(T4SERVE_MODEL="qat"), ensure_model(settings(T4SERVE_MODEL="qat"), t4()))])
    runnable = [(a, b) for a, b in zip(rows, plain, strict=True) if a.runnable and b.runnable]
    assert runnable and all(a.gpu_weights_bytes == b.gpu_weights_bytes + ASSISTANT_BYTES for a, b in runnable)
