"""The `vllm` program under supervisord: spawn the plan's argv, stream its output, follow its phases, run the canary.

`Wrapper(spec, state_dir).run()` starts vLLM, prefixes each output line with `[vllm]`, feeds it to the phase
tracker, watches the HF cache for downloads, polls /health, runs the canary once /health answers, and keeps
state.json current. When vLLM dies it repeats the last lines with a diagnosis. It returns vLLM's exit code.
Stop: supervisord signals this wrapper only; the wrapper passes SIGTERM to vLLM's API server, as `docker stop` would
to a bare vLLM, so vLLM drains (--shutdown-timeout) and shuts its own engine down in order.
"""

from __future__ import annotations

import collections
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path
from types import FrameType
from typing import IO

from t4serve.atomic import LockError
from t4serve.config import compilation
from t4serve.httpclient import local_url
from t4serve.supervise import compilerecord, history
from t4serve.supervise.canary import check_drafting, run_canary
from t4serve.supervise.children import stop_child
from t4serve.supervise.diagnose import diagnose
from t4serve.supervise.logwatch import PhaseTracker, compare, format_comparison
from t4serve.supervise.phases import PHASE_LABELS, PHASES
from t4serve.supervise.state import (
    MAX_LINE_CHARS,
    RunSpec,
    ServeState,
    new_state,
    read_exit_request,
    read_state,
    write_state,
)
from t4serve.units import fmt_duration

PREFIX = "[vllm] "
LAST_LINES = 40
# Lines the diagnosis reads: a Python traceback through vLLM's engine-core launcher runs to 60+ lines after the error
# that names the cause (seen on the GPU host), so it reads further back than the 40 lines repeated.
DIAGNOSIS_LINES = 400
TICK_S = 1.0
HEALTH_TIMEOUT_S = 2.0
# After the listener gave up, seconds a loading vLLM gets to end on SIGTERM before its process tree is killed: with
# nothing served yet there is nothing to drain, and supervisord would otherwise wait its whole stopwaitsecs.
GIVE_UP_GRACE_S = 10.0


def health_ok(base_url: str, timeout: float = HEALTH_TIMEOUT_S) -> bool:
    from t4serve.httpclient import HttpFailure, fetch

    try:
        return fetch("GET", f"{base_url}/health", deadline_s=timeout).status == 200
    except HttpFailure:
        return False


def downloads_active(hf_hub_cache: str) -> bool:
    """huggingface_hub writes each blob as `<sha>.incomplete` until it is complete."""
    root = Path(hf_hub_cache)
    if not root.is_dir():
        return False
    return any(True for _ in root.glob("models--*/blobs/*.incomplete"))


