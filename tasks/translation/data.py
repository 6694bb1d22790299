"""Parallel corpora for translation: sentence pairs as bytes, split, cached.

Bytes in, bytes out, as the language-model task: a source or target byte is a token 0..255, and
three special ids follow: :data:`PAD` (256, padding, ignored by the loss), :data:`BOS` (257, the
decoder's first input) and :data:`EOS` (258, the end of a target).  The vocabulary is
:data:`VOCAB_SIZE` (259); a ``task: seq2seq`` space says ``vocab_size: 259``.

The default corpus is the system's gettext catalogs: the English messages of every program and
their translations, ``/usr/share/locale/<lang>/LC_MESSAGES/*.mo`` read with Python's
:mod:`gettext` (``--lang``, default ``de``).  Each catalog's ``msgid -> msgstr`` entries become
pairs: the header entry is skipped, a plural entry gives its singular form, a message context
(``ctxt\\x04msgid``) is stripped, untranslated (empty) and identical pairs are dropped, repeats
within a catalog kept once.  The split is *by catalog*: a catalog's name hashed with the seed
picks train, val or test (80/10/10 of the catalogs), so a test sentence's program is never seen
in training.  ``--data pairs.tsv`` is a user's own corpus, ``source<TAB>target`` per line, split
by line (a seeded permutation, 80/10/10).

The pairs are cached under ``cache_dir/translation/<key>/`` (the key hashes the inputs: file
names, sizes and modification times, the seed, the format): per split a ``.bin`` of the bytes and
an ``.idx.npy`` of offsets, and ``meta.json`` with the file list, sizes and the sha256 of the
contents, as :mod:`supernet.data` does for the byte corpus.
"""

from __future__ import annotations

import gettext
import hashlib
import json
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from search_spaces import UserError
from supernet.files import publish_dir, temp_dir

PAD, BOS, EOS = 256, 257, 258
VOCAB_SIZE = 259
SPECIALS = {"PAD": PAD, "BOS": BOS, "EOS": EOS}
LOCALE_DIR = Path("/usr/share/locale")
DEFAULT_LANG = "de"
CACHE_FORMAT = 1
SPLITS = ("train", "val", "test")
FRACTIONS = (0.8, 0.1, 0.1)  # of the catalogs (gettext) or the lines (a TSV)

Pair = tuple[bytes, bytes]


# --------------------------------------------------------------------------- reading


def catalog_pairs(path: Path) -> tuple[list[Pair], dict[str, int]]:
    """The (English, translation) pairs of one ``.mo`` catalog, in msgid order, and what was dropped."""
    with open(path, "rb") as f:
        catalog = gettext.GNUTranslations(f)._catalog  # msgid -> msgstr; plurals: (msgid, n) -> msgstr
    dropped = {"untranslated": 0, "identical": 0, "repeated": 0}
    seen, pairs = set(), []
    for key in sorted(catalog, key=lambda k: (k, 0) if isinstance(k, str) else k):
        if isinstance(key, tuple):
            if key[1] != 0:
                continue  # plural forms after the first: the singular ([0]) stands for the entry
            msgid = key[0]
        else:
            msgid = key
        if msgid == "":
            continue  # the header entry (charset, plural rule, translators)
        src, tgt = msgid.split("\x04")[-1], catalog[key]  # drop a message context "ctxt\x04msgid"
        if not tgt:
            dropped["untranslated"] += 1
        elif src == tgt:
            dropped["identical"] += 1
        elif (src, tgt) in seen:
            dropped["repeated"] += 1
        else:
            seen.add((src, tgt))
            pairs.append((src.encode("utf-8"), tgt.encode("utf-8")))
    return pairs, dropped


def languages(locale_dir: Path = LOCALE_DIR) -> list[str]:
    """The languages with at least one ``.mo`` catalog under ``locale_dir``."""
    if not locale_dir.is_dir():
        return []
    return sorted(d.name for d in locale_dir.iterdir() if any((d / "LC_MESSAGES").glob("*.mo")))


