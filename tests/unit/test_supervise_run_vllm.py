"""run_vllm.Wrapper: output prefixed, phases and state followed, the canary judged, deaths diagnosed, stops passed on.

The spawned "vLLM" is the stand-in server (tests/standin/vllm_standin.py) on a free 127.0.0.1 port, or a few lines
of Python where a test needs one exact behaviour. Wrapper.run() installs signal handlers, so tests that signal the
wrapper run it as supervisord does, `python -m t4serve run-vllm --spec FILE`, in a process of their own; the others
run it here with a fast tick, the handlers restored after, and a watchdog that kills the child at a deadline so a
regression fails instead of hanging.
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest

from t4serve.supervise import history, run_vllm
from t4serve.supervise.canary import FP16_HINT
from t4serve.supervise.run_vllm import PREFIX, Wrapper, downloads_active, local_url
from t4serve.supervise.state import (
    ExitRequest,
    Prediction,
    RunSpec,
    ServeState,
    new_state,
    read_state,
    write_exit_request,
    write_run_spec,
    write_state,
)

STANDIN = Path(__file__).resolve().parents[1] / "standin" / "vllm_standin.py"
MODEL = "google/gemma-4-E2B-it"
SERVED = "gemma"
GPU = "Tesla T4"
DEADLINE_S = 20.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def standin_argv(port: int) -> list[str]:
    return [
        sys.executable, str(STANDIN), "serve", MODEL, "--host", "127.0.0.1", "--port", str(port),
        "--served-model-name", SERVED, "--shutdown-timeout", "0",
    ]  # fmt: skip


def script_argv(code: str, *args: str) -> list[str]:
    return [sys.executable, "-c", code, *args]


def make_spec(
    tmp: Path,
    argv: list[str],
    *,
    port: int = 8000,
    mode: str = "ok",
    canary: bool = True,
    cache_dir: Path | None = None,
    predictions: dict[str, Prediction] | None = None,
    speculative: str = "off",
    env: dict[str, str] | None = None,
) -> RunSpec:
    return RunSpec(
        argv=argv,
        env={"T4SERVE_STANDIN_MODE": mode, "T4SERVE_STANDIN_LOAD_SECONDS": "0.05", **(env or {})},
        model=MODEL,
        served_model_name=SERVED,
        host="127.0.0.1",
        port=port,
        dtype="float16",
        shutdown_timeout=0,
        canary=canary,
        gpu_name=GPU,
        hf_hub_cache=str(tmp / "hub"),
        cache_dir=str(cache_dir if cache_dir is not None else tmp / "cache"),
        predictions=predictions or {},
        speculative=speculative,
    )


@pytest.fixture
def state_dir(tmp_path: Path) -> Path:
    d = tmp_path / "state"
    d.mkdir()
    return d


# ------------------------------------------------------------------------------------------------- in this process


@dataclass
class Outcome:
    code: int
    out: str
    state: ServeState
    # The state the watcher saw when its predicate first held (then it ended the child).
    seen: ServeState | None = None
    timed_out: bool = False
    lines: list[str] = field(default_factory=list)


def run_here(
    spec: RunSpec,
    state_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    *,
    until: Callable[[ServeState, str], bool] | None = None,
    deadline: float = DEADLINE_S,
) -> Outcome:
    """Wrapper.run() in this process; with `until`, the child gets SIGTERM once the state and output satisfy it."""
    monkeypatch.setattr(run_vllm, "TICK_S", 0.05)
    out = io.StringIO()
    wrapper = Wrapper(spec, state_dir, out=out)
    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    seen: list[ServeState] = []
    timed_out = threading.Event()
    finished = threading.Event()

    def watch() -> None:
        end = time.monotonic() + deadline
        while not finished.is_set() and time.monotonic() < end:
            if until is not None and not seen:
                try:
                    state = read_state(state_dir)
                except Exception:
                    state = None
                if state is not None and until(state, out.getvalue()):
                    seen.append(state)
                    if wrapper.child is not None:
                        wrapper.child.send_signal(signal.SIGTERM)
            time.sleep(0.02)
        if not finished.is_set():
            timed_out.set()
            if wrapper.child is not None:
                wrapper.child.kill()

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        code = wrapper.run()
    finally:
        finished.set()
        watcher.join(timeout=5)
        for sig, handler in saved.items():
            signal.signal(sig, handler)
    assert not timed_out.is_set(), f"the wrapper ran past {deadline} s:\n{out.getvalue()}"
    text = out.getvalue()
    return Outcome(code, text, read_state(state_dir), seen[0] if seen else None, lines=text.splitlines())


def phases_of(state: ServeState) -> list[str]:
    return [m.phase for m in state.phases]


def test_every_output_line_is_prefixed_and_an_exit_0_is_reported_as_a_failure(
    tmp_path: Path, state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    child = "print('hello from vllm'); print('second line')"
    done = run_here(make_spec(tmp_path, script_argv(child)), state_dir, monkeypatch)
    assert all(line.startswith(PREFIX) for line in done.lines), done.out
    assert f"{PREFIX}hello from vllm" in done.lines and f"{PREFIX}second line" in done.lines
    # A server that stops on its own has stopped serving: supervisord must see a failure, not a clean exit.
    assert done.code == 1
    assert done.state.phase == "failed" and done.state.exit_code == 0
    assert done.state.reason == "vLLM exited with code 0 while starting"


def test_a_crash_while_loading_returns_its_code_repeats_the_last_lines_and_diagnoses(
    tmp_path: Path, state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = make_spec(tmp_path, standin_argv(free_port()), mode="crash-on-load")
    done = run_here(spec, state_dir, monkeypatch)
    assert done.code == 1
    state = done.state
    assert state.phase == "failed" and state.exit_code == 1
    assert state.reason == "vLLM exited with code 1 while loading weights"
    assert state.diagnosis is not None and "GPU ran out of memory" in state.diagnosis
    assert state.fix is not None and "T4SERVE_MAX_MODEL_LEN" in state.fix
    assert any("CUDA out of memory" in line for line in state.last_lines)
    header = next(i for i, line in enumerate(done.lines) if "vLLM exited with code 1 while loading weights" in line)
    assert done.lines[header].startswith(f"{PREFIX}t4serve: ") and done.lines[header].endswith("lines:")
    repeated = [line for line in done.lines[header + 1 :] if line.startswith(f"{PREFIX}  | ")]
    assert [line.removeprefix(f"{PREFIX}  | ") for line in repeated] == state.last_lines
    assert done.lines[-1].startswith(f"{PREFIX}t4serve: diagnosis: the GPU ran out of memory")


def test_an_unknown_death_says_no_cause_matched(
    tmp_path: Path, state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    done = run_here(make_spec(tmp_path, script_argv("import sys; print('bye'); sys.exit(7)")), state_dir, monkeypatch)
    assert done.code == 7
    assert done.state.phase == "failed" and done.state.exit_code == 7 and done.state.diagnosis is None
    assert done.state.reason == "vLLM exited with code 7 while starting"
    assert done.lines[-2:] == [
        f"{PREFIX}  | bye",
        f"{PREFIX}t4serve: diagnosis: no known cause matched; read the lines above",
    ]


def test_a_signal_death_is_128_plus_the_signal(
    tmp_path: Path, state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    child = "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"
    done = run_here(make_spec(tmp_path, script_argv(child)), state_dir, monkeypatch)
    assert done.code == 128 + signal.SIGKILL
    assert done.state.exit_code == 137
    # SIGKILL while starting is the host OOM killer's signature.
    assert done.state.diagnosis is not None and "out of host memory" in done.state.diagnosis


def test_a_missing_program_is_127_and_the_state_says_it_could_not_start(
    tmp_path: Path, state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    missing = str(tmp_path / "no-such-vllm")
    done = run_here(make_spec(tmp_path, [missing, "serve", MODEL]), state_dir, monkeypatch)
    assert done.code == 127
    assert done.state.phase == "failed" and done.state.exit_code == 127
    assert done.state.reason is not None and done.state.reason.startswith(f"could not start {missing!r}")
    assert f"{PREFIX}t4serve: could not start {missing!r}" in done.out


def test_canary_failure_is_its_own_state_with_the_reason_and_the_fp16_hint(
    tmp_path: Path, state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    port = free_port()
    spec = make_spec(tmp_path, standin_argv(port), port=port, mode="garbage")
    # The ticker says "canary FAILED" just after it writes the state: wait for both.
    done = run_here(
        spec, state_dir, monkeypatch, until=lambda s, out: s.phase in ("ready", "failed") or "canary FAILED" in out
    )
    seen = done.seen
    assert seen is not None, done.out
    assert seen.phase == "canary_failed"
    assert phases_of(seen)[-2:] == ["canary", "canary_failed"]
    assert seen.reason is not None and seen.reason.startswith("canary failed: empty answer")
    assert seen.canary is not None and not seen.canary.ok
    assert seen.fix == FP16_HINT
    assert f"{PREFIX}t4serve: canary FAILED: empty answer" in "\n".join(done.lines)
    assert not (tmp_path / "cache" / history.HISTORY_FILE).exists()


MTP_CONFIG = '{"method": "mtp", "model": "google/gemma-4-E2B-it-assistant", "num_speculative_tokens": 2}'


def test_with_mtp_the_canary_needs_the_drafter_to_have_drafted(
    tmp_path: Path, state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    port = free_port()
    spec = make_spec(tmp_path, [*standin_argv(port), "--speculative-config", MTP_CONFIG], port=port,
                     speculative="mtp")
    done = run_here(spec, state_dir, monkeypatch, until=lambda s, out: "ready after" in out or "canary FAILED" in out)
    assert done.seen is not None and done.seen.phase == "ready", done.out
    assert "speculative decoding (mtp): 2 tokens drafted, 1 accepted so far" in done.out


def test_with_mtp_a_drafter_that_never_drafts_fails_the_canary(
    tmp_path: Path, state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    port = free_port()
    spec = make_spec(tmp_path, [*standin_argv(port), "--speculative-config", MTP_CONFIG], port=port,
                     speculative="mtp", env={"T4SERVE_STANDIN_DRAFTS": "off"})
    done = run_here(spec, state_dir, monkeypatch,
                    until=lambda s, out: s.phase in ("ready", "failed") or "canary FAILED" in out)
    seen = done.seen
    assert seen is not None and seen.phase == "canary_failed", done.out
    assert seen.reason is not None and "vLLM drafted no tokens for the canary" in seen.reason
    assert seen.canary is not None and not seen.canary.ok and seen.canary.text == "391"


def test_the_api_key_reaches_vllm_in_its_environment_and_the_canary_sends_it(
    tmp_path: Path, state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # `t4serve serve` puts the key into the environment supervisord, and so this wrapper, inherits.
    key = "sk-wrapper-SECRET-key"
    monkeypatch.setenv("VLLM_API_KEY", key)
    port = free_port()
    spec = make_spec(tmp_path, standin_argv(port), port=port)
    answers: dict[str, int] = {}

    def status(headers: dict[str, str]) -> int:
        request = urllib.request.Request(f"{local_url('127.0.0.1', port)}/v1/models", headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=5) as response:
                return int(response.status)
        except urllib.error.HTTPError as exc:
            return exc.code

    def ready_then_probe(state: ServeState, out: str) -> bool:
        if state.phase not in ("ready", "canary_failed", "failed"):
            return False
        # The stand-in enforces VLLM_API_KEY as vLLM does: proof that the child got it in its environment.
        answers["keyless"] = status({})
        answers["keyed"] = status({"Authorization": f"Bearer {key}"})
        return True

    done = run_here(spec, state_dir, monkeypatch, until=ready_then_probe)
    assert done.seen is not None and done.seen.phase == "ready", done.out
    assert done.seen.canary is not None and done.seen.canary.ok, done.seen.canary
    assert answers == {"keyless": 401, "keyed": 200}
    assert key not in done.out
    assert key not in (state_dir / "state.json").read_text()
    assert key not in " ".join(spec.argv) and key not in json.dumps(spec.env)


def test_ready_with_an_unwritable_cache_reports_it_and_still_serves(
    tmp_path: Path, state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A cache "folder" below a regular file cannot be written, even by root.
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    port = free_port()
    spec = make_spec(tmp_path, standin_argv(port), port=port, cache_dir=blocker / "cache")
    # Recording the start comes just after "ready" is written: wait for the report of its failure too.
    done = run_here(
        spec,
        state_dir,
        monkeypatch,
        until=lambda s, out: s.phase in ("canary_failed", "failed") or "could not record" in out,
    )
    assert done.seen is not None and done.seen.phase == "ready", done.out
    assert f"{PREFIX}t4serve: could not record this start in {blocker / 'cache'}" in done.out
    assert f"{PREFIX}t4serve: start history unreadable, no estimate" in done.out


def test_downloads_in_the_hf_cache_show_as_the_downloading_phase(
    tmp_path: Path, state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blobs = tmp_path / "hub" / "models--google--gemma-4-E2B-it" / "blobs"
    blobs.mkdir(parents=True)
    (blobs / "0123abcd.incomplete").write_bytes(b"partial")
    # vLLM logs "Starting to load model" before its loader downloads; then this one dies mid-download.
    child = f"import sys, time; print('Starting to load model {MODEL}...', flush=True); time.sleep(0.6); sys.exit(1)"
    done = run_here(make_spec(tmp_path, script_argv(child)), state_dir, monkeypatch)
    assert "downloading" in phases_of(done.state), done.out
    assert done.state.reason == "vLLM exited with code 1 while downloading weights"


# ------------------------------------------------------------------------------ as supervisord runs it: its own process


class Supervised:
    """`python -m t4serve run-vllm --spec FILE` in a session of its own; its output (stdout and stderr, as
    supervisord's stdout logfile gets it) collected by a thread."""

    def __init__(self, spec: RunSpec, state_dir: Path, python_code: str | None = None) -> None:
        spec_path = write_run_spec(state_dir, spec)
        argv = [sys.executable, "-m", "t4serve", "run-vllm", "--spec", str(spec_path)]
        if python_code is not None:  # the same command, run by a script that first changes something in the process
            argv = [sys.executable, "-c", python_code, "run-vllm", "--spec", str(spec_path)]
        self.state_dir = state_dir
        self.proc = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
        )
        self.out: list[str] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.out.append(line.rstrip("\n"))

    def wait_state(self, predicate: Callable[[ServeState], bool], timeout: float = DEADLINE_S) -> ServeState:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            try:
                state = read_state(self.state_dir)
            except Exception:
                state = None
            if state is not None and predicate(state):
                return state
            if self.proc.poll() is not None:
                break
            time.sleep(0.02)
        raise AssertionError(f"state not reached within {timeout} s:\n" + "\n".join(self.out))

    def finish(self, timeout: float = DEADLINE_S) -> int:
        code = self.proc.wait(timeout=timeout)
        self.reader.join(timeout=5)
        return code

    @property
    def output(self) -> str:
        return "\n".join(self.out)

    def cleanup(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=5)


