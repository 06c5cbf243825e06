"""T4SERVE_SPECULATIVE planned: the `--speculative-config` vLLM 0.34 gets and what the drafter adds to the card.

`speculation(settings, facts)` resolves the setting (a ConfigError names what cannot draft: a model without a drafter,
a drafter that cannot draft for it); `drafter_gpu(...)` gives the drafter's bytes on the GPU, each with its
arithmetic. What vLLM 0.34 does with Gemma 4's drafter (`Gemma4Speculator`, checked by tests/oracle): it loads the
assistant beside the target in the same "Model loading" step, replaces its input embedding by the target's, keeps its
own tied 256-wide embedding as its output layer, points each of its layers at the KV cache of the target's last owning
layer of the same attention type (it owns no KV cache, so the KV figures are the target's own), and hands it the
target's rotary caches where their parameters are equal. `ngram` (vLLM's `ngram_gpu`) loads nothing. Pure.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from t4serve.config.settings import Settings
from t4serve.errors import ConfigError
from t4serve.facts import Facts, ModelFacts
from t4serve.planning import kvcache
from t4serve.planning.weights import weights_in_gpu
from t4serve.probes.drafter import choose_drafter
from t4serve.units import GIB, MIB

# vLLM's method names for T4SERVE_SPECULATIVE: `mtp` (vLLM turns a Gemma 4 assistant into `Gemma4MTPModel`) and
# `ngram_gpu` (the n-gram proposer on the GPU, the one checked against vLLM's planner).
VLLM_METHODS = {"mtp": "mtp", "ngram": "ngram_gpu"}
# The text model type of the targets Gemma 4's speculator wires a drafter into (layer types, KV-shared layers).
GEMMA4_TEXT = "gemma4_text"
# vLLM's `_CACHE_ONLY_ROPE_TYPES`: where max_position_embeddings only sizes the rotary cache, vLLM raises a drafter's
# below the target's max_model_len to it (`_maybe_override_draft_max_position_embeddings`).
CACHE_ONLY_ROPE_TYPES = ("default", "linear", "llama3", "ntk", "proportional")


@dataclass(frozen=True)
class Speculation:
    """T4SERVE_SPECULATIVE resolved: vLLM's method, tokens per step, and for `mtp` the drafter and how it was
    chosen."""

    mode: str
    num_speculative_tokens: int
    drafter: ModelFacts | None = None
    chosen_by: str = ""

    @property
    def drafter_arg(self) -> str | None:
        """What `--speculative-config`'s model gets: the local directory when found, else the repo id vLLM downloads."""
        if self.drafter is None:
            return None
        return self.drafter.local_path or self.drafter.requested

    def config(self) -> dict[str, Any]:
        config: dict[str, Any] = {"method": VLLM_METHODS[self.mode]}
        if self.drafter_arg is not None:
            config["model"] = self.drafter_arg
        config["num_speculative_tokens"] = self.num_speculative_tokens
        return config

    def argv(self) -> list[str]:
        return ["--speculative-config", json.dumps(self.config())]

    def describe(self) -> str:
        tokens = f"{self.num_speculative_tokens} tokens drafted per step"
        if self.drafter is None:
            return f"{self.mode}: vLLM's {VLLM_METHODS[self.mode]} (no draft model), {tokens}"
        return f"{self.mode}: {self.drafter.requested} ({self.drafter.source}; {self.chosen_by}), {tokens}"


def _refusal(what: str, found: str, required: str, fix: str) -> ConfigError:
    return ConfigError(f"T4SERVE_SPECULATIVE=mtp: {what}", found=found, required=required, fix=fix)


