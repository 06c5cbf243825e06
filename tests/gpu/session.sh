#!/usr/bin/env bash
# A queue of tests/gpu/gpu-host.sh steps that outlives the device tool's 10-minute calls:
#   tests/gpu/session.sh start PARTS STEP [STEP...]   start the steps one after another, detached; returns at once
#   tests/gpu/session.sh wait SECONDS OUT             follow the queue for up to SECONDS (or to its end), then pack
#                                                     every result so far into OUT/results.tar.xz.NN
# The queue runs from a copy of this checkout (/tmp/t4serve-repo), so a later call that lays the checkout down again
# cannot change a script under a running step. Results: /tmp/t4serve-gpu/results/STEP/ and STEP.log per step, and
# session.log (each step's start, end and exit). A step that fails does not stop the queue; DONE marks its end.
set -euo pipefail
results=/tmp/t4serve-gpu/results
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
    rm -rf /tmp/t4serve-repo && mkdir -p /tmp/t4serve-repo "$results"
    (cd "$src" && tar --exclude=./.gpu --exclude=./.venv --exclude=./.git -cf - .) | tar -xf - -C /tmp/t4serve-repo
    rm -f "$results/DONE"
    nohup setsid bash -c '
      parts=$1 results=$2; shift 2
      for step in "$@"; do
        echo "=== $step started $(date -u +%FT%TZ)"
        rc=0; bash /tmp/t4serve-repo/tests/gpu/gpu-host.sh "$parts" "$step" "$results/$step" >"$results/$step.log" 2>&1 || rc=$?
        echo "=== $step ended $(date -u +%FT%TZ), exit $rc"
      done
      touch "$results/DONE"' queue "$parts" "$results" "$@" >>"$results/session.log" 2>&1 </dev/null &
    echo $! >"$results/session.pid"
    echo "queue started (pid $!): $*"
    ;;
  wait)
    seconds=${1:?usage: session.sh wait SECONDS OUT}; out=${2:?usage: session.sh wait SECONDS OUT}
    end=$(( $(date +%s) + seconds ))
    shown=0
    while [ "$(date +%s)" -lt "$end" ] && [ ! -f "$results/DONE" ]; do
      sleep 5
      if [ -f "$results/session.log" ]; then
        lines=$(wc -l <"$results/session.log")
        [ "$lines" -gt "$shown" ] && sed -n "$((shown + 1)),${lines}p" "$results/session.log" && shown=$lines
      fi
    done
    [ -f "$results/DONE" ] && echo "queue finished" || echo "queue still running after ${seconds} s"
    # What comes back from a device call is at most 8 files of 16 MiB, two folders down: the results travel as one
    # xz tar, split into 15 MiB pieces (cat results.tar.xz.* | tar -xJ), beside the session log.
    mkdir -p "$out" && cp "$results/session.log" "$out/"
    # With them each server's log and state as they stand now (servers/NAME/...): a step cut short by the end of the
    # device time leaves no record of its own, but its servers' logs and phases still say how far it got.
    work=$(dirname "$results")
    live=$(cd "$work" && ls -d ./*/serve.log ./*/state 2>/dev/null || true)
    # shellcheck disable=SC2086
    tar -C "$work" -cf - ./results $live | xz -T0 -6 | split -b 15M -d -a 2 - "$out/results.tar.xz."
    ls -la "$out"
    current=$(ls -t "$results"/*.log 2>/dev/null | grep -v session.log | head -n 1 || true)
    [ -z "$current" ] || { echo "--- tail of $current"; tail -n 25 "$current"; }
    ;;
  *) echo "session.sh: unknown command $cmd (start or wait)" >&2; exit 2 ;;
esac
