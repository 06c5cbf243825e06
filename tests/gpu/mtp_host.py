"""Gemma 4's MTP drafter on a GPU host sized as a T4 (issue 46), with issue 34's int8 numerics in the same hold.

    python3 tests/gpu/mtp_host.py OUT WORK [--inputs 512] [--concurrency 1,4,8] [--repeats 2] [--no-qat]
        [--no-hf-reference] [--deadline EPOCH]

1. Checkpoints (each written once, under a temporary name renamed when complete): Gemma 4 E2B bf16 with seeded random
   weights (kv_quant_host.randomize by `layers_x3_rule`: the layers lead the residual stream, so greedy tokens are
   a function of the whole context rather than the input token again), and the drafter written from
   google/gemma-4-E2B-it-assistant's published config (tests/unit/e2b_checkpoint.py) with seeded random weights and
   a seeded permutation of the vocabulary as its centroid token ordering. The QAT checkpoint (zero weights) comes
   from tests/gpu/write_checkpoints.py (gpu-host.sh writes it).
2. Servers, each `t4serve serve` sized as a T4 (T4SERVE_SIZE_AS=t4, the canary off: random weights answer nothing
   sensible), every one with tests/gpu/steptiming.py on (each engine step's GPU time, the draft apart):
   `t4serve` (the plan as it comes: its attention `auto`, turing-mma on a card sized as a T4), `t4serve-mtp`
   (T4SERVE_SPECULATIVE=mtp, T4SERVE_DRAFT_MODEL the drafter, 2 tokens a step), `kv-int8` (T4SERVE_KV_CACHE_DTYPE=int8)
   and `t4serve-triton` (T4SERVE_ATTENTION=triton: vLLM's own launch, another 16-bit process with other attention
   kernels) on the random bf16 checkpoint; `qat` and `qat-mtp` on the QAT one. All start at once where the card holds
   them all (their pools are passed explicitly, so no start moves another's sizing), else the QAT pair after the
   others are stopped. Each one's phase and vLLM's logged KV figures beside the plan's. Where `t4serve` or
   `t4serve-mtp` fails, `t4serve-mtp-triton` starts and the pair measured below is vLLM's own launch with and
   without MTP (`pair` in mtp.json says which).
3. Greedy equality: the fixed prompt set (kv_quant_host.prompts: 20 prompts of 64 to 6,000 tokens), GREEDY_TOKENS
   greedy tokens each (ignore_eos), from the reference one prompt at a time, from the MTP server one at a time and
   all at once, and from the reference all at once: the control. Speculative decoding at temperature 0 must change
   nothing beyond what the control's other batch size changes. vLLM's acceptance counters (vllm:spec_decode_*) from
   the MTP server's /metrics over it. `t4serve-triton` one at a time beside them: what another attention kernel
   changes.
4. Issue 34's int8 numerics, in threads beside step 3 (each server gets only its own requests, one at a time):
   kv_quant_host.measure on the reference twice (`same_server_again`), `kv-int8` and `t4serve-triton`
   (`control_16bit`), compared with the reference.
5. `t4serve bench --models REF,MTP` at the inputs and concurrencies given, interleaved pair by pair (--warmup-run),
   stopped before the deadline; then steptiming's summary of both servers over the bench's window: per number of
   requests (1, 4, 8), the median step, verify and draft GPU times of the decode-only steps. vLLM's acceptance
   counters over the bench.
6. With the time left: transformers' 16-bit and int8 reference on the same checkpoint against the servers
   (kv_quant_host.independent_reference), after every server is stopped.

OUT gets mtp.json (written after every stage, so a hold cut short keeps what was done), bench/ (t4serve bench's
report and raw results), each server's serve log and step records. A measuring tool for the GPU host, not a test;
tests/unit/test_gpu_mtp.py checks its pure parts.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import struct
import subprocess
import sys
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))

SEED = 46
GREEDY_TOKENS = 64
NUM_SPECULATIVE_TOKENS = 2
T4_SERVER_BYTES = 16 << 30  # what one server sized as a T4 holds on the card, its CUDA context included, rounded up
TOKEN_ORDERING = "masked_embedding.token_ordering"


def write_token_ordering(path: Path, seed: int = SEED) -> int:
    """Write a seeded permutation of the vocabulary into the drafter's int64 `masked_embedding.token_ordering` (vLLM's
    Gemma4MTPMaskedEmbedder reads it as num_centroids rows of vocab/num_centroids token ids: all zeros would make
    every draft token 0). Returns the vocabulary size."""
    import numpy as np

    with path.open("rb") as f:
        (size,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(size))
    info = header[TOKEN_ORDERING]
    if info["dtype"] != "I64" or len(info["shape"]) != 1:
        raise ValueError(f"{path}: {TOKEN_ORDERING} is {info['dtype']} {info['shape']}, not a 1-D I64 tensor")
    vocab = int(info["shape"][0])
    begin, end = info["data_offsets"]
    if end - begin != 8 * vocab:
        raise ValueError(f"{path}: {TOKEN_ORDERING} holds {end - begin} bytes, not {8 * vocab}")
    data = np.random.default_rng(seed).permutation(vocab).astype("<i8").tobytes()
    fd = os.open(path, os.O_WRONLY)
    try:
        done = 0
        while done < len(data):
            done += os.pwrite(fd, data[done:], 8 + size + begin + done)
    finally:
        os.close(fd)
    return vocab


def drafter_checkpoint(work: Path, name: str = "assistant-random") -> Path:
    """WORK/checkpoints/NAME: the assistant's published config with seeded random weights and token ordering."""
    from e2b_checkpoint import write_assistant_checkpoint  # type: ignore[import-not-found]
    from kv_quant_host import randomize

    ckpt = work / "checkpoints" / name
    if not (ckpt / "config.json").is_file():
        tmp = ckpt.with_name(f".{name}.writing")
        shutil.rmtree(tmp, ignore_errors=True)
        write_assistant_checkpoint(tmp, sparse=True)
        randomize(tmp, seed=SEED)
        write_token_ordering(tmp / "model.safetensors")
        tmp.rename(ckpt)
    return ckpt


