"""The task's data: TSV files of ``label<TAB>space-separated tokens``, the generators that write them, the
vocabulary, and the encoded examples a run trains on.

A data folder (what ``nas data`` writes, or a user's own) holds ``train.tsv``, ``val.tsv`` (and ``test.tsv``)
and ``data.json``: the classes, the vocabulary (a list of symbols, or the name of a fixed one: ``listops``,
``pixels``), and for generated data the generator, its version, the seed, the sizes, the count of each label
per split and each file's sha256 (the cache's key and check).  A single TSV file (``--data FILE.tsv``) is a
user's own: its classes come from ``--classes``, its vocabulary is built from its rows, and a seeded share of
its rows is the validation split.

Token ids (the model's vocabulary): ``0 .. C-1`` the classes (predicted at the [CLS] position, never read),
``C`` the [CLS] token that starts every example, ``C + 1`` padding, ``C + 2 + i`` the vocabulary's symbol ``i``;
a space's ``vocab_size`` must hold ``C + 2 + len(symbols)``.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

import numpy as np

from search_spaces.errors import first_line, shown
from supernet.files import atomic_stream, atomic_write, file_problem, read_bounded
from supernet.heldout import IGNORE
from supernet.task import Examples

from . import fmnist, listops, pathfinder

SPLITS = ("train", "val", "test")
MAX_EXAMPLES = 1_000_000  # --n and --eval-n: about 6x LRA's largest split (Pathfinder's 160,000), 2-8 GB of TSV
LOCK = ".nas-data.lock"  # held while a run writes a folder: a second run into it is refused, not mixed in
OURS = {*(f"{s}.tsv" for s in SPLITS), "data.json", LOCK}  # what a `nas data` folder holds
FIXED = {"listops": listops.SYMBOLS, "pixels": pathfinder.SYMBOLS}  # the named vocabularies


@dataclass(frozen=True)
class Generator:
    """A generator of a data folder: its classes, vocabulary, longest sequence and LRA's split sizes."""

    name: str
    version: int
    classes: int
    vocabulary: str  # a key of FIXED
    max_length: int
    sizes: tuple[int, int, int]  # LRA's (train, val, test) examples
    note: str


GENERATORS = {
    "listops": Generator("listops", listops.VERSION, 10, "listops", listops.MAX_LENGTH - 1, (96_000, 2_000, 2_000),
                         "ListOps as LRA generates it (MIN, MAX, MED, SM; 10 arguments, depth 10, 500-2,000 tokens)"),
    "pathfinder": Generator("pathfinder", pathfinder.VERSION, 2, "pixels", pathfinder.SIZE ** 2, (160_000, 20_000, 20_000),
                            "Pathfinder-32 (contour length 14), generated with numpy"),
    "fmnist-pixels": Generator("fmnist-pixels", fmnist.VERSION, fmnist.CLASSES, "pixels", 784, (54_000, 6_000, 10_000),
                               fmnist.NOTE),
}


def generator(name: str) -> Generator:
    if name not in GENERATORS:
        raise ValueError(f"unknown generator {name!r}: one of {', '.join(GENERATORS)}")
    return GENERATORS[name]


def split_sizes(gen: Generator, n: int | None, eval_n: int | None) -> dict[str, int]:
    """(train, val, test) sizes: ``n`` training examples (default LRA's) and ``eval_n`` each for validation and test
    (default: LRA's ratio to ``n``, at least 8)."""
    train, val, test = gen.sizes
    n = train if n is None else n
    for flag, value in (("--n", n), ("--eval-n", eval_n)):
        if value is not None and value < 1:
            raise ValueError(f"{flag}: {value} is not a positive number of examples")
        if value is not None and value > MAX_EXAMPLES:
            raise ValueError(f"{flag}: {shown(value)} examples is over the limit of {MAX_EXAMPLES:,} (LRA's largest split is "
                             "160,000)")
    sizes = {"train": n, "val": eval_n or max(8, min(val, round(n * val / train))),
             "test": eval_n or max(8, min(test, round(n * test / train)))}
    if gen.name == "fmnist-pixels":
        if sizes["train"] + sizes["val"] > 60_000 or sizes["test"] > 10_000:
            raise ValueError(f"--n / --eval-n: {sizes} exceed Fashion-MNIST's 60,000 training and 10,000 test images")
    return sizes


