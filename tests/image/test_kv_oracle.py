"""t4serve.planning.kvcache against vLLM's own KV cache code: tests/oracle/kv_oracle.py runs the image's vLLM 0.34 (real
engine config, real Gemma 4 layers on the meta device, real planner) for E2B on a stand-in T4 without a GPU; every
figure kvcache.py computes from config.json must equal vLLM's, field by field, for each pool and max_model_len here."""

from __future__ import annotations

import json
import subprocess
from typing import Any

import pytest

from t4serve.gpus import default_max_num_batched_tokens
from t4serve.planning import kvcache as kv

from .conftest import REPO, load_e2b_checkpoint

pytestmark = pytest.mark.image

# Importing vLLM and building its engine config and model once per length takes about 20 s on two cores.
ORACLE_TIMEOUT_S = 300
PUBLISHED_POOL = 3_040_935_936  # published-t4-run.md: 2.832 GiB of KV cache on the published T4 run
T4_MEMORY_BYTES = 15360 * 1024**2
DTYPE_BYTES = 2  # --dtype float16, KV cache dtype auto
LENGTHS = (16384, 1000, 131072)  # published; under the sliding window's hold; the model's max_position_embeddings
POOLS = (PUBLISHED_POOL, 1024**3)


E2B = load_e2b_checkpoint()
TEXT: dict[str, Any] = E2B.e2b_config("bf16")["text_config"]
BATCHED = default_max_num_batched_tokens(T4_MEMORY_BYTES, "Tesla T4")


def layout(max_model_len: int) -> kv.KVLayout:
    return kv.kv_layout(TEXT, dtype_bytes=DTYPE_BYTES, max_model_len=max_model_len, max_num_batched_tokens=BATCHED)


def pools_for(max_model_len: int) -> list[int]:
    """The fixed pools, plus kvcache's smallest accepted pool and one byte less: vLLM must draw the line there too."""
    least = kv.min_pool_bytes(layout(max_model_len))
    return [*POOLS, least, least - 1]


def run_oracle(docker_bin: str, image: str, kind: str, lengths: tuple[int, ...], pools: list[int],
               *extra: str) -> dict[int, Any]:
    """vLLM's figures by max_model_len, from tests/oracle/kv_oracle.py in a throwaway container (no GPU, no network)."""
    cmd = [docker_bin, "run", "--rm", "--network", "none", "-e", "CUDA_VISIBLE_DEVICES="]
    cmd += ["-v", f"{REPO / 'tests'}:/t:ro", "--entrypoint", "python", image, "/t/oracle/kv_oracle.py"]
    cmd += ["--e2b", kind, "--dtype", "float16", *extra]
    for length in lengths:
        cmd += ["--max-model-len", str(length)]
    for pool in pools:
        cmd += ["--pool", str(pool)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=ORACLE_TIMEOUT_S)
    assert done.returncode == 0, f"the oracle failed in {image}:\n{done.stderr[-6000:]}"
    data: dict[str, Any] = json.loads(done.stdout)
    assert data["vllm_version"] == "0.34.0", data["vllm_version"]
    return {run["max_model_len"]: run for run in data["runs"]}


@pytest.fixture(scope="module")
def oracle(docker_bin: str, image_ref: str) -> dict[int, dict[str, Any]]:
    """The bf16 checkpoint. The fit boundary differs per length, so every length is asked for every pool."""
    return run_oracle(docker_bin, image_ref, "bf16", LENGTHS, sorted({p for n in LENGTHS for p in pools_for(n)}))


def kind_of(spec_type: str) -> str:
    return {"FullAttentionSpec": "full", "SlidingWindowSpec": "sliding"}[spec_type]


@pytest.mark.parametrize("max_model_len", LENGTHS)
def test_engine_inputs_match_what_kvcache_assumes(oracle: dict[int, dict[str, Any]], max_model_len: int) -> None:
    run = oracle[max_model_len]
    lay = layout(max_model_len)
    assert run["dtype"] == "float16"
    assert run["block_size"] == kv.DEFAULT_BLOCK_SIZE
    assert run["attention_backend"].endswith("TRITON_ATTN")
    # vLLM's own default for a 15 GiB T4 and its async scheduling default, which kvcache.py takes as given.
    assert run["max_num_batched_tokens"] == BATCHED
    assert run["async_scheduling"] is True
    assert run["max_in_flight_tokens"] == lay.in_flight_tokens
    # vLLM 0.34 turns the extensible KV cache on by default on CUDA, and off where the pool is given, as t4serve
    # gives it (kv_oracle passes kv_cache_memory_bytes): its tokens are then the planner's, logged at start.
    assert run["extensible_kv_cache"] is False


