"""t4serve's plan against vLLM 0.34's own planner for eight model families on the GPUs of the known table, with the
flags that move KV accounting: tests/oracle/plan_oracle.py runs, in the image, t4serve's plan for each case and then
vLLM on that plan's argv (its parser, engine config, real model classes on the meta device, planner). Every figure
must be equal, or both must refuse, with the same largest length where the refusal is the pool's.

The checkpoints are written by tests/unit/family_checkpoints.py (published config.json, true headers, sparse data) and
tests/unit/e2b_checkpoint.py (Gemma 4 E2B)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from typing import Any

import pytest

from .conftest import REPO, load_e2b_checkpoint

pytestmark = pytest.mark.image

sys.path.insert(0, str(REPO / "tests" / "unit"))
from family_checkpoints import FAMILIES, write_family  # noqa: E402

from t4serve.gpus import KNOWN_GPUS  # noqa: E402

# Importing vLLM, probing eight checkpoints through its config reader and building ~80 engines takes minutes.
ORACLE_TIMEOUT_S = 1500
ALL = ("e2b", *FAMILIES)
# Models that fit a T4 in the dtype vLLM runs them in; the others are planned on a T4 with a given pool.
FITS_T4 = ("e2b", "qwen3", "llama3", "phi4mini", "smollm3", "llama31awq")
# Families with sliding-window layers (the flags that move the sliding groups are asked for each).
SLIDING = ("e2b", "gemma3", "phi4mini", "mistral")
T4_POOL = str(3 * 1024**3)  # a KV pool for the models whose weights do not fit a T4


def cases() -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []

    def case(family: str, gpu: str, name: str, **env: str) -> None:
        if gpu == "t4" and family not in FITS_T4:
            env.setdefault("T4SERVE_KV_CACHE_MEMORY_BYTES", T4_POOL)
        out.append({"id": f"{family}/{gpu}/{name}", "model": f"/fam/{family}", "gpu": gpu, "env": env})

    for family in ALL:
        case(family, "t4", "default")
        case(family, "t4", "len4096", T4SERVE_MAX_MODEL_LEN="4096")
        case(family, "a100", "default")
        case(family, "h100", "default")
        # vLLM's checks before it plans, and a pool too small for the length asked.
        case(family, "t4", "above-the-model", T4SERVE_MAX_MODEL_LEN="1048576",
             T4SERVE_KV_CACHE_MEMORY_BYTES=str(64 * 1024**3))
        case(family, "t4", "seqs-above-batched", T4SERVE_MAX_MODEL_LEN="4096", T4SERVE_MAX_NUM_SEQS="300",
             T4SERVE_MAX_NUM_BATCHED_TOKENS="256")
        case(family, "t4", "pool-too-small", T4SERVE_MAX_MODEL_LEN="32768",
             T4SERVE_KV_CACHE_MEMORY_BYTES=str(256 * 1024**2))
    for family in SLIDING:
        case(family, "t4", "no-async", T4SERVE_VLLM_ARGS="--no-async-scheduling")
        case(family, "t4", "hybrid-off", T4SERVE_VLLM_ARGS="--disable-hybrid-kv-cache-manager")
        case(family, "t4", "chunked-off", T4SERVE_MAX_MODEL_LEN="8192", T4SERVE_VLLM_ARGS="--no-enable-chunked-prefill")
        case(family, "t4", "chunked-off-batched-set", T4SERVE_MAX_MODEL_LEN="8192",
             T4SERVE_MAX_NUM_BATCHED_TOKENS="2048", T4SERVE_VLLM_ARGS="--no-enable-chunked-prefill")
        case(family, "t4", "block32", T4SERVE_VLLM_ARGS="--block-size 32")
    case("qwen3", "t4", "block64", T4SERVE_VLLM_ARGS="--block-size 64")
    case("e2b", "t4", "chunked-off-auto-length", T4SERVE_MAX_NUM_BATCHED_TOKENS="2048",
         T4SERVE_VLLM_ARGS="--no-enable-chunked-prefill")
    # The backend is vLLM's choice (Triton below 8.0 and for Gemma 4 below 9.0, FlashAttention above) unless
    # T4SERVE_ATTENTION names Triton: the figures must not depend on it.
    case("e2b", "h100", "triton", T4SERVE_ATTENTION="triton")
    case("qwen3", "a100", "triton", T4SERVE_ATTENTION="triton")
    case("e2b", "l4", "default")
    case("mistral", "l4", "default")
    case("e2b", "h200", "ngram-gpu", T4SERVE_SPECULATIVE="ngram", T4SERVE_NUM_SPECULATIVE_TOKENS="3")
    # The quantized KV caches (T4SERVE_KV_CACHE_DTYPE): vLLM's per-token-head int8 and int4 on every card, sized by the
    # plan as vLLM's planner lays them out (Gemma 4's padded sliding pages), at several lengths and on several GPUs;
    # fp8 from capability 8.9 only.
    for family in ("e2b", "gemma3", "gemma3_1b", "qwen3", "mistral", "phi4mini"):
        for kv in ("int8", "int4"):
            case(family, "t4", f"kv-{kv}", T4SERVE_KV_CACHE_DTYPE=kv)
            case(family, "t4", f"kv-{kv}-len4096", T4SERVE_KV_CACHE_DTYPE=kv, T4SERVE_MAX_MODEL_LEN="4096")
    # E2B's int4 figures on an L4: on a T4 (and for the 256-wide full-attention layers of Gemma 3) the plan refuses
    # int4, whose attention kernel does not fit Turing's shared memory (t4serve.planning.kernelfit), where vLLM's
    # planner plans it: test_plan_equals_vllm checks that divergence.
    for length in ("1000", "32768", "131072"):
        case("e2b", "t4", f"kv-int8-len{length}", T4SERVE_KV_CACHE_DTYPE="int8", T4SERVE_MAX_MODEL_LEN=length)
        case("e2b", "l4", f"kv-int4-len{length}", T4SERVE_KV_CACHE_DTYPE="int4", T4SERVE_MAX_MODEL_LEN=length)
    case("e2b", "t4", "kv-int8-no-async", T4SERVE_KV_CACHE_DTYPE="int8", T4SERVE_VLLM_ARGS="--no-async-scheduling")
    case("e2b", "l4", "kv-int4-hybrid-off", T4SERVE_KV_CACHE_DTYPE="int4",
         T4SERVE_VLLM_ARGS="--disable-hybrid-kv-cache-manager")
    case("e2b", "t4", "kv-int8-block32", T4SERVE_KV_CACHE_DTYPE="int8", T4SERVE_VLLM_ARGS="--block-size 32")
    case("e2b", "l4", "kv-int4-pool-too-small", T4SERVE_KV_CACHE_DTYPE="int4", T4SERVE_MAX_MODEL_LEN="131072",
         T4SERVE_KV_CACHE_MEMORY_BYTES=str(64 * 1024**2))
    case("e2b", "l4", "kv-int4", T4SERVE_KV_CACHE_DTYPE="int4")
    for gpu in ("l4", "a100", "h100"):
        case("e2b", gpu, "kv-int8", T4SERVE_KV_CACHE_DTYPE="int8")
        case("qwen3", gpu, "kv-int4", T4SERVE_KV_CACHE_DTYPE="int4")
    for gpu in ("t4", "l4", "h100"):
        case("e2b", gpu, "kv-fp8", T4SERVE_KV_CACHE_DTYPE="fp8")
        case("qwen3", gpu, "kv-fp8", T4SERVE_KV_CACHE_DTYPE="fp8")
    # gpt-oss's mxfp4 needs capability 8.0 (vLLM refuses it on a T4), and bfloat16.
    out.append({"id": "gptoss/t4/default", "model": "/fam/gptoss", "gpu": "t4", "env": {}})
    case("llama3", "t4", "ngram-gpu", T4SERVE_SPECULATIVE="ngram", T4SERVE_NUM_SPECULATIVE_TOKENS="3")
    return out


@pytest.fixture(scope="module")
def oracle(docker_bin: str, image_ref: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("families")
    for family in FAMILIES:
        write_family(root / family, family)
    load_e2b_checkpoint().write_checkpoint(root / "e2b", kind="bf16")
    write_gpt_oss(root / "gptoss")
    spec = {
        "cases": cases(),
        "batch_defaults": [{"key": g.key, "name": g.name, "capability": list(g.compute_capability),
                            "memory_bytes": g.memory_bytes} for g in KNOWN_GPUS.values()],
    }
    (root / "cases.json").write_text(json.dumps(spec))
    # The image runs as its own user: the checkpoints it reads must be readable by others.
    for path in (root, *root.rglob("*")):
        path.chmod(0o755 if path.is_dir() else 0o644)
    cmd = [docker_bin, "run", "--rm", "--network", "none", "-e", "CUDA_VISIBLE_DEVICES=",
           "-v", f"{REPO / 'tests'}:/t:ro", "-v", f"{root}:/fam:ro", "--entrypoint", "python", image_ref,
           "/t/oracle/plan_oracle.py", "/fam/cases.json"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=ORACLE_TIMEOUT_S)
    assert done.returncode == 0, f"the oracle failed in {image_ref}:\n{done.stderr[-6000:]}"
    data: dict[str, Any] = json.loads(done.stdout)
    assert data["vllm_version"] == "0.34.0", data["vllm_version"]
    return data


# openai/gpt-oss-20b's config.json, less fields no planner reads; one tensor header (vLLM's engine config reads no
# weights, t4serve's probe needs a safetensors file).
GPT_OSS_20B = {
    "architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "hidden_size": 2880, "head_dim": 64,
    "intermediate_size": 2880, "num_attention_heads": 64, "num_key_value_heads": 8, "num_hidden_layers": 24,
    "num_local_experts": 32, "num_experts_per_tok": 4, "sliding_window": 128, "vocab_size": 201088,
    "max_position_embeddings": 131072, "layer_types": ["sliding_attention", "full_attention"] * 12,
    "rope_scaling": {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
                     "original_max_position_embeddings": 4096},
    "quantization_config": {"quant_method": "mxfp4",
                            "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                                                       "model.embed_tokens", "lm_head"]},
    "torch_dtype": "bfloat16", "tie_word_embeddings": False,
}


def write_gpt_oss(directory: Any) -> None:
    from e2b_checkpoint import write_safetensors

    directory.mkdir(parents=True)
    (directory / "config.json").write_text(json.dumps(GPT_OSS_20B))
    write_safetensors(directory / "model.safetensors", [("model.embed_tokens.weight", "BF16", [201088, 2880])])


def by_id(oracle: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["id"]: c for c in oracle["cases"]}


def flag(argv: list[str], name: str) -> str | None:
    return argv[argv.index(name) + 1] if name in argv else None


def test_every_known_gpus_batch_defaults_are_vllms(oracle: dict[str, Any]) -> None:
    rows = {r["key"]: r for r in oracle["batch_defaults"]}
    assert set(rows) == set(KNOWN_GPUS)
    for key, row in rows.items():
        assert row["t4serve"] == row["vllm"], key


@pytest.mark.parametrize("case_id", [c["id"] for c in cases()])
def test_plan_equals_vllm(oracle: dict[str, Any], case_id: str) -> None:
    assert_plan_equals_vllm(by_id(oracle)[case_id], case_id)


def assert_plan_equals_vllm(entry: dict[str, Any], case_id: str) -> None:
    """One case of plan_oracle's answer: t4serve's figures are vLLM's, or both refuse (the same largest length)."""
    assert "error" not in entry, entry.get("traceback", entry.get("error"))
    ours, theirs = entry["t4serve"], entry["vllm"]
    # The config the figures rest on was read with transformers' defaults (t4serve's table, checked against vLLM's
    # reader below) or by vLLM's own reader.
    assert ours["config_read_by"] is not None
    if ours["sizing_error"] is not None and "int4 attention kernel needs" in ours["sizing_error"]:
        # Past vLLM's planner, which plans it: the card could not launch vLLM's int4 kernel (its shared memory).
        assert theirs.get("refused") is None, theirs.get("refused")
        assert "Hardware limit: 65536" in ours["sizing_error"] and case_id.split("/")[1] == "t4", case_id
        return
    if ours["sizing_error"] is not None:
        # t4serve refuses: vLLM refuses the same argv, at its checks or when planning the pool.
        assert "no GPU memory is left" not in ours["sizing_error"], ours["sizing_error"]
        refused_pools = [p for p in theirs.get("pools", []) if not p["fits"]]
        assert theirs.get("refused") or refused_pools, (ours["sizing_error"], theirs)
        if not theirs.get("refused"):
            said = int(ours["sizing_error"].split("required: at most ")[1].split(" tokens")[0].replace(",", ""))
            assert refused_pools[0]["estimated_max_model_len"] == said, (said, refused_pools[0])
        return
    assert theirs.get("refused") is None, theirs.get("refused")
    argv = ours["argv"]
    # vLLM runs what the plan says: its dtype, lengths, batch, block and backend.
    assert theirs["dtype"] == ours["dtype"]
    assert theirs["max_model_len"] == ours["max_model_len"] == int(flag(argv, "--max-model-len") or 0)
    assert theirs["max_num_seqs"] == ours["max_num_seqs"]
    assert theirs["max_num_batched_tokens"] == ours["max_num_batched_tokens"]
    assert theirs["block_size"] == ours["block_size"]
    named = flag(argv, "--attention-backend")
    if named is not None:
        assert theirs["attention_backends"] == [named.upper()]
    assert theirs["kv_cache_layout"] == "LBNHC"  # the layout kvcache.bytes_per_block is written for
    pools = {str(p["pool_bytes"]): p for p in theirs["pools"]}
    assert set(ours["pools"]) <= set(pools)
    for pool, mine in ours["pools"].items():
        vllm_pool = pools[pool]
        assert vllm_pool["fits"] == mine["fits"], (pool, vllm_pool.get("error"))
        if not mine["fits"]:
            assert vllm_pool["estimated_max_model_len"] == mine["largest_length"], pool
            continue
        assert (vllm_pool["num_blocks"], vllm_pool["bytes_per_block"], vllm_pool["kv_cache_size_tokens"],
                vllm_pool["max_concurrency"]) == (mine["num_blocks"], mine["bytes_per_block"],
                                                  mine["kv_cache_size_tokens"], mine["max_concurrency"]), pool
        assert [g["blocks_per_request"] for g in vllm_pool["groups"]] == mine["blocks_per_request_by_group"], pool
    # The plan's own pool: vLLM logs exactly the plan's tokens and concurrency.
    own = pools[str(ours["kv_cache_memory_bytes"])]
    assert own["kv_cache_size_tokens"] == ours["kv_tokens"]
    assert round(own["max_concurrency"], 2) == ours["concurrency"]
    for line in own["log"]:  # vLLM logs each distinct line once per process
        assert f"{ours['kv_tokens']:,} tokens" in line