def speculation(settings: Settings, facts: Facts) -> Speculation | None:
    """T4SERVE_SPECULATIVE for this model: None when off; a ConfigError for a model without a drafter, a drafter that
    was not probed or cannot be read, or one that cannot draft for this model."""
    if settings.speculative == "off":
        return None
    if settings.speculative == "ngram":
        return Speculation("ngram", settings.num_speculative_tokens)
    choice = choose_drafter(settings, facts.model)
    other_ways = "set T4SERVE_SPECULATIVE=ngram (no draft model) or off"
    if choice.target is None:
        raise _refusal(f"{settings.model.requested} has no drafter", choice.how,
                       "a model with a Gemma 4 assistant drafter (qat, bf16: " + "e2b-assistant), or "
                       "T4SERVE_DRAFT_MODEL naming one that drafts for it",
                       f"set T4SERVE_DRAFT_MODEL to its drafter's checkpoint, or {other_ways}")
    drafter = facts.drafter
    if drafter is None or drafter.requested != choice.target:
        raise _refusal("the drafter was not probed", f"{choice.target} ({choice.how}) is not in the facts",
                       "the drafter's checkpoint probed beside the model (`t4serve probe` records both)",
                       "record the facts again with T4SERVE_SPECULATIVE=mtp set, or plan without --facts")
    if drafter.source == "invalid":
        raise _refusal(f"cannot read the drafter {choice.target}", drafter.error or "the probe could not read it",
                       "config.json and readable safetensors headers of a Gemma 4 assistant",
                       f"point T4SERVE_DRAFT_MODEL at a complete drafter checkpoint, or {other_ways}")
    _check_drafts_for(settings, facts.model, drafter)
    return Speculation("mtp", settings.num_speculative_tokens, drafter, choice.how)


def _check_drafts_for(settings: Settings, model: ModelFacts | None, drafter: ModelFacts) -> None:
    """The drafter can draft for this target as vLLM 0.34 wires it: a Gemma 4 target, the drafter's projections at
    the target's width, and for each of its layers' attention types a target layer owning a KV cache of that type
    (vLLM would otherwise leave the layer without one to read and give it its own)."""
    target = model.config.get("text") if model is not None else None
    text = drafter.config.get("text")
    if not isinstance(target, dict) or not isinstance(text, dict):
        raise _refusal("the model's or the drafter's config is missing", f"{settings.model.requested}, "
                       f"{drafter.requested}", "both config.json files read",
                       "point T4SERVE_MODEL and T4SERVE_DRAFT_MODEL at complete checkpoints")
    fix = ("unset T4SERVE_DRAFT_MODEL to use the model's own drafter, or serve the model this drafter was trained "
           "for")
    if target.get("model_type") != GEMMA4_TEXT:
        raise _refusal(f"{drafter.requested} drafts for Gemma 4 models only",
                       f"{settings.model.requested}: text model type {target.get('model_type')}",
                       "a Gemma 4 model, whose KV cache vLLM's Gemma 4 speculator points the drafter's layers at",
                       fix)
    backbone = drafter.config.get("backbone_hidden_size")
    if backbone != target.get("hidden_size"):
        raise _refusal(f"{drafter.requested} was made for a model {backbone} wide",
                       f"{settings.model.requested}: hidden size {target.get('hidden_size')}",
                       "the drafter's backbone_hidden_size equal to the model's hidden_size (its projections read "
                       "and write the model's hidden states)", fix)
    owned = {("sliding_attention" if spec.sliding_window else "full_attention")
             for spec in kvcache.kv_cache_specs(target, 2)}
    wanted = set(text.get("layer_types") or ["full_attention"])
    if not wanted <= owned:
        missing = ", ".join(sorted(wanted - owned))
        raise _refusal(f"{drafter.requested} has {missing} layers the model has no KV cache of",
                       f"the model's layers owning a KV cache: {', '.join(sorted(owned))}",
                       "a target layer owning a KV cache of each of the drafter's attention types", fix)


@dataclass(frozen=True)
class DrafterGpu:
    """What the drafter holds on the GPU: weights (vLLM's "Model loading" counts them), rotary caches the target does
    not already hold, and the activation of its forward beside the target's hidden states."""

    weights: int
    rotary: int
    activation: int
    how: str

    @property
    def loaded(self) -> int:
        return self.weights + self.rotary


