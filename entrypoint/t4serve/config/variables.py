"""One row of the settings table (`Variable`), the parsers that turn a row's text into its value, and the ConfigError
for a bad value.

A parser takes the raw string and a `Context` and returns the typed value or raises `Invalid` (the reason completes
"NAME=VALUE: must be ...", with a value that would work). t4serve.config.settings builds its table from these, and
t4serve.config.secrets its secret rows.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

from t4serve import untrusted
from t4serve.config.vllmflags import is_secret_word, redact_vllm_args
from t4serve.errors import ConfigError
from t4serve.untrusted import REDACTED

# huggingface_hub's own truth table (constants.ENV_VARS_TRUE_VALUES), so t4serve and the hub never disagree, as
# (true, false) pairs.
SWITCH_PAIRS = (("1", "0"), ("true", "false"), ("yes", "no"), ("on", "off"))
TRUE_WORDS = frozenset(on for on, _ in SWITCH_PAIRS)
FALSE_WORDS = frozenset(off for _, off in SWITCH_PAIRS)
# A switch is written back in the vocabulary of its default: T4SERVE_CANARY=on reads back "on"/"off", HF_HUB_OFFLINE=0
# reads back "1"/"0", as the hub itself writes it.
SWITCH_WORDS: dict[str, tuple[str, str]] = {w: pair for pair in SWITCH_PAIRS for w in pair}


def switch_text(value: bool, default: str | None) -> str:
    """`value` in the words of the switch's default (1/0 where the default is not a switch word)."""
    on, off = SWITCH_WORDS.get((default or "").strip().lower(), ("1", "0"))
    return on if value else off
# ASCII digits only, as every number t4serve reads (t4serve.untrusted): `\d` alone would take other scripts' digits.
_SIZE = re.compile(r"^\s*([0-9]{1,19}(?:\.[0-9]{1,19})?)\s*([KMGT]i?B|B)?\s*$", re.IGNORECASE | re.ASCII)
# No GPU holds a pebibyte: a larger size is a typo, and would overflow the float arithmetic of sizing.
MAX_SIZE_BYTES = 2**50
_SIZE_UNITS = {
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}


# What one setting may hold: far past a path (4,095 bytes), a repo id, a key or a token, and short of a value that is
# repeated into megabytes of output (every row of `profiles` quotes the command line, served model name included).
MAX_SETTING_CHARS = 4096
# T4SERVE_VLLM_ARGS holds several flags, JSON-valued ones among them (a speculative or compilation config).
MAX_VLLM_ARGS_CHARS = 8192
# A name clients send with every request (T4SERVE_SERVED_MODEL_NAME): a repo id is at most 96 characters on the hub.
MAX_NAME_CHARS = 256