@pytest.mark.parametrize("max_model_len", LENGTHS)
def test_per_layer_specs_and_kv_sharing(oracle: dict[int, dict[str, Any]], max_model_len: int) -> None:
    layers = oracle[max_model_len]["layers"]
    assert [entry["layer"] for entry in layers] == list(range(int(TEXT["num_hidden_layers"])))
    owning = [entry for entry in layers if "shares_kv_with" not in entry]
    ours = kv.kv_cache_specs(TEXT, DTYPE_BYTES)
    theirs = [
        {
            "layer": e["layer"],
            "kind": kind_of(e["type"]),
            "block_size": e["block_size"],
            "page_size_bytes": e["page_size_bytes"],
            "num_kv_heads": e["num_kv_heads"],
            "head_size": e["head_size"],
            "head_size_v": e["head_size_v"],
            "dtype_bytes": {"float16": 2, "bfloat16": 2, "float32": 4}[e["dtype"]],
            "sliding_window": e["sliding_window"],
        }
        for e in owning
    ]
    assert theirs == [
        {
            "layer": s.layer,
            "kind": s.kind,
            "block_size": s.block_size,
            "page_size_bytes": s.page_size_bytes,
            "num_kv_heads": s.num_kv_heads,
            "head_size": s.head_size,
            "head_size_v": s.head_size,
            "dtype_bytes": s.dtype_bytes,
            "sliding_window": s.sliding_window,
        }
        for s in ours
    ]
    # Layers kvcache.py gives no spec are exactly those vLLM shares, each reading an owning layer of its own type.
    shared = [entry for entry in layers if "shares_kv_with" in entry]
    assert {e["layer"] for e in shared} == set(range(len(ours), int(TEXT["num_hidden_layers"])))
    kinds = {s.layer: s.kind for s in ours}
    for entry in shared:
        assert entry["shares_kv_with_layer"] in kinds
        own_type = "sliding" if TEXT["layer_types"][entry["layer"]] == "sliding_attention" else "full"
        assert kinds[entry["shares_kv_with_layer"]] == own_type, entry


@pytest.mark.parametrize("max_model_len", LENGTHS)
def test_groups_blocks_capacity_and_concurrency(oracle: dict[int, dict[str, Any]], max_model_len: int) -> None:
    run = oracle[max_model_len]
    lay = layout(max_model_len)
    by_pool = {p["pool_bytes"]: p for p in run["pools"]}
    for pool in pools_for(max_model_len):
        theirs = by_pool[pool]
        assert theirs["fits"] == kv.fits(lay, pool), (pool, theirs.get("error"))
        if not theirs["fits"]:
            assert "KV cache" in theirs["error"], theirs
            continue
        groups = [
            {
                "layers": g["layers"],
                "kind": kind_of(g["type"]),
                "block_size": g["block_size"],
                "page_size_bytes": g["page_size_bytes"],
                "blocks_per_request": g["blocks_per_request"],
            }
            for g in theirs["groups"]
        ]
        assert groups == [
            {
                "layers": list(g.layers),
                "kind": g.spec.kind,
                "block_size": g.spec.block_size,
                "page_size_bytes": g.spec.page_size_bytes,
                "blocks_per_request": blocks,
            }
            for g, blocks in zip(lay.groups, lay.blocks_per_request_by_group, strict=True)
        ], f"pool {pool}"
        assert theirs["bytes_per_block"] == lay.bytes_per_block
        ours = kv.capacity(lay, pool)
        assert (theirs["num_blocks"], theirs["kv_cache_size_tokens"], theirs["max_concurrency"]) == (
            ours.num_blocks,
            ours.tokens,
            ours.concurrency,
        ), f"pool {pool}, max_model_len {max_model_len}"
        assert theirs["log"] == [
            f"GPU KV cache size: {ours.tokens:,} tokens, Maximum concurrency for {max_model_len:,} tokens per "
            f"request: {ours.concurrency:.2f}x"
        ]


