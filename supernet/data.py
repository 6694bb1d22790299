"""Byte-level corpora: find the documents, split them by document, cache them as memory-mapped tokens.

A token is a byte (vocabulary 256).  :func:`prepare_corpus` turns ``--data`` (a text
file, a directory of text files, a glob, or ``None`` for the embedded default corpus)
into three ``np.uint8`` memmaps, ``train``, ``val`` and ``test``.  The split is by
document: the documents are shuffled with ``seed``, the first ones, up to ``val_fraction``
of the bytes, go to validation (what training evaluates and the search scores on), the next
ones, up to ``test_fraction``, to test (what no search, hurdle or training ever sees: the
final comparisons), the rest to training.  Every document ends with :data:`DOC_SEPARATOR`
(NUL, which no text file contains: files with a NUL byte are skipped as binary).

The encoded corpus is cached under ``cache_dir/corpus/<key>/``, the key being a hash of
the inputs (each file's path, size and modification time, the seed and the fraction),
so a second run only stats the files and maps the cache.  ``meta.json`` beside the
tokens records the file list, the sha256 of the contents and the sizes.

The default corpus is the running Python's standard library: its ``.py`` sources
without the test suites, plus the ``pydoc_data`` help topics (one document per topic),
human-written code and prose under the PSF licence that every installation carries.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import shutil
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import numpy as np

from search_spaces import UserError
from supernet.files import publish_dir, temp_dir

CACHE_FORMAT = 2  # 2: a test split
TEST_FRACTION = 0.05
DOC_SEPARATOR = b"\x00"
DEFAULT_CORPUS = "python-stdlib"
DEFAULT_LICENCE = "PSF-2.0 (Python Software Foundation License; the LICENSE.txt of the standard library)"
TEST_DIRS = {"test", "tests", "idle_test"}
SKIP_DIRS = {"site-packages", "__pycache__", "lib-dynload"}
SINGLE_DOC_CHUNKS = 200  # a lone document is cut at line ends into about this many pieces for the split
MIN_CHUNK = 4096

Progress = Callable[[int, int], None]  # (bytes done, bytes total)


@dataclass(frozen=True)
class Document:
    """One unit of the split: a name (stable across machines) and how to read its bytes."""

    name: str
    path: Path | None  # None for documents that do not live in a file of their own
    size: int
    mtime_ns: int
    text: bytes | None = None

    def read(self) -> bytes:
        return self.text if self.text is not None else self.path.read_bytes()


@dataclass(frozen=True)
class Corpus:
    train: np.ndarray  # (N_train,) uint8 memmap
    val: np.ndarray  # (N_val,) uint8 memmap
    test: np.ndarray  # (N_test,) uint8 memmap; empty when the corpus had too few documents
    meta: dict
    path: Path  # the cache directory holding train.bin, val.bin, test.bin, meta.json

    @property
    def hash(self) -> str:
        return self.meta["hash"]


# --------------------------------------------------------------------------- finding documents


def default_documents() -> list[Document]:
    """The standard library's ``.py`` sources (no test suites) and the pydoc help topics."""
    root = Path(sysconfig.get_paths()["stdlib"]).resolve()
    docs = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in TEST_DIRS | SKIP_DIRS)
        for name in sorted(filenames):
            path = Path(dirpath) / name
            rel = path.relative_to(root).as_posix()
            if name.endswith(".py") and not name.startswith("_sysconfigdata") and rel != "pydoc_data/topics.py":
                st = path.stat()
                docs.append(Document(rel, path, st.st_size, st.st_mtime_ns))
    try:
        from pydoc_data.topics import topics  # stdlib data module: a dict of help texts
    except ImportError:  # some distributions strip it
        topics = {}
    for name in sorted(topics):
        text = topics[name].encode("utf-8")
        docs.append(Document(f"pydoc_data/topics.py#{name}", None, len(text), 0, text))
    return docs


def _is_text(path: Path) -> bool:
    with path.open("rb") as f:
        return DOC_SEPARATOR not in f.read(8192)


def _walk(directory: Path, exclude: Path | None) -> Iterator[Path]:
    for dirpath, dirnames, filenames in os.walk(directory):
        here = Path(dirpath)
        dirnames[:] = sorted(
            d for d in dirnames if not d.startswith(".") and (exclude is None or (here / d).resolve() != exclude)
        )
        for name in sorted(filenames):
            if not name.startswith("."):
                yield here / name


def absolute_data(data: str | None) -> str | None:
    """``--data`` as an absolute path or pattern, so a checkpoint's record works from any directory."""
    if data is None:
        return None
    return data if os.path.isabs(data) else os.path.join(os.getcwd(), data)


