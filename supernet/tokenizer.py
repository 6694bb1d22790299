"""Subword vocabularies: byte-level BPE (Hugging Face ``tokenizers``), trained on a corpus's training split, nested,
cached like the corpus.

**Ids.**  Every vocabulary here has one layout: the byte ``b`` is id ``b`` (0-255), the task's special ids come next
(``base`` ids in all: 256 for a language model, 259 for translation's BOS / EOS / PAD), and the ``i``-th merge's new
token is id ``base + i``.  A byte model's ids are the same ids, so a BPE of no merge *is* the byte vocabulary.

**Nested.**  BPE training is greedy: merges are chosen one at a time, the most frequent pair first (ties broken by
the pair's ids), so training to a smaller size stops on a prefix of the same merges.  The vocabulary of size ``k`` is
therefore the ids below ``k`` of the largest one and its first merges (:meth:`Vocabulary.at`); the supernet's
embedding and output rows slice like every other width (``tests/supernet/test_tokenizer.py`` checks the prefix against
``tokenizers`` training at the smaller size).

**Deterministic.**  The trainer has no random choice; what could change its merges is pinned here: the training
text (the training split's documents in the split's seeded order, up to :data:`TRAIN_BYTES`), no normaliser, the
byte-level pre-tokeniser with GPT-2's pattern, the whole byte alphabet, ``min_frequency`` 2, no dropout (BPE dropout
samples), ``ignore_merges`` off.  The ``tokenizers`` version is part of the cache key.

**Every input is representable.**  Text that is not UTF-8 is cut at the invalid bytes, which are their own ids; the
valid runs go through the tokenizer.  Decoding concatenates each id's bytes, so ``decode(encode(b)) == b`` for any
``b``; a special id decodes to no byte.

**Fair units.**  :meth:`Vocabulary.token_lengths` is each id's length in bytes: a held-out loss summed over tokens
and divided by the bytes those tokens spell is bits per byte of text, whatever the vocabulary
(:class:`supernet.heldout.HeldOut`).
"""

from __future__ import annotations

import hashlib
import json
import shutil
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Callable, Iterable

import numpy as np

from search_spaces import UserError
from search_spaces.space import BYTES, MAX_VOCAB, TokenizerSpec

from .files import publish_dir, temp_dir

FORMAT = 1
FILE = "tokenizer.json"
TRAIN_BYTES = 32 << 20  # the BPE learns from at most this much of the training split (its first documents)
MIN_FREQUENCY = 2
MAX_FILE = 64 << 20  # a tokenizer.json larger than this is refused unread
SPECIAL_MARK = "\u27e8{}\u27e9"  # specials are named with characters no byte-level token contains: ⟨bos⟩


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte-level alphabet (the one ``tokenizers.pre_tokenizers.ByteLevel`` uses): byte -> printable character."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    chars, n = {}, 0
    for b in range(256):
        if b in keep:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + n)
            n += 1
    return chars


BYTE_CHARS = bytes_to_unicode()
CHAR_BYTES = {c: b for b, c in BYTE_CHARS.items()}


def _pre_tokenizer() -> dict:
    return {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": True}


def _document_texts(data: Iterable[bytes]) -> Iterable[str]:
    """The training texts (the trainer takes strings): invalid UTF-8 replaced, which only moves a count or two."""
    for doc in data:
        if doc:
            yield doc.decode("utf-8", errors="replace")


def train_merges(documents: Iterable[bytes], size: int, base: int) -> list[tuple[str, str]]:
    """The merges (pairs of byte-level strings, in order) of a BPE trained to ``size`` ids from ``base`` (bytes and
    specials): at most ``size - base`` of them; fewer where the text has no more pair of frequency 2."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=size - base + BYTES, min_frequency=MIN_FREQUENCY, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=[])
    tok.train_from_iterator(_document_texts(documents), trainer)
    merges = json.loads(tok.to_str())["model"]["merges"]
    return [tuple(m.split(" ", 1)) if isinstance(m, str) else (m[0], m[1]) for m in merges]


def tokenizer_json(merges: list[tuple[str, str]], base: int = BYTES, specials: tuple[str, ...] = ()) -> str:
    """The ``tokenizer.json`` of ``merges`` in this module's id layout (bytes, then ``specials`` up to ``base``, then
    each merge's new token); a merge whose result is already a token adds no id."""
    assert len(specials) == base - BYTES, (specials, base)
    vocab = {BYTE_CHARS[b]: b for b in range(BYTES)}
    for i, name in enumerate(specials):
        vocab[SPECIAL_MARK.format(name)] = BYTES + i
    for a, b in merges:
        vocab.setdefault(a + b, len(vocab))
    doc = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [],
        "normalizer": None,
        "pre_tokenizer": _pre_tokenizer(),
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": vocab, "merges": [[a, b] for a, b in merges]},
    }
    return json.dumps(doc, ensure_ascii=False, separators=(",", ":"))