Rows = list[tuple[int, list[str]]]


def generate(name: str, sizes: dict[str, int], seed: int, progress: Callable[[int, int], None] | None = None,
             lengths: tuple[int, int] | None = None) -> dict[str, Iterator[tuple[int, list[str]]]]:
    """The examples of each split, a pure function of (generator, its version, ``sizes``, ``seed``), as iterators to
    be read in the order train, val, test (one stream of draws: LRA's 96,000 ListOps or 200,000 Pathfinder images are
    never all in memory); ``lengths``: ListOps' (min, max) filter in place of LRA's 500-2,000 (a quick test's)."""
    gen = generator(name)
    total = sum(sizes[s] for s in SPLITS)
    if name == "fmnist-pixels":
        images, labels = fmnist.load("train")
        test_images, test_labels = fmnist.load("test")
        rng = np.random.default_rng([seed, 3])
        order, test_order = rng.permutation(len(images)), rng.permutation(len(test_images))
        n, v = sizes["train"], sizes["val"]
        return {"train": fmnist.examples(images, labels, order[:n]), "val": fmnist.examples(images, labels, order[n:n + v]),
                "test": fmnist.examples(test_images, test_labels, test_order[:sizes["test"]])}
    if gen.name == "listops":
        lo, hi = lengths or (listops.MIN_LENGTH, listops.MAX_LENGTH)
        stream = listops.rows(total, seed, min_length=lo, max_length=hi, progress=progress)
    else:
        if lengths is not None:
            raise ValueError(f"{name}: lengths are ListOps' only")
        stream = pathfinder.rows(total, seed, progress=progress)
    return {s: itertools.islice(stream, sizes[s]) for s in SPLITS}


# ---------------------------------------------------------------------------------------------- TSV files


def write_tsv(path: Path, rows: Iterable[tuple[int, list[str]]]) -> tuple[str, dict[str, int]]:
    """Write ``rows`` as ``label<TAB>tokens`` lines, one by one, whole or not at all (:func:`supernet.files.atomic_stream`:
    a new temporary file of a unique name beside ``path``, never a planted one or a link's target; removed on any failure,
    Ctrl-C and a full disk included); (their sha256, the count of each label)."""
    h, c = hashlib.sha256(), Counter()
    with atomic_stream(path) as f:
        for label, toks in rows:
            line = f"{label}\t{' '.join(toks)}\n".encode()
            h.update(line)
            f.write(line)
            c[str(label)] += 1
    return h.hexdigest(), dict(sorted(c.items(), key=lambda kv: int(kv[0])))


def read_tsv(path: str | Path, classes: int | None = None, symbols: set[str] | dict[str, int] | None = None,
             numbers: list[int] | None = None, encode_ids: bool = False) -> Rows:
    """The rows of a ``label<TAB>space-separated tokens`` file; ValueError naming the file and line of the first bad
    row: no label, a label that is not one of ``0 .. classes-1``, no tokens, a token outside ``symbols``.  Each row's
    line number is appended to ``numbers`` when given (blank lines are skipped).  With ``encode_ids`` (``symbols`` a
    dict symbol -> id) each row's tokens are its ids, an int16 array (LRA's sizes as strings would take gigabytes)."""
    path = Path(path)
    rows: Rows = []
    try:
        with open(path, encoding="utf-8") as f:
            for k, line in enumerate(f, 1):
                _row(path, k, line.rstrip("\n"), classes, symbols, encode_ids, rows, numbers)
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: cannot be read as UTF-8 text ({e})") from None
    if not rows:
        raise ValueError(f"{path}: no rows")
    return rows


