"""`t4serve bench` inside the image with the real `vllm bench serve` against the stand-in server.

One container, everything on 127.0.0.1: a word-level tokenizer built with `tokenizers`, two stand-ins (qat answers,
bf16's engine is dead so every request fails), a tiny grid. Checks the folder (raw JSON, CSV, report, plots), the
seed scheme (both models were sent the same prompts, cells and repeats different ones) and the failed model's rows.
Then bench without --base-url in the stand-in image: each server it starts is the real `t4serve serve` (preflight,
supervisord, the vLLM wrapper, the canary) over the stand-in, measured by the real client, stopped by SIGTERM.
"""

from __future__ import annotations

import itertools
import json
import subprocess

import pytest

from .conftest import REPO, RunInImage
from .test_supervision import standin

pytestmark = pytest.mark.image
__all__ = ["standin"]  # the stand-in image fixture, shared with test_supervision

# A word-level tokenizer in /tmp/w/tok, built with `tokenizers`: `vllm bench serve` needs one it can load offline.
MAKE_TOKENIZER = r"""
python - <<'PY'
import json, pathlib
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
out = pathlib.Path("/tmp/w/tok"); out.mkdir()
vocab = {"<pad>": 0, "<eos>": 1, "<bos>": 2, "<unk>": 3, **{f"w{i}": i + 4 for i in range(1000)}}
tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
tok.pre_tokenizer = pre_tokenizers.Whitespace()
tok.decoder = decoders.WordPiece(prefix="##")
tok.save(str(out / "tokenizer.json"))
(out / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "PreTrainedTokenizerFast",
    "bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>", "unk_token": "<unk>"}))
PY
"""

SCRIPT = r"""
set -eu
mkdir -p /tmp/w/bin
ln -s /t4tests/standin/vllm_standin.py /tmp/w/bin/vllm
export PATH=/tmp/w/bin:$PATH HF_HUB_OFFLINE=1
""" + MAKE_TOKENIZER + r"""
T4SERVE_STANDIN_TOKEN_DELAY=0.005 T4SERVE_STANDIN_PROMPT_LOG=/tmp/w/qat.prompts \
  vllm serve /tmp/w/tok --host 127.0.0.1 --port 8101 --served-model-name qat >/tmp/w/qat.log 2>&1 &
T4SERVE_STANDIN_MODE=crash-after-ready T4SERVE_STANDIN_CRASH_AFTER=0 T4SERVE_STANDIN_DEAD_LINGER=900 \
  T4SERVE_STANDIN_PROMPT_LOG=/tmp/w/bf16.prompts \
  vllm serve /tmp/w/tok --host 127.0.0.1 --port 8102 --served-model-name bf16 >/tmp/w/bf16.log 2>&1 &
python - <<'PY'
import time, urllib.request
for _ in range(200):
    try:
        [urllib.request.urlopen(f"http://127.0.0.1:{p}/v1/models", timeout=1) for p in (8101, 8102)]
        break
    except OSError:
        time.sleep(0.1)
PY
rc=0
t4serve bench --models qat,bf16 --inputs 32,64 --concurrency 1 --repeats 2 --output-len 8 --num-warmups 1 \
  --base-url qat=http://127.0.0.1:8101,bf16=http://127.0.0.1:8102 --tokenizer /tmp/w/tok --ceiling qat=100 \
  --output /tmp/w/out >/tmp/w/bench.out 2>/tmp/w/bench.err || rc=$?
python - "$rc" <<'PY'
import json, os, pathlib, sys
w = pathlib.Path("/tmp/w")
out = w / "out"
print(json.dumps({
    "rc": int(sys.argv[1]),
    "files": sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file()),
    "png_sizes": {p.name: p.stat().st_size for p in out.glob("*.png")},
    "report": (out / "report.md").read_text() if (out / "report.md").exists() else "",
    "csv": (out / "runs.csv").read_text() if (out / "runs.csv").exists() else "",
    "runs": json.loads((out / "runs.json").read_text()) if (out / "runs.json").exists() else None,
    "qat_prompts": (w / "qat.prompts").read_text().split() if (w / "qat.prompts").exists() else [],
    "bf16_prompts": (w / "bf16.prompts").read_text().split() if (w / "bf16.prompts").exists() else [],
    "stderr": (w / "bench.err").read_text()[-3000:],
    "raw_qat": json.loads((out / "raw" / "qat_in32_c1_r1.json").read_text())
               if (out / "raw" / "qat_in32_c1_r1.json").exists() else None,
}))
PY
"""


