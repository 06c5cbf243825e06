"""The model probe: resolve a checkpoint, read config.json and every safetensors header, group bytes by part and dtype.

`probe_model(target, hf_home=..., offline=...) -> ModelFacts` never reads tensor data and never raises for a bad
checkpoint: a missing config.json, a malformed header or a truncated file is a fact (source "invalid", `error` naming
the file and the problem). Every file is untrusted input (t4serve.untrusted): bounded size and nesting, numbers the
planner uses checked, header offsets checked against the file, each other and dtype x shape, and names from the index
or refs/main kept inside the checkout or the cache. Not local: headers are read remotely when the hub is reachable,
else the built-in facts of the two aliases (source "builtin", provenance in config["provenance"]) or a clean
"not-local" fact. The target is what the settings resolved (`Settings.model.target`: an alias is expanded there,
once): a repo id or a directory, never an alias.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import struct
from collections import defaultdict
from importlib import resources
from pathlib import Path
from typing import Any

from t4serve.config.aliases import BF16_REPO, E2B_ASSISTANT_REPO, QAT_REPO
from t4serve.facts import ModelFacts, TensorGroup
from t4serve.probes import configdefaults, hfconfig
from t4serve.untrusted import (
    Untrusted,
    check_int,
    check_relative_name,
    is_inside,
    load_json_file,
    loads_json,
    open_regular,
    read_text_bounded,
)

# The repo ids of the two aliases, whose facts ship with the package for planning before a download.
BUILTIN_MODELS: dict[str, str] = {
    BF16_REPO: "gemma-4-E2B-it.json",
    QAT_REPO: "gemma-4-E2B-it-qat-w4a16-ct.json",
    E2B_ASSISTANT_REPO: "gemma-4-E2B-it-assistant.json",
}
# What a checkpoint is probed as: the model to serve, or the drafter T4SERVE_SPECULATIVE=mtp adds beside it; a
# drafter is one of Gemma 4's assistants, which vLLM 0.34 turns into `Gemma4MTPModel` (`hf_config_override`).
ROLE_MODEL, ROLE_DRAFTER = "model", "drafter"
DRAFTER_MODEL_TYPES = ("gemma4_assistant",)

# The ModelFacts.config key naming how the text config was read: t4serve's table of transformers' defaults
# (t4serve.probes.configdefaults) or vLLM's reader (t4serve.probes.hfconfig); either way the class's attributes.
CONFIG_READ_BY = "config_read_by"

# Parts the checkpoint's bytes are grouped into (TensorGroup.part). What a decode step reads is decided from these in
# t4serve.planning.roofline; what vLLM keeps in GPU memory in t4serve.planning.sizing.
PART_TEXT_DECODER = "text_decoder"
PART_EMBEDDING = "embedding"  # token embedding, also the output layer when tied
PART_OUTPUT_LAYER = "output_layer"  # an untied lm_head
PART_PER_LAYER_EMBEDDING = "per_layer_embedding"  # the PLE table: a row lookup per token
PART_PER_LAYER_PROJECTION = "per_layer_projection"  # the PLE projections, gates and their norms
PART_KV_SHARED_DROPPED = "kv_shared_dropped"  # K/V weights of KV-shared layers that vLLM drops at load
PART_VISION = "vision_tower"
PART_AUDIO = "audio_tower"
PART_OTHER = "other"
PARTS = (PART_TEXT_DECODER, PART_EMBEDDING, PART_OUTPUT_LAYER, PART_PER_LAYER_EMBEDDING, PART_PER_LAYER_PROJECTION,
         PART_KV_SHARED_DROPPED, PART_VISION, PART_AUDIO, PART_OTHER)

# A safetensors header above this is not a header (the format caps it at 100 MB).
MAX_HEADER_BYTES = 100 * 1000 * 1000
# config.json of a multimodal model is tens of KB; an index lists a few thousand tensors (80 B each).
MAX_CONFIG_BYTES = 4 * 1000 * 1000
MAX_INDEX_BYTES = 16 * 1000 * 1000
# Bounds on the work across one checkpoint's files, not only per file, so `plan` answers within seconds whatever the
# files hold: Gemma 4 E2B has about 2,000 tensors in one file, the largest open MoE checkpoints about 100,000 in 163
# shards (far past any GPU t4serve plans for; a GPTQ MoE of 30B parameters, about 75,000), their headers about 100 B
# a tensor. Each tensor costs the probe tens of microseconds, each header byte tens of nanoseconds: 50,000 tensors
# and 32 MB of headers keep `plan` within 10 s on a loaded 2-core machine (scripts/bench-hostile-plan prints it).
MAX_TENSORS = 50_000
MAX_SHARDS = 1000
MAX_TOTAL_HEADER_BYTES = 32 * 1000 * 1000
# Bits per element of every safetensors dtype (safetensors' Dtype enum); any other dtype is refused.
DTYPE_BITS: dict[str, int] = {
    "BOOL": 8, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8, "F8_E8M0": 8, "I16": 16, "U16": 16, "F16": 16,
    "BF16": 16, "I32": 32, "U32": 32, "F32": 32, "C64": 64, "F64": 64, "I64": 64, "U64": 64, "F4": 4,
    "F6_E2M3": 6, "F6_E3M2": 6,
}
# Integers of the text config that sizing, the KV cache and the roofline compute with: (smallest, largest). Bounds
# far beyond any real model, small enough that no product of them overflows a float.
TEXT_INTS: dict[str, tuple[int, int]] = {
    "num_hidden_layers": (1, 4096),
    "num_attention_heads": (1, 4096),
    "num_key_value_heads": (1, 4096),
    "num_global_key_value_heads": (1, 4096),
    "head_dim": (1, 65536),
    "global_head_dim": (1, 65536),
    "hidden_size": (1, 1 << 20),
    "intermediate_size": (1, 1 << 22),
    "vocab_size": (1, 1 << 24),
    "max_position_embeddings": (1, 1 << 24),
    "sliding_window": (1, 1 << 24),
    "hidden_size_per_layer_input": (0, 1 << 20),
    "num_kv_shared_layers": (0, 4096),
}
_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")


class CheckpointError(Exception):
    """A checkpoint file that cannot be read; `probe_model` turns it into an "invalid" fact."""


class Budget:
    """What is left of one checkpoint's bounds on work (MAX_TENSORS, MAX_TOTAL_HEADER_BYTES) as its files are read."""

    def __init__(self) -> None:
        self.tensors = MAX_TENSORS
        self.header_bytes = MAX_TOTAL_HEADER_BYTES

    def take_bytes(self, path: Path, length: int) -> None:
        if length > self.header_bytes:
            raise CheckpointError(
                f"{path}: its header of {length:,} bytes passes the {MAX_TOTAL_HEADER_BYTES:,} bytes of headers "
                "t4serve reads for one checkpoint (all files together)"
            )
        self.header_bytes -= length

    def take_tensors(self, path: Path | str, count: int, what: str = "tensors") -> None:
        if count > self.tensors:
            raise CheckpointError(
                f"{path}: {what} pass the {MAX_TENSORS:,} tensors t4serve reads for one checkpoint (all files "
                f"together; {MAX_TENSORS - self.tensors:,} before this file)"
            )
        self.tensors -= count


