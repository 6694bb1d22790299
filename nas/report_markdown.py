"""The Markdown of a results folder (a benchmark's README) as data for the report's templates, never as HTML.

A small subset, the one the benchmarks' READMEs use: headings, fenced code, pipe tables, lists, paragraphs, and
inline code, links, images and bold.  :func:`blocks` returns plain lists and dicts; the page's Jinja2 template
(``blocks.html``) turns them into HTML with autoescaping on, so a file's ``<script>`` is text on the page.  Links
keep only ``http(s)://`` targets and files of the folder (``link``); images only files of the folder (``image``:
embedded); anything else is shown as its text.

Why not a Markdown library: Python-Markdown (installed with the docs) passes raw HTML and ``javascript:`` links
through unless a sanitizer follows it, and took 269 s on a 50 KB line of ``[`` (its link patterns backtrack).
Every pattern here is bounded, so the 100 KB the page reads of a file parse in well under a second.
"""

from __future__ import annotations

import re
from typing import Any, Callable

# inline code, an image, a link, bold; each part bounded (no pattern can backtrack over the whole text)
_INLINE = re.compile(r"`([^`\n]{1,1000})`|!\[([^\]\n]{0,300})\]\(([^)\s]{1,1000})\)|\[([^\]\n]{1,300})\]\(([^)\s]{1,1000})\)"
                     r"|\*\*([^*\n]{1,1000})\*\*")
_WEB = re.compile(r"https?://[^\s]+\Z")
_ITEM = re.compile(r"\s{0,12}([-*]|\d{1,9}\.)\s+(.*)")
_HEADING = re.compile(r"(#{1,6})\s+(.*)")
_RULE = re.compile(r":?-{2,}:?")

Span = dict[str, Any]
Block = dict[str, Any]


def inline(text: str, image: Callable[[str], Any], link: Callable[[str], str | None], bold: bool = True) -> list[Span]:
    """The spans of one line: ``{"t": "text" | "code", "text"}``, ``{"t": "strong", "spans"}``,
    ``{"t": "link", "href", "spans"}``, ``{"t": "figure", "figure"}``.  ``image(ref)``: an embeddable figure of the
    folder or None; ``link(ref)``: the page's anchor (``#section``) of a file of the folder, or None."""
    out: list[Span] = []
    pos = 0
    for m in _INLINE.finditer(text):
        if m.start() > pos:
            out.append({"t": "text", "text": text[pos:m.start()]})
        code, alt, src, label, href, strong = m.groups()
        if code is not None:
            out.append({"t": "code", "text": code})
        elif src is not None:
            figure = image(src)
            out.append({"t": "figure", "figure": figure} if figure is not None else {"t": "text", "text": alt or src})
        elif href is not None:
            spans = inline(label, image, link, bold)
            target = href if _WEB.match(href) else link(href)
            out.append({"t": "link", "href": target, "spans": spans} if target else {"t": "span", "spans": spans})
        elif bold:
            out.append({"t": "strong", "spans": inline(strong, image, link, bold=False)})
        else:
            out.append({"t": "text", "text": m.group(0)})
        pos = m.end()
    if pos < len(text):
        out.append({"t": "text", "text": text[pos:]})
    return out


def blocks(text: str, image: Callable[[str], Any], link: Callable[[str], str | None]) -> list[Block]:
    """The blocks of ``text``: ``{"t": "h", "level", "spans"}`` (levels 3-6: under the file's own section heading),
    ``{"t": "pre", "text"}``, ``{"t": "table", "head", "rows"}`` (cells are span lists), ``{"t": "list", "ordered",
    "items"}``, ``{"t": "p", "spans"}``."""
    lines = text.splitlines()
    out: list[Block] = []
    para: list[str] = []

    def span(s: str) -> list[Span]:
        return inline(s, image, link)

    def flush() -> None:
        if para:
            out.append({"t": "p", "spans": span(" ".join(s.strip() for s in para))})
            para.clear()

    i = 0
    while i < len(lines):
        line = lines[i]
        if line.lstrip().startswith("```"):
            flush()
            j = i + 1
            while j < len(lines) and not lines[j].lstrip().startswith("```"):
                j += 1
            out.append({"t": "pre", "text": "\n".join(lines[i + 1:j])})
            i = j + 1
            continue
        heading = _HEADING.match(line)
        if heading:
            flush()
            out.append({"t": "h", "level": min(len(heading.group(1)) + 2, 6), "spans": span(heading.group(2).strip())})
        elif line.lstrip().startswith("|"):
            flush()
            block = []
            while i < len(lines) and lines[i].lstrip().startswith("|"):
                block.append(lines[i].strip())
                i += 1
            cells = [[c.strip() for c in row.strip("|").split("|")] for row in block]
            body = [r for r in cells[1:] if not all(_RULE.fullmatch(c) for c in r if c)]
            out.append({"t": "table", "head": [span(c) for c in cells[0]], "rows": [[span(c) for c in r] for r in body]})
            continue
        elif _ITEM.match(line):
            flush()
            ordered = bool(re.match(r"\s*\d", line))
            items: list[list[str]] = []  # each item's lines, joined at the end (no quadratic concatenation)
            while i < len(lines) and lines[i].strip():
                m = _ITEM.match(lines[i])
                if m:
                    items.append([m.group(2)])
                elif items:
                    items[-1].append(lines[i].strip())
                i += 1
            out.append({"t": "list", "ordered": ordered, "items": [span(" ".join(t)) for t in items]})
            continue
        elif not line.strip():
            flush()
        else:
            para.append(line)
        i += 1
    flush()
    return out
