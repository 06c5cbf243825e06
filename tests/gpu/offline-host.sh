#!/usr/bin/env bash
# Source on an NVIDIA host without the image, where vLLM sits in a site folder SITE (a Python 3.12 with torch):
#   source tests/gpu/offline-host.sh SITE
# puts `t4serve`, `vllm` and `supervisord` on PATH as wrappers around this Python (t4serve from this checkout's
# entrypoint/), exports PYTHONPATH, and applies t4serve's Turing clamp to SITE/vllm (a no-op when it is there), so
# T4SERVE_SIZE_AS=t4 runs the T4's attention tiles. FlashInfer is not in such a site: its sampler is switched off.
# vLLM finds its plugins by their distributions' entry points: t4serve's (the attention path, pyproject.toml) comes
# from `pip install` of this checkout into DIST (its metadata; the code still loads from the checkout, first on the
# path), and tests/gpu/t4mode.py's (the GPU host's T4 mode, on only where T4SERVE_GPU_AS_T4=1) and
# tests/gpu/steptiming.py's (each engine step's GPU time, on only where T4SERVE_GPU_STEP_TIMING names a folder) are
# written beside it.
site=${1:?usage: source tests/gpu/offline-host.sh SITE}
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
bin=${T4SERVE_WRAPPER_BIN:-/tmp/t4serve-bin}
dist=${T4SERVE_DIST_DIR:-/tmp/t4serve-dist}
mkdir -p "$bin"
py=$(command -v python3)
printf '#!/bin/sh\nexec %s -m t4serve "$@"\n' "$py" > "$bin/t4serve"
printf '#!/bin/sh\nexec %s -m vllm.entrypoints.cli.main "$@"\n' "$py" > "$bin/vllm"
printf '#!/bin/sh\nexec %s -m supervisor.supervisord "$@"\n' "$py" > "$bin/supervisord"
chmod +x "$bin"/t4serve "$bin"/vllm "$bin"/supervisord
export PATH="$bin:$PATH" PYTHONPATH="$repo/entrypoint:$site:$dist:$repo/tests/gpu" VLLM_USE_FLASHINFER_SAMPLER=0
if [ ! -f "$dist/.installed" ]; then
  rm -rf "$dist" && mkdir -p "$dist"
  (cd "$repo" && "$py" -m pip install -q --no-deps --no-build-isolation --no-index --target "$dist" .) \
    || { echo "offline-host.sh: pip install of t4serve into $dist failed" >&2; return 1; }
  info="$dist/t4serve_gpu_t4mode-0.dist-info"
  mkdir -p "$info"
  printf 'Metadata-Version: 2.1\nName: t4serve-gpu-t4mode\nVersion: 0\n' > "$info/METADATA"
  printf '[vllm.general_plugins]\nt4mode = t4mode:register\nsteptiming = steptiming:register\n' > "$info/entry_points.txt"
  touch "$dist/.installed"
fi
"$py" -c "
from importlib.metadata import entry_points
found = sorted(e.name for e in entry_points(group='vllm.general_plugins'))
print('vllm.general_plugins:', ', '.join(found))
assert 't4serve_turing_attention' in found, found
from t4serve.patch.apply import apply_clamp
r = apply_clamp('$site/vllm')
print(f'clamp {r.action} in {r.path} (vLLM {r.vllm_version})')
"