def _row(path: Path, k: int, line: str, classes: int | None, symbols: Any, encode_ids: bool, rows: list,
         numbers: list[int] | None) -> None:
    """Check line ``k`` and append its row (see :func:`read_tsv`)."""
    if not line.strip():
        return
    label, tab, seq = line.partition("\t")
    if not tab or not label.strip():
        raise ValueError(f"{path} line {k}: no label (expected 'label<TAB>space-separated tokens')")
    try:
        y = int(label)
    except ValueError:
        raise ValueError(f"{path} line {k}: label {label!r} is not an integer") from None
    if y < 0 or (classes is not None and y >= classes):
        raise ValueError(f"{path} line {k}: label {y} is outside the declared classes 0..{(classes or 0) - 1}")
    toks = seq.split()
    if not toks:
        raise ValueError(f"{path} line {k}: label {y} has no tokens")
    if symbols is not None:
        bad = next((t for t in toks if t not in symbols), None)
        if bad is not None:
            raise ValueError(f"{path} line {k}: token {bad!r} is not in the vocabulary ({len(symbols)} symbols)")
    rows.append((y, np.array([symbols[t] for t in toks], dtype=np.int16) if encode_ids else toks))
    if numbers is not None:
        numbers.append(k)


def counts(rows: Rows) -> dict[str, int]:
    c: dict[str, int] = {}
    for y, _ in rows:
        c[str(y)] = c.get(str(y), 0) + 1
    return dict(sorted(c.items(), key=lambda kv: int(kv[0])))


def write_folder(name: str, out: str | Path, n: int | None = None, eval_n: int | None = None, seed: int = 0,
                 progress: Callable[[int, int], None] | None = None, lengths: tuple[int, int] | None = None
                 ) -> tuple[dict[str, Any], bool]:
    """Generate ``name``'s data into ``out`` (train.tsv, val.tsv, test.tsv, data.json); (its data.json, cached).

    A folder already holding the same (generator, version, seed, sizes), its files unchanged, is reused without
    generating again (``cached`` True); one holding other data, or files ``nas data`` did not write (no data.json: a
    user's own train.tsv), is refused (nothing is overwritten).  Everything is checked before the folder is made (the
    sizes, the generator's input: a damaged Fashion-MNIST file leaves no empty ``out``).  While a run writes, it holds
    ``out/.nas-data.lock``: a second run into the same folder is refused, never mixed in.  data.json is written first
    as a claim without checksums (a folder a killed run left is ours to write again) and last whole."""
    gen = generator(name)
    sizes = split_sizes(gen, n, eval_n)
    out = Path(out)
    key = {"generator": gen.name, "version": gen.version, "seed": seed, "sizes": sizes}
    if lengths is not None:
        key["lengths"] = list(lengths)
    held = _held(out, key)
    if held is not None:
        return held, True
    streams = generate(name, sizes, seed, progress, lengths)  # reads its inputs (Fashion-MNIST) before out is made
    out.mkdir(parents=True, exist_ok=True)
    from filelock import FileLock, Timeout

    lock = FileLock(out / LOCK, timeout=0)
    try:
        lock.acquire()
    except Timeout:
        raise ValueError(f"--out {out}: another `nas data` run is writing this folder now ({LOCK} is held); wait for it to "
                         "end, or choose another --out") from None
    try:
        held = _held(out, key)  # (written meanwhile by the run that held the lock before)
        if held is not None:
            return held, True
        sidecar = out / "data.json"
        atomic_write(sidecar, json.dumps({**key, "note": "being written by nas data (no checksums yet)"}, indent=1) + "\n")
        written = {s: write_tsv(out / f"{s}.tsv", streams[s]) for s in SPLITS}  # in this order: one stream of draws
        digests = {s: w[0] for s, w in written.items()}
        record = {**key, "classes": gen.classes, "vocabulary": gen.vocabulary,
                  "max_length": gen.max_length if lengths is None else lengths[1] - 1,
                  "counts": {s: written[s][1] for s in SPLITS}, "sha256": digests, "note": gen.note,
                  "format": "label<TAB>space-separated tokens, one example a line"}
        atomic_write(sidecar, json.dumps(record, indent=1) + "\n")
    finally:
        lock.release()
    return record, False


