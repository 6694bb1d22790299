import json
import os

import numpy as np
import pytest

import supernet.data as data_mod
from search_spaces import UserError
from supernet.data import DOC_SEPARATOR, batches, check_corpus, prepare_corpus, sample_batch


def write_docs(root, n=12, seed=0):
    """n small text documents with distinct, recognisable contents."""
    rng = np.random.default_rng(seed)
    root.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        words = " ".join(f"w{int(w)}" for w in rng.integers(0, 50, size=int(rng.integers(50, 400))))
        (root / f"doc{i:02d}.txt").write_text(f"document {i}\n{words}\n")
    return root


def docs_of(tokens):
    return [d for d in bytes(tokens).split(DOC_SEPARATOR) if d]


def test_directory_split_by_document_is_seeded_and_cached(tmp_path, monkeypatch):
    src = write_docs(tmp_path / "docs")
    (src / "image.bin").write_bytes(b"\x89PNG\x00\x01binary")
    (src / ".hidden.txt").write_text("hidden\n")
    corpus = prepare_corpus(str(src), tmp_path / "run", seed=3, val_fraction=0.2)

    # By document: every validation and test document is whole and in one split only.
    train_docs, val_docs, test_docs = docs_of(corpus.train), docs_of(corpus.val), docs_of(corpus.test)
    originals = {p.read_bytes() for p in src.glob("doc*.txt")}
    assert set(train_docs) | set(val_docs) | set(test_docs) == originals
    assert not set(train_docs) & set(val_docs) and not set(test_docs) & (set(train_docs) | set(val_docs))
    assert len(train_docs) + len(val_docs) + len(test_docs) == 12 and 1 <= len(val_docs) <= 4 and 1 <= len(test_docs) <= 2
    assert corpus.train.dtype == np.uint8 and isinstance(corpus.train, np.memmap)
    meta = corpus.meta
    assert [meta["sizes"][k] for k in ("train", "val", "test")] == [len(corpus.train), len(corpus.val), len(corpus.test)]
    names = meta["files"]["train"] + meta["files"]["val"] + meta["files"]["test"]
    assert sorted(names) == [f"doc{i:02d}.txt" for i in range(12)] and meta["test_fraction"] == 0.05
    assert meta["skipped"] == [str(src / "image.bin")] and meta["seed"] == 3 and len(meta["hash"]) == 64

    # Same inputs, same split and hash; a second call maps the cache without re-encoding.
    def no_rebuild(*args, **kwargs):
        raise AssertionError("the cache should have been reused")

    monkeypatch.setattr(data_mod, "_write", no_rebuild)
    again = prepare_corpus(str(src), tmp_path / "run", seed=3, val_fraction=0.2)
    assert again.path == corpus.path and again.hash == corpus.hash
    assert np.array_equal(again.val, corpus.val) and json.loads((corpus.path / "meta.json").read_text()) == meta
    monkeypatch.undo()

    # Another seed, another split (same contents, so the same multiset of documents).
    other = prepare_corpus(str(src), tmp_path / "run", seed=4, val_fraction=0.2)
    assert other.path != corpus.path and set(docs_of(other.val)) != set(val_docs)

    # A changed file is a cache miss with a new hash, and a checkpoint's hash check refuses it.
    (src / "doc00.txt").write_text("changed\n")
    changed = prepare_corpus(str(src), tmp_path / "run", seed=3, val_fraction=0.2)
    assert changed.path != corpus.path and changed.hash != corpus.hash
    with pytest.raises(UserError, match="ckpt.pt: trained on corpus .* but the data now hashes to"):
        check_corpus(changed, corpus.hash, "ckpt.pt")


