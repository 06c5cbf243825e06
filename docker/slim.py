"""Slim the image's venv by docker/slim.json, then prove the serving path still imports. Runs at build time, as root,
with the venv's Python, in two processes (the first one's interpreter started with the removed packages' .pth hooks):

    python3 slim.py remove slim.json             # uninstall, delete, check each is gone; prints what it freed
    python3 slim.py prove slim.json RECORD.json  # import what serving imports, build the OpenAI app, write the record
    python3 slim.py imports slim.json            # the same walk without the removal checks: its record on stdout
    python3 slim.py rewrite slim.json            # only the rewrites (an image before slimming: scripts/image-imports)

`prove` imports what vLLM imports from the moment the server starts until it answers: the CLI and API server, the
engine core and its client, the worker and GPU model runner, the sampler, every structured-output backend and the
grammar libraries they load lazily, the tokenizer and Gemma 4's processor, the Gemma 4 model, the Triton attention
backend, compressed-tensors W4A16 through Marlin, torch.compile's backend. It then builds the FastAPI app exactly as
`vllm serve` does and checks the OpenAI routes are on it. Any ImportError fails the build, so a removal that breaks
serving cannot ship. The record (the top-level packages the walk imported, the routes, vLLM's decisions, the
switches as vLLM reads them) goes to /etc/t4serve/import-proof.json; tests/image/test_slim.py reads it, and
scripts/image-imports runs `imports` in an image before slimming (docs/verified/image-slim/).

No GPU: CUDA_VISIBLE_DEVICES is set empty, as the oracles do, so vllm.triton_utils hands out the real Triton.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import types
from pathlib import Path
from typing import Any

# docker/lazyimports.py, beside this file (the Dockerfile copies both): which imports a function's body takes.
from lazyimports import decide_on_platform, lazy_imports, module_imports

SITE = Path(sysconfig.get_paths()["purelib"])
# Top-level packages imported before the walk (by the interpreter, any .pth hook such as the one nvidia-cutlass-dsl
# installs, and the standard library modules above): not imported by the serving path, so the records leave them out.
STARTUP = {name.split(".")[0] for name in sys.modules}

# What serving imports after the engine starts, by the step that imports it. Module names only: the classes inside
# are what the modules define at import, and a missing dependency fails at that import.
SERVING_MODULES: dict[str, list[str]] = {
    "cli and server": [
        "vllm.entrypoints.cli.main",
        "vllm.entrypoints.cli.serve",
        "vllm.entrypoints.launchers.api_server.entry",
        "vllm.entrypoints.launchers.api_server.routers",
        "vllm.entrypoints.launchers.api_server.app_state",
        "vllm.entrypoints.launchers.app",
        "vllm.entrypoints.generate.api_router",
    ],
    "openai routes and serving": [
        "vllm.entrypoints.openai.api_server",
        "vllm.entrypoints.openai.chat_completion.api_router",
        "vllm.entrypoints.openai.chat_completion.serving",
        "vllm.entrypoints.openai.completion.api_router",
        "vllm.entrypoints.openai.completion.serving",
        "vllm.entrypoints.openai.responses.api_router",
        "vllm.entrypoints.openai.responses.serving",
        "vllm.entrypoints.openai.models.api_router",
        "vllm.entrypoints.openai.models.serving",
        "vllm.entrypoints.anthropic.serving",
        "vllm.entrypoints.serve.tokenize.serving",
    ],
    "engine": [
        "vllm.v1.engine.async_llm",
        "vllm.v1.engine.core",
        "vllm.v1.engine.core_client",
        "vllm.v1.engine.input_processor",
        "vllm.v1.engine.output_processor",
        "vllm.v1.engine.detokenizer",
        "vllm.v1.executor.uniproc_executor",
        "vllm.v1.executor.multiproc_executor",
        "vllm.v1.core.sched.scheduler",
        "vllm.v1.core.kv_cache_utils",
        "vllm.v1.metrics.loggers",
    ],
    "worker and model runner": [
        "vllm.v1.worker.gpu_worker",
        "vllm.v1.worker.gpu.model_runner",
        "vllm.compilation.backends",
        "vllm.compilation.cuda_graph",
        "vllm.model_executor.model_loader.default_loader",
        "vllm.model_executor.model_loader.weight_utils",
    ],
    "sampler": [
        "vllm.v1.worker.gpu.sample.sampler",
        "vllm.v1.sample.ops.topk_topp_sampler",
        "vllm.v1.sample.ops.topk_topp_triton",
        "vllm.v1.worker.gpu.spec_decode.rejection_sampler",
    ],
    # Gemma 4's own drafter (vLLM's method mtp with its assistant checkpoint) and the GPU n-gram proposer.
    "speculative decoding": [
        "vllm.v1.worker.gpu.spec_decode.speculator",
        "vllm.v1.worker.gpu.spec_decode.gemma4.speculator",
        "vllm.v1.worker.gpu.spec_decode.ngram.speculator",
        "vllm.model_executor.models.gemma4_mtp",
    ],
    "structured output": [
        "vllm.v1.structured_output",
        "vllm.v1.structured_output.backend_xgrammar",
        "vllm.v1.structured_output.backend_guidance",
        "vllm.v1.structured_output.backend_outlines",
        "vllm.v1.structured_output.backend_lm_format_enforcer",
        "xgrammar",
        "llguidance",
        "llguidance.hf",
        "llguidance.torch",
        "outlines_core",
        "lmformatenforcer",
    ],
    "tokenizer and processor": [
        "vllm.tokenizers",
        "vllm.tokenizers.hf",
        "vllm.renderers.hf",
        "vllm.reasoning.gemma4_engine_reasoning_parser",
        "vllm.tool_parsers.gemma4_engine_tool_parser",
        "transformers.models.gemma.tokenization_gemma",
        "transformers.models.gemma4.processing_gemma4",
        "transformers.models.gemma4.image_processing_gemma4",
        "transformers.models.gemma4.feature_extraction_gemma4",
        "vllm.multimodal.media.image",
        "vllm.multimodal.media.audio",
        "vllm.multimodal.video_decoders.opencv",
    ],
    "gemma 4 on turing": [
        "vllm.model_executor.models.gemma4",
        "vllm.model_executor.models.gemma4_mm",
        "vllm.v1.attention.backends.triton_attn",
        "vllm.v1.attention.ops.triton_unified_attention",
        "vllm.model_executor.layers.attention.mm_encoder_attention",
        "vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors",
        "vllm.model_executor.layers.quantization.compressed_tensors.schemes.compressed_tensors_wNa16",
        "vllm.model_executor.kernels.linear.mixed_precision.marlin",
    ],
}
# vLLM's compiled CUDA extension that serving imports (module -> library under site-packages); see stand_in_t4. The
# MoE and FlashAttention-2 libraries are slimmed (docker/slim.json), so the walk imports without them, as a T4 does.
CUDA_EXTENSIONS = {
    "vllm._C_stable_libtorch": "vllm/_C_stable_libtorch.abi3.so",
}
OP_NAMESPACES = ("_C", "_C_cache_ops", "_C_custom_ar")
# What vLLM's FlashAttention checks answer on the stand-in T4 once the libraries are gone (see flash_attention_on_t4).
FLASH_ATTENTION_ON_T4 = {
    "package_imported": True,
    "fa2_available": False,
    "fa3_available": False,
    "versions_supported": [],
}
CUTLASS_PROBES = (
    "cutlass_scaled_mm_supports_fp8",
    "cutlass_scaled_mm_supports_block_fp8",
    "cutlass_group_gemm_supported",
    "cutlass_scaled_mm_supports_fp4",
)
# Routes the OpenAI-compatible server must have once the app is built ("generate" task, as for Gemma 4).
REQUIRED_ROUTES = ("/v1/chat/completions", "/v1/completions", "/v1/models", "/health")


def fail(what: str, found: str, required: str, fix: str) -> None:
    print(f"docker/slim.py: {what}\n  found: {found}\n  required: {required}\n  fix: {fix}", file=sys.stderr)
    sys.exit(1)


def load_spec(path: str) -> dict[str, Any]:
    spec: dict[str, Any] = json.loads(Path(path).read_text())
    return spec


def tree_bytes(path: Path) -> int:
    if path.is_symlink() or path.is_file():
        return path.lstat().st_size
    return sum(p.lstat().st_size for p in path.rglob("*") if p.is_file() or p.is_symlink())


def dist_bytes(name: str) -> int:
    files = importlib.metadata.distribution(name).files or []
    return sum(p.stat().st_size for p in (Path(f.locate()) for f in files) if p.is_file())


def remove(spec: dict[str, Any]) -> None:
    names = [d["name"] for d in spec["distributions"]]
    missing = []
    for name in names:
        try:
            importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            missing.append(name)
    if missing:
        fail(
            "docker/slim.json names distributions the lock did not install",
            ", ".join(missing),
            "every listed distribution installed by docker/requirements.lock",
            "drop them from docker/slim.json (a pin changed), after checking the serving path still imports",
        )
    present = [e["name"] for e in spec.get("excluded_from_lock", []) if _installed(e["name"])]
    if present:
        fail(
            "the venv holds distributions docker/slim.json says the lock leaves out",
            ", ".join(present),
            "none of excluded_from_lock installed (docker/requirements.exclude)",
            "regenerate the lock with scripts/lock, or move the entry back to distributions",
        )
    freed = {name: dist_bytes(name) for name in names}
    paths = [SITE / p["path"] for p in spec["paths"]]
    absent = [str(p) for p in paths if not (p.exists() or p.is_symlink())]
    if absent:
        fail(
            "docker/slim.json names paths the installed packages do not have",
            ", ".join(absent),
            "each listed path present in the venv",
            "update docker/slim.json for the pinned versions",
        )
    for path in paths:
        freed[str(path.relative_to(SITE))] = tree_bytes(path)
    rewrites = checked_rewrites(spec)
    subprocess.run([sys.executable, "-m", "pip", "uninstall", "-y", "-q", *names], check=True)
    for path in paths:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()
    # pip leaves the folders of a removed package behind when they held files it did not install (bytecode, empty
    # subfolders); an empty folder still imports as a namespace package, so it goes when no file is left in it.
    for module in sorted({m for d in spec["distributions"] for m in d["modules"]}):
        folder = SITE / module
        if folder.is_dir() and not folder.is_symlink() and not any(p.is_file() for p in folder.rglob("*")):
            shutil.rmtree(folder)
    left = [n for n in names if _installed(n)] + [str(p) for p in paths if p.exists() or p.is_symlink()]
    if left:
        fail(
            "removal left things behind",
            ", ".join(left),
            "none of docker/slim.json's entries installed",
            "read pip's output above",
        )
    apply_rewrites(rewrites)
    for what, size in sorted(freed.items(), key=lambda kv: -kv[1]):
        print(f"  removed {size / 1e6:8.1f} MB  {what}")
    print(
        f"docker/slim.py: removed {len(names)} distributions and {len(paths)} paths, {sum(freed.values()) / 1e9:.2f} GB"
    )


def checked_rewrites(spec: dict[str, Any]) -> list[tuple[Path, str, str]]:
    """slim.json's rewrites as (file, old, new), each old statement found exactly once; else the build fails."""
    rewrites = [(SITE / r["path"], r["old"], r["new"]) for r in spec.get("rewrites", [])]
    for path, old, _ in rewrites:
        found = path.read_text().count(old) if path.is_file() else 0
        if found != 1:
            fail(
                f"docker/slim.json rewrites text that {path} does not hold exactly once",
                f"{found} occurrence(s) of {old.splitlines()[0]!r}",
                "the statement as the pinned vLLM has it, once",
                "update the rewrite in docker/slim.json for the pinned version (or drop it with the path it serves)",
            )
    return rewrites