def _held(out: Path, key: dict[str, Any]) -> dict[str, Any] | None:
    """The data.json of ``out`` when it holds ``key``'s data whole (to be read back); None when there is nothing there
    yet, or an unfinished or damaged write of the same data (to be written again); ValueError for anything else: a file
    where the folder goes, a folder of other data, or of files ``nas data`` did not write."""
    if not out.exists() and not out.is_symlink():
        return None
    if not out.is_dir():
        raise ValueError(f"--out {out}: not a folder; choose a new or empty folder")
    sidecar = out / "data.json"
    if not sidecar.exists():
        theirs = sorted(p.name for p in out.iterdir() if p.name not in OURS and not _our_leftover(p.name))
        ours = sorted(p.name for p in out.iterdir() if p.name in OURS - {LOCK})
        if ours or theirs:
            listed = ", ".join((ours + theirs)[:4]) + (", ..." if len(ours + theirs) > 4 else "")
            raise ValueError(f"--out {out}: holds files nas data did not write ({listed}) and no data.json; choose a new or "
                             "empty folder")
        return None
    try:
        held = json.loads(read_bounded(sidecar, 1 << 20, "a data.json"))
    except ValueError as e:
        raise ValueError(f"{sidecar}: not readable JSON ({first_line(e)}); choose another --out") from None
    if not isinstance(held, dict) or {k: held.get(k) for k in key} != key:
        held = held if isinstance(held, dict) else {}
        raise ValueError(f"--out {out}: holds other data ({', '.join(f'{k} {str(held.get(k))[:80]}' for k in key)}); choose "
                         "another --out")
    digests = held.get("sha256")
    if isinstance(digests, dict) and all(_matches(out / f"{s}.tsv", digests.get(s)) for s in SPLITS):
        return held
    return None


def _matches(path: Path, digest: Any) -> bool:
    try:
        return path.is_file() and not path.is_symlink() and file_sha256(path) == digest
    except OSError:
        return False


def _our_leftover(name: str) -> bool:
    """A temporary file of ours a killed run left (``.train.tsv.k3j9a.tmp``: :func:`supernet.files.temp_file`)."""
    return name.startswith(".") and name.endswith(".tmp") and any(name.startswith(f".{o}.") for o in OURS)


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


# ---------------------------------------------------------------------------------------------- a run's data


def describe_source(data: str | None) -> str:
    return str(data) if data else "(none)"


def vocabulary(path: Path, classes: int | None) -> tuple[int, list[str], str]:
    """(classes, symbols, what) of the data at ``path``: a folder with data.json, or a user's TSV (``classes`` given;
    its symbols are the sorted distinct tokens of its rows)."""
    if path.is_dir():
        sidecar = path / "data.json"
        if not sidecar.is_file():
            raise ValueError(f"--data {path}: a folder without data.json (write one with `nas data`, or give a TSV file)")
        try:
            record = json.loads(read_bounded(sidecar, 1 << 20, "a data.json"))
        except ValueError as e:
            raise ValueError(f"{sidecar}: not JSON ({first_line(e)})") from None
        if not isinstance(record, dict):
            raise ValueError(f"{sidecar}: not a mapping of the data's fields")
        if record.get("generator") is not None and "sha256" not in record:
            raise ValueError(f"{sidecar}: written by a `nas data` run that did not finish; run it again")
        c = record.get("classes")
        if not isinstance(c, int) or c < 2:
            raise ValueError(f"{sidecar}: classes {c!r} is not an integer of at least 2")
        if classes is not None and classes != c:
            raise ValueError(f"--classes {classes}: {sidecar} declares {c}")
        voc = record.get("vocabulary")
        if isinstance(voc, str):
            if voc not in FIXED:
                raise ValueError(f"{sidecar}: vocabulary {voc!r} is not one of {', '.join(FIXED)} or a list of symbols")
            return c, list(FIXED[voc]), record.get("generator") or str(path)
        if voc is None:
            rows = read_tsv(path / "train.tsv", c)
            return c, sorted({t for _, toks in rows for t in toks}), str(path)
        if not isinstance(voc, list) or not all(isinstance(s, str) for s in voc):
            raise ValueError(f"{sidecar}: vocabulary is not a list of symbols")
        return c, list(voc), str(path)
    problem = file_problem(path)
    if problem:
        raise ValueError(f"--data {path}: {problem} (expected a folder written by `nas data`, or a TSV file)")
    if classes is None:
        raise ValueError(f"--data {path}: a TSV file of your own needs --classes N (its labels are 0..N-1)")
    if classes < 2:
        raise ValueError(f"--classes: {classes} is not at least 2")
    rows = read_tsv(path, classes)
    return classes, sorted({t for _, toks in rows for t in toks}), str(path)


