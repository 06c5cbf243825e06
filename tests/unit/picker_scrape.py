"""What llm-d-router's endpoint picker reads from a pod's /metrics, checked against a page a server answered: the
families of its built-in `vllm` engine (tests/unit/data/endpoint-picker), typed so that it reads their values
(gauges), and the KV cache's block size and block count in vllm:cache_config_info's labels. Shared by
tests/unit/test_standin.py (the stand-in run here) and tests/image/test_inference_pool_metrics.py (in the image)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

PICKER = json.loads((Path(__file__).parent / "data" / "endpoint-picker" / "llm-d-router_v0.10.0.json").read_text())
# The specs the picker's extractor reads for an engine labelled vllm (or unlabelled: vllm is its default engine).
GAUGES = ("queuedRequestsSpec", "runningRequestsSpec", "kvUsageSpec")
_TYPE = re.compile(r"^# TYPE (\S+) (\S+)$")
_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)[{ ]")
_SUFFIXES = ("_bucket", "_sum", "_count", "_total", "_created")


def layout_problems(text: str) -> list[str]:
    """The text format's rules the picker's parser (Go's expfmt TextParser) enforces and prometheus_client's lenient
    parser does not: one TYPE line per family, before its samples, and a family's samples together."""
    problems = []
    typed: set[str] = set()
    current = None
    finished: set[str] = set()
    for line in text.splitlines():
        if match := _TYPE.match(line):
            name = match.group(1)
            if name in typed:
                problems.append(f"second TYPE line for {name}")
            typed.add(name)
            if current:
                finished.add(current)
            current = name
        elif (match := _SAMPLE.match(line)) and not line.startswith("#"):
            sample = match.group(1)
            family = next((f for f in (sample, *(sample.removesuffix(s) for s in _SUFFIXES)) if f in typed), sample)
            if family in finished or (family != current and family in typed):
                problems.append(f"samples of {family} are not together")
            if family not in typed:
                if current:
                    finished.add(current)
                current = family
    return problems


def families(text: str) -> dict[str, Any]:
    return {f.name: f for f in text_string_to_metric_families(text)}


def picker_problems(text: str, block_size: int) -> list[str]:
    """Everything wrong with a /metrics page for the picker: a missing or untyped family it reads, a value it cannot
    read, or a cache_config_info without the block size the server was given."""
    problems = layout_problems(text)
    found = families(text)
    vllm, readable = PICKER["vllm"], PICKER["scrape"]["metric_types_read"]
    for spec in (*GAUGES, "cacheInfoSpec"):
        name = vllm[spec]
        family = found.get(name)
        if family is None:
            problems.append(f"{name} ({spec}): not served")
        elif family.type not in readable:
            problems.append(f"{name}: served as {family.type}, the picker reads the values of {readable} only")
        elif not family.samples:
            problems.append(f"{name}: no sample")
    if problems:
        return problems
    info = found[vllm["cacheInfoSpec"]].samples
    labels = info[-1].labels
    served = labels.get(vllm["cacheBlockSizeLabelName"])
    if served != str(block_size):
        problems.append(f"{vllm['cacheInfoSpec']}: {vllm['cacheBlockSizeLabelName']}={served!r}, the server was given "
                        f"{block_size}")  # fmt: skip
    blocks = labels.get(vllm["cacheNumBlocksLabelName"], "")
    if not blocks.isdigit() or int(blocks) <= 0:
        problems.append(f"{vllm['cacheInfoSpec']}: {vllm['cacheNumBlocksLabelName']}={blocks!r} is not a block count")
    return problems
