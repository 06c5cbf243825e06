"""Copy vLLM's Triton attention kernel out of an installed vLLM into a small folder a GPU machine without vLLM can use.

    /opt/vllm-venv/bin/python tests/gpu/vendor_attention.py tests/gpu/vendored [--vllm-root DIR]

Copies, unchanged, the real files: vllm/_version.py, vllm/v1/attention/ops/triton_unified_attention.py and
triton_attention_helpers.py. Everything else the kernel file imports from vllm is replaced by TEST DOUBLES written
here (vllm.envs, vllm.logger, vllm.platforms, vllm.triton_utils, vllm.v1.kv_cache_interface), each limited to the
names the kernel file uses; the script refuses to run if the kernel file imports anything else from vllm.
The result is a few hundred KiB: `tests/gpu/test_clamp_gpu.py` patches a copy of it and runs it on the GPU.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import shutil
import sys
from pathlib import Path

KERNEL = "v1/attention/ops/triton_unified_attention.py"
REAL_FILES = ("_version.py", KERNEL, "v1/attention/ops/triton_attention_helpers.py")

STAND_IN_NOTE = (
    '"""TEST DOUBLE written by tests/gpu/vendor_attention.py: stands in for vLLM\'s {module} where vLLM is not\n'
    'installed; it provides only what triton_unified_attention.py uses ({names})."""\n'
)

# module -> (names the kernel file may import from it, the stand-in's code)
STAND_INS: dict[str, tuple[frozenset[str], str]] = {
    "vllm.envs": (
        frozenset({"VLLM_BATCH_INVARIANT"}),
        "# vLLM's default: batch invariance off.\nVLLM_BATCH_INVARIANT = False\n",
    ),
    "vllm.logger": (
        frozenset({"init_logger"}),
        "import logging\n\n\n"
        "class _Logger(logging.LoggerAdapter):\n"
        "    def debug_once(self, msg, *args):\n"
        "        self.debug(msg, *args)\n\n"
        "    def info_once(self, msg, *args):\n"
        "        self.info(msg, *args)\n\n"
        "    def warning_once(self, msg, *args):\n"
        "        self.warning(msg, *args)\n\n\n"
        "def init_logger(name):\n"
        "    return _Logger(logging.getLogger(name), {})\n",
    ),
    "vllm.platforms": (
        frozenset({"current_platform"}),
        "import torch\n\n\n"
        "class _CudaPlatform:\n"
        "    # vLLM's CUDA platform: OCP fp8 (e4m3fn); capability families compare the major version.\n"
        "    def fp8_dtype(self):\n"
        "        return torch.float8_e4m3fn\n\n"
        "    def is_device_capability_family(self, capability, device_id=0):\n"
        "        if not torch.cuda.is_available():\n"
        "            return False\n"
        "        major, minor = torch.cuda.get_device_capability(device_id)\n"
        "        return (major * 10 + minor) // 10 == capability // 10\n\n\n"
        "current_platform = _CudaPlatform()\n",
    ),
    "vllm.triton_utils": (
        frozenset({"tl", "triton"}),
        "import triton\nimport triton.language as tl\n",
    ),
}
KV_CACHE_INTERFACE = "vllm.v1.kv_cache_interface"


def installed_vllm_root() -> Path:
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("no vllm importable here: run with /opt/vllm-venv/bin/python or pass --vllm-root")
    return Path(next(iter(spec.submodule_search_locations)))


def kernel_imports(source: str) -> dict[str, set[str]]:
    """vllm modules the kernel file imports at module level -> names it takes from each."""
    found: dict[str, set[str]] = {}
    for node in ast.parse(source).body:
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "vllm":
            found.setdefault(node.module, set()).update(a.name for a in node.names)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "vllm":
                    found.setdefault(alias.name, set())
    return found


def kv_quant_mode_stand_in(real_source: str) -> str:
    """KVQuantMode with the real enum's members and values, read from vLLM's kv_cache_interface.py."""
    for node in ast.parse(real_source).body:
        if isinstance(node, ast.ClassDef) and node.name == "KVQuantMode":
            members = [
                f"    {s.targets[0].id} = {s.value.value}\n"
                for s in node.body
                if isinstance(s, ast.Assign)
                and isinstance(s.targets[0], ast.Name)
                and isinstance(s.value, ast.Constant)
                and isinstance(s.value.value, int)
            ]
            return "from enum import IntEnum\n\n\nclass KVQuantMode(IntEnum):\n" + "".join(members)
    raise SystemExit("vLLM's kv_cache_interface.py has no KVQuantMode: update tests/gpu/vendor_attention.py")


def vendor(dest: Path, vllm_root: Path) -> list[Path]:
    kernel_source = (vllm_root / KERNEL).read_text()
    imports = kernel_imports(kernel_source)
    helpers_module = "vllm." + REAL_FILES[2].removesuffix(".py").replace("/", ".")
    covered = set(STAND_INS) | {KV_CACHE_INTERFACE, helpers_module}
    uncovered = {m: n for m, n in imports.items() if m not in covered}
    too_much = {m: n - STAND_INS[m][0] for m, n in imports.items() if m in STAND_INS and n - STAND_INS[m][0]}
    kv_names = imports.get(KV_CACHE_INTERFACE, set())
    if uncovered or too_much or not kv_names <= {"KVQuantMode"}:
        raise SystemExit(
            f"{vllm_root / KERNEL} imports vllm names this script has no test double for: "
            f"{uncovered or ''} {too_much or ''} {kv_names - {'KVQuantMode'} or ''}; extend STAND_INS"
        )
    package = dest / "vllm"
    if package.exists():
        shutil.rmtree(package)
    written: list[Path] = []
    for relative in REAL_FILES:
        target = package / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(vllm_root / relative, target)
        written.append(target)
    for folder in (package, package / "v1", package / "v1/attention", package / "v1/attention/ops"):
        init = folder / "__init__.py"
        init.write_text('"""Package marker of the vendored vLLM attention kernel (tests/gpu/vendor_attention.py)."""\n')
        written.append(init)
    for module, (names, code) in STAND_INS.items():
        target = package / (module.removeprefix("vllm.").replace(".", "/") + ".py")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(STAND_IN_NOTE.format(module=module, names=", ".join(sorted(names))) + "\n" + code)
        written.append(target)
    kv = package / "v1/kv_cache_interface.py"
    kv_code = kv_quant_mode_stand_in((vllm_root / "v1/kv_cache_interface.py").read_text())
    kv.write_text(STAND_IN_NOTE.format(module=KV_CACHE_INTERFACE, names="KVQuantMode") + "\n" + kv_code)
    written.append(kv)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dest", type=Path, help="folder to write vllm/ into (e.g. tests/gpu/vendored)")
    parser.add_argument("--vllm-root", type=Path, help="the installed vllm package folder (default: importable vllm)")
    args = parser.parse_args(argv)
    root = args.vllm_root or installed_vllm_root()
    written = vendor(args.dest, root)
    size = sum(p.stat().st_size for p in written)
    print(f"vendored vLLM's attention kernel from {root} into {args.dest / 'vllm'}: {len(written)} files, {size:,} B")
    return 0


if __name__ == "__main__":
    sys.exit(main())
