"""The build-manifest probe: what the image recorded about itself at build time (torch, CUDA, arch list, vLLM, clamp).

`probe_manifest(path)` reads the JSON the image's build stage wrote (`t4serve build-manifest`, facts.BuildManifest's
fields) without importing torch. A missing or malformed file is a `BuildManifest` with `present=False` and the reason.
"""

from __future__ import annotations

import json
from pathlib import Path

from t4serve.errors import ConfigError
from t4serve.facts import BuildManifest
from t4serve.serde import from_dict

MISSING_MEANS = "not running in the t4serve image, or the image was built without its manifest"
# The writer stores the whole BuildManifest; these describe the reading, so the reader sets them, not the file.
_READER_FIELDS = ("path", "present", "error")


def probe_manifest(path: str) -> BuildManifest:
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        return BuildManifest(path=path, present=False, error=f"no build manifest at {path}: {MISSING_MEANS}")
    except OSError as exc:
        return BuildManifest(path=path, present=False, error=f"cannot read the build manifest {path}: {exc}")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        return BuildManifest(path=path, present=False, error=f"the build manifest {path} is not JSON: {exc}")
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
