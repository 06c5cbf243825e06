"""Every relative link in the README and docs/ leads somewhere: the file exists in the repository, and an anchor names
a heading of the Markdown file it points into (GitHub's rule for heading ids). Links inside code are not links."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCS = sorted([REPO / "README.md", *(REPO / "docs").rglob("*.md")])
FENCE = re.compile(r"^(```|~~~).*?^\1", re.M | re.S)
CODE = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"!?\[[^\]\n]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.M)


def prose(text: str) -> str:
    return CODE.sub("", FENCE.sub("", text))


def heading_ids(path: Path) -> set[str]:
    """GitHub's ids: lower case, punctuation other than hyphens and underscores dropped, spaces to hyphens; a repeat
    gets -1, -2, ..."""
    ids: set[str] = set()
    for title in HEADING.findall(FENCE.sub("", path.read_text())):
        slug = re.sub(r"[^\w\- ]", "", title.strip().lower()).replace(" ", "-")
        candidate, n = slug, 0
        while candidate in ids:
            n += 1
            candidate = f"{slug}-{n}"
        ids.add(candidate)
    return ids


def broken_links(doc: Path, root: Path = REPO) -> list[str]:
    broken = []
    for target in LINK.findall(prose(doc.read_text())):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        dest = (doc.parent / path).resolve() if path else doc
        if not dest.is_relative_to(root) or not dest.exists():
            broken.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in heading_ids(dest):
            broken.append(f"{target}: no heading with that id in {dest.relative_to(root)}")
    return broken


@pytest.mark.parametrize("doc", DOCS, ids=[str(d.relative_to(REPO)) for d in DOCS])
def test_every_relative_link_resolves(doc: Path) -> None:
    assert broken_links(doc) == []


def test_the_checker_finds_a_broken_file_and_a_broken_anchor(tmp_path: Path) -> None:
    doc = tmp_path / "a.md"
    (tmp_path / "b.md").write_text("# Real heading\n\n## Real heading\n")
    doc.write_text("[ok](b.md#real-heading-1) [gone](c.md) [bad](b.md#fake) `[code](c.md)`\n```\n[x](c.md)\n```\n")
    assert broken_links(doc, tmp_path) == ["c.md: no such file", "b.md#fake: no heading with that id in b.md"]
