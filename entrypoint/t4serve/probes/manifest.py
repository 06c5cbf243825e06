"""The build-manifest probe: what the image recorded about itself at build time (torch, CUDA, arch list, vLLM, clamp).

`probe_manifest(path)` reads the JSON the image's build stage wrote (`t4serve build-manifest`, facts.BuildManifest's
fields) without importing torch. A missing or malformed file is a `BuildManifest` with `present=False` and the reason.
"""

from __future__ import annotations

from pathlib import Path

from t4serve.errors import ConfigError
from t4serve.facts import BuildManifest, TuringAttentionProof
from t4serve.serde import from_dict
from t4serve.untrusted import Untrusted, loads_json, read_bounded

MISSING_MEANS = "not running in the t4serve image, or the image was built without its manifest"
# The writer stores the whole BuildManifest; these describe the reading, so the reader sets them, not the file.
_READER_FIELDS = ("path", "present", "error")
# The manifest holds versions, an arch list and the clamp proof: a few KB.
MAX_MANIFEST_BYTES = 1 << 20


def probe_manifest(path: str) -> BuildManifest:
    try:
        # T4SERVE_MANIFEST may name anything: bounded, non-blocking (a FIFO or /dev/zero is refused at once).
        raw = read_bounded(Path(path), MAX_MANIFEST_BYTES, "the build manifest")
    except FileNotFoundError:
        return BuildManifest(path=path, present=False, error=f"no build manifest at {path}: {MISSING_MEANS}")
    except Untrusted as exc:
        return BuildManifest(path=path, present=False, error=exc.reason)
    try:
        data = loads_json(raw, f"the build manifest {path}")
    except Untrusted as exc:
        return BuildManifest(path=path, present=False, error=exc.reason)
    if not isinstance(data, dict):
        return BuildManifest(
            path=path, present=False, error=f"the build manifest {path} is not a JSON object: {type(data).__name__}"
        )
    fields = {key: value for key, value in data.items() if key not in _READER_FIELDS}
    try:
        return from_dict(BuildManifest, {"path": path, "present": True, **fields}, where=path)
    except ConfigError as exc:
        # Fields of the wrong type or unknown to this t4serve: a manifest from another build, not half-loaded.
        detail = exc.what if exc.found is None else f"{exc.what} ({exc.found})"
        return BuildManifest(path=path, present=False, error=f"the build manifest {path} does not match: {detail}")


# Written by `t4serve attention prove` in the image's turing-attention stage, beside the build manifest.
TURING_PROOF_NAME = "turing-attention-proof.json"
# Its table's launches and step 1's combinations, with their figures: tens of KB.
MAX_TURING_PROOF_BYTES = 1 << 20


def probe_turing_proof(manifest_path: str) -> TuringAttentionProof:
    """The Turing attention proof beside the build manifest, summarised; `present=False` with the reason when it is
    missing, unreadable or of another shape."""
    path = str(Path(manifest_path).parent / TURING_PROOF_NAME)
    try:
        raw = read_bounded(Path(path), MAX_TURING_PROOF_BYTES, "the Turing attention proof")
        data = loads_json(raw, f"the Turing attention proof {path}")
    except FileNotFoundError:
        return TuringAttentionProof(path=path, present=False,
                                    error=f"no Turing attention proof at {path}: {MISSING_MEANS}")
    except Untrusted as exc:
        return TuringAttentionProof(path=path, present=False, error=exc.reason)
    kernels = data.get("kernels") if isinstance(data, dict) else None
    if not isinstance(kernels, list) or not kernels or not all(_proof_row(k) for k in kernels):
        return TuringAttentionProof(path=path, present=False,
                                    error=f"the Turing attention proof {path} does not match: no list of kernels "
                                    "with phase, head_size, kv_cache, tensor_core_instructions, shared_memory_bytes "
                                    "and spill_bytes")
    phases = {k["phase"] for k in kernels}
    rows = {(k["phase"], k["head_size"], k["kv_cache"]) for k in kernels}
    heads, caches = {k["head_size"] for k in kernels}, {k["kv_cache"] for k in kernels}
    covered = [(h, kv) for h in heads for kv in caches if all((p, h, kv) in rows for p in phases)]
    version = data.get("vllm_version")
    return TuringAttentionProof(
        path=path, present=True, vllm_version=version if isinstance(version, str) else None,
        launches=len(kernels), tensor_core_launches=sum(1 for k in kernels if k["tensor_core_instructions"] > 0),
        padded_heads=sorted({h for h, _ in covered}), kv_caches=sorted({kv for _, kv in covered}),
        largest_shared_memory_bytes=max(k["shared_memory_bytes"] for k in kernels),
        most_spill_bytes=max(k["spill_bytes"] for k in kernels))


def _proof_row(row: object) -> bool:
    if not isinstance(row, dict):
        return False
    numbers = ("head_size", "tensor_core_instructions", "shared_memory_bytes", "spill_bytes")
    return (all(isinstance(row.get(k), int) and not isinstance(row.get(k), bool) and 0 <= row[k] < 1 << 31
                for k in numbers)
            and row.get("phase") in ("prefill", "decode") and isinstance(row.get("kv_cache"), str))
