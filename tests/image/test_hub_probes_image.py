"""t4serve's probes against the image's own huggingface_hub (2.x since vLLM 0.34.0 requires it): the remote
checkpoint probe (`get_safetensors_metadata` by ranges, `hf_hub_download` of config.json) reads what the local probe
reads from the same files, the download watcher sees a 2.x download in progress (its temporary file is now
`<etag>.<random>.incomplete`), and t4serve's switch words are the hub's truth table. The hub itself is
tests/image/fakehub.py (a test double of huggingface.co's file endpoint), run inside the container: the network stays
off."""

from __future__ import annotations

import json

import pytest

from t4serve.config.variables import TRUE_WORDS

from .conftest import REPO, RunInImage

pytestmark = pytest.mark.image

SCRIPT = r"""
import json, os, sys, tempfile, threading, time
from pathlib import Path
sys.path[:0] = ["/t/image", "/t/unit"]
import fakehub, e2b_checkpoint
scratch = Path(tempfile.mkdtemp())
root = e2b_checkpoint.write_checkpoint(scratch / "repo", kind="qat")
(root / "slow.bin").write_bytes(b"x" * (1 << 20))
server = fakehub.serve(root, "org/e2b", slow="slow.bin")
os.environ["HF_ENDPOINT"] = f"http://127.0.0.1:{server.server_port}"
os.environ["HF_HOME"] = str(scratch / "hf")
os.environ["HF_HUB_DISABLE_XET"] = "1"
import huggingface_hub
from huggingface_hub import constants, hf_hub_download
from t4serve.probes.checkpoint import probe_local, probe_remote
from t4serve.serde import to_dict
from t4serve.supervise.run_vllm import downloads_active

remote, why = probe_remote("org/e2b")
local = probe_local("org/e2b", root, "local-dir")
seen = []
done = threading.Event()
def fetch():
    hf_hub_download("org/e2b", "slow.bin")
    done.set()
thread = threading.Thread(target=fetch)
thread.start()
hub = str(scratch / "hf" / "hub")
while not done.is_set():
    seen.append(downloads_active(hub))
    time.sleep(0.02)
thread.join()
incomplete = [p.name for p in Path(hub).rglob("*.incomplete")]
print(json.dumps({
    "version": huggingface_hub.__version__,
    "why": why,
    "remote": to_dict(remote) if remote is not None else None,
    "local": to_dict(local),
    "active_during": any(seen),
    "active_after": downloads_active(hub),
    "left_incomplete": incomplete,
    "true_values": sorted(constants.ENV_VARS_TRUE_VALUES),
}))
"""


@pytest.fixture(scope="module")
def result(run_in_image: RunInImage) -> dict[str, object]:
    out = run_in_image("-c", SCRIPT, entrypoint="python3", timeout=600,
                       extra=["--network", "none", "-v", f"{REPO / 'tests'}:/t:ro"])
    assert out.returncode == 0, out.stderr[-4000:]
    found: dict[str, object] = json.loads(out.stdout.strip().splitlines()[-1])
    return found


def test_the_image_runs_huggingface_hub_2(result: dict[str, object]) -> None:
    assert str(result["version"]).startswith("2."), result["version"]


def test_the_remote_probe_reads_what_the_local_one_reads(result: dict[str, object]) -> None:
    remote, local = result["remote"], result["local"]
    assert remote is not None, result["why"]
    assert isinstance(remote, dict) and isinstance(local, dict)
    assert remote["source"] == "not-local" and remote["error"] is None
    for key in ("config", "quantization", "safetensors_files", "weights"):
        assert remote[key] == local[key], key


def test_a_download_in_progress_is_seen_and_one_finished_is_not(result: dict[str, object]) -> None:
    assert result["active_during"] is True
    assert result["active_after"] is False and result["left_incomplete"] == []


def test_t4serves_switch_words_are_the_hubs(result: dict[str, object]) -> None:
    assert {w.upper() for w in TRUE_WORDS} == set(result["true_values"])  # type: ignore[arg-type]