def read_safetensors_header(path: Path, budget: Budget | None = None) -> dict[str, Any]:
    """The JSON header of one safetensors file (8-byte little-endian length, then JSON), checked against its size:
    every entry's dtype known, its bytes dtype x shape, the tensors tiling the data region exactly (no overlap, no
    hole, nothing past the end), as the safetensors library itself requires. `budget` bounds the header bytes and
    tensors of the whole checkpoint: counted before the JSON is parsed (each entry is an object, so the header's `{`
    bound its tensors), so a file past it costs a byte count, not a parse."""
    budget = budget or Budget()
    try:
        # Non-blocking and regular files only: a FIFO named *.safetensors must not hold the probe in open().
        with open_regular(path, "the safetensors file") as f:
            size = os.fstat(f.fileno()).st_size
            prefix = f.read(8)
            if len(prefix) < 8:
                raise CheckpointError(f"{path}: {size} bytes, too short for the 8-byte header length")
            (length,) = struct.unpack("<Q", prefix)
            if length > MAX_HEADER_BYTES or length > size - 8:
                raise CheckpointError(
                    f"{path}: header length {length:,} does not fit the file ({size:,} bytes): "
                    "truncated or not safetensors"
                )
            budget.take_bytes(path, length)
            raw = f.read(length)
            budget.take_tensors(path, raw.count(b"{") - 1, "its tensors (counting the objects of its header)")
    except OSError as exc:
        raise CheckpointError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    except Untrusted as exc:
        raise CheckpointError(exc.reason) from None
    try:
        header = loads_json(raw, "header")
    except Untrusted as exc:
        raise CheckpointError(f"{path}: header is not valid JSON: {exc.reason}") from None
    if not isinstance(header, dict):
        raise CheckpointError(f"{path}: header is {type(header).__name__}, not a JSON object")
    metadata = header.get("__metadata__", {})
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise CheckpointError(f"{path}: __metadata__ must be an object of strings")
    entries = {k: v for k, v in header.items() if k != "__metadata__"}
    for name, info in entries.items():
        _check_entry(path, name, info)
    data_end = check_layout(path, entries)
    if 8 + length + data_end > size:
        raise CheckpointError(
            f"{path}: truncated: tensors end at byte {8 + length + data_end:,} but the file has {size:,} bytes"
        )
    if 8 + length + data_end < size:
        raise CheckpointError(
            f"{path}: {size - 8 - length - data_end:,} bytes after the last tensor (byte {8 + length + data_end:,}): "
            "not a safetensors file as written"
        )
    return header