def test_the_flags_moved_what_they_should(oracle: dict[str, Any]) -> None:
    """The flags reached vLLM and changed its accounting as the plan modelled it (not a no-op on both sides)."""
    cases_by_id = by_id(oracle)
    for family in SLIDING:
        default = cases_by_id[f"{family}/t4/default"]
        sync = cases_by_id[f"{family}/t4/no-async"]
        flat = cases_by_id[f"{family}/t4/hybrid-off"]
        unchunked = cases_by_id[f"{family}/t4/chunked-off"]
        assert default["vllm"]["async_scheduling"] and not sync["vllm"]["async_scheduling"]
        assert sync["vllm"]["max_in_flight_tokens"] * 2 == default["vllm"]["max_in_flight_tokens"]
        assert not flat["vllm"]["hybrid_kv_cache_manager"]
        assert not unchunked["vllm"]["chunked_prefill"] and unchunked["vllm"]["max_num_batched_tokens"] == 8192
        assert cases_by_id[f"{family}/t4/block32"]["vllm"]["block_size"] == 32
    # Gemma 4 with the hybrid manager off: the sliding layers are allocated in full, almost half the tokens.
    e2b_flat = cases_by_id["e2b/t4/hybrid-off"]["t4serve"]
    e2b = cases_by_id["e2b/t4/default"]["t4serve"]
    assert e2b_flat["kv_tokens"] < 0.6 * e2b["kv_tokens"]
    # Phi-4-mini's model-level window slides on every layer, as vLLM builds it.
    assert cases_by_id["phi4mini/t4/default"]["vllm"]["layer_spec_types"] == ["SlidingWindowSpec"]
    # Gemma 3 on a T4 runs in float32 (vLLM refuses float16 for it), in bfloat16 from capability 8.0.
    assert cases_by_id["gemma3/t4/default"]["vllm"]["dtype"] == "float32"
    assert cases_by_id["gemma3/a100/default"]["vllm"]["dtype"] == "bfloat16"
    # vLLM's own backend choice, which the plan leaves to it: FlashAttention 4 for Gemma 4 from capability 9.0, Triton
    # below; FlashAttention for a dense model from 8.0. The figures above were equal either way.
    assert cases_by_id["e2b/h100/default"]["vllm"]["attention_backends"] == ["FLASH_ATTN"]
    assert cases_by_id["e2b/a100/default"]["vllm"]["attention_backends"] == ["TRITON_ATTN"]
    assert cases_by_id["e2b/t4/default"]["vllm"]["attention_backends"] == ["TRITON_ATTN"]
    assert cases_by_id["qwen3/a100/default"]["vllm"]["attention_backends"] == ["FLASH_ATTN"]
    # An A100 keeps vLLM's small batch by name; an H100 gets 8192.
    assert cases_by_id["qwen3/a100/default"]["vllm"]["max_num_batched_tokens"] == 2048
    assert cases_by_id["qwen3/h100/default"]["vllm"]["max_num_batched_tokens"] == 8192


