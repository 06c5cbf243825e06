"""vLLM 0.33's KV accounting, one test per rule, and published-t4-run.md's bf16 T4 figures reproduced exactly."""

from __future__ import annotations

import pytest
from e2b_checkpoint import e2b_config

from t4serve.errors import ConfigError
from t4serve.planning import kvcache as kv

TEXT = e2b_config()["text_config"]


def layout(length: int = 16384, batched: int = 2048, **kw: object) -> kv.KVLayout:
    return kv.kv_layout(TEXT, dtype_bytes=2, max_model_len=length, max_num_batched_tokens=batched, **kw)  # type: ignore[arg-type]


def test_only_non_shared_layers_own_a_cache_with_their_head_dims() -> None:
    specs = kv.kv_cache_specs(TEXT, 2)
    assert [s.layer for s in specs] == list(range(15))
    assert [s.layer for s in specs if s.kind == "full"] == [4, 9, 14]
    assert {s.head_size for s in specs if s.kind == "full"} == {512}
    assert {(s.head_size, s.sliding_window) for s in specs if s.kind == "sliding"} == {(256, 512)}
    # published-t4-run.md: fp16 KV per token, 1,024 B per sliding layer and 2,048 B per full layer.
    assert {s.kind: s.bytes_per_token for s in specs} == {"sliding": 1024, "full": 2048}


def test_page_sizes_unify_by_growing_the_sliding_block() -> None:
    specs = kv.unify_kv_cache_spec_page_size(kv.kv_cache_specs(TEXT, 2))
    assert {s.page_size_bytes for s in specs} == {32768}
    assert {s.kind: s.block_size for s in specs} == {"sliding": 32, "full": 16}


def test_non_dividing_pages_are_padded_to_the_largest() -> None:
    # vLLM pads an attention page that does not divide the largest (page_size_padded) and keeps its block.
    specs = kv.unify_kv_cache_spec_page_size([kv.KVSpec(0, 16, 1, 96, 2), kv.KVSpec(1, 16, 1, 256, 2, 512)])
    assert [(s.block_size, s.page_size_bytes, s.page_size_padded) for s in specs] == [(16, 16384, 16384),
                                                                                     (16, 16384, None)]


@pytest.mark.parametrize(("cache_dtype", "sliding", "full"), [
    # TritonAttentionBackend.customize_spec: (head + head) x 1 B (int4: halves packed two a byte) + 2 x 4 B scales.
    ("int8_per_token_head", 2 * 256 + 8, 2 * 512 + 8),
    ("int4_per_token_head", 2 * 128 + 8, 2 * 256 + 8),
    ("fp8", 2 * 256, 2 * 512),
    ("auto", 2 * 256 * 2, 2 * 512 * 2),
])
def test_bytes_per_token_by_cache_dtype(cache_dtype: str, sliding: int, full: int) -> None:
    specs = kv.kv_cache_specs(TEXT, 2, cache_dtype=cache_dtype)
    assert {s.kind: s.bytes_per_token for s in specs} == {"sliding": sliding, "full": full}


@pytest.mark.parametrize(("cache_dtype", "block_bytes"), [("int8_per_token_head", 3 * 16 * 1032),
                                                          ("int4_per_token_head", 3 * 16 * 520)])
def test_per_token_head_sliding_pages_are_padded_not_doubled(cache_dtype: str, block_bytes: int) -> None:
    # 520 B and 1,032 B a token do not divide: the sliding groups keep 16-token blocks on padded pages, so a
    # 16,384-token request takes 4 x (ceil(4607/16) + 1) + 1024 blocks instead of fp16's 4 x 145 + 1024.
    lay = layout(cache_dtype=cache_dtype)
    assert lay.bytes_per_block == block_bytes
    assert {g.spec.kind: g.spec.block_size for g in lay.groups} == {"sliding": 16, "full": 16}
    assert lay.blocks_per_request_by_group == (289, 289, 289, 289, 1024)
    ratio = (layout().blocks_per_request * layout().bytes_per_block) / (lay.blocks_per_request * block_bytes)
    assert 1.4 < ratio < 3.0