def byte_tokenizer_json(base: int = BYTES, specials: tuple[str, ...] = ()) -> str:
    """The ``tokenizer.json`` of the byte vocabulary (no merge): what a byte model's folder carries."""
    return tokenizer_json([], base, specials)


@dataclass(frozen=True)
class Vocabulary:
    """A byte-level BPE in this module's id layout (see the module doc), from its ``tokenizer.json`` text."""

    text: str
    where: str = field(default="tokenizer.json", compare=False)

    @cached_property
    def doc(self) -> dict:
        return json.loads(self.text)

    @cached_property
    def ids(self) -> dict[str, int]:
        return self.doc["model"]["vocab"]

    @property
    def size(self) -> int:
        return len(self.ids)

    @property
    def merges(self) -> list[tuple[str, str]]:
        return [(a, b) for a, b in self.doc["model"]["merges"]]

    @cached_property
    def specials(self) -> tuple[str, ...]:
        """The names of the special ids (256 up to ``base``), as a task named them."""
        names = sorted((i, t) for t, i in self.ids.items() if i >= BYTES and t.startswith("\u27e8") and t.endswith("\u27e9"))
        return tuple(t[1:-1] for _, t in names)

    @property
    def base(self) -> int:
        """Ids before the first merge: the bytes and the specials."""
        return BYTES + len(self.specials)

    @property
    def kind(self) -> str:
        """``bytes`` (no merge) or ``bpe``."""
        return "bpe" if self.size > self.base else "bytes"

    @cached_property
    def sha256(self) -> str:
        return hashlib.sha256(self.text.encode()).hexdigest()

    @cached_property
    def tokenizer(self):
        from tokenizers import Tokenizer

        return Tokenizer.from_str(self.text)

    @cached_property
    def token_bytes(self) -> list[bytes]:
        """Each id's bytes (a special's: none)."""
        out = [b""] * self.size
        for token, i in self.ids.items():
            out[i] = b"" if self.base > i >= BYTES else bytes(CHAR_BYTES[c] for c in token)
        return out

    def token_lengths(self) -> np.ndarray:
        """(size,) int64: each id's length in bytes (0 for a special)."""
        return np.array([len(t) for t in self.token_bytes], dtype=np.int64)

    def at(self, size: int) -> "Vocabulary":
        """The nested vocabulary of ``size`` ids: the ids below it and the merges before the first that makes an id of
        ``size`` or more."""
        assert self.base <= size <= self.size, (size, self.base, self.size)
        ids, merges = self.ids, []
        for a, b in self.merges:
            made = ids[a + b]
            if made >= size:
                break
            merges.append((a, b))
            if made == size - 1:  # the last id of the size: training to ``size`` stops here
                break
        return Vocabulary(tokenizer_json(merges, self.base, self.specials), self.where)

    def encode(self, data: bytes) -> np.ndarray:
        """The ids of ``data`` (any bytes: invalid UTF-8 bytes are their own ids), (N,) int64."""
        out: list[int] = []
        for valid, piece in utf8_runs(data):
            if valid:
                out.extend(self.tokenizer.encode(piece.decode("utf-8"), add_special_tokens=False).ids)
            else:
                out.extend(piece)
        return np.asarray(out, dtype=np.int64)

    def encode_documents(self, documents: list[bytes]) -> list[np.ndarray]:
        """:meth:`encode` of each document (valid UTF-8 ones in one batch)."""
        valid = {}
        for i, d in enumerate(documents):
            try:
                valid[i] = d.decode("utf-8")
            except UnicodeDecodeError:
                pass
        batch = self.tokenizer.encode_batch(list(valid.values()), add_special_tokens=False) if valid else []
        done = {i: np.asarray(e.ids, dtype=np.int64) for i, e in zip(valid, batch)}
        return [done[i] if i in done else self.encode(d) for i, d in enumerate(documents)]

    def decode(self, ids: Iterable[int]) -> bytes:
        """The bytes ``ids`` spell (specials spell none)."""
        table = self.token_bytes
        return b"".join(table[int(i)] for i in ids)

    def describe(self) -> str:
        return "bytes" if self.kind == "bytes" else f"byte-level BPE of {self.size:,} ids"

    def metadata(self) -> str:
        """What an ONNX file's ``nas.tokenizer`` says of it: ``bytes`` (the bytes, and a task's specials: ``nas.specials``
        names them), or ``bpe:SIZE:sha256=HEX`` (the file's digest)."""
        return "bytes" if self.kind == "bytes" else f"{self.kind}:{self.size}:sha256={self.sha256}"


