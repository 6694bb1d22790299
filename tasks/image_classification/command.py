"""``nas classify-image``: classify PNG files with an exported image classifier (``nas export`` of an
image-classification subnet): each file's class and probability, one line each, tab-separated (a tab, newline, carriage
return or backslash in a file or class name is written ``\\t``, ``\\n``, ``\\r``, ``\\\\``)."""

from __future__ import annotations

import argparse

NAME = "classify-image"
HELP = "classify PNG images with an exported image classifier (task image-classification)"
EXAMPLE = "nas classify-image runs/vision-model shoe.png coat.png --top 3"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", metavar="MODEL_DIR", help="a folder written by `nas export` of an image-classification subnet")
    p.add_argument("images", nargs="+", metavar="IMAGE.png", help="PNG files of the model's size and mode (grayscale / RGB)")
    p.add_argument("--top", type=int, default=1, metavar="K", help="the K most probable classes of each image (default 1)")


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from search_spaces import UserError
    from search_spaces.errors import tsv_field

    from .export import classify_files, load_vision_model

    if args.top < 1:
        raise UserError(f"--top: {args.top} is not a positive integer")
    model, card = load_vision_model(args.model)
    from supernet.files import file_problem

    for f in args.images:  # a folder, a FIFO (that would block) or a missing file: named as what it is
        problem = file_problem(f)
        if problem:
            raise UserError(f"{f}: {problem}; expected a PNG file")
    try:
        results = classify_files(model, card, [Path(f) for f in args.images], args.top)
    except ValueError as e:
        raise UserError(str(e)) from None
    for path, best in results:  # tab-separated: a tab, newline or backslash in a file or class name is escaped
        print(f"{tsv_field(path)}\t" + "\t".join(f"{tsv_field(name)}\t{p:.4f}" for name, p in best))
    return 0
