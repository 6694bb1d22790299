"""``nas data``: write a generated data set of the sequence-classification task (Long Range Arena's, offline).

``nas data listops|pathfinder|fmnist-pixels --out DIR [--n N] [--eval-n M] [--seed S]`` writes ``DIR/train.tsv``,
``val.tsv``, ``test.tsv`` (``label<TAB>space-separated tokens``, one example a line) and ``DIR/data.json`` (the
generator, its version, the seed, the sizes, the classes, the vocabulary, the count of each label per split,
each file's sha256).  Run again with the same settings it reads the folder back instead of generating again;
a folder holding other data is refused.  ``nas train-supernet SPACE --data DIR`` trains on it.
"""

from __future__ import annotations

import argparse

NAME = "data"
HELP = "write a generated sequence-classification data set (LRA's ListOps, Pathfinder-32, Fashion-MNIST pixels) as TSV"
EXAMPLE = "nas data listops --out data/listops --n 4000 --seed 0"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("generator", metavar="GENERATOR", help="listops, pathfinder or fmnist-pixels")
    p.add_argument("--out", required=True, metavar="DIR", help="the folder: train.tsv, val.tsv, test.tsv, data.json")
    p.add_argument("--n", type=int, metavar="N", help="training examples (default LRA's: 96,000 ListOps, 160,000 "
                   "Pathfinder, 54,000 Fashion-MNIST)")
    p.add_argument("--eval-n", type=int, metavar="M", help="validation and test examples each (default: LRA's ratio to "
                   "--n, at least 8)")
    p.add_argument("--seed", type=int, default=0, metavar="S", help="the generator's seed (default 0)")


def run(args: argparse.Namespace) -> int:
    from supernet.progress import progress_bar, show_progress
    from search_spaces import UserError

    from .data import generator, split_sizes, write_folder

    try:
        gen = generator(args.generator)
        split_sizes(gen, args.n, args.eval_n)  # refused before anything is written
    except ValueError as e:
        raise UserError(str(e)) from None
    bars = []  # opened when generating starts (a cached folder or a refusal shows none)

    def progress(done: int, total: int) -> None:
        if not bars:
            bars.append(progress_bar(total=total, desc=f"nas data {gen.name}", unit="ex", leave=False))
        bars[0].update(done - bars[0].n)

    try:
        record, cached = write_folder(gen.name, args.out, args.n, args.eval_n, args.seed,
                                      progress if show_progress() else None)
    except ValueError as e:
        raise UserError(str(e)) from None
    finally:
        for bar in bars:
            bar.close()
    how = "read back (cached: same generator, version, seed and sizes)" if cached else "written"
    print(f"{args.out}: {gen.name} v{record['version']} seed {record['seed']}, {how}")
    for split in ("train", "val", "test"):
        c = record["counts"][split]
        print(f"  {split:5s} {sum(c.values()):>7,} examples  labels " + " ".join(f"{k}:{v}" for k, v in c.items()))
    print(f"  {record['classes']} classes, vocabulary {record['vocabulary']}; {record['note']}")
    return 0