def find_documents(data: str | None, exclude: Path | None = None) -> tuple[list[Document], list[str]]:
    """The documents of ``--data`` and the names of skipped (binary or unreadable) files."""
    if data is None:
        return default_documents(), []
    if any(ch in data for ch in "*?["):
        matches = sorted(glob.glob(data, recursive=True))
        if not matches:
            raise UserError(f"--data {data!r}: the pattern matches no files")
        paths: list[Path] = []
        for m in map(Path, matches):
            if exclude is not None and m.resolve().is_relative_to(exclude):
                continue  # our own cache, when the pattern reaches into the run directory
            paths.extend(_walk(m, exclude) if m.is_dir() else [m])
        base = Path(os.path.commonpath([str(p.resolve()) for p in paths])) if paths else Path(".")
    else:
        root = Path(data)
        if not root.exists():
            raise UserError(f"--data {data}: no such file or directory")
        paths = list(_walk(root, exclude)) if root.is_dir() else [root]
        base = root.resolve() if root.is_dir() else root.resolve().parent
    docs, skipped = [], []
    for path in paths:
        try:
            if not path.is_file() or not _is_text(path):
                skipped.append(str(path))
                continue
            st = path.stat()
        except OSError:
            skipped.append(str(path))
            continue
        rel = path.resolve()
        name = rel.relative_to(base).as_posix() if rel.is_relative_to(base) and rel != base else path.name
        docs.append(Document(name, path, st.st_size, st.st_mtime_ns))
    if not any(d.size for d in docs):
        why = f" ({len(skipped)} binary or unreadable file(s) skipped)" if skipped else ""
        raise UserError(f"--data {data}: no non-empty text files found{why}")
    return docs, skipped


# --------------------------------------------------------------------------- split


def split_documents(
    docs: list[Document], seed: int, val_fraction: float, test_fraction: float = 0.0
) -> tuple[list[int], list[int], list[int]]:
    """Indices of train, validation and test documents: a seeded shuffle, validation first up to
    ``val_fraction`` of the bytes, then test up to ``test_fraction`` (none when fewer than three
    documents), the rest training (at least one document each for training and validation)."""
    order = [int(i) for i in np.random.default_rng(seed).permutation(len(docs))]
    total = sum(d.size for d in docs)

    def take(start: int, fraction: float, keep: int) -> int:
        """The end of the run of ``order`` from ``start`` that reaches ``fraction`` of the bytes, leaving ``keep``."""
        end, acc = start, 0
        while end < len(order) - keep and acc < fraction * total:
            acc += docs[order[end]].size
            end += 1
        return end

    v = take(0, val_fraction, 1)
    t = take(v, test_fraction, 1) if test_fraction > 0 and len(docs) >= 3 else v
    return order[t:], order[:v], order[v:t]