@pytest.fixture
def supervised() -> Iterator[Callable[..., Supervised]]:
    started: list[Supervised] = []

    def start(spec: RunSpec, state_dir: Path, python_code: str | None = None) -> Supervised:
        started.append(Supervised(spec, state_dir, python_code))
        return started[-1]

    yield start
    for s in started:
        s.cleanup()


def test_phases_advance_to_ready_after_the_canary_and_sigterm_stops_vllm_cleanly(
    tmp_path: Path, state_dir: Path, supervised: Callable[..., Supervised]
) -> None:
    port = free_port()
    kv = Prediction("kv_tokens", 300_000, "tokens", "plan arithmetic")
    spec = make_spec(tmp_path, standin_argv(port), port=port, predictions={"kv_tokens": kv})
    wrapper = supervised(spec, state_dir)
    ready = wrapper.wait_state(lambda s: s.phase in ("ready", "canary_failed", "failed"))

    assert ready.phase == "ready", "\n".join(wrapper.out)
    assert phases_of(ready) == ["starting", "loading_weights", "profiling", "compiling", "canary", "ready"]
    assert ready.canary is not None and ready.canary.ok and "391" in (ready.canary.text or "")
    assert ready.figures["kv_tokens"].value == 315_974
    assert ready.attempt == 1 and ready.wrapper_pid == wrapper.proc.pid
    # The start is recorded for the next estimate (just after "ready" is written).
    records = tmp_path / "cache" / history.HISTORY_FILE
    end = time.monotonic() + DEADLINE_S
    while not records.exists() and time.monotonic() < end:
        time.sleep(0.02)
    [record] = json.loads(records.read_text())
    assert record["model"] == MODEL and record["gpu_name"] == GPU and record["total_seconds"] > 0
    assert "canary" in record["phases"] and "ready" not in record["phases"]

    os.kill(wrapper.proc.pid, signal.SIGTERM)
    code = wrapper.finish()
    out = "\n".join(wrapper.out)
    # The stand-in exits 0 after its own SIGTERM shutdown, which it logs: the wrapper passed SIGTERM on.
    assert code == 0, out
    assert f"{PREFIX}(APIServer pid=" in out and "[shutdown] API server: shutdown triggered" in out
    assert all(line.startswith(PREFIX) for line in wrapper.out), out
    assert f"{PREFIX}t4serve: canary passed: '17*23='" in out
    assert f"{PREFIX}t4serve: kv_tokens: measured 315,974.00 tokens, predicted 300,000.00 tokens (+5.3%" in out
    final = read_state(state_dir)
    assert final.phase == "stopping" and final.exit_code == 0
    assert final.reason is None and final.diagnosis is None
    assert "diagnosis:" not in out


