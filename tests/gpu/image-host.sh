#!/usr/bin/env bash
# The image itself on a GPU host without Docker, one step per call, or queued by tests/gpu/session.sh with
# T4SERVE_GPU_RUNNER=tests/gpu/image-host.sh:
#   tests/gpu/image-host.sh PARTS STEP OUT
# PARTS holds the image's parts as tests/gpu/imagebox.py receive laid them down (manifest.json, rootfs.tar.zst.NNN).
# STEP: prepare (unpack, checkpoints, image.json), qat, patch, bf16: tests/gpu/image_session.py says what each does.
# Containers' state (their logs among it) lives in IMAGEBOX_ROOT, under the queue's work folder so that
# `session.sh wait` packs their logs as it goes.
set -euo pipefail
parts=${1:?usage: image-host.sh PARTS STEP OUT}; step=${2:?step}; out=${3:?out}
export IMAGEBOX_ROOT=${IMAGEBOX_ROOT:-${T4SERVE_GPU_ROOT:-/tmp/t4serve-gpu}/imagebox} PYTHONUNBUFFERED=1
mkdir -p "$out"
exec python3 "$(dirname "$0")/image_session.py" "$step" "$out" --parts "$parts"
