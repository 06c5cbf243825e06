"""Error classes, one per exit code, the one table of exit codes, and the message shape every failure follows.

Every failure a user can meet says what failed, what was found, what is required, and what fixes it.
Exit codes are fixed per class: usage/config 2, preflight 3, patch 4, Docker engine 5, benchmark 6, internal 70.
EXIT_CODES is the table every command keeps to, in every output form (`--json` or text); docs/reference.md's copy is
generated from it (`exit_codes_markdown`) and a unit test keeps them equal.
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


# The one table of exit codes: (code, meaning, where it comes from).
EXIT_CODES: tuple[tuple[str, str, str], ...] = (
    ("0", "success", "every command; `healthcheck`: ready (with `--liveness`: alive)"),
    ("1", "a verdict of failure that is no error of t4serve's",
     "`healthcheck`: not ready or not alive, whatever the reason (Docker reads only 0 and 1); `bench`: some runs "
     "failed (the folder holds the rest); `run-vllm`: vLLM exited"),
    ("2", "bad configuration, usage or input file (`ConfigError`)",
     "a setting, option or secret file (any command); a facts file; a checkpoint the probe cannot read (`plan`, "
     "`profiles`, `roofline`, `preflight` and `serve` alike); a state or exit-request file `status` cannot read, a "
     "bench result folder; `T4SERVE_SIZE_AS` larger than the card; `mcp --http` on an address it cannot listen on; "
     "`scripts/publish`: a usage error, `T4SERVE_PUSH_TIMEOUT_S`, a kustomization it cannot edit (nothing pushed)"),
    ("3", "the machine cannot run the plan (`PreflightError`)",
     "`preflight`, `host-check` or `serve` found a failed check; `serve` cannot write its state folder"),
    ("4", "the Turing clamp not applied or not proven (`PatchError`)", "`patch apply`, `patch verify`"),
    ("5", "the Docker engine or its client refused or failed a request (`EngineError`)",
     "`host-check`, `mcp` (its tools answer the same found / required / fix as an error); a `--json` command that "
     "failed in the container, or answered in another shape, is this on the host, whatever its own exit code; "
     "`scripts/publish`: no engine, the build, the tag or the push failed (nothing pinned)"),
    ("6", "`bench` measured nothing (`BenchError`)", "`bench`: no run of the sweep produced figures"),
    ("70", "internal error: a bug in t4serve", "any command; the traceback is printed to report; `scripts/publish`: "
     "its kustomization edit failed its own check (the file is left as it was)"),
    ("128+N", "stopped by signal N", "`bench` (the runs finished before it are in the folder), `serve`"),
    ("130", "aborted", "Ctrl-C at a prompt"),
)


def exit_codes_markdown() -> str:
    """docs/reference.md's exit-code table, from EXIT_CODES."""
    lines = ["| exit | meaning | from |", "|---|---|---|"]
    lines += [f"| {code} | {meaning} | {where} |" for code, meaning, where in EXIT_CODES]
    return "\n".join(lines) + "\n"