def chunk_document(doc: Document, n_chunks: int = SINGLE_DOC_CHUNKS) -> list[Document]:
    """Cut one document at line ends into about ``n_chunks`` pieces (so a single file can still be split)."""
    data = doc.read()
    target = max(MIN_CHUNK, len(data) // n_chunks)
    pieces, start = [], 0
    while start < len(data):
        end = min(len(data), start + target)
        nl = data.find(b"\n", end)
        end = len(data) if nl < 0 else nl + 1
        pieces.append(Document(f"{doc.name}@{start}", None, end - start, doc.mtime_ns, data[start:end]))
        start = end
    return pieces


# --------------------------------------------------------------------------- cache


def cache_key(
    docs: list[Document], data: str | None, seed: int, val_fraction: float, test_fraction: float = TEST_FRACTION
) -> str:
    h = hashlib.sha256()
    fields = {"format": CACHE_FORMAT, "data": data, "seed": seed, "val_fraction": val_fraction, "test_fraction": test_fraction}
    h.update(json.dumps(fields).encode())
    if data is None:
        h.update(sys.version.encode())
    for d in docs:
        h.update(f"{d.name}\0{d.path}\0{d.size}\0{d.mtime_ns}\n".encode())
    return h.hexdigest()[:16]


def _write(docs: list[Document], indices: list[int], path: Path, digest, progress: Callable[[int], None]) -> int:
    n = 0
    with path.open("wb") as f:
        for i in indices:
            data = docs[i].read()
            digest.update(docs[i].name.encode() + b"\0" + len(data).to_bytes(8, "little"))
            digest.update(data)
            f.write(data)
            f.write(DOC_SEPARATOR)
            n += len(data) + 1
            progress(len(data))
    return n


def _load(directory: Path) -> Corpus | None:
    try:
        meta = json.loads((directory / "meta.json").read_text())
        train = np.memmap(directory / "train.bin", dtype=np.uint8, mode="r")
        val = np.memmap(directory / "val.bin", dtype=np.uint8, mode="r")
        test = _map(directory / "test.bin")
    except (OSError, ValueError):
        return None
    sizes = meta.get("sizes", {})
    if meta.get("format") != CACHE_FORMAT or (sizes.get("train"), sizes.get("val"), sizes.get("test")) != (
        len(train),
        len(val),
        len(test),
    ):
        return None
    return Corpus(train, val, test, meta, directory)


def _map(path: Path) -> np.ndarray:
    """A memmap of the file, or an empty array for an empty file (numpy cannot map zero bytes)."""
    return np.memmap(path, dtype=np.uint8, mode="r") if path.stat().st_size else np.zeros(0, dtype=np.uint8)


def prepare_corpus(
    data: str | None,
    cache_dir: Path,
    seed: int = 0,
    val_fraction: float = 0.05,
    progress: Progress | None = None,
    test_fraction: float = TEST_FRACTION,
) -> Corpus:
    """Encode ``data`` once into ``cache_dir/corpus/<key>/`` and map it; later calls only map it."""
    if not 0.0 < val_fraction < 1.0:
        raise UserError(f"--val-fraction: {val_fraction} is not between 0 and 1 (exclusive)")
    if not 0.0 <= test_fraction < 1.0 - val_fraction:
        raise UserError(f"test fraction {test_fraction}: expected 0 <= it < 1 - val_fraction ({1.0 - val_fraction:g})")
    cache_root = Path(cache_dir) / "corpus"
    docs, skipped = find_documents(data, exclude=cache_root.resolve())
    docs = [d for d in docs if d.size]
    key = cache_key(docs, absolute_data(data), seed, val_fraction, test_fraction)
    target = cache_root / key
    cached = _load(target)
    if cached is not None:
        return cached

    unit = "document"
    if len(docs) < 2:
        docs, unit = chunk_document(docs[0]), "chunk"
    if len(docs) < 2:
        raise UserError(f"--data {data}: {docs[0].name} is too small to split into training and validation parts")
    train_idx, val_idx, test_idx = split_documents(docs, seed, val_fraction, test_fraction)
    total = sum(d.size for d in docs)
    done = 0

    def tick(n: int) -> None:
        nonlocal done
        done += n
        if progress is not None:
            progress(done, total)

    cache_root.mkdir(parents=True, exist_ok=True)
    tmp = temp_dir(f".{key}.", cache_root)  # published by a rename: 0777 less the umask
    try:
        digest = hashlib.sha256()
        n_train = _write(docs, train_idx, tmp / "train.bin", digest, tick)
        n_val = _write(docs, val_idx, tmp / "val.bin", digest, tick)
        n_test = _write(docs, test_idx, tmp / "test.bin", digest, tick)
        meta = {
            "format": CACHE_FORMAT,
            "corpus": DEFAULT_CORPUS if data is None else "user",
            "data": absolute_data(data),
            "licence": DEFAULT_LICENCE if data is None else None,
            "python": sys.version.split()[0] if data is None else None,
            "hash": digest.hexdigest(),
            "seed": seed,
            "val_fraction": val_fraction,
            "test_fraction": test_fraction,
            "split_unit": unit,
            "separator": DOC_SEPARATOR.hex(),
            "sizes": {
                "train": n_train,
                "val": n_val,
                "test": n_test,
                "train_docs": len(train_idx),
                "val_docs": len(val_idx),
                "test_docs": len(test_idx),
            },  # fmt: skip
            "files": {
                "train": [docs[i].name for i in train_idx],
                "val": [docs[i].name for i in val_idx],
                "test": [docs[i].name for i in test_idx],
            },  # fmt: skip
            "skipped": skipped,
        }
        (tmp / "meta.json").write_text(json.dumps(meta, indent=1))
        publish_dir(tmp, target, lambda d: _load(d) is not None)  # a damaged entry (see _load above) is replaced
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    corpus = _load(target)
    assert corpus is not None, target
    return corpus


def check_corpus(corpus: Corpus, expected_hash: str, where: str) -> None:
    """Refuse a corpus whose contents differ from the one ``where`` (a checkpoint) was trained on."""
    if corpus.hash != expected_hash:
        raise UserError(
            f"{where}: trained on corpus {expected_hash[:16]}, but the data now hashes to {corpus.hash[:16]} "
            f"(files changed since training; validation numbers would not be comparable)"
        )


# --------------------------------------------------------------------------- sampling


def sample_batch(tokens: np.ndarray, batch_size: int, seq_len: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """``batch_size`` random windows: inputs x and next-byte targets y, both (B, T) int64."""
    starts = rng.integers(0, len(tokens) - seq_len, size=batch_size)  # (B,)
    return windows(tokens, starts, seq_len)


def windows(tokens: np.ndarray, starts: np.ndarray, seq_len: int) -> tuple[np.ndarray, np.ndarray]:
    idx = starts[:, None] + np.arange(seq_len + 1)  # (B, T+1)
    w = np.asarray(tokens[idx], dtype=np.int64)  # (B, T+1)
    return w[:, :-1], w[:, 1:]


def batches(
    tokens: np.ndarray, batch_size: int, seq_len: int, generator: np.random.Generator
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Endless random batches from ``tokens`` drawn with ``generator``."""
    check_length(tokens, seq_len, "tokens")
    while True:
        yield sample_batch(tokens, batch_size, seq_len, generator)


def check_length(tokens: np.ndarray, seq_len: int, what: str) -> None:
    if len(tokens) < seq_len + 1:
        raise UserError(
            f"the {what} split has {len(tokens)} bytes, fewer than one window of --seq-len {seq_len} + 1; give more data or a "
            "shorter --seq-len"
        )