def apply_rewrites(rewrites: list[tuple[Path, str, str]]) -> None:
    # Imported here, not at the top: STARTUP (the modules the records leave out) must not grow with it.
    import py_compile

    for path, old, replacement in rewrites:
        path.write_text(path.read_text().replace(old, replacement))
        # The runtime user cannot write __pycache__: a stale .pyc would be recompiled in memory at every start.
        py_compile.compile(str(path), doraise=True)
        print(f"  rewrote {path.relative_to(SITE)}: {old.splitlines()[0]!r}", file=sys.stderr)


def removed_module_names(spec: dict[str, Any]) -> list[str]:
    """The top-level modules of every distribution the image lacks: removed here, or never locked."""
    entries = [*spec["distributions"], *spec.get("excluded_from_lock", [])]
    return sorted({m for d in entries for m in d["modules"]})


def _installed(name: str) -> bool:
    try:
        importlib.metadata.distribution(name)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def walk_serving_path(spec: dict[str, Any]) -> dict[str, Any]:
    """Import what serving imports, make vLLM's T4 decisions, build the OpenAI app; fail on the first error."""
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    for name, switch in spec["switches"].items():
        os.environ[name] = switch["value"]
    stand_in_t4()
    imported: list[str] = []
    for step, modules in SERVING_MODULES.items():
        for module in modules:
            try:
                importlib.import_module(module)
            except Exception as exc:  # any failure to import is the finding: report it whole
                fail(
                    f"the serving path no longer imports ({step}: {module})",
                    f"{type(exc).__name__}: {exc}",
                    "every module serving imports after the engine starts",
                    "restore the package it needs (remove it from docker/slim.json) or set the vLLM switch "
                    "that avoids it",
                )
            imported.append(module)
    try:
        decisions = runtime_decisions()
    except Exception as exc:  # a decision that cannot even be made is the finding
        fail(
            "vLLM's runtime choices on a T4 fail in the slimmed venv",
            f"{type(exc).__name__}: {exc}",
            "the sampler built and the kernel chosen without a removed package",
            "set the vLLM switch that avoids the removed package (docker/slim.json switches) or keep the package",
        )
    flash_attention = flash_attention_on_t4()
    warmup = warmup_imports()
    engine = engine_imports()
    routes = build_app_routes()
    lacking = [r for r in REQUIRED_ROUTES if r not in routes]
    if lacking:
        fail(
            "the OpenAI server app lacks routes",
            ", ".join(lacking),
            ", ".join(REQUIRED_ROUTES),
            "read vllm/entrypoints/launchers/api_server/routers.py for what registers them",
        )
    import vllm
    import vllm.envs as envs

    return {
        "vllm_version": vllm.__version__,
        "python": sys.version.split()[0],
        "modules": imported,
        "routes": sorted(routes),
        "decisions_on_t4": decisions,
        "flash_attention_on_t4": flash_attention,
        "warmup_imports_on_t4": warmup,
        "engine_imports_on_t4": engine,
        "switches_as_vllm_reads_them": {name: str(getattr(envs, name)) for name in spec["switches"]},
        "top_level_at_start": sorted(STARTUP),
        "top_level_imported": sorted({name.split(".")[0] for name in sys.modules} - STARTUP),
    }


