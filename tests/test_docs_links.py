"""Relative links in README.md and docs/ point at files (and headings) that exist."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]

FENCE = re.compile(r"^(```|~~~).*?^\1", re.M | re.S)
CODE_SPAN = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"!?\[[^\]\n]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.M)


def _prose(text: str) -> str:
    """The text without fenced code blocks and code spans (links there are not links)."""
    return CODE_SPAN.sub("", FENCE.sub("", text))


def _anchors(path: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens,
    repeats numbered -1, -2, ..."""
    seen: dict[str, int] = {}
    out = set()
    for title in HEADING.findall(FENCE.sub("", path.read_text(encoding="utf-8"))):
        slug = re.sub(r"[^\w\- ]", "", title.strip().lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def _broken(doc: Path) -> list[str]:
    broken = []
    for target in LINK.findall(_prose(doc.read_text(encoding="utf-8"))):
        if re.match(r"[a-z][a-z0-9+.-]*:", target, re.I):  # http:, https:, mailto:, ...
            continue
        name, _, anchor = target.partition("#")
        dest = (doc.parent / name).resolve() if name else doc
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            where = dest.relative_to(ROOT) if dest.is_relative_to(ROOT) else dest.name
            broken.append(f"{target}: no heading #{anchor} in {where}")
    return broken


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(doc):
    assert _broken(doc) == []


def test_the_checker_sees_a_broken_link_and_a_missing_heading(tmp_path):
    (tmp_path / "other.md").write_text("# Title\n\n## A `code` heading, here\n")
    doc = tmp_path / "doc.md"
    doc.write_text(
        "[ok](other.md) [ok](other.md#a-code-heading-here) [ok](#local) [web](https://x.y/z)\n"
        "`[not a link](gone.md)`\n```\n[not a link](gone.md)\n```\n"
        "## Local\n[bad](gone.md) ![bad](pic.png) [bad](other.md#nowhere)\n")
    assert _broken(doc) == [
        "gone.md: no such file",
        "pic.png: no such file",
        "other.md#nowhere: no heading #nowhere in other.md",
    ]