def test_bench_with_real_vllm_client_and_standin(run_in_image: RunInImage) -> None:
    done = run_in_image(
        "-c",
        SCRIPT,
        entrypoint="bash",
        extra=["-v", f"{REPO / 'tests'}:/t4tests:ro"],
        timeout=900,
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    # The failed model makes the command exit 1, after writing everything.
    assert result["rc"] == 1, result["stderr"]
    files = set(result["files"])
    for name in ("report.md", "runs.csv", "runs.json", *result["png_sizes"]):
        assert name in files
    assert set(result["png_sizes"]) == {
        "throughput_vs_concurrency.png",
        "per_stream_vs_concurrency.png",
        "ttft_vs_input.png",
    }
    assert all(size > 5000 for size in result["png_sizes"].values())
    assert {f"raw/qat_in{i}_c1_r{r}.json" for i in (32, 64) for r in (1, 2)} <= files

    report = result["report"]
    assert "## input 32 tokens" in report and "## input 64 tokens" in report
    assert "| 1 | " in report and "FAILED" in report
    assert "bf16, input 32, c=1: FAILED (no repeat succeeded)" in report
    assert "| qat | 100.0 | 32 | 1 |" in report  # the roofline fraction row

    runs = result["runs"]["runs"]
    # Interleaved pair by pair (A B, then B A), cells by concurrency then input, all in one client process that
    # imported the image's vLLM once (the first run paid it); each run's start and end recorded.
    assert result["runs"]["order"] == "interleaved" and result["runs"]["client"] == "sweep"
    assert [(r["model"], r["input_len"], r["repeat"]) for r in runs] == [
        ("qat", 32, 1), ("bf16", 32, 1), ("bf16", 32, 2), ("qat", 32, 2),
        ("qat", 64, 1), ("bf16", 64, 1), ("bf16", 64, 2), ("qat", 64, 2)]
    timings = [r["timing"] for r in runs]
    assert all(a["ended"] <= b["started"] for a, b in itertools.pairwise(timings))
    assert timings[0]["client_start_s"] > 0 and all(t["client_start_s"] == 0 for t in timings[1:])
    assert "client start-up: 1 start(s)" in result["stderr"]
    seeds = {(r["model"], r["input_len"], r["concurrency"], r["repeat"]): r["seed"] for r in runs}
    assert seeds[("qat", 32, 1, 1)] == seeds[("bf16", 32, 1, 1)] == 320_101
    assert len({s for (m, *_), s in seeds.items() if m == "qat"}) == 4
    qat_ok = [r for r in runs if r["model"] == "qat"]
    assert all(r["figures"]["completed"] == 10 and r["figures"]["failed"] == 0 for r in qat_ok)  # 10 x c
    assert all(r["figures"] is None or r["figures"]["completed"] == 0 for r in runs if r["model"] == "bf16")
    assert result["csv"].count("\n") == 1 + 8

    # Goodput is vLLM's own count (`--goodput`), kept per run and shown per cell; the stand-in answers well within
    # the default objectives, so every request was good. The detailed result keeps per-request TTFTs.
    raw = result["raw_qat"]
    assert raw["request_goodput"] == pytest.approx(raw["request_throughput"])
    assert len(raw["ttfts"]) == 10 and len(raw["latencies"]) == 10
    assert all(r["figures"]["request_goodput"] == pytest.approx(r["figures"]["request_throughput"]) for r in qat_ok)
    assert "TTFT was within 2000 ms and TPOT within 100 ms" in report
    # vLLM's /metrics per run (here the stand-in's, which serves vLLM's names): the queue and decode times of the
    # run's requests, no preemption, no engine steps (the stand-in has none, so none are claimed).
    for r in qat_ok:
        server = r["server"]
        assert server["samples"] >= 2 and server["error"] is None, server
        assert server["preemptions"] == 0 and server["steps"] is None
        assert server["queue_ms_mean"] is not None and server["decode_ms_mean"] > 0
    assert "## server side (vLLM's /metrics)" in report

    # Same prompts for both checkpoints; different across cells and repeats.
    assert sorted(result["qat_prompts"]) == sorted(result["bf16_prompts"])
    # 4 runs of 10 prompts; the initial test and warm-up requests reuse a run's first prompt. One shared seed would
    # give at most 11 distinct prompts.
    assert len(set(result["qat_prompts"])) >= 3 * 10


# Bench starting its own servers: `t4serve serve` per model, in the stand-in image (the stand-in is `vllm serve`, the
# real vLLM answers `vllm bench serve`). No GPU here: preflight warns instead of refusing.
STARTED_SCRIPT = r"""
set -eu
mkdir -p /tmp/w
""" + MAKE_TOKENIZER + r"""
rc=0
t4serve bench --models qat,bf16 --inputs 32 --concurrency 1 --repeats 1 --output-len 8 --num-warmups 1 \
  --tokenizer /tmp/w/tok --ceiling qat=100,bf16=50 --ready-timeout 120 --output /tmp/w/out \
  >/tmp/w/bench.out 2>/tmp/w/bench.err || rc=$?
python - "$rc" <<'PY'
import json, pathlib, sys
out = pathlib.Path("/tmp/w/out")
states = {p.parent.name: json.loads(p.read_text()) for p in out.glob("servers/*/state.json")}
specs = {p.parent.name: json.loads(p.read_text()) for p in out.glob("servers/*/run-spec.json")}
logs = {p.name: p.read_text()[:3000] + "\n...\n" + p.read_text()[-3000:] for p in (out / "raw").glob("server_*.log")}
# What a server started: supervisord, the vLLM wrapper (t4serve run-vllm) and `vllm serve`, by their first arguments.
def started(pid):
    try:
        args = [a.decode() for a in (pid / "cmdline").read_bytes().split(b"\0")[:4]]
    except OSError:
        return False
    names = [a.rsplit("/", 1)[-1] for a in args]
    return "supervisord" in names or "run-vllm" in names or ("vllm" in names[:2] and "serve" in names)
alive = sorted(p.name for p in pathlib.Path("/proc").iterdir() if p.name.isdigit() and started(p))
print(json.dumps({"rc": int(sys.argv[1]), "runs": json.loads((out / "runs.json").read_text()),
                  "states": states, "specs": specs, "logs": logs, "alive": alive,
                  "stderr": pathlib.Path("/tmp/w/bench.err").read_text()[-3000:]}))
PY
"""


def test_bench_starts_t4serve_serve_for_each_model(docker_bin: str, standin: str) -> None:
    done = subprocess.run(
        [docker_bin, "run", "--rm", "--entrypoint", "bash", "-e", "T4SERVE_PREFLIGHT=warn", "-e", "HF_HUB_OFFLINE=1",
         "-e", "T4SERVE_DTYPE=float16", "-e", "T4SERVE_STANDIN_TOKEN_DELAY=0.005", standin, "-c", STARTED_SCRIPT],
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["rc"] == 0, result["stderr"]
    runs = result["runs"]["runs"]
    assert [(r["model"], r["error"]) for r in runs] == [("qat", None), ("bf16", None)], result["stderr"]
    assert all(r["figures"]["completed"] == 10 and r["figures"]["failed"] == 0 for r in runs)
    # Each model was served by t4serve serve: its own plan's checkpoint, ready only after the canary, then drained.
    assert result["specs"]["qat"]["argv"][:3] == ["vllm", "serve", "google/gemma-4-E2B-it-qat-w4a16-ct"]
    assert result["specs"]["bf16"]["argv"][:3] == ["vllm", "serve", "google/gemma-4-E2B-it"]
    for model, state in result["states"].items():
        phases = [m["phase"] for m in state["phases"]]
        assert phases.index("canary") < phases.index("ready") < phases.index("stopping"), (model, phases)
        assert state["canary"]["ok"], model
    for name, log in result["logs"].items():
        assert "t4serve: preflight:" in log and "vLLM stopped (exit 0)" in log, (name, log[-1500:])
    # Nothing of either server outlives the sweep.
    assert result["alive"] == []