LANG_NAME = re.compile(r"[A-Za-z]{2,8}(?:[_-][A-Za-z0-9]{1,8})*(?:\.[A-Za-z0-9-]{1,16})?(?:@[A-Za-z0-9]{1,16})?")


def check_lang(lang: object, flag: str = "--lang") -> str:
    """``lang`` if it is a locale's name (de, pt_BR, sr@latin, zh_CN.UTF-8), before it becomes part of a path: an empty
    value (which trained on the default language) or a path (``../../etc``) is one line, and nothing is read."""
    if not isinstance(lang, str) or not LANG_NAME.fullmatch(lang):
        raise UserError(f"{flag}: {str(lang)[:40]!r} is not a language name; expected a gettext locale such as de, fr, "
                        "pt_BR or sr@latin")
    return lang


def catalogs(lang: str, locale_dir: Path = LOCALE_DIR) -> list[Path]:
    """The ``.mo`` files of ``lang``; refuses a language without any, naming those that have some."""
    found = sorted((locale_dir / check_lang(lang) / "LC_MESSAGES").glob("*.mo"))
    if not found:
        have = languages(locale_dir)
        raise UserError(
            f"--lang {lang}: no gettext catalogs in {locale_dir / lang / 'LC_MESSAGES'} (languages with catalogs "
            f"on this machine: {', '.join(have) if have else 'none'})"
        )
    return found


def read_tsv(path: Path) -> list[Pair]:
    """The pairs of a ``source<TAB>target`` file (UTF-8 or any bytes); blank lines are skipped."""
    try:
        data = path.read_bytes()
    except OSError as e:
        raise UserError(f"--data {path}: cannot read: {e.strerror or e}") from None
    pairs, extra = [], []  # extra: lines of more than two fields (a third column would have become part of the target)
    for n, line in enumerate(data.split(b"\n"), 1):
        line = line.removesuffix(b"\r")
        if not line:
            continue
        if b"\t" not in line:
            raise UserError(f"--data {path}: line {n} has no tab (expected source<TAB>target)")
        if line.count(b"\t") > 1:
            extra.append((n, line.count(b"\t") + 1))
            continue
        src, tgt = line.split(b"\t", 1)
        for what, text in (("source", src), ("target", tgt)):
            if not text.strip():
                raise UserError(f"--data {path}: line {n} has an empty {what} (expected source<TAB>target, both non-empty)")
        pairs.append((src, tgt))
    if extra:
        (n, fields), more = extra[0], f" (and {len(extra) - 1:,} more lines)" if len(extra) > 1 else ""
        raise UserError(f"--data {path}: line {n}{more} has {fields} tab-separated fields; expected 2 (source<TAB>target): "
                        "keep the first two columns (cut -f1,2) or remove the tabs inside the texts")
    if len(pairs) < 3:
        raise UserError(f"--data {path}: {len(pairs)} pair(s); a corpus needs at least 3 (train, val and test)")
    return pairs


# --------------------------------------------------------------------------- split


def split_of(name: str, seed: int) -> str:
    """train, val or test for a catalog name: a uniform value from the hash of (seed, name) against 80/10/10."""
    u = int.from_bytes(hashlib.sha256(f"{seed}\0{name}".encode()).digest()[:8], "little") / 2**64
    return "train" if u < FRACTIONS[0] else "val" if u < FRACTIONS[0] + FRACTIONS[1] else "test"


def split_lines(n: int, seed: int) -> dict[str, np.ndarray]:
    """Line indices per split: a seeded permutation cut 80/10/10 (at least one line each)."""
    order = np.random.default_rng(seed).permutation(n)
    n_val = max(1, round(FRACTIONS[1] * n))
    n_test = max(1, round(FRACTIONS[2] * n))
    n_train = n - n_val - n_test
    return {"train": np.sort(order[:n_train]), "val": np.sort(order[n_train : n_train + n_val]),
            "test": np.sort(order[n_train + n_val :])}  # fmt: skip


