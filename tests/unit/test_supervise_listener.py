"""listener: supervisord's event protocol fed through StringIO; gives up after too many exits or on FATAL."""

from __future__ import annotations

import io

from t4serve.supervise.listener import RestartPolicy, listen, parse_tokens


def event(name: str, process: str = "vllm", serial: int = 1) -> str:
    payload = f"processname:{process} groupname:{process} from_state:RUNNING expected:0 pid:4{serial}"
    header = f"ver:3.0 server:supervisor serial:{serial} pool:listener poolserial:{serial} eventname:{name} "
    return header + f"len:{len(payload)}\n" + payload


def run(events: list[str], max_restarts: int, window: float, times: list[float]) -> tuple[list[str], str, str]:
    reasons: list[str] = []
    out, err = io.StringIO(), io.StringIO()
    clock = iter(times)
    code = listen(io.StringIO("".join(events)), out, err, RestartPolicy(max_restarts, window), reasons.append,
                  lambda: next(clock))  # fmt: skip
    assert code == 0
    return reasons, out.getvalue(), err.getvalue()


def test_protocol_ready_and_ok_for_every_event() -> None:
    _reasons, out, _err = run([event("PROCESS_STATE_EXITED", serial=i) for i in range(2)], 5, 60, [0.0, 1.0])
    assert out == "READY\nRESULT 2\nOKREADY\nRESULT 2\nOKREADY\n"


def test_gives_up_once_after_more_than_max_restarts_in_window() -> None:
    exits = [event("PROCESS_STATE_EXITED", serial=i) for i in range(5)]
    reasons, _out, err = run(exits, 3, 300, [0.0, 10.0, 20.0, 30.0, 40.0])
    assert len(reasons) == 1
    assert "4 times within 300 s" in reasons[0] and "T4SERVE_MAX_RESTARTS=3" in reasons[0]
    assert "giving up" in err


def test_exits_spread_beyond_the_window_are_tolerated() -> None:
    exits = [event("PROCESS_STATE_EXITED", serial=i) for i in range(6)]
    reasons, _out, _err = run(exits, 2, 60, [0.0, 50.0, 100.0, 150.0, 200.0, 250.0])
    assert reasons == []


def test_fatal_gives_up_at_once() -> None:
    reasons, _out, _err = run([event("PROCESS_STATE_FATAL")], 3, 300, [])
    assert len(reasons) == 1 and "FATAL" in reasons[0]


def test_other_programs_never_end_the_container() -> None:
    events = [event("PROCESS_STATE_FATAL", process="telemetry")] + [
        event("PROCESS_STATE_EXITED", process="telemetry", serial=i) for i in range(5)
    ]
    reasons, _out, err = run(events, 0, 300, [])
    assert reasons == [] and "telemetry went FATAL" in err


def test_zero_restarts_means_the_first_exit_ends_it() -> None:
    reasons, _out, _err = run([event("PROCESS_STATE_EXITED")], 0, 300, [0.0])
    assert len(reasons) == 1


def test_parse_tokens() -> None:
    assert parse_tokens("a:1 b:x:y c") == {"a": "1", "b": "x:y"}
