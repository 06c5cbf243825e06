"""plan(): the argv, dtype, clamp decision and sizing for recorded and known machines; pure and secret-free."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from sample_facts import QAT_REPO, no_gpu, t4, with_gpu

from t4serve.config.settings import Settings
from t4serve.facts import Facts
from t4serve.pipeline import ensure_model, with_known_gpu
from t4serve.planning.derived import Derived
from t4serve.planning.plan import Plan, choose_dtype, clamp_decision, head_sizes, plan

TOKEN = "hf_planTOKEN42"


def settings(**env: str) -> Settings:
    return Settings.from_environ({"HF_HOME": "/nonexistent-hf-home", "HF_TOKEN": TOKEN, **env})


def plan_for(facts: Facts, **env: str) -> Plan:
    s = settings(**env)
    return plan(s, ensure_model(s, facts))


def flag(argv: tuple[str, ...], name: str) -> str | None:
    return argv[argv.index(name) + 1] if name in argv else None


def test_t4_qat_argv() -> None:
    p = plan_for(t4())
    argv = p.argv
    assert argv[:3] == ("vllm", "serve", QAT_REPO)
    assert flag(argv, "--host") == "0.0.0.0" and flag(argv, "--port") == "8000"
    assert flag(argv, "--served-model-name") == QAT_REPO
    assert flag(argv, "--dtype") == "float16"
    assert flag(argv, "--kv-cache-dtype") == "auto"
    assert flag(argv, "--tensor-parallel-size") == "1"
    assert flag(argv, "--gpu-memory-utilization") == "0.9"
    assert flag(argv, "--shutdown-timeout") == "30"
    assert p.sizing is not None and p.sizing_error is None
    assert flag(argv, "--max-model-len") == str(int(p.sizing.max_model_len.value))
    assert flag(argv, "--max-num-seqs") == str(int(p.sizing.max_num_seqs.value))
    if p.sizing.kv_cache_memory_bytes is not None:
        assert flag(argv, "--kv-cache-memory-bytes") == str(int(p.sizing.kv_cache_memory_bytes.value))
    # vLLM's Triton backend on Turing's tensor cores (t4serve.turing); the block size the figures are for is pinned.
    assert flag(argv, "--attention-backend") == "TRITON_ATTN" and p.attention.path == "turing-mma"
    assert p.env["T4SERVE_ATTENTION"] == "turing-mma"
    assert flag(argv, "--block-size") == "16" and p.sizing.block_size == 16
    assert "capability 7.5 < 8.0" in p.dtype_reason


def test_the_token_never_reaches_argv_env_json_or_summary() -> None:
    p = plan_for(t4())
    for text in (" ".join(p.argv), json.dumps(p.env), p.to_json(), p.summary(), repr(p)):
        assert TOKEN not in text
    assert "HF_TOKEN" not in p.env


def test_settings_pass_through_and_user_flags_come_last() -> None:
    p = plan_for(
        t4(),
        T4SERVE_MAX_MODEL_LEN="8192",
        T4SERVE_MAX_NUM_SEQS="4",
        T4SERVE_PORT="8080",
        T4SERVE_SERVED_MODEL_NAME="gemma",
        T4SERVE_GPU_MEMORY_UTILIZATION="0.85",
        T4SERVE_SHUTDOWN_TIMEOUT="5",
        T4SERVE_VLLM_ARGS="--enforce-eager --enable-prefix-caching",
    )
    argv = p.argv
    assert flag(argv, "--max-model-len") == "8192" and flag(argv, "--max-num-seqs") == "4"
    assert flag(argv, "--port") == "8080" and flag(argv, "--served-model-name") == "gemma"
    assert flag(argv, "--gpu-memory-utilization") == "0.85" and flag(argv, "--shutdown-timeout") == "5"
    assert argv[-2:] == ("--enforce-eager", "--enable-prefix-caching")


def test_kv_cache_memory_bytes_setting_reaches_argv() -> None:
    p = plan_for(t4(), T4SERVE_KV_CACHE_MEMORY_BYTES="2GiB")
    assert flag(p.argv, "--kv-cache-memory-bytes") == str(2 * 2**30)


def test_explicit_dtype_is_kept_for_preflight_to_judge() -> None:
    p = plan_for(t4(), T4SERVE_DTYPE="bfloat16")
    assert flag(p.argv, "--dtype") == "bfloat16" and p.dtype_reason == "set by T4SERVE_DTYPE"


def test_ampere_uses_the_checkpoints_dtype_and_needs_no_clamp() -> None:
    p = plan_for(with_known_gpu(t4(), "a10g"))
    assert flag(p.argv, "--dtype") == "bfloat16" and "checkpoint" in p.dtype_reason
    assert p.clamp_needed is False
    assert p.gpu_origin == "known:a10g"


def test_clamp_needed_on_t4_for_gemma4_heads() -> None:
    p = plan_for(t4())
    assert head_sizes(t4().model) == [256, 512]
    assert p.clamp_needed is True
    assert "98,304" in p.clamp_reason and "65,536" in p.clamp_reason
    assert plan_for(with_known_gpu(t4(), "h100")).clamp_needed is False


def test_clamp_not_needed_for_a_model_with_narrow_heads() -> None:
    model = t4().model
    assert model is not None
    narrow = dataclasses.replace(model, config={"text": {"head_dim": 128}})
    needed, reason = clamp_decision(t4().gpu.devices[0], narrow)
    assert needed is False and "pads to 128" in reason
    # Unknown heads: judged as Gemma 4's widest, so a T4 is not waved through.
    needed, reason = clamp_decision(t4().gpu.devices[0], dataclasses.replace(model, config={}))
    assert needed is True and "assumed 512" in reason


def test_no_gpu_plan_omits_sizing_and_says_how_to_plan_anyway() -> None:
    p = plan_for(no_gpu())
    assert p.gpu is None and p.sizing is None
    assert p.sizing_error is not None and "--gpu t4" in p.sizing_error
    assert "--max-model-len" not in p.argv and flag(p.argv, "--dtype") == "auto"
    assert "--max-model-len" in plan_for(no_gpu(), T4SERVE_MAX_MODEL_LEN="4096").argv


def test_local_checkpoint_is_served_from_its_directory(tmp_path: Path) -> None:
    facts = t4()
    assert facts.model is not None
    local = dataclasses.replace(facts.model, source="local-dir", local_path=str(tmp_path))
    p = plan(settings(), dataclasses.replace(facts, model=local))
    assert p.argv[2] == str(tmp_path) and p.model_source == "local-dir"


def test_summary_shows_each_derived_number_with_its_arithmetic() -> None:
    p = plan_for(t4())
    text = p.summary()
    assert p.sizing is not None
    derived = [v for v in vars(p.sizing).values() if isinstance(v, Derived)]
    assert derived
    for value in derived:
        assert value.how in text
    assert p.command_line() in text and p.dtype_reason in text and p.clamp_reason in text


def test_json_is_complete_and_plan_is_pure() -> None:
    facts = ensure_model(settings(), t4())
    first, second = plan(settings(), facts), plan(settings(), facts)
    assert first == second
    data = json.loads(first.to_json())
    assert data["argv"] == list(first.argv) and data["command_line"] == first.command_line()
    assert data["sizing"]["max_model_len"]["how"]


def test_more_than_one_gpu_is_noted() -> None:
    facts = t4()
    two = dataclasses.replace(facts, gpu=dataclasses.replace(facts.gpu, devices=facts.gpu.devices * 2))
    assert any("2 GPUs visible" in n for n in plan_for(two).notes)
    assert not any("GPUs visible" in n for n in plan_for(with_gpu(t4())).notes)


def test_kv_cache_profile_leaves_the_pool_to_vllm_and_keeps_the_prediction() -> None:
    auto = plan_for(t4())
    p = plan_for(t4(), T4SERVE_KV_CACHE_MEMORY_BYTES="profile")
    assert "--kv-cache-memory-bytes" in auto.argv and "--kv-cache-memory-bytes" not in p.argv
    assert flag(p.argv, "--gpu-memory-utilization") == "0.9"
    assert p.sizing is not None and p.sizing.kv_cache_memory_bytes is None
    # The same prediction, shown as one: seqs and length are still chosen from it.
    assert auto.sizing is not None
    assert p.sizing.max_num_seqs.value == auto.sizing.max_num_seqs.value
    assert "vLLM profiles" in p.sizing.kv_pool_bytes.how
    assert any("profile" in n and "the measuring run can reach the card's limit" in n for n in p.sizing.notes)


def h200() -> Facts:
    """The H200 recorded by `t4serve probe --json` on the GPU host (docs/verified/h200-probe.json)."""
    path = Path(__file__).resolve().parents[2] / "docs" / "verified" / "h200-probe.json"
    return Facts.from_json(path.read_text())


def test_size_as_t4_on_an_h200_gives_the_t4_plan_with_vllms_budget_scaled() -> None:
    on_t4 = plan_for(t4(), T4SERVE_MODEL="bf16")
    on_h200 = plan_for(h200(), T4SERVE_MODEL="bf16", T4SERVE_SIZE_AS="t4")
    real = h200().gpu.devices[0]
    for name in ("--dtype", "--max-model-len", "--max-num-seqs", "--max-num-batched-tokens", "--kv-cache-memory-bytes"):
        assert flag(on_h200.argv, name) == flag(on_t4.argv, name), name
    # vLLM's budget: utilization x the real card's memory = 0.9 x the T4's 15,360 MiB, never more.
    utilization = float(flag(on_h200.argv, "--gpu-memory-utilization") or 0)
    t4_budget = 0.9 * 15360 * 1024**2
    assert utilization * real.memory_total_bytes <= t4_budget
    assert utilization * real.memory_total_bytes > t4_budget - real.memory_total_bytes * 1e-6
    assert on_h200.sized_as == "t4" and on_h200.gpu is not None
    assert on_h200.gpu.compute_capability == (7, 5) and on_h200.gpu.memory_total_bytes == 15360 * 1024**2
    assert on_h200.gpu.shared_memory_per_block == 65_536 and on_h200.clamp_needed
    assert on_h200.env["T4SERVE_SHARED_MEMORY_PER_BLOCK"] == "65536"
    assert flag(on_h200.argv, "--attention-backend") == "TRITON_ATTN"
    assert "sized as Tesla T4" in on_h200.gpu.name and "T4SERVE_SIZE_AS=t4" in on_h200.summary()
    # The unsized H200 plan is the H200's own: bigger batches, bf16, no clamp, vLLM picks the backend.
    plain = plan_for(h200(), T4SERVE_MODEL="bf16")
    assert flag(plain.argv, "--max-num-batched-tokens") == "8192" and flag(plain.argv, "--dtype") == "bfloat16"
    assert "T4SERVE_SHARED_MEMORY_PER_BLOCK" not in plain.env and "--attention-backend" not in plain.argv


def test_size_as_t4_takes_the_t4s_attention_path() -> None:
    p = plan_for(h200(), T4SERVE_SIZE_AS="t4")
    assert p.argv.count("--attention-backend") == 1 and p.attention.path == "turing-mma"
    assert p.env["T4SERVE_ATTENTION"] == "turing-mma"


def test_max_num_batched_tokens_is_owned_by_the_plan_and_moves_its_kv_figures() -> None:
    default = plan_for(t4(), T4SERVE_MODEL="bf16")
    assert flag(default.argv, "--max-num-batched-tokens") == "2048"
    bigger = plan_for(t4(), T4SERVE_MODEL="bf16", T4SERVE_MAX_NUM_BATCHED_TOKENS="8192")
    assert flag(bigger.argv, "--max-num-batched-tokens") == "8192"
    assert default.sizing is not None and bigger.sizing is not None
    # Sliding-window groups hold 2 x batched tokens in flight: more per request, fewer tokens from the pool.
    assert bigger.sizing.kv_tokens.value < default.sizing.kv_tokens.value
    assert bigger.sizing.max_num_batched_tokens.source == "setting"


def test_sized_settings_give_another_checkpoint_the_reference_flags() -> None:
    """What bench gives every model after the first: set as settings, the second checkpoint's plan passes the first
    one's sized flags, so the two servers differ only in the checkpoint."""
    from t4serve.planning.plan import sized_settings, without_option

    reference = plan_for(t4(), T4SERVE_MODEL="qat")
    pinned = sized_settings(reference)
    assert set(pinned) == {"T4SERVE_DTYPE", "T4SERVE_MAX_MODEL_LEN", "T4SERVE_MAX_NUM_SEQS",
                           "T4SERVE_MAX_NUM_BATCHED_TOKENS", "T4SERVE_KV_CACHE_MEMORY_BYTES"}  # fmt: skip
    own = plan_for(t4(), T4SERVE_MODEL="bf16")
    pinned_bf16 = plan_for(t4(), T4SERVE_MODEL="bf16", **pinned)

    def flags(p: Plan) -> tuple[str, ...]:
        return without_option(p.argv[3:], "--served-model-name")

    assert flags(own) != flags(reference)  # bf16's own plan sizes a smaller pool on a T4
    assert flags(pinned_bf16) == flags(reference)
    assert pinned_bf16.argv[2] == "google/gemma-4-E2B-it" and pinned_bf16.served_model_name == "google/gemma-4-E2B-it"
    # Where sizing could not run, only a chosen dtype is pinned: the settings themselves are shared.
    assert sized_settings(plan_for(no_gpu(), T4SERVE_MODEL="qat")) == {}
    assert sized_settings(plan_for(no_gpu(), T4SERVE_MODEL="qat", T4SERVE_DTYPE="float16")) == {
        "T4SERVE_DTYPE": "float16"}


