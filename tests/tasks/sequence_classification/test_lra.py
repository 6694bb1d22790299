"""Long Range Arena's data, offline (issue 41): the generators, the TSV files, ``nas data`` and its cache."""

import gzip
import json
from collections import Counter

import numpy as np
import pytest

from nas.cli import main
from tasks.sequence_classification import data, fmnist, listops, pathfinder


# ---------------------------------------------------------------------------------------------- ListOps


@pytest.fixture(scope="module")
def examples():
    return listops.generate(300, seed=3)


def test_listops_reproduces_lras_distribution(examples):
    lengths = [len(t) for _, t in examples]
    assert min(lengths) > 500 and max(lengths) < 2000  # LRA's filter: 500 < length < 2000
    assert all(set(t) <= set(listops.SYMBOLS) for _, t in examples)
    # every label is the true value of its expression, by an evaluator independent of the generator's trees
    assert all(listops.evaluate(t) == label for label, t in examples)
    assert set(Counter(label for label, _ in examples)) == set(range(10))  # all 10 classes present
    assert len({tuple(t) for _, t in examples}) == len(examples)  # distinct, as LRA's set
    assert all(t.count(listops.END) == sum(t.count(op) for op in listops.OPERATORS) for _, t in examples)


def lra_style(n: int, seed: int) -> list[tuple[int, int]]:
    """(value, length) of ``n`` trees drawn as LRA's listops.py draws them, written here independently in its own style:
    Python's ``random``, left-nested pairs, values computed through unsaturated functions."""
    import random

    ops, end = ["[MIN", "[MAX", "[MED", "[SM"], "]"
    r = random.Random(seed)

    def tree(depth):
        if (r.random() if depth < 10 else 1) > 0.25:
            return r.choice(range(10)), 1
        values, length = [], 2
        for _ in range(r.randint(2, 10)):
            t, n = tree(depth + 1)
            values.append(t)
            length += n
        t = (r.choice(ops), values[0])
        for v in values[1:]:
            t = (t, v)
        return (t, end), length

    def value(t):
        if not isinstance(t, tuple):
            return t
        left, right = value(t[0]), value(t[1])
        if left in ops:
            return (left, [right])
        if right == end:
            f, args = left
            return {"[MIN": min, "[MAX": max, "[MED": lambda a: int(np.median(a)), "[SM": lambda a: sum(a) % 10}[f](args)
        return (left[0], left[1] + [right])

    out, seen = [], set()
    while len(out) < n:
        t, length = tree(1)
        if 500 < length < 2000 and repr(t) not in seen:
            seen.add(repr(t))
            out.append((value(t), length))
    return out


def test_listops_draws_lras_distribution_of_lengths_and_labels(examples):
    from scipy.stats import chi2_contingency, ks_2samp

    theirs = lra_style(300, seed=11)
    ours_len, theirs_len = [len(t) for _, t in examples], [n for _, n in theirs]
    assert ks_2samp(ours_len, theirs_len).pvalue > 0.01, (np.mean(ours_len), np.mean(theirs_len))
    ours_y, theirs_y = Counter(y for y, _ in examples), Counter(v for v, _ in theirs)
    table = np.array([[ours_y[c] for c in range(10)], [theirs_y[c] for c in range(10)]])
    assert chi2_contingency(table).pvalue > 0.01, table


def test_listops_is_a_pure_function_of_its_seed(examples):
    assert listops.generate(20, seed=3) == examples[:20]
    assert listops.generate(20, seed=4) != examples[:20]


def test_listops_operators_and_the_bounded_filter():
    assert listops.evaluate("[MED 1 2 3 4 ]".split()) == 2  # int(np.median): 2.5 -> 2
    assert listops.evaluate("[SM 9 8 [MAX 1 7 ] ]".split()) == 4  # (9 + 8 + 7) % 10
    assert listops.evaluate("[MIN 3 [MED 9 9 5 ] 4 ]".split()) == 3
    tree = ("[SM", [9, ("[MIN", [4, 5]), 2])
    assert listops.tokens(tree) == "[SM 9 [MIN 4 5 ] 2 ]".split() and listops.value(tree) == 5
    with pytest.raises(ValueError, match="not a ListOps token: 'x'"):
        listops.evaluate(["[MAX", "x", "]"])
    # a filter that cannot be met stops, naming it (no unbounded rejection loop)
    with pytest.raises(ValueError, match=r"0 of 2 examples of length 500..2000 after 50 trees \(depth 2"):
        listops.generate(2, seed=0, max_depth=2, max_draws=50)


