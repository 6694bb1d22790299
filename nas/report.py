"""``nas report``: one self-contained HTML page that shows a run folder, to open or share.

A folder is recognised by what it holds (:func:`detect`):

* ``demo``: a ``nas demo`` run (``summary.json`` beside ``search/``): the verdicts with their noise, the
  Pareto front, the predictor against the measurements, the verification on the device, the comparison
  with the uniform baselines, the model card;
* ``search``: a ``nas search --out`` folder (``search.json``): its budgets, front and verification;
* ``model``: a ``nas export`` folder (``model_card.json``): the card;
* ``predictor``: a ``nas fit-predictor`` folder (``predictor.json``): its figure and its agreement with the measurements;
* ``files``: any other folder of results (``docs/benchmarks/<name>/``): its Markdown, figures, tables and
  JSON, one section per file.

The page needs nothing at view time: figures are embedded as ``data:`` URIs, the style is inline, there
is no script, and a Content-Security-Policy forbids loading anything else (a browser refuses any
network fetch and says so on its console).  Every text taken from the folder is escaped
(:func:`html.escape`): a file's contents are data, never markup.
"""

from __future__ import annotations

import base64
import csv
import html
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

import numpy as np

from search_spaces import UserError

PAGE = "report.html"
MAX_ROWS = 200  # rows of a table shown; the rest counted
MAX_TEXT = 100_000  # characters of a text file shown
MAX_IMAGE = 8 * 1024 * 1024  # bytes of one embedded figure
CSP = "default-src 'none'; img-src data:; style-src 'unsafe-inline'"

STYLE = """
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; color: #1d2430; background: #fff;
       max-width: 1180px; margin: 0 auto; padding: 0 18px 40px; }
h1 { font-size: 24px; margin: 22px 0 4px; } h2 { font-size: 19px; margin: 30px 0 8px; border-bottom: 1px solid #d8dde6; }
h3 { font-size: 16px; margin: 18px 0 6px; } h4, h5, h6 { font-size: 14px; margin: 14px 0 4px; }
.meta { color: #5a6475; margin: 0 0 10px; } nav a { margin-right: 12px; }
table { border-collapse: collapse; margin: 6px 0 12px; font-size: 13px; }
th, td { border: 1px solid #d8dde6; padding: 3px 7px; text-align: left; vertical-align: top; }
th { background: #f2f4f8; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
.wide { overflow-x: auto; max-width: 100%; }
pre { background: #f6f8fa; border: 1px solid #e1e5eb; padding: 8px 10px; overflow-x: auto; font-size: 12.5px; }
code { background: #f2f4f8; padding: 0 3px; }
figure { margin: 8px 0 14px; } figure img { max-width: 100%; border: 1px solid #e1e5eb; }
figcaption { color: #5a6475; font-size: 12.5px; }
.verdicts li { margin: 3px 0; } .ok { color: #17663a; font-weight: 600; } .bad { color: #a3231b; font-weight: 600; }
.note { color: #5a6475; font-style: italic; } summary { cursor: pointer; color: #2a4d8f; margin: 4px 0; }
"""


def esc(value: Any) -> str:
    return html.escape(str(value), quote=True)


# --------------------------------------------------------------------------- what the folder is


def detect(folder: str | Path) -> str:
    """``demo``, ``search``, ``model``, ``predictor`` or ``files`` (the module's docstring); a folder with none of these is
    refused."""
    folder = Path(folder)
    if not folder.is_dir():
        raise UserError(f"{folder}: no such folder (expected a run folder: a demo, a search or a benchmark's)")
    if (folder / "summary.json").is_file() and (folder / "search").is_dir():
        return "demo"
    if (folder / "search.json").is_file():
        return "search"
    if (folder / "model_card.json").is_file():
        return "model"
    if (folder / "predictor.json").is_file():
        return "predictor"
    if any(p.suffix.lower() in SHOWN for p in _files(folder)):
        return "files"
    raise UserError(f"{folder}: not a run folder: no summary.json (nas demo), search.json (nas search), "
                    f"model_card.json (nas export), nor any {', '.join(sorted(SHOWN))} file to show")