def _rope_keys(text: dict[str, Any], max_position: int) -> dict[str, tuple[Any, ...]]:
    """vLLM's `get_rope` cache key per attention type of a Gemma 4 text config, less the dtype both share: the head
    size, the cache length and the rope parameters in their written order (vLLM keys on the items in order, so the
    same parameters listed in another order make a second cache)."""
    rope = text.get("rope_parameters") or {}
    keys = {}
    for heads_spec, layer_type in zip(kvcache.layer_heads(text), text.get("layer_types") or [], strict=False):
        params = rope.get(layer_type, rope) if isinstance(rope, dict) else {}
        items = tuple((k, tuple(v) if isinstance(v, list) else v) for k, v in params.items()) if isinstance(
            params, dict) else ()
        keys[layer_type] = (heads_spec[1], max_position, items)
    return keys


def drafter_rotary(target: dict[str, Any], text: dict[str, Any], max_model_len: int,
                   dtype_bytes: int) -> tuple[int, str]:
    """The drafter's rotary caches the target does not hold already: vLLM builds one per key (`get_rope`'s cache)
    and hands both models the same cache where the keys are equal."""
    target_keys = set(_rope_keys(target, int(target.get("max_position_embeddings") or 0)).values())
    max_position = int(text.get("max_position_embeddings") or 0)
    rope = text.get("rope_parameters") or {}
    types = [p.get("rope_type", "default") for p in (rope.values() if all(isinstance(p, dict) for p in rope.values())
                                                      else [rope])] if isinstance(rope, dict) else []
    if max_position < max_model_len and all(t in CACHE_ONLY_ROPE_TYPES for t in types):
        max_position = max_model_len
    own = {key for key in _rope_keys(text, max_position).values() if key not in target_keys}
    total = sum(position * head * dtype_bytes for head, position, _items in own)
    if not own:
        return 0, "rotary caches: the target's (the same head sizes, length and rope parameters)"
    sizes = " + ".join(f"{position:,} x {head}" for head, position, _items in sorted(own, key=str))
    return total, f"rotary caches of its own ({sizes}) x {dtype_bytes} B"


def drafter_gpu(drafter: ModelFacts, target: dict[str, Any], *, max_model_len: int, batched_tokens: int,
                dtype_bytes: int) -> DrafterGpu:
    """The drafter's GPU bytes: weights from its headers (held in the model dtype), the rotary caches it does not
    share, and its forward over the batched tokens (vLLM's profile and prefill steps draft over every scheduled
    token): its input (the token embedding beside the target's hidden state, 2 x backbone), the backbone-width state it
    feeds back, 3 x MLP + 4 x hidden + its queries per layer, and the speculator's hidden-state buffer."""
    text: dict[str, Any] = drafter.config["text"]
    weights, weights_how = weights_in_gpu(drafter, dtype_bytes)
    rotary, rotary_how = drafter_rotary(target, text, max_model_len, dtype_bytes)
    backbone = int(drafter.config.get("backbone_hidden_size") or text["hidden_size"])
    hidden, mlp = int(text["hidden_size"]), int(text.get("intermediate_size") or 0)
    queries = int(text["num_attention_heads"]) * max(kvcache.head_sizes(text) or [0])
    per_token = 2 * backbone + backbone + 3 * mlp + 4 * hidden + queries
    forward = batched_tokens * dtype_bytes * per_token
    buffer = batched_tokens * backbone * dtype_bytes
    how = (f"drafter weights {weights / MIB:.1f} MiB ({weights_how}); {rotary_how}; its forward {batched_tokens} "
           f"tokens x {dtype_bytes} B x (3 x {backbone} backbone + 3 x {mlp} MLP + 4 x {hidden} hidden + {queries} "
           f"queries) = {forward / MIB:.1f} MiB + the speculator's hidden-state buffer {buffer / MIB:.1f} MiB")
    return DrafterGpu(weights, rotary, forward + buffer, how)


def drafter_summary(gpu: DrafterGpu) -> str:
    return f"{(gpu.loaded + gpu.activation) / GIB:.4f} GiB ({gpu.how})"