SIGTERM_CHILD = """
import os, signal, sys, time
from pathlib import Path
folder = Path(sys.argv[1])
def on_term(signum, frame):
    (folder / "child-got").write_text(signal.Signals(signum).name)
    print("child: draining", flush=True)
    os._exit(3)
signal.signal(signal.SIGTERM, on_term)
(folder / "child-ready").write_text("1")
time.sleep(30)
"""


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_stop_signal_becomes_sigterm_for_vllm_and_its_exit_code_is_returned(
    tmp_path: Path, state_dir: Path, supervised: Callable[..., Supervised], signum: int
) -> None:
    wrapper = supervised(make_spec(tmp_path, script_argv(SIGTERM_CHILD, str(tmp_path))), state_dir)
    end = time.monotonic() + DEADLINE_S
    while not (tmp_path / "child-ready").exists() and time.monotonic() < end:
        time.sleep(0.01)
    os.kill(wrapper.proc.pid, signum)
    code = wrapper.finish()
    assert code == 3, wrapper.output
    assert (tmp_path / "child-got").read_text() == "SIGTERM"
    state = read_state(state_dir)
    assert state.phase == "stopping" and state.exit_code == 3
    assert state.reason is None and state.diagnosis is None
    out = "\n".join(wrapper.out)
    assert f"{PREFIX}child: draining" in out
    assert f"received {signal.Signals(signum).name}; passing SIGTERM to vLLM" in out
    assert "diagnosis:" not in out and "  | " not in out


