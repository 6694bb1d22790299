"""``nas report``: one self-contained HTML page that shows a run folder, to open or share.

A folder is recognised by what it holds (:func:`detect`):

* ``demo``: a ``nas demo`` run (``summary.json`` beside ``search/``): the verdicts with their noise, the
  Pareto front with the uniform baselines, the search's best per generation, the predictor against the
  measurements, the verification on the device, the comparison with the uniform baselines, the model card, the
  supernet's learning curve, the stages and how to reproduce the run;
* ``search``: a ``nas search --out`` folder (``search.json``): its budgets, front, best per generation and
  verification;
* ``model``: a ``nas export`` folder (``model_card.json``): the card;
* ``predictor``: a ``nas fit-predictor`` folder (``predictor.json``): its figure and its agreement with the measurements;
* ``training``: a ``nas train-supernet --out`` folder (``log.jsonl``): the learning curve;
* ``files``: any other folder of results (``docs/benchmarks/<name>/``): its Markdown, figures, tables and
  JSON, one section per file.

The page is rendered by the Jinja2 templates in ``nas/templates/report/`` with autoescaping on: every text
taken from the folder (file contents, file names, JSON fields) is data, never markup.  The folder is read
through :class:`nas.report_files.RunFolder` (no links followed, no FIFO opened, nothing read whole when large;
:mod:`nas.report_files`), and every JSON document is checked against the types each section expects
(:func:`nas.report_files.conform`): a field of another type is left out and the section says so.

The page needs nothing at view time: figures are embedded as ``data:`` URIs, the style is inline (allowed by
its hash), there is no script, and a Content-Security-Policy forbids loading anything, submitting a form or
changing the page's base (a browser refuses and says so on its console).
"""

from __future__ import annotations

import base64
import functools
import hashlib
import itertools
import json
import math
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from search_spaces import UserError

from .report_figures import plottable
from .report_files import (
    ANY,
    BOOL,
    MAX_CELL,
    MAX_COLUMNS,
    MAX_ENTRIES,
    MAX_CSV,
    MAX_IMAGE,
    MAX_JSON,
    MAX_LOG,
    MAX_PIXELS,
    MAX_TEXT,
    NUM,
    PNG_SIGNATURE,
    TEXT,
    Map,
    RunFolder,
    Table,
    Unreadable,
    conform,
    printable,
    shown,
)

PAGE = "report.html"
MAX_ROWS = 200  # rows of a table shown; the rest counted
MAX_DEPTH_SHOWN = 4  # levels of a JSON document shown as nested tables (deeper: its text)
MAX_PRE = 100_000  # characters of one preformatted text shown
MAX_VALUES = 20_000  # values of one JSON document shown (nested tables of a 16 MB document would be gigabytes)
MAX_READ = 64 * 2**20  # bytes of the folder's other files read for one page (then they are listed, not shown)
IMAGES = {".png": "image/png", ".jpg": "image/jpeg", ".jpeg": "image/jpeg", ".svg": "image/svg+xml"}
SHOWN = {".md", ".json", ".csv", ".txt", ".log", *IMAGES}
KIND_TITLES = {"demo": "nas demo run", "search": "nas search", "model": "exported model", "predictor": "latency predictor",
               "training": "supernet training", "files": "results"}

# What a timing's flags mean (latency/timing_core.py sets them), shown wherever timings are.
FLAGS = {
    "load": "the machine's 1-minute load average was above its core count while this model was timed: other work ran "
            "beside it, so its time may be high (with --clock cpu only this thread's CPU time counts, which load "
            "disturbs less)",
    "noisy": "the spread of its samples (IQR) was wider than the protocol's tolerance around the median",
    "interference": "the reference model's time changed during the visit, after every retry: disturbed",
}


# --------------------------------------------------------------------------- the expected shape of each document

ROW = {"name": TEXT, "subnet": TEXT, "key": TEXT, "params": NUM, "bpb": NUM, "bpb_windows": NUM, "search_bpb": NUM,
       "search_windows": NUM, "predicted_ms": NUM, "measured_ms": NUM, "measured_iqr_ms": NUM, "flags": TEXT,
       "vs_found_bpb": NUM, "vs_found_se": NUM}
SUMMARY = {"budget_ms": NUM, "within_budget": BOOL, "error_pct": NUM, "beats_baselines": BOOL, "sample": TEXT,
           "found": {**ROW, "subnet": ANY}, "baselines": [ROW], "stage_seconds": Map(NUM), "plan": Map(ANY),
           "command": TEXT, "recipe": TEXT,
           "deployed": {"bpb": NUM, "bpb_windows": NUM, "search_bpb": NUM, "inherited_bpb": NUM}}
SEARCH = {
    "nas_version": TEXT, "evaluations": NUM,
    "config": {"strategy": TEXT, "seed": NUM, "margin_pct": NUM, "max_params": NUM, "budgets": [TEXT],
               "fitness": Map(ANY), "search": Map(ANY)},
    "budgets": Map({"constraints": TEXT, "evaluated": NUM, "budgets_ms": Map(NUM),
                    "best": {"subnet": ANY, "loss_bpb": NUM, "latency_ms": NUM, "params": NUM}}),
    "figure": {"title": TEXT, "ylabel": TEXT, "budgets_ms": [NUM], "limits_ms": [NUM]}, "workload": TEXT,
}
DEVICE = {"device": TEXT, "runtime": TEXT, "threads": NUM, "clock": TEXT, "cpu_model": TEXT, "python": TEXT,
          "torch": TEXT, "onnxruntime": TEXT}
CHECK = {"rank": NUM, "loss_bpb": NUM, "predicted_ms": NUM, "measured_ms": NUM, "error_pct": NUM, "holds": BOOL,
         "kept": BOOL, "flags": TEXT, "subnet": ANY}
VERIFY = {"device": DEVICE, "workload": {"name": TEXT}, "settings": {"repeats": NUM, "rounds": NUM},
          "budgets": Map({"budget_ms": NUM, "checks": [CHECK]})}
METRIC = {"n": NUM, "rmse_ms": NUM, "mape": NUM, "within_5": NUM, "within_10": NUM, "kendall_tau": NUM}
PREDICTOR = {"model": TEXT, "fingerprint": DEVICE, "workload": {"name": TEXT},
             "metrics": {"chosen": TEXT, "cv": Map(METRIC), "held_out": METRIC, "held_out_vs_retest": METRIC,
                         "test_retest": METRIC}}
CARD = {
    "validation": {"metric": TEXT, "bits_per_byte": NUM, "windows": NUM, "seq_len": NUM, "examples": NUM, "source": TEXT},
    "latency": {"predicted_ms": NUM, "model": TEXT, "device": DEVICE},
    "measured": {"median_ms": NUM, "iqr_ms": NUM, "timed": TEXT, "error_pct": NUM, "device": DEVICE, "flags": [TEXT]},
    "source": {"supernet": TEXT, "step": NUM}, "torch_program": {"torch": TEXT},
    "tokenizer": {"kind": TEXT, "vocab": NUM, "file": TEXT, "sha256": TEXT},
}


# --------------------------------------------------------------------------- numbers as the page writes them


