"""T4SERVE_VLLM_ARGS read as `vllm serve` reads it: vLLM 0.33's FlexibleArgumentParser (underscores for dashes, `-O3`,
dotted keys `--flag.key value` merged into one JSON value appended at the end), then Python 3.13's argparse (exact
options, `--flag=value`, unambiguous abbreviations, `-xVALUE` for two-character options, how many values each
flag takes), over vLLM's own table of `vllm serve`'s options.

`read_vllm_args(args)` gives each flag as argparse takes it (`Occurrence`: its action, the option it matched, its
values; the last of one action wins, as in argparse), and the first argument vLLM's parser would refuse
(`ArgvProblem`: an unknown or ambiguous flag, a value-taking flag with no value, a value with no flag). The table is
data/vllm-serve-flags.json, written from the installed vLLM by `python -m t4serve.config.vllmargv --write` (in the
image, where vLLM is installed; `--check` exits 1 when it differs), and checked against the image's vLLM by
tests/image/test_vllm_argv.py. Pure otherwise: strings in, occurrences out.
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cache, lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

DATA_FILE = "vllm-serve-flags.json"
FORMAT = 1
# argparse's reading of an argument that looks like a negative number (it is a value unless an option looks so too).
_NEGATIVE_NUMBER = re.compile(r"^-\d+$|^-\d*\.\d+$")
# vLLM's FlexibleArgumentParser: underscores become dashes between `--` and the first `.`.
_FLAG_NAME = re.compile(r"(?<=--)[^.]*")
# vllm.utils.argparse_utils.human_readable_int, which reads a dotted key's value that is not JSON.
_HUMAN_INT = re.compile(r"(\d+(?:\.\d+)?)([kKmMgGtT])")
_DECIMAL = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
_BINARY = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


@dataclass(frozen=True)
class Action:
    """One argparse action of `vllm serve`: its dest, how many values it takes (argparse's nargs: None for exactly one
    value that does not look like an option, an int, "?", "*" or "+"), the option strings naming it, and for a switch
    those that set it false (`--no-x`, `--disable-x` of an `--enable-x`)."""

    dest: str
    nargs: int | str | None
    options: tuple[str, ...]
    false_options: frozenset[str]

    @property
    def name(self) -> str:
        """The long option a message names it by (`--enable-prefix-caching`, not `--no-enable-prefix-caching`)."""
        longs = [o for o in self.options if o.startswith("--") and o not in self.false_options]
        return min(longs, key=len) if longs else self.options[0]


@dataclass(frozen=True, eq=False)  # one per data file: compared and hashed by identity
class FlagTable:
    vllm_version: str
    prefix_chars: str
    allow_abbrev: bool
    negative_number_options: bool
    actions: tuple[Action, ...]
    by_option: Mapping[str, Action]

    def action(self, option: str) -> Action:
        """The action an exact option string names (the policy tables name flags so; a test holds them to this)."""
        return self.by_option[option]


@dataclass(frozen=True)
class Occurrence:
    """One flag as vLLM's parser takes it."""

    action: Action
    # The option string argparse matched (`--attention-backend` for `--attention-b`).
    option: str
    # The flag as written (the name only, never its value): `--attention_b`, `-sc.method`, `-O3`.
    written: str
    values: tuple[str, ...]
    # Where in T4SERVE_VLLM_ARGS it was written.
    position: int
    # For a value-taking flag given none (at the end, or followed by another flag): argparse's words for it.
    missing: str | None = None

    @property
    def value(self) -> str | None:
        """The one value (the last of several), or None."""
        return self.values[-1] if self.values else None

    @property
    def switched_on(self) -> bool:
        """A switch's state: False for `--no-x` / `--disable-x` of an `--enable-x` action."""
        return self.option not in self.action.false_options


@dataclass(frozen=True)
class ArgvProblem:
    """The first argument vLLM's parser refuses: where, the flag as written (never a value: "a value" stands for one),
    and why (`written` then `reason` make the sentence)."""

    position: int
    written: str
    reason: str


@dataclass(frozen=True)
class ReadArgs:
    occurrences: tuple[Occurrence, ...]
    problem: ArgvProblem | None

    def last(self, dest: str) -> Occurrence | None:
        """The occurrence that wins for `dest`: the last one, as argparse sets it."""
        found = [o for o in self.occurrences if o.action.dest == dest]
        return found[-1] if found else None


def _table_from(data: Any) -> FlagTable:
    actions = tuple(
        Action(str(a["dest"]), a["nargs"], tuple(a["options"]), frozenset(a["false_options"])) for a in data["actions"]
    )
    by_option = {o: a for a in actions for o in a.options}
    return FlagTable(str(data["vllm_version"]), str(data["prefix_chars"]), bool(data["allow_abbrev"]),
                     bool(data["negative_number_options"]), actions, by_option)  # fmt: skip