# The functions vLLM runs once the KV cache is allocated, before it serves, whose own import statements sit inside
# their bodies (module, function): walk_serving_path's module imports never execute those.
WARMUP_FUNCTIONS = (("vllm.model_executor.warmup.kernel_warmup", "kernel_warmup"),)
# The modules of the engine's start and its steps, read whole: every function and method, each import inside a body
# that the T4 stand-in does not rule out imported (the engine core and its executor, the worker, the model runner and
# its warm-up, CUDA graphs, the sampler, Gemma 4 and its drafter, the Triton attention backend).
ENGINE_MODULES = (
    "vllm.v1.engine.core",
    "vllm.v1.executor.uniproc_executor",
    "vllm.v1.worker.gpu_worker",
    "vllm.v1.worker.gpu.model_runner",
    "vllm.v1.worker.gpu.warmup",
    "vllm.v1.worker.gpu.cudagraph_utils",
    "vllm.v1.worker.gpu.sample.sampler",
    "vllm.v1.worker.gpu.spec_decode.gemma4.speculator",
    "vllm.model_executor.models.gemma4",
    "vllm.model_executor.models.gemma4_mtp",
    "vllm.v1.attention.backends.triton_attn",
)
# Imports those bodies may take that cannot import here, and why that is no finding: module -> reason.
ENGINE_IMPORTS_ABSENT_HERE = {
    "vllm.device_allocator.cumem": "loads the driver's libcuda.so.1, which the container toolkit provides on a GPU "
                                   "(Worker.shutdown, sleep mode)",
    "ray": "the Ray executor's node set-up (EngineCoreActorMixin); t4serve serves one GPU with the uniproc executor",
}