def _files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.is_file() and not p.name.startswith(".") and p.suffix.lower() != ".html")


# --------------------------------------------------------------------------- the page


@dataclass
class Page:
    """The sections of a page, in order, each ``(id, title, html)``; ``shown`` the files already on it."""

    title: str
    meta: list[str] = field(default_factory=list)
    sections: list[tuple[str, str, str]] = field(default_factory=list)
    shown: set[Path] = field(default_factory=set)

    def add(self, title: str, body: str) -> None:
        anchor = re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-") or "section"
        taken = {a for a, _, _ in self.sections}
        n, base = 2, anchor
        while anchor in taken:
            anchor, n = f"{base}-{n}", n + 1
        self.sections.append((anchor, title, body))

    def html(self) -> str:
        from search_spaces.version import __version__

        nav = " ".join(f'<a href="#{esc(a)}">{esc(t)}</a>' for a, t, _ in self.sections)
        parts = [
            "<!doctype html>",
            '<html lang="en"><head><meta charset="utf-8">',
            f'<meta http-equiv="Content-Security-Policy" content="{esc(CSP)}">',
            '<meta name="viewport" content="width=device-width, initial-scale=1">',
            f"<title>{esc(self.title)}</title><style>{STYLE}</style></head><body>",
            f"<header><h1>{esc(self.title)}</h1>",
            *(f'<p class="meta">{m}</p>' for m in self.meta),
            f'<p class="meta">written by nas {esc(__version__)} (<code>nas report</code>); everything on this page is in '
            "this one file</p>",
            f"<nav>{nav}</nav></header>",
        ]
        for anchor, title, body in self.sections:
            parts.append(f'<section id="{esc(anchor)}"><h2>{esc(title)}</h2>\n{body}\n</section>')
        parts.append("</body></html>\n")
        return "\n".join(parts)


def build(folder: str | Path) -> str:
    """The page of ``folder`` (:func:`detect` says which kind), as HTML text."""
    folder = Path(folder)
    kind = detect(folder)
    page = Page(f"{folder.resolve().name}: {KIND_TITLES[kind]}")
    page.meta.append(f"folder <code>{esc(folder)}</code>")
    {"demo": _demo, "search": _search, "model": _model, "predictor": predictor_section, "files": _folder}[kind](folder, page)
    if kind != "files":
        _folder(folder, page, only_new=True)  # what else lies at the top of the folder
    return page.html()


def write_report(folder: str | Path, out: str | Path | None = None) -> Path:
    """Write the page of ``folder`` to ``out`` (default ``folder/report.html``); returns its path."""
    from supernet.files import atomic_write

    text = build(folder)
    path = Path(out) if out is not None else Path(folder) / PAGE
    atomic_write(path, text)
    return path


KIND_TITLES = {"demo": "nas demo run", "search": "nas search", "model": "exported model", "predictor": "latency predictor",
               "files": "results"}


# --------------------------------------------------------------------------- reading files (never trusting them)


def _read_json(path: Path) -> Any:
    """The JSON of ``path``, or None when it is missing; a file that is not JSON is refused naming it."""
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8", errors="replace"))
    except json.JSONDecodeError as e:
        raise UserError(f"{path}: not valid JSON ({e})") from None


def _read_csv(path: Path) -> tuple[list[str], list[list[str]]]:
    with open(path, newline="", encoding="utf-8", errors="replace") as f:
        rows = list(csv.reader(f))
    return (rows[0], rows[1:]) if rows else ([], [])


def _num(text: str) -> float | None:
    try:
        return float(text)
    except (TypeError, ValueError):
        return None


def ms(value: Any) -> str:
    """Milliseconds as the figures give them (3 decimals)."""
    return f"{value:.3f} ms" if isinstance(value, (int, float)) and math.isfinite(value) else f"{fmt(value)} ms"


def bpb(value: Any) -> str:
    """A held-out score as the tables give it (4 decimals)."""
    return f"{value:.4f}" if isinstance(value, (int, float)) and math.isfinite(value) else fmt(value)


