"""A checkpoint's text config as vLLM reads it, for the model types t4serve.probes.configdefaults does not hold.

vLLM does not plan from the raw JSON: `vllm.transformers_utils.config.get_config` builds transformers' config class,
whose defaults fill every field the file leaves out (the published Gemma 3 configs name no heads, head size, layer
types or vocabulary), and `get_hf_text_config` takes its text part. `resolve(directory)` runs exactly that in a child
Python (`python -m t4serve.probes.hfconfig DIR`: importing vLLM costs seconds and memory t4serve's own process should
not keep), offline, bounded in time, and returns the text config's plain attributes. Where neither vLLM nor transformers
is importable (the unit-test venv, a laptop running `t4serve plan --gpu t4`), or the reader fails, the result says
why, and t4serve.probes.checkpoint refuses the model by name.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from t4serve import untrusted

# Importing vLLM and building a config takes about 5 s on two cores; a reader that hangs must not hang the probe.
RESOLVE_TIMEOUT_S = 120
# Bounds on what the child may hand back (a text config is a few KB; Gemma 3's layer_types is the longest field).
MAX_OUTPUT_BYTES = 4 * 1000 * 1000
# The text-config key the reader adds for per-layer values (t4serve.planning.kvcache.layer_heads reads it), and the
# fields.
LAYER_OVERRIDES = "layer_overrides"
PER_LAYER_FIELDS = ("head_dim", "num_key_value_heads")


@dataclass(frozen=True)
class Resolution:
    """The text config as vLLM reads it (`text`, with who read it in `by`), or None with the reason in `why_not`."""

    text: dict[str, Any] | None
    by: str
    why_not: str | None


def reader_missing() -> str | None:
    """Why no config reader can run here, or None when transformers (and so vLLM's reader, if vLLM is there) can."""
    if importlib.util.find_spec("transformers") is None:
        return "neither vLLM nor transformers is installed here (the image has both)"
    return None


def resolve(directory: Path, timeout: float = RESOLVE_TIMEOUT_S) -> Resolution:
    """`directory`'s text config read by vLLM's `get_config` (or transformers' AutoConfig where only it is there)."""
    missing = reader_missing()
    if missing is not None:
        return Resolution(None, "", missing)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_LOGGING_LEVEL": "ERROR"}
    try:
        done = subprocess.run(
            [sys.executable, "-m", "t4serve.probes.hfconfig", str(directory)],
            capture_output=True, timeout=timeout, env=env, stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        return Resolution(None, "", f"vLLM's config reader did not finish within {timeout:g} s")
    except OSError as exc:
        return Resolution(None, "", f"vLLM's config reader could not start: {exc.strerror or exc}")
    last = done.stderr.decode("utf-8", "replace").strip().splitlines()[-1:] or [""]
    if done.returncode != 0 or len(done.stdout) > MAX_OUTPUT_BYTES:
        return Resolution(None, "", f"vLLM's config reader failed (exit {done.returncode}): {last[0][:300]}")
    try:
        data = untrusted.loads_json(done.stdout, "the config reader's output")
    except untrusted.Untrusted as exc:
        return Resolution(None, "", f"vLLM's config reader gave no JSON: {exc.reason}")
    if not isinstance(data, dict):
        return Resolution(None, "", "vLLM's config reader gave no JSON object")
    if isinstance(data.get("error"), str):
        return Resolution(None, "", f"vLLM's config reader refused config.json: {data['error'][:300]}")
    text = data.get("text")
    by = data.get("by")
    if not isinstance(text, dict) or not isinstance(by, str):
        return Resolution(None, "", "vLLM's config reader gave no text config")
    return Resolution(text, by, None)


def _plain(value: Any, depth: int = 0) -> Any:
    """A JSON-able copy of a config attribute: numbers, strings, lists and dicts of them; torch dtypes by name;
    anything else (sub-configs, objects) left out as None."""
    if depth > 8:
        return None
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [_plain(v, depth + 1) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v, depth + 1) for k, v in value.items()}
    if type(value).__module__ == "torch" and type(value).__name__ == "dtype":
        return str(value).removeprefix("torch.")
    return None


def _read(directory: str) -> dict[str, Any]:
    try:
        import vllm
        from vllm.transformers_utils.config import get_config, get_hf_text_config
    except ImportError:
        import transformers  # type: ignore[import-not-found]
        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(directory, trust_remote_code=False)
        text = config.get_text_config()
        by = f"transformers {transformers.__version__} AutoConfig ({type(text).__name__})"
    else:
        config = get_config(directory, trust_remote_code=False)
        text = get_hf_text_config(config)
        import transformers

        by = f"vLLM {vllm.__version__} get_config (transformers {transformers.__version__} {type(text).__name__})"
    attributes = config_attributes(text)
    overrides = _layer_overrides(text, attributes)
    if overrides:
        attributes[LAYER_OVERRIDES] = overrides
    return {"by": by, "text": attributes}


def config_attributes(text: Any) -> dict[str, Any]:
    """A config object's plain attributes, and the standard names its class maps to its own (`attribute_map`: GPT-2's
    and GPT-BigCode's `n_embd` is `hidden_size`, `n_layer` is `num_hidden_layers`), as vLLM reads them (getattr)."""
    attributes = {k: _plain(v) for k, v in vars(text).items() if not k.startswith("_")}
    for standard in getattr(type(text), "attribute_map", None) or {}:
        if isinstance(standard, str) and standard not in attributes:
            try:
                attributes[standard] = _plain(getattr(text, standard))
            except AttributeError:
                continue
    return attributes


def _layer_overrides(text: Any, attributes: dict[str, Any]) -> list[dict[str, Any]] | None:
    """Per-layer values of PER_LAYER_FIELDS where they differ from the model-wide ones: transformers 5's
    heterogeneous configs keep them in `per_layer_config` (Gemma 4's 512-wide global heads), not as attributes."""
    per_layer = getattr(text, "per_layer_config", None)
    layers = attributes.get("num_hidden_layers")
    if per_layer is None or not isinstance(layers, int):
        return None
    out = []
    for i in range(layers):
        layer = per_layer[i]
        out.append({f: _plain(getattr(layer, f)) for f in PER_LAYER_FIELDS
                    if hasattr(layer, f) and getattr(layer, f) != attributes.get(f)})
    return out if any(out) else None


def main(argv: list[str] | None = None) -> int:
    """`python -m t4serve.probes.hfconfig DIR`: the text config of DIR as JSON on stdout; {"error": ...} when the reader
    refuses config.json. Anything the readers print goes to stderr."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m t4serve.probes.hfconfig CHECKPOINT_DIR", file=sys.stderr)
        return 2
    out = sys.stdout
    sys.stdout = sys.stderr
    try:
        result = _read(args[0])
    except ImportError as exc:
        result = {"error": f"no config reader: {exc}"}
    except Exception as exc:  # the readers raise many classes for a bad config; each is a refusal to report
        result = {"error": f"{type(exc).__name__}: {exc}"}
    json.dump(result, out)
    out.write("\n")
    out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
