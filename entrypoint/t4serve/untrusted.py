"""Untrusted input, checked in one place: numbers, text, paths, secrets, JSON files and command-line flags.

Each function returns a value that is safe to use (bounded, finite, no control characters, inside its folder) or
raises `Untrusted`, whose `reason` completes "must be ..." or says what was found, and never holds a secret. Callers
turn it into their own failure: a settings ConfigError (exit 2), a checkpoint fact "invalid", an unhealthy check.
"""

from __future__ import annotations

import json
import math
import os
import re
import stat
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, BinaryIO

REDACTED = "<redacted>"

# Linux NAME_MAX and PATH_MAX (bytes, the terminating NUL of PATH_MAX left out).
NAME_MAX_BYTES = 255
PATH_MAX_BYTES = 4095
# Every integer t4serve reads fits in 19 digits (int64); more is never a count or a size, and a 400-digit one
# overflows the float arithmetic of sizing.
MAX_INT_DIGITS = 19
# The largest integer setting without a bound of its own (int32: what vLLM's sizes and counts fit in).
MAX_SETTING_INT = 2**31 - 1
# A token or key this long is not one; the environment of an exec'd process holds at most 128 KiB per string.
MAX_SECRET_CHARS = 4096
# JSON files t4serve reads nest 6 levels at most (state.json: object > dict > object > list); real configs ~4.
MAX_JSON_DEPTH = 32

# ASCII digits only (Python's int() and float() also take other scripts' digits, such as Arabic-Indic, and underscores
# between digits: "\u0663" would be 3 and "1_0" 10, which no person reading the value means).
_INT = re.compile(r"[+-]?[0-9]+", re.ASCII)
_FLOAT = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?", re.ASCII)
# A host label that a URL parser (WHATWG "ends in a number") or inet_aton reads as a number: decimal, or 0x hex.
_NUMERIC_LABEL = re.compile(r"[0-9]+|0[xX][0-9A-Fa-f]*", re.ASCII)
# C0 controls, DEL and C1 controls: a newline in a value would start a new line of supervisord.conf, a NUL ends an
# exec'd string early (and makes exec fail), the rest corrupt what a terminal or a log shows.
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_CONTROL_EXCEPT_BLANKS = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")
_HOST_NAME = re.compile(r"(?=.{1,253}$)[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?(?:\.[A-Za-z0-9-]{1,63})*")


