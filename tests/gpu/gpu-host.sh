#!/usr/bin/env bash
# The GPU tests on an NVIDIA host without the image, one step per call (or queued by tests/gpu/session.sh):
#   tests/gpu/gpu-host.sh PARTS STEP OUT
# PARTS holds one of two bundles, installed once into /tmp/site (T4SERVE_GPU_SITE):
#   - the image's own stack (vLLM 0.34.0, torch 2.14.0, triton 3.8.0 as cp312 wheels in parts w.00 ... w.NN, with
#     install-stack.sh and slim.json: `python3 tests/gpu/stack_parts.py make DIR` here, one device call per part):
#     what the image ships, installed with this checkout's docker/slim.json;
#   - the vLLM 0.26.0 site bundle (part1 ... partN with assemble.sh), built on the host's own torch 2.11.0.
# Every record names the vLLM it ran (realserve.vllm_version). Where the host's cuDNN cannot serve this torch (the
# image stack's torch 2.14 wants a newer cuDNN than such a host has), every server gets --language-model-only (no
# convolution on that path): host.json says so. Checkpoints and servers live under /tmp/t4serve-gpu
# (T4SERVE_GPU_ROOT), so later steps reuse the compile caches of earlier ones while the host stays up. Results (JSON,
# logs) go to OUT.
#   measure    tests/gpu/compile_memory.py: every compile rung side by side, cold caches, peaks and speed
#   measure-warm   bf16 full and lean, QAT full: cold, speed, then a warm start of each (peaks, ready time)
#   cold       the cold-then-warm start tests at T4 memory (a ballast): bf16, QAT, then bf16 with a profiled pool
#   cold-bf16, cold-qat   one of them
#   cold-profile   bf16 with T4SERVE_KV_CACHE_MEMORY_BYTES=profile, cold then warm, at T4 memory
#   cold-profile-first   its cold start alone
#   lifecycle  crash/restart/give-up, drain, canary and profile side by side
#   bench      t4serve bench: the published flags against t4serve's plan in one run, interleaved pair by pair;
#              T4SERVE_GPU_BENCH_ARGS picks the grid (default: inputs 512,4096, concurrency 16,8,4,1, 3 repeats,
#              10 x c requests a run where the estimate fits the hold; see tests/gpu/bench_host.py and
#              tests/gpu/bench_estimate.py, which prints the estimate on any machine); `--kv int8,int4` in
#              T4SERVE_GPU_BENCH_ARGS serves the quantized caches beside them (kv-quant's checks, in the same hold;
#              sized as a T4, int4 is refused by the plan since 8da2931: its kernel does not fit Turing, so `--kv int8`)
#   bench-published, bench-t4serve   one of the two servers
#   kv-quant   tests/gpu/kv_quant_host.py: bf16 E2B with seeded random weights sized as a T4, served with
#              T4SERVE_KV_CACHE_DTYPE auto, int8, int4: vLLM's KV figures against the plan's, top-1 agreement and the
#              largest log-probability difference against the 16-bit cache, beside two controls (the 16-bit
#              server measured again, a second 16-bit server with T4SERVE_COMPILE=eager), then transformers' 16-bit
#              and int8 reference on the same checkpoint against the servers (--no-hf-reference); T4SERVE_GPU_KV_ARGS
#              adds its options (--bench: throughput at 4096 tokens x 16 streams per dtype; --kinds auto,int8, which is
#              what a T4 runs: the shortest hold that settles the int8 numerics; --no-control)
#   turing     issue 43, attention as a T4 runs it (tests/gpu/t4mode.py): tests/gpu/turing_kernels.py (vLLM's kernel
#              launch by launch at E2B's shapes, vLLM's launch against t4serve's FMA and tensor-core launches, sm_75
#              code within a T4's registers), then tests/gpu/turing_served.py with the launches it chose (triton and
#              turing-mma served side by side sized as a T4: TTFT, greedy tokens, the profiler's attention share,
#              the bench's 4,096-token cells); T4SERVE_GPU_DEADLINE (epoch seconds) ends the served part in time
#   mtp        issue 46 (tests/gpu/mtp_host.py): Gemma 4's MTP drafter (seeded random weights from the assistant's
#              published config) on the random bf16 E2B, sized as a T4: KV figures, greedy tokens with and without
#              MTP beside a control, vLLM's acceptance counters, `t4serve bench --models t4serve,t4serve-mtp`
#              (T4SERVE_GPU_MTP_ARGS adds options, e.g. --repeats 3) with each step's draft and verify GPU time
#              (tests/gpu/steptiming.py), issue 34's int8 numerics beside it, and QAT with and without MTP served
#   turing-kernels, turing-served   one of the two (turing-served with the package's own launch table, or the
#              kernel step's choice.json where T4SERVE_GPU_TURING_CHOICE names it; tests/gpu/turing-host.sh runs
#              the kernel step without the stack, on the host's own torch)
set -euo pipefail
parts=${1:?usage: gpu-host.sh PARTS STEP OUT}; step=${2:?step}; out=${3:?out}
repo=$(cd "$(dirname "$0")/../.." && pwd)
# When this step began: bench_host.py budgets its sweep from it (the stack's install and the checkpoints come first).
export T4SERVE_GPU_STEP_STARTED=${T4SERVE_GPU_STEP_STARTED:-$(date +%s)}
site=${T4SERVE_GPU_SITE:-/tmp/site} work=${T4SERVE_GPU_ROOT:-/tmp/t4serve-gpu}
mkdir -p "$out" "$work"
if [ ! -d "$site/vllm" ]; then
  # The stack's removals and rewrites are this checkout's docker/slim.json, not the copy made with the parts: a
  # rewrite added since (vLLM 0.34's warm-up guard) reaches the host with the checkout.
  if [ -f "$parts/install-stack.sh" ]; then cp "$repo/docker/slim.json" "$parts/slim.json"
    bash "$parts/install-stack.sh" "$parts" "$site"
  else bash "$parts/assemble.sh" "$parts" "$site"; fi