# SIGTERM reaches the wrapper after its handlers are installed and just before vLLM is spawned (supervisord stopping
# a program it has just started): the handler runs at the next bytecode after os.kill, while there is no child yet.
SIGNAL_BEFORE_SPAWN = """
import os, signal, subprocess, sys
from t4serve.cli import main
from t4serve.supervise import run_vllm
real_popen = subprocess.Popen
def popen_after_sigterm(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGTERM)
    return real_popen(*args, **kwargs)
run_vllm.subprocess.Popen = popen_after_sigterm
sys.exit(main(sys.argv[1:]))
"""


def test_a_stop_before_vllm_exists_is_passed_on_once_it_does(
    tmp_path: Path, state_dir: Path, supervised: Callable[..., Supervised]
) -> None:
    # Left alone the child sleeps 5 s and exits 0; given the stop, SIGTERM kills it at once (128+15).
    spec = make_spec(tmp_path, script_argv("import time; time.sleep(5)"))
    started = time.monotonic()
    wrapper = supervised(spec, state_dir, SIGNAL_BEFORE_SPAWN)
    code = wrapper.finish()
    assert code == 128 + signal.SIGTERM, wrapper.output
    assert time.monotonic() - started < 4.5
    state = read_state(state_dir)
    assert state.phase == "stopping" and state.exit_code == 128 + signal.SIGTERM and state.diagnosis is None


