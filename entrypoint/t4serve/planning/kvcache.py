"""vLLM 0.33's KV cache accounting, reproduced from config.json: specs, page unification, groups, blocks, capacity.

Pure arithmetic, mirroring (and named after) the functions in vllm/v1/core/kv_cache_planning.py, kv_cache_utils.py
and vllm/v1/kv_cache_interface.py, so `capacity(layout, pool)` gives the "GPU KV cache size: N tokens" and "Maximum
concurrency for L tokens per request: Nx" that vLLM logs for that pool. tests/oracle/kv_oracle.py checks it against
vLLM's own code.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from t4serve.errors import ConfigError

# vLLM's CacheConfig.block_size for the CUDA attention backends (Triton included): 16 tokens.
DEFAULT_BLOCK_SIZE = 16

# vLLM 0.33's `--kv-cache-dtype` values t4serve sizes -> (bytes per stored element, or None for the model dtype's;
# whether each K and V head row carries an inline float32 scale; elements packed per byte). The per-token-head modes
# (`KVQuantMode.is_per_token_head`) are laid out by the Triton backend's `customize_spec`: each (head, token) cell is
# (head_size + head_size_v) / packing bytes of data plus one 4-byte scale per side; `fp8` is per-tensor, 1 B each.
KV_CACHE_DTYPE_LAYOUTS: dict[str, tuple[int | None, bool, int]] = {
    "auto": (None, False, 1),
    "fp8": (1, False, 1),
    "int8_per_token_head": (1, True, 1),
    "int4_per_token_head": (1, True, 2),
}
# `TritonAttentionBackend.customize_spec`: get_dtype_size(torch.float32), once for K and once for V.
PER_TOKEN_HEAD_SCALE_BYTES = 4


def kv_content_bytes(head_size: int, dtype_bytes: int, cache_dtype: str = "auto") -> int:
    """Bytes one token of one KV head takes (K and V): `AttentionSpec.state_content_size_bytes`."""
    element, scaled, packing = KV_CACHE_DTYPE_LAYOUTS[cache_dtype]
    data = 2 * (head_size // packing) * (element or dtype_bytes)
    return data + (2 * PER_TOKEN_HEAD_SCALE_BYTES if scaled else 0)


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def max_in_flight_tokens(max_num_batched_tokens: int, async_scheduling: bool = True) -> int:
    """`VllmConfig.max_in_flight_tokens` = max_concurrent_batches x max_num_batched_tokens.

    `VllmConfig.max_concurrent_batches` is 2 with async scheduling (vLLM's default) and no pipeline parallelism, else 1.
    """
    return (2 if async_scheduling else 1) * max_num_batched_tokens


@dataclass(frozen=True)
class KVSpec:
    """One attention layer's KV cache spec: `FullAttentionSpec` or `SlidingWindowSpec` (kv_cache_interface.py)."""

    layer: int
    block_size: int
    num_kv_heads: int
    head_size: int
    dtype_bytes: int
    # None for full attention; the window in tokens for a sliding layer.
    sliding_window: int | None = None
    # vLLM's --kv-cache-dtype (a key of KV_CACHE_DTYPE_LAYOUTS); "auto" stores K and V in the model dtype.
    cache_dtype: str = "auto"
    # `AttentionSpec.page_size_padded`: set where page unification pads a page that does not divide the largest.
    page_size_padded: int | None = None

    @property
    def kind(self) -> str:
        return "full" if self.sliding_window is None else "sliding"

    @property
    def bytes_per_token(self) -> int:
        # K and V of every head (`AttentionSpec.state_content_size_bytes` x heads), scales included where inline.
        return self.num_kv_heads * kv_content_bytes(self.head_size, self.dtype_bytes, self.cache_dtype)

    @property
    def page_size_bytes(self) -> int:
        """`AttentionSpec.page_size_bytes`: heads x block_size x content bytes, or the padded page where set."""
        return self.page_size_padded or self.bytes_per_token * self.block_size

    def same_type(self, other: KVSpec) -> bool:
        """Equal except for the layer: the key `_get_kv_cache_groups_uniform_page_size` groups layers by."""
        return replace(self, layer=0) == replace(other, layer=0)

    def tokens_held(self, max_model_len: int, in_flight_tokens: int) -> int:
        """Tokens one request keeps cached in this layer at most."""
        if self.sliding_window is None:
            return max_model_len
        # `SlidingWindowSpec.max_admission_blocks_per_request`: the last window-1 computed tokens plus every token
        # scheduled but not yet settled, never more than max_model_len.
        return min(self.sliding_window - 1 + in_flight_tokens, max_model_len)

    def blocks_per_request(self, max_model_len: int, in_flight_tokens: int) -> int:
        """cdiv(max_memory_usage_bytes, page_size_bytes), as `get_max_concurrency_for_kv_cache_config` sums it."""
        held = self.tokens_held(max_model_len, in_flight_tokens)
        if self.sliding_window is None:
            return cdiv(held, self.block_size)  # `FullAttentionSpec.max_memory_usage_bytes`
        # +1: the window need not start on a block boundary.
        return cdiv(held, self.block_size) + 1


# Markers of layers vLLM gives another kind of KV cache (MLA latents, chunked local attention, Mamba/linear-attention
# state): t4serve's accounting covers full and sliding-window attention only, so such a model is refused by name.
UNMODELLED_KV_FIELDS = {
    "kv_lora_rank": "multi-head latent attention (MLAAttentionSpec)",
    "attention_chunk_size": "chunked local attention (ChunkedLocalAttentionSpec)",
    "layers_block_type": "Mamba/attention hybrid layers (MambaSpec)",
    "hybrid_override_pattern": "Mamba/attention hybrid layers (MambaSpec)",
    "mamba_d_state": "Mamba state (MambaSpec)",
    "linear_conv_kernel_dim": "linear-attention state (MambaSpec)",
}
ATTENTION_LAYER_TYPES = ("full_attention", "sliding_attention")


def _outside_the_model(what: str, found: str) -> ConfigError:
    return ConfigError(
        "the model's KV cache is outside what t4serve sizes",
        found=found,
        required="decoder layers of full or sliding-window attention (docs/sizing.md lists the families covered)",
        fix="set T4SERVE_KV_CACHE_MEMORY_BYTES=profile so vLLM sizes the pool itself, and set T4SERVE_MAX_MODEL_LEN "
            f"and T4SERVE_MAX_NUM_SEQS yourself ({what} is not modelled)",
    )


def kv_cache_specs(text: dict[str, Any], dtype_bytes: int, block_size: int = DEFAULT_BLOCK_SIZE,
                   cache_dtype: str = "auto") -> list[KVSpec]:
    """The specs vLLM's `Attention.get_kv_cache_spec` returns for a decoder's text config: only layers owning a cache.

    Which layers slide is vLLM's rule: a layer named "sliding_attention" in `layer_types` gets the config's
    `sliding_window`; a layer given no window of its own falls back to the model-level window
    (`CacheConfig.sliding_window`), which `EngineArgs.create_engine_config` sets only when `layer_types` is absent or
    all sliding. So a model-level `sliding_window` without `layer_types` (Phi-4-mini, Mistral 7B) slides on every
    layer, and a `sliding_window` of 0 means none (`ModelConfig`). Gemma 4: KV-shared layers (the last
    `num_kv_shared_layers`) read another layer's cache and return no spec; full-attention layers use
    `global_head_dim` (and `num_global_key_value_heads` where `attention_k_eq_v`), sliding layers `head_dim`.
    """
    for key, what in UNMODELLED_KV_FIELDS.items():
        if text.get(key) is not None:
            raise _outside_the_model(what, f"config.json sets {key}: {what}")
    try:
        layers = int(text["num_hidden_layers"])
        named_types = text.get("layer_types")
        layer_types = list(named_types) if named_types else ["full_attention"] * layers
        heads = layer_heads(text)
    except (KeyError, TypeError, ValueError, ZeroDivisionError) as exc:
        raise ConfigError(
            "the model's config.json lacks what KV cache sizing needs",
            found=f"text config without a usable {exc}",
            required="num_hidden_layers, num_attention_heads, hidden_size or head_dim (a decoder-only LM config)",
            fix="point T4SERVE_MODEL at a complete checkpoint, or set T4SERVE_KV_CACHE_MEMORY_BYTES and "
                "T4SERVE_MAX_MODEL_LEN yourself",
        ) from exc
    unknown = sorted({t for t in layer_types if t not in ATTENTION_LAYER_TYPES})
    if unknown:
        raise _outside_the_model(f"layer type {unknown[0]}",
                                 f"layer_types names {', '.join(unknown)} (t4serve knows "
                                 f"{' and '.join(ATTENTION_LAYER_TYPES)})")
    window = int(text.get("sliding_window") or 0) or None
    # `EngineArgs.create_engine_config`: the model-level window only when no layer type says otherwise.
    model_window = window if not named_types or all(t == "sliding_attention" for t in layer_types) else None
    owning = layers - int(text.get("num_kv_shared_layers") or 0)
    specs = []
    for i in range(owning):
        own_window = window if layer_types[i] == "sliding_attention" else None
        effective = own_window or model_window
        # A sliding layer's own block (`_largest_kernel_block_within`) is the planned block on every backend t4serve
        # plans for (kvflags.MODELLED_BLOCK_SIZES): its page budget is its own page at that block.
        specs.append(KVSpec(i, block_size, heads[i][0], heads[i][1], dtype_bytes, effective, cache_dtype))
    return specs


def layer_heads(text: dict[str, Any]) -> list[tuple[int, int]]:
    """(KV heads, head size) of each decoder layer, as vLLM's attention layers get them.

    A config read through vLLM's reader lists per-layer values where they differ (`layer_overrides`, from
    transformers' `per_layer_config`: Gemma 4's 512-wide global heads); a config.json as written says it with
    Gemma 4's `global_head_dim` (and `num_global_key_value_heads` where `attention_k_eq_v`) for full-attention layers.
    Otherwise every layer has `num_key_value_heads` heads of `head_dim` (hidden_size / num_attention_heads).
    """
    layers = int(text["num_hidden_layers"])
    layer_types = list(text.get("layer_types") or ["full_attention"] * layers)
    head_dim = int(text.get("head_dim") or int(text["hidden_size"]) // int(text["num_attention_heads"]))
    kv_heads = int(text.get("num_key_value_heads") or text["num_attention_heads"])
    global_head = int(text.get("global_head_dim") or head_dim)
    global_kv_heads = kv_heads
    if text.get("attention_k_eq_v") and text.get("num_global_key_value_heads"):
        global_kv_heads = int(text["num_global_key_value_heads"])
    overrides = text.get("layer_overrides")
    out = []
    for i in range(layers):
        full = layer_types[i] != "sliding_attention"
        heads, head = (global_kv_heads, global_head) if full else (kv_heads, head_dim)
        if isinstance(overrides, list) and i < len(overrides) and isinstance(overrides[i], dict):
            heads = int(overrides[i].get("num_key_value_heads") or heads)
            head = int(overrides[i].get("head_dim") or head)
        out.append((heads, head))
    return out


def head_sizes(text: dict[str, Any]) -> list[int]:
    """The distinct attention head sizes of the decoder's layers (Gemma 4: 256 and 512); where the config is too
    sparse for `layer_heads`, the sizes it declares (`head_dim`, `global_head_dim`), else none."""
    try:
        return sorted({head for _heads, head in layer_heads(text)})
    except (KeyError, TypeError, ValueError, ZeroDivisionError):
        declared = (text.get(key) for key in ("head_dim", "global_head_dim"))
        return sorted({v for v in declared if isinstance(v, int) and not isinstance(v, bool) and v > 0})


def unify_kv_cache_spec_page_size(specs: list[KVSpec]) -> list[KVSpec]:
    """`unify_kv_cache_spec_page_size`: a smaller page that divides the largest grows its block size by the ratio; one
    that does not (Gemma 4's 256- and 512-wide heads with per-token-head scales: 520 and 1,032 B a token) keeps its
    block and is padded to the largest page (`page_size_padded`), as vLLM does for attention layers other than MLA."""
    largest = max(s.page_size_bytes for s in specs)
    out = []
    for s in specs:
        if s.page_size_bytes == largest:
            out.append(s)
        elif largest % s.page_size_bytes == 0:
            out.append(replace(s, block_size=s.block_size * (largest // s.page_size_bytes)))
        else:
            out.append(replace(s, page_size_padded=largest))
    return out


@dataclass(frozen=True)
class KVGroup:
    """A KV cache group: layers sharing one block table (`KVCacheGroupSpec`), each with its own spec.

    The specs are identical but for the layer in the usual case; in a `UniformTypeKVCacheSpecs` group (one attention
    type, different page sizes: Gemma 4 with the hybrid manager disabled) each layer keeps its own page.
    """

    specs: tuple[KVSpec, ...]

    @property
    def spec(self) -> KVSpec:
        """The group's representative spec (its first layer's)."""
        return self.specs[0]

    @property
    def layers(self) -> tuple[int, ...]:
        return tuple(s.layer for s in self.specs)

    @property
    def uniform_type(self) -> bool:
        """Layers of one attention type with differing pages (`UniformTypeKVCacheSpecs`)."""
        return len({s.page_size_bytes for s in self.specs}) > 1

    @property
    def block_bytes(self) -> int:
        return sum(s.page_size_bytes for s in self.specs)

    def blocks_per_request(self, max_model_len: int, in_flight_tokens: int) -> int:
        """cdiv(max_memory_usage_bytes, page_size_bytes) of the group's spec; a uniform-type group's is the largest of
        its layers' (`UniformTypeKVCacheSpecs.max_memory_usage_bytes`)."""
        return max(s.blocks_per_request(max_model_len, in_flight_tokens) for s in self.specs)


def promote_local_kv_cache_specs(specs: list[KVSpec]) -> list[KVSpec]:
    """`--disable-hybrid-kv-cache-manager` (`unify_hybrid_kv_cache_specs`): where full and sliding layers mix, every
    sliding layer is allocated as full attention (blocks for all tokens) at the full layers' block size; a model of
    one kind is left as it is."""
    kinds = {s.kind for s in specs}
    if kinds != {"full", "sliding"}:
        return specs
    full_blocks = {s.block_size for s in specs if s.kind == "full"}
    block = next(iter(full_blocks)) if len(full_blocks) == 1 else None
    return [replace(s, sliding_window=None, block_size=block or s.block_size) for s in specs]


def _uniform_type(specs: list[KVSpec]) -> bool:
    """`UniformTypeKVCacheSpecs.is_uniform_type`: one block size, and all full or all sliding with one window."""
    return (len({s.block_size for s in specs}) == 1
            and len({s.kind for s in specs}) == 1
            and len({s.sliding_window for s in specs}) == 1)


def get_kv_cache_groups(specs: list[KVSpec], hybrid_kv_cache_manager: bool = True) -> list[KVGroup]:
    """`get_kv_cache_groups` for attention-only specs.

    With the hybrid manager disabled, mixed full and sliding layers are promoted to full attention first. Identical
    specs make one group (`_get_kv_cache_groups_uniform_spec`); one attention type with differing pages makes one
    group of per-layer pages (`_get_kv_cache_groups_uniform_type`); otherwise (`_get_kv_cache_groups_uniform_page_size`)
    pages are unified, layers bucketed by spec type in layer order, the group size is the smallest bucket (or the
    largest when it is under 1.5x the smallest), and each bucket splits into cdiv(len, size) groups taking
    layers[i::num_groups].
    """
    if not specs:
        return []
    if not hybrid_kv_cache_manager:
        specs = promote_local_kv_cache_specs(specs)
    if all(s.same_type(specs[0]) for s in specs) or _uniform_type(specs):
        return [KVGroup(tuple(specs))]
    specs = unify_kv_cache_spec_page_size(specs)
    buckets: list[list[KVSpec]] = []
    for s in specs:
        for bucket in buckets:
            if bucket[0].same_type(s):
                bucket.append(s)
                break
        else:
            buckets.append([s])
    smallest = min(len(b) for b in buckets)
    largest = max(len(b) for b in buckets)
    group_size = largest if largest < smallest * 1.5 else smallest
    groups = []
    for bucket in buckets:
        num_groups = cdiv(len(bucket), group_size)
        for i in range(num_groups):
            groups.append(KVGroup(tuple(bucket[i::num_groups])))
    return groups


def bytes_per_block(groups: list[KVGroup]) -> int:
    """`_get_kv_cache_bytes_per_block` (layer-outer layout): the largest group's sum of its layers' pages.

    Groups alias the same memory, so one block id costs the widest group's bytes. Pages need no alignment padding
    at the block sizes t4serve passes (the backends' kernel blocks divide them: `KVCacheSpec.get_block_stride_alignment`
    is 1).
    """
    return max(g.block_bytes for g in groups)


@dataclass(frozen=True)
class KVLayout:
    """Everything about a model's KV cache that does not depend on the pool size."""

    specs: tuple[KVSpec, ...]
    groups: tuple[KVGroup, ...]
    bytes_per_block: int
    max_model_len: int
    in_flight_tokens: int
    # Blocks one max-length request takes from the shared pool, per group (summed by vLLM).
    blocks_per_request_by_group: tuple[int, ...]

    @property
    def blocks_per_request(self) -> int:
        return sum(self.blocks_per_request_by_group)

    @property
    def kv_bytes_per_token(self) -> int:
        """Bytes one token's K and V take across the owning layers (before block rounding and unification)."""
        return sum(s.bytes_per_token for s in self.specs)

    def describe(self) -> str:
        parts = []
        for g, blocks in zip(self.groups, self.blocks_per_request_by_group, strict=True):
            held = g.spec.tokens_held(self.max_model_len, self.in_flight_tokens)
            pages = (f" (pages {'+'.join(str(p.page_size_bytes) for p in g.specs)} B in one block)"
                     if g.uniform_type else "")
            if g.spec.page_size_padded is not None:
                pages += (f" (page {g.spec.bytes_per_token * g.spec.block_size:,} B padded to "
                          f"{g.spec.page_size_padded:,} B)")
            rule = (f"ceil({held}/{g.spec.block_size})" if g.spec.sliding_window is None
                    else f"ceil(min({g.spec.sliding_window}-1+{self.in_flight_tokens}, {self.max_model_len})"
                         f"/{g.spec.block_size})+1")
            parts.append(f"{g.spec.kind} layers {list(g.layers)}{pages}: {rule} = {blocks}")
        return (f"{len(self.groups)} groups, block = {self.bytes_per_block:,} B; blocks per {self.max_model_len}-token "
                f"request: " + "; ".join(parts) + f"; total {self.blocks_per_request}")


def kv_layout(text: dict[str, Any], *, dtype_bytes: int, max_model_len: int, max_num_batched_tokens: int,
              async_scheduling: bool = True, block_size: int = DEFAULT_BLOCK_SIZE,
              hybrid_kv_cache_manager: bool = True, cache_dtype: str = "auto") -> KVLayout:
    specs = kv_cache_specs(text, dtype_bytes, block_size, cache_dtype)
    if not specs:
        raise ConfigError(
            "the model has no KV cache layers", found="0 attention layers own a KV cache",
            required="a decoder with attention layers", fix="check T4SERVE_MODEL",
        )
    groups = get_kv_cache_groups(specs, hybrid_kv_cache_manager)
    in_flight = max_in_flight_tokens(max_num_batched_tokens, async_scheduling)
    return KVLayout(
        specs=tuple(specs),
        groups=tuple(groups),
        bytes_per_block=bytes_per_block(groups),
        max_model_len=max_model_len,
        in_flight_tokens=in_flight,
        blocks_per_request_by_group=tuple(g.blocks_per_request(max_model_len, in_flight) for g in groups),
    )


@dataclass(frozen=True)
class Capacity:
    pool_bytes: int
    num_blocks: int
    concurrency: float
    tokens: int


def capacity(layout: KVLayout, pool_bytes: int) -> Capacity:
    """`get_kv_cache_config_from_groups` (num_blocks = pool // bytes per block) and `get_kv_cache_capacity`.

    concurrency = num_blocks / blocks per max-length request (`get_max_concurrency_for_kv_cache_config`),
    tokens = int(concurrency x max_model_len): what vLLM logs as "GPU KV cache size".
    """
    num_blocks = pool_bytes // layout.bytes_per_block
    concurrency = num_blocks / layout.blocks_per_request
    return Capacity(pool_bytes, num_blocks, concurrency, int(concurrency * layout.max_model_len))


def fits(layout: KVLayout, pool_bytes: int) -> bool:
    """`_check_enough_kv_cache_memory` after `get_kv_cache_configs` holds back the null block: one request must fit."""
    return pool_bytes - layout.bytes_per_block >= layout.blocks_per_request * layout.bytes_per_block


def min_pool_bytes(layout: KVLayout) -> int:
    """The smallest pool vLLM accepts: one max-length request plus the null block."""
    return (layout.blocks_per_request + 1) * layout.bytes_per_block


def pool_bytes_range(layout: KVLayout, tokens: int) -> tuple[int, int]:
    """[low, high): the pools for which vLLM reports exactly `tokens`; empty (low == high) when none does."""
    # tokens = floor(num_blocks x L / B): the least num_blocks with num_blocks x L >= tokens x B, then up while equal.
    per = layout.blocks_per_request
    low_blocks = cdiv(tokens * per, layout.max_model_len)
    high_blocks = low_blocks
    while (high_blocks * layout.max_model_len) // per == tokens:
        high_blocks += 1
    if (low_blocks * layout.max_model_len) // per != tokens:
        return low_blocks * layout.bytes_per_block, low_blocks * layout.bytes_per_block
    return low_blocks * layout.bytes_per_block, high_blocks * layout.bytes_per_block


def fit_max_model_len(layout_for: Callable[[int], KVLayout], pool_bytes: int, upper: int) -> int:
    """`_estimate_max_model_len_from_groups`: the largest max_model_len <= upper whose one request fits the pool
    (binary search, as vLLM's), 0 if none. `layout_for(length)` is the layout at that length."""
    if not fits(layout_for(1), pool_bytes):
        return 0
    left, right, best = 1, upper, 1
    while left <= right:
        mid = (left + right) // 2
        if fits(layout_for(mid), pool_bytes):
            best, left = mid, mid + 1
        else:
            right = mid - 1
    return best


def estimate_max_model_len(text: dict[str, Any], pool_bytes: int, *, dtype_bytes: int, upper: int,
                           max_num_batched_tokens: int, async_scheduling: bool = True,
                           block_size: int = DEFAULT_BLOCK_SIZE, hybrid_kv_cache_manager: bool = True,
                           cache_dtype: str = "auto") -> int:
    """`fit_max_model_len` for fixed batched tokens and flags."""

    def layout_for(length: int) -> KVLayout:
        return kv_layout(text, dtype_bytes=dtype_bytes, max_model_len=length,
                         max_num_batched_tokens=max_num_batched_tokens, async_scheduling=async_scheduling,
                         block_size=block_size, hybrid_kv_cache_manager=hybrid_kv_cache_manager,
                         cache_dtype=cache_dtype)

    return fit_max_model_len(layout_for, pool_bytes, upper)