# --------------------------------------------------------------------------- the corpus


class _Offsets:
    """What a split of pairs shares however it holds them: ``index`` (N, 4), each pair's source start and end and its
    target start and end in ``data``."""

    index: np.ndarray

    def __len__(self) -> int:
        return len(self.index)

    def __iter__(self):
        return (self[i] for i in range(len(self)))

    @property
    def src_lengths(self) -> np.ndarray:
        return self.index[:, 1] - self.index[:, 0]

    @property
    def tgt_lengths(self) -> np.ndarray:
        return self.index[:, 3] - self.index[:, 2]

    @property
    def unit_lengths(self) -> np.ndarray:
        """Each pair's target bytes and its EOS: what the training loop counts (a ``--tokens`` budget, tokens/s) and a
        loss per target byte is divided by, whatever the vocabulary reads them as."""
        return self.tgt_lengths.astype(np.int64) + 1

    def target_units(self, indices: np.ndarray) -> int:
        """What a loss over the pairs ``indices`` is divided by: their target bytes and one EOS each."""
        return int(self.unit_lengths[indices].sum())


@dataclass(frozen=True)
class Pairs(_Offsets):
    """One split: the bytes of every pair in one array and their offsets (N, 4): src start, end, tgt start, end."""

    data: np.ndarray  # (bytes,) uint8
    index: np.ndarray  # (N, 4) int64

    def __getitem__(self, i: int) -> Pair:
        a, b, c, d = (int(x) for x in self.index[i])
        return bytes(self.data[a:b]), bytes(self.data[c:d])


