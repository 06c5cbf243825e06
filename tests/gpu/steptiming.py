"""Step timing for the GPU host: what each engine step of a vLLM 0.34 server costs on the GPU, the speculative
decoder's draft apart from the rest (the verify), with CUDA events and no synchronisation.

Active only where T4SERVE_GPU_STEP_TIMING names a folder; vLLM's processes load it from the `vllm.general_plugins`
entry point `steptiming = steptiming:register` (tests/gpu/offline-host.sh writes it beside t4mode's). It wraps
vLLM 0.34's `GPUModelRunner.execute_model` and `sample_tokens` (the V2 runner, vllm/v1/worker/gpu/model_runner.py)
and, on the first step that has one, the speculator's `propose`. Per engine step with tokens scheduled (dummy runs,
profiling and CUDA-graph capture are left alone) it records four events on the current stream:
- e0 as execute_model begins (the step's inputs, the target's forward, and sampling or rejection follow),
- e1 and e2 around `propose` (the drafter's forwards: the draft step), where a speculator runs,
- e3 as sample_tokens returns.
verify_ms = e0 -> e1 (e0 -> e3 without a speculator), draft_ms = e1 -> e2, step_ms = e0 -> e3. Events are read once
the GPU has passed them (`query`), never waited for, so the server runs as it would unmeasured. Each process appends
one JSON line per step to FOLDER/steps-PID.jsonl: wall time, tokens and requests scheduled, the figures above.
`summarize` (pure) reads them: per number of requests, the median and spread of each figure over the decode-only steps
(every request scheduled 1 + k tokens: its sampled token and k drafts).

Nothing here changes what vLLM computes. A measuring tool for the GPU host; tests/unit/test_gpu_steptiming.py checks
its pure parts.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import Any

ENABLE = "T4SERVE_GPU_STEP_TIMING"
FLUSH_S = 1.0


class _Recorder:
    def __init__(self, folder: str) -> None:
        self.path = Path(folder) / f"steps-{os.getpid()}.jsonl"
        self.pending: dict[str, Any] | None = None
        self.unresolved: list[dict[str, Any]] = []
        self.lines: list[str] = []
        self.flushed = time.time()

    def begin(self, tokens: int, requests: int) -> None:
        import torch

        if torch.cuda.is_current_stream_capturing():
            self.pending = None
            return
        self.pending = {"t": time.time(), "tokens": tokens, "reqs": requests, "events": {"e0": _event()}}

    def mark(self, name: str) -> None:
        if self.pending is not None:
            self.pending["events"][name] = _event()

    def end(self) -> None:
        if self.pending is not None:
            self.pending["events"]["e3"] = _event()
            self.unresolved.append(self.pending)
            self.pending = None
        self.resolve()

    def resolve(self) -> None:
        still = []
        for step in self.unresolved:
            ev = step["events"]
            if not ev["e3"].query():
                still.append(step)
                continue
            line: dict[str, Any] = {"t": round(step["t"], 4), "tokens": step["tokens"], "reqs": step["reqs"],
                                    "step_ms": round(ev["e0"].elapsed_time(ev["e3"]), 4)}
            if "e1" in ev and "e2" in ev:
                line["verify_ms"] = round(ev["e0"].elapsed_time(ev["e1"]), 4)
                line["draft_ms"] = round(ev["e1"].elapsed_time(ev["e2"]), 4)
            else:
                line["verify_ms"] = line["step_ms"]
            self.lines.append(json.dumps(line))
        self.unresolved = still
        if self.lines and time.time() - self.flushed >= FLUSH_S:
            with self.path.open("a") as f:
                f.write("\n".join(self.lines) + "\n")
            self.lines = []
            self.flushed = time.time()


def _event() -> Any:
    import torch

    event = torch.cuda.Event(enable_timing=True)
    event.record()
    return event


def install(folder: str) -> None:
    """Wrap vLLM 0.34's GPU model runner in this process (idempotent)."""
    from vllm.v1.worker.gpu import model_runner

    cls = model_runner.GPUModelRunner
    if getattr(cls, "_t4serve_step_timing", False):
        return
    recorder = _Recorder(folder)
    execute_model, sample_tokens = cls.execute_model, cls.sample_tokens

    def timed_execute_model(self: Any, scheduler_output: Any, *args: Any, **kwargs: Any) -> Any:
        dummy = kwargs.get("dummy_run", args[1] if len(args) > 1 else False)
        tokens = int(getattr(scheduler_output, "total_num_scheduled_tokens", 0) or 0)
        if not dummy and tokens > 0:
            try:
                recorder.begin(tokens, len(scheduler_output.num_scheduled_tokens))
                _wrap_propose(self, recorder)
            except Exception:  # a measurement never takes the server down
                recorder.pending = None
        return execute_model(self, scheduler_output, *args, **kwargs)

    def timed_sample_tokens(self: Any, *args: Any, **kwargs: Any) -> Any:
        out = sample_tokens(self, *args, **kwargs)
        try:
            recorder.end()
        except Exception:
            recorder.pending = None
        return out

    cls.execute_model = timed_execute_model
    cls.sample_tokens = timed_sample_tokens
    cls._t4serve_step_timing = True