def check_layout(path: Path | str, entries: dict[str, Any]) -> int:
    """The end of the data region, after checking the tensors tile it from byte 0: each begins where the one before
    it ends (no overlap, no hole)."""
    end = 0
    for name, info in sorted(entries.items(), key=lambda item: (item[1]["data_offsets"], item[0])):
        begin, stop = info["data_offsets"]
        if begin != end:
            what = "overlaps the tensor before it" if begin < end else f"leaves a hole of {begin - end:,} bytes"
            raise CheckpointError(f"{path}: tensor {name!r} at bytes {begin:,}..{stop:,} {what} (ending at {end:,})")
        end = stop
    return end


def _check_entry(path: Path | str, name: str, info: Any) -> None:
    ok = (
        isinstance(info, dict)
        and set(info) == {"dtype", "shape", "data_offsets"}
        and isinstance(info.get("dtype"), str)
        and isinstance(info.get("shape"), list)
        and len(info["shape"]) <= 16
        and all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in info["shape"])
        and isinstance(info.get("data_offsets"), list)
        and len(info["data_offsets"]) == 2
        and all(isinstance(o, int) and not isinstance(o, bool) for o in info["data_offsets"])
        and 0 <= info["data_offsets"][0] <= info["data_offsets"][1]
    )
    if not ok:
        shown = repr(info) if len(repr(info)) <= 200 else repr(info)[:197] + "..."
        raise CheckpointError(f"{path}: tensor {name[:200]!r} has a malformed entry {shown}")
    bits = DTYPE_BITS.get(info["dtype"])
    if bits is None:
        raise CheckpointError(
            f"{path}: tensor {name[:200]!r} has the unknown dtype {info['dtype'][:40]!r} "
            f"(known: {', '.join(DTYPE_BITS)})"
        )
    begin, end = info["data_offsets"]
    need_bits = math.prod(info["shape"]) * bits
    if need_bits % 8 or need_bits // 8 != end - begin:
        raise CheckpointError(
            f"{path}: tensor {name[:200]!r} is {info['dtype']} {info['shape']} ({need_bits / 8:,g} bytes) but its "
            f"offsets {begin:,}..{end:,} hold {end - begin:,} bytes"
        )


