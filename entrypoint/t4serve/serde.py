"""Dataclasses to and from JSON-compatible dicts: the one typed reader of every file and answer that crosses a
boundary (recorded facts, state files, the container's answers).

`to_dict` is `dataclasses.asdict` with tuples kept as lists; `from_dict` rebuilds nested frozen dataclasses from
their type hints (dataclasses, lists, tuples, dicts, optionals, plain scalars) and the bounds a field declares with
`Annotated[T, mark, ...]`: `Range`, `OneOf`, `Matches`, `Text`, `Items`, `Check`. Every integer fits 19 digits, every
float is finite, every string is valid UTF-8, and a dataclass may check across its fields in `check_read`. Unknown
or missing keys and any value out of bounds are a ConfigError naming where: a file from another version, or an
answer of another shape, fails loudly instead of half-loading or reaching a traceback later.
"""

from __future__ import annotations

import dataclasses
import math
import re
import types
import typing
from collections.abc import Callable
from typing import Annotated, Any, TypeVar, Union, get_args, get_origin, get_type_hints

from t4serve.errors import ConfigError
from t4serve.untrusted import MAX_INT_DIGITS, Untrusted, plain_text, printable

T = TypeVar("T")
_MAX_INT = 10**MAX_INT_DIGITS


@dataclasses.dataclass(frozen=True)
class Range:
    """A number from `lo` to `hi`."""

    lo: float
    hi: float


@dataclasses.dataclass(frozen=True)
class OneOf:
    """One of these values (an enum of text or numbers)."""

    values: tuple[object, ...]


@dataclasses.dataclass(frozen=True)
class Matches:
    """Text matching `pattern` whole: a name, an id or a path, checked as the same name from a client would be."""

    pattern: re.Pattern[str]
    what: str


@dataclasses.dataclass(frozen=True)
class Text:
    """Text of at most `max_chars` as a person may be shown it: escape sequences and control characters removed
    (t4serve.untrusted.plain_text; newlines kept with `lines`)."""

    max_chars: int
    lines: bool = False


@dataclasses.dataclass(frozen=True)
class Items:
    """A list or object of `lo` to `hi` entries."""

    lo: int
    hi: int


@dataclasses.dataclass(frozen=True)
class Check:
    """Any other check: `fn` raises t4serve.untrusted.Untrusted for a value it refuses."""

    fn: Callable[[Any], None]


Mark = Range | OneOf | Matches | Text | Items | Check


