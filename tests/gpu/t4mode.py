"""The GPU host's T4 mode: every Triton attention kernel runs the code a T4 runs, on whatever NVIDIA card is present.

A Hopper host compiles vLLM's attention for sm_90 (tensor cores, cp.async, 255 registers) and so hides what a Turing
card does. In this mode (stands in for the T4 itself, which no machine here has):
- the kernels of vLLM's attention modules (ATTENTION_MODULES) are compiled for target sm_75: Triton's Turing code
  generator (FMA for `tl.dot`), or its sm_80 one where t4serve's turing-mma launch asks for it, lowered to sm_75 by
  t4serve.turing.lowering exactly as on a T4;
- each such kernel is assembled by ptxas for sm_75 (its registers, spill bytes, HMMA and FFMA counts in the SASS are
  recorded), and the PTX is what the driver loads, with `.maxnreg` set to the registers ptxas gave it for sm_75: the
  driver JIT-compiles it for the card present within the T4's register budget;
- Triton sees 65,536 B of shared memory per block (a T4's opt-in limit), so a kernel a T4 cannot launch fails here
  too, and vLLM's tile choice (the clamp) is the T4's;
- every load is recorded with the loaded function's registers (cuFuncGetAttribute, through Triton's loader), and a
  function given more registers than its sm_75 budget stops the run.

`install(record_dir)` turns it on in this process; vLLM's processes get it from the `vllm.general_plugins` entry
point `t4mode = t4mode:register` (tests/gpu/offline-host.sh writes it) when T4SERVE_GPU_AS_T4=1. Records:
RECORD_DIR/kernels-PID.jsonl, one line per compile and per load.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import tempfile
import threading
from collections import defaultdict
from pathlib import Path
from typing import Any

ENABLE = "T4SERVE_GPU_AS_T4"
RECORD_DIR = "T4SERVE_GPU_AS_T4_RECORDS"
LAUNCHES = "T4SERVE_GPU_LAUNCHES"
T4_CAPABILITY = 75
T4_SHARED_MEMORY = 65_536
ATTENTION_MODULES = ("vllm.v1.attention.",)
MODE_VERSION = "t4mode-1"

_lock = threading.Lock()
_state: dict[str, Any] = {"installed": False, "records": None}


def is_attention_kernel(module_name: str) -> bool:
    return module_name.startswith(ATTENTION_MODULES)


def _record(entry: dict[str, Any]) -> None:
    directory = _state["records"]
    if directory is None:
        return
    path = Path(directory) / f"kernels-{os.getpid()}.jsonl"
    with _lock, path.open("a") as f:
        f.write(json.dumps(entry) + "\n")


def assemble_for_t4(ptx: str) -> dict[str, Any]:
    """ptxas for sm_75 on the PTX: registers and spill bytes per thread, and the SASS's tensor-core (HMMA) and FMA
    (FFMA) instruction counts. Raises when ptxas refuses the PTX (an instruction Turing lacks, say)."""
    from triton import knobs

    with tempfile.TemporaryDirectory() as tmp:
        src, cubin = Path(tmp) / "k.ptx", Path(tmp) / "k.cubin"
        src.write_text(ptx)
        done = subprocess.run([knobs.nvidia.ptxas.path, "-v", f"--gpu-name=sm_{T4_CAPABILITY}", str(src), "-o",
                               str(cubin)], capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"ptxas for sm_75 refused the kernel: {done.stderr.strip()[-2000:]}")
        registers = re.search(r"Used (\d+) registers", done.stderr)
        spills = re.search(r"(\d+) bytes spill stores", done.stderr)
        sass = subprocess.run([knobs.nvidia.cuobjdump.path, "-sass", str(cubin)], capture_output=True,
                              text=True).stdout
    return {"registers": int(registers.group(1)) if registers else None,
            "spill_bytes": int(spills.group(1)) if spills else 0,
            "hmma": len(re.findall(r"\bHMMA\.", sass)), "ffma": len(re.findall(r"\bFFMA\b", sass))}


def cap_registers(ptx: str, registers: int) -> str:
    """The PTX with `.maxnreg registers` after its thread-count directive (Triton writes `.reqntid`), so the driver's
    JIT gives the kernel the register budget ptxas gives it for sm_75."""
    without = re.sub(r"^\.maxnreg[ \t]+\d+[ \t]*\n", "", ptx, flags=re.MULTILINE)
    directive = re.search(r"^\.(?:reqntid|maxntid)[^\n]*\n", without, flags=re.MULTILINE)
    if directive is None:
        raise RuntimeError("no .reqntid/.maxntid directive in the kernel's PTX to put .maxnreg after")
    return f"{without[:directive.end()]}.maxnreg {registers}\n{without[directive.end():]}"


def _stages_hook(previous: Any) -> Any:
    def hook(*args: Any) -> Any:
        if not args:
            key, digest = previous() if previous is not None else ("", "")
            return f"{key}+{MODE_VERSION}", f"{digest}+{MODE_VERSION}"
        if previous is not None:
            previous(*args)
        backend, stages, options, _language, capability = args
        if int(backend.target.arch) != T4_CAPABILITY:
            return None

        def as_t4(ptx: str, metadata: dict[str, Any]) -> bytes:
            shared = int(metadata.get("shared") or 0)
            name = metadata.get("name")
            if shared > T4_SHARED_MEMORY:
                from triton.runtime.errors import OutOfResources

                raise OutOfResources(shared, T4_SHARED_MEMORY, "shared memory")
            t4 = assemble_for_t4(ptx)
            capped = cap_registers(ptx, t4["registers"]) if t4["registers"] else ptx
            binary = capped.encode() + b"\0"
            entry = {"event": "compile", "kernel": name, "codegen_capability": int(capability),
                     "num_warps": options.num_warps, "maxnreg": options.maxnreg, "shared_memory_bytes": shared,
                     "ptx_mma": len(re.findall(r"^\s*(?:@!?%\w+\s+)?mma\.sync", ptx, re.MULTILINE)),
                     "ptx_fma": len(re.findall(r"^\s*(?:@!?%\w+\s+)?fma\.rn\.f32", ptx, re.MULTILINE)),
                     "sm75": t4, "binary_sha256": hashlib.sha256(binary).hexdigest()}
            _record(entry)
            return binary

        stages["cubin"] = as_t4
        return None

    return hook


def _t4_binder(jit_fn: Any) -> Any:
    """JITFunction.create_binder, with target sm_75."""

    def create() -> Any:
        from triton.backends.compiler import GPUTarget
        from triton.compiler import ASTSource, CompiledKernel, compile, make_backend
        from triton.runtime.jit import create_function_from_signature

        target = GPUTarget("cuda", T4_CAPABILITY, 32)
        backend = make_backend(target)
        jit_fn.CompiledKernel, jit_fn.compile, jit_fn.ASTSource = CompiledKernel, compile, ASTSource
        return {}, {}, target, backend, create_function_from_signature(jit_fn.signature, jit_fn.params, backend)

    return create


def install(record_dir: str | os.PathLike[str] | None = None) -> None:
    """T4 mode in this process (idempotent)."""
    if _state["installed"]:
        return
    from triton import knobs
    from triton.runtime import driver, jit

    if record_dir is not None:
        Path(record_dir).mkdir(parents=True, exist_ok=True)
        _state["records"] = str(record_dir)
    original_binder = jit.JITFunction.create_binder
    probe = original_binder.__code__.co_varnames
    if "target" not in probe:
        raise RuntimeError("this Triton's JITFunction.create_binder has no target: T4 mode needs Triton 3.6-3.8's")

    def create_binder(self: Any) -> Any:
        if is_attention_kernel(self.module):
            return _t4_binder(self)()
        return original_binder(self)

    jit.JITFunction.create_binder = create_binder
    # Kernels already defined captured the old factory at construction.
    for fn in list(jit._triton_jit_function_registry.values()):
        if is_attention_kernel(fn.module):
            if any(caches[0] for caches in fn.device_caches.values()):
                raise RuntimeError(f"{fn.module}:{fn.fn.__qualname__} was compiled before T4 mode was installed")
            fn.device_caches = defaultdict(_t4_binder(fn))
    knobs.runtime.add_stages_inspection_hook = _stages_hook(knobs.runtime.add_stages_inspection_hook)

    utils = driver.active.utils
    real_properties, real_load = utils.get_device_properties, utils.load_binary

    def get_device_properties(device: int) -> dict[str, Any]:
        properties = dict(real_properties(device))
        properties["max_shared_mem"] = min(int(properties["max_shared_mem"]), T4_SHARED_MEMORY)
        return properties

    def load_binary(name: str, binary: bytes, shared: int, device: int) -> Any:
        loaded = real_load(name, binary, shared, device)
        # A kernel of this mode is PTX with its sm_75 budget in `.maxnreg` (also when it comes from Triton's cache,
        # compiled by another process).
        budget = re.search(rb"^\.maxnreg (\d+)$", binary, re.MULTILINE) if binary.startswith(b"//") else None
        if budget is not None:
            _, _, registers, spills, _ = loaded
            cap = int(budget.group(1))
            _record({"event": "load", "kernel": name, "binary_sha256": hashlib.sha256(binary).hexdigest(),
                     "loaded_registers": registers, "loaded_local_bytes": spills, "sm75_registers": cap})
            if registers > cap:
                raise RuntimeError(f"{name}: the driver gave the kernel {registers} registers, over the {cap} "
                                   "ptxas gives it for sm_75")
        return loaded

    utils.get_device_properties, utils.load_binary = get_device_properties, load_binary
    _state["installed"] = True


def register() -> None:
    """The `vllm.general_plugins` entry point: T4 mode in each vLLM process when T4SERVE_GPU_AS_T4=1; with
    T4SERVE_GPU_LAUNCHES (the kernel step's choice.json, tests/gpu/turing_kernels.py) the turing-mma launch table
    becomes the measured choice (in place: the table t4serve's plugin installed is the same object)."""
    if os.environ.get(ENABLE) != "1":
        return
    install(os.environ.get(RECORD_DIR))
    choice = os.environ.get(LAUNCHES)
    if choice:
        from turing_kernels import table_from_choice

        from t4serve.turing import launch

        table = table_from_choice(json.loads(Path(choice).read_text()))
        launch.LAUNCHES.clear()
        launch.LAUNCHES.update(table)
        _record({"event": "launches", "source": choice,
                 "table": {"/".join(map(str, k)): v.describe() for k, v in sorted(table.items())}})


def read_records(directory: Path) -> list[dict[str, Any]]:
    """Every record in a RECORD_DIR, compile and load events of every process."""
    entries = []
    for path in sorted(directory.glob("kernels-*.jsonl")):
        for line in path.read_text().splitlines():
            if line.strip():
                entries.append(json.loads(line))
    return entries