def test_without_option_drops_both_spellings() -> None:
    from t4serve.planning.plan import without_option

    argv = ["--a", "1", "--served-model-name", "x", "--b", "--served-model-name=y", "--served-model-names", "z"]
    assert without_option(argv, "--served-model-name") == ("--a", "1", "--b", "--served-model-names", "z")


def test_an_a100_keeps_vllms_small_batch_defaults_by_its_name() -> None:
    """vLLM keeps an 80 GiB A100 at 2048 batched tokens and 256 seqs (its name check); 8192 would hold 4 x 8192
    tokens in flight per sliding group and give up KV capacity vLLM itself would have kept."""
    a100 = plan_for(with_known_gpu(t4(), "a100"), T4SERVE_MODEL="bf16")
    assert flag(a100.argv, "--max-num-batched-tokens") == "2048"
    assert a100.sizing is not None and "A100" in a100.sizing.max_num_batched_tokens.how
    assert int(a100.sizing.max_num_seqs.value) <= 256 and "256" in a100.sizing.max_num_seqs.how
    forced = plan_for(with_known_gpu(t4(), "a100"), T4SERVE_MODEL="bf16", T4SERVE_MAX_NUM_BATCHED_TOKENS="8192")
    assert forced.sizing is not None and forced.sizing.kv_tokens.value < a100.sizing.kv_tokens.value


