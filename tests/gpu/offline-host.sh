#!/usr/bin/env bash
# Source on an NVIDIA host without the image, where vLLM sits in a site folder SITE (a Python 3.12 with torch):
#   source tests/gpu/offline-host.sh SITE
# puts `t4serve`, `vllm` and `supervisord` on PATH as wrappers around this Python (t4serve from this checkout's
# entrypoint/), exports PYTHONPATH, and applies t4serve's Turing clamp to SITE/vllm (a no-op when it is there), so
# T4SERVE_SIZE_AS=t4 runs the T4's attention tiles. FlashInfer is not in such a site: its sampler is switched off.
site=${1:?usage: source tests/gpu/offline-host.sh SITE}
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
bin=${T4SERVE_WRAPPER_BIN:-/tmp/t4serve-bin}
mkdir -p "$bin"
py=$(command -v python3)
printf '#!/bin/sh\nexec %s -m t4serve "$@"\n' "$py" > "$bin/t4serve"
printf '#!/bin/sh\nexec %s -m vllm.entrypoints.cli.main "$@"\n' "$py" > "$bin/vllm"
printf '#!/bin/sh\nexec %s -m supervisor.supervisord "$@"\n' "$py" > "$bin/supervisord"
chmod +x "$bin"/t4serve "$bin"/vllm "$bin"/supervisord
export PATH="$bin:$PATH" PYTHONPATH="$site:$repo/entrypoint" VLLM_USE_FLASHINFER_SAMPLER=0
"$py" -c "
from t4serve.patch.apply import apply_clamp
r = apply_clamp('$site/vllm')
print(f'clamp {r.action} in {r.path} (vLLM {r.vllm_version})')
"
