"""t4serve's log lines against the image's own vLLM: each line's format string in the phase table
(t4serve.supervise.phases), as vLLM writes it, is a string literal of the source file the line names, and that format,
filled in, is matched by the line's regex; the table's vLLM version is the image's. The tracker reads phases and
figures from these lines only; a vLLM bump that rewords one fails here, at build time, not at a user's first start.
(vLLM 0.26's wording, met on the GPU host, is checked against its printed logs in tests/unit.)"""

from __future__ import annotations

import ast
import json
import re

import pytest

from t4serve.supervise.phases import LOG_LINES, VLLM_VERSION, LogLine

from .conftest import RunInImage

pytestmark = pytest.mark.image

LINES = [line for line, _phase in LOG_LINES]
# Reads each named file of the installed vllm package (found without importing it), and the package's version from its
# distribution metadata, and prints them as JSON.
READ_SOURCES = (
    "import importlib.metadata, importlib.util, json, pathlib, sys\n"
    "root = pathlib.Path(importlib.util.find_spec('vllm').origin).parent\n"
    "files = {n: (root / n).read_text() if (root / n).is_file() else None for n in sys.argv[1:]}\n"
    "print(json.dumps({'version': importlib.metadata.version('vllm'), 'files': files}))\n"
)


@pytest.fixture(scope="module")
def image_vllm(run_in_image: RunInImage) -> dict[str, object]:
    names = sorted({line.source_file for line in LINES})
    out = run_in_image("-c", READ_SOURCES, *names, entrypoint="python3")
    assert out.returncode == 0, f"could not read vLLM's source in the image: {out.stderr[-2000:]}"
    found: dict[str, object] = json.loads(out.stdout)
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


def test_the_table_was_read_from_the_images_vllm(image_vllm: dict[str, object]) -> None:
    assert image_vllm["version"] == VLLM_VERSION, "the image's vLLM changed: read each format string again"


@pytest.mark.parametrize("line", LINES, ids=lambda line: line.name)
def test_line_matches_the_images_vllm(line: LogLine, image_vllm: dict[str, object]) -> None:
    files = image_vllm["files"]
    assert isinstance(files, dict)
    text = files[line.source_file]
    assert text is not None, f"{line.name}: vllm/{line.source_file} is not in the image (the line's source moved?)"
    filled = _filled(line.vllm_format)
    assert line.vllm_format in _string_literals(text), f"{line.name}: {line.vllm_format!r} is not in {line.source_file}"
    assert line.regex.search(filled), f"{line.name}: {line.regex.pattern!r} misses {filled!r}"