def test_groups_of_the_smallest_bucket_strided() -> None:
    groups = kv.get_kv_cache_groups(kv.kv_cache_specs(TEXT, 2))
    assert [g.layers for g in groups] == [(0, 5, 10), (1, 6, 11), (2, 7, 12), (3, 8, 13), (4, 9, 14)]
    assert kv.bytes_per_block(groups) == 3 * 32768


def test_group_size_uses_largest_bucket_when_close() -> None:
    # 12 sliding + 13 full: 13 < 1.5 x 12, so groups of 13 (gpt-oss-style) with one padding slot.
    specs = [kv.KVSpec(i, 16, 1, 64, 2, 128) for i in range(12)] + [kv.KVSpec(12 + i, 16, 1, 64, 2) for i in range(13)]
    groups = kv.get_kv_cache_groups(specs)
    assert [len(g.layers) for g in groups] == [12, 13]
    assert kv.bytes_per_block(groups) == 13 * specs[0].page_size_bytes


def test_uniform_model_is_one_group() -> None:
    specs = [kv.KVSpec(i, 16, 8, 128, 2) for i in range(4)]
    assert [g.layers for g in kv.get_kv_cache_groups(specs)] == [(0, 1, 2, 3)]


def test_sliding_blocks_per_request_window_plus_in_flight() -> None:
    lay = layout()
    # async scheduling: 2 x 2048 in flight; sliding: ceil(min(511 + 4096, 16384) / 32) + 1 = 145; full: 16384/16.
    assert lay.in_flight_tokens == 4096
    assert lay.blocks_per_request_by_group == (145, 145, 145, 145, 1024)
    assert lay.blocks_per_request == 1604
    sync = layout(async_scheduling=False)
    assert sync.blocks_per_request_by_group[0] == -(-(511 + 2048) // 32) + 1


def test_sliding_hold_is_capped_by_max_model_len() -> None:
    lay = layout(length=1000)
    assert lay.blocks_per_request_by_group == (-(-1000 // 32) + 1,) * 4 + (-(-1000 // 16),)


def test_published_bf16_t4_pool_gives_logged_tokens_and_concurrency() -> None:
    lay = layout()
    low, high = kv.pool_bytes_range(lay, 315_974)
    # The exact pool vLLM's arithmetic implies: 30,934 blocks of 98,304 B = 3,040,935,936 B = 2.8321 GiB.
    assert (low, high) == (30_934 * 98_304, 30_935 * 98_304)
    assert round(low / 1024**3, 3) == 2.832
    for pool in (low, high - 1):
        cap = kv.capacity(lay, pool)
        assert cap.tokens == 315_974
        assert f"{cap.concurrency:.2f}" == "19.29"
    assert kv.capacity(lay, low - 1).tokens != 315_974


def test_fits_reserves_the_null_block() -> None:
    lay = layout()
    need = kv.min_pool_bytes(lay)
    assert need == 1605 * 98_304
    assert kv.fits(lay, need) and not kv.fits(lay, need - 1)


def test_estimate_max_model_len_binary_search() -> None:
    pool = kv.min_pool_bytes(layout(16384))
    assert kv.estimate_max_model_len(TEXT, pool, dtype_bytes=2, upper=131072, max_num_batched_tokens=2048) == 16384
    assert kv.estimate_max_model_len(TEXT, 98_304, dtype_bytes=2, upper=131072, max_num_batched_tokens=2048) == 0


def test_incomplete_config_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="lacks what KV cache sizing needs"):
        kv.kv_cache_specs({"hidden_size": 10}, 2)


def dense(**extra: object) -> dict[str, object]:
    """A dense decoder's text config (Phi-4-mini's shape: 32 layers, 24 query and 8 KV heads of 128)."""
    return {"num_hidden_layers": 32, "num_attention_heads": 24, "num_key_value_heads": 8, "hidden_size": 3072,
            **extra}


def test_model_level_window_without_layer_types_slides_every_layer() -> None:
    """vLLM sets CacheConfig.sliding_window when layer_types is absent, and every layer built without a window of its
    own takes it: Phi-4-mini's 262,144-token window makes each layer a sliding spec, one block more per request."""
    specs = kv.kv_cache_specs(dense(sliding_window=262144), 2)
    assert {s.kind for s in specs} == {"sliding"} and {s.sliding_window for s in specs} == {262144}
    lay = kv.kv_layout(dense(sliding_window=262144), dtype_bytes=2, max_model_len=16384, max_num_batched_tokens=2048)
    assert len(lay.groups) == 1 and lay.blocks_per_request == 16384 // 16 + 1
    full = kv.kv_layout(dense(), dtype_bytes=2, max_model_len=16384, max_num_batched_tokens=2048)
    assert full.blocks_per_request == 16384 // 16


def test_a_window_only_where_layer_types_say_sliding() -> None:
    all_full = dense(sliding_window=4096, layer_types=["full_attention"] * 32)
    assert {s.kind for s in kv.kv_cache_specs(all_full, 2)} == {"full"}
    all_sliding = dense(sliding_window=4096, layer_types=["sliding_attention"] * 32)
    assert {s.sliding_window for s in kv.kv_cache_specs(all_sliding, 2)} == {4096}
    # A window of 0 is "no window" (vLLM's ModelConfig turns it into None).
    assert {s.kind for s in kv.kv_cache_specs(dense(sliding_window=0), 2)} == {"full"}


def test_layers_of_other_kinds_are_refused_by_name() -> None:
    with pytest.raises(ConfigError, match="outside what t4serve sizes") as exc:
        kv.kv_cache_specs(dense(layer_types=["linear_attention", "full_attention"] * 16), 2)
    assert "linear_attention" in exc.value.found
    with pytest.raises(ConfigError, match="outside what t4serve sizes") as exc:
        kv.kv_cache_specs(dense(kv_lora_rank=512), 2)
    assert "MLA" in exc.value.found or "latent" in exc.value.found
    assert exc.value.fix is not None and "T4SERVE_KV_CACHE_MEMORY_BYTES=profile" in exc.value.fix


def test_disabled_hybrid_manager_allocates_sliding_layers_in_full() -> None:
    """--disable-hybrid-kv-cache-manager: E2B's 12 sliding layers are promoted to full attention, and with their
    256-wide heads the 15 layers form one group of per-layer pages (UniformTypeKVCacheSpecs)."""
    hybrid = layout(16384)
    flat = layout(16384, hybrid_kv_cache_manager=False)
    assert len(flat.groups) == 1 and flat.groups[0].uniform_type
    assert flat.bytes_per_block == 12 * 16384 + 3 * 32768
    assert flat.blocks_per_request == 16384 // 16
    per_request = (flat.blocks_per_request * flat.bytes_per_block, hybrid.blocks_per_request * hybrid.bytes_per_block)
    assert 1.85 < per_request[0] / per_request[1] < 1.95  # "almost 2x" the bytes per max-length request
    # A model of one kind is left as it is.
    one_kind = kv.kv_layout(dense(sliding_window=4096), dtype_bytes=2, max_model_len=16384,
                            max_num_batched_tokens=2048, hybrid_kv_cache_manager=False)
    assert {g.spec.kind for g in one_kind.groups} == {"sliding"}


def test_async_scheduling_and_block_size_move_the_sliding_groups() -> None:
    sync = layout(16384, async_scheduling=False)
    assert sync.in_flight_tokens == 2048
    assert sync.blocks_per_request_by_group[0] == -(-(511 + 2048) // 32) + 1
    big = layout(16384, block_size=32)
    assert big.bytes_per_block == 2 * layout(16384).bytes_per_block
    assert big.blocks_per_request_by_group[-1] == 16384 // 32
