"""`t4serve bench` on a GPU host against two bf16 servers sized as a T4 (T4SERVE_SIZE_AS=t4):

- `published`: the published T4 run's flags (`--max-num-seqs 8`, `--max-model-len 16384`, the KV pool sized by
  vLLM's own profiling: T4SERVE_KV_CACHE_MEMORY_BYTES=profile);
- `t4serve`: t4serve's plan as it comes (the pool passed explicitly, max_num_seqs from what it holds).

    python tests/gpu/bench_host.py OUT WORK [published,t4serve]

The third argument picks the servers (default both): one server's sweep fits a 10-minute device call, two may not
(the second session's did not: 11 of 16 runs). Compare two one-server folders with `t4serve bench compare A B`.

Inputs 512 and 4096, concurrency 1, 4, 8, 16, one repeat, the real `vllm bench serve` client; OUT gets bench's
report, plots and raw results, and servers.json (each server's logged figures). The per-stream ceiling printed is
the H200's roofline (t4serve.roofline at its nominal bandwidth), since the card computes at its own speed: memory,
batch and kernel tiles are the T4's, throughput is not. A measuring tool for the GPU host, not a test.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from realserve import Server, vllm_version, write_json


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    out, work = Path(args[0]), Path(args[1])
    chosen = (args[2] if len(args) > 2 else "published,t4serve").split(",")
    ckpt = work / "checkpoints" / "bf16"
    base = {"T4SERVE_SIZE_AS": "t4", "T4SERVE_CANARY": "off"}
    servers = {
        "published": Server("bench-published", work / "bench-published", str(ckpt), 8500, env={
            **base, "T4SERVE_SERVED_MODEL_NAME": "published", "T4SERVE_MAX_NUM_SEQS": "8",
            "T4SERVE_MAX_MODEL_LEN": "16384", "T4SERVE_KV_CACHE_MEMORY_BYTES": "profile"}),
        "t4serve": Server("bench-t4serve", work / "bench-t4serve", str(ckpt), 8501, env={
            **base, "T4SERVE_SERVED_MODEL_NAME": "t4serve"}),
    }
    unknown = sorted(set(chosen) - set(servers))
    if unknown:
        print(f"unknown server(s) {', '.join(unknown)}; choose from {', '.join(servers)}", file=sys.stderr)
        return 2
    servers = {n: s for n, s in servers.items() if n in chosen}
    warm = work / "start-bf16" / "compile"
    for s in servers.values():
        if warm.is_dir() and not (s.root / "compile").exists():
            shutil.copytree(warm, s.root / "compile")
    record: dict[str, object] = {"vllm": vllm_version()}
    try:
        # The profiling server measures free memory: it starts alone, the other once it is ready.
        for name, s in servers.items():
            s.start()
            phase = s.wait_phase(("ready", "failed"), 420)
            record[name] = {"phase": phase, "figures": {k: v.get("value") for k, v in
                                                        (s.state().get("figures") or {}).items()}}
            print(f"{name}: {phase}", flush=True)
            if phase != "ready":
                print(s.log()[-3000:])
                return 1
        from t4serve.checkpoint import probe_local
        from t4serve.gpus import KNOWN_GPUS
        from t4serve.roofline import decode_ceiling

        ceiling = decode_ceiling(probe_local(str(ckpt), ckpt, "local"), KNOWN_GPUS["h200"]).value
        urls = ",".join(f"{n}={s.base_url}" for n, s in servers.items())
        cmd = ["t4serve", "bench", "--models", ",".join(servers), "--base-url", urls, "--tokenizer", str(ckpt),
               "--inputs", "512,4096", "--concurrency", "1,4,8,16", "--repeats", "1",
               "--ceiling", ",".join(f"{n}={ceiling:.1f}" for n in servers), "--output", str(out)]
        record["command"] = cmd
        print(" ".join(cmd), flush=True)
        record["bench_exit"] = subprocess.run(cmd, env=next(iter(servers.values())).environment(),
                                              timeout=540).returncode
    finally:
        for s in servers.values():
            s.kill()
        write_json(out / "servers.json", record)
    return int(record.get("bench_exit", 1) != 0)  # type: ignore[call-overload]


if __name__ == "__main__":
    sys.exit(main())