@dataclass(frozen=True)
class Sequences(Examples):
    """Encoded examples: ``inputs`` (N, T) [CLS] then the tokens then padding; ``targets`` the label at position 0,
    :data:`IGNORE` elsewhere; ``lengths`` (N,) tokens of each row (without [CLS]); ``where``: each row's file and line."""

    lengths: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    where: tuple[str, ...] = ()
    classes: int = 0
    vocab: int = 0  # token ids the model must hold: classes + 2 + symbols

    def row(self, i: int) -> str:
        return self.where[i] if i < len(self.where) else f"row {i + 1}"


def token_ids(classes: int) -> dict[str, int]:
    return {"CLS": classes, "PAD": classes + 1}


def encode(rows: list, lines: list[str], classes: int, symbols: list[str], length: int) -> Sequences:
    """``rows`` (tokens, or their ids already: an array) as :class:`Sequences` padded to ``length`` tokens (+1 for [CLS])."""
    ids = {s: classes + 2 + i for i, s in enumerate(symbols)}
    x = np.full((len(rows), length + 1), classes + 1, dtype=np.int16)  # (N, T) padding
    x[:, 0] = classes  # [CLS]
    y = np.full(x.shape, IGNORE, dtype=np.int16)
    for i, (label, toks) in enumerate(rows):
        x[i, 1: 1 + len(toks)] = toks if isinstance(toks, np.ndarray) else [ids[t] for t in toks]
        y[i, 0] = label
    return Sequences(x, y, np.array([len(t) for _, t in rows], dtype=np.int64), tuple(lines), classes, classes + 2 + len(symbols))


@dataclass
class SequenceData:
    """A run's data (what :meth:`tasks.base.Task.prepare_data` returns): ``train`` and ``val`` :class:`Sequences`."""

    train: Sequences
    val: Sequences
    hash: str
    meta: dict[str, Any]
    path: Path
    test: Sequences | None = None


def load(settings: dict[str, Any], cache_dir: str | Path) -> SequenceData:
    """The data of a run's settings (``data``, ``data_seed``, ``val_fraction``, ``classes``, ``symbols``)."""
    path = Path(settings["data"])
    classes, symbols = settings["classes"], settings["symbols"]
    vocab = {sym: classes + 2 + i for i, sym in enumerate(symbols)}  # read as ids (see encode)
    if path.is_dir():
        rows, lines = {}, {}
        for s in SPLITS:
            if s == "test" and not (path / "test.tsv").is_file():
                continue
            numbers: list[int] = []
            rows[s] = read_tsv(path / f"{s}.tsv", classes, vocab, numbers, encode_ids=True)
            lines[s] = [f"{path / f'{s}.tsv'} line {k}" for k in numbers]
    else:
        numbers = []
        every = read_tsv(path, classes, vocab, numbers, encode_ids=True)
        order = np.random.default_rng([settings["data_seed"], 5]).permutation(len(every))
        n_val = max(1, int(round(len(every) * settings["val_fraction"])))
        if n_val >= len(every):
            raise ValueError(f"--data {path}: {len(every)} rows leave none for training at --val-fraction "
                             f"{settings['val_fraction']}")
        pick = {"val": order[:n_val], "train": order[n_val:]}
        rows = {s: [every[i] for i in idx] for s, idx in pick.items()}
        lines = {s: [f"{path} line {numbers[i]}" for i in idx] for s, idx in pick.items()}
    length = max(len(t) for r in rows.values() for _, t in r)
    encoded = {s: encode(r, lines[s], classes, symbols, length) for s, r in rows.items()}
    h = hashlib.sha256(json.dumps([classes, symbols]).encode())
    for s in ("train", "val"):
        h.update(encoded[s].inputs.tobytes())
        h.update(encoded[s].targets.tobytes())
    meta = {"corpus": f"{describe_source(settings['data'])} ({classes} classes, {len(symbols)} symbols)",
            "sizes": {s: len(e) for s, e in encoded.items()}, "length": length}
    return SequenceData(encoded["train"], encoded["val"], h.hexdigest(), meta, Path(cache_dir), encoded.get("test"))