@pytest.mark.parametrize("family", ALL)
def test_t4serves_table_reads_each_config_as_vllms_reader(oracle: dict[str, Any], family: str) -> None:
    """The text config t4serve probed without importing anything (transformers' defaults and rules from its table)
    is, as the sizing reads it, the one vLLM's `get_config` builds from the same config.json."""
    reading = oracle["configs"][f"/fam/{family}"]
    assert "error" not in reading, reading
    assert reading["t4serve_read_by"].startswith("t4serve's table of transformers 5.20.2"), reading["t4serve_read_by"]
    assert reading["vllm_read_by"].startswith("vLLM 0.34.0 get_config")
    assert reading["t4serve"] == reading["vllm"]


def test_the_kv_cache_dtypes_reached_vllm(oracle: dict[str, Any]) -> None:
    """int8 and int4 are vLLM's per-token-head caches on the Triton backend, wherever vLLM would pick another; fp8 is
    refused below 8.9 by both, in vLLM's words, and planned from 8.9."""
    cases_by_id = by_id(oracle)
    for case_id, entry in cases_by_id.items():
        kv = entry["t4serve"].get("argv", [])
        if "kv-int" in case_id:
            assert entry["vllm"]["attention_backends"] == ["TRITON_ATTN"], case_id
            assert kv[kv.index("--kv-cache-dtype") + 1].endswith("_per_token_head"), case_id
    e2b, int8 = (cases_by_id[f"e2b/t4/{n}"]["t4serve"] for n in ("default", "kv-int8"))
    # Gemma 4 E2B at 16,384 tokens on a T4: about 1.5x the 16-bit cache's tokens with int8; int4, refused on a T4,
    # about 3x on an L4.
    assert 1.3 < int8["kv_tokens"] / e2b["kv_tokens"] < 1.7
    e2b_l4, int4_l4 = (cases_by_id[f"e2b/l4/{n}"]["t4serve"] for n in ("default", "kv-int4"))
    assert 2.5 < int4_l4["kv_tokens"] / e2b_l4["kv_tokens"] < 3.2
    for family in ("e2b", "gemma3", "gemma3_1b"):
        assert "int4 attention kernel needs" in cases_by_id[f"{family}/t4/kv-int4"]["t4serve"]["sizing_error"]
    for family in ("qwen3", "mistral", "phi4mini"):  # 128-wide heads (Phi-4-mini's 96 padded): int4 fits a T4
        assert cases_by_id[f"{family}/t4/kv-int4"]["t4serve"]["sizing_error"] is None
    for family in ("e2b", "qwen3"):
        refused = cases_by_id[f"{family}/t4/kv-fp8"]
        assert "native FP8 (fp8e4nv) requires SM89+" in refused["t4serve"]["sizing_error"]
        assert "native FP8 (fp8e4nv) requires SM89+" in refused["vllm"]["refused"]
        said = refused["vllm"]["refused"].split("ValueError: ", 1)[1]
        assert said in refused["t4serve"]["sizing_error"].replace("\n", " ")
        assert cases_by_id[f"{family}/l4/kv-fp8"]["t4serve"]["sizing_error"] is None


def test_gpt_oss_mxfp4_is_refused_on_a_t4_in_vllms_words(oracle: dict[str, Any]) -> None:
    entry = by_id(oracle)["gptoss/t4/default"]
    # vLLM's refusal comes wrapped in pydantic's ValidationError ("Value error, MESSAGE [type=...").
    found = re.search(r"The quantization method \S+ is not supported for the current GPU\. Minimum capability: \d+\. "
                      r"Current capability: \d+\.", entry["vllm"]["refused"])
    assert found is not None, entry["vllm"]["refused"]
    assert "Minimum capability: 80. Current capability: 75." in found.group(0)
    assert found.group(0) in entry["t4serve"]["sizing_error"]