# ---------------------------------------------------------------------------------------------- Pathfinder


def test_pathfinder_balanced_seeded_pixel_tokens():
    rows = pathfinder.generate(40, seed=1)
    assert Counter(label for label, _ in rows) == {0: 20, 1: 20}
    assert all(len(t) == 1024 and set(t) <= set(pathfinder.SYMBOLS) for _, t in rows)
    assert rows == pathfinder.generate(40, seed=1) and rows != pathfinder.generate(40, seed=2)


def _markers(img: np.ndarray) -> set[tuple[int, int]]:
    """Centres of the 3 x 3 all-255 squares (the endpoint markers)."""
    return {(y, x) for y in range(1, 31) for x in range(1, 31) if (img[y - 1:y + 2, x - 1:x + 2] == 255).all()}


def test_pathfinder_classes_differ_only_in_where_the_markers_are():
    # the same draws for the paths: the two images differ only where the markers go
    pos = pathfinder.image(np.random.default_rng(7), 1)
    neg = pathfinder.image(np.random.default_rng(7), 0)
    first = pathfinder._path(np.random.default_rng(7), pathfinder.CONTOUR_LENGTH)  # the first path drawn
    ends = [tuple(np.rint(first[0, 0]).astype(int)), tuple(np.rint(first[-1, 1]).astype(int))]
    assert set(ends) <= _markers(pos)  # positive: both ends of the first path marked
    assert len(set(ends) & _markers(neg)) == 1  # negative: one end of the first path, the other marker elsewhere
    changed = np.argwhere(pos != neg)
    assert len(changed) > 0 and all(
        min(max(abs(y - cy), abs(x - cx)) for cy, cx in _markers(pos) | _markers(neg)) <= 1 for y, x in changed)
    with pytest.raises(ValueError, match="label 2 is not 0 or 1"):
        pathfinder.image(np.random.default_rng(0), 2)


# ---------------------------------------------------------------------------------------------- Fashion-MNIST


def write_idx(path, array: np.ndarray, compress: bool) -> None:
    header = bytes([0, 0, 8, array.ndim]) + b"".join(int(d).to_bytes(4, "big") for d in array.shape)
    blob = header + array.astype(np.uint8).tobytes()
    (gzip.open if compress else open)(path, "wb").write(blob)


@pytest.fixture
def fake_fmnist(tmp_path, monkeypatch):
    rng = np.random.default_rng(0)
    folder = tmp_path / "fm"
    folder.mkdir()
    for split, n in (("train", 40), ("t10k", 12)):
        write_idx(folder / f"{split}-images-idx3-ubyte.gz", rng.integers(0, 256, size=(n, 28, 28)), True)
        write_idx(folder / f"{split}-labels-idx1-ubyte", np.arange(n) % 10, False)
    monkeypatch.setenv(fmnist.ENV, str(folder))
    return folder


def test_idx_reader_reads_gzip_and_raw_and_refuses_other_files(fake_fmnist, tmp_path):
    images, labels = fmnist.load("train")
    assert images.shape == (40, 28, 28) and labels.tolist() == [i % 10 for i in range(40)]
    (tmp_path / "bad").write_bytes(b"\x00\x00\x0d\x01\x00\x00\x00\x02ab")
    with pytest.raises(ValueError, match=r"bad: IDX type 0x0d, expected 0x08"):
        fmnist.read_idx(tmp_path / "bad")
    (tmp_path / "short").write_bytes(b"\x00\x00\x08\x01\x00\x00\x00\x05ab")
    with pytest.raises(ValueError, match=r"short: 2 bytes of data, its header says \(5,\) \(5 bytes\)"):
        fmnist.read_idx(tmp_path / "short")


def test_fmnist_pixels_folder(fake_fmnist, tmp_path):
    record, cached = data.write_folder("fmnist-pixels", tmp_path / "fm-data", n=20, eval_n=8, seed=0)
    assert not cached and record["sizes"] == {"train": 20, "val": 8, "test": 8} and "in place of LRA's CIFAR-10" in record["note"]
    rows = data.read_tsv(tmp_path / "fm-data" / "train.tsv", 10, set(data.FIXED["pixels"]))
    assert len(rows) == 20 and all(len(t) == 784 for _, t in rows)
    images, labels = fmnist.load("train")
    first = rows[0][1]
    match = [i for i in range(len(images)) if [str(v) for v in images[i].reshape(-1)] == first]
    assert match and rows[0][0] == labels[match[0]]  # the pixels row by row, with their label