def utf8_runs(data: bytes) -> Iterable[tuple[bool, bytes]]:
    """``data`` cut into runs of valid UTF-8 (True) and of bytes that are not (False), in order."""
    start = 0
    while start < len(data):
        try:
            data[start:].decode("utf-8")
        except UnicodeDecodeError as e:
            if e.start:
                yield True, data[start:start + e.start]
            yield False, data[start + e.start:start + e.end]
            start += e.end
            continue
        yield True, data[start:]
        return


# --------------------------------------------------------------------------- reading a tokenizer.json


def read_vocabulary(path: str | Path, embedding: int | None = None, what: str = "tokenizer") -> Vocabulary:
    """A ``tokenizer.json`` checked: Hugging Face's format, a byte-level BPE of this layout (the bytes are ids 0-255, ids
    contiguous), and at most ``embedding`` ids (the model's rows); one line naming the file otherwise."""
    path = Path(path)
    try:
        if path.stat().st_size > MAX_FILE:
            raise UserError(f"{path}: {path.stat().st_size:,} bytes, larger than a {what} file can be ({MAX_FILE:,})")
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UserError(f"{path}: missing (the {what} of this model)") from None
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"{path}: not a readable tokenizer.json ({type(e).__name__})") from None
    return check_vocabulary(text, str(path), embedding)


