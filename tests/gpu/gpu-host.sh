#!/usr/bin/env bash
# The GPU tests on an NVIDIA host without the image, one step per call (each fits a 10-minute window):
#   tests/gpu/gpu-host.sh PARTS STEP OUT
# PARTS holds the site bundle's parts and assemble.sh (a vLLM built for this host's Python and torch); it is
# unpacked once into /tmp/site. Checkpoints and servers live under /tmp/t4serve-gpu, so later steps reuse the
# compile caches of earlier ones while the host stays up. Results (JSON, logs) go to OUT.
#   measure    tests/gpu/compile_memory.py: every compile rung side by side, cold caches, peaks and speed
#   measure-warm   bf16 full and lean, QAT full: cold, speed, then a warm start of each (peaks, ready time)
#   cold       the cold-then-warm start tests at T4 memory (a ballast): bf16, QAT, then bf16 with a profiled pool
#   cold-bf16, cold-qat   one of them
#   cold-profile   bf16 with T4SERVE_KV_CACHE_MEMORY_BYTES=profile, cold then warm, at T4 memory
#   lifecycle  crash/restart/give-up, drain, canary and profile side by side
#   bench      t4serve bench: the published flags against t4serve's plan, 512/4096 in, c=1,4,8,16, one repeat
#   bench-published, bench-t4serve   one of the two servers (one fits a 10-minute call; both may not)
set -euo pipefail
parts=${1:?usage: gpu-host.sh PARTS STEP OUT}; step=${2:?step}; out=${3:?out}
repo=$(cd "$(dirname "$0")/../.." && pwd)
site=/tmp/site work=/tmp/t4serve-gpu
mkdir -p "$out" "$work"
[ -d "$site/vllm" ] || bash "$parts/assemble.sh" "$parts" "$site"
# shellcheck source=/dev/null
source "$repo/tests/gpu/offline-host.sh" "$site"
export T4SERVE_GPU_WORK=$work T4SERVE_GPU_RESULTS=$out T4SERVE_GPU_CHECKPOINTS=$work/checkpoints PYTHONUNBUFFERED=1
[ -f "$work/checkpoints/qat/config.json" ] || python3 "$repo/tests/gpu/write_checkpoints.py" "$work/checkpoints"
cd "$repo"
case $step in
  measure) python3 tests/gpu/compile_memory.py "$out/measure" "$work/checkpoints" --timeout 420 ;;
  measure-warm) python3 tests/gpu/compile_memory.py "$out/measure-warm" "$work/checkpoints" --timeout 300 --warm \
      --configs bf16-full,bf16-lean,qat-full ;;
  cold) python3 -m pytest -s -x -p no:cacheprovider tests/gpu/test_real_serve.py -k cold ;;
  cold-bf16|cold-qat) python3 -m pytest -s -p no:cacheprovider tests/gpu/test_real_serve.py \
      -k "cold_then_warm_start and ${step#cold-}" ;;
  cold-profile) python3 -m pytest -s -p no:cacheprovider tests/gpu/test_real_serve.py -k profile_pool ;;
  lifecycle) python3 -m pytest -s -p no:cacheprovider tests/gpu/test_real_serve.py -k lifecycle ;;
  bench) python3 tests/gpu/bench_host.py "$out/bench" "$work" ;;
  bench-published|bench-t4serve) python3 tests/gpu/bench_host.py "$out/$step" "$work" "${step#bench-}" ;;
  *) echo "unknown step $step" >&2; exit 2 ;;
esac
