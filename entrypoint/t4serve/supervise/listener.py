"""A supervisord event listener that ends supervisord when vLLM keeps dying, so Docker's restart policy acts.

`listen(stdin, stdout, policy, give_up)` speaks supervisord's listener protocol until stdin closes: supervisor's own
`childutils.listener` writes READY and the RESULT 2 OK acknowledgement; the header and payload tokens are read with
`parse_tokens`, which unlike `childutils.get_headers` tolerates a value holding a colon. Tests feed it StringIO.
vLLM exiting more than `max_restarts` times within `window_s`, or reaching FATAL (it kept dying within startsecs),
calls `give_up(reason)` once.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from dataclasses import dataclass
from typing import TextIO

from supervisor import childutils

WATCHED_PROGRAM = "vllm"


@dataclass
class RestartPolicy:
    max_restarts: int
    window_s: float

    def __post_init__(self) -> None:
        self._exits: collections.deque[float] = collections.deque()

    def record_exit(self, now: float) -> int:
        """Record one exit; returns how many fall inside the window, this one included."""
        self._exits.append(now)
        while self._exits and now - self._exits[0] > self.window_s:
            self._exits.popleft()
        return len(self._exits)

    def exceeded(self, exits_in_window: int) -> bool:
        return exits_in_window > self.max_restarts


def parse_tokens(line: str) -> dict[str, str]:
    """supervisord's `key:value key:value` header and payload format."""
    return dict(token.split(":", 1) for token in line.split() if ":" in token)


def listen(
    stdin: TextIO,
    stdout: TextIO,
    stderr: TextIO,
    policy: RestartPolicy,
    give_up: Callable[[str], None],
    clock: Callable[[], float],
) -> int:
    gave_up = False
    while True:
        childutils.listener.ready(stdout)
        header_line = stdin.readline()
        if not header_line:
            return 0
        header = parse_tokens(header_line)
        length = int(header.get("len", "0"))
        payload_text = stdin.read(length)
        first_line = payload_text.split("\n", 1)[0]
        payload = parse_tokens(first_line)
        event = header.get("eventname", "")
        name = payload.get("processname", "")
        if name == WATCHED_PROGRAM and not gave_up:
            reason = None
            if event == "PROCESS_STATE_EXITED":
                count = policy.record_exit(clock())
                print(
                    f"listener: vllm exited (pid {payload.get('pid', '?')}, from {payload.get('from_state', '?')}); "
                    f"{count} exit(s) in the last {policy.window_s:.0f} s, limit {policy.max_restarts}",
                    file=stderr,
                    flush=True,
                )
                if policy.exceeded(count):
                    reason = (
                        f"vLLM exited {count} times within {policy.window_s:.0f} s "
                        f"(T4SERVE_MAX_RESTARTS={policy.max_restarts}, T4SERVE_RESTART_WINDOW={policy.window_s:.0f})"
                    )
            elif event == "PROCESS_STATE_FATAL":
                reason = "vLLM went FATAL: it kept exiting before supervisord's startsecs, every retry used up"
            if reason is not None:
                gave_up = True
                print(f"listener: giving up: {reason}; ending supervisord", file=stderr, flush=True)
                give_up(reason)
        elif event == "PROCESS_STATE_FATAL":
            print(f"listener: {name} went FATAL (not restarted; the server keeps running)", file=stderr, flush=True)
        childutils.listener.ok(stdout)