def _module_source(module_name: str) -> str:
    spec = importlib.util.find_spec(module_name)
    return Path(spec.origin).read_text() if spec and spec.origin else ""


def _import_or_fail(name: str, what: str, required: str, fix: str) -> None:
    """Import `name`; any failure fails the build (the engine would fail there on a T4, after the KV cache is
    allocated or at a step)."""
    try:
        importlib.import_module(name)
    except Exception as exc:  # any failure to import is the finding
        fail(what, f"{type(exc).__name__}: {exc}", required, fix)


def warmup_imports() -> dict[str, Any]:
    """Import what vLLM's warm-up functions (WARMUP_FUNCTIONS) import inside their bodies on the T4 stand-in; fail on
    the first that cannot be imported. Returns, per function, the modules imported and the imports skipped, with the
    condition that skipped each."""
    import vllm.platforms

    platform = vllm.platforms.current_platform
    out: dict[str, Any] = {}
    for module_name, function in WARMUP_FUNCTIONS:
        taken, skipped = lazy_imports(_module_source(module_name), function,
                                      lambda e: decide_on_platform(platform, e))
        for name in taken:
            _import_or_fail(
                name, f"vLLM's warm-up ({module_name}.{function}) imports {name} on a T4, and it does not import",
                "every module the warm-up imports on a T4 importable in the slimmed venv",
                "restore the package it needs (docker/slim.json) or rewrite the import behind a find_spec guard "
                "(slim.json rewrites)",
            )
        out[f"{module_name}.{function}"] = {"imported": taken, "skipped": skipped}
    return out


