#!/usr/bin/env bash
# On the GPU host, once every part is in DIR (w.00 ... w.NN from tests/gpu/stack_parts.py, and slim.json): install the
# image's Python stack into SITE as the image build does: the wheels, then docker/slim.json's removals (what the parts
# still hold) and rewrites. Prints the versions. tests/gpu/gpu-host.sh runs it with the checkout's slim.json.
#   usage: bash install-stack.sh DIR SITE        then PYTHONPATH=SITE (tests/gpu/offline-host.sh SITE does this)
set -euo pipefail
dir=${1:?usage: install-stack.sh DIR SITE}; site=${2:?usage: install-stack.sh DIR SITE}
wheels=$(mktemp -d)
cat "$dir"/w.[0-9][0-9] | tar -x -C "$wheels"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$site" "$wheels"/*.whl 2>&1 \
  | grep -v WARNING || true
rm -rf "$wheels"
python3 - "$dir/slim.json" "$site" <<'PY'
import json, pathlib, shutil, sys
site = pathlib.Path(sys.argv[2])
spec = json.loads(pathlib.Path(sys.argv[1]).read_text())
for entry in spec.get("paths", []):
    target = site / entry["path"]
    if target.is_dir():
        shutil.rmtree(target)
    else:
        target.unlink(missing_ok=True)
for rewrite in spec.get("rewrites", []):  # as docker/slim.py applies them at build time
    target = site / rewrite["path"]
    text = target.read_text()
    if text.count(rewrite["old"]) != 1:
        sys.exit(f"install-stack.sh: slim.json rewrites text that {target} does not hold exactly once")
    target.write_text(text.replace(rewrite["old"], rewrite["new"]))
PY
PYTHONPATH=$site python3 -c 'import torch, vllm, triton, transformers; print("vllm", vllm.__version__, "torch", torch.__version__, "triton", triton.__version__, "transformers", transformers.__version__, "nccl", torch.cuda.nccl.version(), "cuda", torch.cuda.is_available())'
