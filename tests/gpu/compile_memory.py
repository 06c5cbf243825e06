"""Measure what a first start costs in GPU memory, and what each cheaper compile setting costs in speed.

    python tests/gpu/compile_memory.py OUT_DIR CHECKPOINTS_DIR [--configs NAME,...] [--timeout S]

Starts one `t4serve serve` per configuration (T4SERVE_SIZE_AS=t4, each with its own empty compile caches, so every
start is a cold one) side by side on one big GPU, without a ballast, so none of them can die of the memory a cold
compile takes; tests/gpu/probe_hook records each process's peak. Once all are ready (or dead), each is measured alone:
decode at concurrency 1 and 8 (512 prompt tokens, 128 output), time to first token at 512 and 4096 prompt tokens.
Writes OUT_DIR/compile-memory.json and OUT_DIR/compile-memory.md. A measuring tool for the GPU host, not a test.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from realserve import Server, complete, peak_reserved, random_prompt, vllm_version, write_json

from t4serve.units import GIB

# name -> (checkpoint kind, T4SERVE_COMPILE): each rung of t4serve's compile ladder (t4serve.config.compilation), fixed.
CONFIGS: dict[str, tuple[str, str]] = {
    "bf16-full": ("bf16", "full"),
    "bf16-lean": ("bf16", "lean"),
    "bf16-o1": ("bf16", "o1"),
    "bf16-eager": ("bf16", "eager"),
    "qat-full": ("qat", "full"),
    "qat-eager": ("qat", "eager"),
}


def measure_speed(server: Server, name: str) -> dict[str, object]:
    model = name_of(server)
    # A first request pays one-off costs (the first batch shapes, lazy initialisation): seen in the first session as
    # a 2-6 s "TTFT 512" beside a 0.1 s TTFT at 4096. Warm up first, so each TTFT is the steady state's.
    complete(server.base_url, model, random_prompt(512, 99), 8, stream=True)
    complete(server.base_url, model, random_prompt(4096, 98), 1, stream=True)
    one = complete(server.base_url, model, random_prompt(512, 1), 128, stream=True)
    ttft_4096 = complete(server.base_url, model, random_prompt(4096, 2), 1, stream=True)
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        t0 = time.perf_counter()
        many = list(pool.map(lambda i: complete(server.base_url, model, random_prompt(512, 10 + i), 128), range(8)))
        wall = time.perf_counter() - t0
    ok = [c for c in many if c.error is None]
    tpot = (one.seconds - one.ttft_seconds) / max(one.tokens - 1, 1) if one.ttft_seconds and one.tokens else None
    return {
        "c1_tpot_ms": None if tpot is None else round(tpot * 1000, 3),
        "c1_tokens_per_s": None if tpot is None else round(1 / tpot, 2),
        "c8_output_tokens_per_s": round(sum(c.tokens for c in ok) / wall, 2) if ok else None,
        "ttft_512_ms": None if one.ttft_seconds is None else round(one.ttft_seconds * 1000, 1),
        "ttft_4096_ms": None if ttft_4096.ttft_seconds is None else round(ttft_4096.ttft_seconds * 1000, 1),
        "errors": [c.error for c in [one, ttft_4096, *many] if c.error],  # type: ignore[dict-item]
    }


def name_of(server: Server) -> str:
    """The served model name: the checkpoint folder's name (bf16 or qat), as main() sets it."""
    return server.model.rstrip("/").rsplit("/", 1)[-1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path)
    parser.add_argument("checkpoints", type=Path)
    parser.add_argument("--configs", default=",".join(CONFIGS))
    parser.add_argument("--timeout", type=float, default=420)
    parser.add_argument("--warm", action="store_true",
                        help="then start every server again on the compile cache its cold start wrote: ready time "
                        "and peak memory of a warm start, side by side")
    args = parser.parse_args(argv)
    names = [n for n in args.configs.split(",") if n]
    servers = {}
    for i, name in enumerate(names):
        kind, rung = CONFIGS[name]
        servers[name] = Server(
            name, args.out / name, str(args.checkpoints / kind), 8100 + i,
            env={"T4SERVE_SIZE_AS": "t4", "T4SERVE_CANARY": "off", "T4SERVE_MAX_RESTARTS": "0",
                 "T4SERVE_COMPILE": rung, "T4SERVE_SERVED_MODEL_NAME": kind},
        )
    results: dict[str, dict[str, object]] = {}
    try:
        for s in servers.values():
            s.start()
        deadline = time.time() + args.timeout
        for name, s in servers.items():
            phase = s.wait_phase(("ready", "failed"), max(1.0, deadline - time.time()))
            state = s.state()
            results[name] = {
                "compile": CONFIGS[name][1],
                "phase": phase,
                "ready_seconds": round(time.time() - s.started_at, 1) if phase == "ready" else None,
                "figures": {k: v.get("value") for k, v in (state.get("figures") or {}).items()},
                "peak_reserved_gib": round(peak_reserved(s.probe_dir) / GIB, 3),
                "diagnosis": state.get("diagnosis"),
            }
            print(f"{name}: {phase}, peak reserved {results[name]['peak_reserved_gib']} GiB", flush=True)
        for name, s in servers.items():
            if results[name]["phase"] == "ready":
                speed = measure_speed(s, name)
                results[name].update(speed)
                print(f"{name}: {speed}", flush=True)
            results[name]["peak_reserved_gib"] = round(peak_reserved(s.probe_dir) / GIB, 3)
        if args.warm:
            for s in servers.values():
                s.kill()
            for s in servers.values():
                s.start()  # the same root: its compile cache is warm; state and probe records start empty
            deadline = time.time() + args.timeout
            for name, s in servers.items():
                phase = s.wait_phase(("ready", "failed"), max(1.0, deadline - time.time()))
                figures = s.state().get("figures") or {}
                results[name]["warm"] = {
                    "phase": phase,
                    "ready_seconds": round(time.time() - s.started_at, 1) if phase == "ready" else None,
                    "peak_reserved_gib": round(peak_reserved(s.probe_dir) / GIB, 3),
                    "torch_compile_seconds": (figures.get("torch_compile_seconds") or {}).get("value"),
                }
                print(f"{name} warm: {results[name]['warm']}", flush=True)
    finally:
        for s in servers.values():
            s.kill()
    report = {"vllm": vllm_version(), "configs": results}
    write_json(args.out / "compile-memory.json", report)
    (args.out / "compile-memory.md").write_text(markdown(report))
    print(markdown(report))
    return 0