def fmt(value: Any) -> str:
    """A number as a reader wants it (6 significant digits, thousands grouped), anything else as text."""
    if isinstance(value, bool) or value is None:
        return "null" if value is None else str(value).lower()
    if isinstance(value, int):
        return f"{value:,}" if abs(value) >= 10_000 else str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            return str(value)
        return f"{value:,.0f}" if abs(value) >= 1e6 else f"{value:.6g}"
    return str(value)


# --------------------------------------------------------------------------- HTML pieces


def image(path: Path, caption: str | None = None) -> str:
    """A PNG (or JPEG, SVG) embedded as a data URI, with a caption."""
    mime = {".png": "image/png", ".jpg": "image/jpeg", ".jpeg": "image/jpeg", ".svg": "image/svg+xml"}[path.suffix.lower()]
    size = path.stat().st_size
    if size > MAX_IMAGE:
        return (f'<p class="note">{esc(path.name)}: {size:,} bytes, over the {MAX_IMAGE:,}-byte limit of one figure; '
                "not embedded</p>")
    data = base64.b64encode(path.read_bytes()).decode("ascii")
    cap = esc(caption if caption is not None else path.name)
    return f'<figure><img src="data:{mime};base64,{data}" alt="{esc(path.name)}"><figcaption>{cap}</figcaption></figure>'


def table(header: list[str], rows: Iterable[list[Any]], *, total: int | None = None) -> str:
    """An HTML table; numbers right-aligned.  ``total``: the rows there are, when ``rows`` shows fewer."""
    rows = list(rows)
    out = ['<div class="wide"><table><thead><tr>', *(f"<th>{esc(h)}</th>" for h in header), "</tr></thead><tbody>"]
    for row in rows:
        out.append("<tr>")
        for cell in row:
            text = cell if isinstance(cell, str) else fmt(cell)
            numeric = isinstance(cell, (int, float)) and not isinstance(cell, bool) or _num(text) is not None
            out.append(f'<td class="num">{esc(text)}</td>' if numeric else f"<td>{esc(text)}</td>")
        out.append("</tr>")
    out.append("</tbody></table></div>")
    if total is not None and total > len(rows):
        out.append(f'<p class="note">{len(rows)} of {total:,} rows shown</p>')
    return "".join(out)


def csv_table(path: Path, *, keep=None, columns: list[str] | None = None) -> str:
    """``path`` as a table (the first :data:`MAX_ROWS` rows; ``keep(row dict)`` filters, ``columns`` picks)."""
    header, rows = _read_csv(path)
    if not header:
        return f'<p class="note">{esc(path.name)}: empty</p>'
    dicts = [dict(zip(header, r)) for r in rows]
    if keep is not None:
        dicts = [d for d in dicts if keep(d)]
    cols = [c for c in (columns or header) if c in header]
    return table(cols, ([_short(d.get(c, "")) for c in cols] for d in dicts[:MAX_ROWS]), total=len(dicts))


def _short(text: str) -> str:
    """A CSV cell: a long float cut to 6 significant digits (the file keeps them all)."""
    v = _num(text)
    if v is not None and re.fullmatch(r"-?\d+\.\d{7,}(e[-+]?\d+)?", text.strip()):
        return f"{v:.6g}"
    return text


def value_html(value: Any, depth: int = 0) -> str:
    """A JSON value: objects as two-column tables, lists of objects as tables, long texts preformatted."""
    if isinstance(value, dict):
        if not value:
            return "{}"
        if depth >= 4:
            return f"<pre>{esc(json.dumps(value, indent=1)[:MAX_TEXT])}</pre>"
        rows = "".join(f"<tr><th>{esc(k)}</th><td>{value_html(v, depth + 1)}</td></tr>" for k, v in value.items())
        return f'<div class="wide"><table><tbody>{rows}</tbody></table></div>'
    if isinstance(value, list):
        if value and all(isinstance(v, dict) for v in value) and depth < 4:
            cols = list(dict.fromkeys(k for v in value for k in v))
            if all(not isinstance(v.get(c), (dict, list)) for v in value for c in cols):
                return table(cols, ([v.get(c, "") for c in cols] for v in value[:MAX_ROWS]), total=len(value))
            return "".join(value_html(v, depth + 1) for v in value[:MAX_ROWS])
        if all(not isinstance(v, (dict, list)) for v in value):
            shown = ", ".join(fmt(v) for v in value[:60]) + (f", ... ({len(value)} in all)" if len(value) > 60 else "")
            return esc(f"[{shown}]")
        return f"<pre>{esc(json.dumps(value, indent=1)[:MAX_TEXT])}</pre>"
    if isinstance(value, str) and ("\n" in value or len(value) > 200):
        return f"<pre>{esc(value[:MAX_TEXT])}</pre>"
    return esc(fmt(value))


