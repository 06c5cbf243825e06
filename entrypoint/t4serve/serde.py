"""Dataclasses to and from JSON-compatible dicts, so recorded facts can be replayed exactly.

`to_dict` is `dataclasses.asdict` with tuples kept as lists; `from_dict` rebuilds nested frozen dataclasses from
their type hints (dataclasses, lists, tuples, dicts, optionals and plain scalars only). Unknown keys are an error:
a fact file from another version must fail loudly, not half-load.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any, TypeVar, Union, get_args, get_origin, get_type_hints

from t4serve.errors import ConfigError

T = TypeVar("T")


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
        raise ConfigError(f"{where}: value {_short(data)} matches none of {tp}", found="; ".join(errors)[:2000])
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        if not isinstance(data, dict):
            raise ConfigError(f"{where}: expected an object for {tp.__name__}, found {type(data).__name__}")
        hints = get_type_hints(tp)
        names = {f.name for f in dataclasses.fields(tp)}
        unknown = set(data) - names
        if unknown:
            raise ConfigError(f"{where}: unknown keys {_short(sorted(unknown))} for {tp.__name__}")
        kwargs = {}
        for f in dataclasses.fields(tp):
            if f.name in data:
                kwargs[f.name] = _convert(hints[f.name], data[f.name], f"{where}.{f.name}")
            elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise ConfigError(f"{where}: missing key {f.name!r} for {tp.__name__}")
        return tp(**kwargs)
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
        _key_t, val_t = get_args(tp) or (Any, Any)
        return {k: _convert(val_t, v, f"{where}.{str(k)[:40]}") for k, v in data.items()}
    if tp is float and isinstance(data, int) and not isinstance(data, bool):
        return float(data)
    if isinstance(tp, type):
        if isinstance(data, tp) and not (tp is int and isinstance(data, bool)):
            return data
        raise ConfigError(f"{where}: expected {tp.__name__}, found {_short(data)}")
    return data


def _short(value: Any) -> str:
    """A value as an error may quote it: its repr, cut to 80 characters (a file may hold a megabyte in one field)."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