class Untrusted(ValueError):
    """Input that failed a check; `reason` says why without repeating a secret."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


# Numbers


def parse_int(raw: str, lo: int, hi: int) -> int:
    """An integer in [lo, hi] from text ("8", " 30 ", "-3"): ASCII decimal digits only (no underscores, no other
    scripts' digits, no base prefix), at most MAX_INT_DIGITS of them. The one parser of an integer a person typed."""
    text = raw.strip()
    if not _INT.fullmatch(text) or len(text.lstrip("+-")) > MAX_INT_DIGITS:
        raise Untrusted(f"must be an integer from {lo} to {hi}")
    value = int(text)
    if not lo <= value <= hi:
        raise Untrusted(f"must be an integer from {lo} to {hi}")
    return value


def parse_float(raw: str, lo: float, hi: float, *, lo_open: bool = False) -> float:
    """A finite decimal number in [lo, hi] ((lo, hi] with `lo_open`): no nan, inf, hex or 1e309."""
    text = raw.strip()
    bounds = f"a number {'>' if lo_open else '>='} {lo:g} and <= {hi:g}"
    if not _FLOAT.fullmatch(text) or len(text) > 64:
        raise Untrusted(f"must be {bounds}")
    value = float(text)
    if not math.isfinite(value) or value > hi or value < lo or (lo_open and value == lo):
        raise Untrusted(f"must be {bounds}")
    return value


def python_reads_differently(text: str) -> bool:
    """`text` is a number to Python's int() or float() (which vLLM's parser uses) but not ASCII decimal: other
    scripts' digits ("\u0663", full-width "\uff18") or underscores ("1_0"). A person reading it sees something else
    than the program, so t4serve refuses it wherever a value reaches a parser it does not own."""
    value = text.strip()
    if not any(c.isdigit() for c in value) or _FLOAT.fullmatch(value):
        return False
    try:
        float(value)
    except ValueError:
        return False
    return True


def check_int(value: object, what: str, lo: int, hi: int) -> int:
    """A JSON value that must be an integer in [lo, hi] (not a bool, not a float like 2.0 or 1e20)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise Untrusted(f"{what} must be an integer from {lo} to {hi}, found {_short(value)}")
    if not lo <= value <= hi:
        raise Untrusted(f"{what} must be an integer from {lo} to {hi}, found {value}")
    return value


def check_finite(value: object, what: str, lo: float = -math.inf, hi: float = math.inf) -> float:
    """A JSON value that must be a finite number in [lo, hi]."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise Untrusted(f"{what} must be a number, found {_short(value)}")
    number = float(value)
    if not math.isfinite(number) or not lo <= number <= hi:
        raise Untrusted(f"{what} must be a finite number from {lo:g} to {hi:g}, found {_short(value)}")
    return number


# Text and paths


def check_text(value: str, what: str, *, allow_blanks: bool = False) -> str:
    """`value` without control characters (tab, CR and LF allowed with `allow_blanks`) and valid as UTF-8.

    A variable holding bytes that are not UTF-8 reaches Python as lone surrogates; they cannot be written to a
    UTF-8 file, so they are refused here rather than where a file is half written."""
    subject = f"{what} " if what else ""
    pattern = _CONTROL_EXCEPT_BLANKS if allow_blanks else _CONTROL
    match = pattern.search(value)
    if match is not None:
        raise Untrusted(f"{subject}must hold no control characters (found {match.group()!r} at index {match.start()})")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise Untrusted(f"{subject}must be valid UTF-8 (found an undecodable byte at index {exc.start})") from None
    return value


def printable(text: str) -> str:
    """`text` as a message may show it: control characters and undecodable bytes escaped (a newline in a value must
    not start a new line of the message)."""
    if _CONTROL.search(text) is None and _utf8(text):
        return text
    return "".join(
        c if _CONTROL.match(c) is None and _utf8(c) else c.encode("unicode_escape", "backslashreplace").decode("ascii")
        for c in text
    )


# Terminal escape sequences: CSI (colours, cursor moves; ESC [ or the C1 byte), OSC (titles, links; ended by BEL or
# ESC \) and the two-byte ones. Removed whole, so no "[31m" is left behind when the ESC goes.
_ESCAPE_SEQUENCE = re.compile(
    r"(?:\x1b\[|\x9b)[0-?]*[ -/]*[@-~]?"  # CSI
    r"|(?:\x1b\]|\x9d)[^\x07\x1b\x9c]*(?:\x07|\x1b\\|\x9c)?"  # OSC
    r"|\x1b[@-Z\\-_]?"
)
_CONTROL_EXCEPT_LINES = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def plain_text(text: str, *, lines: bool = True) -> str:
    """`text` as a result or a message may carry it when another program wrote it (a container's answer, its log):
    escape sequences removed whole, every other control character removed (tabs kept, newlines with `lines`, else
    each made a space), lone surrogates as U+FFFD. Unlike `printable`, which escapes, this keeps what a person reads."""
    if _CONTROL.search(text) is None and _utf8(text):
        return text
    text = _ESCAPE_SEQUENCE.sub("", text)
    if not lines:
        text = re.sub(r"[\r\n]+", " ", text)
    text = _CONTROL_EXCEPT_LINES.sub("", text.replace("\r\n", "\n"))
    return text if _utf8(text) else text.encode("utf-8", "replace").decode("utf-8")


def redact(text: str, secrets: Sequence[str]) -> str:
    """`text` with every secret replaced by REDACTED, as written and as JSON escapes it (a quote or backslash in a
    key). The one redaction step: run before anything that came from elsewhere is cut, stored or shown, so no cut
    leaves a secret's prefix behind."""
    for secret in secrets:
        if secret:
            text = text.replace(secret, REDACTED)
            escaped = json.dumps(secret)[1:-1]
            if escaped != secret:
                text = text.replace(escaped, REDACTED)
    return text


# What a message quotes of one value: enough to recognise it, never a megabyte argument echoed back or logged.
MAX_SHOWN_CHARS = 200


def shown(text: str, limit: int = MAX_SHOWN_CHARS) -> str:
    """`text` as a message quotes it: `printable`, and cut to `limit` characters with how long it was."""
    if len(text) > limit:
        return printable(text[:limit]) + f"... ({len(text):,} characters in all)"
    return printable(text)


def check_path(value: str, what: str = "the path") -> str:
    """A path a file system accepts and supervisord.conf can hold: no control characters, each component at most
    255 bytes, the whole at most 4095."""
    check_text(value, what)
    encoded = value.encode("utf-8")
    if len(encoded) > PATH_MAX_BYTES:
        raise Untrusted(f"{what} must be at most {PATH_MAX_BYTES} bytes long (found {len(encoded)})")
    longest = max((len(part.encode("utf-8")) for part in value.split("/")), default=0)
    if longest > NAME_MAX_BYTES:
        raise Untrusted(f"{what} must have no component over {NAME_MAX_BYTES} bytes (found one of {longest})")
    return value


def check_relative_name(name: object, what: str) -> str:
    """A file name from an untrusted listing (an index's weight_map, refs/main): relative, no `..`, no empty part."""
    if not isinstance(name, str) or not name:
        raise Untrusted(f"{what} must be a non-empty file name, found {_short(name)}")
    check_path(name, what)
    parts = name.split("/")
    if name.startswith("/") or any(part in ("", ".", "..") for part in parts):
        raise Untrusted(f"{what} must be a plain relative name inside its folder, found {name!r}")
    return name


def is_inside(path: Path, root: Path) -> bool:
    """`path`, with every symlink resolved, is `root` or below it (also resolved)."""
    real, real_root = os.path.realpath(path), os.path.realpath(root)
    return real == real_root or real.startswith(real_root.rstrip("/") + "/")


def check_host(value: str) -> str:
    """An IP address (dotted decimal IPv4, or IPv6) or a host name (RFC 1123 labels). A name that reads as a number
    in any base is refused: resolvers (inet_aton) read `1.5` as 1.0.0.5 and `0x10` as 0.0.0.16, URL parsers read a
    numeric or 0x last label as IPv4, and `nan` or `1e5` is no host anyone means. The one check of a host."""
    import ipaddress
    import socket

    try:
        ipaddress.ip_address(value)
        return value
    except ValueError:
        pass
    if not _HOST_NAME.fullmatch(value):
        raise Untrusted("must be an IP address or a host name")
    numeric = _NUMERIC_LABEL.fullmatch(value.rsplit(".", 1)[-1]) is not None
    try:
        socket.inet_aton(value)
        numeric = True
    except OSError:
        pass
    try:
        float(value)
        numeric = True
    except ValueError:
        pass
    if numeric:
        raise Untrusted("must be an IP address or a host name (a name that reads as a number is neither)")
    return value


# Secrets


def check_secret(raw: str, what: str, *, printable_ascii: bool = False) -> str:
    """A token or key: stripped, non-blank, one word, no control characters, at most MAX_SECRET_CHARS; the reason
    never quotes it."""
    value = raw.strip()
    if not value:
        raise Untrusted(f"must be one {what}, not blank (a blank {what} would leave the server without one)")
    if len(value) > MAX_SECRET_CHARS:
        raise Untrusted(f"must be one {what} of at most {MAX_SECRET_CHARS} characters (found {len(value)})")
    if any(c.isspace() for c in value):
        raise Untrusted(f"must be one {what} without whitespace")
    if _CONTROL.search(value) is not None or not _utf8(value):
        raise Untrusted(f"must be one {what} without control characters or undecodable bytes")
    # An HTTP header carries the key: only visible ASCII survives every client unchanged.
    if printable_ascii and not all("!" <= c <= "~" for c in value):
        raise Untrusted(f"must be one {what} of printable ASCII characters")
    return value


def redact_flags(raw: str, is_secret_flag: Callable[[str], bool]) -> str:
    """Shell-quoted flags as they may be shown in a message: unchanged when no secret flag is among them; else every
    value redacted (the value after a secret flag too, even one starting with a dash: which token vLLM takes as the
    secret depends on its parser). Text that does not split (an unbalanced quote) is redacted whole when it may hold
    a secret flag."""
    import shlex

    try:
        tokens = shlex.split(raw)
        splits = True
    except ValueError:
        tokens = raw.split()
        splits = False

    if not any(holds_secret_flag(t, is_secret_flag) for t in tokens):
        return raw
    if not splits:
        return REDACTED
    shown: list[str] = []
    after_secret = False
    for token in tokens:
        holds = holds_secret_flag(token, is_secret_flag)
        if after_secret or not token.startswith("-") or " " in token:
            shown.append(REDACTED)
        else:
            flag, eq, _value = token.partition("=")
            shown.append(flag + (f"={REDACTED}" if eq else ""))
        after_secret = holds and "=" not in token
    return " ".join(shown)


def secret_values(raw: str, is_secret_flag: Callable[[str], bool]) -> list[str]:
    """The texts in shell-quoted flags that may be secrets: the value after or glued to a secret flag, and any token
    holding a secret flag inside it; longest first, for scrubbing a message that quotes part of `raw`."""
    import shlex

    try:
        tokens = shlex.split(raw)
    except ValueError:
        tokens = raw.split()
    found: list[str] = []
    for i, token in enumerate(tokens):
        if not holds_secret_flag(token, is_secret_flag):
            continue
        if not token.startswith("-") or any(c.isspace() for c in token):
            found.append(token)
        _flag, eq, value = token.partition("=")
        if eq and value:
            found.append(value)
        elif i + 1 < len(tokens):
            found.append(tokens[i + 1])
    return sorted({f for f in found if f}, key=len, reverse=True)


def holds_secret_flag(token: str, is_secret_flag: Callable[[str], bool]) -> bool:
    """`token`, or any word inside it (quotes stripped), names a secret flag (or what `is_secret_flag` counts as one:
    a JSON value with a secret key, checked on the whole token too)."""
    return is_secret_flag(token) or any(is_secret_flag(word.strip("\"'").split("=", 1)[0]) for word in token.split())


# Files and JSON


def open_regular(path: Path, what: str) -> BinaryIO:
    """`path` opened for reading, if it is a regular file: opened non-blocking, so a FIFO cannot hold the caller in
    open(), then refused unless regular (a FIFO, a device such as /dev/zero, a directory, a socket), the path and
    what it is named in the reason. A symlink loop or an unreadable file is refused too; a missing file raises
    FileNotFoundError, which callers treat as absent. The one way t4serve opens a file it did not write just now."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise Untrusted(f"{what} {path} cannot be opened: {exc.strerror or type(exc).__name__}") from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise Untrusted(f"{what} {path} must be a regular file (it is {file_kind(mode)})")
    except OSError as exc:
        os.close(fd)
        raise Untrusted(f"{what} {path} cannot be read: {exc.strerror or type(exc).__name__}") from None
    except BaseException:
        os.close(fd)
        raise
    return os.fdopen(fd, "rb")


def file_kind(mode: int) -> str:
    """What a file that is not regular is, from its st_mode, as an error names it ("a FIFO")."""
    for test, kind in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):  # fmt: skip
        if test(mode):
            return kind
    return "not a regular file"


def read_bounded(path: Path, max_bytes: int, what: str) -> bytes:
    """A regular file's bytes, at most `max_bytes` (`open_regular`, then a capped read). A FIFO, a device, a
    directory, a symlink loop or a file that grows past the cap is refused instead of blocking or filling memory."""
    with open_regular(path, what) as handle:
        try:
            size = os.fstat(handle.fileno()).st_size
            if size > max_bytes:
                raise Untrusted(f"{what} {path} must be at most {max_bytes:,} bytes (it has {size:,})")
            chunks: list[bytes] = []
            total = 0
            while True:
                chunk = handle.read(min(1 << 20, max_bytes + 1 - total))
                if not chunk:
                    break
                chunks.append(chunk)
                total += len(chunk)
                if total > max_bytes:
                    raise Untrusted(f"{what} {path} must be at most {max_bytes:,} bytes (it grew past that while read)")
            return b"".join(chunks)
        except OSError as exc:
            raise Untrusted(f"{what} {path} cannot be read: {exc.strerror or type(exc).__name__}") from None


def read_tail_bounded(path: Path, max_bytes: int, what: str) -> bytes:
    """The last `max_bytes` of a regular file (a log that may be large): `open_regular`, then a seek from the end."""
    with open_regular(path, what) as handle:
        try:
            size = os.fstat(handle.fileno()).st_size
            handle.seek(max(0, size - max_bytes))
            return handle.read(max_bytes)
        except OSError as exc:
            raise Untrusted(f"{what} {path} cannot be read: {exc.strerror or type(exc).__name__}") from None


def read_text_bounded(path: Path, max_bytes: int, what: str) -> str:
    """`read_bounded`, decoded as strict UTF-8."""
    data = read_bounded(path, max_bytes, what)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise Untrusted(f"{what} {path} must be UTF-8 text (byte {exc.start} is not)") from None


def loads_json(data: bytes | str, what: str, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """JSON from an untrusted source: strict UTF-8, nesting at most `max_depth`, integers of at most MAX_INT_DIGITS
    digits, finite numbers only (NaN, Infinity and 1e309 are refused), no duplicate object keys."""
    if isinstance(data, bytes):
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise Untrusted(f"{what} must be UTF-8 JSON (byte {exc.start} is not UTF-8)") from None
    else:
        text = data
    depth = json_depth(text, max_depth)
    if depth > max_depth:
        raise Untrusted(f"{what} must nest at most {max_depth} levels (found more)")
    try:
        value = json.loads(
            text,
            parse_constant=_refuse_constant,
            parse_int=_bounded_int,
            parse_float=_finite_float,
            object_pairs_hook=_unique_keys,
        )
        # A \\ud800 escape with no partner decodes to a lone surrogate, which no UTF-8 file or stream can hold: the
        # first print of it would be a traceback. Looked for only where such an escape is written.
        if _SURROGATE_ESCAPE.search(text) is not None and not _utf8(json.dumps(value, ensure_ascii=False)):
            raise Untrusted("must hold valid UTF-8 text (found a \\u escape of a lone surrogate)")
        return value
    except Untrusted as exc:
        raise Untrusted(f"{what}: {exc.reason}") from None
    except (json.JSONDecodeError, RecursionError) as exc:
        raise Untrusted(f"{what} is not valid JSON: {exc}") from None


_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def json_depth(text: str, limit: int | None = None) -> int:
    """The deepest nesting of `[` and `{` outside strings, counted without recursion; with `limit`, counting stops at
    the first level past it (a header of 50 million `[` costs microseconds, not a minute)."""
    # Strings out first, the loop unrolled: (?:[^"\\]|\\.)* took 54 s over an 85 MB header string.
    bare = re.sub(r'"[^"\\]*(?:\\.[^"\\]*)*"', "", text)
    depth = deepest = 0
    for match in re.finditer(r"[\[\]{}]", bare):
        depth += 1 if match.group() in "[{" else -1
        if depth > deepest:
            deepest = depth
            if limit is not None and deepest > limit:
                break
    return deepest


def load_json_file(path: Path, max_bytes: int, what: str, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """`read_bounded` then `loads_json`."""
    return loads_json(read_bounded(path, max_bytes, what), f"{what} {path}", max_depth)


def _refuse_constant(name: str) -> Any:
    raise Untrusted(f"must hold finite numbers only (found {name})")


def _bounded_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise Untrusted(f"must hold integers of at most {MAX_INT_DIGITS} digits (found one of {len(text)})")
    return int(text)


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise Untrusted(f"must hold finite numbers only (found {text[:40]})")
    return value


def _unique_keys(pairs: Iterable[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise Untrusted(f"must not repeat the key {key[:80]!r} in one object")
        result[key] = value
    return result


def _utf8(value: str) -> bool:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