def check_text_config(text: dict[str, Any]) -> None:
    """The text config's numbers the planner computes with: integers in range (TEXT_INTS), a head size derivable,
    `layer_types` one string per layer; Untrusted naming the field otherwise."""
    for key, (lo, hi) in TEXT_INTS.items():
        if text.get(key) is not None:
            check_int(text[key], key, lo, hi)
    for key in ("num_hidden_layers", "num_attention_heads"):
        if text.get(key) is None:
            raise Untrusted(f"{key} must be set (a decoder-only LM config has it)")
    if not text.get("head_dim") and text.get("hidden_size", 0) < text["num_attention_heads"]:
        raise Untrusted("head_dim must be set, or hidden_size must be at least num_attention_heads")
    layers = text["num_hidden_layers"]
    if (text.get("num_kv_shared_layers") or 0) >= layers:
        raise Untrusted(f"num_kv_shared_layers must be below num_hidden_layers ({layers})")
    overrides = text.get(hfconfig.LAYER_OVERRIDES)
    if overrides is not None:
        if not isinstance(overrides, list) or len(overrides) != layers or not all(isinstance(o, dict) for o in
                                                                                 overrides):
            raise Untrusted(f"{hfconfig.LAYER_OVERRIDES} must list one object per layer ({layers})")
        for override in overrides:
            for key in hfconfig.PER_LAYER_FIELDS:
                if key in override:
                    check_int(override[key], f"{hfconfig.LAYER_OVERRIDES} {key}", *TEXT_INTS[key])
    layer_types = text.get("layer_types")
    if layer_types is not None and (
        not isinstance(layer_types, list)
        or len(layer_types) != layers
        or not all(isinstance(t, str) for t in layer_types)
    ):
        found = f"a list of {len(layer_types)}" if isinstance(layer_types, list) else type(layer_types).__name__
        raise Untrusted(f"layer_types must list one string per layer ({layers}), found {found}")


def read_recorded(model: ModelFacts) -> ModelFacts:
    """A model's facts read back from a recording (`--facts FILE`) as the probe reads the checkpoint they stand for:
    a number set to null is unset (`without_unset`), then the text config is checked by `check_text_config` and the
    weights by part, dtype and count; Untrusted naming the field otherwise. Facts without a config (not local,
    invalid) plan nothing and pass."""
    if not model.config:
        return model
    text = model.config.get("text")
    if not isinstance(text, dict):
        raise Untrusted("config.text must be an object: the text config, as the probe records it")
    text = without_unset(text)
    check_text_config(text)
    for group in model.weights:
        if group.part not in PARTS:
            raise Untrusted(f"weights: part {group.part[:40]!r} must be one of {', '.join(PARTS)}")
        unknown = sorted(set(group.bytes_by_dtype) - set(DTYPE_BITS))
        if unknown:
            raise Untrusted(f"weights: dtype {unknown[0][:40]!r} of {group.part} must be one of "
                            f"{', '.join(DTYPE_BITS)}")
    tensors = sum(group.tensors for group in model.weights)
    if tensors > MAX_TENSORS:
        raise Untrusted(f"weights: {tensors:,} tensors, more than the {MAX_TENSORS:,} t4serve reads for one checkpoint")
    return dataclasses.replace(model, config={**model.config, "text": text})


def classify(name: str, text: dict[str, Any]) -> str:
    """The part a tensor belongs to, from its checkpoint name and the text config (for the KV-shared layers)."""
    if "vision_tower" in name or "embed_vision" in name:
        return PART_VISION
    if "audio_tower" in name or "embed_audio" in name:
        return PART_AUDIO
    if "embed_tokens_per_layer" in name:
        return PART_PER_LAYER_EMBEDDING
    if "embed_tokens" in name:
        return PART_EMBEDDING
    if name.startswith("lm_head") or ".lm_head." in name:
        return PART_OUTPUT_LAYER
    if "per_layer" in name:
        return PART_PER_LAYER_PROJECTION
    match = _LAYER.search(name)
    if match is not None:
        layer = int(match.group(1))
        first_shared = int(text.get("num_hidden_layers", 0)) - int(text.get("num_kv_shared_layers", 0) or 0)
        # vLLM 0.33 `_gemma4_layer_weights_mapper`: k_proj, v_proj and k_norm of KV-shared layers map to None.
        if 0 < first_shared <= layer and re.search(r"\.self_attn\.(k_proj|v_proj|k_norm)\.", name):
            return PART_KV_SHARED_DROPPED
        return PART_TEXT_DECODER
    if "language_model" in name or name.startswith("model.norm") or name.startswith("model.layers"):
        return PART_TEXT_DECODER
    return PART_OTHER