@cache
def flag_table() -> FlagTable:
    """data/vllm-serve-flags.json (see the module docstring)."""
    return _table_from(json.loads(resources.files("t4serve").joinpath("data", DATA_FILE).read_text()))


# vLLM's own preprocessing (FlexibleArgumentParser.parse_args), each argument kept with where it was written


@dataclass(frozen=True)
class _Arg:
    text: str
    position: int
    written: str


def _flexible(args: Sequence[str]) -> tuple[list[_Arg], ArgvProblem | None]:
    """Underscores to dashes, `-O3` to `--optimization-level 3`, `--help=x` to `--help`, then dotted keys merged
    into one JSON value per flag, appended after everything else; as vLLM 0.33 does before argparse sees them."""
    processed: list[_Arg] = []
    for i, arg in enumerate(args):
        if arg.startswith("--help="):
            processed.append(_Arg("--help", i, "--help"))
        elif arg.startswith("--"):
            key, eq, value = arg.partition("=")
            dashed = _FLAG_NAME.sub(lambda m: m.group(0).replace("_", "-"), key, count=1)
            processed.append(_Arg(dashed + eq + value, i, key))
        elif arg.startswith("-O") and arg != "-O":
            level = arg[3:] if arg[2] == "=" else arg[2:]
            processed += [_Arg("--optimization-level", i, arg), _Arg(level, i, arg)]
        elif arg == "-O" and i + 1 < len(args) and args[i + 1] in {"0", "1", "2", "3"}:
            processed.append(_Arg("--optimization-level", i, arg))
        else:
            processed.append(_Arg(arg, i, arg.partition("=")[0] if arg.startswith("-") else "a value"))
    deleted: set[int] = set()
    merged: dict[str, tuple[_Arg, dict[str, Any]]] = {}
    for i, item in enumerate(processed):
        text = item.text
        if i in deleted or (text.startswith("--") and "." not in text) or not (text.startswith("-") and "." in text):
            continue
        if "=" in text:
            text, value = text.split("=", 1)
            if "." not in text:
                continue
        else:
            if i + 1 >= len(processed):
                # vLLM reads the next argument unguarded: an IndexError, its traceback, no server.
                return [], ArgvProblem(item.position, item.written.partition("=")[0],
                                       "needs a value: a dotted key (--flag.key VALUE) takes the next argument, and "
                                       "it ends the flags")
            value = processed[i + 1].text
            deleted.add(i + 1)
        if text.endswith("+"):
            text, value = text[:-1], json.dumps(value.split(","))
        key, *keys = text.split(".")
        try:
            parsed = _dotted_value(value)
        except RecursionError:
            return [], ArgvProblem(item.position, text, "nests its value deeper than vLLM's JSON reader goes")
        nested: Any = parsed
        for k in reversed(keys):
            nested = {k: nested}
        _, into = merged.setdefault(key, (item, {}))
        _update(into, nested)
        deleted.add(i)
    kept = [a for i, a in enumerate(processed) if i not in deleted]
    for key, (first, merged_value) in merged.items():
        written = first.written.partition("=")[0]
        try:
            text = json.dumps(merged_value)
        except (ValueError, RecursionError):
            return [], ArgvProblem(first.position, written, "nests its value deeper than vLLM's JSON reader goes")
        kept += [_Arg(key, first.position, written), _Arg(text, first.position, written)]
    return kept, None


def _dotted_value(text: str) -> Any:
    """A dotted key's value as vLLM reads it: JSON, else a human-readable integer (`80g`), else the text."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        pass
    stripped = text.strip()
    match = _HUMAN_INT.fullmatch(stripped)
    try:
        if match:
            number, suffix = match.groups()
            if suffix in _DECIMAL:
                return int(float(number) * _DECIMAL[suffix])
            return int(number) * _BINARY[suffix]
        return int(stripped)
    except (ValueError, OverflowError):
        return text


def _update(original: dict[str, Any], update: dict[str, Any]) -> None:
    """vLLM's `recursive_dict_update`: objects merged, lists extended, anything else replaced."""
    for k, v in update.items():
        if isinstance(v, dict) and isinstance(original.get(k), dict):
            _update(original[k], v)
        elif isinstance(v, list) and isinstance(original.get(k), list):
            original[k] += v
        else:
            original[k] = v


# Python 3.13's argparse (the image's), over the table


_Tuple = tuple[Action | None, str, str | None, str | None]


