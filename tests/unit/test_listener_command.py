"""t4serve.commands.listener as supervisord runs it: a child process speaking the protocol on its pipes. Giving up
writes the exit request (code 1, the reason) and sends SIGTERM to the parent, which here is a small Python process
standing in for supervisord."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from t4serve.supervise.state import read_exit_request

PARENT = r"""
import json, signal, subprocess, sys, time
terms = []
signal.signal(signal.SIGTERM, lambda *_: terms.append(time.time()))
state_dir, event, wait_s = sys.argv[1], sys.argv[2], float(sys.argv[3])
child = subprocess.Popen(
    [sys.executable, "-m", "t4serve", "listener", "--state-dir", state_dir, "--max-restarts", "0",
     "--restart-window", "60"],
    stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
)
first = child.stdout.read(6)
child.stdin.write(event)
child.stdin.flush()
deadline = time.time() + wait_s
while not terms and time.time() < deadline:
    time.sleep(0.05)
child.stdin.close()
out, err = first + child.stdout.read(), child.stderr.read()
child.wait(timeout=20)
print(json.dumps({"first": first, "out": out[len(first):], "err": err, "rc": child.returncode, "sigterm": bool(terms)}))
"""


def event(name: str, process: str) -> str:
    payload = f"processname:{process} groupname:{process} from_state:RUNNING expected:0 pid:42"
    header = f"ver:3.0 server:supervisor serial:1 pool:listener poolserial:1 eventname:{name} len:{len(payload)}"
    return header + "\n" + payload


def speak(tmp_path: Path, text: str, wait_s: float) -> dict[str, object]:
    """Runs the stand-in supervisord; it waits up to `wait_s` for the listener's SIGTERM before closing its stdin."""
    done = subprocess.run([sys.executable, "-c", PARENT, str(tmp_path), text, str(wait_s)], capture_output=True,
                          text=True, timeout=60, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    result: dict[str, object] = json.loads(done.stdout)
    return result


def test_vllm_exiting_past_the_limit_ends_supervisord_with_exit_code_1(tmp_path: Path) -> None:
    result = speak(tmp_path, event("PROCESS_STATE_EXITED", "vllm"), 20)
    assert result["first"] == "READY\n" and result["out"] == "RESULT 2\nOKREADY\n"
    assert result["sigterm"] is True and result["rc"] == 0
    request = read_exit_request(tmp_path)
    assert request is not None and request.code == 1
    assert "vLLM exited 1 times within 60 s" in request.reason and "T4SERVE_MAX_RESTARTS=0" in request.reason
    assert "giving up" in str(result["err"])


def test_another_program_exiting_ends_nothing(tmp_path: Path) -> None:
    result = speak(tmp_path, event("PROCESS_STATE_EXITED", "telemetry"), 1)
    assert result["out"] == "RESULT 2\nOKREADY\n" and result["sigterm"] is False and result["rc"] == 0
    assert read_exit_request(tmp_path) is None
