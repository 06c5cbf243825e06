"""`t4serve bench` on a GPU host against two bf16 servers sized as a T4 (T4SERVE_SIZE_AS=t4), in one recorded run:

- `published`: the published T4 run's flags (`--max-num-seqs 8`, `--max-model-len 16384`, the KV pool sized by
  vLLM's own profiling: T4SERVE_KV_CACHE_MEMORY_BYTES=profile);
- `t4serve`: t4serve's plan as it comes (the pool passed explicitly, max_num_seqs from what it holds).

    python tests/gpu/bench_host.py OUT WORK [--servers published,t4serve] [--inputs 512,4096]
        [--concurrency 16,8,4,1] [--repeats 3] [--waves auto] [--timeout SECONDS] [--kv int8,int4]

Both servers are resident (each sized as a T4 on the H200), so `t4serve bench --base-url` interleaves them pair by
pair: per cell and repeat the two runs back to back, A B then B A, with one client process for the whole sweep;
runs.json, runs.csv and report.md are written after every run, so a hold cut short leaves every complete pair and a
report that says which cells are complete. The cells go 16 streams first (512 then 4,096 tokens), then 8, 4 and 1:
the claims rest on c=16 and c >= 8, so a sweep cut short has decided those first.

Before it starts, it prints tests/gpu/bench_estimate.py's estimate of the step on an H200 from the earlier records
against the step's budget (a 30-minute hold less about 8 minutes of transfers). `--waves auto` (the default) runs
10 x c requests a run where the estimate at the record's speed fits, else the most that fit (and says so); the
sweep itself is stopped by SIGTERM (bench then writes its partial report) where it would run past the budget
(`--timeout`, default what the budget leaves once the servers are up).

Both servers run `--enable-per-request-metrics`, so every request's server-side queue time and TTFT land in vLLM's
detailed results (raw/), beside the /metrics figures t4serve bench keeps per run, and `--jit-monitor-verbose`, so
every Triton kernel compiled while serving is logged with its specialization (vLLM warns only once otherwise);
neither changes scheduling. The sweep runs with `--warmup-run`: each cell once, unrecorded, before its repeats (the
0.33.0 session's first repeats at 512 tokens ran while vLLM JIT-compiled an attention kernel for a new batch shape). The
servers start one after the other (the profiling one first and alone, so nothing else moves the free memory it
measures); the second reuses the first's compile caches (Inductor's and Triton's caches are keyed by content, so
only what differs compiles again). While the sweep runs, every process of both servers is sampled for CPU time
(cpu.json): on a card much faster than a T4 a server can be bound by its CPU rather than its GPU, and this shows it.

OUT gets bench's report, plots and raw results, servers.json (each server's logged figures, phases, argv, vLLM
version) and cpu.json. The per-stream ceiling printed is the H200's roofline (t4serve.planning.roofline at its nominal
bandwidth), since the card computes at its own speed: memory, batch and kernel tiles are the T4's, throughput is not.
With `--kv int8,int4`, issue 34's quantized caches ride along in the same hold: every server then serves E2B bf16
with seeded random weights (tests/gpu/kv_quant_host.py; the weights' values do not change the throughput, and the
numerics need signal), and beside the two a `kv-KIND` server per kind starts with the `t4serve` server (the plan's
settings but for T4SERVE_KV_CACHE_DTYPE). Before the sweep: each one's logged KV figures beside the plan's, and the
numerics (kv_quant_host's fixed prompts: top-1 agreement and the largest log-probability difference against the
`t4serve` server, the 16-bit cache); after it, with what time is left, 4,096 x 16 interleaved over `t4serve` and the
kv servers (OUT/kv-bench). All of it in servers.json's `kv`. The step's end is T4SERVE_GPU_DEADLINE (epoch seconds),
which the session sets from the hold's first call, else the hold less the transfers from the step's start.

A measuring tool for the GPU host, not a test.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from realserve import Server, cmdline, comm, process_tree, vllm_version, write_json

SERVER_FLAGS = "--enable-per-request-metrics --jit-monitor-verbose"


BASE_ENV = {"T4SERVE_SIZE_AS": "t4", "T4SERVE_CANARY": "off", "T4SERVE_VLLM_ARGS": SERVER_FLAGS}


def servers_for(work: Path, ckpt: Path) -> dict[str, Server]:
    return {
        "published": Server("bench-published", work / "bench-published", str(ckpt), 8500, env={
            **BASE_ENV, "T4SERVE_SERVED_MODEL_NAME": "published", "T4SERVE_MAX_NUM_SEQS": "8",
            "T4SERVE_MAX_MODEL_LEN": "16384", "T4SERVE_KV_CACHE_MEMORY_BYTES": "profile"}),
        "t4serve": Server("bench-t4serve", work / "bench-t4serve", str(ckpt), 8501, env={
            **BASE_ENV, "T4SERVE_SERVED_MODEL_NAME": "t4serve"}),
    }


def kv_servers_for(work: Path, ckpt: Path, kinds: list[str]) -> dict[str, Server]:
    """The plan's server with a quantized KV cache (T4SERVE_KV_CACHE_DTYPE), one per kind: `t4serve` with the same
    flags but for the cache, so `t4serve` is their 16-bit reference."""
    return {f"kv-{kind}": Server(f"bench-kv-{kind}", work / f"bench-kv-{kind}", str(ckpt), 8502 + i, env={
        **BASE_ENV, "T4SERVE_SERVED_MODEL_NAME": f"kv-{kind}", "T4SERVE_KV_CACHE_DTYPE": kind})
        for i, kind in enumerate(kinds)}


def step_deadline(step_began: float) -> float:
    """When the step must be done (epoch seconds): T4SERVE_GPU_DEADLINE where the session set it from the hold's
    first call, else a 30-minute hold less the transfers and the packing, from the step's start."""
    from bench_estimate import HOLD_S, PACK_S, TRANSFERS_S

    raw = os.environ.get("T4SERVE_GPU_DEADLINE", "").strip()
    return float(raw) if raw else step_began + HOLD_S - TRANSFERS_S - PACK_S


