"""`t4serve bench` on a GPU host against two bf16 servers sized as a T4 (T4SERVE_SIZE_AS=t4), in one recorded run:

- `published`: the published T4 run's flags (`--max-num-seqs 8`, `--max-model-len 16384`, the KV pool sized by
  vLLM's own profiling: T4SERVE_KV_CACHE_MEMORY_BYTES=profile);
- `t4serve`: t4serve's plan as it comes (the pool passed explicitly, max_num_seqs from what it holds).

    python tests/gpu/bench_host.py OUT WORK [--servers published,t4serve] [--inputs 512,4096]
        [--concurrency 8,16] [--repeats 3] [--timeout 1500]

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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("work", type=Path)
    parser.add_argument("--servers", default="published,t4serve")
    parser.add_argument("--inputs", default="512,4096")
    parser.add_argument("--concurrency", default="8,16")
    parser.add_argument("--repeats", default="3")
    parser.add_argument("--timeout", type=float, default=1500, help="seconds the sweep itself may take")
    args = parser.parse_args(argv)
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
                   "--warmup-run", "--ceiling", ",".join(f"{n}={ceiling:.1f}" for n in servers),
                   "--output", str(out / "sweep")]
            record["command"] = cmd
            print(" ".join(cmd), flush=True)
            began = time.time()
            try:
                record["bench_exit"] = subprocess.run(cmd, env=next(iter(servers.values())).environment(),
                                                      timeout=args.timeout).returncode
            except subprocess.TimeoutExpired:
                record["bench_exit"] = f"stopped after {args.timeout} s"
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