def fmt(value: Any) -> str:
    """A number as a reader wants it (6 significant digits, thousands grouped), anything else as text; None as ?."""
    if value is None:
        return "?"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, int):
        return f"{value:,}" if abs(value) >= 10_000 else str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            return str(value)
        return f"{value:,.0f}" if abs(value) >= 1e6 else f"{value:.6g}"
    return str(value)


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def ms(value: Any) -> str:
    """Milliseconds as the figures give them (3 decimals); anything that is not a number: ``? ms``."""
    return f"{value:.3f} ms" if _finite(value) else "? ms"


def bpb(value: Any) -> str:
    """A held-out score as the tables give it (4 decimals); anything that is not a number: ``?``."""
    return f"{value:.4f}" if _finite(value) else "?"


def signed(value: Any, digits: int = 1) -> str:
    """``+1.2`` (a percentage's, a difference's form); ``?`` for anything that is not a number."""
    return f"{value:+.{digits}f}" if _finite(value) else "?"


def cut(text: Any, n: int = 200) -> str:
    """``text`` at most ``n`` characters (a label, a name from a file), with an ellipsis where it was cut."""
    text = str(text)
    return text if len(text) <= n else text[: n - 1] + "…"


# --------------------------------------------------------------------------- the templates

_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


def _finalize(value: Any) -> Any:
    """Every ``{{ }}`` of the templates: texts made valid UTF-8 without control characters (then autoescaped);
    markup the templates made themselves passes as it is."""
    from markupsafe import Markup

    if isinstance(value, Markup):
        return value
    if isinstance(value, str):
        return _CONTROL.sub("\ufffd", shown(value))
    return value


@functools.lru_cache(maxsize=1)
def environment():
    """The Jinja2 environment of the page: autoescaping on for every template, undefined names an error."""
    import jinja2

    env = jinja2.Environment(loader=jinja2.PackageLoader("nas", "templates/report"), autoescape=True,
                             undefined=jinja2.StrictUndefined, finalize=_finalize, trim_blocks=True, lstrip_blocks=True)
    env.filters.update(ms=ms, bpb=bpb, fmt=fmt, signed=signed, cut=cut)
    env.globals.update(FLAGS=FLAGS)
    return env


def render(template: str, **context: Any):
    """A template rendered (autoescaped) as markup to place in the page."""
    from markupsafe import Markup

    return Markup(environment().get_template(template).render(**context))


def style() -> str:
    """The page's style sheet (``style.css``): inlined, and allowed by its hash in the page's policy."""
    return environment().loader.get_source(environment(), "style.css")[0]


def csp(style_text: str) -> str:
    """The page's Content-Security-Policy: nothing loads (``default-src 'none'``), images only from the page itself,
    the one style sheet by its hash (no other inline style), no form submits anywhere, no ``<base>``."""
    digest = base64.b64encode(hashlib.sha256(style_text.encode("utf-8")).digest()).decode("ascii")
    return (f"default-src 'none'; img-src data:; style-src 'sha256-{digest}'; form-action 'none'; base-uri 'none'")


# --------------------------------------------------------------------------- the page


@dataclass
class Section:
    anchor: str
    title: str
    body: Any  # Markup
    skipped: list[str] = field(default_factory=list)


@dataclass
class Page:
    """The sections of a page, in order; ``shown``: the files (paths relative to the run folder) already on it."""

    run: RunFolder
    title: str
    sections: list[Section] = field(default_factory=list)
    shown: set[str] = field(default_factory=set)

    def add(self, title: str, template: str, skipped: list[str] | None = None, anchor: str | None = None,
            **context: Any) -> None:
        """A section rendered from ``template``; ``skipped``: what it left out, and why (shown under its title)."""
        base = anchor or _anchor(title)
        taken = {s.anchor for s in self.sections}
        anchor, n = base, 2
        while anchor in taken:
            anchor, n = f"{base}-{n}", n + 1
        self.sections.append(Section(anchor, title, render(template, **context), list(skipped or [])))

    def html(self) -> str:
        from search_spaces.version import __version__

        text = style()
        return environment().get_template("page.html").render(
            title=self.title, folder=self.run.display(""), version=__version__, csp=csp(text), style=_markup(text),
            sections=self.sections)


def _markup(text: str):
    from markupsafe import Markup

    return Markup(text)