def kv_bench_repeats(runs_json: Path, models: int, left_s: float, fallback_s: float = 20.0) -> tuple[int, float]:
    """How many repeats of 4,096 x 16 for `models` servers fit in `left_s`, from the sweep's own runs of that cell
    (the median wall time of a run, set-up included; `fallback_s` where the sweep has none): each repeat runs every
    server once, the warm-up a fifth of a run per server, 40 s for the client's start-up. 0 when not even one fits."""
    walls = []
    try:
        for run in json.loads(runs_json.read_text()).get("runs", []):
            timing = run.get("timing") or {}
            if (run.get("input_len"), run.get("concurrency")) == (4096, 16) and timing.get("wall_s"):
                walls.append(float(timing["wall_s"]))
    except (OSError, ValueError):
        pass
    per_run = statistics.median(walls) if walls else fallback_s
    for repeats in (3, 2, 1):
        if 40 + models * per_run * (repeats + 0.2) <= left_s:
            return repeats, per_run
    return 0, per_run


class CpuSampler:
    """Every `interval` s, the cumulative CPU seconds (user + system) of every process in the servers' trees."""

    def __init__(self, servers: dict[str, Server], interval: float = 1.0) -> None:
        self.servers = servers
        self.interval = interval
        self.tick = os.sysconf("SC_CLK_TCK")
        self.samples: list[dict[str, Any]] = []
        self.names: dict[int, dict[str, str]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="cpu-sampler", daemon=True)

    def _cpu(self, pid: int) -> float | None:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            return None
        return (int(fields[11]) + int(fields[12])) / self.tick  # utime, stime (fields 14, 15 of stat(5))

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            row: dict[str, Any] = {"t": round(time.time(), 2)}
            for name, server in self.servers.items():
                if server.proc is None:
                    continue
                for pid in process_tree(server.proc.pid):
                    seconds = self._cpu(pid)
                    if seconds is None:
                        continue
                    self.names.setdefault(pid, {"server": name, "comm": comm(pid), "cmdline": cmdline(pid)[:200]})
                    row[str(pid)] = round(seconds, 2)
            self.samples.append(row)

    def __enter__(self) -> CpuSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def record(self) -> dict[str, Any]:
        """The timeline and, per process, the busiest 1-s rate seen (1.0 = one core saturated)."""
        peak: dict[str, float] = {}
        for before, after in zip(self.samples, self.samples[1:], strict=False):
            dt = after["t"] - before["t"]
            for pid, seconds in after.items():
                if pid != "t" and pid in before and dt > 0:
                    peak[pid] = max(peak.get(pid, 0.0), round((seconds - before[pid]) / dt, 3))
        return {"interval_s": self.interval, "processes": {str(k): v for k, v in self.names.items()},
                "peak_cores": peak, "samples": self.samples}


