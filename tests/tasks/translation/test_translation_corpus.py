"""The parallel corpus: gettext catalogs (split by catalog) and a user's TSV (split by line), cached with a hash."""

import struct

import numpy as np
import pytest

import tasks.translation.data as tr
from search_spaces import UserError
from tasks.translation.data import BOS, EOS, PAD, collate, length_batches, prepare_pairs, split_of

HEADER = "Content-Type: text/plain; charset=UTF-8\nPlural-Forms: nplurals=2; plural=(n != 1);\n"


def write_mo(path, entries):
    """A GNU .mo file of ``entries`` (msgid -> msgstr, both str; plurals joined by NUL, contexts by EOT)."""
    items = sorted({"": HEADER, **entries}.items(), key=lambda kv: kv[0].encode())
    ids = [k.encode() for k, _ in items]
    strs = [v.encode() for _, v in items]
    n = len(items)
    start = 7 * 4 + 16 * n
    table_ids, table_strs, blob = [], [], b""
    for s in ids:
        table_ids.append((len(s), start + len(blob)))
        blob += s + b"\0"
    for s in strs:
        table_strs.append((len(s), start + len(blob)))
        blob += s + b"\0"
    out = struct.pack("<7I", 0x950412DE, 0, n, 28, 28 + 8 * n, 0, 0)
    out += b"".join(struct.pack("<2I", *t) for t in table_ids + table_strs)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(out + blob)


def fake_locale(root, n_catalogs=30):
    """``n_catalogs`` German catalogs of 3 pairs each, plus one dropped of each kind, and a French one."""
    for c in range(n_catalogs):
        write_mo(root / "de" / "LC_MESSAGES" / f"prog{c:02d}.mo", {
            f"file {c} not found": f"Datei {c} nicht gefunden",
            f"menu\x04Open {c}": f"Öffnen {c}",  # a context is stripped
            f"one item {c}\x00%d items {c}": f"ein Element {c}\x00%d Elemente {c}",  # plural: the singular form
            f"OK {c}": f"OK {c}",  # identical: dropped
        })  # fmt: skip
    write_mo(root / "fr" / "LC_MESSAGES" / "prog.mo", {"Open": "Ouvrir"})
    (root / "xx" / "LC_MESSAGES").mkdir(parents=True)
    return root


def test_gettext_catalogs_split_by_catalog_cached_and_hashed(tmp_path, monkeypatch):
    root = fake_locale(tmp_path / "locale")
    corpus = prepare_pairs(None, tmp_path / "run", seed=1, locale_dir=root)
    meta = corpus.meta
    pairs = {s: set(corpus.split(s)) for s in ("train", "val", "test")}
    assert sum(map(len, pairs.values())) == 90 and meta["dropped"] == {"untranslated": 0, "identical": 30, "repeated": 0}
    assert (b"Open 3", "Öffnen 3".encode()) in set.union(*pairs.values())
    assert (b"one item 3", b"ein Element 3") in set.union(*pairs.values())
    # By catalog: each catalog's three pairs lie in the split its name hashes to, and nowhere else.
    for split, names in meta["files"].items():
        assert all(split_of(name, 1) == split for name in names)
        for name in names:
            c = int(name[4:6])
            assert (f"file {c} not found".encode(), f"Datei {c} nicht gefunden".encode()) in pairs[split]
    assert sorted(sum(meta["files"].values(), [])) == [f"prog{c:02d}.mo" for c in range(30)]
    assert [meta["sizes"][s]["pairs"] for s in ("train", "val", "test")] == [3 * len(meta["files"][s]) for s in tr.SPLITS]
    assert meta["corpus"] == "gettext:de" and len(meta["hash"]) == 64 and meta["specials"] == {"PAD": 256, "BOS": 257, "EOS": 258}

    monkeypatch.setattr(tr, "_write_split", lambda *a: (_ for _ in ()).throw(AssertionError("cache not reused")))
    again = prepare_pairs(None, tmp_path / "run", seed=1, locale_dir=root)
    assert again.path == corpus.path and again.hash == corpus.hash and list(again.test) == list(corpus.test)
    monkeypatch.undo()
    other = prepare_pairs(None, tmp_path / "run", seed=2, locale_dir=root)
    assert other.meta["files"] != meta["files"] and other.hash != corpus.hash
    # --lang fr reads fr's catalogs: one catalog cannot fill three splits, which is said in one line.
    with pytest.raises(UserError, match=r"^--lang fr: the catalogs give no pairs for the .* split\(s\) \(1 catalog\(s\) with"):
        prepare_pairs(None, tmp_path / "run", lang="fr", locale_dir=root)


