"""`t4serve bench` on a GPU host against two bf16 servers sized as a T4 (T4SERVE_SIZE_AS=t4), in one recorded run:

- `published`: the published T4 run's flags (`--max-num-seqs 8`, `--max-model-len 16384`, the KV pool sized by
  vLLM's own profiling: T4SERVE_KV_CACHE_MEMORY_BYTES=profile);
- `t4serve`: t4serve's plan as it comes (the pool passed explicitly, max_num_seqs from what it holds).

    python tests/gpu/bench_host.py OUT WORK [--servers published,t4serve] [--inputs 512,4096]
        [--concurrency 16,8,4,1] [--repeats 3] [--waves auto] [--timeout SECONDS]

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
A measuring tool for the GPU host, not a test.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from realserve import Server, cmdline, comm, process_tree, vllm_version, write_json

SERVER_FLAGS = "--enable-per-request-metrics --jit-monitor-verbose"


def servers_for(work: Path, ckpt: Path) -> dict[str, Server]:
    base = {"T4SERVE_SIZE_AS": "t4", "T4SERVE_CANARY": "off", "T4SERVE_VLLM_ARGS": SERVER_FLAGS}
    return {
        "published": Server("bench-published", work / "bench-published", str(ckpt), 8500, env={
            **base, "T4SERVE_SERVED_MODEL_NAME": "published", "T4SERVE_MAX_NUM_SEQS": "8",
            "T4SERVE_MAX_MODEL_LEN": "16384", "T4SERVE_KV_CACHE_MEMORY_BYTES": "profile"}),
        "t4serve": Server("bench-t4serve", work / "bench-t4serve", str(ckpt), 8501, env={
            **base, "T4SERVE_SERVED_MODEL_NAME": "t4serve"}),
    }


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
    args = parser.parse_args(argv)
    # The step's start: gpu-host.sh's (it installs the stack and writes the checkpoints first), else now.
    step_began = float(os.environ.get("T4SERVE_GPU_STEP_STARTED") or time.time())
    from bench_estimate import HOLD_S, PACK_S, TRANSFERS_S, read_record, report, waves_that_fit
    from bench_estimate import Cell as EstimateCell

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
    out, work = args.out, args.work
    ckpt = work / "checkpoints" / "bf16"
    known = servers_for(work, ckpt)
    chosen = args.servers.split(",")
    unknown = sorted(set(chosen) - set(known))
    if unknown:
        print(f"unknown server(s) {', '.join(unknown)}; choose from {', '.join(known)}", file=sys.stderr)
        return 2
    servers = {n: s for n, s in known.items() if n in chosen}
    warm = work / "start-bf16" / "compile"
    record: dict[str, Any] = {"vllm": vllm_version(), "extra_vllm_args": os.environ.get("T4SERVE_GPU_VLLM_ARGS")}
    out.mkdir(parents=True, exist_ok=True)
    sampler = CpuSampler(servers)
    try:
        with sampler:
            # The profiling server measures free memory: it starts alone, the other once it is ready.
            previous: Server | None = None
            for name, s in servers.items():
                seed = previous.root / "compile" if previous is not None else warm
                if seed.is_dir() and not (s.root / "compile").exists():
                    shutil.copytree(seed, s.root / "compile")
                began = time.time()
                s.start()
                phase = s.wait_phase(("ready", "failed"), 600)
                state = s.state()
                record[name] = {"phase": phase, "ready_s": round(time.time() - began, 1),
                                "compile_seeded_from": str(seed) if seed.is_dir() else None,
                                "env": s.environment_added(), "phases": state.get("phases"),
                                "predictions": {k: v.get("value") for k, v in (state.get("predictions") or {}).items()},
                                "figures": {k: v.get("value") for k, v in (state.get("figures") or {}).items()}}
                print(f"{name}: {phase} after {record[name]['ready_s']} s", flush=True)
                if phase != "ready":
                    print(s.log()[-3000:])
                    return 1
                previous = s
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
            budget = HOLD_S - TRANSFERS_S - PACK_S - (time.time() - step_began)
            timeout = args.timeout if args.timeout is not None else max(budget, 60.0)
            record["sweep_timeout_s"] = round(timeout, 1)
            # What is known before the sweep is on disk now: a hold that ends during it still brings this back.
            write_json(out / "servers.json", record)
            print(" ".join(cmd), f"(stopped after {timeout:.0f} s if still running)", flush=True)
            began = time.time()
            record["bench_exit"] = run_sweep(cmd, next(iter(servers.values())).environment(), timeout)
            record["bench_s"] = round(time.time() - began, 1)
    finally:
        for s in servers.values():
            s.kill()
            if s.log_path.exists():
                shutil.copy2(s.log_path, out / f"{s.name}-serve.log")
        write_json(out / "servers.json", record)
        write_json(out / "cpu.json", sampler.record())
    return int(record.get("bench_exit") != 0)


if __name__ == "__main__":
    sys.exit(main())