def markdown(report: dict[str, object]) -> str:
    configs = report["configs"]
    assert isinstance(configs, dict)
    lines = [
        f"vLLM {report['vllm']}, T4SERVE_SIZE_AS=t4, cold compile caches (then warm ones where a warm column is "
        "filled), side by side without a ballast.",
        "",
        "| config | phase | ready s | peak reserved GiB | model GiB | c=1 tok/s | c=8 tok/s | TTFT 512 ms "
        "| TTFT 4096 ms | warm ready s | warm peak GiB |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, r in configs.items():
        fig = r.get("figures") or {}
        warm = r.get("warm") or {}
        assert isinstance(warm, dict)
        lines.append(
            f"| {name} | {r['phase']} | {r.get('ready_seconds')} | {r.get('peak_reserved_gib')} | "
            f"{fig.get('model_memory_gib')} | {r.get('c1_tokens_per_s')} | {r.get('c8_output_tokens_per_s')} | "
            f"{r.get('ttft_512_ms')} | {r.get('ttft_4096_ms')} | {warm.get('ready_seconds', '-')} | "
            f"{warm.get('peak_reserved_gib', '-')} |"
        )
    medians = [r["peak_reserved_gib"] for r in configs.values() if isinstance(r.get("peak_reserved_gib"), float)]
    if medians:
        lines += ["", f"median peak reserved: {statistics.median(medians):.3f} GiB"]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