def check_vocabulary(text: str, where: str, embedding: int | None = None) -> Vocabulary:
    """:func:`read_vocabulary` of the text of a file."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise UserError(f"{where}: not a tokenizer.json (not JSON: {e.msg} at line {e.lineno})") from None
    model = doc.get("model") if isinstance(doc, dict) else None
    if not isinstance(model, dict) or model.get("type") != "BPE" or not isinstance(model.get("vocab"), dict) \
            or not isinstance(model.get("merges"), list):
        raise UserError(f"{where}: not a tokenizer.json of a BPE (Hugging Face tokenizers' format: a model of type BPE "
                        "with a vocab and merges)")
    try:
        from tokenizers import Tokenizer

        Tokenizer.from_str(text)
    except Exception as e:  # noqa: BLE001 - the library's own refusal, whatever its type
        raise UserError(f"{where}: not a tokenizer.json that Hugging Face tokenizers reads ({str(e).splitlines()[0][:160]})"
                        ) from None
    vocab = Vocabulary(text, where)
    ids = sorted(vocab.ids.values())
    pre = doc.get("pre_tokenizer") or {}
    bytes_ok = all(vocab.ids.get(BYTE_CHARS[b]) == b for b in range(BYTES))
    if pre.get("type") != "ByteLevel" or not bytes_ok or ids != list(range(len(ids))) or len(ids) > MAX_VOCAB:
        raise UserError(f"{where}: not a byte-level BPE whose ids 0-255 are the bytes and whose ids are 0..N-1 (the layout "
                        "this tool trains and reads)")
    if embedding is not None and vocab.size > embedding:
        raise UserError(f"{where}: a vocabulary of {vocab.size:,} ids, larger than the model's embedding ({embedding:,} rows)")
    return vocab


# --------------------------------------------------------------------------- a corpus tokenized, cached


@dataclass(frozen=True)
class Tokens:
    """One split tokenized at each vocabulary size of a space: ``arrays[size]`` (N,) uint16, documents separated by the
    separator byte's id; ``lengths`` (largest size,) each id's bytes (a prefix serves each smaller size)."""

    arrays: dict[int, np.ndarray]
    lengths: np.ndarray

    def at(self, size: int) -> np.ndarray:
        return self.arrays[size]

    @property
    def sizes(self) -> tuple[int, ...]:
        return tuple(sorted(self.arrays))

    def __len__(self) -> int:
        """Tokens at the smallest size (the most: what a window count is checked against)."""
        return len(self.arrays[self.sizes[0]])


@dataclass(frozen=True)
class Tokenized:
    """A corpus (``supernet.data.Corpus``) read through a trained vocabulary: ``.train``, ``.val``, ``.test`` as
    :class:`Tokens`, ``.vocabulary`` (at the largest size), ``.meta`` (the corpus's, with ``tokenizer``), ``.hash`` (the
    corpus's: the text is the same), ``.path`` (the cache folder)."""

    train: Tokens
    val: Tokens
    test: Tokens
    vocabulary: Vocabulary
    meta: dict
    path: Path

    @property
    def hash(self) -> str:
        return self.meta["hash"]

    def bytes_per_token(self) -> dict[int, float]:
        """Each size's measured bytes per token on the validation split."""
        return self.meta["tokenizer"]["bytes_per_token"]

    def at(self, size: int) -> "Tokenized":
        """The corpus read at one vocabulary (a subnet trained on its own): its tokens alone, its ``vocabulary``."""
        one = {name: Tokens({size: getattr(self, name).at(size)}, getattr(self, name).lengths)
               for name in ("train", "val", "test")}
        return Tokenized(one["train"], one["val"], one["test"], self.vocabulary.at(size), self.meta, self.path)


def split_documents(tokens: np.ndarray, separator: int) -> list[bytes]:
    """A split's bytes (documents each followed by ``separator``) as its documents."""
    data = np.asarray(tokens, dtype=np.uint8).tobytes()
    docs = data.split(bytes([separator]))
    return docs[:-1] if docs and docs[-1] == b"" else docs


def cache_key(corpus_hash: str, spec: TokenizerSpec, specials: tuple[str, ...]) -> str:
    from tokenizers import __version__

    fields = {"format": FORMAT, "corpus": corpus_hash, "sizes": list(spec.sizes), "base": spec.base, "specials": list(specials),
              "train_bytes": TRAIN_BYTES, "min_frequency": MIN_FREQUENCY, "tokenizers": __version__}
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:16]


def training_documents(train: np.ndarray, separator: int, limit: int = TRAIN_BYTES) -> list[bytes]:
    """The documents the BPE learns from: the training split's, in its (seeded) order, up to ``limit`` bytes."""
    out, total = [], 0
    for doc in split_documents(train, separator):
        if total >= limit:
            break
        out.append(doc)
        total += len(doc)
    return out


def train_vocabulary(documents: list[bytes], spec: TokenizerSpec, specials: tuple[str, ...] = ()) -> Vocabulary:
    """The vocabulary at the largest size of ``spec``, trained on ``documents``; one line when they are too few."""
    largest = spec.sizes[-1]
    merges = train_merges(documents, largest, spec.base)
    vocab = Vocabulary(tokenizer_json(merges, spec.base, specials))
    if vocab.size < largest:
        raise UserError(f"tokenizer: the training split supports a vocabulary of {vocab.size:,} ids (no pair left twice), "
                        f"not {largest:,}: give more data or smaller sizes")
    return vocab


def encode_split(vocab: Vocabulary, split: np.ndarray, separator: int) -> np.ndarray:
    """A byte split (documents each followed by ``separator``) as ids of ``vocab``, uint16, each document still
    followed by the separator's id (a document's tokens never reach into the next)."""
    docs = split_documents(split, separator)
    parts = []
    for ids in vocab.encode_documents(docs):
        parts.append(ids)
        parts.append(np.array([separator], dtype=np.int64))
    out = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
    assert out.size == 0 or int(out.max()) < MAX_VOCAB
    return out.astype(np.uint16)