def test_an_h100_gets_vllms_large_defaults_and_its_seqs_cap() -> None:
    h100 = plan_for(with_known_gpu(t4(), "h100"), T4SERVE_MODEL="qat", T4SERVE_MAX_MODEL_LEN="1024")
    assert h100.sizing is not None
    assert flag(h100.argv, "--max-num-batched-tokens") == "8192"
    # 1024-token requests: the pool holds thousands, vLLM's default caps at 1024 on this tier.
    assert flag(h100.argv, "--max-num-seqs") == "1024"
    assert "1024" in h100.sizing.max_num_seqs.how


def test_max_num_seqs_never_exceeds_the_batched_tokens() -> None:
    p = plan_for(with_known_gpu(t4(), "h100"), T4SERVE_MODEL="qat", T4SERVE_MAX_MODEL_LEN="1024",
                 T4SERVE_MAX_NUM_BATCHED_TOKENS="512")
    assert flag(p.argv, "--max-num-seqs") == "512"
    assert p.sizing is not None and "max_num_batched_tokens 512" in p.sizing.max_num_seqs.how


def with_config(facts: Facts, **config: object) -> Facts:
    """`facts` whose model's config.json says `config` at the top level (the text config and weights kept)."""
    assert facts.model is not None
    return dataclasses.replace(facts, model=dataclasses.replace(facts.model, config={**facts.model.config, **config}))