def run_sweep(cmd: list[str], env: dict[str, str], timeout: float) -> int | str:
    """`t4serve bench` to its end, or, past `timeout`, SIGTERM (bench writes the partial report: every complete
    pair, the cells complete) and, if it has not ended a minute later, SIGKILL (runs.json is current after every
    run either way)."""
    proc = subprocess.Popen(cmd, env=env)
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.terminate()
        try:
            proc.wait(timeout=60)
            return f"stopped by SIGTERM after {timeout:.0f} s"
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            return f"killed after {timeout + 60:.0f} s"


def start_servers(servers: dict[str, Server], first: str, warm: Path, record: dict[str, Any],
                  required: set[str]) -> list[str]:
    """`first` alone (the profiling server measures free memory: nothing else may move it), then every other server
    at once, each seeded with `first`'s compile caches (Inductor's and Triton's caches are keyed by content, so only
    what differs compiles again; the others pass their pool explicitly, so a neighbour's start cannot change their
    sizing). Records each start in `record`; returns the servers that became ready. A server in `required` that
    fails ends the starts (the caller stops)."""
    ready: list[str] = []

    def started(name: str, s: Server, began: float, seed: Path) -> str:
        phase = s.wait_phase(("ready", "failed"), max(600 - (time.time() - began), 1))
        state = s.state()
        record[name] = {"phase": phase, "ready_s": round(time.time() - began, 1),
                        "compile_seeded_from": str(seed) if seed.is_dir() else None,
                        "env": s.environment_added(), "phases": state.get("phases"),
                        "predictions": {k: v.get("value") for k, v in (state.get("predictions") or {}).items()},
                        "figures": {k: v.get("value") for k, v in (state.get("figures") or {}).items()}}
        print(f"{name}: {phase} after {record[name]['ready_s']} s", flush=True)
        if phase == "ready":
            ready.append(name)
        else:
            record[name]["log_tail"] = s.log()[-6000:]
            print(s.log()[-3000:], flush=True)
        return phase

    def seeded(s: Server, seed: Path) -> Path:
        if seed.is_dir() and not (s.root / "compile").exists():
            shutil.copytree(seed, s.root / "compile")
        return seed

    head = servers[first]
    began = time.time()
    seed = seeded(head, warm)
    head.start()
    if started(first, head, began, seed) != "ready" and first in required:
        return ready
    rest = [n for n in servers if n != first]
    began = time.time()
    seeds = {n: seeded(servers[n], head.root / "compile") for n in rest}
    for n in rest:
        servers[n].start()
    for n in rest:
        started(n, servers[n], began, seeds[n])
    return ready


