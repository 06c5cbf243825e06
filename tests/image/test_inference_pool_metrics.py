"""What components/inference-pool's endpoint picker scrapes exists on a t4serve pod, through its API-key guard: the
image (t4serve:standin, the stand-in server as `vllm`) serves as the pod does, from `t4serve serve` and its plan, with
the key from a secret file, and its /metrics, fetched as llm-d-router v0.10.0 fetches it (GET, no Authorization), holds
the families the picker's `vllm` engine reads, typed as it reads them, and vllm:cache_config_info with the block size
the plan gave vLLM. The stand-in's cache_config_info is held to the image's own vLLM: the label names its CacheConfig
reports (`metrics_info()`), and the metric names in vLLM's loggers.py."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import urllib.error
import urllib.request
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from t4serve.config.kvflags import BLOCK_SIZE_FLAG, PLAN_BLOCK_SIZE
from t4serve.planning.kvcache import DEFAULT_BLOCK_SIZE

from .conftest import REPO, RunInImage
from .test_monitoring_names import LOGGERS, READ, exposed_names
from .test_supervision import Start, dexec, standin, start, wait_phase

__all__ = ["standin", "start"]  # the stand-in image and its containers, fixtures shared with test_supervision
pytestmark = pytest.mark.image

API_KEY = "sk-pool-0123456789abcdef"
# vLLM's CacheConfig as the plan configures it, asked for the labels it reports.
CACHE_LABELS = (
    "import json, sys\n"
    "from vllm.config import CacheConfig\n"
    "print(json.dumps(list(CacheConfig(block_size=int(sys.argv[1])).metrics_info())))\n"
)


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, REPO / "tests" / "unit" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def get(url: str, headers: dict[str, str] | None = None) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_the_pickers_metrics_are_served_through_the_key_guard(
    docker_bin: str, start: Start, run_in_image: RunInImage, tmp_path: Path
) -> None:
    scrape = _load("picker_scrape")
    key_file = tmp_path / "api_key"
    key_file.write_text(API_KEY + "\n")
    key_file.chmod(0o644)  # the container's user (uid 1000) reads the bind-mounted file
    name = start({"T4SERVE_API_KEY_FILE": "/run/secrets/api_key", "T4SERVE_STANDIN_LOAD_SECONDS": "1"},
                 "-v", f"{key_file}:/run/secrets/api_key:ro", "-p", "127.0.0.1::8000")  # fmt: skip
    state = wait_phase(docker_bin, name, {"ready", "canary_failed", "failed"})
    assert state["phase"] == "ready", state.get("reason")
    port = subprocess.run([docker_bin, "port", name, "8000/tcp"], capture_output=True, text=True).stdout
    base = f"http://127.0.0.1:{port.strip().split(':')[-1]}"
    spec: dict[str, Any] = json.loads(dexec(docker_bin, name, "cat", "/tmp/t4serve/run-spec.json").stdout)
    argv = spec["argv"]
    block = int(argv[argv.index(BLOCK_SIZE_FLAG) + 1])
    assert block == PLAN_BLOCK_SIZE == DEFAULT_BLOCK_SIZE

    # The guard is on: the API answers 401 without the key; the picker's scrape, keyless, is answered.
    assert get(base + "/v1/models")[0] == 401
    status, text = get(base + scrape.PICKER["scrape"]["path"])
    assert status == 200, text
    assert scrape.picker_problems(text, block) == []
    info = scrape.families(text)[scrape.PICKER["vllm"]["cacheInfoSpec"]].samples[0].labels
    print(f"\n/metrics through the guard: {len(scrape.families(text))} families; cache_config_info block_size="
          f"{info['block_size']}, num_gpu_blocks={info['num_gpu_blocks']}")  # fmt: skip

    # The stand-in's cache_config_info reports what the image's vLLM reports: its CacheConfig's fields, and engine.
    real = run_in_image("-c", CACHE_LABELS, str(block), entrypoint="python3")
    assert real.returncode == 0, real.stderr[-2000:]
    assert list(info) == [*json.loads(real.stdout.strip().splitlines()[-1]), "engine"]
    # And vLLM defines the families the picker reads under those names (its own source, in the image).
    source = run_in_image("-c", READ, LOGGERS, entrypoint="python3")
    assert source.returncode == 0, source.stderr[-2000:]
    vllm = scrape.PICKER["vllm"]
    assert {vllm[s] for s in scrape.GAUGES} <= exposed_names(source.stdout)
    assert f'name = "{vllm["cacheInfoSpec"]}"' in source.stdout