def test_vllm_reproduces_the_published_t4_figures(oracle: dict[int, dict[str, Any]]) -> None:
    """published-t4-run.md, independent of kvcache.py: 30,934 blocks of 98,304 B; "315,974 tokens ... 19.29x"."""
    published = next(p for p in oracle[16384]["pools"] if p["pool_bytes"] == PUBLISHED_POOL)
    assert (published["num_blocks"], published["bytes_per_block"]) == (30934, 98304)
    assert published["log"] == [
        "GPU KV cache size: 315,974 tokens, Maximum concurrency for 16,384 tokens per request: 19.29x"
    ]


def test_qat_checkpoint_has_the_same_kv_cache(docker_bin: str, image_ref: str) -> None:
    """The compressed-tensors build quantizes weights only: vLLM plans its KV cache exactly as kvcache.py does."""
    text = E2B.e2b_config("qat")["text_config"]
    lay = kv.kv_layout(text, dtype_bytes=DTYPE_BYTES, max_model_len=16384, max_num_batched_tokens=BATCHED)
    ours = kv.capacity(lay, PUBLISHED_POOL)
    theirs = run_oracle(docker_bin, image_ref, "qat", (16384,), [PUBLISHED_POOL])[16384]["pools"][0]
    assert (theirs["num_blocks"], theirs["bytes_per_block"], theirs["kv_cache_size_tokens"]) == (
        ours.num_blocks,
        lay.bytes_per_block,
        ours.tokens,
    )
    assert theirs["max_concurrency"] == ours.concurrency


def test_vllm_034s_default_block_size_is_64_and_kvcache_sizes_it(docker_bin: str, image_ref: str) -> None:
    """No --block-size: vLLM 0.34's own default (64, `CacheConfig.DEFAULT_BLOCK_SIZE`; 16 before) on the stand-in T4.
    kvcache.py at 64 gives vLLM's blocks, tokens and concurrency at 4k, 16k and 32k, and fewer tokens than at 16, the
    block t4serve passes (docs/sizing.md has the figures)."""
    lengths = (4096, 16384, 32768)
    runs = run_oracle(docker_bin, image_ref, "bf16", lengths, [PUBLISHED_POOL], "--block-size", "vllm")
    for length in lengths:
        run = runs[length]
        assert run["block_size"] == 64
        lay = kv.kv_layout(TEXT, dtype_bytes=DTYPE_BYTES, max_model_len=length, max_num_batched_tokens=BATCHED,
                           block_size=64)
        theirs = run["pools"][0]
        ours = kv.capacity(lay, PUBLISHED_POOL)
        assert (theirs["num_blocks"], theirs["bytes_per_block"], theirs["kv_cache_size_tokens"],
                theirs["max_concurrency"]) == (ours.num_blocks, lay.bytes_per_block, ours.tokens, ours.concurrency)
        assert ours.tokens < kv.capacity(layout(length), PUBLISHED_POOL).tokens


def test_mtp_drafter_shares_the_targets_cache(docker_bin: str, image_ref: str) -> None:
    """Gemma 4 E2B's MTP drafter (its assistant checkpoint, 2 speculative tokens as vLLM's recipe gives them) on the
    QAT checkpoint: vLLM's Gemma 4 speculator points each of the drafter's 4 layers at the target's last owning layer
    of its type (13 sliding, 14 full), so the drafter owns no KV cache and vLLM plans exactly the target's figures, at
    every length."""
    lengths = (4096, 16384, 131072)
    runs = run_oracle(docker_bin, image_ref, "qat", lengths, [PUBLISHED_POOL], "--speculative", "mtp")
    for length in lengths:
        run = runs[length]
        assert (run["speculative_method"], run["num_speculative_tokens"]) == ("mtp", 2)
        drafter = run["drafter_layers"]
        assert [d["owns_kv"] for d in drafter] == [False] * 4
        assert [d["shares_kv_with"].split(".")[-3] for d in drafter] == ["13", "13", "13", "14"]
        assert run["max_in_flight_tokens"] == layout(length).in_flight_tokens
        theirs = run["pools"][0]
        if not theirs["fits"]:
            assert not kv.fits(layout(length), PUBLISHED_POOL)
            continue
        ours = kv.capacity(layout(length), PUBLISHED_POOL)
        assert (theirs["num_blocks"], theirs["kv_cache_size_tokens"], theirs["max_concurrency"]) == (
            ours.num_blocks, ours.tokens, ours.concurrency)