def _option_tuples(table: FlagTable, arg: str) -> list[_Tuple] | None:
    """argparse's `_parse_optional`: None for a positional argument (a value), else the options it may name."""
    if not arg or arg[0] not in table.prefix_chars:
        return None
    if arg in table.by_option:
        return [(table.by_option[arg], arg, None, None)]
    if len(arg) == 1:
        return None
    name, sep, explicit = arg.partition("=")
    if sep and name in table.by_option:
        return [(table.by_option[name], name, sep, explicit)]
    found: list[_Tuple] = []
    chars = table.prefix_chars
    prefix: str
    if arg[1] in chars:
        if table.allow_abbrev:
            prefix, sep, explicit = arg.partition("=")
            for option, action in table.by_option.items():
                if option.startswith(prefix):
                    found.append((action, option, sep or None, explicit if sep else None))
    else:
        prefix, sep, explicit = arg.partition("=")
        short, short_explicit = arg[:2], arg[2:]
        for option, action in table.by_option.items():
            if option == short:
                found.append((action, option, "", short_explicit))
            elif table.allow_abbrev and option.startswith(prefix):
                found.append((action, option, sep or None, explicit if sep else None))
    if found:
        return found
    if _NEGATIVE_NUMBER.match(arg) and not table.negative_number_options:
        return None
    if " " in arg:
        return None
    return [(None, arg, None, None)]


def _count(action: Action, pattern: str) -> int | str:
    """argparse's `_match_argument` for an option: how many of the following arguments it takes ('A' a value, 'O'
    an option), or its error."""
    nargs = action.nargs
    leading = len(pattern) - len(pattern.lstrip("A"))
    if nargs is None:
        return 1 if leading >= 1 else "expected one argument"
    if nargs == "?":
        return min(leading, 1)
    if nargs == "*":
        return leading
    if nargs == "+":
        return leading if leading >= 1 else "expected at least one argument"
    if isinstance(nargs, int):
        options_too = len(pattern) - len(pattern.lstrip("AO"))
        if options_too >= nargs:
            return nargs
        return f"expected {nargs} argument{'s' if nargs != 1 else ''}"
    return "takes values in a way t4serve does not read"


def _suggest(table: FlagTable, written: str) -> str:
    """The flags `written` may have meant: its lower-case spelling (vLLM's parser is case-sensitive), else the
    closest names."""
    import difflib

    name = written.partition("=")[0]
    folded = "--" + name[2:].lower().replace("_", "-") if name.startswith("--") else name.lower()
    if folded != name and folded in table.by_option:
        return f" (vLLM's flags are lower case: {folded})"
    close = difflib.get_close_matches(folded, [a.name for a in table.actions], n=2)
    return f" (did you mean {' or '.join(close)}?)" if close else ""


@lru_cache(maxsize=64)  # the settings, the plan and the KV sizing read the same arguments
def _read(args: tuple[str, ...], table: FlagTable) -> ReadArgs:
    items, problem = _flexible(args)
    if problem is not None:
        return ReadArgs((), problem)
    tuples: list[list[_Tuple] | None] = []
    pattern = ""
    for i, item in enumerate(items):
        if item.text == "--":
            pattern += "-" + "A" * (len(items) - i - 1)
            tuples += [None] * (len(items) - i)
            break
        found = _option_tuples(table, item.text)
        tuples.append(found)
        pattern += "A" if found is None else "O"
    occurrences: list[Occurrence] = []

    def stop(at: int, reason: str, written: str | None = None) -> ReadArgs:
        item = items[at]
        return ReadArgs(tuple(occurrences), ArgvProblem(item.position, written or item.written, reason))

    i = 0
    while i < len(items):
        item = items[i]
        if pattern[i] == "-":
            return stop(i, "ends vLLM's options: what follows is taken as more model names, which vLLM refuses")
        if pattern[i] == "A":
            return stop(i, "stands with no flag before it (vLLM's parser refuses it as an unrecognized argument; "
                           "quote a value that holds spaces)", written="a value")
        options = tuples[i]
        assert options is not None
        if len(options) > 1:
            matches = ", ".join(sorted(o for _a, o, _s, _e in options)[:6])
            return stop(i, f"is ambiguous to vLLM's parser: it could be {matches}; write the whole flag")
        action, option, sep, explicit = options[0]
        while True:
            if action is None:
                return stop(i, f"is not a flag of vLLM {table.vllm_version}'s `vllm serve`{_suggest(table, option)}")
            if explicit is not None:
                count = _count(action, "A")
                if count == 0 and option[1] not in table.prefix_chars and explicit != "":
                    if sep or explicit[0] in table.prefix_chars:
                        return stop(i, f"gives the switch {option} a value, which vLLM's parser refuses")
                    occurrences.append(Occurrence(action, option, item.written, (), item.position))
                    option = option[0] + explicit[0]
                    if option not in table.by_option:
                        return stop(i, f"is not a flag of vLLM {table.vllm_version}'s `vllm serve` ({option} is "
                                       "none)")
                    action, explicit = table.by_option[option], explicit[1:]
                    if not explicit:
                        sep = explicit = None
                    elif explicit[0] == "=":
                        sep, explicit = "=", explicit[1:]
                    else:
                        sep = ""
                    continue
                if count == 1:
                    occurrences.append(Occurrence(action, option, item.written, (explicit,), item.position))
                    i += 1
                    break
                return stop(i, f"gives {option} a value with `=`, which vLLM's parser refuses"
                            + (" (a switch takes none)" if action.nargs == 0 else ""))
            taken = _count(action, pattern[i + 1:])
            if isinstance(taken, str):
                occurrences.append(Occurrence(action, option, item.written, (), item.position, missing=taken))
                ahead = "it ends the flags" if i + 1 >= len(items) else "another flag follows it"
                return stop(i, f"needs a value ({option}: {taken}), and {ahead}")
            values = tuple(a.text for a in items[i + 1:i + 1 + taken])
            occurrences.append(Occurrence(action, option, item.written, values, item.position))
            i += 1 + taken
            break
    return ReadArgs(tuple(occurrences), None)


