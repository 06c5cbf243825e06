"""Every vLLM series deploy/kubernetes reads (the alerts, the dashboard, KEDA's query, the HPA's adapter rule) is one
the image's vLLM exposes: the names are taken from vLLM's own metric definitions (vllm/v1/metrics/loggers.py, each
`self._gauge_cls(name=...)`, `_counter_cls`, `_histogram_cls`), with the suffixes prometheus_client adds (a counter's
`_total`; a histogram's `_bucket`, `_sum`, `_count`). A vLLM bump that renames one fails here, not on a dashboard."""

from __future__ import annotations

import ast
import importlib.util
import json
import re
from types import ModuleType

import pytest
import yaml

from .conftest import REPO, RunInImage

pytestmark = pytest.mark.image

LOGGERS = "v1/metrics/loggers.py"
READ = (
    "import importlib.util, pathlib, sys\n"
    "root = pathlib.Path(importlib.util.find_spec('vllm').origin).parent\n"
    "print((root / sys.argv[1]).read_text())\n"
)
SUFFIXES = {"_gauge_cls": ("",), "_counter_cls": ("_total",), "_histogram_cls": ("_bucket", "_sum", "_count")}


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, REPO / "tests" / "unit" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def exposed_names(source: str) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in SUFFIXES:
            for keyword in node.keywords:
                if keyword.arg == "name" and isinstance(keyword.value, ast.Constant):
                    names |= {str(keyword.value.value) + s for s in SUFFIXES[node.func.attr]}
    return names


def test_every_vllm_series_the_manifests_read_exists(run_in_image: RunInImage) -> None:
    out = run_in_image("-c", READ, LOGGERS, entrypoint="python3")
    assert out.returncode == 0, out.stderr[-2000:]
    exposed = exposed_names(out.stdout)
    assert {"vllm:num_requests_waiting", "vllm:generation_tokens_total", "vllm:e2e_request_latency_seconds_bucket"} \
        <= exposed, "vLLM's metric definitions were not found where they were: read them again"  # fmt: skip
    manifests = _load("k8s_manifests")
    objs = manifests.render(manifests.DEPLOY / "overlays" / "autoscaling")
    groups = manifests.one(objs, "PrometheusRule")["spec"]["groups"]
    exprs = [r["expr"] for g in groups for r in g["rules"]]
    board = next(o for o in objs if o["kind"] == "ConfigMap" and "t4serve.json" in o.get("data", {}))
    exprs += [t["expr"] for p in json.loads(board["data"]["t4serve.json"])["panels"] for t in p.get("targets", [])]
    exprs.append(manifests.one(objs, "ScaledObject")["spec"]["triggers"][0]["metadata"]["query"])
    adapter = yaml.safe_load((manifests.DEPLOY / "components" / "hpa" / "prometheus-adapter-values.yaml").read_text())
    exprs += [rule["seriesQuery"] for rule in adapter["rules"]["custom"]]
    used = {m for e in exprs for m in re.findall(r"\b(vllm:[a-zA-Z0-9_:]+)", e)}
    print(f"\n{len(used)} vLLM series read, of {len(exposed)} the image's vLLM exposes")
    assert used and used <= exposed, sorted(used - exposed)