# ------------------------------------------------------------------------------------------------ the small pieces


@pytest.mark.parametrize(
    ("host", "url"),
    [
        ("0.0.0.0", "http://127.0.0.1:8000"),
        ("::", "http://127.0.0.1:8000"),
        ("[::]", "http://127.0.0.1:8000"),
        ("", "http://127.0.0.1:8000"),
        ("127.0.0.1", "http://127.0.0.1:8000"),
        ("::1", "http://[::1]:8000"),
        ("[::1]", "http://[::1]:8000"),
        ("localhost", "http://localhost:8000"),
    ],
)
def test_local_url(host: str, url: str) -> None:
    assert local_url(host, 8000) == url


def test_downloads_active_sees_only_incomplete_blobs_of_a_model(tmp_path: Path) -> None:
    hub = tmp_path / "hub"
    assert not downloads_active(str(hub))  # no cache yet
    blobs = hub / "models--google--gemma-4-E2B-it" / "blobs"
    blobs.mkdir(parents=True)
    assert not downloads_active(str(hub))
    (blobs / "9f8e7d").write_bytes(b"done")
    assert not downloads_active(str(hub))
    (hub / ".locks").mkdir()
    (hub / ".locks" / "stray.incomplete").write_bytes(b"")
    assert not downloads_active(str(hub))
    (blobs / "0123abcd.incomplete").write_bytes(b"partial")
    assert downloads_active(str(hub))