def text_block(path: Path) -> str:
    text = path.read_text(encoding="utf-8", errors="replace")
    cut = f'<p class="note">the first {MAX_TEXT:,} of {len(text):,} characters</p>' if len(text) > MAX_TEXT else ""
    return f"<pre>{esc(text[:MAX_TEXT])}</pre>{cut}"


# --------------------------------------------------------------------------- Markdown, simply

_INLINE = re.compile(r"`([^`]+)`|!\[([^\]]*)\]\(([^)\s]+)\)|\[([^\]]+)\]\(([^)\s]+)\)|\*\*([^*]+)\*\*")


def _inline(text: str, folder: Path | None) -> str:
    """Code spans, images (a file of the folder: embedded; else its alt text), links (web links kept; a file of the
    folder: a link to its section), bold; everything else escaped."""
    out, pos = [], 0
    for m in _INLINE.finditer(text):
        out.append(esc(text[pos:m.start()]))
        code, alt, src, label, href, bold = m.groups()
        if code is not None:
            out.append(f"<code>{esc(code)}</code>")
        elif src is not None:
            local = _local(folder, src)
            out.append(image(local, alt or local.name) if local and local.suffix.lower() in IMAGES else esc(alt or src))
        elif href is not None:
            out.append(_link(label, href, folder))
        else:
            out.append(f"<strong>{_inline(bold, folder)}</strong>")
        pos = m.end()
    out.append(esc(text[pos:]))
    return "".join(out)


def _local(folder: Path | None, ref: str) -> Path | None:
    """A file directly in ``folder`` that ``ref`` names (no other path is followed)."""
    if folder is None or "/" in ref or "\\" in ref or ref.startswith("."):
        return None
    path = folder / ref.split("#", 1)[0]
    return path if path.is_file() else None


def _link(label: str, href: str, folder: Path | None) -> str:
    text = _inline(label, folder)
    if re.match(r"https?://", href):
        return f'<a href="{esc(href)}">{text}</a>'
    local = _local(folder, href)
    if local is not None and local.suffix.lower() in SHOWN:
        return f'<a href="#{esc(_file_anchor(local))}">{text}</a>'
    return text


def _file_anchor(path: Path) -> str:
    return re.sub(r"[^a-z0-9]+", "-", path.name.lower()).strip("-")