def group_tensors(entries: dict[str, dict[str, Any]], text: dict[str, Any]) -> list[TensorGroup]:
    """Bytes by part and dtype (size = data_offsets end - begin), parts in PARTS order, empty parts left out."""
    counts: dict[str, int] = defaultdict(int)
    by_dtype: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for name, info in entries.items():
        part = classify(name, text)
        counts[part] += 1
        begin, end = info["data_offsets"]
        by_dtype[part][info["dtype"]] += end - begin
    return [TensorGroup(p, counts[p], dict(sorted(by_dtype[p].items()))) for p in PARTS if counts[p]]


def planning_config(config: dict[str, Any]) -> dict[str, Any]:
    """What planning keeps of config.json: top-level identity, quantization, and the text config under "text"."""
    wanted = ("architectures", "model_type", "torch_dtype", "dtype", "tie_word_embeddings", "quantization_config",
              # A Gemma 4 drafter's: the target width its projections read and write.
              "backbone_hidden_size")
    keep: dict[str, Any] = {k: config[k] for k in wanted if k in config}
    text = config.get("text_config")
    # A flat (text-only) config keeps its text fields at the top level.
    keep["text"] = dict(text) if isinstance(text, dict) else {k: v for k, v in config.items() if k not in (
        "vision_config", "audio_config", "quantization_config")}
    keep["text"] = without_unset(keep["text"])
    for tower in ("vision_config", "audio_config"):
        if isinstance(config.get(tower), dict):
            keep[tower.removesuffix("_config")] = config[tower]
    return keep


def written_text(config: dict[str, Any]) -> dict[str, Any]:
    """The text part of config.json as written, nulls kept (transformers keeps an explicit null over its default)."""
    text = config.get("text_config")
    if isinstance(text, dict):
        return dict(text)
    return {k: v for k, v in config.items() if k not in ("vision_config", "audio_config", "quantization_config")}


def without_unset(text: dict[str, Any]) -> dict[str, Any]:
    """A number set to null means "not set": the planner's defaults apply, as for a key left out. A sliding_window of
    0 is no window: vLLM's ModelConfig makes it None (transformers' Qwen2MoeConfig, and some checkpoints, set 0)."""
    return {k: v for k, v in text.items()
            if not (k in TEXT_INTS and (v is None or (k == "sliding_window" and type(v) is int and v == 0)))}


def read_text_config(config: dict[str, Any], kept: dict[str, Any], directory: Path | None) -> str | None:
    """Put the text config vLLM plans from into `kept` (and how it was read), or return why it cannot be.

    A model type in t4serve.probes.configdefaults: transformers' defaults and rules, applied here (no import). Any
    other: vLLM's own reader in a child Python where the checkout is local and a reader is installed; without one,
    refused by name, since config.json as written may differ from what vLLM plans with.
    """
    written = written_text(config)
    model_type = configdefaults.text_model_type(config, written)
    try:
        filled = configdefaults.fill(model_type, written)
    except (TypeError, ValueError, KeyError, ZeroDivisionError) as exc:
        # A field the class's rules compute with is of the wrong kind (null layers, a text pattern): transformers
        # would refuse the config too.
        return (f"model type {model_type}: its config class cannot be built from config.json "
                f"({type(exc).__name__}: {str(exc)[:200]}); check num_hidden_layers, sliding_window and the fields "
                "the layer types are derived from")
    if filled is not None:
        kept["text"] = without_unset(filled)
        kept[CONFIG_READ_BY] = f"{configdefaults.read_by(model_type)} ({model_type})"
        return None
    resolution = hfconfig.resolve(directory) if directory is not None else None
    if resolution is not None and resolution.text is not None:
        # vLLM plans from its config class's attributes, defaults included: so does t4serve. A field config.json sets
        # that the class keeps elsewhere (Gemma 4's global_head_dim, moved into per-layer values) stays as written.
        # Its None is a decision (Qwen's sliding_window without use_sliding_window), so it overrides before the nulls
        # are dropped as unset.
        kept["text"] = without_unset({**kept["text"], **resolution.text})
        kept[CONFIG_READ_BY] = resolution.by
        return None
    why = resolution.why_not if resolution is not None else "read from the hub, so vLLM's reader cannot open it"
    return (f"model type {model_type or '(none)'} is not among {configdefaults.covered()}, and vLLM's config "
            f"reader did not read it ({why}); config.json as written "
            "may differ from what vLLM plans with: run `t4serve plan` in the image, or download the checkpoint there")