fi
# pytest for the test steps, where the host's Python lacks it: wheels in PARTS/extra/ (pytest, pluggy, iniconfig).
if ! PYTHONPATH=$site python3 -c 'import pytest' 2>/dev/null && compgen -G "$parts/extra/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --target "$site" "$parts"/extra/*.whl
fi
# shellcheck source=/dev/null
source "$repo/tests/gpu/offline-host.sh" "$site"
export T4SERVE_GPU_WORK=$work T4SERVE_GPU_RESULTS=$out T4SERVE_GPU_CHECKPOINTS=$work/checkpoints PYTHONUNBUFFERED=1
# Can this torch use this host's cuDNN? One small convolution tells (asked once per host, the answer kept).
if [ ! -f "$work/cudnn.txt" ]; then
  if python3 -c 'import torch; x = torch.ones(1, 1, 8, 8, device="cuda"); torch.nn.functional.conv2d(x, x[:, :, :3, :3]); torch.cuda.synchronize()' \
      >"$work/cudnn.err" 2>&1; then echo ok >"$work/cudnn.txt"
  else printf 'unusable: %s\n' "$(grep -v '^\s*$' "$work/cudnn.err" | tail -n 1)" >"$work/cudnn.txt"; fi
fi
if [ "$(cat "$work/cudnn.txt")" != ok ] && [ -z "${T4SERVE_GPU_VLLM_ARGS+set}" ]; then
  export T4SERVE_GPU_VLLM_ARGS=--language-model-only
fi
python3 - "$out/host.json" "$work/cudnn.txt" <<'PY'
import json, subprocess, sys, os
from importlib import metadata
def version(name):
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None
smi = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
                     capture_output=True, text=True).stdout.strip()
json.dump({"packages": {n: version(n) for n in ("vllm", "torch", "triton", "transformers", "nvidia-nccl-cu13")},
           "gpu": smi, "cudnn": open(sys.argv[2]).read().strip(),
           "extra_vllm_args": os.environ.get("T4SERVE_GPU_VLLM_ARGS")}, open(sys.argv[1], "w"), indent=2)
PY
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
  cold-profile-first) T4SERVE_GPU_STARTS=cold python3 -m pytest -s -p no:cacheprovider tests/gpu/test_real_serve.py \
      -k profile_pool ;;
  lifecycle) python3 -m pytest -s -p no:cacheprovider tests/gpu/test_real_serve.py -k lifecycle ;;
  # shellcheck disable=SC2086
  bench) python3 tests/gpu/bench_host.py "$out/bench" "$work" ${T4SERVE_GPU_BENCH_ARGS:-} ;;
  # shellcheck disable=SC2086
  bench-published|bench-t4serve) python3 tests/gpu/bench_host.py "$out/$step" "$work" --servers "${step#bench-}" \
      ${T4SERVE_GPU_BENCH_ARGS:-} ;;
  # shellcheck disable=SC2086
  kv-quant) python3 tests/gpu/kv_quant_host.py "$out/kv-quant" "$work" ${T4SERVE_GPU_KV_ARGS:-} ;;
  # shellcheck disable=SC2086
  turing) python3 tests/gpu/turing_kernels.py "$out/kernels" ${T4SERVE_GPU_TURING_ARGS:-} \
        || echo "turing_kernels.py failed: the servers run the package's own launch table"
      launches=(); [ -f "$out/kernels/choice.json" ] && launches=(--launches "$out/kernels/choice.json")
      python3 tests/gpu/turing_served.py "$out/served" "$work" "${launches[@]}" \
        --deadline "${T4SERVE_GPU_DEADLINE:-0}" ;;
  # shellcheck disable=SC2086
  mtp) python3 tests/gpu/mtp_host.py "$out/mtp" "$work" ${T4SERVE_GPU_MTP_ARGS:-} ;;
  # shellcheck disable=SC2086
  turing-kernels) python3 tests/gpu/turing_kernels.py "$out/kernels" ${T4SERVE_GPU_TURING_ARGS:-} ;;
  turing-served) launches=(); choice=${T4SERVE_GPU_TURING_CHOICE:-}
      [ -n "$choice" ] && [ -f "$choice" ] && launches=(--launches "$choice")
      python3 tests/gpu/turing_served.py "$out/served" "$work" "${launches[@]}" \
        --deadline "${T4SERVE_GPU_DEADLINE:-0}" ;;
  *) echo "unknown step $step" >&2; exit 2 ;;
esac
