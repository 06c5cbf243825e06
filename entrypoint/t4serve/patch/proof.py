"""`t4serve patch verify`: prove the Turing clamp by running vLLM's real code, and write the proof as ClampProof JSON.

Step 1 locates the clamp by syntax tree (here); steps 2 and 4 (compile for sm_75, decision table) and step 3 (the
Triton interpreter against a float32 reference) run in child processes (`t4serve.patch.worker`) so this process
never imports torch or vLLM. Any failed check raises PatchError (exit 4) with the figures that failed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from t4serve.atomic import write_atomic
from t4serve.errors import PatchError
from t4serve.facts import ClampProof
from t4serve.gpus import TURING, shared_memory_per_block_optin
from t4serve.patch.apply import find_vllm_root, read_vllm_version
from t4serve.patch.clamp import CLAMPED_TILE, TARGET_FUNCTION, clamp_sha256, padded_head_size, tile_shared_memory
from t4serve.patch.locate import TARGET_PATH, TileSite, locate
from t4serve.patch.worker import RESULT_PREFIX
from t4serve.serde import to_dict

# The T4's opt-in shared memory per block (CUDA programming guide via t4serve.gpus): the budget every kernel must fit.
TURING_SHARED_MEMORY = shared_memory_per_block_optin(TURING)
# fp16 output of a float32-accumulated attention: about 1e-3 (published-t4-run.md); a wrong mask or tile shows as >=
# 1e-1.
INTERPRETER_TOLERANCE = 5e-3
# The kernels the proof must have compiled: both layer kinds of Gemma 4 E2B, prefill (2D) and decode (3D).
REQUIRED_KERNELS = ("2d/prefill/head256/", "3d/decode/head256/", "2d/prefill/head512/", "3d/decode/head512/")
WORKER_TIMEOUT_S = 600
CLAMP_TARGET = f"vllm/{TARGET_PATH}:{TARGET_FUNCTION}"

Echo = Callable[[str], None]


def _worker_env(*, interpret: bool) -> dict[str, str]:
    env = dict(os.environ)
    # Empty, not unset: vllm.triton_utils otherwise finds no active driver and hands out a placeholder `triton`.
    env["CUDA_VISIBLE_DEVICES"] = ""
    if interpret:
        env["TRITON_INTERPRET"] = "1"
    else:
        env.pop("TRITON_INTERPRET", None)
    # The worker runs from this very package, wherever it is installed or checked out.
    package_parent = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_parent, env.get("PYTHONPATH", "")) if p)
    return env


def run_child(command: list[str], env: Mapping[str, str], *, result_prefix: str, timeout: float, echo: Echo,
              what: str, takes: str, rerun: str, failure_fix: str) -> Any:
    """Run a proof's child Python with a fresh Triton cache (the proof compiles the kernels itself rather than trust a
    cached binary, and leaves nothing in the image's compile-cache volume), echo its lines, and return the JSON of its
    `result_prefix` line; PatchError when it times out, fails or gives no result."""
    try:
        with tempfile.TemporaryDirectory(prefix="t4serve-proof-triton-") as cache_dir:
            completed = subprocess.run(command, env={**env, "TRITON_CACHE_DIR": cache_dir}, capture_output=True,
                                       text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired as exc:
        raise PatchError(
            f"{what} did not finish",
            found=f"no result after {timeout} s",
            required=f"the step to finish ({takes})",
            fix=f"check that the machine is not starved of CPU; rerun `{rerun}`",
        ) from exc
    result: Any = None
    for line in completed.stdout.splitlines():
        if line.startswith(result_prefix):
            result = json.loads(line[len(result_prefix) :])
        else:
            echo(line)
    if completed.returncode != 0 or result is None:
        tail = "\n".join(completed.stderr.strip().splitlines()[-25:])
        raise PatchError(
            f"{what} failed running vLLM's real code (exit {completed.returncode})",
            found=tail or "no output",
            required=f"`{' '.join(command)}` to exit 0 with a result",
            fix=failure_fix,
        )
    return result


def run_worker(mode: str, target: Path, *, python: str, echo: Echo, extra_env: Mapping[str, str] | None = None) -> Any:
    """Run one proof step in a child Python, echo its figures, and return its JSON result."""
    command = [python, "-m", "t4serve.patch", mode, str(target), "--shared-memory", str(TURING_SHARED_MEMORY)]
    env = _worker_env(interpret=mode == "interpret") | dict(extra_env or {})
    return run_child(command, env, result_prefix=RESULT_PREFIX, timeout=WORKER_TIMEOUT_S, echo=echo,
                     what=f"the clamp's {mode} step", takes="about a minute on 2 cores", rerun="t4serve patch verify",
                     failure_fix="read the error above: a vLLM or Triton version other than the one the clamp was "
                     "proven on (docker/requirements.in) is the usual cause")


def check_compile(result: Mapping[str, Any], echo: Echo) -> None:
    """Step 2 and 4's verdicts over the worker's figures."""
    shared: dict[str, int] = result["shared_memory"]
    missing = [k for k in REQUIRED_KERNELS if not any(label.startswith(k) for label in shared)]
    if missing:
        raise PatchError(
            "the compile step did not cover every kernel the clamp must fit",
            found=f"compiled: {sorted(shared)}",
            required=f"a kernel for each of {list(REQUIRED_KERNELS)}",
            fix="vLLM's unified_attention no longer launches these kernels for Gemma 4 E2B's shapes: review the clamp",
        )
    over = {k: v for k, v in shared.items() if v > TURING_SHARED_MEMORY}
    if over:
        raise PatchError(
            "with the clamp, vLLM's attention kernels still need more shared memory than a T4 has",
            found=", ".join(f"{k}: {v:,} B" for k, v in over.items()),
            required=f"every kernel <= {TURING_SHARED_MEMORY:,} B (sm_75 opt-in shared memory per block)",
            fix="the clamp's tile no longer fits this vLLM/Triton: review t4serve/patch/clamp.py",
        )
    unpatched = int(result["unpatched_shared_memory"])
    predicted = tile_shared_memory(padded_head_size(512), 32)
    if unpatched <= TURING_SHARED_MEMORY:
        raise PatchError(
            "vLLM's own tile for head 512 prefill fits a T4: the clamp's premise no longer holds",
            found=f"{result['unpatched_label']}: {unpatched:,} B",
            required=f"> {TURING_SHARED_MEMORY:,} B (published-t4-run.md: {predicted:,} B), or the clamp is not needed",
            fix="drop the clamp for this vLLM/Triton after checking on a T4",
        )
    echo(
        f"  every clamped kernel fits {TURING_SHARED_MEMORY:,} B (largest {max(shared.values()):,} B); vLLM's own "
        f"choice {result['unpatched_label']} needs {unpatched:,} B (predicted {predicted:,} B): the clamp matters"
    )
    differing = result["decisions_differing"]
    if differing:
        raise PatchError(
            "the clamp changes the tile on a device with enough shared memory",
            found=f"{len(differing)} of {result['decisions_checked']} combinations differ, e.g. {differing[:5]}",
            required="vLLM's own tile for every combination at >= 98,304 B",
            fix="review _t4serve_clamp_tile in t4serve/patch/clamp.py",
        )
    if not result["changed_on_t4"]:
        raise PatchError(
            "the clamp changes no tile at a T4's shared memory",
            found="0 combinations changed at 65,536 B",
            required="head-512 tiles above 16 clamped to 16",
            fix="review _t4serve_clamp_tile in t4serve/patch/clamp.py",
        )


def check_interpreter(result: Mapping[str, Any], echo: Echo) -> float:
    error = float(result["max_abs_error"])
    launches = [label for case in result["cases"] for label in case["launches"]]
    clamped = f"2d/prefill/head512/tile{CLAMPED_TILE}"
    if clamped not in launches:
        raise PatchError(
            "the interpreter run did not use the clamped tile for head 512 prefill",
            found=f"launches: {launches}",
            required=f"a launch {clamped}",
            fix="the clamp is not reached from unified_attention: review t4serve/patch/clamp.py",
        )
    if not error <= INTERPRETER_TOLERANCE:
        raise PatchError(
            "vLLM's unified_attention with the clamped tiles disagrees with the float32 reference",
            found=f"max |error| {error:.3e}; per case: "
            + ", ".join(f"{c['layer']} {c['phase']}: {c['max_abs_error']:.2e}" for c in result["cases"]),
            required=f"max |error| <= {INTERPRETER_TOLERANCE:.0e}",
            fix="the clamped kernel computes wrong attention: do not ship this image; report with this output",
        )
    echo(f"  max |error| {error:.2e} <= {INTERPRETER_TOLERANCE:.0e} over {len(result['cases'])} cases")
    return error


def step_locate(path: Path, version: str, echo: Echo) -> TileSite:
    site = locate(path.read_text(encoding="utf-8"), version, filename=str(path))
    if site.state != "patched":
        raise PatchError(
            f"the Turing clamp is not applied to vLLM {version}",
            found=f"vLLM's own {TARGET_FUNCTION} at {path}:{site.function_line}",
            required="t4serve's clamp in place",
            fix="run `t4serve patch apply` (reinstalling vLLM removes the clamp)",
        )
    callers = ", ".join(f"{name} line {line}" for name, line in site.caller_lines.items())
    echo(
        f"step 1: vLLM {version}: {TARGET_FUNCTION} (original at line {site.function_line}, tiles "
        f"{list(site.returned_tiles)}) clamped, callers {callers}; clamp sha256 {clamp_sha256()}"
    )
    return site


def verify(
    vllm_root: str | Path | None = None,
    *,
    skip_interpreter: bool = False,
    proof_out: str | Path | None = None,
    python: str = sys.executable,
    echo: Echo = print,
) -> ClampProof:
    started = time.monotonic()
    root = find_vllm_root(vllm_root)
    version = read_vllm_version(root)
    path = root / TARGET_PATH
    step_locate(path, version, echo)
    compiled = run_worker("compile", path, python=python, echo=echo)
    check_compile(compiled, echo)
    echo(f"  steps 2 and 4 took {compiled['seconds']:.1f} s")
    error: float | None = None
    if skip_interpreter:
        echo("step 3: skipped (--skip-interpreter)")
    else:
        interpreted = run_worker("interpret", path, python=python, echo=echo)
        error = check_interpreter(interpreted, echo)
        echo(f"  step 3 took {interpreted['seconds']:.1f} s")
    proof = ClampProof(
        state="applied",
        vllm_version=version,
        target=CLAMP_TARGET,
        source_sha256=clamp_sha256(),
        shared_memory=dict(compiled["shared_memory"]),
        unpatched_shared_memory=int(compiled["unpatched_shared_memory"]),
        interpreter_max_abs_error=error,
    )
    if proof_out is not None:
        write_proof(Path(proof_out), proof)
        echo(f"proof written to {proof_out}")
    echo(f"clamp proven for vLLM {version} in {time.monotonic() - started:.1f} s")
    return proof


def write_proof(path: Path, proof: ClampProof) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, json.dumps(to_dict(proof), indent=2) + "\n")
    except OSError as exc:
        raise PatchError(
            f"cannot write the clamp proof to {path}",
            found=str(exc),
            required=f"write access to {path.parent}",
            fix="pass --proof-out to a writable path",
        ) from exc