def quant_method(config: dict[str, Any]) -> str | None:
    qc = config.get("quantization_config")
    if isinstance(qc, dict) and isinstance(qc.get("quant_method"), str):
        return str(qc["quant_method"])
    return None


def resolve_local(repo: str, hf_home: str) -> tuple[Path, str] | None:
    """(directory holding config.json, "local-dir" or "hf-cache"), or None when the checkpoint (a repo id or a
    directory) is not on disk."""
    direct = Path(repo).expanduser()
    if direct.is_dir():
        return direct.resolve(), "local-dir"
    if repo.count("/") != 1 or repo.startswith(("/", ".")):
        return None
    repo_dir = Path(hf_home) / "hub" / ("models--" + repo.replace("/", "--"))
    snapshots = repo_dir / "snapshots"
    ref = repo_dir / "refs" / "main"
    revision = _cached_revision(ref)
    if revision is not None and (snapshots / revision).is_dir() and is_inside(snapshots / revision, repo_dir):
        return snapshots / revision, "hf-cache"
    # No refs/main (e.g. a cache filled by a pinned revision): the newest snapshot holding a config.json.
    candidates = sorted((p for p in snapshots.glob("*") if (p / "config.json").is_file()),
                        key=lambda p: p.stat().st_mtime, reverse=True) if snapshots.is_dir() else []
    return (candidates[0], "hf-cache") if candidates else None


def _cached_revision(ref: Path) -> str | None:
    """The revision refs/main names, or None when it is absent or not a plain name (`../..`, invalid UTF-8, a FIFO):
    then the newest snapshot is used, as when there is no refs/main."""
    try:
        return check_relative_name(read_text_bounded(ref, 4096, "refs/main").strip(), "refs/main")
    except (OSError, Untrusted):
        return None


def _invalid(requested: str, local: Path | None, error: str) -> ModelFacts:
    return ModelFacts(requested=requested, local_path=str(local) if local else None, source="invalid", error=error)


def role_refusal(config: dict[str, Any], role: str, kept: dict[str, Any] | None = None) -> str | None:
    """Why a config.json cannot be probed in `role`: a drafter is not a model to serve, and only Gemma 4's assistant
    drafters are drafters t4serve sizes; None when it can. A drafter's text config in `kept` becomes what vLLM 0.34
    plans with: all of the assistant's layers are KV-shared in its config.json, and vLLM sets `num_kv_shared_layers`
    to 0 (`hf_config_override`), its speculator wiring each layer to a target layer's cache once built."""
    kind = config.get("model_type")
    if role == ROLE_MODEL and kind in DRAFTER_MODEL_TYPES:
        return (f"a Gemma 4 drafter (model_type {kind}), not a model to serve on its own: name it in "
                "T4SERVE_DRAFT_MODEL with T4SERVE_SPECULATIVE=mtp, and serve its target (qat, bf16)")
    if role == ROLE_DRAFTER and kind not in DRAFTER_MODEL_TYPES:
        shown = str(kind)[:60] if kind is not None else "(none)"
        return (f"model type {shown} is not a drafter t4serve sizes: T4SERVE_SPECULATIVE=mtp drafts with Gemma 4's "
                f"assistant checkpoints (model_type {', '.join(DRAFTER_MODEL_TYPES)}, such as {E2B_ASSISTANT_REPO})")
    if role == ROLE_DRAFTER and kept is not None and "num_kv_shared_layers" in kept.get("text", {}):
        kept["text"]["num_kv_shared_layers"] = 0
    return None