def spec_counters(metrics_text: str) -> dict[str, float]:
    """vLLM's speculative-decoding counters from a /metrics page: name (with labels) -> value, `_created` left out."""
    out: dict[str, float] = {}
    for line in metrics_text.splitlines():
        if line.startswith("vllm:spec_decode") and "_created" not in line:
            key, _, value = line.rpartition(" ")
            try:
                out[key] = float(value)
            except ValueError:
                continue
    return out


def acceptance(counters: dict[str, float]) -> dict[str, Any]:
    """Acceptance from the counters: accepted over drafted tokens, the mean accepted tokens a draft (vLLM's "mean
    acceptance length" less its bonus token), and per draft position the share accepted."""

    def total(prefix: str) -> float:
        return sum(v for k, v in counters.items() if k.split("{")[0] == prefix)

    drafts = total("vllm:spec_decode_num_drafts_total")
    drafted = total("vllm:spec_decode_num_draft_tokens_total")
    accepted = total("vllm:spec_decode_num_accepted_tokens_total")
    per_position = {}
    for key, value in counters.items():
        if key.startswith("vllm:spec_decode_num_accepted_tokens_per_pos_total") and 'position="' in key:
            position = key.split('position="', 1)[1].split('"', 1)[0]
            per_position[position] = round(value / drafts, 4) if drafts else None
    return {"drafts": drafts, "draft_tokens": drafted, "accepted_tokens": accepted,
            "acceptance_rate": round(accepted / drafted, 4) if drafted else None,
            "mean_accepted_per_draft": round(accepted / drafts, 4) if drafts else None,
            "per_position": dict(sorted(per_position.items()))}