@dataclass(frozen=True)
class TokenPairs(_Offsets):
    """One split read at a joint subword vocabulary (``tokenizer: {bpe: N}``): the ids of every pair in one array and
    their offsets (N, 4), as :class:`Pairs` holds bytes; ``tgt_bytes`` (N,) each target's length in bytes, so that a
    loss stays per target byte.  A pair reads as two id arrays."""

    data: np.ndarray  # (tokens,) uint16
    index: np.ndarray  # (N, 4) int64
    tgt_bytes: np.ndarray  # (N,) int64

    def __getitem__(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        a, b, c, d = (int(x) for x in self.index[i])
        return np.asarray(self.data[a:b], dtype=np.int64), np.asarray(self.data[c:d], dtype=np.int64)

    @property
    def unit_lengths(self) -> np.ndarray:
        """Target bytes (not tokens) and one EOS per pair: a loss per target byte compares vocabularies, and a budget in
        target bytes buys the same text whatever the vocabulary."""
        return self.tgt_bytes.astype(np.int64) + 1


@dataclass(frozen=True)
class ParallelCorpus:
    train: Pairs
    val: Pairs
    test: Pairs
    meta: dict
    path: Path

    @property
    def hash(self) -> str:
        return self.meta["hash"]

    def split(self, name: str) -> Pairs:
        if name not in SPLITS:
            raise UserError(f"split {name!r}: expected one of {', '.join(SPLITS)}")
        return getattr(self, name)


def _inputs(data: str | None, lang: str, locale_dir: Path) -> list[Path]:
    if data is None:
        return catalogs(lang, locale_dir)
    from supernet.files import file_problem

    path = Path(data)
    problem = file_problem(path)
    if problem:
        raise UserError(f"--data {data}: {problem} (expected a source<TAB>target file)")
    return [path]


def _key(files: list[Path], data: str | None, lang: str, seed: int) -> str:
    h = hashlib.sha256(json.dumps({"format": CACHE_FORMAT, "data": data, "lang": lang, "seed": seed}).encode())
    for p in files:
        st = p.stat()
        h.update(f"{p.resolve()}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return h.hexdigest()[:16]


def _write_split(pairs: list[Pair], directory: Path, name: str, digest) -> dict[str, int]:
    index = np.zeros((len(pairs), 4), dtype=np.int64)
    at = 0
    with (directory / f"{name}.bin").open("wb") as f:
        for i, (src, tgt) in enumerate(pairs):
            for part in (src, tgt):
                digest.update(len(part).to_bytes(8, "little") + part)
                f.write(part)
            index[i] = (at, at + len(src), at + len(src), at + len(src) + len(tgt))
            at += len(src) + len(tgt)
    np.save(directory / f"{name}.idx.npy", index, allow_pickle=False)
    return {"pairs": len(pairs), "source_bytes": int(index[:, 1].sum() - index[:, 0].sum()) if len(pairs) else 0,
            "target_bytes": int(index[:, 3].sum() - index[:, 2].sum()) if len(pairs) else 0}  # fmt: skip


def _load(directory: Path) -> ParallelCorpus | None:
    try:
        meta = json.loads((directory / "meta.json").read_text())
        parts = {}
        for name in SPLITS:
            path = directory / f"{name}.bin"
            data = np.fromfile(path, dtype=np.uint8)
            parts[name] = Pairs(data, np.load(directory / f"{name}.idx.npy", allow_pickle=False))
    except (OSError, ValueError):
        return None
    if meta.get("format") != CACHE_FORMAT or any(meta["sizes"][n]["pairs"] != len(parts[n]) for n in SPLITS):
        return None
    return ParallelCorpus(parts["train"], parts["val"], parts["test"], meta, directory)


def prepare_pairs(
    data: str | None, cache_dir: Path, seed: int = 0, lang: str = DEFAULT_LANG, locale_dir: Path = LOCALE_DIR
) -> ParallelCorpus:
    """Read ``data`` (None: the gettext catalogs of ``lang``) once into ``cache_dir/translation/<key>/``; later calls load it."""
    data = None if data is None else os.path.abspath(data)
    files = _inputs(data, lang, locale_dir)
    root = Path(cache_dir) / "translation"
    key = _key(files, data, None if data else lang, seed)
    cached = _load(root / key)
    if cached is not None:
        return cached
    dropped = {"untranslated": 0, "identical": 0, "repeated": 0}
    parts: dict[str, list[Pair]] = {n: [] for n in SPLITS}
    names: dict[str, list[str]] = {n: [] for n in SPLITS}
    skipped = []
    if data is None:
        for path in files:
            try:
                pairs, why = catalog_pairs(path)
            except (OSError, UnicodeDecodeError, LookupError, ValueError) as e:  # a damaged or oddly encoded catalog
                skipped.append(f"{path.name}: {e}")
                continue
            for k, v in why.items():
                dropped[k] += v
            if pairs:
                split = split_of(path.name, seed)
                parts[split] += pairs
                names[split].append(path.name)
        empty = [n for n in SPLITS if not parts[n]]
        if empty:
            raise UserError(f"--lang {lang}: the catalogs give no pairs for the {', '.join(empty)} split(s) "
                            f"({sum(map(len, names.values()))} catalog(s) with pairs; seed {seed})")  # fmt: skip
    else:
        pairs = read_tsv(files[0])
        for name, idx in split_lines(len(pairs), seed).items():
            parts[name] = [pairs[i] for i in idx]
    root.mkdir(parents=True, exist_ok=True)
    tmp = temp_dir(f".{key}.", root)  # published by a rename: 0777 less the umask
    try:
        digest = hashlib.sha256()
        sizes = {n: _write_split(parts[n], tmp, n, digest) for n in SPLITS}
        meta = {
            "format": CACHE_FORMAT,
            "corpus": f"gettext:{lang}" if data is None else "user",
            "data": data,
            "lang": lang if data is None else None,
            "source_lang": "en" if data is None else None,
            "specials": SPECIALS,
            "vocab_size": VOCAB_SIZE,
            "hash": digest.hexdigest(),
            "seed": seed,
            "split_unit": "catalog" if data is None else "line",
            "fractions": dict(zip(SPLITS, FRACTIONS)),
            "sizes": sizes,
            "files": names if data is None else {n: [Path(data).name] for n in SPLITS},
            "file_sizes": {p.name: p.stat().st_size for p in files},
            "dropped": dropped,
            "skipped": skipped,
        }
        (tmp / "meta.json").write_text(json.dumps(meta, indent=1))
        publish_dir(tmp, root / key, lambda d: _load(d) is not None)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    corpus = _load(root / key)
    assert corpus is not None, root / key
    return corpus


def check_pairs(corpus: ParallelCorpus, expected_hash: str, where: str) -> None:
    """Refuse a corpus whose contents differ from the one ``where`` (a checkpoint) was trained on."""
    if corpus.hash != expected_hash:
        raise UserError(f"{where}: trained on corpus {expected_hash[:16]}, but the data now hashes to {corpus.hash[:16]}")


# --------------------------------------------------------------------------- batches


def length_batches(pairs: Pairs, batch_size: int, max_len: int, seed: int, epoch: int) -> list[np.ndarray]:
    """The batches (pair indices) of one epoch: pairs that fit ``max_len`` (source bytes; target bytes + 1),
    sorted by length with seeded ties, cut into runs of ``batch_size`` (similar lengths, little padding),
    in a seeded order.  A pure function of (seed, epoch): a resumed run draws the same batches."""
    src, tgt = pairs.src_lengths, pairs.tgt_lengths
    keep = np.flatnonzero((src <= max_len) & (tgt + 1 <= max_len) & (src > 0))
    rng = np.random.default_rng([seed, epoch])
    tie = rng.permutation(len(keep))
    order = keep[np.lexsort((tie, tgt[keep], src[keep]))]
    runs = [order[i : i + batch_size] for i in range(0, len(order), batch_size)]
    return [runs[i] for i in rng.permutation(len(runs))]


def _ids(text: bytes | np.ndarray) -> np.ndarray:
    """A side of a pair as ids: its bytes (a byte corpus), or the ids it already is (:class:`TokenPairs`)."""
    return np.frombuffer(text, dtype=np.uint8) if isinstance(text, bytes) else text


def collate(pairs: Pairs, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Source ids (B, S), decoder inputs BOS + target (B, T) and targets target + EOS (B, T), padded with PAD."""
    items = [pairs[int(i)] for i in indices]
    s = max(len(a) for a, _ in items)
    t = max(len(b) for _, b in items) + 1
    src = np.full((len(items), s), PAD, dtype=np.int64)
    inp = np.full((len(items), t), PAD, dtype=np.int64)
    out = np.full((len(items), t), PAD, dtype=np.int64)
    for row, (a, b) in enumerate(items):
        src[row, : len(a)] = _ids(a)
        tb = _ids(b)
        inp[row, 0], inp[row, 1 : len(b) + 1] = BOS, tb
        out[row, : len(b)], out[row, len(b)] = tb, EOS
    return src, inp, out


# --------------------------------------------------------------------------- a joint subword vocabulary


SPECIAL_NAMES = ("pad", "bos", "eos")  # ids 256, 257, 258 of every vocabulary (PAD, BOS, EOS)


def tokenize_pairs(corpus: ParallelCorpus, spec, cache_dir: Path, progress=None) -> ParallelCorpus:
    """``corpus`` read at a joint byte-level BPE (HAT's: one vocabulary for source and target): trained on the sentences
    of both sides of the *training* pairs (each sentence a document), PAD / BOS / EOS at 256-258 before the merges,
    cached under ``cache_dir/tokenizer/<key>/`` (:mod:`supernet.tokenizer`); the splits become :class:`TokenPairs`,
    ``.vocabulary`` the vocabulary and ``.meta["tokenizer"]`` its record (bytes per token on the validation targets)."""
    from supernet.tokenizer import Vocabulary, cache_key, train_vocabulary

    assert len(spec.sizes) == 1 and spec.base == VOCAB_SIZE, spec
    key = cache_key(corpus.hash, spec, SPECIAL_NAMES)
    root = Path(cache_dir) / "tokenizer"
    target = root / key
    loaded = _load_tokens(target)
    if loaded is None:
        if progress is not None:
            progress(f"training a joint byte-level BPE of {spec.sizes[0]:,} ids on the training pairs")
        sentences = [side for pair in corpus.train for side in pair]
        vocab = train_vocabulary(sentences, spec, SPECIAL_NAMES)
        root.mkdir(parents=True, exist_ok=True)
        tmp = temp_dir(f".{key}.", root)
        try:
            counts = {}
            for name in SPLITS:
                pairs = corpus.split(name)
                flat = [side for pair in pairs for side in pair]
                ids = vocab.encode_documents(flat)
                lengths = np.array([len(x) for x in ids], dtype=np.int64)
                ends = np.cumsum(lengths)
                starts = ends - lengths
                index = np.stack([starts[0::2], ends[0::2], starts[1::2], ends[1::2]], axis=1) if len(ids) else \
                    np.zeros((0, 4), dtype=np.int64)
                data = np.concatenate(ids).astype(np.uint16) if ids else np.zeros(0, dtype=np.uint16)
                (tmp / f"{name}.ids").write_bytes(data.tobytes())
                np.save(tmp / f"{name}.index.npy", index)
                np.save(tmp / f"{name}.tgt_bytes.npy", pairs.tgt_lengths.astype(np.int64))
                counts[name] = {"tokens": int(len(data)), "target_tokens": int((index[:, 3] - index[:, 2]).sum())}
            val = corpus.val
            bpt = float(val.tgt_lengths.sum()) / max(1, counts["val"]["target_tokens"])
            (tmp / "tokenizer.json").write_text(vocab.text, encoding="utf-8")
            meta = {"format": 1, "corpus": corpus.hash, "sha256": vocab.sha256, "sizes": list(spec.sizes), "counts": counts,
                    "bytes_per_token": {str(spec.sizes[0]): round(bpt, 6)}, "specials": list(SPECIAL_NAMES)}
            (tmp / "meta.json").write_text(json.dumps(meta, indent=1))
            publish_dir(tmp, target, lambda d: _load_tokens(d) is not None)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        loaded = _load_tokens(target)
        assert loaded is not None, target
    text, meta, splits = loaded
    vocab = Vocabulary(text, str(target / "tokenizer.json"))
    record = {"kind": "bpe", "sizes": meta["sizes"], "sha256": vocab.sha256, "key": key,
              "bytes_per_token": {int(k): v for k, v in meta["bytes_per_token"].items()}}
    return TokenizedCorpus(splits["train"], splits["val"], splits["test"], {**corpus.meta, "tokenizer": record}, target,
                           vocab)


def _load_tokens(directory: Path):
    try:
        meta = json.loads((directory / "meta.json").read_text())
        text = (directory / "tokenizer.json").read_text(encoding="utf-8")
        splits = {}
        for name in SPLITS:
            path = directory / f"{name}.ids"
            data = np.memmap(path, dtype=np.uint16, mode="r") if path.stat().st_size else np.zeros(0, dtype=np.uint16)
            splits[name] = TokenPairs(data, np.load(directory / f"{name}.index.npy"),
                                      np.load(directory / f"{name}.tgt_bytes.npy"))
    except (OSError, ValueError, KeyError):
        return None
    if any(meta["counts"][n]["tokens"] != len(splits[n].data) for n in SPLITS):
        return None
    return text, meta, splits


@dataclass(frozen=True)
class TokenizedCorpus(ParallelCorpus):
    """A :class:`ParallelCorpus` whose splits are :class:`TokenPairs` of ``vocabulary`` (a joint BPE)."""

    vocabulary: object = None
