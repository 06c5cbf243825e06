"""t4serve's turing-mma path installed in vLLM the way vLLM installs it, and its launches run under TRITON_INTERPRET=1
on the CPU against float32 attention: what the launch table changes (prefill's tile and query rows, and the grid
vLLM's upper bound gives them) computes the same attention. The tensor cores themselves are PTX, which the
interpreter does not run: their numerics are the GPU host's (tests/gpu/turing_kernels.py).

    TRITON_INTERPRET=1 CUDA_VISIBLE_DEVICES= T4SERVE_ATTENTION=turing-mma python tests/gpu/turing_interpret.py [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from typing import Any


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print the result as one JSON line last")
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore", category=RuntimeWarning)
    import torch
    from triton import knobs
    from vllm.plugins import load_general_plugins

    # vLLM's own loader finds t4serve's entry point (pyproject.toml) and runs it, as in each of its processes.
    load_general_plugins()
    import vllm.v1.attention.ops.triton_unified_attention as module

    from t4serve.patch import worker
    from t4serve.turing.launch import LAUNCHES, PREFILL, TuringLaunches

    proxy = module.kernel_unified_attention
    seen: list[dict[str, Any]] = []
    result: dict[str, Any] = {
        "installed": isinstance(proxy, TuringLaunches),
        "hook": bool(getattr(knobs.runtime.add_stages_inspection_hook, "t4serve_turing", False)),
        "cases": [],
    }
    if not result["installed"]:
        print(json.dumps(result))
        return 1
    proxy.on_launch = lambda launch, kwargs: seen.append(
        {"BLOCK_M": kwargs["BLOCK_M"], "TILE_SIZE": kwargs["TILE_SIZE"], "launch": launch.describe()})
    # E2B's two layer kinds (a window small enough to cut in at these lengths), a fresh prompt beside a later chunk
    # over cached context and a short one.
    for head, window, block in ((512, 0, 16), (256, 16, 32)):
        batch = worker.make_batch(torch, head, window, block, [0, 13, 30], [20, 9, 5], seed=head)
        reference = worker.reference_attention(torch, batch)
        seen.clear()
        worker.run_unified_attention(module, torch, batch)
        error = float((batch.tensors["out"].float() - reference).abs().max())
        result["cases"].append({"head": head, "window": window, "launches": list(seen), "max_abs_error": error,
                                "table": LAUNCHES[(PREFILL, head, 0)].describe()})
        if not args.json:
            print(f"head {head} window {window or '-'}: {seen} max |error| {error:.2e}")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