def to_dict(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_dict(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, list | tuple):
        return [to_dict(v) for v in obj]
    if isinstance(obj, dict):
        return {str(k): to_dict(v) for k, v in obj.items()}
    return obj


def from_dict(cls: type[T], data: Any, where: str = "$") -> T:
    return typing.cast(T, _convert(cls, data, where))


def _convert(tp: Any, data: Any, where: str) -> Any:
    origin = get_origin(tp)
    if tp is Any:
        return data
    if origin is Annotated:
        base, *marks = get_args(tp)
        value = _convert(base, data, where)
        for mark in marks:
            if value is not None:
                value = _apply(mark, value, where)
        return value
    if origin in (Union, types.UnionType):
        args = get_args(tp)
        if data is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _convert(arg, data, where)
            except ConfigError as exc:
                errors.append(str(exc))
        raise ConfigError(f"{where}: value {_short(data)} matches none of {_short(tp)}", found="; ".join(errors)[:2000])
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        return _dataclass(tp, data, where)
    if origin in (list, tuple):
        if not isinstance(data, list | tuple):
            raise ConfigError(f"{where}: expected a list, found {type(data).__name__}")
        args = get_args(tp)
        if origin is tuple and args and args[-1] is not Ellipsis:
            if len(args) != len(data):
                raise ConfigError(f"{where}: expected {len(args)} items, found {len(data)}")
            return tuple(_convert(a, v, f"{where}[{i}]") for i, (a, v) in enumerate(zip(args, data, strict=True)))
        item = args[0] if args else Any
        items = [_convert(item, v, f"{where}[{i}]") for i, v in enumerate(data)]
        return tuple(items) if origin is tuple else items
    if origin is dict:
        if not isinstance(data, dict):
            raise ConfigError(f"{where}: expected an object, found {type(data).__name__}")
        key_t, val_t = get_args(tp) or (Any, Any)
        return {_convert(key_t, k, f"{where} key {_short(k)}"): _convert(val_t, v, f"{where}.{printable(str(k)[:40])}")
                for k, v in data.items()}  # fmt: skip
    if tp is float and isinstance(data, int) and not isinstance(data, bool):
        return _scalar(float, float(data) if abs(data) < _MAX_INT else math.inf, where)
    if isinstance(tp, type):
        if isinstance(data, tp) and not (tp is int and isinstance(data, bool)):
            return _scalar(tp, data, where)
        raise ConfigError(f"{where}: expected {tp.__name__}, found {_short(data)}")
    return data


def _dataclass(tp: type[Any], data: Any, where: str) -> Any:
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: expected an object for {tp.__name__}, found {type(data).__name__}")
    hints = _hints(tp)
    names = {f.name for f in dataclasses.fields(tp)}
    unknown = set(data) - names
    if unknown:
        raise ConfigError(f"{where}: unknown keys {_short(sorted(map(str, unknown)))} for {tp.__name__}")
    kwargs = {}
    for f in dataclasses.fields(tp):
        if f.name in data:
            kwargs[f.name] = _convert(hints[f.name], data[f.name], f"{where}.{f.name}")
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise ConfigError(f"{where}: missing key {f.name!r} for {tp.__name__}")
    obj = tp(**kwargs)
    check = getattr(obj, "check_read", None)
    if callable(check):
        try:
            check()
        except Untrusted as exc:
            raise ConfigError(f"{where}: {exc.reason}") from None
    return obj


_HINTS: dict[type[Any], dict[str, Any]] = {}


def _hints(tp: type[Any]) -> dict[str, Any]:
    """A dataclass's field types with their marks, evaluated once (they are the class's string annotations)."""
    if tp not in _HINTS:
        _HINTS[tp] = get_type_hints(tp, include_extras=True)
    return _HINTS[tp]


def _scalar(tp: type[Any], data: Any, where: str) -> Any:
    """The bounds every scalar keeps, declared or not: integers of at most 19 digits, finite floats, UTF-8 text."""
    if tp is int and not -_MAX_INT < data < _MAX_INT:
        raise ConfigError(f"{where}: expected an integer of at most {MAX_INT_DIGITS} digits, found {_short(data)}")
    if tp is float and not math.isfinite(data):
        raise ConfigError(f"{where}: expected a finite number, found {_short(data)}")
    if tp is str:
        try:
            data.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise ConfigError(f"{where}: expected UTF-8 text (found a lone surrogate at index {exc.start})") from None
    return data


def _apply(mark: Any, value: Any, where: str) -> Any:
    """`value` checked against one declared mark (Text cleans it)."""
    problem = None
    if isinstance(mark, Range):
        if not mark.lo <= value <= mark.hi:
            problem = f"a number from {mark.lo:g} to {mark.hi:g}"
    elif isinstance(mark, OneOf):
        if value not in mark.values:
            problem = "one of " + ", ".join(map(str, mark.values))[:600]
    elif isinstance(mark, Matches):
        if not mark.pattern.fullmatch(value):
            problem = mark.what
    elif isinstance(mark, Text):
        if len(value) > mark.max_chars:
            problem = f"text of at most {mark.max_chars:,} characters (found {len(value):,})"
        else:
            return plain_text(value, lines=mark.lines)
    elif isinstance(mark, Items):
        if not mark.lo <= len(value) <= mark.hi:
            problem = f"{mark.lo:,} to {mark.hi:,} entries (found {len(value):,})"
    elif isinstance(mark, Check):
        try:
            mark.fn(value)
        except Untrusted as exc:
            problem = exc.reason
    if problem is not None:
        raise ConfigError(f"{where}: expected {problem}, found {_short(value)}")
    return value


def _short(value: Any) -> str:
    """A value as an error may quote it: its repr, cut to 80 characters (a file may hold a megabyte in one field)."""
    try:
        text = repr(value)
    except ValueError:  # an integer past Python's 4,300 digits of int-to-text conversion
        return "an integer of more than 4,300 digits"
    return text if len(text) <= 80 else text[:77] + "..."