def kv_numerics(servers: dict[str, Server], kinds: list[str], until: float) -> dict[str, Any]:
    """kv_quant_host's numerics: the fixed prompt set's prompt_logprobs and greedy continuations from `t4serve` (the
    16-bit cache), each ready kv server and, where it runs, `published`, all at once (one thread per server, each
    sending one request at a time, so no server's batches change), compared with `t4serve`; nothing is sent after
    `until`. Two controls: `t4serve` measured a second time (`same_server_again`: one process's repeatability), and
    `published` (`control_16bit`: another process with the same checkpoint and the same 16-bit cache), so the
    quantized caches' agreement reads against what the comparison gives when the cache does not change at all (the
    first hold's quantized caches agreed on almost nothing, and so, it turned out, did two 16-bit servers)."""
    from kv_quant_host import measure, numerics, prompts, repeats_previous_token

    names = ["t4serve", *(["published"] if "published" in servers else []), *(f"kv-{k}" for k in kinds)]
    measured: dict[str, Any] = {}

    def one(name: str) -> None:
        try:
            measured[name] = measure(servers[name].base_url, name, until=until)
            if name == "t4serve":  # the same server again: what one process gives twice
                measured["t4serve-again"] = measure(servers[name].base_url, name, until=until)
        except Exception as e:
            measured.setdefault(name, {"error": f"{type(e).__name__}: {e}"})

    threads = [threading.Thread(target=one, args=(n,), daemon=True) for n in names]
    began = time.time()
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=max(until - time.time(), 0) + 70)
    out: dict[str, Any] = {"seconds": round(time.time() - began, 1)}
    reference = measured.get("t4serve") or {"error": "not measured"}
    if "logprobs" in reference:  # how much the reference's top-1 depends on more than the token before it
        out["reference_top1_repeats_previous_token"] = repeats_previous_token(reference["logprobs"], prompts())
    controls = [("same_server_again", "t4serve-again"), *([("control_16bit", "published")]
                                                          if "published" in names else [])]
    for key, name in [*((k, f"kv-{k}") for k in kinds), *controls]:
        other = measured.get(name) or {"error": "not measured"}
        if "error" in reference or "error" in other:
            out[key] = {"error": reference.get("error") or other.get("error")}
            continue
        out[key] = numerics(reference, other)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("work", type=Path)
    parser.add_argument("--servers", default="published,t4serve")
    parser.add_argument("--inputs", default="512,4096")
    parser.add_argument("--concurrency", default="16,8,4,1")
    parser.add_argument("--repeats", default="3")
    parser.add_argument("--waves", default="auto", help="requests per stream in a run, or auto (see above)")
    parser.add_argument("--timeout", type=float, default=None,
                        help="seconds the sweep itself may take [default: what the step's budget leaves]")
    parser.add_argument("--kv", default="", help="quantized KV caches to serve beside `t4serve` (int8,int4): "
                        "their figures, numerics against the 16-bit cache, and 4,096 x 16 after the sweep")
    args = parser.parse_args(argv)
    # The step's start: gpu-host.sh's (it installs the stack and writes the checkpoints first), else now.
    step_began = float(os.environ.get("T4SERVE_GPU_STEP_STARTED") or time.time())
    deadline = step_deadline(step_began)
    from bench_estimate import Cell as EstimateCell
    from bench_estimate import read_record, report, waves_that_fit

    cells = [EstimateCell(int(i), int(c)) for i in args.inputs.split(",") for c in args.concurrency.split(",")]
    waves = args.waves
    if waves == "auto":
        fit = waves_that_fit(read_record(), cells, int(args.repeats), 1.0)
        waves = str(min(max(fit, 1), 10))
        if fit < 10:
            print(f"the estimate does not fit the step's budget with 10 x c requests a run: {waves} x c a run "
                  "(a measured-time budget per run, see the estimate)", flush=True)
    print(report([int(i) for i in args.inputs.split(",")], [int(c) for c in args.concurrency.split(",")],
                 int(args.repeats), int(waves)), flush=True)
    print(f"the step ends by {time.strftime('%H:%M:%S', time.gmtime(deadline))} UTC "
          f"({deadline - time.time():.0f} s from now)", flush=True)
    out, work = args.out, args.work
    kinds = [k for k in args.kv.split(",") if k]
    if not set(kinds) <= {"int8", "int4", "fp8"}:
        print(f"--kv: int8, int4 or fp8, not {args.kv}", file=sys.stderr)
        return 2
    chosen = args.servers.split(",")
    if kinds and "t4serve" not in chosen:
        print("--kv needs the t4serve server (the 16-bit reference)", file=sys.stderr)
        return 2
    if kinds:
        # The numerics need weights that carry signal: every server then serves the seeded random checkpoint (the
        # throughput does not depend on the weights' values).
        from kv_quant_host import random_checkpoint

        ckpt = random_checkpoint(work)
    else:
        ckpt = work / "checkpoints" / "bf16"
    known = servers_for(work, ckpt)
    unknown = sorted(set(chosen) - set(known))
    if unknown:
        print(f"unknown server(s) {', '.join(unknown)}; choose from {', '.join(known)}", file=sys.stderr)
        return 2
    servers = {n: s for n, s in known.items() if n in chosen}
    kv = kv_servers_for(work, ckpt, kinds)
    warm = work / "start-bf16" / "compile"
    record: dict[str, Any] = {"vllm": vllm_version(), "extra_vllm_args": os.environ.get("T4SERVE_GPU_VLLM_ARGS"),
                              "checkpoint": str(ckpt), "deadline": deadline}
    out.mkdir(parents=True, exist_ok=True)
    everything = {**servers, **kv}
    sampler = CpuSampler(everything)
    try:
        with sampler:
            ready = start_servers(everything, next(iter(servers)), warm, record, set(servers))
            if not set(servers) <= set(ready):
                return 1
            kv_ready = [k for k in kinds if f"kv-{k}" in ready]
            if kinds:
                from kv_quant_host import KV_FIGURES, kv_figures

                record["kv"] = {"kinds": kinds, "ready": kv_ready, "figure_keys": list(KV_FIGURES),
                                "figures": {n: kv_figures(everything[n].state())
                                            for n in ["t4serve", *(f"kv-{k}" for k in kinds)] if n in ready}}
                write_json(out / "servers.json", record)
                if kv_ready:
                    record["kv"]["numerics"] = kv_numerics(everything, kv_ready, until=time.time() + 150)
                    print("numerics against the 16-bit cache:", json.dumps(record["kv"]["numerics"]), flush=True)
            from t4serve.gpus import KNOWN_GPUS
            from t4serve.planning.roofline import decode_ceiling
            from t4serve.probes.checkpoint import probe_local

            ceiling = decode_ceiling(probe_local(str(ckpt), ckpt, "local"), KNOWN_GPUS["h200"]).value
            urls = ",".join(f"{n}={s.base_url}" for n, s in servers.items())
            cmd = ["t4serve", "bench", "--models", ",".join(servers), "--base-url", urls, "--tokenizer", str(ckpt),
                   "--inputs", args.inputs, "--concurrency", args.concurrency, "--repeats", args.repeats,
                   "--waves", waves, "--warmup-run", "--ceiling", ",".join(f"{n}={ceiling:.1f}" for n in servers),
                   "--output", str(out / "sweep")]
            record["command"] = cmd
            timeout = args.timeout if args.timeout is not None else max(deadline - time.time(), 60.0)
            record["sweep_timeout_s"] = round(timeout, 1)
            # What is known before the sweep is on disk now: a hold that ends during it still brings this back.
            write_json(out / "servers.json", record)
            print(" ".join(cmd), f"(stopped after {timeout:.0f} s if still running)", flush=True)
            began = time.time()
            record["bench_exit"] = run_sweep(cmd, next(iter(servers.values())).environment(), timeout)
            record["bench_s"] = round(time.time() - began, 1)
            write_json(out / "servers.json", record)
            if kv_ready:
                names = ["t4serve", *(f"kv-{k}" for k in kv_ready)]
                left = deadline - time.time()
                repeats, per_run = kv_bench_repeats(out / "sweep" / "runs.json", len(names), left)
                record["kv"]["bench_plan"] = {"left_s": round(left, 1), "per_run_s": round(per_run, 1),
                                              "repeats": repeats}
                if repeats:
                    kv_cmd = ["t4serve", "bench", "--models", ",".join(names), "--base-url",
                              ",".join(f"{n}={everything[n].base_url}" for n in names), "--tokenizer", str(ckpt),
                              "--inputs", "4096", "--concurrency", "16", "--repeats", str(repeats), "--waves", waves,
                              "--warmup-run", "--output", str(out / "kv-bench")]
                    record["kv"]["bench_command"] = kv_cmd
                    print(" ".join(kv_cmd), flush=True)
                    began = time.time()
                    record["kv"]["bench_exit"] = run_sweep(kv_cmd, everything["t4serve"].environment(),
                                                           max(deadline - time.time(), 30.0))
                    record["kv"]["bench_s"] = round(time.time() - began, 1)
                else:
                    print(f"no time left for 4,096 x 16 on the KV caches ({left:.0f} s left, a run about "
                          f"{per_run:.0f} s)", flush=True)
    finally:
        for s in everything.values():
            s.kill()
            if s.log_path.exists():
                shutil.copy2(s.log_path, out / f"{s.name}-serve.log")
        write_json(out / "servers.json", record)
        write_json(out / "cpu.json", sampler.record())
    return int(record.get("bench_exit") != 0)


if __name__ == "__main__":
    sys.exit(main())