def markdown(text: str, folder: Path | None = None) -> str:
    """A small Markdown subset: headings, fenced code, pipe tables, lists, paragraphs, inline code / links / bold."""
    lines = text.splitlines()
    out: list[str] = []
    para: list[str] = []
    i = 0

    def flush() -> None:
        if para:
            out.append(f"<p>{_inline(' '.join(s.strip() for s in para), folder)}</p>")
            para.clear()

    while i < len(lines):
        line = lines[i]
        if line.lstrip().startswith("```"):
            flush()
            j = i + 1
            while j < len(lines) and not lines[j].lstrip().startswith("```"):
                j += 1
            out.append(f"<pre>{esc(chr(10).join(lines[i + 1:j]))}</pre>")
            i = j + 1
            continue
        heading = re.match(r"(#{1,6})\s+(.*)", line)
        if heading:
            flush()
            level = min(len(heading.group(1)) + 2, 6)  # under the file's own section heading
            out.append(f"<h{level}>{_inline(heading.group(2).strip(), folder)}</h{level}>")
        elif line.lstrip().startswith("|"):
            flush()
            block = []
            while i < len(lines) and lines[i].lstrip().startswith("|"):
                block.append(lines[i].strip())
                i += 1
            cells = [[c.strip() for c in row.strip("|").split("|")] for row in block]
            body = [r for r in cells[1:] if not all(re.fullmatch(r":?-{2,}:?", c) for c in r if c)]
            out.append('<div class="wide"><table><thead><tr>'
                       + "".join(f"<th>{_inline(c, folder)}</th>" for c in cells[0]) + "</tr></thead><tbody>"
                       + "".join("<tr>" + "".join(f"<td>{_inline(c, folder)}</td>" for c in r) + "</tr>" for r in body)
                       + "</tbody></table></div>")
            continue
        elif re.match(r"\s*([-*]|\d+\.)\s+", line):
            flush()
            ordered = bool(re.match(r"\s*\d+\.", line))
            items: list[str] = []
            while i < len(lines) and lines[i].strip():
                m = re.match(r"\s*([-*]|\d+\.)\s+(.*)", lines[i])
                if m:
                    items.append(m.group(2))
                elif items:
                    items[-1] += " " + lines[i].strip()
                i += 1
            tag = "ol" if ordered else "ul"
            out.append(f"<{tag}>" + "".join(f"<li>{_inline(t, folder)}</li>" for t in items) + f"</{tag}>")
            continue
        elif not line.strip():
            flush()
        else:
            para.append(line)
        i += 1
    flush()
    return "\n".join(out)


# --------------------------------------------------------------------------- any folder: one section per file

IMAGES = {".png", ".jpg", ".jpeg", ".svg"}
SHOWN = {".md", ".json", ".csv", ".txt", ".log", *IMAGES}


def file_html(path: Path, folder: Path) -> str:
    suffix = path.suffix.lower()
    if suffix in IMAGES:
        return image(path)
    if suffix == ".md":
        return markdown(path.read_text(encoding="utf-8", errors="replace")[:MAX_TEXT], folder)
    if suffix == ".csv":
        return csv_table(path)
    if suffix == ".json":
        try:
            return value_html(_read_json(path))
        except UserError as e:
            return f'<p class="note">{esc(e)}</p>{text_block(path)}'
    return text_block(path)


def _folder(folder: Path, page: Page, only_new: bool = False) -> None:
    """A section per file of ``folder`` (README first, then Markdown, figures, tables, JSON, text) not yet on the page."""
    order = {".md": 1, ".png": 2, ".jpg": 2, ".jpeg": 2, ".svg": 2, ".csv": 3, ".json": 4, ".txt": 5, ".log": 5}
    files = [p for p in _files(folder) if p.suffix.lower() in SHOWN and p not in page.shown]
    files.sort(key=lambda p: (p.name.lower() != "readme.md", order[p.suffix.lower()], p.name))
    if only_new and files:
        page.add("Other files", "".join(f'<h3 id="{esc(_file_anchor(p))}">{esc(p.name)}</h3>{file_html(p, folder)}'
                                        for p in files))
        return
    for p in files:
        page.sections.append((_file_anchor(p), p.name, file_html(p, folder)))
        page.shown.add(p)


# --------------------------------------------------------------------------- a search


