#!/usr/bin/env bash
# A queue of tests/gpu/gpu-host.sh steps (or another runner's: T4SERVE_GPU_RUNNER, a path in this checkout, e.g.
# tests/gpu/image-host.sh for the image itself) that outlives the device tool's 10-minute calls:
#   tests/gpu/session.sh start PARTS STEP [STEP...]   start the steps one after another, detached; returns at once
#   tests/gpu/session.sh wait SECONDS OUT             follow the queue for up to SECONDS (or to its end), then pack
#                                                     every result so far into OUT/results.tar.xz.NN
# The queue runs from a copy of this checkout (ROOT.repo), so a later call that lays the checkout down again cannot
# change a script under a running step. Results: ROOT/results/STEP/ and STEP.log per step, and session.log (each
# step's start, end and exit). A step that fails does not stop the queue; DONE marks its end. ROOT is
# T4SERVE_GPU_ROOT, default /tmp/t4serve-gpu (gpu-host.sh's work folder).
# `wait` on a machine where no queue runs (the device tool gave the machine back between two calls, with the queue on
# it, and this call started a fresh one) says so and exits 3 at once rather than spending its SECONDS on nothing;
# a queue whose process died without DONE ends the wait too.
set -euo pipefail
root=${T4SERVE_GPU_ROOT:-/tmp/t4serve-gpu}
results=$root/results
cmd=${1:?usage: session.sh start PARTS STEP... | session.sh wait SECONDS OUT}
shift
case $cmd in
  start)
    parts=${1:?usage: session.sh start PARTS STEP...}; shift
    [ $# -gt 0 ] || { echo "session.sh start: name one step or more (see tests/gpu/gpu-host.sh)" >&2; exit 2; }
    if [ -f "$results/session.pid" ] && kill -0 "$(cat "$results/session.pid")" 2>/dev/null; then
      echo "session.sh start: a queue is already running (pid $(cat "$results/session.pid"))" >&2; exit 2
    fi
    src=$(cd "$(dirname "$0")/../.." && pwd)
    runner=${T4SERVE_GPU_RUNNER:-tests/gpu/gpu-host.sh}
    [ -f "$src/$runner" ] || { echo "session.sh start: no runner $runner in $src (T4SERVE_GPU_RUNNER)" >&2; exit 2; }
    copy=$root.repo
    rm -rf "$copy" && mkdir -p "$copy" "$results"
    (cd "$src" && tar --exclude=./.gpu --exclude=./.venv --exclude=./.git -cf - .) | tar -xf - -C "$copy"
    rm -f "$results/DONE" "$results/session.pid"
    nohup setsid bash -c '
      parts=$1 results=$2 copy=$3 runner=$4; shift 4
      echo $$ >"$results/session.pid"
      for step in "$@"; do
        echo "=== $step started $(date -u +%FT%TZ)"
        rc=0; bash "$copy/$runner" "$parts" "$step" "$results/$step" >"$results/$step.log" 2>&1 || rc=$?
        echo "=== $step ended $(date -u +%FT%TZ), exit $rc"
      done
      touch "$results/DONE"' queue "$parts" "$results" "$copy" "$runner" "$@" >>"$results/session.log" 2>&1 </dev/null &
    for _ in $(seq 50); do [ -s "$results/session.pid" ] && break; sleep 0.1; done
    [ -s "$results/session.pid" ] || { echo "session.sh start: the queue did not start (see $results/session.log)" >&2; exit 1; }
    echo "queue started (pid $(cat "$results/session.pid")): $*"
    ;;
  wait)
    seconds=${1:?usage: session.sh wait SECONDS OUT}; out=${2:?usage: session.sh wait SECONDS OUT}
    if [ ! -f "$results/session.pid" ]; then
      echo "session.sh wait: no queue on this machine ($results/session.pid is missing): the machine that ran it was" \
        "given back and this is a fresh one. Lay the parts down again and start the queue anew." >&2
      exit 3
    fi
    end=$(( $(date +%s) + seconds ))
    shown=0
    while [ "$(date +%s)" -lt "$end" ] && [ ! -f "$results/DONE" ]; do
      pid=$(cat "$results/session.pid")  # the queue writes its own pid once it runs (setsid may fork)
      if ! kill -0 "$pid" 2>/dev/null; then
        [ -f "$results/DONE" ] || echo "the queue (pid $pid) ended without finishing its steps"
        break
      fi
      sleep 5
      if [ -f "$results/session.log" ]; then
        lines=$(wc -l <"$results/session.log")
        [ "$lines" -gt "$shown" ] && sed -n "$((shown + 1)),${lines}p" "$results/session.log" && shown=$lines
      fi
    done
    if [ -f "$results/DONE" ]; then echo "queue finished"
    elif kill -0 "$(cat "$results/session.pid")" 2>/dev/null; then echo "queue still running after ${seconds} s"
    else echo "queue not running, and not finished"; fi
    # What comes back from a device call is at most 8 files of 16 MiB, two folders down: the results travel as one
    # xz tar, split into 15 MiB pieces (cat results.tar.xz.* | tar -xJ), beside the session log.
    mkdir -p "$out" && cp "$results/session.log" "$out/"
    # With them each server's log and state as they stand now (servers/NAME/...): a step cut short by the end of the
    # device time leaves no record of its own, but its servers' logs and phases still say how far it got.
    # The image's containers (tests/gpu/image-host.sh): their logs and configs, not their layers or volumes.
    live=$(cd "$root" && ls -d ./*/serve.log ./*/state ./imagebox/*/log ./imagebox/*/config.json ./imagebox/*/exit \
      2>/dev/null || true)
    # shellcheck disable=SC2086
    tar -C "$root" -cf - ./results $live | xz -T0 -6 | split -b 15M -d -a 2 - "$out/results.tar.xz."
    ls -la "$out"
    current=$(ls -t "$results"/*.log 2>/dev/null | grep -v session.log | head -n 1 || true)
    [ -z "$current" ] || { echo "--- tail of $current"; tail -n 25 "$current"; }
    ;;
  *) echo "session.sh: unknown command $cmd (start or wait)" >&2; exit 2 ;;
esac
