"""Session-finish summary of the hardening tests: inputs tried per area and what went wrong (all zero when the
promises hold), printed by every run that ran them (docs/verification-hardening.md records one)."""

from __future__ import annotations

import pytest
from hardening import Tally


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not Tally.areas:
        return
    write = terminalreporter.write_line
    terminalreporter.section("hardening figures")
    write(f"{'area':<28} {'inputs':>7} {'tracebacks':>11} {'leaks':>6} {'over deadline':>14} {'bad exit':>9}")
    totals = [0, 0, 0, 0, 0]
    for name, f in sorted(Tally.areas.items()):
        row = [f.inputs, f.tracebacks, f.leaks, f.over_deadline, f.bad_exit_codes]
        totals = [a + b for a, b in zip(totals, row, strict=True)]
        write(f"{name:<28} {row[0]:>7} {row[1]:>11} {row[2]:>6} {row[3]:>14} {row[4]:>9}")
    write(f"{'total':<28} {totals[0]:>7} {totals[1]:>11} {totals[2]:>6} {totals[3]:>14} {totals[4]:>9}")
    for name, f in sorted(Tally.areas.items()):
        for example in f.examples[:3]:
            write(f"  {name}: {example}")