def search_sections(folder: Path, page: Page, heading: str = "Search") -> None:
    """The budgets and their best subnets, the Pareto figure(s), the front's rows, the verification."""
    s = _read_json(folder / "search.json") or {}
    page.shown |= {folder / "search.json"}
    config = s.get("config", {})
    from nas.search.pareto import loss_label

    scored = s.get("figure", {}).get("ylabel") or loss_label("loss", config.get("fitness", {}))  # what the loss is, on what
    body = [f"<p>{esc(config.get('strategy', '?'))}, seed {esc(config.get('seed', '?'))}, {fmt(s.get('evaluations'))} "
            f"evaluations; loss: {esc(scored)}"
            + (f"; the search kept {esc(fmt(config['margin_pct']))}% below each budget by the predictor"
               if config.get("margin_pct") else "") + "</p>"]
    rows = []
    for label, e in s.get("budgets", {}).items():
        b = e.get("best") or {}
        rows.append([label, e.get("constraints", ""), e.get("evaluated", ""), b.get("loss_bpb", "-"), b.get("latency_ms", "-"),
                     b.get("params", "-"), _subnet_text(b.get("subnet")) if b else "no feasible subnet"])
    body.append(table(["budget", "constraints", "evaluated", "loss", "predicted ms", "params", "best subnet"], rows))
    for png in sorted(folder.glob("pareto*.png")):
        body.append(image(png, f"{png.name}: every subnet evaluated (grey), the Pareto front (blue), the budget (dashed), "
                               "the search's limit below it (dotted), the best per budget (star) and what the device "
                               "measured (diamonds)"))
        page.shown.add(png)
    if (folder / "pareto.csv").is_file():
        body.append("<h3>The Pareto front (pareto.csv, on_front = 1)</h3>")
        body.append(csv_table(folder / "pareto.csv", keep=lambda d: d.get("on_front") == "1",
                              columns=["trial", "budget", "generation", "loss_bpb", "latency_ms", "params", "subnet"]))
        page.shown.add(folder / "pareto.csv")
    page.add(heading, "".join(body))
    verify_section(folder, page)
    hurdles = [p for p in _files(folder) if p.name.startswith("hurdles")]
    if hurdles:
        page.add("Hurdles", "".join(f"<h3>{esc(p.name)}</h3>{file_html(p, folder)}" for p in hurdles))
        page.shown.update(hurdles)


def _subnet_text(subnet: Any) -> str:
    """A subnet's one-line form from its JSON (``d128 L3 [...]``), or its JSON when it is not one."""
    if not isinstance(subnet, dict):
        return str(subnet)
    from search_spaces import Subnet

    try:
        return str(Subnet.from_dict(subnet))
    except Exception:  # noqa: BLE001 - another task's subnet (an encoder-decoder's), or an unreadable one: as written
        return json.dumps(subnet)


def verify_section(folder: Path, page: Page) -> None:
    """``verify.json``: per budget, each candidate's predicted and measured latency, which held, which was kept."""
    doc = _read_json(folder / "verify.json")
    if doc is None:
        return
    page.shown |= {folder / "verify.json", folder / "verify.csv"}
    fp = doc.get("device", {})
    settings = doc.get("settings", {})
    body = [f"<p>timed on {esc(fp.get('device', '?'))} ({esc(fp.get('runtime', ''))}, {esc(fp.get('threads', '?'))} "
            f"thread(s), {esc(fp.get('clock', 'wall'))} clock) at workload {esc(doc.get('workload', {}).get('name', '?'))}; "
            f"protocol: {esc(settings.get('repeats', '?'))} repeats x {esc(settings.get('rounds', '?'))} rounds, median; "
            "the device is held to the budget itself</p>", '<ul class="verdicts">']
    for label, b in doc.get("budgets", {}).items():
        checks = b.get("checks", [])
        kept = next((c for c in checks if c.get("kept")), None)
        errors = [abs(c["error_pct"]) for c in checks if isinstance(c.get("error_pct"), (int, float))]
        noise = (f"; |predictor error| over the {len(errors)} timed: median {float(np.median(errors)):.1f}%"
                 if errors else "")
        if kept:
            body.append(f'<li><span class="ok">{esc(label)}: holds</span>: rank {esc(kept["rank"])} of {len(checks)} kept, '
                        f"measured {ms(kept['measured_ms'])} against the budget {ms(b.get('budget_ms'))} "
                        f"(predicted {ms(kept['predicted_ms'])}, {kept['error_pct']:+.1f}%){esc(noise)}"
                        + (f"; flags: {esc(kept['flags'])}" if kept.get("flags") else "") + "</li>")
        else:
            body.append(f'<li><span class="bad">{esc(label)}: none of the {len(checks)} candidates held</span> on the '
                        f"device{esc(noise)}</li>")
    body.append("</ul>")
    rows = [[label, c.get("rank"), c.get("loss_bpb"), c.get("predicted_ms"), c.get("measured_ms"), c.get("error_pct"),
             c.get("holds"), c.get("kept"), c.get("flags", ""), _subnet_text(c.get("subnet"))]
            for label, b in doc.get("budgets", {}).items() for c in b.get("checks", [])]
    body.append(table(["budget", "rank", "loss", "predicted ms", "measured ms", "error %", "holds", "kept", "flags",
                       "subnet"], rows))
    page.add("Verification on the device", "".join(body))


