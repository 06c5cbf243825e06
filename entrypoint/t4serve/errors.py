"""Error classes, one per exit code, and the message shape every user-facing failure follows.

Every failure a user can meet says what failed, what was found, what is required, and what fixes it.
Exit codes are fixed per class: usage/config 2, preflight 3, patch 4, Docker engine 5, benchmark 6, internal 70.
"""

from __future__ import annotations


class T4ServeError(Exception):
    """A failure with a user-facing message and a fixed exit code."""

    exit_code = 70

    def __init__(self, what: str, *, found: str | None = None, required: str | None = None, fix: str | None = None):
        self.what = what
        self.found = found
        self.required = required
        self.fix = fix
        super().__init__(self.message())

    def message(self) -> str:
        parts = [self.what]
        if self.found is not None:
            parts.append(f"found: {self.found}")
        if self.required is not None:
            parts.append(f"required: {self.required}")
        if self.fix is not None:
            parts.append(f"fix: {self.fix}")
        return "\n  ".join(parts)


class ConfigError(T4ServeError):
    """A bad environment variable, flag or input file (exit 2)."""

    exit_code = 2


class PreflightError(T4ServeError):
    """The machine cannot run the plan (exit 3)."""

    exit_code = 3


class PatchError(T4ServeError):
    """The Turing clamp could not be applied or proven (exit 4)."""

    exit_code = 4


class EngineError(T4ServeError):
    """The Docker Engine refused or failed a request of the host-side commands (exit 5)."""

    exit_code = 5


class BenchError(T4ServeError):
    """`t4serve bench` could not measure: a server it needs never became ready or lists no model, or no run of the
    sweep produced figures (exit 6)."""

    exit_code = 6


class InternalError(T4ServeError):
    """A bug in t4serve (exit 70)."""

    exit_code = 70
