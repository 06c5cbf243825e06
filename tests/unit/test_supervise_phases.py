"""t4serve.supervise.phases: the one table of phases and of vLLM's log lines, as the tracker, the healthcheck and the
start budget read it. (Each format string is checked against the image's vLLM source in tests/image/test_log_formats.py;
here, that each line's regex reads its own format filled in, so the table cannot hold a line its tracker misses.)"""

from __future__ import annotations

import re

import pytest

from t4serve.supervise import phases
from t4serve.supervise.logwatch import PHASE_RANK, PhaseTracker
from t4serve.supervise.phases import FIGURE_LINES, LOADING_PHASES, LOG_LINES, PHASES, LogLine


def filled(fmt: str) -> str:
    return re.sub(r"%\.\df", "12.5", fmt.replace("%s", "1,234"))


def test_the_phases_in_the_order_a_start_goes_through_them() -> None:
    assert list(PHASES) == ["starting", "downloading", "loading_weights", "profiling", "compiling", "canary", "ready",
                            "canary_failed", "failed", "config_error", "stopping"]  # fmt: skip
    assert LOADING_PHASES == ("starting", "downloading", "loading_weights", "profiling", "compiling", "canary")
    assert [PHASE_RANK[p] for p in [*LOADING_PHASES, "ready"]] == [0, 1, 1, 2, 3, 4, 5]
    assert {p.name for p in PHASES.values() if p.before_weights_loaded} == {"starting", "downloading",
                                                                             "loading_weights"}
    assert len({p.label for p in PHASES.values()}) == len(PHASES)


def test_each_phase_says_what_both_healthchecks_answer_in_it() -> None:
    readiness = {phases.NOT_READY_LOADING, phases.READY_WHEN_ANSWERING, phases.UNHEALTHY, phases.UNHEALTHY_CONFIG,
                 phases.NOT_READY_STOPPING}
    liveness = {phases.ALIVE_WITHIN_BUDGET, phases.ALIVE_WHILE_ANSWERING, phases.ALIVE}
    for phase in PHASES.values():
        assert phase.readiness in readiness and phase.liveness in liveness, phase.name
        # A loading phase is alive within the cold-start budget, and only a loading phase is.
        assert phase.loading == (phase.liveness == phases.ALIVE_WITHIN_BUDGET), phase.name
    assert PHASES["ready"].readiness == phases.READY_WHEN_ANSWERING
    assert {n for n, p in PHASES.items() if p.readiness == phases.UNHEALTHY} == {"canary_failed", "failed"}
    assert PHASES[phases.CONFIG_ERROR].readiness == phases.UNHEALTHY_CONFIG


@pytest.mark.parametrize("line", [line for line, _ in LOG_LINES], ids=lambda line: line.name)
def test_each_line_reads_its_own_format_and_names_its_source(line: LogLine) -> None:
    match = line.regex.search(filled(line.vllm_format))
    assert match is not None, (line.name, line.regex.pattern, filled(line.vllm_format))
    for name, group, _unit in line.figures:
        assert match.group(group) in ("1,234", "12.5"), (line.name, name)
    assert line.source_file.endswith(".py") and "/" in line.source_file
    assert phases.VLLM_VERSION == "0.34.0"


def test_a_line_moves_the_tracker_into_the_phase_whose_row_holds_it() -> None:
    names = [line.name for line, _ in LOG_LINES]
    assert len(set(names)) == len(names)
    assert set(FIGURE_LINES) == {line for line, phase in LOG_LINES if phase is None}
    for line, phase in LOG_LINES:
        tracker = PhaseTracker(0.0)
        event = tracker.feed(f"INFO 05-01 12:00:00 [x.py:1] {filled(line.vllm_format)}", 1.0)
        assert event is not None and event.pattern == line.name
        if phase is not None:
            assert line in PHASES[phase].started_by
            assert tracker.phase == phase
        else:
            assert tracker.phase == "starting"


def test_every_phase_is_entered_on_a_log_line_or_an_event_of_the_wrapper() -> None:
    for phase in PHASES.values():
        assert bool(phase.started_by) != bool(phase.entered_on), phase.name


def test_the_architecture_document_holds_this_table() -> None:
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs" / "architecture.md").read_text(encoding="utf-8")
    start, end = "<!-- phases:start -->\n", "<!-- phases:end -->"
    assert text.count(start) == 1 and text.count(end) == 1
    assert text[text.index(start) + len(start):text.index(end)] == phases.markdown_table(), (
        "docs/architecture.md's table of phases is out of date: put t4serve.supervise.phases.markdown_table() between "
        "its markers"
    )
