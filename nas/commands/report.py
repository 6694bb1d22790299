"""``nas report``: one self-contained HTML page of a run folder (a demo, a search, an export, a benchmark's files)."""

from __future__ import annotations

import argparse
from .registry import register_command

NAME = "report"
HELP = ("one self-contained HTML page of a run folder (nas demo, nas search, nas export, a benchmark's results): its "
        "figures, tables, verdicts with their noise and the model card; nothing loaded from the network when viewed")
EXAMPLE = "nas report runs/demo        # writes runs/demo/report.html"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("folder", metavar="RUN_DIR", help="the folder: a demo run, a search's --out, an export, or any folder of "
                   "results (Markdown, JSON, CSV, PNG)")
    p.add_argument("--out", metavar="FILE", help="where to write the page (default RUN_DIR/report.html; inside RUN_DIR "
                   "only an .html file, never one of the files the page reads)")


def run(args: argparse.Namespace) -> int:
    from nas.report import PAGE, check_out, detect, write_report

    check_out(args.folder, args.out or f"{args.folder}/{PAGE}")  # before anything is read or written
    kind = detect(args.folder)
    path = write_report(args.folder, args.out)
    print(f"wrote {path} ({kind} folder; {path.stat().st_size:,} bytes, open it in a browser)")
    return 0


register_command(__name__)