def greedy(base_url: str, model: str, prompts: list[list[int]], tokens: int, *, together: bool) -> list[Any]:
    """GREEDY continuations of every prompt (token ids): one request at a time, or all at once."""
    from kv_quant_host import post

    def one(ids: list[int]) -> Any:
        body = {"model": model, "prompt": ids, "max_tokens": tokens, "temperature": 0, "ignore_eos": True,
                "return_token_ids": True}
        return post(f"{base_url}/v1/completions", body)["choices"][0].get("token_ids")

    if not together:
        return [one(p) for p in prompts]
    with ThreadPoolExecutor(len(prompts)) as pool:
        return list(pool.map(one, prompts))


def first_difference(reference: list[Any], other: list[Any]) -> list[int | None]:
    """Per prompt, the position of the first token that differs (None where identical)."""
    out: list[int | None] = []
    for a, b in zip(reference, other, strict=True):
        a, b = a or [], b or []
        n = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), None)
        out.append(None if n is None and len(a) == len(b) else (n if n is not None else min(len(a), len(b))))
    return out


def fetch(url: str, timeout: float = 30) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return str(response.read().decode())


def card_bytes() -> int:
    out = subprocess.run(["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True, check=True).stdout
    return int(out.split()[0]) << 20


def server_specs(target: Path, qat: Path, drafter: Path, with_qat: bool) -> list[tuple[str, Path, dict[str, str]]]:
    """(name, checkpoint, environment) of every server: the plan as it comes (its attention path `auto`: turing-mma
    on a card sized as a T4), with MTP, with the int8 cache, and with vLLM's own Triton launch (`triton`: another
    16-bit process and other attention kernels, the int8 numerics' control and the fallback reference); QAT with and
    without MTP. `*-mtp-triton` is started only where an MTP server on turing-mma fails."""
    mtp = {"T4SERVE_SPECULATIVE": "mtp", "T4SERVE_DRAFT_MODEL": str(drafter),
           "T4SERVE_NUM_SPECULATIVE_TOKENS": str(NUM_SPECULATIVE_TOKENS)}
    triton = {"T4SERVE_ATTENTION": "triton"}
    specs = [("t4serve", target, {}), ("t4serve-mtp", target, mtp),
             ("kv-int8", target, {"T4SERVE_KV_CACHE_DTYPE": "int8"}), ("t4serve-triton", target, triton),
             ("t4serve-mtp-triton", target, {**mtp, **triton})]
    if with_qat:
        specs += [("qat", qat, {}), ("qat-mtp", qat, mtp)]
    return specs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("work", type=Path)
    parser.add_argument("--inputs", default="512")
    parser.add_argument("--concurrency", default="1,4,8")
    parser.add_argument("--repeats", default="2")
    parser.add_argument("--no-qat", dest="qat", action="store_false")
    parser.add_argument("--no-hf-reference", dest="hf_reference", action="store_false")
    parser.add_argument("--deadline", type=float, default=float(os.environ.get("T4SERVE_GPU_DEADLINE") or 0),
                        help="epoch seconds by which the step must end [T4SERVE_GPU_DEADLINE; 0: 40 minutes]")
    parser.add_argument("--timeout", type=float, default=600, help="seconds a server may take to become ready")
    parser.add_argument("--servers", default="", help="start only these (comma-separated names; default: all)")
    parser.add_argument("--prompts", type=int, default=0,
                        help="the greedy comparison's first N fixed prompts (0: all; the int8 numerics use all)")
    args = parser.parse_args(argv)
    deadline = args.deadline or time.time() + 2400
    import kv_quant_host as kq
    from bench_host import run_sweep
    from realserve import Server, vllm_version, write_json
    from steptiming import ENABLE, read_steps, summarize

    out, work = args.out, args.work
    out.mkdir(parents=True, exist_ok=True)
    began = time.time()
    target = kq.random_checkpoint(work, "bf16-random-layers-x3", rule=kq.layers_x3_rule)
    drafter = drafter_checkpoint(work)
    qat = work / "checkpoints" / "qat"
    record: dict[str, Any] = {"vllm": vllm_version(), "extra_vllm_args": os.environ.get("T4SERVE_GPU_VLLM_ARGS"),
                              "target": str(target), "drafter": str(drafter), "qat": str(qat), "seed": SEED,
                              "greedy_tokens": GREEDY_TOKENS, "num_speculative_tokens": NUM_SPECULATIVE_TOKENS,
                              "checkpoints_s": round(time.time() - began, 1), "deadline": deadline, "servers": {}}
    servers: dict[str, Server] = {}
    for i, (name, ckpt, env) in enumerate(server_specs(target, qat, drafter, args.qat)):
        steps = work / name / "steps"
        shutil.rmtree(steps, ignore_errors=True)
        steps.mkdir(parents=True)
        servers[name] = Server(name, work / name, str(ckpt), 8700 + 10 * i, env={
            "T4SERVE_SIZE_AS": "t4", "T4SERVE_CANARY": "off", **env, "T4SERVE_SERVED_MODEL_NAME": name,
            ENABLE: str(steps)})
    chosen = [n for n in args.servers.split(",") if n] or list(servers)
    unknown = sorted(set(chosen) - set(servers))
    if unknown:
        print(f"--servers: unknown {', '.join(unknown)}; choose from {', '.join(servers)}", file=sys.stderr)
        return 2
    main_four = [n for n in ("t4serve", "t4serve-mtp", "kv-int8", "t4serve-triton") if n in chosen]
    qats = [n for n in servers if n.startswith("qat") and n in chosen]
    record["card_bytes"] = card_bytes()
    together = record["card_bytes"] >= (len(main_four) + len(qats)) * T4_SERVER_BYTES
    record["started_together"] = main_four + (qats if together else [])

    def save() -> None:
        write_json(out / "mtp.json", record)

    def start(names: list[str]) -> list[str]:
        t0 = time.time()
        for n in names:
            servers[n].start()
        ready = []
        for n in names:
            s = servers[n]
            phase = s.wait_phase(("ready", "failed"), max(args.timeout - (time.time() - t0), 1))
            entry = {"phase": phase, "ready_s": round(time.time() - t0, 1), "env": s.environment_added(),
                     "phases": s.state().get("phases"), **kq.kv_figures(s.state())}
            if phase == "ready":
                ready.append(n)
            else:
                entry["log_tail"] = s.log()[-6000:]
                s.kill()
            record["servers"][n] = entry
            print(f"{n}: {phase} after {entry['ready_s']} s; KV figures equal: {entry['equal']}", flush=True)
        save()
        return ready

    def stop(names: list[str]) -> None:
        for n in names:
            servers[n].kill()
            if servers[n].log_path.exists():
                shutil.copy2(servers[n].log_path, out / f"{n}-serve.log")

    def url(n: str) -> str:
        return servers[n].base_url

    try:
        ready = start(record["started_together"])
        # The pair measured: the plan as it comes and with MTP; where either fails, vLLM's own Triton launch.
        ref, mtp = "t4serve", "t4serve-mtp"
        if (not {ref, mtp} <= set(ready) and "t4serve-triton" in ready and "t4serve-mtp-triton" in chosen
                and time.time() < deadline - 600):
            ref, mtp = "t4serve-triton", "t4serve-mtp-triton"
            ready += start([mtp])
        record["pair"] = [ref, mtp]
        prompts = kq.prompts()[: args.prompts or None]
        results: dict[str, Any] = {}

        def job(items: list[tuple[str, Any]]) -> None:
            for key, fn in items:
                if time.time() > deadline - 120:
                    results[key] = {"error": "not run: the step's deadline"}
                    continue
                try:
                    results[key] = fn()
                except Exception as e:  # one server's failure leaves the others' figures
                    results[key] = {"error": f"{type(e).__name__}: {e}"}

        # Each server gets only its own requests: the reference one prompt at a time, then all at once (the
        # control), then the numerics twice; MTP one at a time and all at once; int8 and triton the numerics.
        jobs: list[list[tuple[str, Any]]] = []
        if ref in ready:
            jobs.append([
                ("greedy_one", lambda: greedy(url(ref), ref, prompts, GREEDY_TOKENS, together=False)),
                ("greedy_all", lambda: greedy(url(ref), ref, prompts, GREEDY_TOKENS, together=True)),
                ("kv_auto", lambda: kq.measure(url(ref), ref, until=deadline - 60)),
                ("kv_auto_again", lambda: kq.measure(url(ref), ref, until=deadline - 60))])
        if mtp in ready:
            jobs.append([("mtp_metrics_before", lambda: spec_counters(fetch(f"{url(mtp)}/metrics"))),
                         ("mtp_one", lambda: greedy(url(mtp), mtp, prompts, GREEDY_TOKENS, together=False)),
                         ("mtp_all", lambda: greedy(url(mtp), mtp, prompts, GREEDY_TOKENS, together=True)),
                         ("mtp_metrics_after", lambda: spec_counters(fetch(f"{url(mtp)}/metrics")))])
        for n in ("kv-int8", "t4serve-triton"):
            if n in ready and n != ref:
                jobs.append([(f"kv_{n}", lambda n=n: kq.measure(url(n), n, until=deadline - 60))])
        if "t4serve-triton" in ready and ref != "t4serve-triton":
            jobs[-1].append(("triton_one", lambda: greedy(url("t4serve-triton"), "t4serve-triton", prompts,
                                                          GREEDY_TOKENS, together=False)))
        t0 = time.time()
        threads = [threading.Thread(target=job, args=(items,), daemon=True) for items in jobs]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=max(deadline - time.time(), 0) + 60)
        record["requests_s"] = round(time.time() - t0, 1)
        record["greedy"] = greedy_record(results)
        record["acceptance_greedy"] = acceptance_delta(results)
        record["kv_numerics"] = kv_record(kq, results, control="kv_t4serve-triton")
        save()
        print("greedy:", json.dumps(record["greedy"]["summary"]), flush=True)
        print("acceptance:", json.dumps(record["acceptance_greedy"]), flush=True)
        print("kv numerics:", json.dumps(record["kv_numerics"]), flush=True)

        if {ref, mtp} <= set(ready) and time.time() < deadline - 240:
            before = spec_counters(fetch(f"{url(mtp)}/metrics"))
            cmd = ["t4serve", "bench", "--models", f"{ref},{mtp}", "--base-url", f"{ref}={url(ref)},{mtp}={url(mtp)}",
                   "--tokenizer", str(target), "--inputs", args.inputs, "--concurrency", args.concurrency,
                   "--repeats", args.repeats, "--warmup-run", "--output", str(out / "bench")]
            record["bench_command"] = cmd
            save()
            # The client without the step timing (vLLM's bench client loads the general plugins too).
            client_env = {k: v for k, v in servers[ref].environment().items() if k != ENABLE}
            t0 = time.time()
            record["bench_exit"] = run_sweep(cmd, client_env, max(deadline - 180 - t0, 60))
            t1 = time.time()
            record["bench_s"] = round(t1 - t0, 1)
            record["acceptance_bench"] = acceptance(counter_delta(before, spec_counters(fetch(f"{url(mtp)}/metrics"))))
            record["step_times"] = {
                ref: summarize(read_steps(work / ref / "steps"), 1, since=t0, until=t1),
                mtp: summarize(read_steps(work / mtp / "steps"), 1 + NUM_SPECULATIVE_TOKENS, since=t0, until=t1)}
            print("step times:", json.dumps(record["step_times"]), flush=True)
            save()
        stop(list(servers))
        if qats and not together and time.time() < deadline - 300:
            start(qats)
            stop(qats)
        record["step_records_all"] = {n: summarize(read_steps(work / n / "steps"),
                                                   1 + NUM_SPECULATIVE_TOKENS if "mtp" in n else 1) for n in servers}
        save()
        served = {k: results[v]["logprobs"] for k, v in (("auto", "kv_auto"), ("int8", "kv_kv-int8"))
                  if isinstance(results.get(v), dict) and "logprobs" in results[v]}
        if args.hf_reference and "auto" in served and time.time() < deadline - 200:
            record["kv_numerics"]["independent_reference"] = kq.independent_reference(target, served)
            save()
    finally:
        stop(list(servers))
        for n in servers:
            for f in (work / n / "steps").glob("*"):
                shutil.copy2(f, out / f"{n}-{f.name}")
        save()
    started = [e for e in record["servers"].values()]
    ok = all(e["phase"] == "ready" and all(e["equal"].values()) for e in started)
    return 0 if ok else 1


def counter_delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {k: v - before.get(k, 0.0) for k, v in after.items()}


def acceptance_delta(results: dict[str, Any]) -> dict[str, Any] | None:
    before, after = results.get("mtp_metrics_before"), results.get("mtp_metrics_after")
    if not isinstance(before, dict) or not isinstance(after, dict) or "error" in before or "error" in after:
        return None
    return acceptance(counter_delta(before, after))


def greedy_record(results: dict[str, Any]) -> dict[str, Any]:
    """MTP's greedy tokens against the reference (one prompt at a time), beside the control: the reference with every
    prompt at once; and vLLM's own Triton launch one prompt at a time (another attention kernel), where it ran."""
    from kv_quant_host import greedy_agreement

    reference = results.get("greedy_one")
    out: dict[str, Any] = {"raw": {k: results.get(k) for k in ("greedy_one", "greedy_all", "mtp_one", "mtp_all",
                                                                 "triton_one")}}
    summary: dict[str, Any] = {}
    if isinstance(reference, list):
        for key, name in (("control_all_at_once", "greedy_all"), ("mtp_one_at_a_time", "mtp_one"),
                          ("mtp_all_at_once", "mtp_all"), ("triton_one_at_a_time", "triton_one")):
            other = results.get(name)
            if isinstance(other, list):
                summary[key] = {**greedy_agreement(reference, other),
                                "first_difference": first_difference(reference, other)}
            else:
                summary[key] = other or {"error": "not measured"}
    else:
        summary["error"] = reference or "the reference was not measured"
    out["summary"] = summary
    return out


def kv_record(kq: Any, results: dict[str, Any], control: str) -> dict[str, Any]:
    """kv_quant_host's numerics against the reference (the 16-bit cache): int8, the same server again, and
    `control` (the results' key of another 16-bit process with other kernels), as kv_quant_host.py names them.
    kq.measure sends the whole fixed prompt set whatever --prompts chose for the greedy comparison, so this reads the
    whole set (given the subset, it failed on the GPU host on 2026-12-06)."""
    prompts = kq.prompts()
    reference = results.get("kv_auto")
    out: dict[str, Any] = {}
    if not isinstance(reference, dict) or "logprobs" not in reference:
        return {"error": (reference or {}).get("error", "the 16-bit reference was not measured")}
    out["reference_top1_repeats_previous_token"] = kq.repeats_previous_token(reference["logprobs"], prompts)
    for key, name in (("int8", "kv_kv-int8"), (kq.AGAIN, "kv_auto_again"), (kq.CONTROL, control)):
        other = results.get(name)
        out[key] = kq.numerics(reference, other) if isinstance(other, dict) and "logprobs" in other else (
            other or {"error": "not measured"})
    return out


if __name__ == "__main__":
    sys.exit(main())
