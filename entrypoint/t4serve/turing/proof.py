"""`t4serve attention prove`: prove t4serve's Turing attention against vLLM's real kernel and write the proof.

The child (`t4serve.turing.worker`) compiles every row of the launch table and every FMA combination of step 1 for
sm_75; this process (no torch, no vLLM) judges the figures: each table row fits a T4's 65,536 B of shared memory and
does not spill, each tensor-core row holds HMMA instructions in its sm_75 SASS, and each FMA row spills no more than
the least-spilling combination of its phase and head. Any failure raises PatchError (exit 4) with the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from t4serve.atomic import write_atomic
from t4serve.errors import PatchError, T4ServeError
from t4serve.gpus import TURING, shared_memory_per_block_optin
from t4serve.patch.apply import find_vllm_root, read_vllm_version
from t4serve.patch.locate import TARGET_PATH
from t4serve.patch.proof import run_child
from t4serve.turing.worker import RESULT_PREFIX

TURING_SHARED_MEMORY = shared_memory_per_block_optin(TURING)
WORKER_TIMEOUT_S = 1800
Echo = Callable[[str], None]


def run_worker(target: Path, *, python: str, echo: Echo, step1: bool = True) -> Any:
    command = [python, "-m", "t4serve.turing", str(target)] + ([] if step1 else ["--no-step1"])
    env = dict(os.environ)
    # Empty, not unset: vllm.triton_utils otherwise hands out a placeholder `triton` on a machine without a GPU.
    env["CUDA_VISIBLE_DEVICES"] = ""
    env.pop("TRITON_INTERPRET", None)
    package_parent = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_parent, env.get("PYTHONPATH", "")) if p)
    return run_child(command, env, result_prefix=RESULT_PREFIX, timeout=WORKER_TIMEOUT_S, echo=echo,
                     what="the Turing attention proof", takes="a few minutes on 2 cores",
                     rerun="t4serve attention prove",
                     failure_fix="a vLLM or Triton other than the pinned one (docker/requirements.lock) is the usual "
                     "cause; t4serve.turing.lowering names an instruction Turing lacks")


def check(result: Mapping[str, Any], echo: Echo) -> None:
    """The verdicts over the worker's figures (PatchError on the first that fails)."""
    kernels = result["kernels"]
    problems = []
    for row in kernels:
        where = f"{row['phase']} head {row['head_size']} {row['kv_cache']} ({row['launch']})"
        if row["shared_memory_bytes"] > TURING_SHARED_MEMORY:
            problems.append(f"{where}: {row['shared_memory_bytes']:,} B of shared memory")
        if row["spill_bytes"] > 0:
            problems.append(f"{where}: {row['spill_bytes']} B of spills per thread at {row['registers']} registers")
        if row["tensor_cores"] and row["tensor_core_instructions"] == 0:
            problems.append(f"{where}: no HMMA instruction in its sm_75 SASS")
    best: dict[tuple[str, int], int] = {}
    for row in result.get("step1", []):
        if row["fits"]:
            key = (row["phase"], row["head_size"])
            best[key] = min(best.get(key, row["spill_bytes"]), row["spill_bytes"])
    for row in kernels:
        key = (row["phase"], row["head_size"])
        if not row["tensor_cores"] and key in best and row["spill_bytes"] > best[key]:
            problems.append(f"{row['phase']} head {row['head_size']}: the table's FMA launch spills "
                            f"{row['spill_bytes']} B where another combination spills {best[key]} B")
    if problems:
        raise PatchError(
            "t4serve's Turing attention launches do not hold on sm_75",
            found="; ".join(problems),
            required=f"every launch within {TURING_SHARED_MEMORY:,} B of shared memory and without spills, "
                     "tensor-core launches with HMMA in their SASS, FMA launches spilling least of step 1",
            fix="choose other launches in t4serve/turing/launch.py (docs/verified/turing-attention/ has every "
                "combination's figures); this Triton may generate other code than the pinned one",
        )
    mma = [r for r in kernels if r["tensor_cores"]]
    echo(f"  {len(kernels)} launches: {len(mma)} on tensor cores (HMMA {min(r['hmma'] for r in mma) if mma else 0}-"
         f"{max((r['hmma'] for r in mma), default=0)} per kernel), all within {TURING_SHARED_MEMORY:,} B "
         f"(largest {max(r['shared_memory_bytes'] for r in kernels):,} B), no spills")
    if best:
        least = ", ".join(f"{p} {h}: {b} B" for (p, h), b in sorted(best.items()))
        echo(f"  step 1: least spills per phase and head over {len(result['step1'])} FMA combinations: {least}")


def prove(vllm_root: str | Path | None = None, *, proof_out: str | Path | None = None, step1: bool = True,
          python: str = sys.executable, echo: Echo = print) -> dict[str, Any]:
    started = time.monotonic()
    root = find_vllm_root(vllm_root)
    version = read_vllm_version(root)
    echo(f"t4serve's Turing attention on vLLM {version}'s kernel ({root / TARGET_PATH}):")
    result = run_worker(root / TARGET_PATH, python=python, echo=echo, step1=step1)
    check(result, echo)
    proof = {"vllm_version": version, "arch": "sm_75", "shared_memory_limit": TURING_SHARED_MEMORY,
             "kernels": [{k: row[k] for k in ("kernel", "phase", "head_size", "kv_cache", "launch", "arch",
                                              "tensor_core_instructions", "shared_memory_bytes", "registers",
                                              "spill_bytes", "ffma")} for row in result["kernels"]],
             # Figures only, no timings: the same code proves to the same bytes, so a code-only rebuild of the image
             # keeps the layer that copies the proof (tests/image/test_image.py).
             "step1": [{k: v for k, v in row.items() if k != "seconds"} for row in result.get("step1", [])]}
    if proof_out is not None:
        path = Path(proof_out)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(path, json.dumps(proof, indent=1) + "\n")
        except OSError as exc:
            raise PatchError(f"cannot write the Turing attention proof to {path}", found=str(exc),
                             required=f"write access to {path.parent}", fix="pass --proof-out to a writable path"
                             ) from exc
        echo(f"proof written to {proof_out}")
    echo(f"Turing attention proven for vLLM {version} in {time.monotonic() - started:.1f} s")
    return proof


def main(argv: list[str] | None = None) -> int:
    """`python -m t4serve.turing.proof`: the image's proof stage runs this, with only the proof's own modules
    installed (t4serve.turing.inputs); `t4serve attention prove` is the same with the whole CLI around it."""
    parser = argparse.ArgumentParser(prog="python -m t4serve.turing.proof",
                                     description="prove t4serve's Turing attention launches for sm_75")
    parser.add_argument("--vllm-root", type=Path, help="the vllm package folder (default: the importable vllm)")
    parser.add_argument("--proof-out", type=Path, help="write the proof (JSON) here")
    parser.add_argument("--no-step1", dest="step1", action="store_false", help="skip step 1's FMA sweep")
    args = parser.parse_args(argv)
    try:
        prove(args.vllm_root, proof_out=args.proof_out, step1=args.step1)
    except T4ServeError as exc:
        print(f"t4serve: {exc.message()}", file=sys.stderr)
        return exc.exit_code
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