def _wrap_propose(runner: Any, recorder: _Recorder) -> None:
    speculator = getattr(runner, "speculator", None)
    if speculator is None or getattr(speculator, "_t4serve_timed", False):
        return
    propose = speculator.propose

    def timed_propose(*args: Any, **kwargs: Any) -> Any:
        recorder.mark("e1")
        out = propose(*args, **kwargs)
        recorder.mark("e2")
        return out

    speculator.propose = timed_propose
    speculator._t4serve_timed = True


def register() -> None:
    """vLLM's general plugin entry point: install where T4SERVE_GPU_STEP_TIMING names a folder."""
    folder = os.environ.get(ENABLE, "")
    if not folder or not os.path.isdir(folder):
        return
    try:
        install(folder)
    except Exception as exc:  # vLLM's API moved: say so in the folder, serve unmeasured
        Path(folder, f"error-{os.getpid()}.txt").write_text(f"{type(exc).__name__}: {exc}\n")


# --- reading the records (pure) ------------------------------------------------------------------------------------


def read_steps(folder: Path) -> list[dict[str, Any]]:
    steps: list[dict[str, Any]] = []
    for path in sorted(folder.glob("steps-*.jsonl")):
        for line in path.read_text().splitlines():
            try:
                steps.append(json.loads(line))
            except ValueError:
                continue
    return steps


def decode_only(steps: Iterable[dict[str, Any]], per_request: int) -> list[dict[str, Any]]:
    """The steps in which every request was scheduled exactly `per_request` tokens (1 + the drafts: decode, no
    prefill chunk beside it)."""
    return [s for s in steps if s.get("reqs") and s.get("tokens") == s["reqs"] * per_request]


def _spread(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    pick = lambda q: ordered[min(int(q * len(ordered)), len(ordered) - 1)]  # noqa: E731
    return {"median": round(statistics.median(ordered), 4), "p10": round(pick(0.1), 4), "p90": round(pick(0.9), 4)}


def summarize(steps: Iterable[dict[str, Any]], per_request: int, requests: Iterable[int] = (1, 4, 8),
              since: float | None = None, until: float | None = None) -> dict[str, Any]:
    """Per number of requests in `requests`: how many decode-only steps were seen (within [since, until] when
    given) and the median, 10th and 90th percentile of step_ms, verify_ms and draft_ms (where recorded)."""
    chosen = [s for s in steps if (since is None or s["t"] >= since) and (until is None or s["t"] <= until)]
    by_reqs: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for s in decode_only(chosen, per_request):
        by_reqs[int(s["reqs"])].append(s)
    out: dict[str, Any] = {}
    for n in requests:
        rows = by_reqs.get(n, [])
        entry: dict[str, Any] = {"steps": len(rows)}
        for key in ("step_ms", "verify_ms", "draft_ms"):
            values = [float(r[key]) for r in rows if key in r]
            if values:
                entry[key] = _spread(values)
        out[str(n)] = entry
    return out
