"""``nas classify``: the predicted label of each text, from a classifier written by ``nas finetune --task classify``."""

from __future__ import annotations

import argparse
import logging

from .registry import register_command

log = logging.getLogger(__name__)

NAME = "classify"
HELP = ("print the predicted label of each text (arguments, or a CSV's text column) with a classifier from "
        "`nas finetune --task classify`")
EXAMPLE = 'nas classify --model runs/classifier "the match ended one goal to nil"'


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("texts", nargs="*", metavar="TEXT", help="texts to classify (one label per line, in order)")
    p.add_argument("--model", required=True, metavar="DIR", help="a directory written by `nas finetune --task classify`")
    p.add_argument("--data", metavar="FILE.csv", help="classify the rows of this UTF-8 CSV (its --text-column); with a "
                   "--label-column present, also report the accuracy on stderr")
    p.add_argument("--text-column", default="text", metavar="NAME", help="the CSV column of the texts (default text)")
    p.add_argument("--label-column", default="label", metavar="NAME", help="the CSV column of the labels, if any (default label)")
    p.add_argument("--batch-size", type=int, default=64, metavar="N", help="texts per forward batch (default 64)")


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from nas.classify import csv_rows, load_classifier, read_csv_text, text_bytes
    from search_spaces import UserError
    from search_spaces.errors import tsv_field

    if bool(args.texts) == bool(args.data):
        raise UserError("give the texts to classify as arguments or --data FILE.csv (one of the two)")
    if args.batch_size < 1:
        raise UserError(f"--batch-size: {args.batch_size} is not a positive integer")
    model, classes, card = load_classifier(args.model)
    truth = None
    if args.data:
        path = Path(args.data)
        header, rows = csv_rows(path, read_csv_text(path), {args.text_column: "--text-column"})
        texts = [row.get(args.text_column) or "" for _, row in rows]
        if args.label_column in header:
            truth = [(row.get(args.label_column) or "").strip() for _, row in rows]
    else:
        texts = list(args.texts)
    predicted = model.predict(text_bytes(texts, card["seq_len"]), batch_size=args.batch_size)
    for i in predicted:  # one label a line: a newline, tab or backslash in a label is escaped
        print(tsv_field(classes[i]))
    if truth is not None:
        right = sum(classes[i] == t for i, t in zip(predicted, truth))
        log.info("accuracy %.4f (%d of %d rows of %s match column %r)", right / max(1, len(truth)), right, len(truth),
                 args.data, args.label_column)
    return 0


register_command(__name__)
