"""The quantized KV caches on a GPU host sized as a T4: int8 and int4 against the 16-bit cache, on one checkpoint.

    python3 tests/gpu/kv_quant_host.py OUT WORK [--kinds auto,int8,int4] [--bench] [--no-control]
        [--no-hf-reference] [--timeout 900]

1. Writes WORK/checkpoints/bf16-random: Gemma 4 E2B's bf16 checkpoint (tests/unit/e2b_checkpoint.py) with seeded
   random, non-zero weights (`randomize`, by `init_rule`: linear weights N(0, 1/fan_in), norms 1 + N(0, 0.02), layer
   scalars 1, q_norm tempered, the embedding spread), so attention, and so the KV cache, carries signal (zero weights
   give every cache dtype the same zeros) and rounding does not scramble the outputs.
2. For each T4SERVE_KV_CACHE_DTYPE (auto first: the reference), one `t4serve serve` sized as a T4
   (T4SERVE_SIZE_AS=t4, the canary off: random weights answer nothing sensible): its phase, vLLM's logged KV figures
   (state.json `figures`) beside the plan's (`predictions`), and whether they are equal; a start that fails is
   recorded with its log's tail (a quantized cache vLLM cannot run on the card is then refused by name).
3. The numerics: a fixed prompt set (PROMPT_LENGTHS, seeded token ids, past the 512-token window so the sliding and
   the full layers read the cache) sent with `prompt_logprobs`: at every prompt position vLLM returns the top
   TOP_K tokens with log-probabilities, computed with the cache of this dtype. `compare` gives the top-1 agreement
   with the 16-bit cache over all positions, and the largest difference of the log-probability the two assign to the
   reference's top-1 token (a logit difference less the change of the normaliser), with how many positions lost that
   token from the top TOP_K. Greedy continuations (GREEDY_TOKENS) are compared too. Two controls read beside them
   (unless --no-control): the 16-bit server measured a second time (`same_server_again`), and a second 16-bit server
   with T4SERVE_COMPILE=eager (`control_16bit`: another process and other kernels, no torch.compile, no CUDA graphs),
   started after the quantized caches: what the comparison gives when the cache does not change at all (the first
   hold's two 16-bit servers agreed on 0 of 160 first tokens, so without a control a low agreement means nothing).
   After the servers (unless --no-hf-reference): transformers' Gemma 4 on the same checkpoint, 16-bit and with
   vLLM's int8 rounding (tests/gpu/hf_reference.py), each against the server of its kind: whether vLLM's int8 path
   computes what int8 rounding gives, which random weights cannot hide (docs/verified/numerics-transformers/).
4. With --bench: `t4serve bench` at 4,096 input tokens and 16 streams against each server in turn (its report, raw
   results and the throughput line per dtype in OUT/bench-KIND).

OUT gets kv-quant.json (every figure above, the vLLM version, the servers' settings), each server's log, and the bench
folders. A measuring tool for the GPU host, not a test; tests/unit/test_gpu_kv_quant.py checks its pure parts.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import struct
import subprocess
import sys
import time
import urllib.request
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))

SEED = 34
PROMPT_LENGTHS = (64, 600, 1500, 3000, 6000)
PROMPTS_PER_LENGTH = 4
# The controls' keys in kv-quant.json's numerics, as tests/gpu/bench_host.py names them.
AGAIN = "same_server_again"
CONTROL = "control_16bit"
TOP_K = 5
GREEDY_TOKENS = 32
# Below the smallest E2B vocabulary id the tests' tokenizer maps to a word, above its special tokens.
TOKEN_RANGE = (1000, 200000)
KINDS = ("auto", "int8", "int4")
FLOAT_DTYPES = {"BF16", "F16", "F32"}
CHUNK = 1 << 24  # values generated and written at once
# The figures vLLM logs that the plan states exactly (its memory figures are predictions, compared elsewhere).
KV_FIGURES = ("kv_tokens", "max_concurrency", "max_model_len")


def randomize(directory: Path, seed: int = SEED, workers: int | None = None, rule: Rule | None = None) -> int:
    """Fill every floating-point tensor of the safetensors files in `directory` with seeded random values, in place
    (headers untouched, integer tensors untouched); returns the bytes written. Each CHUNK of a tensor has its own
    seed (the run's, the tensor's name, the chunk's index), so the bytes are the same whatever the number of
    `workers` (default: every core; the E2B checkpoint's 5 billion values take about 90 s on one)."""
    jobs = _fill_jobs(directory, seed, rule or init_rule)
    workers = workers or os.cpu_count() or 1
    if workers == 1 or len(jobs) == 1:
        return sum(map(_fill, jobs))
    import multiprocessing

    with multiprocessing.get_context("fork").Pool(min(workers, len(jobs))) as pool:
        return sum(pool.imap_unordered(_fill, jobs))


# A weights rule: (tensor name, shape) -> (mean, standard deviation).
Rule = Callable[[str, list[int]], tuple[float, float]]
# A slice of one tensor to fill: (file, offset, values, dtype, mean, std, seed key).
FillJob = tuple[str, int, int, str, float, float, tuple[int, int, int]]


def _fill_jobs(directory: Path, seed: int, rule: Rule) -> list[FillJob]:
    jobs: list[FillJob] = []
    for path in sorted(directory.glob("*.safetensors")):
        with path.open("rb") as f:
            (size,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(size))
        base = 8 + size
        for name in sorted(k for k in header if k != "__metadata__"):
            info = header[name]
            if info["dtype"] not in FLOAT_DTYPES:
                continue
            begin, end = info["data_offsets"]
            mean, std = rule(name, info["shape"])
            item = 4 if info["dtype"] == "F32" else 2
            count = (end - begin) // item
            key = zlib.crc32(name.encode())
            for index, start in enumerate(range(0, count, CHUNK)):
                jobs.append((str(path), base + begin + start * item, min(CHUNK, count - start), info["dtype"], mean,
                             std, (seed, key, index)))
    return jobs


def init_rule(name: str, shape: list[int]) -> tuple[float, float]:
    """The (mean, standard deviation) a tensor is filled with. Chosen so that the model's outputs are a function of its
    inputs that small numeric differences do not scramble (tests/gpu/gemma4_numerics_cpu.py: with every tensor random,
    as the first hold had it, two 16-bit runs agreed on 1 % of top-1 tokens, and so did int8 against 16 bits):
    - a layer scalar (Gemma 4 multiplies the residual stream by it after every layer; vLLM's default is 1): 1, so
      the residual path survives (at N(0, 0.02) each layer restarts the stream);
    - q_norm: (1 + N(0, 0.02)) / sqrt(head_dim): Gemma 4 attends with scale 1.0 behind its q/k norms, so norms of 1
      give scores of standard deviation sqrt(head_dim) (16 and 23 in E2B), an attention nearly one-hot whose winner
      any rounding flips; trained norms give scores near 1;
    - the token embedding (tied to the output head): N(0, 4 / sqrt(hidden)), so the logits spread (standard
      deviation about 4) and the top-1 token leads by more than rounding; at 0.02 they are flat over 262,144 tokens;
    - other norms 1 + N(0, 0.02); other matrices N(0, 1/fan_in); the rest (the per-layer embeddings) N(0, 0.02)."""
    if name.endswith("layer_scalar"):
        return 1.0, 0.0
    if "q_norm" in name:
        scale = 1.0 / max(shape[-1], 1) ** 0.5
        return scale, 0.02 * scale
    if name.endswith("embed_tokens.weight") and len(shape) == 2:
        return 0.0, 4.0 / max(shape[-1], 1) ** 0.5
    if "norm" in name:
        return 1.0, 0.02
    if len(shape) == 2 and "embed" not in name:
        return 0.0, 1.0 / max(shape[-1], 1) ** 0.5
    return 0.0, 0.02


POST_NORMS = ("post_attention_layernorm", "post_feedforward_layernorm", "post_per_layer_input_norm")


def layers_x3_rule(name: str, shape: list[int]) -> tuple[float, float]:
    """init_rule with the norms after each attention, MLP and per-layer-input block at 3: the layers, not the input
    token's own embedding, lead the residual stream (under init_rule the top-1 token is the input token again, so every
    kernel agrees on top-1 with every other: tests/gpu/gemma4_numerics_transformers.py found another 16-bit kernel
    at 99.5 % top-1 agreement under this rule, int8 at 10 %)."""
    mean, std = init_rule(name, shape)
    return (3 * mean, 3 * std) if any(n in name for n in POST_NORMS) else (mean, std)


def _fill(job: FillJob) -> int:
    import numpy as np

    path, offset, count, dtype, mean, std, key = job
    values = np.random.default_rng(list(key)).standard_normal(count, dtype=np.float32) * std + mean
    data = _encode(values, dtype)
    fd = os.open(path, os.O_WRONLY)
    try:
        done = 0
        while done < len(data):
            done += os.pwrite(fd, data[done:], offset + done)
    finally:
        os.close(fd)
    return len(data)


def _encode(values: Any, dtype: str) -> bytes:
    import numpy as np

    if dtype == "F32":
        return bytes(values.astype("<f4").tobytes())
    if dtype == "F16":
        return bytes(values.astype("<f2").tobytes())
    # bfloat16: the upper half of each float32, rounded to nearest even.
    bits = values.astype("<f4").view(np.uint32)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    return bytes(rounded.astype("<u2").tobytes())


def prompts(seed: int = SEED) -> list[list[int]]:
    """The fixed prompt set: PROMPTS_PER_LENGTH seeded token-id prompts of each of PROMPT_LENGTHS."""
    rng = random.Random(seed)
    return [[rng.randrange(*TOKEN_RANGE) for _ in range(n)] for n in PROMPT_LENGTHS for _ in range(PROMPTS_PER_LENGTH)]


def top_tokens(prompt_logprobs: list[Any]) -> list[dict[int, float]]:
    """vLLM's `prompt_logprobs` (per position None or {token_id: {"logprob", "rank", ...}}) as {token: logprob} per
    position, the first position (no logprobs) left out."""
    out = []
    for position in prompt_logprobs:
        if position is None:
            continue
        out.append({int(t): float(v["logprob"]) for t, v in position.items()})
    return out


def compare(reference: list[list[dict[int, float]]], other: list[list[dict[int, float]]]) -> dict[str, Any]:
    """Top-1 agreement and the largest log-probability difference on the reference's top-1 token, over every position
    of every prompt (lists of per-prompt, per-position {token: logprob}); and over every token of the reference's top
    TOP_K that the other's top TOP_K holds too, the largest and the mean difference. The top-1 token of a random model
    can lead by so much that its log-probability is 0 to five digits in both (tests/gpu/gemma4_numerics_transformers.py:
    docs/verified/numerics-transformers/), where only the tokens below it still show a difference."""
    positions = agree = missing = 0
    largest = largest_k = total_k = 0.0
    count_k = 0
    for ref_prompt, other_prompt in zip(reference, other, strict=True):
        for ref, oth in zip(ref_prompt, other_prompt, strict=True):
            positions += 1
            ref_top = max(ref, key=lambda t: ref[t])
            oth_top = max(oth, key=lambda t: oth[t])
            agree += ref_top == oth_top
            if ref_top in oth:
                largest = max(largest, abs(ref[ref_top] - oth[ref_top]))
            else:
                missing += 1
            for token in ref.keys() & oth.keys():
                difference = abs(ref[token] - oth[token])
                largest_k = max(largest_k, difference)
                total_k += difference
                count_k += 1
    return {"positions": positions, "top1_agreement": agree / positions if positions else None,
            "largest_top1_logprob_difference": round(largest, 6), f"top1_not_in_top{TOP_K}": missing,
            f"largest_top{TOP_K}_logprob_difference": round(largest_k, 6),
            f"mean_top{TOP_K}_logprob_difference": round(total_k / count_k, 6) if count_k else None}


def repeats_previous_token(logprobs: list[list[dict[int, float]]], prompts: list[list[int]]) -> float | None:
    """The share of positions whose top-1 token is the prompt token just before it: a random model whose output is
    its input token again agrees on top-1 with anything, so its top-1 agreement says little (`top_tokens` drops the
    first position: entry j of a prompt's list is the distribution of token j + 1)."""
    positions = repeats = 0
    for per_position, prompt in zip(logprobs, prompts, strict=True):
        for j, top in enumerate(per_position):
            positions += 1
            repeats += max(top, key=lambda t: top[t]) == prompt[j]
    return repeats / positions if positions else None


def post(url: str, body: dict[str, Any], timeout: float = 600) -> dict[str, Any]:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"content-type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        data: dict[str, Any] = json.loads(response.read())
        return data


def measure(base_url: str, model: str, until: float | None = None) -> dict[str, Any]:
    """prompt_logprobs and a greedy continuation of every prompt, from one server; with `until` (epoch seconds) no
    request is sent after it (TimeoutError) and none waits past it by more than a minute."""
    logprobs: list[list[dict[int, float]]] = []
    greedy: list[Any] = []

    def send(body: dict[str, Any]) -> dict[str, Any]:
        timeout = 600.0
        if until is not None:
            if time.time() >= until:
                raise TimeoutError(f"{model}: the numerics' time ended after {len(greedy)} of {len(prompts())} "
                                   "prompts")
            timeout = until - time.time() + 60
        choice: dict[str, Any] = post(f"{base_url}/v1/completions", body, timeout=timeout)["choices"][0]
        return choice

    for ids in prompts():
        body = {"model": model, "prompt": ids, "max_tokens": 1, "temperature": 0, "prompt_logprobs": TOP_K}
        logprobs.append(top_tokens(send(body)["prompt_logprobs"]))
        body = {"model": model, "prompt": ids, "max_tokens": GREEDY_TOKENS, "temperature": 0, "ignore_eos": True,
                "return_token_ids": True}
        greedy.append(send(body).get("token_ids"))
    return {"logprobs": logprobs, "greedy": greedy}


def greedy_agreement(reference: list[Any], other: list[Any]) -> dict[str, Any]:
    """How many greedy continuations are identical, and the mean length of the common prefix."""
    pairs = [(a or [], b or []) for a, b in zip(reference, other, strict=True)]
    prefix = []
    for a, b in pairs:
        n = 0
        while n < min(len(a), len(b)) and a[n] == b[n]:
            n += 1
        prefix.append(n)
    return {"identical": sum(a == b and bool(a) for a, b in pairs), "of": len(pairs),
            "mean_common_prefix": sum(prefix) / len(prefix) if prefix else None}


def numerics(reference: dict[str, Any], other: dict[str, Any]) -> dict[str, Any]:
    """`measure`'s results of two servers compared: `compare` of their prompt_logprobs and the greedy agreement."""
    return {**compare(reference["logprobs"], other["logprobs"]),
            "greedy": greedy_agreement(reference["greedy"], other["greedy"])}


def kv_figures(state: dict[str, Any]) -> dict[str, Any]:
    """vLLM's logged KV figures beside the plan's, from the wrapper's state.json."""
    figures = {k: v.get("value") for k, v in (state.get("figures") or {}).items()}
    predictions = {k: v.get("value") for k, v in (state.get("predictions") or {}).items()}
    keys = sorted(set(figures) & set(predictions) & set(KV_FIGURES))
    return {"logged": figures, "planned": predictions, "equal": {k: figures[k] == predictions[k] for k in keys}}


def random_checkpoint(work: Path, name: str = "bf16-random", rule: Rule | None = None) -> Path:
    """WORK/checkpoints/NAME: E2B's bf16 checkpoint with seeded random weights by `rule` (init_rule by default),
    written once, under a temporary name renamed when complete, so a step cut short never leaves a half-written
    checkpoint behind."""
    from e2b_checkpoint import write_checkpoint  # type: ignore[import-not-found]

    ckpt = work / "checkpoints" / name
    if not (ckpt / "config.json").is_file():
        tmp = ckpt.with_name(f".{name}.writing")
        shutil.rmtree(tmp, ignore_errors=True)
        began = time.time()
        write_checkpoint(tmp, "bf16", sparse=True, tokenizer=True, processor=True)
        written = randomize(tmp, rule=rule)
        tmp.rename(ckpt)
        print(f"{ckpt}: {written / 2**30:.2f} GiB of seeded random weights in {time.time() - began:.1f} s", flush=True)
    return ckpt


def independent_reference(ckpt: Path, served: dict[str, list[list[dict[int, float]]]]) -> dict[str, Any]:
    """vLLM's servers against transformers on the same checkpoint, kind by kind (tests/gpu/hf_reference.py), or the
    error that stopped it: an extra, so a failure here costs nothing else."""
    began = time.time()
    try:
        from hf_reference import against_servers, reference_logprobs

        result = against_servers(reference_logprobs(ckpt, tuple(served)), served)
    except Exception as e:  # the hold's other figures stand without it
        return {"error": f"{type(e).__name__}: {e}", "seconds": round(time.time() - began, 1)}
    return result | {"seconds": round(time.time() - began, 1)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("work", type=Path)
    parser.add_argument("--kinds", default=",".join(KINDS))
    parser.add_argument("--bench", action="store_true", help="also t4serve bench at 4096 tokens and 16 streams")
    parser.add_argument("--no-control", dest="control", action="store_false",
                        help="skip the 16-bit controls (the reference measured again, a second 16-bit server)")
    parser.add_argument("--no-hf-reference", dest="hf_reference", action="store_false",
                        help="skip transformers' 16-bit and int8 reference after the servers (hf_reference.py)")
    parser.add_argument("--timeout", type=float, default=900, help="seconds a server may take to become ready")
    args = parser.parse_args(argv)
    kinds = args.kinds.split(",")
    if kinds[0] != "auto" or not set(kinds) <= set(KINDS):
        print(f"--kinds: auto first, then any of {', '.join(KINDS[1:])}", file=sys.stderr)
        return 2
    from realserve import Server, vllm_version, write_json

    out, work = args.out, args.work
    out.mkdir(parents=True, exist_ok=True)
    ckpt = random_checkpoint(work)
    record: dict[str, Any] = {"vllm": vllm_version(), "checkpoint": str(ckpt), "seed": SEED,
                              "prompt_lengths": PROMPT_LENGTHS, "prompts_per_length": PROMPTS_PER_LENGTH,
                              "top_k": TOP_K, "servers": {}}
    measured: dict[str, dict[str, Any]] = {}
    # (record key, T4SERVE_KV_CACHE_DTYPE, extra environment): the caches, then the second 16-bit server.
    runs = [(kind, kind, {}) for kind in kinds]
    if args.control:
        runs.append((CONTROL, "auto", {"T4SERVE_COMPILE": "eager"}))
    try:
        for i, (key, kind, extra) in enumerate(runs):
            name = f"kv-{key}"
            server = Server(name, work / name, str(ckpt), 8600 + i, env={
                "T4SERVE_SIZE_AS": "t4", "T4SERVE_CANARY": "off", "T4SERVE_KV_CACHE_DTYPE": kind,
                "T4SERVE_SERVED_MODEL_NAME": name, **extra})
            began = time.time()
            server.start()
            try:
                phase = server.wait_phase(("ready", "failed"), args.timeout)
                entry: dict[str, Any] = {"phase": phase, "ready_s": round(time.time() - began, 1),
                                         "env": server.environment_added(), **kv_figures(server.state())}
                print(f"{name}: {phase} after {entry['ready_s']} s; KV figures equal: {entry['equal']}", flush=True)
                if phase != "ready":
                    entry["log_tail"] = server.log()[-6000:]
                else:
                    measured[key] = measure(server.base_url, name)
                    if key == "auto":  # how much the reference's top-1 depends on more than the token before it
                        record["reference_top1_repeats_previous_token"] = repeats_previous_token(
                            measured[key]["logprobs"], prompts())
                        if args.control:  # the same server again: what one process gives twice
                            measured[AGAIN] = measure(server.base_url, name)
                    # Compared with the 16-bit reference at once: a hold cut short keeps it.
                    compared = AGAIN if key == "auto" else key
                    if compared in measured and "auto" in measured:
                        record.setdefault("numerics", {})[compared] = numerics(measured["auto"], measured[compared])
                    if args.bench and key in kinds:
                        cmd = ["t4serve", "bench", "--models", name, "--base-url",
                               f"{name}={server.base_url}", "--tokenizer", str(ckpt), "--inputs", "4096",
                               "--concurrency", "16", "--repeats", "3", "--warmup-run",
                               "--output", str(out / f"bench-{key}")]
                        entry["bench_command"] = cmd
                        entry["bench_exit"] = subprocess.run(cmd, env=server.environment(), timeout=3600).returncode
                record["servers"][key] = entry
                write_json(out / "kv-quant.json", record)  # after each server: a hold cut short keeps the rest
            finally:
                server.kill()
                if server.log_path.exists():
                    shutil.copy2(server.log_path, out / f"{name}-serve.log")
        if args.hf_reference and "auto" in measured:  # the servers are gone: the GPU is free for transformers
            record["independent_reference"] = independent_reference(
                ckpt, {k: measured[k]["logprobs"] for k in ("auto", "int8") if k in measured})
            write_json(out / "kv-quant.json", record)
        if "numerics" in record:  # each quantized cache was compared as soon as it was measured
            print(json.dumps(record["numerics"], indent=1), flush=True)
    finally:
        write_json(out / "kv-quant.json", record)
    ok = all(e["phase"] == "ready" and all(e["equal"].values()) for e in record["servers"].values())
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
