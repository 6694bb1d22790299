"""The documentation holds together: every relative link in README.md and docs/**/*.md points to a file or folder
that exists (and to a heading that exists, for a ``#anchor`` into a Markdown file), and the README stays an entry
point of at most 300 lines (CONTRIBUTING.md, "Documentation")."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README_MAX_LINES = 300

FENCE = re.compile(r"^\s*(```|~~~)")
INLINE_CODE = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"\[[^\]\n]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")  # [text](target) and ![alt](target)
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")


def markdown_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def prose_lines(path: Path) -> list[tuple[int, str]]:
    """(line number, text) of the lines outside fenced code blocks."""
    out, fenced = [], False
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            out.append((number, line))
    return out


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading keeps its text
    text = re.sub(r"<[^>]+>", "", text).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for _, line in prose_lines(path):
        m = HEADING.match(line)
        if not m:
            continue
        base = slug(m.group(2))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def links(path: Path) -> list[tuple[int, str]]:
    return [(number, m.group(1)) for number, line in prose_lines(path) for m in LINK.finditer(INLINE_CODE.sub("", line))]


def test_slug_follows_github():
    assert slug("Measuring a board (Raspberry Pi 4/5, Jetson CPU)") == "measuring-a-board-raspberry-pi-45-jetson-cpu"
    assert slug("The task seam (`supernet/task.py`)") == "the-task-seam-supernettaskpy"
    assert slug("HAT's table") == "hats-table"


def test_the_checker_sees_links_and_skips_code(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# Top\n\n[a](other.md#x) `[b](not-a-link.md)`\n\n```\n[c](in-code.md)\n```\n", encoding="utf-8")
    assert links(page) == [(3, "other.md#x")]
    assert anchors(page) == {"top"}


@pytest.mark.parametrize("path", markdown_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(path: Path):
    broken = []
    for number, target in links(path):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):  # http:, https:, mailto: ...: not checked here
            continue
        file_part, _, anchor = target.partition("#")
        dest = (path.parent / file_part).resolve() if file_part else path
        where = f"{path.relative_to(ROOT)}:{number}: {target}"
        if not dest.exists():
            broken.append(f"{where}: no such file or folder")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{where}: no heading with anchor #{anchor} in {dest.relative_to(ROOT)}")
    assert not broken, "broken links:\n" + "\n".join(broken)


def test_readme_is_an_entry_point():
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines; at most {README_MAX_LINES} (move detail to docs/)"