@pytest.mark.skipif(not (fmnist.DEFAULT_DIR / "t10k-labels-idx1-ubyte.gz").exists(), reason="dataset-fashion-mnist absent")
def test_the_installed_fashion_mnist(monkeypatch):
    monkeypatch.delenv(fmnist.ENV, raising=False)
    images, labels = fmnist.load("test")
    assert images.shape == (10_000, 28, 28) and sorted(Counter(labels.tolist()).values()) == [1000] * 10


# ---------------------------------------------------------------------------------------------- TSV, nas data


def test_bad_rows_are_named_by_file_and_line(tmp_path):
    f = tmp_path / "own.tsv"
    for text, message in [("1\ta b\nc d\n", r"own.tsv line 2: no label"),
                          ("1\ta b\n\n7\tc\n", r"own.tsv line 3: label 7 is outside the declared classes 0..2"),
                          ("x\ta\n", r"own.tsv line 1: label 'x' is not an integer"),
                          ("1\t \n", r"own.tsv line 1: label 1 has no tokens")]:
        f.write_text(text)
        with pytest.raises(ValueError, match=message):
            data.read_tsv(f, classes=3)
    f.write_text("0\t[MAX 1 2 ]\n1\t[MAX 1 x ]\n")
    with pytest.raises(ValueError, match=r"own.tsv line 2: token 'x' is not in the vocabulary \(15 symbols\)"):
        data.read_tsv(f, 10, set(listops.SYMBOLS))


def test_nas_data_writes_tsv_and_sidecar_then_reads_its_cache(tmp_path, capsys, monkeypatch):
    out = tmp_path / "lo"
    assert main(["data", "listops", "--out", str(out), "--n", "40", "--eval-n", "8", "--seed", "5", "-q"]) == 0
    record = json.loads((out / "data.json").read_text())
    assert (record["generator"], record["version"], record["seed"]) == ("listops", listops.VERSION, 5)
    assert record["sizes"] == {"train": 40, "val": 8, "test": 8}
    rows = {s: data.read_tsv(out / f"{s}.tsv", 10, set(listops.SYMBOLS)) for s in data.SPLITS}
    for s in data.SPLITS:
        assert record["counts"][s] == data.counts(rows[s])
        assert all(listops.evaluate(t) == y for y, t in rows[s])
    assert [r for s in data.SPLITS for r in rows[s]] == listops.generate(56, seed=5)  # train, val, test in draw order
    assert "written" in capsys.readouterr().out
    before = (out / "train.tsv").stat().st_mtime_ns

    def no(*a, **k):
        raise AssertionError("generated again")

    monkeypatch.setattr(data, "generate", no)
    assert main(["data", "listops", "--out", str(out), "--n", "40", "--eval-n", "8", "--seed", "5"]) == 0
    assert "read back (cached" in capsys.readouterr().out and (out / "train.tsv").stat().st_mtime_ns == before
    # other settings into the same folder: refused in one line, nothing overwritten
    assert main(["data", "listops", "--out", str(out), "--n", "40", "--eval-n", "8", "--seed", "6"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"nas data: error: --out {out}: holds other data (generator listops, version 1, seed 5")
    assert err.count("\n") == 1
    monkeypatch.undo()
    (out / "val.tsv").write_text("0\t1\n")  # a changed file: generated again
    assert main(["data", "listops", "--out", str(out), "--n", "40", "--eval-n", "8", "--seed", "5", "-q"]) == 0
    assert "written" in capsys.readouterr().out and len(data.read_tsv(out / "val.tsv")) == 8


def test_nas_data_refuses_an_unknown_generator_and_bad_sizes(tmp_path, capsys):
    assert main(["data", "cifar10", "--out", str(tmp_path / "c")]) == 2
    assert capsys.readouterr().err == ("nas data: error: unknown generator 'cifar10': one of listops, pathfinder, "
                                       "fmnist-pixels\n")
    assert main(["data", "pathfinder", "--out", str(tmp_path / "p"), "--n", "0"]) == 2
    assert capsys.readouterr().err == "nas data: error: --n: 0 is not a positive number of examples\n"
    assert not (tmp_path / "c").exists() and not (tmp_path / "p").exists()
