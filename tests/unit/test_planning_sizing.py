"""size(): the published bf16 T4 run reproduced, choices from the pool, settings winning, failures explained."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from e2b_checkpoint import write_checkpoint

from t4serve.errors import ConfigError
from t4serve.facts import HostFacts, ModelFacts
from t4serve.gpus import KNOWN_GPUS
from t4serve.planning import sizing
from t4serve.probes.checkpoint import probe_model
from t4serve.units import GIB

T4 = KNOWN_GPUS["t4"]
PUBLISHED_POOL = 30_934 * 98_304  # the pool behind the logged 315,974 tokens (test_kvcache)


@pytest.fixture(scope="module")
def bf16(tmp_path_factory: pytest.TempPathFactory) -> ModelFacts:
    d = write_checkpoint(tmp_path_factory.mktemp("bf16") / "c", "bf16")
    return probe_model(str(d), hf_home=str(d), offline=True)


@pytest.fixture(scope="module")
def qat(tmp_path_factory: pytest.TempPathFactory) -> ModelFacts:
    d = write_checkpoint(tmp_path_factory.mktemp("qat") / "c", "qat")
    return probe_model(str(d), hf_home=str(d), offline=True)


def inputs(model: ModelFacts, **kw: object) -> sizing.SizingInputs:
    base = sizing.SizingInputs(
        gpu_memory_bytes=T4.memory_bytes, gpu_memory_utilization=0.9, compute_capability=T4.compute_capability,
        bandwidth_bytes_per_s=T4.bandwidth, model=model, dtype_bytes=2, max_model_len=16384, max_num_seqs=8,
        kv_cache_memory_bytes=None, host=None,
    )
    return dataclasses.replace(base, **kw)  # type: ignore[arg-type]


def host(avail_gib: float, swap_free_gib: float = 0.0, limit: int | None = None) -> HostFacts:
    return HostFacts(cpu_count=2, mem_total_bytes=int(7.8e9), mem_available_bytes=int(avail_gib * GIB),
                     swap_total_bytes=int(swap_free_gib * GIB), swap_free_bytes=int(swap_free_gib * GIB),
                     cgroup_version=2, cgroup_memory_limit_bytes=limit, cgroup_swap_limit_bytes=None,
                     shm_total_bytes=None, shm_free_bytes=None)


def test_published_bf16_t4_run_pool_within_3_percent(bf16: ModelFacts) -> None:
    s = sizing.size(inputs(bf16))
    assert abs(s.kv_pool_bytes.value - PUBLISHED_POOL) / PUBLISHED_POOL < 0.03
    # Each term of the subtraction is shown.
    for term in ("x 0.9", "weights", "buffers", "activation", "non-torch and CUDA graphs"):
        assert term in s.kv_pool_bytes.how
    assert s.max_model_len.source == "setting" and s.max_num_seqs.source == "setting"


def test_published_bf16_tokens_and_concurrency_from_its_pool(bf16: ModelFacts) -> None:
    s = sizing.size(inputs(bf16, kv_cache_memory_bytes=PUBLISHED_POOL))
    assert s.kv_tokens.value == 315_974
    assert s.concurrency.value == 19.29
    assert s.kv_cache_memory_bytes is not None and s.kv_cache_memory_bytes.source == "setting"


def test_calibration_constant_is_what_its_comment_derives(bf16: ModelFacts) -> None:
    text = sizing.text_config(bf16)
    weights, _ = sizing.weights_in_gpu(bf16, 2)
    buffers, _ = sizing.buffers_in_gpu(text, 2048, 2)
    act, _ = sizing.activation_peak(text, tokens=2048, max_num_seqs=8, dtype_bytes=2)
    residual = 0.9 * T4.memory_bytes - weights - buffers - act - PUBLISHED_POOL
    assert abs(residual - sizing.NON_TORCH_AND_GRAPHS_BYTES) < 0.001 * GIB


def test_default_choices_from_the_pool(bf16: ModelFacts) -> None:
    s = sizing.size(inputs(bf16, max_model_len=None, max_num_seqs=None))
    assert s.max_model_len.value == 16384 and s.max_model_len.source == "derived"
    # The pool holds 19 full-length requests (the published run capped at 8): choose 19.
    assert s.max_num_seqs.value == int(s.concurrency.value)
    assert 17 <= s.max_num_seqs.value <= 20
    assert s.kv_cache_memory_bytes is not None
    assert s.kv_cache_memory_bytes.value % 98_304 == 0
    assert s.kv_pool_bytes.value == s.kv_cache_memory_bytes.value


def test_qat_holds_more(bf16: ModelFacts, qat: ModelFacts) -> None:
    a = sizing.size(inputs(bf16, max_num_seqs=None))
    b = sizing.size(inputs(qat, max_num_seqs=None))
    # QAT's weights take 1.76 GiB less (tests/image/test_weights_oracle.py); its sampler term grows with the seqs.
    assert b.kv_pool_bytes.value > a.kv_pool_bytes.value + 1.6 * GIB
    assert b.max_num_seqs.value > a.max_num_seqs.value
    assert b.decode_ceiling_tokens_per_s is not None and a.decode_ceiling_tokens_per_s is not None
    assert b.decode_ceiling_tokens_per_s.value > 2 * a.decode_ceiling_tokens_per_s.value


def test_max_model_len_that_does_not_fit_says_what_does(bf16: ModelFacts) -> None:
    with pytest.raises(ConfigError, match="T4SERVE_MAX_MODEL_LEN does not fit") as exc:
        sizing.size(inputs(bf16, max_model_len=131072, kv_cache_memory_bytes=200 * 1024**2))
    assert exc.value.fix is not None and "T4SERVE_MAX_MODEL_LEN=" in exc.value.fix


def test_no_memory_left_is_explained(bf16: ModelFacts) -> None:
    with pytest.raises(ConfigError, match="no GPU memory is left"):
        sizing.size(inputs(bf16, gpu_memory_utilization=0.5))


def test_swap_need_on_the_published_host(bf16: ModelFacts) -> None:
    s = sizing.size(inputs(bf16, host=host(7.0)))
    assert s.swap_to_add_bytes.value > 6 * GIB
    assert "scripts/setup-swap" in s.swap_to_add_bytes.how
    enough = sizing.size(inputs(bf16, host=host(7.0, swap_free_gib=16)))
    assert enough.swap_to_add_bytes.value == 0


def test_model_without_config_is_refused(tmp_path: Path) -> None:
    empty = ModelFacts(requested="x/y", local_path=None, source="not-local", error="hub unreachable")
    with pytest.raises(ConfigError, match=r"needs the model.s config\.json"):
        sizing.size(inputs(empty))


@pytest.mark.parametrize(
    ("text", "derived"),
    [
        ({"max_position_embeddings": 131072}, 131072),
        ({"max_position_embeddings": 40960, "seq_length": 32768}, 32768),  # the smallest key
        ({"max_position_embeddings": 8192, "model_max_length": 16384}, 16384),  # Command-R's override
        ({"max_position_embeddings": 8192, "rope_scaling": {"type": "linear", "factor": 4.0}}, 32768),
        ({"max_position_embeddings": 8192, "rope_parameters": {"rope_type": "dynamic", "factor": 2.0}}, 16384),
        # Already-scaled types keep max_position_embeddings (Llama 3.1, Phi-4-mini's longrope, YaRN).
        ({"max_position_embeddings": 131072, "rope_parameters": {"rope_type": "llama3", "factor": 8.0}}, 131072),
        ({"max_position_embeddings": 131072, "rope_scaling": {"type": "longrope", "long_factor": [1.0]}}, 131072),
        ({"max_position_embeddings": 131072, "rope_parameters": {"rope_type": "yarn", "factor": 4.0}}, 131072),
        # Gemma 3's 128K is already scaled: vLLM skips the factor for any gemma3 model type.
        ({"model_type": "gemma3_text", "max_position_embeddings": 131072,
          "rope_parameters": {"full_attention": {"rope_type": "linear", "factor": 8.0},
                              "sliding_attention": {"rope_type": "default"}}}, 131072),
        ({"max_position_embeddings": 4096,
          "rope_parameters": {"full_attention": {"rope_type": "linear", "factor": 2.0},
                              "sliding_attention": {"rope_type": "default"}}}, 8192),
        ({"hidden_size": 8}, None),
    ],
)
def test_derived_max_model_len_is_vllms(text: dict[str, object], derived: int | None) -> None:
    assert sizing.derived_max_model_len(text)[0] == derived


def test_max_model_len_above_the_model_is_refused_in_vllms_words(bf16: ModelFacts) -> None:
    with pytest.raises(ConfigError, match="above the model's maximum") as exc:
        sizing.size(inputs(bf16, max_model_len=262144, kv_cache_memory_bytes=40 * GIB))
    assert "User-specified max_model_len (262144) is greater than the derived max_model_len" in exc.value.required
    assert "VLLM_ALLOW_LONG_MAX_MODEL_LEN=1" in exc.value.required
    assert exc.value.fix is not None and "T4SERVE_MAX_MODEL_LEN=131072" in exc.value.fix
    allowed = sizing.size(inputs(bf16, max_model_len=262144, kv_cache_memory_bytes=40 * GIB,
                                 allow_long_max_model_len=True))
    assert allowed.max_model_len.value == 262144
    assert any("VLLM_ALLOW_LONG_MAX_MODEL_LEN is set" in n for n in allowed.notes)


def test_auto_max_model_len_says_the_models_maximum(bf16: ModelFacts) -> None:
    s = sizing.size(inputs(bf16, max_model_len=None, max_num_seqs=None))
    assert "max_position_embeddings=131,072" in s.max_model_len.how


def test_weights_are_held_in_the_model_dtype(bf16: ModelFacts, qat: ModelFacts) -> None:
    """vLLM keeps floating-point weights in the model dtype: bf16 weights take twice the bytes in float32; QAT's
    packed int4 weights stay as stored, only its 16-bit tensors double."""
    half, _ = sizing.weights_in_gpu(bf16, 2)
    full, how = sizing.weights_in_gpu(bf16, 4)
    assert full == 2 * half and "BF16 held as 32-bit" in how
    q_half, _ = sizing.weights_in_gpu(qat, 2)
    q_full, _ = sizing.weights_in_gpu(qat, 4)
    packed = sum(n for g in qat.weights for d, n in g.bytes_by_dtype.items() if d in ("I32", "I64"))
    assert packed > 0 and q_full == 2 * q_half - packed
