"""Gemma 4 E2B served with each attention path, side by side, sized as a T4 and in the GPU host's T4 mode.

    python3 tests/gpu/turing_served.py OUT WORK [--paths triton,turing-mma] [--launches CHOICE_JSON]
        [--timeout 900] [--deadline EPOCH]

1. WORK/checkpoints/bf16-random-layers-x3: E2B's bf16 checkpoint with seeded random weights by
   kv_quant_host.layers_x3_rule (the layers lead the residual stream, so the tokens depend on attention: under that
   rule another 16-bit kernel agreed on 99.5 % of top-1 tokens and int8 on 10 % in the CPU rehearsal).
2. One `t4serve serve` per path (T4SERVE_ATTENTION), started together, each sized as a T4 (T4SERVE_SIZE_AS=t4), the
   canary off (random weights answer nothing sensible), in T4 mode (tests/gpu/t4mode.py: every attention kernel is
   sm_75 code within a T4's registers and shared memory), vLLM's torch profiler on. With --launches (the kernel step's
   choice.json) the turing-mma server runs those launches (t4mode's T4SERVE_GPU_LAUNCHES).
3. Per server: vLLM's logged KV figures against the plan's; the plugin's line in vLLM's log (the path was installed);
   time to first token at 512 and 4,096 prompt tokens, the servers interleaved request by request (REPEATS each,
   after a warm-up); greedy tokens and top-5 prompt log-probabilities over a fixed prompt set, the first path's server
   measured twice (the control: what one server gives twice); torch's profiler over one 4,096-token prefill (the
   attention kernels' share of GPU kernel time); `t4serve bench` at 4,096 tokens, c=1 and 8, interleaved pair by pair.
4. What the T4 mode compiled and loaded in each server: per kernel its sm_75 registers, spills, HMMA/FFMA counts and
   the loaded function's registers.
OUT gets turing-served.json (everything, written after each part), served.json (the record docs/verified keeps),
the servers' logs and the bench folder. A measuring tool for the GPU host, not a test.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import random
import shlex
import shutil
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent / "unit")]

import kv_quant_host as kq  # noqa: E402

SEED = 43
TTFT_TOKENS = (512, 4096)
REPEATS = 5
PROMPT_LENGTHS = (64, 600, 1500, 3000)
PROMPTS_PER_LENGTH = 3
GREEDY_TOKENS = 32
PROFILE_TOKENS = 4096
ATTENTION_KERNELS = ("kernel_unified_attention", "reduce_segments")


def say(text: str) -> None:
    print(text, flush=True)


def prompts(seed: int = SEED) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(*kq.TOKEN_RANGE) for _ in range(n)] for n in PROMPT_LENGTHS for _ in
            range(PROMPTS_PER_LENGTH)]


def measure(base_url: str, model: str) -> dict[str, Any]:
    """Top-5 prompt log-probabilities and a greedy continuation of every prompt."""
    logprobs, greedy = [], []
    for ids in prompts():
        body = {"model": model, "prompt": ids, "max_tokens": 1, "temperature": 0, "prompt_logprobs": kq.TOP_K}
        logprobs.append(kq.top_tokens(kq.post(f"{base_url}/v1/completions", body)["choices"][0]["prompt_logprobs"]))
        body = {"model": model, "prompt": ids, "max_tokens": GREEDY_TOKENS, "temperature": 0, "ignore_eos": True,
                "return_token_ids": True}
        greedy.append(kq.post(f"{base_url}/v1/completions", body)["choices"][0].get("token_ids"))
    return {"logprobs": logprobs, "greedy": greedy}


def greedy_agreement(a: list[Any], b: list[Any]) -> float:
    """The share of greedy tokens equal position by position over the prompt set (0-1)."""
    same = total = 0
    for x, y in zip(a, b, strict=True):
        x, y = x or [], y or []
        total += max(len(x), len(y))
        same += sum(1 for i, j in zip(x, y, strict=False) if i == j)
    return same / total if total else 0.0


def ttft(base_url: str, model: str, tokens: int, seed: int) -> float | None:
    """Seconds to the first streamed token of a `tokens`-token prompt (fresh token ids: no prefix-cache hit)."""
    rng = random.Random(seed)
    ids = [rng.randrange(*kq.TOKEN_RANGE) for _ in range(tokens)]
    body = {"model": model, "prompt": ids, "max_tokens": 2, "temperature": 0, "ignore_eos": True, "stream": True}
    request = urllib.request.Request(f"{base_url}/v1/completions", data=json.dumps(body).encode(),
                                     headers={"content-type": "application/json"})
    start = time.perf_counter()
    with urllib.request.urlopen(request, timeout=600) as response:
        for raw in response:
            line = raw.decode().strip()
            if line.startswith("data: ") and line != "data: [DONE]" and json.loads(line[6:]).get("choices"):
                return time.perf_counter() - start
    return None


def profile_share(base_url: str, model: str, directory: Path) -> dict[str, Any]:
    """torch's profiler (vLLM's /start_profile, /stop_profile) over one PROFILE_TOKENS-token prefill: GPU kernel time
    of the attention kernels against all kernels in the traces vLLM's workers wrote."""
    before = set(directory.rglob("*.json*")) if directory.exists() else set()
    post_empty(f"{base_url}/start_profile")
    ttft(base_url, model, PROFILE_TOKENS, seed=SEED + 999)
    post_empty(f"{base_url}/stop_profile")
    deadline = time.time() + 120
    traces: list[Path] = []
    while time.time() < deadline and not traces:
        time.sleep(2)
        traces = [p for p in directory.rglob("*.pt.trace.json*") if p not in before]
    attention = total = 0.0
    by_kernel: dict[str, float] = {}
    for path in traces:
        opener = gzip.open if path.suffix == ".gz" else open
        with opener(path, "rt") as f:
            events = json.load(f).get("traceEvents", [])
        for e in events:
            if e.get("cat") != "kernel":
                continue
            duration = float(e.get("dur", 0))
            total += duration
            name = str(e.get("name", ""))
            if name.startswith(ATTENTION_KERNELS):
                attention += duration
            by_kernel[name[:80]] = by_kernel.get(name[:80], 0.0) + duration
    top = dict(sorted(by_kernel.items(), key=lambda kv: -kv[1])[:12])
    return {"traces": [str(p) for p in traces], "kernel_ms": round(total / 1000, 3),
            "attention_ms": round(attention / 1000, 3),
            "attention_share": round(attention / total, 4) if total else None,
            "top_kernels_ms": {k: round(v / 1000, 3) for k, v in top.items()}}