def test_auto_dtype_is_vllms_own_choice() -> None:
    """vLLM's `_resolve_auto_dtype`: the checkpoint's dtype where the card runs it; a float32 checkpoint runs in the
    card's first dtype; float16 never for the model types vLLM refuses it for (Gemma 2 and 3, GLM-4)."""
    s = settings(T4SERVE_MODEL="bf16")
    base = ensure_model(s, t4())
    gemma3 = with_config(base, model_type="gemma3")
    dtype, why = choose_dtype(s, gemma3.gpu.devices[0], gemma3.model)
    assert dtype == "float32" and "does not support float16" in why and "twice the memory" in why
    a10g = with_known_gpu(gemma3, "a10g")
    assert choose_dtype(s, a10g.gpu.devices[0], a10g.model)[0] == "bfloat16"
    fp32 = with_known_gpu(with_config(base, torch_dtype="float32"), "a10g")
    assert choose_dtype(s, fp32.gpu.devices[0], fp32.model) == (
        "bfloat16", "auto: a float32 checkpoint runs in bfloat16, vLLM's first dtype on capability 8.6")
    on_t4 = with_config(base, torch_dtype="float32")
    assert choose_dtype(s, on_t4.gpu.devices[0], on_t4.model)[0] == "float16"
    # No dtype in config.json: the weights' floating dtype, as vLLM reads it from the safetensors headers.
    assert base.model is not None
    untyped = dataclasses.replace(base.model, config={k: v for k, v in base.model.config.items()
                                                      if k not in ("torch_dtype", "dtype")})
    assert choose_dtype(s, a10g.gpu.devices[0], untyped)[0] == "bfloat16"


def test_a_gemma3_plan_on_a_t4_is_float32_and_sized_so() -> None:
    s = settings(T4SERVE_MODEL="bf16", T4SERVE_MAX_MODEL_LEN="1024", T4SERVE_MAX_NUM_SEQS="1",
                 T4SERVE_GPU_MEMORY_UTILIZATION="1.0")
    facts = with_known_gpu(with_config(ensure_model(s, t4()), model_type="gemma3"), "h200")
    p = plan(s, facts)
    assert flag(p.argv, "--dtype") == "bfloat16"
    on_t4 = plan(s, with_config(ensure_model(s, t4()), model_type="gemma3"))
    assert flag(on_t4.argv, "--dtype") == "float32"
    # E2B's 10 GB of bf16 weights do not fit a T4 in float32: the refusal says the weights are held in float32.
    assert on_t4.sizing is None and on_t4.sizing_error is not None and "float32" in on_t4.sizing_error