def _search(folder: Path, page: Page) -> None:
    search_sections(folder, page)


# --------------------------------------------------------------------------- a model's card


def card_section(model: Path, page: Page, heading: str = "Model card") -> None:
    card = _read_json(model / "model_card.json")
    if card is None:
        page.add(heading, f'<p class="note">{esc(model)}/model_card.json: not there (the export has not run)</p>')
        return
    page.shown.add(model / "model_card.json")
    lines = []
    v = card.get("validation") or {}
    if v:
        scope = (f"{v['windows']} held-out windows x {v.get('seq_len', '?')} tokens" if "windows" in v
                 else f"{v.get('examples', '?')} held-out examples")
        lines.append(f"<li>{esc(v.get('metric', 'bits/byte'))}: <b>{bpb(v.get('bits_per_byte'))}</b> on {esc(scope)} of "
                     f"the {esc(v.get('source', '?'))}</li>")
    tok = card.get("tokenizer") or {}
    if tok:  # the folder's tokenizer.json (issue 54)
        what = "bytes" if tok.get("kind") == "bytes" else f"byte-level BPE of {tok.get('vocab', '?')} ids"
        lines.append(f"<li>tokenizer: <b>{esc(what)}</b> ({esc(tok.get('file', 'tokenizer.json'))}, sha256 "
                     f"{esc(str(tok.get('sha256', '?'))[:16])})</li>")
    lat = card.get("latency") or {}
    if lat:
        lines.append(f"<li>predicted latency <b>{ms(lat.get('predicted_ms'))}</b> ({esc(lat.get('model', '?'))} "
                     f"predictor, {esc((lat.get('device') or {}).get('device', '?'))})</li>")
    m = card.get("measured") or {}
    if m:
        err = m.get("error_pct")
        lines.append(f"<li>measured latency <b>{ms(m.get('median_ms'))}</b> (IQR {ms(m.get('iqr_ms'))}; "
                     f"{esc(m.get('timed', ''))}"
                     + (f"; {err:+.1f}% against the prediction" if isinstance(err, (int, float)) else "") + ")</li>")
    body = ((f"<ul>{''.join(lines)}</ul>" if lines else "")
            + f"<details><summary>every field of model_card.json</summary>{value_html(card)}</details>")
    page.add(heading, body)


def _model(folder: Path, page: Page) -> None:
    card_section(folder, page)


# --------------------------------------------------------------------------- a demo run


def _demo(folder: Path, page: Page) -> None:
    s = _read_json(folder / "summary.json")
    page.shown.add(folder / "summary.json")
    if not isinstance(s, dict) or "found" not in s:
        raise UserError(f"{folder / 'summary.json'}: not the summary of `nas demo` (no 'found' entry)")
    page.add("Result", demo_verdicts(s))
    if (folder / "search").is_dir() and (folder / "search" / "search.json").is_file():
        search_sections(folder / "search", page, "Search: the Pareto front")
    predictor_section(folder / "predictor", page)
    if (folder / "comparison.csv").is_file():
        page.shown.add(folder / "comparison.csv")
        page.add("Comparison with the uniform baselines (comparison.csv)", csv_table(folder / "comparison.csv"))
    card_section(folder / "model", page)
    if s.get("stage_seconds"):
        page.add("Stages", table(["stage", "seconds"], [[k, v] for k, v in s["stage_seconds"].items()])
                 + (f"<details><summary>the plan (sizes of every stage)</summary>{value_html(s['plan'])}</details>"
                    if s.get("plan") else ""))