def post_empty(url: str) -> None:
    """POST with no body to an endpoint that answers 200 with none (vLLM's profiler routes)."""
    request = urllib.request.Request(url, data=b"", method="POST")
    with urllib.request.urlopen(request, timeout=300) as response:
        response.read()


def plugin_installed(log: str) -> bool:
    return "t4serve attention path turing-mma installed" in log


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("work", type=Path)
    parser.add_argument("--paths", default="triton,turing-mma")
    parser.add_argument("--launches", type=Path, help="the kernel step's choice.json for the turing-mma server")
    parser.add_argument("--timeout", type=float, default=900, help="seconds a server may take to become ready")
    parser.add_argument("--deadline", type=float, default=0, help="epoch seconds after which no new part starts")
    args = parser.parse_args(argv)
    from realserve import PROBE_HOOK, Server, vllm_version, write_json

    out, work = args.out, args.work
    out.mkdir(parents=True, exist_ok=True)
    paths = args.paths.split(",")
    began = time.time()
    ckpt = kq.random_checkpoint(work, "bf16-random-layers-x3", kq.layers_x3_rule)
    record: dict[str, Any] = {"vllm": vllm_version(), "checkpoint": str(ckpt), "weights_rule": "layers_x3_rule",
                              "paths": paths, "servers": {}, "parts": {}}
    # The card's name without a CUDA context in this process (the servers are sized against what is free).
    record["device"] = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                                      text=True).stdout.strip()

    def save() -> None:
        write_json(out / "turing-served.json", record)

    def time_left(part: str) -> bool:
        if args.deadline and time.time() > args.deadline:
            record["parts"][part] = "skipped: the hold's deadline passed"
            say(f"{part}: skipped, past the deadline")
            save()
            return False
        return True

    servers: dict[str, Server] = {}
    for i, path in enumerate(paths):
        root = work / f"served-{path}"
        shutil.rmtree(root / "records", ignore_errors=True)
        env = {"T4SERVE_SIZE_AS": "t4", "T4SERVE_CANARY": "off", "T4SERVE_ATTENTION": path,
               "T4SERVE_SERVED_MODEL_NAME": path, "T4SERVE_GPU_AS_T4": "1",
               "T4SERVE_GPU_AS_T4_RECORDS": str(root / "records"),
               # t4mode's plugin module sits here; the probe hook as realserve puts it.
               "PYTHONPATH": os.pathsep.join([str(PROBE_HOOK), str(HERE), os.environ.get("PYTHONPATH", "")]),
               "T4SERVE_VLLM_ARGS": "--profiler-config " + shlex.quote(json.dumps(
                   {"profiler": "torch", "torch_profiler_dir": str(root / "profile"),
                    "torch_profiler_with_stack": False}))}
        if args.launches and path == "turing-mma":
            env["T4SERVE_GPU_LAUNCHES"] = str(args.launches)
        servers[path] = Server(path, root, str(ckpt), 8700 + 10 * i, env=env)
    try:
        for server in servers.values():
            server.start()
        for path, server in servers.items():
            phase = server.wait_phase(("ready", "failed"), max(60.0, args.timeout - (time.time() - began)))
            log = server.log()
            entry = {"phase": phase, "ready_s": round(time.time() - server.started_at, 1),
                     "env": {k: v for k, v in server.environment_added().items() if k != "PYTHONPATH"},
                     "plugin_installed": plugin_installed(log), **kq.kv_figures(server.state())}
            if phase != "ready":
                entry["log_tail"] = log[-6000:]
            record["servers"][path] = entry
            say(f"{path}: {phase} after {entry['ready_s']} s, KV figures equal {entry['equal']}, plugin line "
                f"{entry['plugin_installed']}")
        save()
        ready = {p: s for p, s in servers.items() if record["servers"][p]["phase"] == "ready"}
        if len(ready) < len(paths):
            return 1
        urls = {p: s.base_url for p, s in ready.items()}
        for p in urls:  # warm-up: the first long prompt compiles what the start did not
            ttft(urls[p], p, 4096, seed=1)
        if time_left("ttft"):
            times: dict[str, dict[str, list[float]]] = {p: {str(n): [] for n in TTFT_TOKENS} for p in urls}
            for n in TTFT_TOKENS:
                for r in range(REPEATS):
                    order = list(urls) if r % 2 == 0 else list(reversed(urls))
                    for p in order:
                        seconds = ttft(urls[p], p, n, seed=SEED + 100 * n + r)
                        if seconds is not None:
                            times[p][str(n)].append(round(seconds * 1000, 2))
            record["ttft_ms"] = {p: {n: {"median": statistics.median(v) if v else None, "runs": v}
                                     for n, v in per.items()} for p, per in times.items()}
            say(json.dumps({p: {n: v["median"] for n, v in per.items()} for p, per in record["ttft_ms"].items()}))
            save()
        if time_left("numerics"):
            measured = {p: measure(urls[p], p) for p in urls}
            first = paths[0]
            control = measure(urls[first], first)
            record["numerics"] = {
                p: {**kq.compare(measured[first]["logprobs"], measured[p]["logprobs"]),
                    "greedy_agreement": greedy_agreement(measured[first]["greedy"], measured[p]["greedy"])}
                for p in paths[1:]}
            record["numerics"]["control_same_server_again"] = {
                **kq.compare(measured[first]["logprobs"], control["logprobs"]),
                "greedy_agreement": greedy_agreement(measured[first]["greedy"], control["greedy"])}
            record["greedy"] = {p: measured[p]["greedy"] for p in paths}
            say(json.dumps(record["numerics"], indent=1))
            save()
        if time_left("profile"):
            record["profile"] = {}
            for p in urls:
                try:
                    record["profile"][p] = profile_share(urls[p], p, work / f"served-{p}" / "profile")
                except Exception as e:  # the rest of the record stands without it
                    record["profile"][p] = {"error": f"{type(e).__name__}: {e}"}
            say(json.dumps({p: v.get("attention_share") for p, v in record["profile"].items()}))
            save()
        if time_left("bench"):
            cmd = ["t4serve", "bench", "--models", ",".join(urls), "--base-url",
                   ",".join(f"{p}={u}" for p, u in urls.items()), "--tokenizer", str(ckpt), "--inputs", "4096",
                   "--concurrency", "1,8", "--repeats", "2", "--waves", "3", "--output-len", "32", "--warmup-run",
                   "--output", str(out / "bench")]
            # Bounded by the hold: four minutes past the deadline at most, so the results still come back.
            limit = max(60.0, args.deadline + 240 - time.time()) if args.deadline else 1500.0
            try:
                done = subprocess.run(cmd, env=next(iter(ready.values())).environment(), timeout=limit)
            except subprocess.TimeoutExpired:
                record["bench"] = {"command": cmd, "exit": None, "timeout_s": round(limit)}
                save()
                raise
            record["bench"] = {"command": cmd, "exit": done.returncode}
            save()
    finally:
        import t4mode

        for path, server in servers.items():
            server.kill()
            if server.log_path.exists():
                shutil.copy2(server.log_path, out / f"{path}-serve.log")
            records = work / f"served-{path}" / "records"
            if records.is_dir():
                record["servers"].setdefault(path, {})["t4mode"] = t4mode.read_records(records)
        record["seconds"] = round(time.time() - began, 1)
        save()
        write_json(out / "served.json", served_record(record))
    return 0


def served_record(record: dict[str, Any]) -> dict[str, Any]:
    """The short record docs/verified/turing-attention/served.json keeps."""
    numerics = record.get("numerics", {})
    return {
        "vllm_version": record.get("vllm"), "device": record.get("device"), "as_t4_kernels": True,
        "attention_path": "turing-mma", "baseline_path": "triton",
        "greedy_agreement": numerics.get("turing-mma", {}).get("greedy_agreement"),
        "greedy_agreement_control": numerics.get("control_same_server_again", {}).get("greedy_agreement"),
        "ttft_ms": {p: {n: v["median"] for n, v in per.items()} for p, per in record.get("ttft_ms", {}).items()},
        "attention_share_of_kernel_time_4096": {p: v.get("attention_share")
                                                for p, v in record.get("profile", {}).items()},
        "kv_figures_equal": {p: s.get("equal") for p, s in record.get("servers", {}).items()},
        "plugin_installed": {p: s.get("plugin_installed") for p, s in record.get("servers", {}).items()},
    }


if __name__ == "__main__":
    sys.exit(main())