def engine_imports() -> dict[str, Any]:
    """Import what every function and method of ENGINE_MODULES imports inside its body on the T4 stand-in, but the
    modules ENGINE_IMPORTS_ABSENT_HERE names; fail on the first that cannot be imported. Returns the functions read,
    the modules imported and those left out with the reason."""
    import vllm.platforms

    platform = vllm.platforms.current_platform
    functions = 0
    imported: set[str] = set()
    for module_name in ENGINE_MODULES:
        read = module_imports(_module_source(module_name), lambda e: decide_on_platform(platform, e))
        functions += len(read)
        for function, taken, _ in read:
            for name in taken:
                if name in ENGINE_IMPORTS_ABSENT_HERE or name in imported:
                    continue
                _import_or_fail(
                    name, f"vLLM's {module_name}.{function} imports {name} on a T4, and it does not import",
                    "every module the engine's functions import on a T4 importable in the slimmed venv",
                    "restore the package it needs (docker/slim.json), rewrite the import behind a find_spec "
                    "guard (slim.json rewrites), or, where it cannot run on a T4, name it in "
                    "ENGINE_IMPORTS_ABSENT_HERE with the reason",
                )
                imported.add(name)
    return {"modules": list(ENGINE_MODULES), "functions": functions, "imported": sorted(imported),
            "absent_here": ENGINE_IMPORTS_ABSENT_HERE}