def test_lang_without_catalogs_names_the_languages_that_have_some(tmp_path):
    root = fake_locale(tmp_path / "locale", n_catalogs=1)
    with pytest.raises(UserError) as e:
        prepare_pairs(None, tmp_path / "run", lang="xx", locale_dir=root)
    assert str(e.value) == (f"--lang xx: no gettext catalogs in {root}/xx/LC_MESSAGES (languages with catalogs on this "
                            "machine: de, fr)")  # fmt: skip


def test_tsv_split_by_line_and_its_bad_lines(tmp_path):
    tsv = tmp_path / "pairs.tsv"
    tsv.write_text("".join(f"source {i}\tZiel {i}\n" for i in range(50)) + "\n")
    corpus = prepare_pairs(str(tsv), tmp_path / "run", seed=0)
    got = sorted(list(corpus.train) + list(corpus.val) + list(corpus.test))
    assert got == sorted((f"source {i}".encode(), f"Ziel {i}".encode()) for i in range(50))
    assert [len(corpus.split(s)) for s in tr.SPLITS] == [40, 5, 5] and corpus.meta["corpus"] == "user"
    for text, message in (
        ("a\tb\nno tab here\n", "line 2 has no tab (expected source<TAB>target)"),
        ("a\tb\n\tb\n", "line 2 has an empty source (expected source<TAB>target, both non-empty)"),
        ("a\tb\nc\tb\nd\t \n", "line 3 has an empty target (expected source<TAB>target, both non-empty)"),
    ):
        tsv.write_text(text)
        with pytest.raises(UserError) as e:
            prepare_pairs(str(tsv), tmp_path / "run2", seed=0)
        assert str(e.value) == f"--data {tsv}: {message}"


def test_batches_group_similar_lengths_and_collate_pads(tmp_path):
    tsv = tmp_path / "pairs.tsv"
    rng = np.random.default_rng(0)
    tsv.write_text("".join(f"{'s' * int(n)}\t{'t' * int(m)}\n" for n, m in rng.integers(1, 40, size=(400, 2))))
    train = prepare_pairs(str(tsv), tmp_path / "run").train
    batches = length_batches(train, 16, 30, seed=0, epoch=0)
    kept = np.concatenate(batches)
    assert len(kept) == len(set(kept.tolist())) == int(((train.src_lengths <= 30) & (train.tgt_lengths <= 29)).sum())
    spread = np.mean([np.ptp(train.src_lengths[b]) for b in batches if len(b) == 16])
    assert spread <= 3  # sorted by source length: a batch's sources differ by a few bytes (random batches: ~25)
    assert [b.tolist() for b in length_batches(train, 16, 30, 0, 0)] == [b.tolist() for b in batches]
    assert [b.tolist() for b in length_batches(train, 16, 30, 0, 1)] != [b.tolist() for b in batches]
    src, inp, out = collate(train, batches[0][:2])
    a, b = train[int(batches[0][0])]
    assert src[0, : len(a)].tolist() == list(a) and inp[0, 0] == BOS and inp[0, 1 : len(b) + 1].tolist() == list(b)
    assert out[0, : len(b)].tolist() == list(b) and out[0, len(b)] == EOS and (out[0, len(b) + 1 :] == PAD).all()


def test_a_cache_published_by_another_process_meanwhile_is_kept_and_a_stale_one_replaced(tmp_path, monkeypatch):
    """Ranks of a distributed run prepare the same cache at once: one that finds the entry missing, builds it
    and then finds another's finished entry keeps that one (a rank may be reading it) instead of deleting it."""
    tsv = tmp_path / "pairs.tsv"
    tsv.write_text("".join(f"source {i}\tZiel {i}\n" for i in range(50)))
    first = prepare_pairs(str(tsv), tmp_path / "run")
    inode = first.path.stat().st_ino
    real, looks = tr._load, []

    def late(directory):  # the first look misses: the other process had not published yet
        looks.append(directory)
        return None if len(looks) == 1 else real(directory)

    monkeypatch.setattr(tr, "_load", late)
    second = prepare_pairs(str(tsv), tmp_path / "run")
    assert len(looks) >= 2 and second.path == first.path and second.path.stat().st_ino == inode
    assert second.hash == first.hash and list(second.train) == list(first.train)
    monkeypatch.setattr(tr, "_load", real)
    meta = first.path / "meta.json"
    meta.write_text(meta.read_text().replace('"format"', '"old_format"'))  # an entry of an older format
    third = prepare_pairs(str(tsv), tmp_path / "run")
    assert third.path == first.path and third.path.stat().st_ino != inode and third.hash == first.hash
    assert not [p.name for p in (tmp_path / "run" / "translation").iterdir() if p.name.startswith(".")]