def _anchor(title: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", shown(title).lower()).strip("-") or "section"


def detect(folder: str | Path) -> str:
    """``demo``, ``search``, ``model``, ``predictor``, ``training`` or ``files`` (the module's docstring); a folder with
    none of these is refused, naming what it holds that the page would not read."""
    return _detect(RunFolder(folder))


def _detect(run: RunFolder) -> str:
    if run.is_file("summary.json") and run.what("search") != "missing":
        return "demo"
    for name, kind in (("search.json", "search"), ("model_card.json", "model"), ("predictor.json", "predictor"),
                       ("log.jsonl", "training")):
        if run.is_file(name):
            return kind
    entries, _ = run.entries()
    if any(e.is_file and _listed(e) for e in entries):
        return "files"
    refused = [f"{printable(e.name)} is {e.kind}" for e in entries if not e.is_file and _listed(e)]
    raise UserError(f"{run.display('')}: not a run folder: no summary.json (nas demo), search.json (nas search), "
                    f"model_card.json (nas export), nor any {', '.join(sorted(SHOWN))} file to show"
                    + (f" ({'; '.join(refused[:3])}: not followed or read)" if refused else ""))


def _listed(e) -> bool:
    return not e.name.startswith(".") and e.suffix in SHOWN


def check_out(folder: str | Path, out: str | Path) -> None:
    """The page's ``out`` is not a file the report reads: inside the run folder only an ``.html`` file may be written
    (``nas report R --out R/summary.json`` would replace the run's summary with the page)."""
    root = Path(folder).resolve()
    out = Path(out)
    target = out.parent.resolve() / out.name  # the file itself is replaced, never followed (atomic_write)
    if (target == root or root in target.parents) and out.suffix.lower() != ".html":
        raise UserError(f"--out {out}: inside the run folder {folder}, where the report reads its files; write the page "
                        f"to an .html file (default {Path(folder) / PAGE}) or outside the folder")


def build(folder: str | Path) -> str:
    """The page of ``folder`` (:func:`detect` says which kind), as HTML text."""
    run = RunFolder(folder)
    kind = _detect(run)
    page = Page(run, f"{run.root.name}: {KIND_TITLES[kind]}")
    {"demo": _demo, "search": _search, "model": _model, "predictor": _predictor, "training": _training,
     "files": _files}[kind](page)
    if kind != "files":
        _files(page, only_new=True)  # what else lies at the top of the folder
    return page.html()


def write_report(folder: str | Path, out: str | Path | None = None) -> Path:
    """Write the page of ``folder`` to ``out`` (default ``folder/report.html``; never a file the report reads:
    :func:`check_out`); returns its path."""
    from supernet.files import atomic_write

    path = Path(out) if out is not None else Path(folder) / PAGE
    check_out(folder, path)
    text = build(folder)
    atomic_write(path, text.encode("utf-8"))
    return path


# --------------------------------------------------------------------------- pieces: figures, tables, values


@dataclass
class Figure:
    mime: str
    data: str  # base64
    alt: str
    caption: str


def figure_of(png: bytes, alt: str, caption: str) -> Figure:
    return Figure("image/png", base64.b64encode(png).decode("ascii"), alt, caption)


def image(run: RunFolder, rel: str, caption: str | None = None) -> Figure:
    """The figure ``rel`` of the folder, to embed (:class:`Unreadable`: not a regular file, over :data:`MAX_IMAGE`,
    not the kind of image its name says, a PNG declaring more than :data:`MAX_PIXELS` pixels)."""
    name = rel.rsplit("/", 1)[-1]
    suffix = Path(name).suffix.lower()
    data = run.read(rel, MAX_IMAGE, "figure")
    where = run.display(rel)
    if suffix == ".png":
        if not data.startswith(PNG_SIGNATURE) or len(data) < 24:
            raise Unreadable(f"{where}: not a PNG image (no PNG signature): not embedded")
        width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
        if width * height > MAX_PIXELS:
            raise Unreadable(f"{where}: a PNG of {width:,} x {height:,} pixels, over the {MAX_PIXELS:,}-pixel limit of "
                             "a figure: not embedded")
    elif suffix in (".jpg", ".jpeg") and not data.startswith(b"\xff\xd8\xff"):
        raise Unreadable(f"{where}: not a JPEG image: not embedded")
    elif suffix == ".svg" and b"<svg" not in data[:4096]:
        raise Unreadable(f"{where}: not an SVG image (no <svg> element at its start): not embedded")
    return Figure(IMAGES[suffix], base64.b64encode(data).decode("ascii"), printable(name),
                  caption if caption is not None else printable(name))


@dataclass
class Cell:
    text: str
    cls: str = ""  # "num" (right-aligned), "subnet" (wraps)


@dataclass
class TableView:
    header: list[str]
    rows: list[list[Cell]]
    total: int
    notes: list[str] = field(default_factory=list)
    cls: str = ""


def cell(value: Any, cls: str | None = None) -> Cell:
    """A table cell: a number formatted (:func:`fmt`) and right-aligned, a text cut to :data:`MAX_CELL` characters,
    None empty."""
    if isinstance(value, str):
        text, numeric = value, _number_text(value) is not None
    elif value is None:
        text, numeric = "", False
    else:
        text, numeric = fmt(value), isinstance(value, (int, float)) and not isinstance(value, bool)
    if len(text) > MAX_CELL:
        text = text[:MAX_CELL] + f"… ({len(text):,} characters)"
    return Cell(text, cls if cls is not None else "num" if numeric else "")


def _number_text(text: str) -> float | None:
    try:
        return float(text) if len(text) < 64 else None
    except ValueError:
        return None


def _short(text: str) -> str:
    """A CSV cell: a long float cut to 6 significant digits (the file keeps them all)."""
    v = _number_text(text)
    if v is not None and re.fullmatch(r"-?\d+\.\d{7,}(e[-+]?\d+)?", text.strip()):
        return f"{v:.6g}"
    return text


def table(header: list[str], rows: list[list[Any]], total: int | None = None, cls: str = "") -> TableView:
    """A table of at most :data:`MAX_ROWS` rows and :data:`MAX_COLUMNS` columns; ``total``: the rows there are."""
    notes = []
    if len(header) > MAX_COLUMNS:
        notes.append(f"the first {MAX_COLUMNS} of {len(header):,} columns shown")
    shown_rows = [[c if isinstance(c, Cell) else cell(c) for c in r[:MAX_COLUMNS]] for r in rows[:MAX_ROWS]]
    return TableView([cut(h, 200) for h in header[:MAX_COLUMNS]], shown_rows, total if total is not None else len(rows),
                     notes, cls)


def csv_view(t: Table, keep: Callable[[dict], bool] | None = None, columns: list[str] | None = None) -> TableView:
    """A CSV table as the page shows it (``keep(row dict)`` filters, ``columns`` picks)."""
    dicts = t.dicts()
    if keep is not None:
        dicts = [d for d in dicts if keep(d)]
    cols = [c for c in (columns or t.header) if c in t.header] if columns else list(t.header)
    view = table(cols, [[_short(d.get(c, "")) for c in cols[:MAX_COLUMNS]] for d in dicts[:MAX_ROWS]], len(dicts))
    view.notes = [*t.notes, *view.notes]
    return view


def value_view(value: Any, depth: int = 0, budget: list[int] | None = None) -> dict:
    """A JSON value for the ``value`` macro: objects as two-column tables, lists of flat objects as tables, lists of
    scalars on one line, long texts preformatted; at most :data:`MAX_ROWS` entries of each, :data:`MAX_DEPTH_SHOWN`
    levels (deeper ones as their JSON text, cut), about :data:`MAX_VALUES` values in all (``budget``: those left)."""
    budget = [MAX_VALUES] if budget is None else budget
    budget[0] -= 1
    if isinstance(value, dict):
        if not value:
            return {"t": "scalar", "text": "{}"}
        if depth >= MAX_DEPTH_SHOWN:
            return {"t": "pre", "text": json_text(value)}
        rows = []
        for k, v in itertools.islice(value.items(), MAX_ROWS):
            if budget[0] <= 0:
                break
            rows.append((cut(k, 200), value_view(v, depth + 1, budget)))
        return {"t": "object", "rows": rows, "more": len(value) - len(rows),
                "cut": MAX_VALUES if budget[0] <= 0 and len(rows) < len(value) else 0}
    if isinstance(value, list):
        head = value[:MAX_ROWS]
        if head and all(isinstance(v, dict) for v in head) and depth < MAX_DEPTH_SHOWN:
            cols = list(itertools.islice(dict.fromkeys(k for v in head for k in v), MAX_COLUMNS + 1))
            if all(not isinstance(v.get(c), (dict, list)) for v in head for c in cols):
                budget[0] -= len(head) * len(cols)
                return {"t": "table", "table": table(cols, [[v.get(c, "") for c in cols] for v in head], len(value))}
            items = []
            for v in head:
                if budget[0] <= 0:
                    break
                items.append(value_view(v, depth + 1, budget))
            return {"t": "items", "items": items, "more": len(value) - len(items),
                    "cut": MAX_VALUES if budget[0] <= 0 and len(items) < len(value) else 0}
        if all(not isinstance(v, (dict, list)) for v in value):
            text = ", ".join(cut(fmt(v), 200) for v in value[:60]) + (f", ... ({len(value):,} in all)" if len(value) > 60 else "")
            return {"t": "scalar", "text": f"[{text}]"}
        return {"t": "pre", "text": json_text(value)}
    if isinstance(value, str) and ("\n" in value or len(value) > 200):
        return {"t": "pre", "text": value[:MAX_PRE]}
    return {"t": "scalar", "text": cut(fmt(value), MAX_CELL)}


def json_text(value: Any) -> str:
    """``value`` as indented JSON, its first :data:`MAX_PRE` characters (written only that far)."""
    out, n = [], 0
    for chunk in json.JSONEncoder(indent=1).iterencode(value):
        out.append(chunk)
        n += len(chunk)
        if n >= MAX_PRE:
            return "".join(out)[:MAX_PRE] + " …"
    return "".join(out)


# --------------------------------------------------------------------------- any folder: one section per file


def file_view(run: RunFolder, rel: str) -> dict:
    """One file of the folder as the ``file`` macro shows it; a file that cannot be shown: a note saying why."""
    suffix = Path(rel).suffix.lower()
    try:
        if suffix in IMAGES:
            return {"t": "figure", "figure": image(run, rel)}
        if suffix == ".md":
            from .report_markdown import blocks

            head, size = run.head(rel, MAX_TEXT)
            folder = rel.rsplit("/", 1)[0] if "/" in rel else ""
            return {"t": "md", "blocks": blocks(head.decode("utf-8", errors="replace"),
                                                lambda ref: _md_image(run, folder, ref), lambda ref: _md_link(run, folder, ref)),
                    "notes": [f"the first {len(head):,} of its {size:,} bytes shown"] if size > len(head) else []}
        if suffix == ".csv":
            return {"t": "table", "table": csv_view(run.csv(rel))}
        if suffix == ".json":
            try:
                return {"t": "value", "value": value_view(run.json(rel)), "notes": []}
            except Unreadable as e:
                if "not valid JSON" not in str(e):
                    raise
                return {**text_view(run, rel), "notes": [str(e)]}
        return text_view(run, rel)
    except Unreadable as e:
        return {"t": "note", "text": str(e)}


def text_view(run: RunFolder, rel: str) -> dict:
    """A text file: whole when short; a long one (a 6 GB log) by its head and its tail, the bytes between counted."""
    head, tail, size = run.head_tail(rel, MAX_TEXT)
    return {"t": "text", "head": head.decode("utf-8", errors="replace"), "tail": tail.decode("utf-8", errors="replace"),
            "between": size - len(head) - len(tail) if tail else 0, "size": size, "notes": []}


def _md_local(run: RunFolder, folder: str, ref: str) -> str | None:
    """A file directly in the Markdown file's folder that ``ref`` names (no other path is followed)."""
    ref = ref.split("#", 1)[0]
    if not ref or "/" in ref or "\\" in ref or ref.startswith("."):
        return None
    rel = f"{folder}/{ref}" if folder else ref
    return rel if run.is_file(rel) else None


def _md_image(run: RunFolder, folder: str, ref: str) -> Figure | None:
    rel = _md_local(run, folder, ref)
    if rel is None or Path(rel).suffix.lower() not in IMAGES:
        return None
    try:
        return image(run, rel, None)
    except Unreadable:
        return None


def _md_link(run: RunFolder, folder: str, ref: str) -> str | None:
    rel = _md_local(run, folder, ref)
    if rel is None or Path(rel).suffix.lower() not in SHOWN or "/" in rel:
        return None
    return "#" + _file_anchor(rel)


def _file_anchor(rel: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", shown(rel.rsplit("/", 1)[-1]).lower()).strip("-") or "file"


READ_COST = {".json": MAX_JSON, ".csv": MAX_CSV, **{suffix: MAX_IMAGE for suffix in IMAGES}}  # else: MAX_TEXT


def _files(page: Page, only_new: bool = False) -> None:
    """A section per file at the top of the folder (README first, then Markdown, figures, tables, JSON, text) not yet on
    the page; what is not shown (links, FIFOs, folders' worth of entries) said in a note."""
    order = {".md": 1, ".png": 2, ".jpg": 2, ".jpeg": 2, ".svg": 2, ".csv": 3, ".json": 4, ".txt": 5, ".log": 5}
    entries, total = page.run.entries()
    listed = [e for e in entries if _listed(e) and e.rel not in page.shown]
    files = sorted((e for e in listed if e.is_file), key=lambda e: (e.name.lower() != "readme.md", order[e.suffix], e.name))
    skipped = [f"{printable(e.name)}: {e.kind}, not read (the page shows only the folder's own regular files)"
               for e in listed if not e.is_file]
    if total > len(entries):
        skipped.append(f"the folder holds {total:,} entries: the first {MAX_ENTRIES:,} by the order the file system "
                       "lists them were looked at")
    views, read = [], 0
    for e in files:
        cost = min(e.size, READ_COST.get(e.suffix, MAX_TEXT))  # what showing it reads, at most
        if read + cost > MAX_READ:
            skipped.append(f"{printable(e.name)}: not shown: the page already holds {read:,} bytes of the folder's files "
                           f"(at most {MAX_READ:,})")
            continue
        read += cost
        views.append((_file_anchor(e.rel), printable(e.name), file_view(page.run, e.rel)))
        page.shown.add(e.rel)
    if only_new:
        if views or skipped:
            page.add("Other files", "files.html", skipped, views=views)
        return
    for anchor, name, view in views:
        page.add(name, "files.html", [], anchor=anchor, views=[(None, None, view)])
    if skipped:
        page.add("Not shown", "files.html", skipped, views=[])


# --------------------------------------------------------------------------- reading a document of the run


def document(page: Page, rel: str, schema: Any, skipped: list[str]) -> tuple[dict | None, Any]:
    """``(the fields of rel that fit schema, the document as read)``; ``(None, None)`` when it is not there or cannot
    be read (said in ``skipped``).  A field of another type is left out and said in ``skipped``."""
    try:
        raw = page.run.json_or_none(rel)
    except Unreadable as e:
        skipped.append(str(e))
        return None, None
    if raw is None:
        return None, None
    page.shown.add(rel)
    problems: list[str] = []
    clean = conform(raw, schema, rel.rsplit("/", 1)[-1], problems)
    skipped.extend(f"{p}: left out" for p in problems[:20])
    if len(problems) > 20:
        skipped.append(f"and {len(problems) - 20:,} more fields of the wrong type")
    return clean, raw


def _subnet_text(subnet: Any) -> str:
    """A subnet's one-line form from its JSON (``d128 L3 [...]``), or its JSON when it is not one."""
    if isinstance(subnet, str):
        return cut(subnet, MAX_CELL)
    if not isinstance(subnet, dict):
        return cut(json.dumps(subnet), MAX_CELL)
    from search_spaces import Subnet

    try:
        return cut(str(Subnet.from_dict(subnet)), MAX_CELL)
    except Exception:  # noqa: BLE001 - another task's subnet (an encoder-decoder's), or an unreadable one: as written
        return cut(json.dumps(subnet), MAX_CELL)


def _flags_in(texts: list[str]) -> list[tuple[str, str]]:
    """The known flags that appear in ``texts`` (``"load;noisy"``), with what each means."""
    seen = {f for t in texts for f in re.split(r"[;,\s]+", t) if f}
    return [(f, FLAGS[f]) for f in FLAGS if f in seen]


# --------------------------------------------------------------------------- a search


def _search(page: Page) -> None:
    search_sections(page, "")
    _reproduce(page, "search")


def search_sections(page: Page, base: str, heading: str = "Search", baselines: list[dict] | None = None) -> None:
    """The budgets and their best subnets, the Pareto figure (with ``baselines`` where given: a demo's), the search's
    best per generation, the front's rows, the verification, the hurdles."""
    from nas.search.pareto import loss_label

    run, skipped = page.run, []
    at = (lambda name: f"{base}/{name}") if base else (lambda name: name)
    s, _ = document(page, at("search.json"), SEARCH, skipped)
    s = s or {}
    config = s.get("config", {})
    figure = s.get("figure", {})
    scored = figure.get("ylabel") or loss_label("loss", config.get("fitness", {}))
    budgets = [{"label": label, "constraints": e.get("constraints", ""), "evaluated": e.get("evaluated"),
                "best": e.get("best") or None, "subnet": _subnet_text(e["best"].get("subnet")) if e.get("best") else ""}
               for label, e in s.get("budgets", {}).items()]
    pareto_rel = at("pareto.csv")
    points = None
    if run.what(pareto_rel) != "missing":
        try:
            points = run.csv(pareto_rel)
            page.shown.add(pareto_rel)
        except Unreadable as e:
            skipped.append(str(e))
    figures = []
    if baselines is not None and points is not None and s:
        figures.extend(f for f in [_front_with_baselines(page, base, s, points, baselines, skipped)] if f)
    else:
        entries, _ = run.entries(base)
        for e in entries:
            if e.name.startswith("pareto") and e.suffix == ".png":
                page.shown.add(e.rel)
                try:
                    figures.append(image(run, e.rel, f"{printable(e.name)}: every subnet evaluated (grey), the Pareto front "
                                         "(blue), the budget (dashed), the search's limit below it (dotted), the best "
                                         "per budget (star) and what the device measured (diamonds)"))
                except Unreadable as err:
                    skipped.append(str(err))
    generations = None
    if points is not None:
        generations = _generations(points, s, scored, skipped)
    front = None
    if points is not None:
        front = csv_view(points, keep=lambda d: d.get("on_front") == "1",
                         columns=["trial", "budget", "generation", "loss_bpb", "latency_ms", "params", "subnet"])
        front.header = [{"loss_bpb": "loss", "latency_ms": "predicted ms"}.get(h, h) for h in front.header]
        skipped.extend(front.notes)
        front.notes = []
    page.add(heading, "search.html", skipped, config=config, evaluations=s.get("evaluations"), scored=scored,
             budgets=budgets, figures=figures, generations=generations, front=front)
    verify_section(page, base)
    hurdles(page, base)


def drawn(make: Callable[[], Any], what: str, skipped: list[str]) -> bytes | None:
    """The PNG of the figure ``make()`` draws, or None when matplotlib cannot draw it from these numbers (said in
    ``skipped``): the data were checked to be finite and in range, this is the last guard of the page."""
    import numpy as np

    from nas.report_figures import png

    try:
        return png(make())
    except (ValueError, OverflowError, FloatingPointError, np.linalg.LinAlgError) as e:
        skipped.append(f"{what}: not drawn ({type(e).__name__}: {cut(e, 200)})")
        return None


def _front_with_baselines(page: Page, base: str, s: dict, points: Table, baselines: list[dict],
                          skipped: list[str]) -> Figure | None:
    """The search's Pareto figure drawn again with the uniform baselines (a demo's ``comparison.csv``: at their
    predicted latency and on the search's windows, the figure's axes) and the device's measurements."""
    from nas.search.pareto import pareto_figure

    xy, dropped = [], 0
    for d in points.dicts():
        loss, ms_ = _number_text(d.get("loss_bpb", "")), _number_text(d.get("latency_ms", ""))
        if plottable(loss) and plottable(ms_):
            xy.append([loss, ms_])
        else:
            dropped += 1
    if dropped:
        skipped.append(f"pareto.csv: {dropped:,} rows whose loss or latency is not a number a figure can place: not drawn")
    figure = s.get("figure", {})
    best = {cut(label, 40): (e["best"]["loss_bpb"], e["best"]["latency_ms"]) for label, e in s.get("budgets", {}).items()
            if plottable(e.get("best", {}).get("loss_bpb")) and plottable(e.get("best", {}).get("latency_ms"))}
    verify, _ = document(page, f"{base}/verify.json" if base else "verify.json", VERIFY, [])
    checks = [c for b in (verify or {}).get("budgets", {}).values() for c in b.get("checks", [])
              if all(plottable(c.get(k)) for k in ("loss_bpb", "predicted_ms", "measured_ms"))]
    device = cut(((verify or {}).get("device") or {}).get("device") or "the device", 60)
    shown_baselines = [{"name": cut(" = ".join(b["names"]).replace("uniform ", ""), 40), "latency_ms": b["predicted_ms"],
                        "loss": b["search_bpb"]} for b in baselines
                       if plottable(b.get("predicted_ms")) and plottable(b.get("search_bpb"))]
    import numpy as np

    def draw():
        return pareto_figure(np.array(xy, dtype=np.float64).reshape(-1, 2),
                             [v for v in figure.get("budgets_ms", []) if plottable(v)], best,
                             cut(figure.get("title", "search"), 300),
                             limits_ms=[v for v in figure.get("limits_ms", []) if plottable(v)],
                             measured=[{**c, "holds": bool(c.get("holds"))} for c in checks],
                             ylabel=cut(figure.get("ylabel", "validation loss (bits per byte)"), 200), device=device,
                             baselines=shown_baselines)

    data = drawn(draw, "the Pareto figure", skipped)
    return data and figure_of(data, "the search's Pareto front with the uniform baselines",
                     "every subnet the search evaluated (grey) and its Pareto front (blue) by predicted latency; the "
                     "budget (dashed) and the search's limit below it (dotted); the found model (star); the uniform "
                     "baselines (squares: their predicted latency and their bits/byte on the search's windows, as the "
                     "front's); the candidates the device timed, at their measured latency (diamonds)")


def _generations(points: Table, s: dict, scored: str, skipped: list[str]):
    """The best-per-generation figure of a search (None with a single generation)."""
    from nas.report_figures import best_per_generation, generations_figure

    workload = s.get("workload")  # the latency pareto.csv holds: the search's own limit on it, per budget
    by_label = {label: e["budgets_ms"][workload] for label, e in s.get("budgets", {}).items()
                if workload in e.get("budgets_ms", {})}
    g = best_per_generation(points.dicts(), by_label)
    if g.skipped:
        skipped.append(f"pareto.csv: {g.skipped:,} rows whose generation, loss or latency is not a number a figure can "
                       "place: not plotted")
    if not g.budgets or max(len(line) for line in g.budgets.values()) < 2:
        return None
    table_rows = [[label, gen, best, so_far] for label, line in g.budgets.items() for gen, best, so_far in line]
    data = drawn(lambda: generations_figure(g, cut(scored, 200)), "the best per generation", skipped)
    return {"figure": data and figure_of(data, "the search's best per generation",
                                         "the best loss of each generation under the search's limit (dots) and the "
                                         "best so far (line): where the line goes flat, more generations found nothing "
                                         "better"),
            "table": table(["budget", "generation", "best of the generation", "best so far"], table_rows)}


def verify_section(page: Page, base: str) -> None:
    """``verify.json``: per budget, each candidate's predicted and measured latency, which held, which was kept."""
    skipped: list[str] = []
    rel = f"{base}/verify.json" if base else "verify.json"
    doc, _ = document(page, rel, VERIFY, skipped)
    if doc is None:
        if skipped:
            page.add("Verification on the device", "verify.html", skipped, doc=None, budgets=[], rows=None, flags=[])
        return
    page.shown.add(f"{base}/verify.csv" if base else "verify.csv")
    budgets = []
    for label, b in doc.get("budgets", {}).items():
        checks = b.get("checks", [])
        kept = next((c for c in checks if c.get("kept")), None)
        errors = [abs(c["error_pct"]) for c in checks if _finite(c.get("error_pct"))]
        budgets.append({"label": label, "budget_ms": b.get("budget_ms"), "n": len(checks), "kept": kept,
                        "errors": len(errors), "median_error": _median(errors)})
    rows = [[label, c.get("rank"), c.get("loss_bpb"), c.get("predicted_ms"), c.get("measured_ms"), c.get("error_pct"),
             c.get("holds"), c.get("kept"), c.get("flags", ""), cell(_subnet_text(c.get("subnet")), "subnet")]
            for label, b in doc.get("budgets", {}).items() for c in b.get("checks", [])]
    flags = _flags_in([c.get("flags", "") for b in doc.get("budgets", {}).values() for c in b.get("checks", [])])
    page.add("Verification on the device", "verify.html", skipped, doc=doc, budgets=budgets, flags=flags,
             rows=table(["budget", "rank", "loss", "predicted ms", "measured ms", "error %", "holds", "kept", "flags",
                         "subnet"], rows, cls="compact"))


def _median(values: list[float]) -> float | None:
    if not values:
        return None
    v = sorted(values)
    n = len(v)
    return v[n // 2] if n % 2 else (v[n // 2 - 1] + v[n // 2]) / 2


def hurdles(page: Page, base: str) -> None:
    entries, _ = page.run.entries(base)
    files = [e for e in entries if e.name.startswith("hurdles") and _listed(e)]
    if not files:
        return
    views = [(None, printable(e.name), file_view(page.run, e.rel)) for e in files]
    page.shown.update(e.rel for e in files)
    page.add("Hurdles", "files.html", [], views=views)


# --------------------------------------------------------------------------- a model's card


def card_section(page: Page, base: str, heading: str = "Model card") -> None:
    skipped: list[str] = []
    rel = f"{base}/model_card.json" if base else "model_card.json"
    card, raw = document(page, rel, CARD, skipped)
    if card is None:
        if not skipped:
            skipped.append(f"{page.run.display(rel)}: not there (the export has not run)")
        page.add(heading, "card.html", skipped, card=None, raw=None, flags=[])
        return
    v = card.get("validation", {})
    scope = (f"{fmt(v['windows'])} held-out windows x {fmt(v.get('seq_len'))} tokens" if "windows" in v
             else f"{fmt(v.get('examples'))} held-out examples")
    page.add(heading, "card.html", skipped, card=card, scope=scope, raw=value_view(raw),
             flags=_flags_in(card.get("measured", {}).get("flags", [])))


def _model(page: Page) -> None:
    card_section(page, "")
    _reproduce(page, "model")


# --------------------------------------------------------------------------- a predictor


def _predictor(page: Page) -> None:
    predictor_section(page, "")
    _reproduce(page, "predictor")


def predictor_section(page: Page, base: str) -> None:
    """The predictor's figure and its agreement with the measurements (held-out, test-retest: the noise floor)."""
    skipped: list[str] = []
    rel = f"{base}/predictor.json" if base else "predictor.json"
    doc, _ = document(page, rel, PREDICTOR, skipped)
    if doc is None:
        if skipped:
            page.add("Latency predictor", "predictor.html", skipped, doc=None, plot=None, rows=None)
        return
    plot = None
    png_rel = f"{base}/predicted_vs_measured.png" if base else "predicted_vs_measured.png"
    if page.run.what(png_rel) != "missing":
        page.shown.add(png_rel)
        try:
            plot = image(page.run, png_rel, "held-out subnets: predicted against measured latency, with the ±10% band; "
                                            "re-measured subnets (test-retest) beside them")
        except Unreadable as e:
            skipped.append(str(e))
    metrics = doc.get("metrics", {})
    labels = {"held_out": f"held-out, {metrics.get('chosen', '?')}", "held_out_vs_retest": "held-out vs re-measured",
              "test_retest": "test-retest (the noise floor)"}
    rows = [[f"cv {k}", *_agreement(m)] for k, m in metrics.get("cv", {}).items()]
    rows += [[label, *_agreement(metrics[k])] for k, label in labels.items() if k in metrics]
    page.add("Latency predictor", "predictor.html", skipped, doc=doc, plot=plot,
             rows=table(["", "n", "RMSE ms", "MAPE %", "within ±5%", "within ±10%", "Kendall tau"], rows) if rows else None)


def _agreement(m: dict) -> list:
    def pct(k: str) -> Any:
        return round(100 * m[k], 2) if k in m and _finite(m[k]) else "-"

    return [m.get("n", "-"), m.get("rmse_ms", "-"), pct("mape"), pct("within_5"), pct("within_10"), m.get("kendall_tau", "-")]


# --------------------------------------------------------------------------- a training run


def _training(page: Page) -> None:
    training_section(page, "", "Learning curve (log.jsonl)")
    _reproduce(page, "training")


def training_section(page: Page, base: str, heading: str) -> None:
    """The learning curve of ``base/log.jsonl`` (its last :data:`MAX_LOG` bytes): training loss and held-out score per
    step, with the first and last held-out scores in a table."""
    from nas.report_figures import curves, learning_curve

    rel = f"{base}/log.jsonl" if base else "log.jsonl"
    if page.run.what(rel) == "missing":
        return
    skipped: list[str] = []
    try:
        data, size = page.run.tail(rel, MAX_LOG)
    except Unreadable as e:
        page.add(heading, "training.html", [str(e)], plot=None, rows=None)
        return
    page.shown.add(rel)
    lines = data.decode("utf-8", errors="replace").splitlines()
    if size > len(data):
        lines = lines[1:]  # the first is cut
        skipped.append(f"{page.run.display(rel)}: {size:,} bytes; the curve is drawn from its last {MAX_LOG:,}")
    c = curves(lines)
    if c.skipped:
        skipped.append(f"{page.run.display(rel)}: {c.skipped:,} lines that are not the log's events: skipped")
    if c.empty:
        skipped.append(f"{page.run.display(rel)}: no training or held-out scores logged yet")
        page.add(heading, "training.html", skipped, plot=None, rows=None)
        return
    rows = [[name, pts[0][0], pts[0][1], pts[-1][0], pts[-1][1]] for name, pts in sorted(c.held_out.items())[:MAX_ROWS]]
    from nas.report_figures import METRICS

    metric = METRICS.get(c.metric, c.metric)
    page.add(heading, "training.html", skipped,
             plot=(data := drawn(lambda: learning_curve(c), "the learning curve", skipped)) and figure_of(
                 data, "the learning curve",
                              "; ".join(part for part, there in (
                                  ("the training loss per step as logged (nats per token)", any(c.train.values())),
                                  (f"the held-out {metric} of the subnets the run evaluates", any(c.held_out.values())))
                                  if there)),
             rows=table(["subnet", "first step", f"held-out {metric}", "last step", f"held-out {metric}"], rows)
             if rows else None)


# --------------------------------------------------------------------------- a demo run


def _demo(page: Page) -> None:
    skipped: list[str] = []
    s, raw = document(page, "summary.json", SUMMARY, skipped)
    if s is None and skipped:
        raise Unreadable(skipped[0])
    if not isinstance(raw, dict) or not isinstance(raw.get("found"), dict):
        raise UserError(f"{page.run.display('summary.json')}: not the summary of `nas demo` (no 'found' entry)")
    groups = distinct_baselines(s.get("baselines", []))
    comparison, comparison_skipped = _comparison(page)
    page.add("Result", "result.html", skipped, s=s, found=s.get("found", {}),
             subnet=_subnet_text(s.get("found", {}).get("subnet")), **_verdict(s, groups))
    if page.run.is_dir("search"):
        if page.run.what("search/search.json") != "missing":
            search_sections(page, "search", "Search: the Pareto front", baselines=groups)
    else:
        page.add("Search: the Pareto front", "files.html", [f"{page.run.display('search')}: {page.run.what('search')}, not "
                                                            "followed (the page shows only the run folder's own files)"],
                 views=[])
    predictor_section(page, "predictor")
    if comparison is not None or comparison_skipped:
        page.add("Comparison with the uniform baselines (comparison.csv)", "comparison.html", comparison_skipped,
                 anchor="comparison", **(comparison or {"table_": None, "flags": [], "merged": []}))
    card_section(page, "model")
    if page.run.what("supernet") != "missing":
        training_section(page, "supernet", "Training the supernet: the learning curve (supernet/log.jsonl)")
    if s.get("stage_seconds"):
        page.add("Stages", "stages.html", [], stages=table(["stage", "seconds"], [[k, v] for k, v in s["stage_seconds"].items()]),
                 plan=value_view(s["plan"]) if s.get("plan") else None)
    _reproduce(page, "demo", s)


def _comparison(page: Page) -> tuple[dict | None, list[str]]:
    """``comparison.csv`` as the page shows it: readable columns, one row per distinct model (identical baselines
    merged), the flags its timings carry explained; and what was left out."""
    rel = "comparison.csv"
    if page.run.what(rel) == "missing":
        return None, []
    try:
        t = page.run.csv(rel)
    except Unreadable as e:
        return None, [str(e)]
    page.shown.add(rel)
    groups = distinct_baselines([_typed_row(d) for d in t.dicts()])
    return ({"table_": comparison_table(groups, t.header), "merged": [g for g in groups if len(g["names"]) > 1],
             "flags": _flags_in([str(r.get("flags", "")) for g in groups for r in g["rows"]])}, list(t.notes))


def _typed_row(d: dict[str, str]) -> dict[str, Any]:
    """A row of comparison.csv with its numbers as numbers (what does not read as one: left as text)."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        num = _number_text(v) if ROW.get(k) is NUM else None
        out[k] = v if num is None else int(num) if k == "params" and num.is_integer() else num
    return out


def distinct_baselines(rows: list[dict]) -> list[dict]:
    """Rows grouped by model: two rows with the same parameter count and the same bits/byte on both sets of windows are
    one model under two names ("uniform softmax" and "uniform gqa:2" at 2 heads: 2 groups of 2 heads is softmax), and
    count once.  Each group: ``names``, ``rows``, and the first row's fields."""
    groups: list[dict] = []
    for r in rows:
        key = (r.get("params"), r.get("bpb"), r.get("search_bpb"))
        same = None
        if all(_finite(k) for k in key):
            same = next((g for g in groups if all(_finite(a) and abs(a - b) <= 1e-9 * max(1.0, abs(b))
                                                  for a, b in zip(g["key"], key))), None)
        if same is None:
            groups.append({**r, "key": key, "names": [str(r.get("name", "?"))], "rows": [r]})
        else:
            same["names"].append(str(r.get("name", "?")))
            same["rows"].append(r)
    return groups


# comparison.csv's columns as the page heads them: (header, the columns it shows)
COMPARISON = [("model", ("names",)), ("parameters", ("params",)), ("bits/byte (fresh windows)", ("bpb",)),
              ("bits/byte (the search's windows)", ("search_bpb",)), ("vs found: Δ bits/byte (paired SE)",
                                                                      ("vs_found_bpb", "vs_found_se")),
              ("predicted ms", ("predicted_ms",)), ("measured ms (IQR)", ("measured_ms", "measured_iqr_ms")),
              ("flags", ("flags",)), ("subnet", ("subnet",))]
COMPARISON_HIDDEN = {"name", "key", "bpb_windows", "search_windows"}  # in other columns, or in the headers


def comparison_table(groups: list[dict], header: list[str]) -> TableView:
    """The comparison with readable column names, one row per distinct model (identical baselines merged), the windows
    each score is on in its header; a column the demo does not write is shown as it is named."""
    windows = {k: next((g.get(k) for g in groups if _finite(g.get(k))), None) for k in ("bpb_windows", "search_windows")}
    heads = []
    for head, cols in COMPARISON:
        if not any(c in header for c in cols) and cols != ("names",):
            continue
        if cols == ("bpb",) and windows["bpb_windows"] is not None:
            head = f"bits/byte ({fmt(windows['bpb_windows'])} fresh windows)"
        if cols == ("search_bpb",) and windows["search_windows"] is not None:
            head = f"bits/byte (the search's {fmt(windows['search_windows'])} windows)"
        heads.append((head, cols))
    known = {c for _, cols in COMPARISON for c in cols} | COMPARISON_HIDDEN
    extra = [c for c in header if c not in known]
    rows = []
    for g in groups:
        row = []
        for _, cols in heads:
            if cols == ("names",):
                row.append(cell(" = ".join(g["names"]), ""))
            elif cols == ("vs_found_bpb", "vs_found_se"):
                d, se = g.get("vs_found_bpb"), g.get("vs_found_se")
                row.append(cell(f"{signed(d, 4)} ({bpb(se)})" if _finite(d) else "", "num"))
            elif cols == ("measured_ms", "measured_iqr_ms"):
                ms_list = [r.get("measured_ms") for r in g["rows"]]
                text = " / ".join(f"{m:.3f}" if _finite(m) else "?" for m in ms_list)
                iqr = g.get("measured_iqr_ms")
                row.append(cell(text + (f" ({iqr:.3f})" if _finite(iqr) else ""), "num"))
            elif cols == ("subnet",):
                row.append(cell(str(g.get("subnet", "")), "subnet"))
            elif cols == ("flags",):
                row.append(cell(str(g.get("flags", "")), ""))
            else:
                v = g.get(cols[0])
                row.append(cell(f"{v:.4f}" if cols[0] in ("bpb", "search_bpb") and _finite(v) else
                                f"{v:.3f}" if cols[0] == "predicted_ms" and _finite(v) else v if v is not None else ""))
        row.extend(cell(g["rows"][0].get(c, "")) for c in extra)
        rows.append(row)
    return table([h for h, _ in heads] + extra, rows, cls="compact comparison")


def _verdict(s: dict, groups: list[dict]) -> dict:
    """The comparison's verdict: the distinct baselines measured at or below the found model's latency (a model timed
    under two names counts once, at or below when either timing is)."""
    found_ms = s.get("found", {}).get("measured_ms")
    beaten = [g for g in groups if _finite(found_ms)
              and any(_finite(r.get("measured_ms")) and r["measured_ms"] <= found_ms for r in g["rows"])]
    names = sum(len(g["names"]) for g in beaten)
    return {"beaten": beaten, "names": names, "merged": [g for g in beaten if len(g["names"]) > 1]}


# --------------------------------------------------------------------------- how to reproduce the run


VERSION_KEYS = ("python", "torch", "onnxruntime")
PACKAGES = ("nas-transformers", "torch", "onnxruntime", "numpy", "optuna", "matplotlib", "jinja2")


def _reproduce(page: Page, kind: str, summary: dict | None = None) -> None:
    """The versions the run recorded (and those installed here now) and the commands that make such a run again."""
    import platform
    from importlib import metadata

    recorded: dict[str, list[tuple[str, str]]] = {}  # package: [(version, where)]

    def note(package: str, version: Any, where: str) -> None:
        if isinstance(version, str) and version:
            entry = (cut(version, 60), where)
            if entry not in recorded.setdefault(package, []):
                recorded[package].append(entry)

    prefixes = {"demo": ("search/", "predictor/", "model/"), "search": ("",), "model": ("",), "predictor": ("",),
                "training": ("",)}[kind]
    docs = {}
    for prefix in prefixes:
        for name, schema in (("search.json", SEARCH), ("verify.json", VERIFY), ("predictor.json", PREDICTOR),
                             ("model_card.json", CARD)):
            rel = prefix + name
            if page.run.is_file(rel):
                try:
                    problems: list[str] = []
                    docs[rel] = conform(page.run.json(rel), schema, name, problems) or {}
                except Unreadable:
                    continue
    for rel, doc in docs.items():
        note("nas-transformers", doc.get("nas_version"), rel)
        for part, d in (("device", doc.get("device")), ("fingerprint", doc.get("fingerprint")),
                        ("latency.device", doc.get("latency", {}).get("device")),
                        ("measured.device", doc.get("measured", {}).get("device"))):
            for k in VERSION_KEYS:
                note(k, (d or {}).get(k), f"{rel} ({part})")
        note("torch", doc.get("torch_program", {}).get("torch"), f"{rel} (torch_program)")
    here = {"python": platform.python_version()}
    for package in PACKAGES:
        try:
            here[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            here[package] = "not installed"
    names = list(dict.fromkeys([*PACKAGES[:1], "python", *PACKAGES[1:], *recorded]))
    versions = table(["package", "recorded by the run", "where", "installed here now"],
                     [[n, "; ".join(dict.fromkeys(v for v, _ in recorded.get(n, []))) or "-",
                       "; ".join(w for _, w in recorded.get(n, [])) or "-", here.get(n, "-")] for n in names])
    folder = page.run.display("")
    commands, notes = _commands(kind, folder, summary or {}, docs)
    commands.append(f"nas report {shlex.quote(folder)}    # this page")
    page.add("Reproduce", "reproduce.html", [], versions=versions, commands=commands, notes=notes)


def _commands(kind: str, folder: str, summary: dict, docs: dict[str, dict]) -> tuple[list[str], list[str]]:
    """The commands that make the run again, from what it recorded; and notes on what they cannot say."""
    q = shlex.quote
    notes: list[str] = []
    if kind == "demo":
        if summary.get("command"):
            return [summary["command"]], notes
        notes.append("summary.json records no command (a run of an earlier nas, or of a benchmark script that runs the "
                     "demo's stages): add --quick, --seed and --threads as the run had them (its plan: under Stages)")
        return [f"nas demo --out {q(folder)}"], notes
    if kind == "search":
        return [search_command(docs.get("search.json", {}), docs.get("verify.json"), folder)], [
            "SUPERNET and PREDICTOR: the files search.json names by their hashes (config.supernet, config.predictor)"]
    if kind == "model":
        card = docs.get("model_card.json", {})
        source = card.get("source", {}).get("supernet", "SUPERNET")
        return [f"nas export {q(source)} --subnet SUBNET.yaml --out {q(folder)}"], [
            "SUBNET.yaml: the subnet of model_card.json (the folder's subnet.yaml); add the --predictor, --format and "
            "--precision the export used"]
    if kind == "predictor":
        return [f"nas fit-predictor TIMINGS.csv --out {q(folder)}"], ["TIMINGS.csv: the timing table it was fitted on"]
    return [f"nas train-supernet SPACE --out {q(folder)}"], ["SPACE and the run's flags: its log.jsonl's first line (meta)"]


# search.json's settings and the search flags that set them
SEARCH_FLAGS = {"strategy": "--strategy", "seed": "--seed", "margin_pct": "--margin", "max_params": "--max-params"}
STRATEGY_FLAGS = {"population": "--population", "parents": "--parents", "mutations": "--mutations",
                  "crossovers": "--crossovers", "generations": "--generations", "mutate_prob": "--mutate-prob",
                  "selection": "--selection", "tournament_size": "--tournament-size", "max_tries": "--max-redraws"}
FITNESS_FLAGS = {"windows": "--val-windows", "seq_len": "--seq-len"}


def _arg(value: Any) -> str:
    """A number as a flag's value: an integer (or an integral float) without a decimal point, else its repr."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return str(value) if isinstance(value, int) else repr(float(value))


def search_command(s: dict, verify: dict | None, out: str) -> str:
    """The ``nas search`` command of a search's settings (``search.json``'s config): budgets, margin, strategy and
    its sizes, seed, the fitness windows, the verification; the supernet and predictor as placeholders."""
    q = shlex.quote
    config = s.get("config", {})
    parts = ["nas search SUPERNET --predictor PREDICTOR"]
    if config.get("budgets"):
        parts.append(f"--budget {q(','.join(config['budgets']))}")
    search = config.get("search", {})
    fitness = config.get("fitness", {})
    for source, flags in ((config, SEARCH_FLAGS), (search, STRATEGY_FLAGS), (fitness, FITNESS_FLAGS)):
        for key, flag in flags.items():
            v = source.get(key)
            if isinstance(v, str):
                parts.append(f"{flag} {q(v)}")
            elif _finite(v) and not (key == "margin_pct" and v == 0):
                parts.append(f"{flag} {_arg(v)}")
    if search.get("aging") is True:
        parts.append("--aging")
    if verify:
        device = (verify.get("device") or {}).get("device")
        n = max((len(b.get("checks", [])) for b in verify.get("budgets", {}).values()), default=0)
        if device:
            parts.append(f"--timing-target {q(device)} --verify-top {n}")
    parts.append(f"--out {q(out)}")
    return " ".join(parts)