def test_glob_and_single_file(tmp_path):
    src = write_docs(tmp_path / "docs", n=6)
    (src / "notes.md").write_text("# not matched\n")
    corpus = prepare_corpus(str(src / "*.txt"), tmp_path / "run", val_fraction=0.3)
    assert sum(len(corpus.meta["files"][k]) for k in ("train", "val", "test")) == 6

    # One file is cut at line ends into chunks so that it can still be split.
    single = tmp_path / "one.txt"
    single.write_text("".join(f"line {i} of a single long document\n" for i in range(20000)))
    corpus = prepare_corpus(str(single), tmp_path / "run", val_fraction=0.1)
    assert corpus.meta["split_unit"] == "chunk" and corpus.meta["sizes"]["val_docs"] >= 2
    pieces = docs_of(corpus.train) + docs_of(corpus.val) + docs_of(corpus.test)
    assert all(p.endswith(b"\n") for p in pieces)
    assert sum(map(len, pieces)) == single.stat().st_size
    total = len(corpus.train) + len(corpus.val) + len(corpus.test)
    assert 0.09 < len(corpus.val) / total < 0.12 and 0.04 < len(corpus.test) / total < 0.07


def test_default_corpus_is_the_stdlib_without_tests(tmp_path):
    corpus = prepare_corpus(None, tmp_path)
    meta = corpus.meta
    files = meta["files"]["train"] + meta["files"]["val"] + meta["files"]["test"]
    assert meta["corpus"] == "python-stdlib" and "PSF" in meta["licence"]
    assert "os.py" in files and "json/decoder.py" in files
    assert any(f.startswith("pydoc_data/topics.py#") for f in files)
    assert not any(part in ("test", "tests", "idle_test") for f in files for part in f.split("/")[:-1])
    assert 8e6 < meta["sizes"]["train"] + meta["sizes"]["val"] < 30e6
    again = prepare_corpus(None, tmp_path)
    assert again.path == corpus.path and again.hash == corpus.hash


def test_bad_data_arguments(tmp_path):
    with pytest.raises(UserError, match=r"--data .*nowhere: no such file or directory"):
        prepare_corpus(str(tmp_path / "nowhere"), tmp_path)
    with pytest.raises(UserError, match=r"--data '.*\*\.zzz': the pattern matches no files"):
        prepare_corpus(str(tmp_path / "*.zzz"), tmp_path)
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "blob").write_bytes(b"\x00\x01")
    with pytest.raises(UserError, match=r"no non-empty text files found \(1 binary or unreadable file\(s\) skipped\)"):
        prepare_corpus(str(empty), tmp_path)
    with pytest.raises(UserError, match="--val-fraction: 1.5 is not between 0 and 1"):
        prepare_corpus(None, tmp_path, val_fraction=1.5)


def test_damaged_cache_is_rebuilt(tmp_path):
    src = write_docs(tmp_path / "docs", n=4)
    corpus = prepare_corpus(str(src), tmp_path / "run", val_fraction=0.25)
    with open(corpus.path / "train.bin", "r+b") as f:
        f.truncate(10)
    rebuilt = prepare_corpus(str(src), tmp_path / "run", val_fraction=0.25)
    assert len(rebuilt.train) == corpus.meta["sizes"]["train"] and rebuilt.hash == corpus.hash
    assert not [p for p in os.listdir(tmp_path / "run" / "corpus") if p.startswith(".")]


def test_sampled_windows_are_shifted_targets(tmp_path):
    tokens = np.arange(1000, dtype=np.uint8)
    x, y = sample_batch(tokens, 8, 16, np.random.default_rng(0))
    assert x.shape == y.shape == (8, 16) and x.dtype == np.int64
    assert np.array_equal(x[:, 1:], y[:, :-1]) and np.all((y - x) % 256 == 1)
    a, b = next(batches(tokens, 8, 16, np.random.default_rng(0))), sample_batch(tokens, 8, 16, np.random.default_rng(0))
    assert np.array_equal(a[0], b[0])
    with pytest.raises(UserError, match="fewer than one window of --seq-len 16"):
        next(batches(tokens[:10], 8, 16, np.random.default_rng(0)))