def prior_state(spec: RunSpec, *, attempt: int, wrapper_pid: int | None) -> ServeState:
    return replace(new_state(spec, started_at=100.0, attempt=attempt, now=100.0), wrapper_pid=wrapper_pid)


@pytest.mark.parametrize(
    ("prior", "expected"),
    [(None, 1), ({"attempt": 1, "wrapper_pid": None}, 1), ({"attempt": 1, "wrapper_pid": 4242}, 2),
     ({"attempt": 4, "wrapper_pid": 4242}, 5)],
)  # fmt: skip
def test_each_wrapper_start_after_the_first_is_a_restart(
    tmp_path: Path, state_dir: Path, prior: dict[str, int | None] | None, expected: int
) -> None:
    spec = make_spec(tmp_path, ["vllm"])
    if prior is not None:
        attempt = prior["attempt"]
        assert attempt is not None
        write_state(state_dir, prior_state(spec, attempt=attempt, wrapper_pid=prior["wrapper_pid"]))
    out = io.StringIO()
    wrapper = Wrapper(spec, state_dir, out=out)
    assert wrapper.state.attempt == expected
    assert wrapper.state.wrapper_pid == os.getpid()
    if prior is not None:
        assert wrapper.state.started_at == 100.0  # the container's start, kept across restarts
    wrapper._announce()
    assert f"{PREFIX}t4serve: attempt {expected}: starting {MODEL}" in out.getvalue()