def prove(spec: dict[str, Any], record: Path) -> None:
    for rewrite in spec.get("rewrites", []):
        text = (SITE / rewrite["path"]).read_text()
        if rewrite["old"] in text or rewrite["new"] not in text:
            fail(
                f"docker/slim.json's rewrite of {rewrite['path']} is not in effect",
                "the old statement still there" if rewrite["old"] in text else "the new text missing",
                "the rewrite applied by `slim.py remove`",
                "run `slim.py remove` before `prove` (the Dockerfile does)",
            )
    removed_modules = removed_module_names(spec)
    # A removed module must not even be findable: a stray .pth or namespace folder would hide a half-removal.
    findable = [m for m in removed_modules if importlib.util.find_spec(m) is not None]
    if findable:
        fail(
            "removed packages are still importable",
            ", ".join(findable),
            "none of them importable",
            "check docker/slim.json's module names against the distributions' top_level.txt",
        )
    data = walk_serving_path(spec)
    leaked = sorted(m for m in removed_modules if m in sys.modules)
    if leaked:
        fail("removed modules appear in sys.modules", ", ".join(leaked), "none", "read the import chain")
    data.update(schema=1, removed_modules=removed_modules)
    record.parent.mkdir(parents=True, exist_ok=True)
    tmp = record.with_name(record.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    tmp.replace(record)
    print(
        f"docker/slim.py: the serving path imports ({len(data['modules'])} modules, "
        f"{len(data['top_level_imported'])} top-level packages, {len(data['routes'])} routes); record {record}"
    )


def stand_in_t4() -> None:
    """Make vLLM import as it does on a T4, without a GPU, so the proof follows the CUDA branches vLLM takes at import
    (`if current_platform.is_cuda(): from ... import ...`) instead of the GPU-less ones.

    vLLM's compiled extension links libcuda.so.1, which only the container toolkit provides at run time: it becomes an
    empty module here, after checking its library is in the image (it is never slimmed). The platform is
    vLLM's CUDA platform with the device queries answered for a T4 (capability 7.5, 15,360 MiB), as
    tests/oracle/kv_oracle.py does; the cutlass capability probes answer as on a T4.
    """
    for name, rel in CUDA_EXTENSIONS.items():
        if not (SITE / rel).is_file():
            fail(
                "a vLLM CUDA extension is missing",
                str(SITE / rel),
                "the library the vllm wheel installs",
                "never slim vLLM's own extensions; restore the path in docker/slim.json",
            )
        sys.modules[name] = types.ModuleType(name)
    import vllm.platforms
    from vllm.platforms.cuda import NonNvmlCudaPlatform
    from vllm.platforms.interface import DeviceCapability

    class T4Platform(NonNvmlCudaPlatform):  # type: ignore[misc]
        @classmethod
        def get_device_capability(cls, device_id: int = 0) -> DeviceCapability:
            return DeviceCapability(7, 5)

        @classmethod
        def get_device_name(cls, device_id: int = 0) -> str:
            return "Tesla T4"

        @classmethod
        def get_device_total_memory(cls, device_id: int = 0) -> int:
            return 15360 * 1024**2

    vllm.platforms.current_platform = T4Platform()
    # The cutlass capability probes vLLM calls while importing the worker live in the stubbed extension; on a T4 they
    # answer False (fp8 and block-fp8 cutlass need capability 8.9 / 9.0).
    import vllm._custom_ops as ops

    for probe in CUTLASS_PROBES:
        setattr(ops, probe, lambda *args, **kwargs: False)
    # Their kernels are looked up in torch.ops when later modules import (for example torch.ops._C.rotary_embedding):
    # with the libraries not loaded each becomes a placeholder that raises if called; importing calls none. Only the
    # ops the library defines (its schema strings name them) get one: vLLM asks `hasattr(torch.ops._C, op)` before
    # registering a fake for an op some builds lack (vllm/_cpu_ops.py), and must get the answer a T4 gives. Installed
    # after vllm._custom_ops, which asks torch.ops whether an op exists before registering its fake.
    import torch._ops

    defined = set().union(*(defined_ops(SITE / rel) for rel in CUDA_EXTENSIONS.values()))
    original = torch._ops._OpNamespace.__getattr__

    def lookup(namespace: Any, name: str) -> Any:
        try:
            return original(namespace, name)
        except AttributeError:
            if namespace.name in OP_NAMESPACES and name in defined:
                return MissingKernel(f"torch.ops.{namespace.name}.{name}")
            raise

    torch._ops._OpNamespace.__getattr__ = lookup


# An operator schema as a compiled library registers it: `rms_norm(Tensor! result, ...) -> ()`.
_SCHEMA = re.compile(
    rb"(?<![A-Za-z0-9_.:])([a-z_][a-z0-9_]*)\((?:Tensor|int|float|bool|str|SymInt|Scalar|ScalarType|Device|\))"
)


def defined_ops(library: Path) -> set[str]:
    """The operator names a compiled extension registers, read from the schema strings in its file."""
    return {m.decode() for m in _SCHEMA.findall(library.read_bytes())}


class MissingKernel:
    """A kernel of a stubbed CUDA extension: raises when called (importing calls none)."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __call__(self, *args: object, **kwargs: object) -> None:
        raise RuntimeError(f"docker/slim.py: kernel {self.name} is not loaded (no GPU at build time)")

    def __getattr__(self, attr: str) -> MissingKernel:
        if attr.startswith("__"):
            raise AttributeError(attr)
        return MissingKernel(f"{self.name}.{attr}")


def runtime_decisions() -> dict[str, object]:
    """The choices vLLM makes once the engine runs on a T4, made here on the stand-in: whether the sampler takes
    FlashInfer (the model runner's Sampler asks `flashinfer_sampler_supported`, which would import FlashInfer without
    VLLM_USE_FLASHINFER_SAMPLER=0), whether FlashInfer and DeepGEMM count as present, and the W4A16 kernel for the
    QAT checkpoint's linear layers (Marlin, not the removed humming kernels)."""
    import torch
    from vllm.model_executor.kernels.linear import choose_mp_linear_kernel
    from vllm.model_executor.kernels.linear.mixed_precision.MPLinearKernel import MPLinearLayerConfig
    from vllm.scalar_type import scalar_types
    from vllm.utils.deep_gemm import is_deep_gemm_supported
    from vllm.utils.flashinfer import has_flashinfer
    from vllm.v1.sample.ops.topk_topp_sampler import flashinfer_sampler_supported

    w4a16 = MPLinearLayerConfig(
        full_weight_shape=(2048, 2048),
        partition_weight_shape=(2048, 2048),
        weight_type=scalar_types.uint4b8,
        act_type=torch.float16,
        group_size=128,
        zero_points=False,
    )
    decisions: dict[str, object] = {
        "flashinfer_sampler": flashinfer_sampler_supported(),
        "has_flashinfer": has_flashinfer(),
        "deep_gemm": is_deep_gemm_supported(),
        "w4a16_kernel": choose_mp_linear_kernel(w4a16, compute_capability=75).__name__,
    }
    expected = {
        "flashinfer_sampler": False,
        "has_flashinfer": False,
        "deep_gemm": False,
        "w4a16_kernel": "MarlinLinearKernel",
    }
    if decisions != expected:
        fail(
            "vLLM decides differently on a T4 than the slimmed image allows",
            json.dumps(decisions),
            json.dumps(expected),
            "set the vLLM switch docker/slim.json names for the differing choice",
        )
    return decisions


def flash_attention_on_t4() -> dict[str, object]:
    """vLLM's FlashAttention package as the T4 path meets it: imported (the attention layers import it on CUDA), with
    no library, and every version refused by vLLM's own check on a T4 (FA2 and FA3 absent, FA4 below its capability),
    so nothing can call a removed kernel. The walk has imported it by now; a failure here is the finding."""
    import vllm.vllm_flash_attn as fa
    from vllm.vllm_flash_attn.flash_attn_interface import FA2_AVAILABLE, FA3_AVAILABLE

    found = {
        "package_imported": "vllm.vllm_flash_attn" in sys.modules,
        "fa2_available": FA2_AVAILABLE,
        "fa3_available": FA3_AVAILABLE,
        "versions_supported": [v for v in (2, 3, 4) if fa.is_fa_version_supported(v)],
    }
    if found != FLASH_ATTENTION_ON_T4:
        fail(
            "vLLM's FlashAttention package is not as the slimmed image needs it on a T4",
            json.dumps(found),
            json.dumps(FLASH_ATTENTION_ON_T4),
            "keep FlashAttention's library (drop it from docker/slim.json) or restore the rewrite of its __init__.py",
        )
    return {**found, "fa2_refused_because": fa.fa_version_unsupported_reason(2)}


def build_app_routes() -> set[str]:
    """The paths on the FastAPI app `vllm serve` builds for a generate model, with the server's own argument parser."""
    from vllm.entrypoints.common.cli_args import make_arg_parser
    from vllm.entrypoints.launchers.app import build_app
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    args = make_arg_parser(FlexibleArgumentParser()).parse_args(["--model", "google/gemma-4-E2B-it"])
    app = build_app(args, supported_tasks=("generate",))
    return {path for route in app.routes if isinstance(path := getattr(route, "path", None), str)}


def main(argv: list[str]) -> None:
    if len(argv) == 2 and argv[0] == "remove":
        remove(load_spec(argv[1]))
    elif len(argv) == 3 and argv[0] == "prove":
        prove(load_spec(argv[1]), Path(argv[2]))
    elif len(argv) == 2 and argv[0] == "imports":
        print(json.dumps(walk_serving_path(load_spec(argv[1])), sort_keys=True))
    elif len(argv) == 2 and argv[0] == "rewrite":
        apply_rewrites(checked_rewrites(load_spec(argv[1])))
    else:
        fail("bad arguments", " ".join(argv), "remove SPEC | prove SPEC RECORD | imports SPEC | rewrite SPEC",
             "see the docstring")


if __name__ == "__main__":
    main(sys.argv[1:])
