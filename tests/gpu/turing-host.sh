#!/usr/bin/env bash
# Issue 43's kernel measurements on an NVIDIA host with its own torch and no vLLM, one step per call (or queued by
# tests/gpu/session.sh with T4SERVE_GPU_RUNNER=tests/gpu/turing-host.sh):
#   tests/gpu/turing-host.sh PARTS kernels OUT
# PARTS holds the image's Triton (its cp312 wheel, less the files docker/slim.json removes, split as t.00 ... t.NN),
# installed into /tmp/turing-site; vLLM's attention kernel comes from tests/gpu/vendored (tests/gpu/vendor_attention.py
# copies the image's clamped kernel files and writes test doubles for the rest of vLLM they import). The host's own
# torch runs the tensors and CUDA graphs; the kernels are the image's Triton's. Then tests/gpu/turing_kernels.py in
# T4 mode writes OUT/kernels.
set -euo pipefail
parts=${1:?usage: turing-host.sh PARTS STEP OUT}; step=${2:?step}; out=${3:?out}
repo=$(cd "$(dirname "$0")/../.." && pwd)
site=/tmp/turing-site
mkdir -p "$out"
[ -f "$repo/tests/gpu/vendored/vllm/v1/attention/ops/triton_unified_attention.py" ] || {
  echo "turing-host.sh: no tests/gpu/vendored (run tests/gpu/vendor_attention.py and carry it)" >&2; exit 2; }
if [ ! -d "$site/triton" ]; then
  wheel=$(mktemp -d)/triton-3.8.0-cp312-cp312-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl
  cat "$parts"/t.[0-9][0-9] > "$wheel"
  python3 -m pip install -q --no-index --no-deps --no-compile --target "$site" "$wheel" 2>&1 | grep -v WARNING || true
fi
export PYTHONPATH="$site:$repo/tests/gpu/vendored:$repo/entrypoint:$repo/tests/gpu" PYTHONUNBUFFERED=1
python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__, torch.cuda.get_device_name())'
cd "$repo"
case $step in
  # shellcheck disable=SC2086
  kernels) python3 tests/gpu/turing_kernels.py "$out/kernels" ${T4SERVE_GPU_TURING_ARGS:-} ;;
  *) echo "unknown step $step" >&2; exit 2 ;;
esac