class Wrapper:
    def __init__(self, spec: RunSpec, state_dir: Path, out: IO[str] | None = None) -> None:
        self.spec = spec
        self.state_dir = state_dir
        self.out = out if out is not None else sys.stdout
        self.base_url = local_url(spec.host, spec.port)
        self.lock = threading.RLock()
        self.lines: collections.deque[str] = collections.deque(maxlen=DIAGNOSIS_LINES)
        self.stopping = threading.Event()
        # Set by every stop signal, even one that comes after vLLM exited: waits for a lock give up on it at once.
        self.signalled = threading.Event()
        self.child: subprocess.Popen[str] | None = None
        self.save_failed = False
        now = time.time()
        self.state = self._initial_state(now)
        self.tracker = PhaseTracker(now, on_phase=self._on_phase)
        self.ladder = tuple(
            compilation.Rung(name, tuple(flags), getattr(compilation.RUNGS_BY_NAME.get(name), "what", name))
            for name, *flags in spec.compile_ladder
        )
        self.compile_key = compilerecord.record_key(spec.model, spec.gpu_name, spec.argv)
        record, problem = compilerecord.load_record(Path(spec.cache_dir), self.compile_key)
        if problem:
            # A record of the wrong shape or a file that is not one: moved aside so the ladder starts over and
            # this start's outcome can be recorded (it would otherwise be refused again at every start).
            self.say(compilerecord.set_aside(Path(spec.cache_dir), problem) if self.ladder else
                     f"compile record unusable, not used ({problem})")
        self.compile_record = record
        self.rung = compilerecord.choose_rung(self.ladder, record)
        self.argv = [*spec.argv, *(self.rung.flags if self.rung else ())]

    def say(self, text: str) -> None:
        with self.lock:
            self.out.write(f"{PREFIX}t4serve: {text}\n")
            self.out.flush()

    def _initial_state(self, now: float) -> ServeState:
        try:
            prior: ServeState | None = read_state(self.state_dir)
        except Exception:  # a missing or unreadable state only means this is the first attempt
            prior = None
        started_at = prior.started_at if prior is not None else now
        # serve writes attempt 1 without a wrapper pid; each wrapper start after that is a restart.
        attempt = 1 if prior is None or prior.wrapper_pid is None else prior.attempt + 1
        state = new_state(self.spec, started_at=started_at, attempt=attempt, now=now)
        records, problem = history.load(Path(self.spec.cache_dir))
        if problem:
            self.say(f"start history unreadable, no estimate ({problem})")
        est = history.estimate(records, self.spec.model, self.spec.gpu_name)
        if est is not None:
            state = replace(state, estimate_seconds=est.total_seconds, estimate_phases=est.phases)
        return replace(state, wrapper_pid=os.getpid())

    def _save(self) -> None:
        with self.lock:
            self.state = replace(self.state, updated_at=time.time(), figures=dict(self.tracker.figures))
            try:
                write_state(self.state_dir, self.state)
            except OSError as exc:  # a state folder replaced or made read-only: vLLM goes on, said once
                if not self.save_failed:
                    self.save_failed = True
                    self.say(f"cannot write the state file in {self.state_dir}: {exc.strerror or exc}; status and "
                             "healthcheck will not see this attempt's progress")

    def _on_phase(self, phase: str, now: float) -> None:
        with self.lock:
            elapsed = now - self.state.attempt_started_at
            self.state = self.state.with_phase(phase, now)
            self.say(f"phase: {PHASE_LABELS[phase]} (at {elapsed:.1f} s)")
            self._save()

    def _announce(self) -> None:
        est = self.state.estimate_seconds
        if est is None:
            self.say(
                f"attempt {self.state.attempt}: starting {self.spec.model}; no past starts of this model on this GPU "
                f"recorded in {self.spec.cache_dir}, so no time-to-ready estimate yet"
            )
        else:
            self.say(
                f"attempt {self.state.attempt}: starting {self.spec.model}; estimated time to ready "
                f"{fmt_duration(est)} (median of past starts on this GPU)"
            )
        for p in self.spec.predictions.values():
            self.say(f"plan predicts {p.name} = {p.value:,.2f} {p.unit} ({p.how})")
        if self.rung is not None:
            why = ""
            if self.compile_record is not None and self.compile_record.get("rung") == self.rung.name:
                failed = ", ".join(str(f) for f in self.compile_record.get("failed", [])) or "none"
                why = f"; recorded in {self.spec.cache_dir} (ran out of memory compiling: {failed})"
            self.say(f"compile: {self.rung.name} ({self.rung.what}){why}")

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(self.spec.env)
        # Lines must reach us as they are written, without colour codes, for the phase tracker.
        env.setdefault("PYTHONUNBUFFERED", "1")
        env.setdefault("VLLM_LOGGING_COLOR", "0")
        return env

    def _begin_stop(self, reason: str | None = None) -> bool:
        """Enter `stopping` once (False if already there), with `reason` in the state when given. Through the
        tracker, so _on_exit sees a stop (not a death) and later log lines cannot move the phase back."""
        if self.stopping.is_set():
            return False
        self.stopping.set()
        if reason is not None:
            with self.lock:
                self.state = replace(self.state, reason=reason)
        self.tracker.advance("stopping", time.time())
        return True

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        self.signalled.set()
        if not self._begin_stop():
            return
        self.say(
            f"received {signal.Signals(signum).name}; passing SIGTERM to vLLM, which drains in-flight requests for up "
            f"to {self.spec.shutdown_timeout} s"
        )
        if self.child is not None and self.child.poll() is None:
            self.child.send_signal(signal.SIGTERM)

    def _given_up(self) -> str | None:
        """The listener's reason if it has ended this container (serve clears the request at every start)."""
        try:
            request = read_exit_request(self.state_dir)
        except Exception:  # an unreadable request is the listener's to repeat; this attempt goes on
            return None
        return request.reason if request is not None else None

    def _stop_given_up(self, reason: str) -> None:
        """The listener gave up while this attempt was starting: supervisord restarted vLLM just before it was told
        to end, and a stop signal sent while it spawns us can be lost. Stop vLLM ourselves, at once."""
        if not self._begin_stop(f"t4serve gave up: {reason}"):
            return
        self.say(f"the listener gave up ({reason}); stopping this attempt")
        child = self.child
        if child is None or child.poll() is not None:
            return
        if not stop_child(child, GIVE_UP_GRACE_S):
            self.say(f"vLLM was still running {GIVE_UP_GRACE_S:.0f} s after SIGTERM; its processes were killed")

    def _ticker(self) -> None:
        """Download watching, /health polling and the canary: everything vLLM's log cannot say."""
        while not self.stopping.wait(TICK_S):
            reason = self._given_up()
            if reason is not None:
                self._stop_given_up(reason)
                return
            phase = self.tracker.phase
            if PHASES[phase].before_weights_loaded:
                self.tracker.observe_download(downloads_active(self.spec.hf_hub_cache), time.time())
            if not PHASES[phase].loading:
                return
            if self.child is None or self.child.poll() is not None:
                continue
            if health_ok(self.base_url):
                self._become_ready()
                return

    def _become_ready(self) -> None:
        if self.spec.canary:
            self.tracker.advance("canary", time.time())
            # The key vLLM enforces is the VLLM_API_KEY of its environment (t4serve serve puts it there).
            api_key = self._env().get("VLLM_API_KEY") or None
            record = run_canary(self.base_url, self.spec.served_model_name, self.spec.dtype, api_key=api_key)
            drafting = None
            if record.ok and self.spec.speculative == "mtp":
                drafting = check_drafting(self.base_url, api_key=api_key)
                if drafting.reason is not None:
                    record = replace(record, ok=False, reason=drafting.reason)
            if self.stopping.is_set():
                return
            with self.lock:
                self.state = replace(self.state, canary=record)
            if not record.ok:
                with self.lock:
                    self.state = replace(self.state, reason=f"canary failed: {record.reason}", fix=record.hint)
                self.tracker.advance("canary_failed", time.time())
                self.say(f"canary FAILED: {record.reason}")
                if record.hint:
                    self.say(f"hint: {record.hint}")
                return
            self.say(f"canary passed: {record.prompt!r} -> {record.text!r} in {record.seconds:.2f} s")
            if drafting is not None:
                self.say(f"speculative decoding (mtp): {drafting.draft_tokens} tokens drafted, "
                         f"{drafting.accepted_tokens} accepted so far (vLLM's /metrics)")
        else:
            self.say("canary off (T4SERVE_CANARY): ready as soon as /health answers")
        now = time.time()
        self.tracker.advance("ready", now)
        total = now - self.state.attempt_started_at
        self.say(f"ready after {fmt_duration(total)}")
        for c in compare(self.tracker.figures, self.spec.predictions):
            self.say(format_comparison(c))
        marks = [(m.phase, m.began_at) for m in self.state.phases if m.phase in PHASE_LABELS]
        durations = history.phase_durations([m for m in marks if m[0] != "ready"], now)
        try:
            history.append(
                Path(self.spec.cache_dir),
                history.StartRecord(self.spec.model, self.spec.gpu_name, now, round(total, 3), durations),
                stop=self.signalled,
            )
        except (OSError, LockError) as exc:  # a read-only cache volume or a stuck lock costs the estimate only
            reason = exc.reason if isinstance(exc, LockError) else str(exc)
            self.say(f"could not record this start in {self.spec.cache_dir}: {reason}")
        if self.rung is not None and (self.compile_record or {}).get("rung") != self.rung.name:
            self._record_rung(self.rung.name, failed=None)

    def _record_rung(self, rung: str, failed: str | None) -> str | None:
        """Record `rung` for the next start; why it could not be, or None. A stuck lock costs seconds, a stop
        signal nothing (it gives up at once), never the wrapper's exit."""
        try:
            compilerecord.record_outcome(Path(self.spec.cache_dir), self.compile_key, rung=rung, failed=failed,
                                       model=self.spec.model, gpu_name=self.spec.gpu_name, stop=self.signalled)
        except compilerecord.RecordError as exc:  # a read-only cache volume: the next start climbs the ladder again
            self.say(f"could not record compile rung {rung} in {self.spec.cache_dir}: {exc.reason}")
            return exc.reason
        return None

    def run(self) -> int:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._on_signal)
        reason = self._given_up()
        if reason is not None:
            self._begin_stop(f"t4serve gave up: {reason}")
            self.say(f"not starting vLLM: the listener gave up ({reason}) and supervisord is ending")
            return 0
        self._announce()
        self._save()
        try:
            self.child = subprocess.Popen(
                self.argv,
                env=self._env(),
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                text=True,
                errors="replace",
                bufsize=1,
            )
        except OSError as exc:
            with self.lock:
                self.state = replace(self.state, reason=f"could not start {self.argv[0]!r}: {exc}", exit_code=127)
            self.tracker.advance("failed", time.time())
            self.say(f"could not start {self.argv[0]!r}: {exc}")
            return 127
        if self.stopping.is_set():  # the stop came while there was no child to pass it to
            self.child.send_signal(signal.SIGTERM)
        ticker = threading.Thread(target=self._ticker, name="t4serve-ticker", daemon=True)
        ticker.start()
        assert self.child.stdout is not None
        for line in self.child.stdout:
            text = line.rstrip("\n")
            with self.lock:
                self.out.write(f"{PREFIX}{text}\n")
                self.out.flush()
                # What the state keeps of a line (its last lines, a figure's line) is at most what its reader takes.
                text = text[:MAX_LINE_CHARS]
                self.lines.append(text)
            if self.tracker.feed(text, time.time()) is not None and self.tracker.figures != self.state.figures:
                self._save()
        returncode = self.child.wait()
        self.stopping.set()
        return self._on_exit(returncode)

    def _on_exit(self, returncode: int) -> int:
        code = 128 - returncode if returncode < 0 else returncode
        now = time.time()
        phase_at_death = self.tracker.phase
        with self.lock:
            self.state = replace(self.state, exit_code=code, last_lines=list(self.lines)[-LAST_LINES:])
        if phase_at_death == "stopping":
            self.say(f"vLLM stopped (exit {code}) {now - self.state.phase_began_at():.1f} s after the stop signal")
            self._save()
            return code
        diagnosis = diagnose(list(self.lines), returncode, phase_at_death)
        if diagnosis is not None and diagnosis.name == "compile_oom" and self.rung is not None:
            lower = compilerecord.next_rung(self.ladder, self.rung)
            if lower is not None:
                problem = self._record_rung(lower.name, failed=self.rung.name)
                fix = (
                    f"t4serve restarts vLLM with compile rung {lower.name} ({lower.what}) and remembers it in "
                    f"{self.spec.cache_dir}; to choose yourself, set T4SERVE_COMPILE"
                    if problem is None
                    # The state says so: the restart would start the same rung again.
                    else f"t4serve could not record compile rung {lower.name} ({problem}), so a restart starts "
                    f"{self.rung.name} again: set T4SERVE_COMPILE={lower.name}, and fix the cache folder"
                )
                diagnosis = replace(diagnosis, fix=fix)
        with self.lock:
            self.state = replace(
                self.state,
                reason=f"vLLM exited with code {code} while {PHASE_LABELS[phase_at_death]}",
                diagnosis=diagnosis.summary if diagnosis else None,
                fix=diagnosis.fix if diagnosis else None,
            )
        self.tracker.advance("failed", now)
        last = list(self.lines)[-LAST_LINES:]
        self.say(f"vLLM exited with code {code} while {PHASE_LABELS[phase_at_death]}; last {len(last)} lines:")
        with self.lock:
            for text in last:
                self.out.write(f"{PREFIX}  | {text}\n")
            self.out.flush()
        self.say(diagnosis.one_line() if diagnosis else "diagnosis: no known cause matched; read the lines above")
        # A server that exits 0 on its own has still stopped serving: report it to supervisord as a failure.
        return code if code != 0 else 1