def demo_verdicts(s: dict) -> str:
    """The demo's verdicts, each with its noise: the latency against the budget (the measurement's IQR), the found
    model against each uniform baseline at or below its latency (the paired difference over the windows, its SE)."""
    f = s["found"]
    out = [f"<p>budget <b>{ms(s.get('budget_ms'))}</b>; found <code>{esc(_subnet_text(f.get('subnet')))}</code>, "
           f"{fmt(f.get('params'))} parameters</p>", '<ul class="verdicts">']
    iqr = f" (IQR {ms(f['measured_iqr_ms'])})" if "measured_iqr_ms" in f else ""
    ok = s.get("within_budget")
    out.append(f'<li><span class="{"ok" if ok else "bad"}">{"within" if ok else "OVER"} the budget</span>: measured '
               f"{ms(f.get('measured_ms'))}{iqr}, predicted {ms(f.get('predicted_ms'))} "
               f"({s.get('error_pct', float('nan')):+.1f}%)</li>")
    windows = f.get("bpb_windows")
    scope = f"on {windows} fresh held-out windows" if windows else "on fresh held-out windows"
    out.append(f"<li>bits/byte <b>{bpb(f.get('bpb'))}</b> {esc(scope)}"
               + (f" ({bpb(f['search_bpb'])} on the search's {f.get('search_windows')} windows, the model card's number)"
                  if "search_bpb" in f else "") + "</li>")
    beaten = [b for b in s.get("baselines", []) if b.get("measured_ms", math.inf) <= f.get("measured_ms", -math.inf)]
    if not beaten:
        out.append("<li>no uniform baseline measured at or below the found model's latency: nothing to compare</li>")
    else:
        good = s.get("beats_baselines")
        out.append(f'<li><span class="{"ok" if good else "bad"}">{"lower" if good else "NOT lower"} bits/byte than all '
                   f"{len(beaten)} uniform baselines at equal or lower measured latency</span><ul>")
        for b in beaten:
            d, se = b.get("vs_found_bpb"), b.get("vs_found_se")
            noise = (f": {d:+.4f} bits/byte against the found model, paired SE {se:.4f} over the windows "
                     f"({d / se:+.1f} SE)" if isinstance(d, float) and isinstance(se, float) and se > 0 else "")
            out.append(f"<li>{esc(b['name'])}: {bpb(b['bpb'])} bits/byte at {ms(b['measured_ms'])}{esc(noise)}</li>")
        out.append("</ul></li>")
    out.append("</ul>")
    if s.get("sample"):
        out.append(f"<h3>A sample from the found model</h3><pre>{esc(s['sample'])}</pre>")
    return "".join(out)


def predictor_section(folder: Path, page: Page) -> None:
    """The predictor's figure and its agreement with the measurements (held-out, test-retest: the noise floor)."""
    doc = _read_json(folder / "predictor.json")
    if doc is None:
        return
    page.shown.add(folder / "predictor.json")
    metrics = doc.get("metrics", {})
    body = []
    if (folder / "predicted_vs_measured.png").is_file():
        body.append(image(folder / "predicted_vs_measured.png", "held-out subnets: predicted against measured latency, "
                          "with the ±10% band; re-measured subnets (test-retest) beside them"))
    rows = []
    labels = {"held_out": f"held-out, {metrics.get('chosen', '?')}", "held_out_vs_retest": "held-out vs re-measured",
              "test_retest": "test-retest (the noise floor)"}
    rows += [[f"cv {k}", *_agreement(m)] for k, m in metrics.get("cv", {}).items()]
    rows += [[label, *_agreement(metrics[k])] for k, label in labels.items() if isinstance(metrics.get(k), dict)]
    body.append(table(["", "n", "RMSE ms", "MAPE %", "within ±5%", "within ±10%", "Kendall tau"], rows))
    fp = doc.get("fingerprint", {})
    body.append(f"<p>model <b>{esc(doc.get('model', '?'))}</b>, fitted on {esc(fp.get('device', '?'))} "
                f"({esc(fp.get('cpu_model', ''))}), workload {esc((doc.get('workload') or {}).get('name', '?'))}</p>")
    page.add("Latency predictor", "".join(body))


def _agreement(m: dict) -> list:
    pct = lambda k: round(100 * m[k], 2) if isinstance(m.get(k), (int, float)) else "-"  # noqa: E731
    return [m.get("n", "-"), m.get("rmse_ms", "-"), pct("mape"), pct("within_5"), pct("within_10"), m.get("kendall_tau", "-")]