def test_past_starts_give_an_estimate_and_a_broken_history_is_said_not_fatal(tmp_path: Path, state_dir: Path) -> None:
    spec = make_spec(tmp_path, ["vllm"])
    cache = Path(spec.cache_dir)
    for total in (100.0, 140.0, 120.0):
        history.append(cache, history.StartRecord(MODEL, GPU, 0.0, total, {"loading_weights": total / 2}))
    history.append(cache, history.StartRecord(MODEL, "NVIDIA L4", 0.0, 10.0, {}))
    out = io.StringIO()
    wrapper = Wrapper(spec, state_dir, out=out)
    assert wrapper.state.estimate_seconds == 120.0
    wrapper._announce()
    assert "estimated time to ready 2m00s" in out.getvalue()

    (cache / history.HISTORY_FILE).write_text("{not json")
    out = io.StringIO()
    wrapper = Wrapper(spec, state_dir, out=out)
    assert wrapper.state.estimate_seconds is None
    assert f"{PREFIX}t4serve: start history unreadable, no estimate" in out.getvalue()


def test_a_compile_out_of_memory_climbs_down_the_ladder_and_later_starts_remember(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The stand-in dies in torch.compile as vLLM 0.26 did at a T4's memory unless it gets --enforce-eager: each
    start records the next rung, the next start (supervisord's restart) uses it, and once one is ready every later
    start begins there."""
    from t4serve.config import compilation
    from t4serve.supervise import compilerecord

    port = free_port()
    spec = dataclasses.replace(
        make_spec(tmp_path, standin_argv(port), port=port, canary=False),
        compile_ladder=[[r.name, *r.flags] for r in compilation.LADDER],
    )
    spec.env["T4SERVE_STANDIN_COMPILE_OOM_WITHOUT"] = "--enforce-eager"
    key = compilerecord.record_key(spec.model, spec.gpu_name, spec.argv)
    tried = []
    for expected in ("full", "lean", "o1"):
        state = tmp_path / f"state-{expected}"
        state.mkdir()
        done = run_here(spec, state, monkeypatch)
        tried.append(expected)
        assert done.code == 1
        assert f"compile: {expected} (" in done.out
        assert done.state.diagnosis is not None and "inside torch.compile" in done.state.diagnosis
        lower = compilerecord.next_rung(compilation.LADDER, compilation.RUNGS_BY_NAME[expected])
        assert lower is not None and done.state.fix is not None and f"rung {lower.name}" in done.state.fix
        record, problem = compilerecord.load_record(Path(spec.cache_dir), key)
        assert problem is None and record is not None
        assert record["rung"] == lower.name and record["failed"] == tried
    state = tmp_path / "state-eager"
    state.mkdir()
    done = run_here(spec, state, monkeypatch, until=lambda s, _out: s.phase == "ready")
    assert done.seen is not None and done.seen.phase == "ready"
    assert "compile: eager (" in done.out and "ran out of memory compiling: full, lean, o1" in done.out
    # The same configuration starts at eager from now on: no failed attempt first.
    state = tmp_path / "state-again"
    state.mkdir()
    again = run_here(spec, state, monkeypatch, until=lambda s, _out: s.phase == "ready")
    assert again.seen is not None and "compile: eager (" in again.out


def test_no_compile_flags_are_added_where_the_user_set_compilation(
    tmp_path: Path, state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from t4serve.config import compilation

    assert compilation.ladder_for("auto", ["-O0"]) == ()
    assert compilation.ladder_for("auto", ["--compilation-config", "{}"]) == ()
    assert compilation.ladder_for("eager", ["--max-logprobs", "5"]) == (compilation.RUNGS_BY_NAME["eager"],)
    port = free_port()
    spec = make_spec(tmp_path, standin_argv(port), port=port, canary=False)
    done = run_here(spec, state_dir, monkeypatch, until=lambda s, _out: s.phase == "ready")
    assert done.seen is not None and "compile:" not in done.out


def test_an_unreadable_compile_record_is_said_and_the_ladder_starts_at_the_top(tmp_path: Path) -> None:
    """The cache volume is shared: a FIFO or garbage where the record belongs must not block or crash a start."""
    from t4serve.config import compilation
    from t4serve.supervise import compilerecord

    cache = tmp_path / "cache"
    cache.mkdir()
    os.mkfifo(cache / compilerecord.RECORD_FILE)
    record, problem = compilerecord.load_record(cache, "k")
    assert record is None and problem is not None and "regular file" in problem
    (cache / compilerecord.RECORD_FILE).unlink()
    (cache / compilerecord.RECORD_FILE).write_text("[1, 2]")
    record, problem = compilerecord.load_record(cache, "k")
    assert record is None and problem is not None and "must be a JSON object" in problem
    assert compilation.user_controls_compilation(["--compilation_config.mode=0"])
    assert not compilation.user_controls_compilation(["--max-num-logprobs", "5", "--otlp-traces-endpoint=x"])


# ------------------------------------------------------------------------------- after the listener gave up

# Stands in for a vLLM that is still loading when told to stop: it ignores SIGTERM, and so does the engine core it
# started (a grandchild of the wrapper, as vLLM's EngineCore is); each writes its pid.
DEAF_LOADER = """
import os, signal, subprocess, sys, time
from pathlib import Path
folder = Path(sys.argv[1])
signal.signal(signal.SIGTERM, signal.SIG_IGN)
core = subprocess.Popen([sys.executable, "-c",
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)"])
(folder / "core.pid").write_text(str(core.pid))
(folder / "loader.pid").write_text(str(os.getpid()))
print("loading weights", flush=True)
time.sleep(60)
"""


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


def test_a_start_after_the_listener_gave_up_does_not_start_vllm(
    tmp_path: Path, state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """supervisord restarted vLLM just before the listener told it to end: that attempt must not load a model."""
    write_exit_request(state_dir, ExitRequest(1, "vLLM exited 2 times within 900 s", time.time()))
    marker = tmp_path / "started"
    spec = make_spec(tmp_path, script_argv("import sys; open(sys.argv[1], 'w').write('1')", str(marker)))
    outcome = run_here(spec, state_dir, monkeypatch)
    assert outcome.code == 0 and not marker.exists()
    assert outcome.state.phase == "stopping"
    assert outcome.state.reason == "t4serve gave up: vLLM exited 2 times within 900 s"
    assert "not starting vLLM: the listener gave up (vLLM exited 2 times within 900 s)" in outcome.out


def test_a_loading_vllm_is_stopped_with_its_engine_when_the_listener_gives_up(
    tmp_path: Path, state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Seen on the GPU host: supervisord's stop signal to a just-restarted wrapper was lost and a loading vLLM ran
    on for 60 s until supervisord's SIGKILL. The wrapper now sees the listener's request itself, gives vLLM a short
    grace on SIGTERM, then kills its process tree, engine core included."""
    monkeypatch.setattr(run_vllm, "GIVE_UP_GRACE_S", 0.5)

    def give_up_once_loading() -> None:
        end = time.monotonic() + DEADLINE_S
        while not (tmp_path / "core.pid").exists() and time.monotonic() < end:
            time.sleep(0.02)
        write_exit_request(state_dir, ExitRequest(1, "vLLM went FATAL", time.time()))

    helper = threading.Thread(target=give_up_once_loading, daemon=True)
    helper.start()
    outcome = run_here(make_spec(tmp_path, script_argv(DEAF_LOADER, str(tmp_path))), state_dir, monkeypatch)
    helper.join(5)
    core, loader = (int((tmp_path / f"{n}.pid").read_text()) for n in ("core", "loader"))
    end = time.monotonic() + 5
    while _alive(core) and time.monotonic() < end:
        time.sleep(0.05)
    assert not _alive(loader) and not _alive(core), outcome.out
    assert outcome.state.phase == "stopping" and outcome.state.reason == "t4serve gave up: vLLM went FATAL"
    assert outcome.code == 128 - (-signal.SIGKILL)
    assert "the listener gave up (vLLM went FATAL); stopping this attempt" in outcome.out
    assert "vLLM was still running 0 s after SIGTERM; its processes were killed" in outcome.out