def probe_local(requested: str, directory: Path, source: str, role: str = ROLE_MODEL) -> ModelFacts:
    config_path = directory / "config.json"
    try:
        config = load_json_file(config_path, MAX_CONFIG_BYTES, "config.json")
    except FileNotFoundError:
        return _invalid(requested, directory, f"{config_path}: missing (every Hugging Face checkpoint has config.json)")
    except Untrusted as exc:
        return _invalid(requested, directory, f"{config_path}: not readable JSON: {exc.reason}")
    if not isinstance(config, dict):
        return _invalid(requested, directory, f"{config_path}: a JSON {type(config).__name__}, not an object")
    kept = planning_config(config)
    refused = read_text_config(config, kept, directory) or role_refusal(config, role, kept)
    if refused is not None:
        return _invalid(requested, directory, f"{config_path}: {refused}")
    try:
        check_text_config(kept["text"])
    except Untrusted as exc:
        return _invalid(requested, directory, f"{config_path}: {exc.reason}")
    index_path = directory / "model.safetensors.index.json"
    # Names from the index stay inside the checkout (checked by name: a local directory's own symlinks are its
    # owner's choice); in the HF cache every file, links resolved, stays inside its repo folder (snapshots -> blobs).
    repo_dir = directory.parent.parent
    try:
        if index_path.is_file():
            index = load_json_file(index_path, MAX_INDEX_BYTES, "the index")
            weight_map = index.get("weight_map") if isinstance(index, dict) else None
            if not isinstance(weight_map, dict) or not weight_map:
                return _invalid(requested, directory, f"{index_path}: no weight_map")
            if len(weight_map) > MAX_TENSORS:
                return _invalid(requested, directory, f"{index_path}: {len(weight_map):,} tensors in its weight_map, "
                                f"more than the {MAX_TENSORS:,} t4serve reads for one checkpoint")
            names = {check_relative_name(f, f"a file in {index_path.name}'s weight_map") for f in weight_map.values()}
            files = sorted(directory / name for name in names)
        else:
            files = sorted(directory.glob("*.safetensors"))
        outside = [f for f in files if source == "hf-cache" and not is_inside(f, repo_dir)]
        if outside:
            real = os.path.realpath(outside[0])
            return _invalid(requested, directory, f"{outside[0]}: resolves outside the cache's {repo_dir} ({real})")
    except (OSError, Untrusted) as exc:
        reason = exc.reason if isinstance(exc, Untrusted) else exc.strerror or str(exc)
        return _invalid(requested, directory, f"{index_path}: not readable JSON: {reason}")
    if not files:
        return _invalid(
            requested, directory, f"{directory}: no *.safetensors files (only safetensors checkpoints are read)"
        )
    if len(files) > MAX_SHARDS:
        return _invalid(requested, directory, f"{directory}: {len(files):,} safetensors files, more than the "
                        f"{MAX_SHARDS:,} t4serve reads for one checkpoint")
    entries: dict[str, dict[str, Any]] = {}
    budget = Budget()
    for path in files:
        if not path.is_file():
            return _invalid(requested, directory, f"{path}: listed in {index_path.name} but missing")
        try:
            header = read_safetensors_header(path, budget)
        except CheckpointError as exc:
            return _invalid(requested, directory, str(exc))
        entries.update({k: v for k, v in header.items() if k != "__metadata__"})
    return ModelFacts(
        requested=requested,
        local_path=str(directory),
        source=source,
        config=kept,
        quantization=quant_method(config),
        safetensors_files=len(files),
        weights=group_tensors(entries, kept["text"]),
    )