class Invalid(Exception):
    """Raised by a parser: `reason` completes "NAME=VALUE: must be ...", `example` is a value that would work."""

    def __init__(self, reason: str, example: str, fix: str | None = None, shown: str | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.example = example
        # Replaces the generic "set NAME=example" where a better fix is known.
        self.fix = fix
        # Replaces the raw value in the message where it holds a secret.
        self.shown = shown


@dataclass(frozen=True)
class Context:
    environ: Mapping[str, str]
    cwd: Path


@dataclass(frozen=True)
class Variable:
    """One row of the settings table."""

    name: str
    field: str
    # The default as a user would write it; None means "unset" (auto, or derived from other settings).
    default: str | None
    # What the default means, for --help, the README and summary().
    default_doc: str
    doc: str
    parse: Callable[[str, Context], Any]
    example: str
    option: str | None = None
    secret: bool = False
    # Computes the default from the environment when it depends on it (HF_HOME follows XDG_CACHE_HOME like the hub).
    default_from: Callable[[Context], Any] | None = None
    # The longest value accepted, in characters (checked before anything else reads it).
    max_chars: int = MAX_SETTING_CHARS

    @property
    def param(self) -> str:
        return f"setting_{self.field}"


def int_in(lo: int, hi: int | None, example: int) -> Callable[[str, Context], int]:
    def parse(raw: str, ctx: Context) -> int:
        try:
            return untrusted.parse_int(raw, lo, untrusted.MAX_SETTING_INT if hi is None else hi)
        except untrusted.Untrusted as exc:
            raise Invalid(exc.reason, str(example)) from None

    return parse


def auto_or_int(lo: int, example: int, hi: int | None = None) -> Callable[[str, Context], int | None]:
    inner = int_in(lo, hi, example)

    def parse(raw: str, ctx: Context) -> int | None:
        if raw.strip().lower() == "auto":
            return None
        try:
            return inner(raw, ctx)
        except Invalid as exc:
            raise Invalid(f'must be "auto" or {exc.reason.removeprefix("must be ")}', str(example)) from None

    return parse


def parse_size(raw: str) -> int:
    """Bytes from "2684354560", "2.5GiB", "2.5 GB" (decimal KB/MB/GB/TB, binary KiB/MiB/GiB/TiB)."""
    match = _SIZE.match(raw)
    if not match:
        raise ValueError(raw)
    number, unit = match.groups()
    # Decimal, so "2.3GB" is exactly 2,300,000,000 bytes and "1.5" (not a whole byte) is refused, not rounded.
    value = Decimal(number) * _SIZE_UNITS[(unit or "B").lower()]
    if value < 1 or value > MAX_SIZE_BYTES or value != value.to_integral_value():
        raise ValueError(raw)
    return int(value)


def choice(options: tuple[str, ...], synonyms: Mapping[str, str] | None = None) -> Callable[[str, Context], str]:
    def parse(raw: str, ctx: Context) -> str:
        value = raw.strip().lower()
        value = (synonyms or {}).get(value, value)
        if value not in options:
            raise Invalid("must be one of " + ", ".join(options), options[0])
        return value

    return parse


def boolean(words: str, example: str) -> Callable[[str, Context], bool]:
    """The one parser of a switch (HF_HUB_OFFLINE, T4SERVE_CANARY): any word of TRUE_WORDS / FALSE_WORDS, whatever
    the case; `words` is how the refusal lists them for this variable ("on or off")."""

    def parse(raw: str, ctx: Context) -> bool:
        value = raw.strip().lower()
        if value in TRUE_WORDS:
            return True
        if value in FALSE_WORDS:
            return False
        raise Invalid(f"must be {words}", example)

    return parse


def host_address(raw: str, ctx: Context) -> str:
    try:
        return untrusted.check_host(raw.strip())
    except untrusted.Untrusted as exc:
        raise Invalid(f"{exc.reason} to bind", "0.0.0.0") from None


def file_path(raw: str, ctx: Context) -> str:
    value = os.path.expanduser(raw.strip())
    if not value:
        raise Invalid("must be a path", "/cache/t4serve")
    path = Path(value)
    absolute = str(path if path.is_absolute() else ctx.cwd / path)
    try:
        # The path goes into supervisord.conf and into file system calls: one line, names the kernel accepts.
        return untrusted.check_path(absolute)
    except untrusted.Untrusted as exc:
        raise Invalid(f"must be a usable path: {exc.reason}", "/cache/t4serve") from None


def checked_text(var: Variable, raw: str) -> str:
    """Every value, before its parser: at most `var.max_chars` characters, no control characters (T4SERVE_VLLM_ARGS
    may span lines), valid UTF-8."""
    if len(raw) > var.max_chars:
        raise Invalid(f"must be at most {var.max_chars:,} characters (found {len(raw):,})", var.example)
    try:
        return untrusted.check_text(raw, "", allow_blanks=var.field == "vllm_args" or var.secret)
    except untrusted.Untrusted as exc:
        raise Invalid(exc.reason, var.example) from None


def setting_error(
    var: Variable,
    raw: str,
    origin: str,
    reason: str,
    example: str,
    fix: str | None = None,
    label: str | None = None,
    shown: str | None = None,
) -> ConfigError:
    """The ConfigError for `raw`, a bad value of `var`: the value as found (redacted where it holds a secret), where it
    came from, what is accepted with an example, and the fix."""
    if var.field == "vllm_args":
        # Parts of the message quote a flag or an argument: none may be a secret's value.
        for secret in untrusted.secret_values(raw, is_secret_word):
            reason = reason.replace(secret, REDACTED)
            fix = fix.replace(secret, REDACTED) if fix is not None else None
    if shown is None:
        text = redact_vllm_args(raw) if var.field == "vllm_args" else raw
        shown = REDACTED if var.secret else untrusted.shown(text)
    given_as = label or var.option
    where = f" (from {given_as})" if origin == "flag" and given_as else ""
    if fix is None and origin == "flag" and label:
        fix = f"give {label} as e.g. {example}, or leave it out for {var.name} or the default ({var.default_doc})"
    default = f", or unset it for the default ({var.default_doc})" if not var.secret else ""
    return ConfigError(
        f"{var.name}={shown}{where}: {reason}, e.g. {example}",
        found=f"{var.name}={shown}",
        fix=fix or f"set {var.name}={example}{default}",
    )


def combine_errors(errors: list[ConfigError]) -> ConfigError:
    """One ConfigError for every bad value found, so a user fixes them all at once."""
    if len(errors) == 1:
        return errors[0]
    return ConfigError(
        f"{len(errors)} settings are invalid:\n" + "\n".join("  - " + e.message().replace("\n", "\n  ") for e in errors)
    )
