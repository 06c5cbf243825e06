#!/usr/bin/env python3
"""Set kustomize's `images:` entry for t4serve (newName + digest, no newTag) in a kustomization, as scripts/publish
does after a push:
    pin_kustomization.py [--check] FILE REPOSITORY sha256:DIGEST

The file is edited as text where PyYAML's parser locates the `images` list (its marks), so every comment, blank
line, quote and key order outside the t4serve entry stays as it was; the result is parsed again and must equal the
original with only that entry set, and no key may repeat (kustomize refuses duplicates). Written beside the file's
target (a symbolic link stays a link), with its mode, then renamed over it. `--check` stops before writing: what
scripts/publish runs before a push, so a file it cannot edit is refused in seconds, not after the upload.

Needs Python 3.11+ and PyYAML (Debian's python3-yaml). Exit codes: 0 done; 2 refused (a file that is not a regular
file, not UTF-8, not YAML, not a mapping, an `images` that is not a list, two t4serve entries, a YAML alias, a
repeated key; the message says which, and the file is untouched); 70 the edit failed its own check (a bug: the file is
untouched).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import stat
import sys
import tempfile
from typing import Any, NoReturn

try:
    import yaml
except ImportError:  # scripts/publish checks it first; said again for a direct call
    print("pin_kustomization.py: PyYAML is not installed for this python3\n  fix: apt-get install python3-yaml (or "
          "pip install pyyaml)", file=sys.stderr)
    sys.exit(2)

NAME = "t4serve"
MAX_BYTES = 1 << 20  # a kustomization is a few KB
DIGEST = re.compile(r"sha256:[0-9a-f]{64}")


class Refused(Exception):
    """The kustomization cannot be edited (exit 2): what was found, and the fix."""

    def __init__(self, what: str, found: str, fix: str, code: int = 2) -> None:
        super().__init__(what)
        self.what, self.found, self.fix, self.code = what, found, fix, code


def read_text(path: str) -> tuple[str, str]:
    """(the target file's real path, its text): a regular file of at most 1 MiB, UTF-8 (a BOM kept aside)."""
    real = os.path.realpath(path)
    try:
        fd = os.open(real, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise Refused("the kustomization cannot be opened", f"{path}: {exc.strerror or exc}",
                      "pass --kustomization PATH/kustomization.yaml, an existing file") from None
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            raise Refused("the kustomization is not a regular file", f"{path} ({real})",
                          "pass --kustomization PATH/kustomization.yaml, a regular file")
        data = f.read(MAX_BYTES + 1)
    if len(data) > MAX_BYTES:
        raise Refused("the kustomization is too large", f"{path}: more than {MAX_BYTES:,} bytes",
                      "pass the kustomization.yaml itself")
    try:
        return real, data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise Refused("the kustomization is not UTF-8 text", f"{path}: byte 0x{data[exc.start]:02x} at offset "
                      f"{exc.start} is not UTF-8", "save it as UTF-8 (kustomize reads UTF-8 only)") from None


def scalar_text(value: str, flow: bool) -> str:
    """`value` as YAML writes it: plain where it reads back as that very string, else double-quoted (JSON)."""
    plain = re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._/:@-]*", value) is not None and ": " not in value
    if plain and not flow:
        try:
            plain = yaml.safe_load(f"k: {value}") == {"k": value}
        except yaml.YAMLError:
            plain = False
    elif plain:
        try:
            plain = yaml.safe_load(f"[{value}]") == [value]
        except yaml.YAMLError:
            plain = False
    return value if plain else json.dumps(value)


def content_end(node: yaml.Node) -> int:
    """Where `node`'s own text ends: a block collection's end mark lies past the comments and blank lines after it,
    so its last value's end is taken instead."""
    if isinstance(node, yaml.MappingNode) and not node.flow_style and node.value:
        return content_end(node.value[-1][1])
    if isinstance(node, yaml.SequenceNode) and not node.flow_style and node.value:
        return content_end(node.value[-1])
    end: int = node.end_mark.index
    return end


def line_end(text: str, index: int) -> int:
    """The end of the line holding `index` (before its newline), or of the text; a block scalar's end lies at the
    start of the next line, which is its own line's end."""
    if index > 0 and text[index - 1] == "\n":
        return index - 1 - (1 if index > 1 and text[index - 2] == "\r" else 0)
    newline = text.find("\n", index)
    if newline < 0:
        return len(text)
    return newline - (1 if newline > 0 and text[newline - 1] == "\r" else 0)


def check_keys(node: yaml.Node, where: str = "the top level") -> None:
    """No key repeats in any mapping (kustomize refuses them; PyYAML keeps the last)."""
    if isinstance(node, yaml.MappingNode):
        seen: set[str] = set()
        for key, value in node.value:
            label = key.value if isinstance(key, yaml.ScalarNode) else key.start_mark.line
            if isinstance(key, yaml.ScalarNode):
                if key.value in seen:
                    raise Refused("the kustomization repeats a key", f"{key.value!r} twice in {where} (line "
                                  f"{key.start_mark.line + 1})", "keep one of them (kustomize refuses the file)")
                seen.add(key.value)
            check_keys(value, f"{where} > {label}")
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            check_keys(item, f"{where}[{i}]")


def entry_is_ours(node: yaml.Node) -> bool:
    return isinstance(node, yaml.MappingNode) and any(
        isinstance(k, yaml.ScalarNode) and k.value == "name" and isinstance(v, yaml.ScalarNode) and v.value == NAME
        and v.tag == "tag:yaml.org,2002:str" for k, v in node.value)


def pinned_data(data: Any, repo: str, digest: str) -> Any:
    """What the file must read as after the edit: `data` with the t4serve entry set (added where there is none)."""
    ours = {"name": NAME, "newName": repo, "digest": digest}
    if data is None:
        return {"images": [ours]}
    images = data.get("images")
    if images is None:
        return {**data, "images": [ours]}
    found = [i for i, e in enumerate(images) if isinstance(e, dict) and e.get("name") == NAME]
    return {**data, "images": [ours if i in found else e for i, e in enumerate(images)] + ([] if found else [ours])}


def newline(text: str) -> str:
    return "\r\n" if "\r\n" in text else "\n"


def block_fields(inner: str, nl: str, repo: str, digest: str) -> str:
    """The entry's keys from `name:` on: the first where the text already stands, the others at `inner`."""
    return f"name: {NAME}{nl}{inner}newName: {scalar_text(repo, False)}{nl}{inner}digest: {scalar_text(digest, False)}"


def block_entry(dash: str, inner: str, nl: str, repo: str, digest: str) -> str:
    """A new list entry: its dash at `dash`, its keys at `inner` (`-   name:` where the list's entries are so)."""
    gap = " " * max(1, len(inner) - len(dash) - 1)
    return f"{dash}-{gap}" + block_fields(inner, nl, repo, digest)


def flow_entry(repo: str, digest: str) -> str:
    return f"{{name: {NAME}, newName: {scalar_text(repo, True)}, digest: {scalar_text(digest, True)}}}"


def edit(text: str, repo: str, digest: str) -> str:
    """`text` with the t4serve entry set; the only text that changes is that entry (or the list it joins)."""
    try:
        documents = list(yaml.compose_all(text, Loader=yaml.SafeLoader))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise Refused("the kustomization is not YAML kustomize can read", f"{problem}{where}",
                      "fix the YAML (kustomize would refuse it too)") from None
    if len(documents) > 1:
        raise Refused("the kustomization holds several YAML documents", f"{len(documents)} documents",
                      "keep the kustomization alone in its file")
    root = documents[0] if documents else None
    nl = newline(text)
    if root is None:
        return text + ("" if not text or text.endswith("\n") else nl) + "images:" + nl + \
            block_entry("  ", "    ", nl, repo, digest) + nl
    if not isinstance(root, yaml.MappingNode):
        raise Refused("the kustomization is not a YAML mapping", f"a {root.id} at the top level",
                      "a kustomization.yaml (resources:, images:, ...)")
    check_keys(root)
    images = next(((k, v) for k, v in root.value if isinstance(k, yaml.ScalarNode) and k.value == "images"), None)
    if images is None:
        if root.flow_style:
            close = root.end_mark.index - 1
            sep = ", " if root.value else ""
            return text[:close] + f"{sep}images: [{flow_entry(repo, digest)}]" + text[close:]
        at = line_end(text, content_end(root))
        col = " " * root.start_mark.column
        return text[:at] + nl + col + "images:" + nl + block_entry(col + "  ", col + "    ", nl, repo, digest) + \
            text[at:]
    key, value = images
    if value.start_mark.index < key.end_mark.index:
        raise Refused("the kustomization's images is a YAML alias", f"images: *... (line {key.start_mark.line + 1})",
                      "write the images list out under images:")
    if isinstance(value, yaml.ScalarNode) and value.tag == "tag:yaml.org,2002:null":
        if value.start_mark.index == value.end_mark.index:  # `images:` with nothing (or a comment) after it
            at = line_end(text, key.end_mark.index)
            col = " " * (key.start_mark.column + 2)
            return text[:at] + nl + block_entry(col, col + "  ", nl, repo, digest) + text[at:]
        return text[:value.start_mark.index] + f"[{flow_entry(repo, digest)}]" + text[value.end_mark.index:]
    if not isinstance(value, yaml.SequenceNode):
        raise Refused("the kustomization's images is not a list", f"images: a {value.id} (line "
                      f"{key.start_mark.line + 1})", "make images a list of entries (- name: ...)")
    ours = [item for item in value.value if entry_is_ours(item)]
    if len(ours) > 1:
        raise Refused(f"the kustomization has {len(ours)} images entries named {NAME}",
                      f"lines {', '.join(str(e.start_mark.line + 1) for e in ours)}", "keep one")
    for item in value.value:
        if not value.start_mark.index <= item.start_mark.index < value.end_mark.index:
            raise Refused("the kustomization's images list holds a YAML alias", f"line {key.start_mark.line + 1}",
                          "write the entries out")
    if ours:
        entry = ours[0]
        start = entry.start_mark.index
        if entry.flow_style or value.flow_style:
            return text[:start] + flow_entry(repo, digest) + text[entry.end_mark.index:]
        inner = " " * entry.start_mark.column
        body = block_fields(inner, nl, repo, digest)  # from where the entry's first key stood
        # To the end of its last line: a comment there spoke of the old value, as comments inside the entry did.
        return text[:start] + body + text[line_end(text, content_end(entry)):]
    if value.flow_style:
        close = value.end_mark.index - 1
        sep = ", " if value.value else ""
        return text[:close] + sep + flow_entry(repo, digest) + text[close:]
    at = line_end(text, content_end(value))
    dash = " " * value.start_mark.column
    first = value.value[0]
    inner = " " * (first.start_mark.column if isinstance(first, yaml.MappingNode) and not first.flow_style
                   else value.start_mark.column + 2)
    return text[:at] + nl + block_entry(dash, inner, nl, repo, digest) + text[at:]


def canonical(data: Any) -> str:
    return json.dumps(data, sort_keys=True, default=repr)


def pinned(text: str, repo: str, digest: str) -> str:
    """The edited text, checked: it parses, repeats no key, and reads as the original with only the entry set."""
    bom = "\ufeff" if text.startswith("\ufeff") else ""
    body = text[len(bom):]
    new = edit(body, repo, digest)
    expected = pinned_data(yaml.safe_load(body), repo, digest)
    try:
        root = yaml.compose(new, Loader=yaml.SafeLoader)
        if root is not None:
            check_keys(root)
        actual = yaml.safe_load(new)
    except (yaml.YAMLError, Refused) as exc:
        raise Refused("the edit would not parse (a bug of scripts/publish)", str(exc).splitlines()[0],
                      "set the image by hand: images: [{name: t4serve, newName: REPO, digest: DIGEST}]",
                      code=70) from None
    if canonical(actual) != canonical(expected):
        raise Refused("the edit would change more than the t4serve entry (a bug of scripts/publish)",
                      canonical(actual)[:300], "set the image by hand: images: [{name: t4serve, newName: REPO, "
                      "digest: DIGEST}]", code=70)
    return bom + new


def write_beside(real: str, text: str) -> None:
    """`text` into a temporary file beside `real` (its mode, and its owner where this user may set it), then renamed
    over it: a reader sees the old file or the new one, and a symbolic link to `real` stays a link."""
    old = os.stat(real)
    fd, tmp = tempfile.mkstemp(prefix=".kustomization.", dir=os.path.dirname(real))
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as f:
            f.write(text)
            f.flush()
            os.fchmod(f.fileno(), stat.S_IMODE(old.st_mode))
            if (old.st_uid, old.st_gid) != (os.getuid(), os.getgid()):
                with contextlib.suppress(PermissionError):  # another's file: this user's, as the edit makes it
                    os.fchown(f.fileno(), old.st_uid, old.st_gid)
            os.fsync(f.fileno())
        os.replace(tmp, real)
    except BaseException:
        os.unlink(tmp)
        raise


def fail(exc: Refused) -> NoReturn:
    print(f"scripts/publish: {exc.what}\n  found: {exc.found}\n  fix: {exc.fix}", file=sys.stderr)
    sys.exit(exc.code)


def main(argv: list[str]) -> int:
    check_only = argv[:1] == ["--check"]
    args = argv[1:] if check_only else argv
    if len(args) != 3 or not DIGEST.fullmatch(args[2]):
        print("usage: pin_kustomization.py [--check] FILE REPOSITORY sha256:DIGEST", file=sys.stderr)
        return 2
    path, repo, digest = args
    try:
        real, text = read_text(path)
        new = pinned(text, repo, digest)
        if not check_only and new != text:
            try:
                write_beside(real, new)
            except OSError as exc:
                raise Refused("the kustomization cannot be rewritten", f"{exc.filename or real}: "
                              f"{exc.strerror or exc}", "make the file and its folder writable") from None
    except Refused as exc:
        fail(exc)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