def probe_remote(repo: str, role: str = ROLE_MODEL) -> tuple[ModelFacts | None, str]:
    """Headers and config.json read from the hub with range requests; (None, why) when that is not possible."""
    try:
        from huggingface_hub import get_safetensors_metadata, hf_hub_download  # type: ignore[import-not-found]
    except ImportError:
        return None, "huggingface_hub is not installed, so headers cannot be read remotely"
    try:
        metadata = get_safetensors_metadata(repo)
        config = load_json_file(Path(hf_hub_download(repo, "config.json")), MAX_CONFIG_BYTES, "config.json")
    except Exception as exc:  # the hub library raises many classes (HTTP, offline, auth, timeouts): all mean "not now"
        return None, f"reading {repo} from the Hugging Face hub failed: {type(exc).__name__}: {exc}"
    if not isinstance(config, dict):
        return _invalid(repo, None, f"remote config.json: a JSON {type(config).__name__}, not an object"), ""
    kept = planning_config(config)
    refused = read_text_config(config, kept, None) or role_refusal(config, role, kept)
    if refused is not None:
        return _invalid(repo, None, f"remote config.json: {refused}"), ""
    try:
        check_text_config(kept["text"])
    except Untrusted as exc:
        return _invalid(repo, None, f"remote config.json: {exc.reason}"), ""
    entries: dict[str, dict[str, Any]] = {}
    for filename, file_meta in metadata.files_metadata.items():
        file_entries: dict[str, Any] = {}
        try:
            for name, info in file_meta.tensors.items():
                entry = {"dtype": info.dtype, "shape": list(info.shape), "data_offsets": list(info.data_offsets)}
                _check_entry(filename, name, entry)
                file_entries[name] = entry
            check_layout(filename, file_entries)
        except CheckpointError as exc:
            return _invalid(repo, None, f"remote header: {exc}"), ""
        entries.update(file_entries)
    return ModelFacts(requested=repo, local_path=None, source="not-local", config=kept,
                      quantization=quant_method(config), safetensors_files=len(metadata.files_metadata),
                      weights=group_tensors(entries, kept["text"])), ""


def builtin_facts(repo: str, why_not_remote: str) -> ModelFacts | None:
    """The shipped facts for an alias's repo (t4serve/data/models/), or None for any other model."""
    filename = BUILTIN_MODELS.get(repo)
    if filename is None:
        return None
    data = json.loads(resources.files("t4serve").joinpath("data", "models", filename).read_text())
    config = dict(data["config"])
    config["provenance"] = f"{data['provenance']} (used because: {why_not_remote})"
    return ModelFacts(
        requested=repo,
        local_path=None,
        source="builtin",
        config=config,
        quantization=data["quantization"],
        safetensors_files=data["safetensors_files"],
        weights=[TensorGroup(g["part"], g["tensors"], g["bytes_by_dtype"]) for g in data["weights"]],
    )


def probe_model(repo: str, *, hf_home: str, offline: bool, role: str = ROLE_MODEL) -> ModelFacts:
    """Facts about the checkpoint `repo` names (a repo id or a local directory: Settings.model.target, or the drafter
    t4serve.probes.drafter chose, with `role` ROLE_DRAFTER); never raises on its content."""
    local = resolve_local(repo, hf_home)
    if local is not None:
        return probe_local(repo, *local, role=role)
    if Path(repo).is_absolute() or repo.startswith("."):
        return _invalid(repo, None, f"{repo}: no such directory")
    if offline:
        why = f"HF_HUB_OFFLINE=1 and {repo} is not in {os.path.join(hf_home, 'hub')}"
    else:
        remote, why = probe_remote(repo, role)
        if remote is not None:
            return remote
    builtin = builtin_facts(repo, why)
    if builtin is not None:
        refused = role_refusal(builtin.config, role)
        return builtin if refused is None else _invalid(repo, None, f"{repo}: {refused}")
    return ModelFacts(requested=repo, local_path=None, source="not-local", error=why)
