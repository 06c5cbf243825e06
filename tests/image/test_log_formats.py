"""t4serve's log patterns against the image's own vLLM: each pattern's format string, as vLLM writes it, is a string
literal of the source file the pattern names, and that format, filled in, is matched by the pattern. The tracker reads
phases and figures from these lines only; a vLLM bump that rewords one fails here, at build time, not at a user's
first start. (vLLM 0.26's wording, met on the GPU host, is checked against its printed logs in tests/unit.)"""

from __future__ import annotations

import ast
import json
import re

import pytest

from t4serve.supervise.logwatch import LOG_PATTERNS, LogPattern

from .conftest import RunInImage

pytestmark = pytest.mark.image

# Each pattern's format string as vLLM 0.33.0's logger call writes it; `%` placeholders (in an f-string: `%s` for each
# replacement field) stand for the regex groups.
FORMAT_STRINGS = {
    "load_start": "Starting to load model %s...",
    "download_done": "Time spent downloading weights for %s: %.6f seconds",
    "weights_loaded": "Loading weights took %.2f seconds",
    "model_loaded": "Model loading took %s GiB memory and %.6f seconds",
    "torch_compile": "%storch.compile took %.2f s in total",
    "kv_memory": "Available KV cache memory: %s GiB",
    "load_start_v2": "Loading model from scratch...",
    "kv_memory_set": "reserved %s GiB memory for KV Cache as specified by kv_cache_memory_bytes",
    "kv_capacity": "KV cache size: %s tokens",
    "kv_concurrency": "Maximum concurrency for %s tokens per request: %.2fx",
    "cuda_graphs": "Graph capturing finished in %.0f secs, took %.2f GiB",
    "engine_ready": "init engine (profile, create kv cache, warmup model) took %.2f s",
    "server_start": "Starting vLLM server on %s",
}
# Reads each named file of the installed vllm package (found without importing it) and prints them as JSON.
READ_SOURCES = (
    "import importlib.util, json, pathlib, sys\n"
    "root = pathlib.Path(importlib.util.find_spec('vllm').origin).parent\n"
    "print(json.dumps({n: (root / n).read_text() if (root / n).is_file() else None for n in sys.argv[1:]}))\n"
)


def _file(pattern: LogPattern) -> str:
    return pattern.source.split()[0]


@pytest.fixture(scope="module")
def sources(run_in_image: RunInImage) -> dict[str, str | None]:
    names = sorted({_file(p) for p in LOG_PATTERNS})
    out = run_in_image("-c", READ_SOURCES, *names, entrypoint="python3")
    assert out.returncode == 0, f"could not read vLLM's source in the image: {out.stderr[-2000:]}"
    found: dict[str, str | None] = json.loads(out.stdout)
    return found


def _string_literals(text: str) -> str:
    """Every string literal of a module, adjacent ones already joined by the parser, so a split format is whole; an
    f-string with `%s` for each of its replacement fields, as a logger's format would have them."""
    strings: list[str] = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            strings.append(node.value)
        elif isinstance(node, ast.JoinedStr):
            strings.append("".join(v.value if isinstance(v, ast.Constant) else "%s" for v in node.values))
    return "\n".join(strings)


def _filled(fmt: str) -> str:
    """The format as a log line would carry it: `%s` as a number with a thousands comma, `%.Nf` as a decimal."""
    return re.sub(r"%\.\df", "12.5", fmt.replace("%s", "1,234"))


def test_every_pattern_has_a_format_string() -> None:
    assert sorted(FORMAT_STRINGS) == sorted(p.name for p in LOG_PATTERNS)


@pytest.mark.parametrize("pattern", LOG_PATTERNS, ids=lambda p: p.name)
def test_pattern_matches_the_images_vllm(pattern: LogPattern, sources: dict[str, str | None]) -> None:
    text = sources[_file(pattern)]
    assert text is not None, f"{pattern.name}: vllm/{_file(pattern)} is not in the image (pattern source moved?)"
    fmt = FORMAT_STRINGS[pattern.name]
    assert fmt in _string_literals(text), f"{pattern.name}: {fmt!r} is not a string of vllm/{_file(pattern)}"
    assert pattern.regex.search(_filled(fmt)), f"{pattern.name}: {pattern.regex.pattern!r} misses {_filled(fmt)!r}"
