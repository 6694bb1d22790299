"""MkDocs hooks (mkdocs.yml ``hooks:``): the project files at the repository root join the site.

README.md, CHANGELOG.md and CONTRIBUTING.md become pages under ``project/``; LICENSE and CITATION.cff are
copied there as they are.  A link that leaves ``docs/`` for one of them (``../README.md`` from
docs/index.md) is pointed at its copy, and the root files' own links into ``docs/`` (``docs/workflow.md``
from README.md) at the pages.  A link to any other file of the repository (a script, a space YAML) becomes
a plain code span naming the path, and so does a link to a folder: the site holds the manuals, not the
sources.  In the rendered docstrings, Sphinx's roles (``:func:`supernet.extract```, ``:class:`~x.Y```) become
cross-references to the API pages where the name is known there, plain code where not.  Nothing else is changed.
"""

from __future__ import annotations

import posixpath
import re
from pathlib import Path

from mkdocs.structure.files import File

ROOT = Path(__file__).resolve().parents[1]
PAGES = ("README.md", "CHANGELOG.md", "CONTRIBUTING.md")  # rendered as pages
COPIES = ("LICENSE", "CITATION.cff")  # copied as they are
PROJECT = "project"
ROLE = re.compile(r":(?:py:)?(?:func|class|meth|mod|attr|data|exc|obj|const):<code>(~?)\.?([^<\s]+?)(?:\(\))?</code>")
LINK = re.compile(r"(?<!!)\[([^\]\n]*)\]\(([^)\s#]*)(#[^)\s]*)?\)")


def _target(page_repo_path: str, link: str) -> str | None:
    """The repository path a relative link of the page at ``page_repo_path`` points to (None: not a relative link)."""
    if not link or "://" in link or link.startswith(("/", "mailto:")):
        return None
    return posixpath.normpath(posixpath.join(posixpath.dirname(page_repo_path), link))


def rewrite(markdown: str, page_repo_path: str, page_site_path: str) -> str:
    """``markdown``'s links, read from ``page_repo_path`` in the repository, for the page at ``page_site_path``."""

    def fix(m: re.Match) -> str:
        text, link, anchor = m.group(1), m.group(2), m.group(3) or ""
        target = _target(page_repo_path, link)
        if target is not None and (ROOT / target).is_dir():  # a folder: a listing on GitHub, nothing on the site
            return f"{text} (`{target}/` in the repository)" if text.strip("`/") != posixpath.basename(target) else f"`{target}/`"
        if target is None or target.startswith("docs/"):
            if target is not None and not page_repo_path.startswith("docs/"):  # a root file's link into docs/
                return f"[{text}]({posixpath.relpath(target[5:], posixpath.dirname(page_site_path) or '.')}{anchor})"
            return m.group(0)
        if target in PAGES or target in COPIES:
            return f"[{text}]({posixpath.relpath(f'{PROJECT}/{target}', posixpath.dirname(page_site_path) or '.')}{anchor})"
        return f"{text} (`{target}` in the repository)" if text.strip("`") != target else f"`{target}`"

    return LINK.sub(fix, markdown)


def on_files(files, config):
    for name in PAGES + COPIES:
        files.append(File.generated(config, f"{PROJECT}/{name}", abs_src_path=str(ROOT / name)))
    return files


def on_page_markdown(markdown, page, config, files):
    src = page.file.src_uri
    repo_path = src[len(PROJECT) + 1:] if src.startswith(f"{PROJECT}/") else f"docs/{src}"
    return rewrite(markdown, repo_path, src)


def on_page_content(html, page, config, files):
    def cross_reference(m: re.Match) -> str:
        target = m.group(2)
        shown = target.rsplit(".", 1)[-1] if m.group(1) else target
        return f'<autoref identifier="{target}" optional><code>{shown}</code></autoref>'  # resolved by mkdocs-autorefs

    return ROLE.sub(cross_reference, html)