def _load(directory: Path, sizes: tuple[int, ...]) -> tuple[Vocabulary, dict, dict] | None:
    try:
        meta = json.loads((directory / "meta.json").read_text())
        vocab = Vocabulary((directory / FILE).read_text(encoding="utf-8"), str(directory / FILE))
        arrays = {split: {k: _map(directory / str(k) / f"{split}.bin") for k in sizes} for split in ("train", "val", "test")}
    except (OSError, ValueError, KeyError):
        return None
    counts = meta.get("tokens", {})
    ok = meta.get("format") == FORMAT and meta.get("sha256") == vocab.sha256 and all(
        counts.get(str(k), {}).get(split) == len(arrays[split][k]) for k in sizes for split in arrays)
    return (vocab, meta, arrays) if ok else None


def _map(path: Path) -> np.ndarray:
    return np.memmap(path, dtype=np.uint16, mode="r") if path.stat().st_size else np.zeros(0, dtype=np.uint16)


def tokenize_corpus(corpus, spec: TokenizerSpec, cache_dir: Path, specials: tuple[str, ...] = (),
                    progress: Callable[[str], None] | None = None) -> Tokenized:
    """``corpus`` (``supernet.data.Corpus``) tokenized at every size of ``spec``: the BPE trained on its training split
    once, cached under ``cache_dir/tokenizer/<key>/`` (the key: the corpus's hash, the sizes, the pinned settings and
    the ``tokenizers`` version), later calls only map it."""
    separator = int.from_bytes(bytes.fromhex(corpus.meta.get("separator", "00")), "little")
    key = cache_key(corpus.hash, spec, specials)
    root = Path(cache_dir) / "tokenizer"
    target = root / key
    loaded = _load(target, spec.sizes)
    if loaded is None:
        say = progress or (lambda text: None)
        say(f"training a byte-level BPE of {spec.sizes[-1]:,} ids on the training split")
        vocab = train_vocabulary(training_documents(corpus.train, separator), spec, specials)
        root.mkdir(parents=True, exist_ok=True)
        tmp = temp_dir(f".{key}.", root)
        try:
            counts, per = {}, {}
            for k in spec.sizes:
                at = vocab.at(k)
                (tmp / str(k)).mkdir()
                counts[str(k)] = {}
                for split in ("train", "val", "test"):
                    say(f"tokenizing the {split} split at {k:,} ids")
                    ids = encode_split(at, getattr(corpus, split), separator)
                    (tmp / str(k) / f"{split}.bin").write_bytes(ids.tobytes())
                    counts[str(k)][split] = len(ids)
                per[str(k)] = round(len(corpus.val) / max(1, counts[str(k)]["val"]), 6)
            (tmp / FILE).write_text(vocab.text, encoding="utf-8")
            from tokenizers import __version__

            meta = {"format": FORMAT, "corpus": corpus.hash, "sizes": list(spec.sizes), "base": spec.base,
                    "specials": list(specials), "sha256": vocab.sha256, "tokenizers": __version__,
                    "train_bytes": TRAIN_BYTES, "min_frequency": MIN_FREQUENCY, "tokens": counts, "bytes_per_token": per}
            (tmp / "meta.json").write_text(json.dumps(meta, indent=1))
            publish_dir(tmp, target, lambda d: _load(d, spec.sizes) is not None)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        loaded = _load(target, spec.sizes)
        assert loaded is not None, target
    vocab, meta, arrays = loaded
    lengths = vocab.token_lengths()
    record = {"kind": "bpe", "sizes": list(spec.sizes), "sha256": vocab.sha256,
              "bytes_per_token": {int(k): v for k, v in meta["bytes_per_token"].items()}, "key": key}
    split = {name: Tokens(arrays[name], lengths) for name in arrays}
    return Tokenized(split["train"], split["val"], split["test"], vocab, {**corpus.meta, "tokenizer": record}, target)
