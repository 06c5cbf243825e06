"""The build-manifest probe: what the image recorded about itself at build time (torch, CUDA, arch list, vLLM, clamp).

`probe_manifest(path)` reads the JSON the image's build stage wrote (`t4serve build-manifest`, facts.BuildManifest's
fields) without importing torch. A missing or malformed file is a `BuildManifest` with `present=False` and the reason.
"""

from __future__ import annotations

from pathlib import Path

from t4serve.errors import ConfigError
from t4serve.facts import BuildManifest
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