def read_vllm_args(args: Sequence[str], table: FlagTable | None = None) -> ReadArgs:
    """`args` (T4SERVE_VLLM_ARGS, split as the shell splits it) as `vllm serve` reads them after t4serve's own flags:
    each flag with its values in order, and the first argument vLLM's parser would refuse."""
    return _read(tuple(args), table or flag_table())


def resolve(written: str, table: FlagTable | None = None) -> Occurrence | None:
    """The flag one argument names as vLLM reads it (`--attention-b`, `--api_key=x`, `-tp`), or None when it names
    none, or several."""
    read = read_vllm_args([written.partition("=")[0] if written.startswith("--") else written], table)
    return read.occurrences[0] if read.occurrences else None


# The table from the installed vLLM (in the image)


def _from_vllm() -> dict[str, Any]:
    """The table as the installed vLLM's `vllm serve` parser has it. Its defaults need a platform: the CPU one
    (VLLM_TARGET_DEVICE=cpu) builds the same options as CUDA's, with no GPU to ask."""
    import argparse

    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    import vllm
    from vllm.entrypoints.cli.serve import ServeSubcommand
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    top = FlexibleArgumentParser(description="vLLM CLI")
    serve = ServeSubcommand().subparser_init(top.add_subparsers(required=False, dest="subparser"))
    actions: dict[int, dict[str, Any]] = {}
    for option, action in serve._option_string_actions.items():
        entry = actions.setdefault(id(action), {"dest": action.dest, "nargs": action.nargs, "options": [],
                                                "false_options": []})  # fmt: skip
        entry["options"].append(option)
        if isinstance(action, argparse.BooleanOptionalAction):
            negative = getattr(action, "negative_option_strings", None)
            entry["false_options"] = sorted(negative if negative is not None else
                                            [o for o in action.option_strings if o.startswith("--no-")])
    listed = [{**a, "options": sorted(a["options"])} for a in actions.values()]
    return {
        "format": FORMAT,
        "vllm_version": vllm.__version__,
        "prefix_chars": serve.prefix_chars,
        "allow_abbrev": serve.allow_abbrev,
        "negative_number_options": bool(serve._has_negative_number_optionals),
        "actions": sorted(listed, key=lambda a: a["options"][0]),
    }


def table_text(data: Mapping[str, Any]) -> str:
    """The data file's text: one action per line, so a new vLLM's changes read as a diff."""
    head = {k: v for k, v in data.items() if k != "actions"}
    lines = [json.dumps(a, sort_keys=True) for a in data["actions"]]
    inner = json.dumps(head, indent=1, sort_keys=True)[:-2]
    return inner + ',\n "actions": [\n  ' + ",\n  ".join(lines) + "\n ]\n}\n"


def main(argv: list[str] | None = None) -> int:
    """`--write`: regenerate the data file from the installed vLLM; `--check`: exit 1 when it differs."""
    args = sys.argv[1:] if argv is None else argv
    if args not in (["--write"], ["--check"]):
        print("usage: python -m t4serve.config.vllmargv --write | --check", file=sys.stderr)
        return 2
    stdout, sys.stdout = sys.stdout, sys.stderr  # what vLLM prints on import stays off the answer
    try:
        fresh = _from_vllm()
    finally:
        sys.stdout = stdout
    path = Path(str(resources.files("t4serve").joinpath("data", DATA_FILE)))
    if args == ["--check"]:
        table = json.loads(path.read_text())
        same = fresh == table
        print(json.dumps({"same": same, "installed": fresh["vllm_version"], "table": table["vllm_version"]}))
        return 0 if same else 1
    path.write_text(table_text(fresh))
    return 0


if __name__ == "__main__":
    sys.exit(main())
