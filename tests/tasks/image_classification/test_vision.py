"""The image-classification task (issue 40): readers, split, augmentation, the space's genes, the ViT's token grid and
extraction, and the commands end to end on small generated images (Fashion-MNIST itself only where installed)."""

import gzip
import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from nas.cli import main
from search_spaces import SpaceError, parse_space
from tasks.image_classification.data import (
    FASHION_MNIST,
    augment,
    load_images,
    read_idx,
    read_png,
    read_png_folder,
    split,
)
from tasks.image_classification.model import patches

SPACE = """
task: image-classification
image: {size: 8, channels: 1, classes: 3}
resolution: [8]
patch: [2, 4]
stem: [linear, conv]
stem_channels: 4
head_dim: 8
embed_dim: [16, 24]
depth: [1, 2]
layers: {heads: [1, 2], ffn_dim: [16, 32], attention: [softmax, linear]}
latency: {image: {batch_size: 1}}
"""


def write_idx(path: Path, array: np.ndarray, compress: bool = True) -> Path:
    header = bytes([0, 0, 0x08, array.ndim]) + b"".join(int(d).to_bytes(4, "big") for d in array.shape)
    raw = header + array.astype(np.uint8).tobytes()
    path.write_bytes(gzip.compress(raw) if compress else raw)
    return path


def make_images(n: int, seed: int, size: int = 8, classes: int = 3) -> tuple[np.ndarray, np.ndarray]:
    """Class k: a bright bar in row band k (learnable in a few steps), plus noise."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, classes, n)
    x = rng.integers(0, 60, (n, size, size))
    band = size // classes
    for i, k in enumerate(y):
        x[i, k * band : (k + 1) * band] += 180
    return x.astype(np.uint8), y.astype(np.uint8)


def idx_folder(root: Path, n: int = 240) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for prefix, count, seed in (("train", n, 0), ("t10k", n // 4, 1)):
        x, y = make_images(count, seed)
        write_idx(root / f"{prefix}-images-idx3-ubyte.gz", x)
        write_idx(root / f"{prefix}-labels-idx1-ubyte.gz", y)
    return root


def write_png(path: Path, a: np.ndarray) -> None:
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(a).save(path)


# --------------------------------------------------------------------------- data


def test_idx_round_trip_plain_and_gzip_and_corrupt_files_are_named(tmp_path):
    a = np.arange(2 * 3 * 4, dtype=np.uint8).reshape(2, 3, 4)
    assert np.array_equal(read_idx(write_idx(tmp_path / "a.gz", a)), a)
    assert np.array_equal(read_idx(write_idx(tmp_path / "a", a, compress=False)), a)
    (tmp_path / "bad").write_bytes(b"\x08\x03\x00\x00" + bytes(20))
    with pytest.raises(ValueError, match=r"bad: not an IDX file \(expected the magic number 0x0000"):
        read_idx(tmp_path / "bad")
    raw = (tmp_path / "a").read_bytes()
    (tmp_path / "short").write_bytes(raw[:-3])
    with pytest.raises(ValueError, match=r"short: IDX header says 2 x 3 x 4 values of 1 byte\(s\) \(24 bytes\), the file holds"):
        read_idx(tmp_path / "short")
    (tmp_path / "broken.gz").write_bytes(gzip.compress(raw)[:-10])
    with pytest.raises(ValueError, match="broken.gz: not a readable IDX file"):
        read_idx(tmp_path / "broken.gz")


def test_png_folders_one_class_size_and_mode_mismatches_and_corrupt_files(tmp_path):
    x, y = make_images(6, 0)
    for i, (a, k) in enumerate(zip(x, y)):
        write_png(tmp_path / "ok" / f"c{k}" / f"{i}.png", a)
    images, labels, classes = read_png_folder(tmp_path / "ok")
    assert images.shape == (6, 1, 8, 8) and classes == tuple(sorted({f"c{k}" for k in y}))
    assert sorted(map(tuple, images.reshape(6, -1))) == sorted(map(tuple, x.reshape(6, -1)))
    write_png(tmp_path / "one" / "only" / "a.png", x[0])
    with pytest.raises(ValueError, match=r"one: expected a folder of at least 2 class folders of PNG files, found 1 \(only\)"):
        read_png_folder(tmp_path / "one")
    write_png(tmp_path / "mixed" / "a" / "0.png", x[0])
    write_png(tmp_path / "mixed" / "b" / "1.png", np.stack([x[1]] * 3, -1) + np.arange(3, dtype=np.uint8))  # RGB, colour
    with pytest.raises(ValueError, match=r"1.png: RGB 8 x 8, but .*0.png is grayscale 8 x 8"):
        read_png_folder(tmp_path / "mixed")
    write_png(tmp_path / "sizes" / "a" / "0.png", x[0])
    write_png(tmp_path / "sizes" / "b" / "1.png", np.zeros((9, 8), np.uint8))
    with pytest.raises(ValueError, match=r"1.png: grayscale 9 x 8, but .*0.png is grayscale 8 x 8"):
        read_png_folder(tmp_path / "sizes")
    (tmp_path / "junk.png").write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(10))
    with pytest.raises(ValueError, match="junk.png: not a readable PNG file"):
        read_png(tmp_path / "junk.png")


def test_split_is_seeded_and_stratified_and_augment_is_seeded(tmp_path):
    x, y = make_images(300, 0)
    x, y = x[:, None], y.astype(np.int64)
    tr, va = split(x, y, 0.2, seed=3)
    tr2, va2 = split(x, y, 0.2, seed=3)
    assert np.array_equal(va.images, va2.images) and len(tr) + len(va) == 300
    for k in range(3):
        assert abs((va.labels == k).sum() - 0.2 * (y == k).sum()) <= 0.5  # per class
    assert not np.array_equal(split(x, y, 0.2, seed=4)[1].labels, va.labels)
    a = augment(x[:20], np.random.default_rng(0), pad=2, flip=True)
    assert a.shape == x[:20].shape and np.array_equal(a, augment(x[:20], np.random.default_rng(0), pad=2, flip=True))
    assert not np.array_equal(a, x[:20])
    assert np.array_equal(augment(x[:20], np.random.default_rng(0), pad=0, flip=False), x[:20])
    flipped = augment(x[:64], np.random.default_rng(1), pad=0, flip=True)
    same = [np.array_equal(f, o) for f, o in zip(flipped, x[:64])]
    mirrored = [np.array_equal(f, o[..., ::-1]) for f, o in zip(flipped, x[:64])]
    assert all(s or m for s, m in zip(same, mirrored)) and 10 < sum(mirrored) < 54


def test_load_images_from_idx_folder(tmp_path):
    data = load_images(idx_folder(tmp_path / "idx"), 0.25, seed=0)
    assert (len(data.train), len(data.val), len(data.test)) == (180, 60, 60) and data.shape == (1, 8, 8)
    assert data.hash == load_images(tmp_path / "idx", 0.25, seed=0).hash != load_images(tmp_path / "idx", 0.25, seed=1).hash


@pytest.mark.skipif(not FASHION_MNIST.is_dir(), reason="Debian's dataset-fashion-mnist is not installed")
def test_fashion_mnist_as_debian_installs_it():
    data = load_images(None, 1 / 12, seed=0)
    assert (len(data.train), len(data.val), len(data.test)) == (55000, 5000, 10000) and data.shape == (1, 28, 28)
    assert np.bincount(data.test.labels).tolist() == [1000] * 10


# --------------------------------------------------------------------------- space and model


def test_space_genes_round_trip_and_refusals():
    space = parse_space(SPACE, where="v.yaml")
    assert space.task == "image-classification" and space.max_seq_len == 16 and space.size() == 2 * 2 * 2 * (8 + 64)
    assert parse_space(json.dumps(space.to_dict()), where="again.yaml").hash == space.hash
    rng = np.random.default_rng(0)
    for _ in range(20):
        s = space.sample(rng)
        assert space.decode(space.encode(s)) == s and type(s).from_json(s.to_json()) == s
        assert space.mutate(s, rng, 1.0) in space and space.crossover(s, space.sample(rng), rng) in space
    assert {"resolution", "patch", "stem", "l0.attention"} <= set(space.genes(space.largest()))
    with pytest.raises(SpaceError, match=r"v.yaml: patch: 3 does not divide resolution 8"):
        parse_space(SPACE.replace("patch: [2, 4]", "patch: [3, 4]"), where="v.yaml")
    with pytest.raises(SpaceError, match=r"v.yaml: stem: \['mlp'\] is not a list of distinct choices among linear, conv"):
        parse_space(SPACE.replace("stem: [linear, conv]", "stem: [mlp]"), where="v.yaml")


def test_tokens_are_the_row_major_grid():
    x = torch.arange(16.0).reshape(1, 1, 4, 4)  # pixel value = 4 * row + column
    p = patches(x, 2)  # (1, 4, 4): 2 x 2 grid
    assert p.shape == (1, 4, 4)
    assert p[0, :, 0].tolist() == [0.0, 2.0, 8.0, 10.0]  # top-left pixel of patches (0,0), (0,1), (1,0), (1,1)


def test_extraction_computes_what_the_supernet_computes():
    from tasks.image_classification.model import SuperViT

    space = parse_space(SPACE, where="v.yaml")
    supernet = SuperViT(space, generator=torch.Generator().manual_seed(0)).eval()
    x = torch.rand(3, 1, 8, 8, generator=torch.Generator().manual_seed(1))
    rng = np.random.default_rng(0)
    for subnet in [space.largest(), space.smallest(), space.largest("linear"), *(space.sample(rng) for _ in range(6))]:
        static = supernet.extract(subnet)
        with torch.no_grad():
            assert (static(x) - supernet(x, subnet)).abs().max().item() <= 1e-5, subnet
        assert static.num_params() == supernet.num_params(subnet)
    with pytest.raises(ValueError, match=r"expected float images of shape \(batch, 1, 8, 8\), got \(3, 1, 9, 9\)"):
        supernet(torch.rand(3, 1, 9, 9), space.largest())


CCT = (SPACE.replace("stem: [linear, conv]", "stem: [linear, conv, cct]")
       .replace("stem_channels: 4", "stem_channels: 4\npool: [mean, seq, cls]"))


def test_cct_stem_and_poolings_extract_encode_and_keep_older_spaces_as_they_were():
    """The cct tokenizer (conv, ReLU, max-pool by 2, patches of half the size) and the seq and cls poolings: elastic in
    the supernet (extraction computes the same numbers, counts the same parameters), genes that round-trip; a space of
    the mean pooling alone writes and encodes no pooling (its hash, subnets and vectors as before)."""
    from tasks.image_classification.model import SuperViT

    space = parse_space(CCT, where="v.yaml")
    assert space.max_seq_len == 17 and space.size() == 2 * 3 * 3 * 2 * (8 + 64)  # 16 tokens + the class token
    assert {"pool=seq", "stem=cct"} <= set(space.feature_names()) and "pool" in space.genes(space.largest())
    supernet = SuperViT(space, generator=torch.Generator().manual_seed(0)).eval()
    x = torch.rand(3, 1, 8, 8, generator=torch.Generator().manual_seed(1))
    rng = np.random.default_rng(0)
    drawn = [space.sample(rng) for _ in range(40)]
    assert {s.pool for s in drawn} == {"mean", "seq", "cls"} and {s.stem for s in drawn} == {"linear", "conv", "cct"}
    for subnet in [space.largest(), space.smallest(), *drawn[:12]]:
        static = supernet.extract(subnet)
        with torch.no_grad():
            assert (static(x) - supernet(x, subnet)).abs().max().item() <= 1e-5, subnet
        assert static.num_params() == supernet.num_params(subnet)
        assert space.decode(space.encode(subnet)) == subnet and type(subnet).from_json(subnet.to_json()) == subnet
    cls = next(s for s in drawn if s.pool == "cls")
    assert cls.seq_len == cls.tokens + 1 and "cls-pool" in str(cls)
    plain = parse_space(SPACE, where="v.yaml")
    assert "pool" not in plain.to_dict() and "pool" not in plain.smallest().to_dict() and len(plain.feature_names()) == (
        len(space.feature_names()) - 4)  # fmt: skip


def test_the_seq_pooling_weighs_the_tokens_and_the_cct_stem_halves_the_map():
    from tasks.image_classification.model import pool_tokens, stem_map

    h = torch.tensor([[[1.0, 0.0], [0.0, 1.0]]])  # (1, 2, 2)
    score = (torch.tensor([[10.0, -10.0]]), torch.zeros(1))  # the first token scores far higher
    assert torch.allclose(pool_tokens(h, "seq", score), torch.tensor([[[1.0, 0.0]]]), atol=1e-6)
    assert torch.equal(pool_tokens(h, "mean"), torch.tensor([[[0.5, 0.5]]]))
    assert torch.equal(pool_tokens(h, "cls"), h[:, :1])
    conv = (torch.ones(4, 1, 3, 3), torch.zeros(4))
    mapped, cut = stem_map(torch.rand(2, 1, 8, 8), "cct", conv, 4)
    assert mapped.shape == (2, 4, 4, 4) and cut == 2 and bool((mapped >= 0).all())  # ReLU then max-pool


@pytest.mark.parametrize("text,message", [
    (CCT.replace("patch: [2, 4]", "patch: [4, 8]").replace("resolution: [8]", "resolution: [8]"), None),
    (CCT.replace("patch: [2, 4]", "patch: [1, 4]"), "v.yaml: patch: 1 is odd: the cct stem pools the image by 2 first"),
    (CCT.replace("attention: [softmax, linear]", "attention: [softmax, axial]"),
     "v.yaml: pool: cls adds a class token before the grid (T + 1 tokens); the 2D types axial read a square grid"),
    (SPACE.replace("stem_channels: 4", "stem_channels: 4\npool: [max]"),
     "v.yaml: pool: ['max'] is not a list of distinct choices among mean, seq, cls"),
])
def test_pooling_and_stem_refusals_name_the_field(text, message):
    if message is None:
        assert parse_space(text, where="v.yaml").pools == ("mean", "seq", "cls")
        return
    with pytest.raises(SpaceError) as e:
        parse_space(text, where="v.yaml")
    assert message in str(e.value)


def test_cct_and_pooled_models_export_to_onnx_with_parity(tmp_path, graph_cache):
    from tasks.image_classification.export import onnx_parity
    from tasks.image_classification.model import ViT
    from tasks.image_classification.timing import export_vit_onnx

    space = parse_space(CCT, where="v.yaml")
    for i, (stem, pool) in enumerate((("cct", "seq"), ("cct", "cls"), ("conv", "seq"))):
        subnet = replace(space.largest(), stem=stem, pool=pool)
        model = ViT(space, subnet, generator=torch.Generator().manual_seed(i)).eval()
        export_vit_onnx(model, tmp_path / f"{i}.onnx")
        assert onnx_parity(model, tmp_path / f"{i}.onnx") <= 1e-4, (stem, pool)


# --------------------------------------------------------------------------- the commands


TRAIN = ["--batch-size", "16", "--lr", "3e-3", "--lr-warmup", "3", "--eval-interval", "15", "--eval-batches", "2",
         "--ckpt-interval", "15", "--log-interval", "5", "--val-fraction", "0.25", "-q"]


@pytest.fixture(scope="module")
def root(tmp_path_factory, graph_cache):
    root = tmp_path_factory.mktemp("vision")
    (root / "space.yaml").write_text(SPACE)
    idx_folder(root / "data")
    assert main(["train-supernet", str(root / "space.yaml"), "--out", str(root / "run"), "--data", str(root / "data"),
                 "--max-steps", "30", *TRAIN]) == 0
    return root


def test_train_search_export_classify(root, capsys):
    ckpt = torch.load(root / "run" / "final.pt", weights_only=True)
    assert ckpt["meta"]["corpus_sizes"] == {"train": 180, "val": 60, "test": 60}
    q = ["--timing-threads", "1", "--timing-warmup", "1", "--repeats", "2", "--rounds", "1", "--min-sample-ms", "1", "-q"]
    assert main(["measure-latency", str(root / "space.yaml"), "--device", "onnxruntime", "--out", str(root / "ort.csv"),
                 "--samples", "12", *q]) == 0
    assert main(["fit-predictor", str(root / "ort.csv"), "--models", "additive", "--out", str(root / "pred"), "-q"]) == 0
    assert main(["search", str(root / "run" / "final.pt"), "--predictor", str(root / "pred"), "--out", str(root / "search"),
                 "--budget", "1s", "--population", "4", "--parents", "2", "--mutations", "2", "--crossovers", "1",
                 "--generations", "1", "--val-windows", "2", "--eval-batch-size", "16", "--no-progress", "-q"]) == 0
    capsys.readouterr()
    assert main(["export", str(root / "run" / "final.pt"), "--subnet", str(root / "search" / "best_1s.yaml"),
                 "--out", str(root / "model"), "-q"]) == 0
    card = json.loads((root / "model" / "model_card.json").read_text())
    assert card["task"] == "image-classification" and card["onnx"]["parity_max_abs"] <= 1e-4
    import onnx

    meta = {p.key: p.value for p in onnx.load(str(root / "model" / "model.onnx")).metadata_props}
    assert meta["nas.task"] == "image-classification" and json.loads(meta["nas.subnet"]) == card["subnet"]
    assert 0 <= card["test"]["accuracy"] <= 1 and card["test"]["images"] == 60
    x, _ = make_images(2, 9)
    write_png(root / "a.png", x[0])
    capsys.readouterr()
    assert main(["classify-image", str(root / "model"), str(root / "a.png"), "--top", "2"]) == 0
    line = capsys.readouterr().out.strip().split("\t")
    assert line[0].endswith("a.png") and len(line) == 5 and float(line[2]) >= float(line[4])
    write_png(root / "big.png", np.zeros((9, 9), np.uint8))
    assert main(["classify-image", str(root / "model"), str(root / "big.png")]) == 2
    assert capsys.readouterr().err.strip().endswith("big.png: 9 x 9 pixels, the model takes 8 x 8")
    write_png(root / "rgb.png", np.zeros((8, 8, 3), np.uint8) + np.arange(3, dtype=np.uint8))
    assert main(["classify-image", str(root / "model"), str(root / "rgb.png")]) == 2
    assert capsys.readouterr().err.strip().endswith("rgb.png: a RGB image, the model takes grayscale images")


def test_bad_data_is_one_line_exit_2(root, tmp_path, capsys):
    write_png(tmp_path / "one" / "only" / "a.png", np.zeros((8, 8), np.uint8))
    assert main(["train-supernet", str(root / "space.yaml"), "--out", str(tmp_path / "r"), "--data", str(tmp_path / "one"),
                 "--max-steps", "1", "-q"]) == 2
    err = capsys.readouterr().err
    assert "found 1 (only)" in err and len(err.strip().splitlines()) == 1
    (tmp_path / "idx").mkdir()
    write_idx(tmp_path / "idx" / "train-images-idx3-ubyte.gz", np.zeros((4, 9, 9)))
    assert main(["train-supernet", str(root / "space.yaml"), "--out", str(tmp_path / "r2"), "--data", str(tmp_path / "idx"),
                 "--max-steps", "1", "-q"]) == 2
    assert "has no train-labels-idx1-ubyte.gz" in capsys.readouterr().err
    for name, shape in (("rgb", (8, 8, 3)), ("big", (9, 9))):
        for k in range(2):
            for i in range(4):
                write_png(tmp_path / name / f"c{k}" / f"{i}.png", np.full(shape, 40 * i + k, np.uint8) + (
                          np.arange(3, dtype=np.uint8) if len(shape) == 3 else 0))
    assert main(["train-supernet", str(root / "space.yaml"), "--out", str(tmp_path / "r3"), "--data", str(tmp_path / "rgb"),
                 "--max-steps", "1", "--val-fraction", "0.25", "-q"]) == 2
    assert capsys.readouterr().err.strip().endswith("the training images are 3 x 8 x 8 (C x H x W); the space takes 1 x 8 x 8 "
                                                     "(its image: size, channels)")
    assert main(["train-supernet", str(root / "space.yaml"), "--out", str(tmp_path / "r4"), "--data", str(tmp_path / "big"),
                 "--max-steps", "1", "--val-fraction", "0.25", "-q"]) == 2
    assert "the training images are 1 x 9 x 9" in capsys.readouterr().err


def test_a_second_resolution_grows_the_tokens_and_int8_timing_runs(tmp_path, graph_cache):
    from search_spaces import tasks
    from tasks.image_classification.model import SuperViT

    text = SPACE.replace("resolution: [8]", "resolution: [8, 16]").replace("patch: [2, 4]", "patch: [4]")
    space = parse_space(text, where="v.yaml")
    assert space.max_seq_len == 16
    supernet = SuperViT(space, generator=torch.Generator().manual_seed(0)).eval()
    x = torch.rand(2, 1, 8, 8, generator=torch.Generator().manual_seed(1))
    big, small = space.largest(), space.smallest()
    assert (big.resolution, big.tokens, small.resolution, small.tokens) == (16, 16, 8, 4)
    for subnet in (big, small):
        with torch.no_grad():
            assert (supernet.extract(subnet)(x) - supernet(x, subnet)).abs().max().item() <= 1e-5
    task = tasks.of(space)
    w = space.workload()
    f_big, f_small = task.table_features(space, big, w), task.table_features(space, small, w)
    assert (f_big["tokens"], f_small["tokens"]) == (16.0, 4.0) and f_big["flops"] > f_small["flops"]
    (tmp_path / "s.yaml").write_text(text)
    assert main(["measure-latency", str(tmp_path / "s.yaml"), "--device", "onnxruntime", "--precision", "int8-dynamic",
                 "--out", str(tmp_path / "int8.csv"), "--samples", "3", "--timing-threads", "1", "--timing-warmup", "1",
                 "--repeats", "2",
                 "--rounds", "1", "--min-sample-ms", "1", "-q"]) == 0


def test_an_arm_bundle_times_each_vit_graph_on_seeded_images(tmp_path, graph_cache, capsys):
    """The bundle runner (numpy and onnxruntime only) times each subnet's graph, its weights drawn on the board, on the
    images the host times; its table is read back as an image table; at int8 the arm bundle is refused in one line."""
    import os
    import subprocess
    import sys
    import tarfile

    from latency.table import read_timings
    from latency.timing_core import image_feed
    from tasks.image_classification.timing import images

    (tmp_path / "s.yaml").write_text(SPACE)
    space = parse_space(SPACE, where="s.yaml")
    bundle = tmp_path / "b.tar.gz"
    q = ["--timing-warmup", "1", "--repeats", "2", "--rounds", "1", "--min-sample-ms", "1", "-q"]
    assert main(["measure-latency", str(tmp_path / "s.yaml"), "--device", "arm", "--bundle", str(bundle), "--samples",
                 "2", "--retest", "0", *q]) == 0  # fmt: skip
    with tarfile.open(bundle) as tar:
        tar.extractall(tmp_path, filter="data")
    root = tmp_path / "nas-latency-bundle"
    manifest = json.loads((root / "manifest.json").read_text())
    assert all(m["images"] == [1, 8, 8] and m["tensors"] for m in manifest["models"] + [manifest["reference"]])
    # the board's images are the host's (one seed, one shape)
    assert np.array_equal(image_feed(1, manifest["reference"]["images"])["pixel_values"], images(space, 1))
    done = subprocess.run([sys.executable, str(root / "runner.py"), "--threads", "1", "--out", str(tmp_path / "board.csv")],
                          capture_output=True, text=True, cwd=tmp_path, env={**os.environ, "PYTHONPATH": ""})  # fmt: skip
    assert done.returncode == 0, done.stderr
    t = read_timings(tmp_path / "board.csv")
    assert t.workload.kind == "image" and set(t.passes("measure")) == {space.largest().key, space.smallest().key}
    assert all(r.median_ms > 0 for r in t.passes("measure").values())
    capsys.readouterr()
    assert main(["measure-latency", str(tmp_path / "s.yaml"), "--device", "arm", "--precision", "int8-dynamic",
                 "--bundle", str(tmp_path / "q.tar.gz"), "-q"]) == 2  # fmt: skip
    assert "--precision int8-dynamic: arm runs fp32 only" in capsys.readouterr().err and not (tmp_path / "q.tar.gz").exists()


def test_a_resumed_run_equals_the_uninterrupted_one(root):
    import os
    import signal

    from nas.train_supernet import SupernetRun, train_supernet
    from search_spaces import load_space

    args = [str(root / "space.yaml"), "--data", str(root / "data"), *TRAIN]
    assert main(["train-supernet", *args, "--out", str(root / "straight"), "--max-steps", "12"]) == 0

    def stop(info):
        if info.step == 6:
            os.kill(os.getpid(), signal.SIGINT)  # caught by the loop: it finishes the step, saves latest.pt, stops

    run = SupernetRun(root / "cut", load_space(root / "space.yaml"),
                      config={"batch_size": 16, "lr": 3e-3, "warmup_steps": 3, "eval_interval": 15, "eval_batches": 2,
                              "ckpt_interval": 15, "log_interval": 5, "max_steps": 12},
                      data={"data": str(root / "data"), "val_fraction": 0.25})  # fmt: skip
    assert train_supernet(run, progress=stop).result.stopped == "interrupted"
    assert main(["train-supernet", "--out", str(root / "cut"), "--resume", "-q"]) == 0
    a, b = (torch.load(root / r / "final.pt", weights_only=True) for r in ("straight", "cut"))
    assert a["state"]["step"] == b["state"]["step"] == 12
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])


def test_train_subnet_from_scratch_writes_a_classifier(root, capsys):
    space = parse_space(SPACE, where="v.yaml")
    (root / "small.yaml").write_text(space.smallest().to_yaml())
    capsys.readouterr()
    assert main(["train-subnet", str(root / "small.yaml"), "--space", str(root / "space.yaml"), "--out", str(root / "scratch"),
                 "--data", str(root / "data"), "--max-steps", "40", "--batch-size", "16", "--lr", "3e-3", "--lr-warmup", "3",
                 "--eval-interval", "20", "--eval-batches", "2", "--val-fraction", "0.25", "-q"]) == 0
    assert "validation accuracy" in capsys.readouterr().out
    card = json.loads((root / "scratch" / "model_card.json").read_text())
    assert card["training"]["init"] == "scratch" and card["training"]["steps"] == 40 and card["test"]["images"] == 60
    assert card["onnx"]["parity_max_abs"] <= 1e-4 and card["subnet"] == space.smallest().to_dict()
    assert main(["train-subnet", str(root / "small.yaml"), "--space", str(root / "space.yaml"), "--out", str(root / "scratch"),
                 "--data", str(root / "data"), "--max-steps", "40", "-q"]) == 2
    assert "already holds a training run" in capsys.readouterr().err
    assert main(["train-subnet", "--out", str(root / "scratch"), "--resume", "--max-steps", "50", "-q"]) == 0
    card = json.loads((root / "scratch" / "model_card.json").read_text())
    assert card["training"]["steps"] == 50 and card["test"]["images"] == 60
    events = [json.loads(line) for line in (root / "scratch" / "train" / "log.jsonl").read_text().splitlines()]
    assert [(e["event"], e["step"]) for e in events if e["event"] in ("start", "resume")] == [("start", 0), ("resume", 40)]


# --------------------------------------------------------------------------- the final-training recipes (issue 51)


def _recipe_run(root, name, *, init="scratch", distill_from=None, distill=0.0, steps=6, lr=3e-3, progress=None,
                resume=False):
    from search_spaces import load_space
    from supernet.train import TrainConfig
    from tasks.image_classification.workflows import train_vision_subnet

    space = load_space(root / "space.yaml")
    config = TrainConfig(batch_size=16, lr=lr, min_lr=lr / 10, warmup_steps=2, max_steps=steps, eval_interval=100,
                         eval_batches=2, ckpt_interval=100, log_interval=1, seed=0)
    data = {"data": str(root / "data"), "data_seed": 0, "val_fraction": 0.25}
    return train_vision_subnet(space, space.smallest(), root / name, config, data, init=init, distill_from=distill_from,
                               distill=distill, formats=(), progress=progress, resume=resume)


def _weights(folder):
    from safetensors.torch import load_file

    return load_file(str(folder / "model.safetensors"))


def test_train_subnet_starts_from_the_supernets_slice(root):
    """``init=supernet:CKPT``: the model's first weights are the subnet's slice of the supernet (at lr 0 they stay it),
    and the card's accuracy before training is the extracted model's."""
    from supernet.checkpoint import load_supernet
    from tasks.image_classification.data import load_images
    from tasks.image_classification.train import accuracy, held_out

    ckpt = root / "run" / "final.pt"
    result = _recipe_run(root, "inherit-lr0", init=f"supernet:{ckpt}", lr=0.0, steps=2)
    supernet, _ = load_supernet(ckpt)
    sliced = supernet.extract(supernet.space.smallest()).state_dict()
    got = _weights(result.out)
    assert got.keys() == sliced.keys() and all(torch.equal(got[k], sliced[k]) for k in got)
    card = json.loads((result.out / "model_card.json").read_text())
    val = load_images(str(root / "data"), 0.25, 0).val
    assert card["training"]["init"] == f"supernet:{ckpt}"
    assert card["training"]["val_accuracy_before"] == accuracy(supernet.extract(supernet.space.smallest()), held_out(val))


def test_train_subnet_distils_from_the_supernets_largest_and_resumes_exactly(root):
    """``distill_from``: the teacher's term changes what is learned (the same init, seed and batches end elsewhere), the
    card and checkpoint record it; interrupted and resumed, the distilled run equals the uninterrupted one."""
    import os
    import signal

    from supernet.runs import TrainingInterrupted

    ckpt = f"supernet:{root / 'run' / 'final.pt'}"
    plain = _recipe_run(root, "inherit", init=ckpt)
    taught = _recipe_run(root, "distil", init=ckpt, distill_from=ckpt, distill=0.5)
    a, b = _weights(plain.out), _weights(taught.out)
    assert any(not torch.equal(a[k], b[k]) for k in a)
    card = json.loads((taught.out / "model_card.json").read_text())
    assert (card["training"]["teacher"], card["training"]["distill"]) == (ckpt, 0.5)
    final = torch.load(taught.out / "train" / "final.pt", weights_only=True)
    assert final["meta"]["objective"]["kind"] == "distill" and final["meta"]["objective"]["distill"] == 0.5

    def stop(info):
        if info.step == 3:
            os.kill(os.getpid(), signal.SIGINT)

    with pytest.raises(TrainingInterrupted):
        _recipe_run(root, "distil-cut", init=ckpt, distill_from=ckpt, distill=0.5, progress=stop)
    assert not (root / "distil-cut" / "model_card.json").exists()
    again = _recipe_run(root, "distil-cut", init=ckpt, distill_from=ckpt, distill=0.5, resume=True)
    c = _weights(again.out)
    assert again.steps == taught.steps == 6 and all(torch.equal(b[k], c[k]) for k in b)
    assert again.val_accuracy == taught.val_accuracy


def test_train_subnet_cli_takes_distill_from_for_an_image_space(root, capsys):
    space = parse_space(SPACE, where="v.yaml")
    (root / "small2.yaml").write_text(space.smallest().to_yaml())
    ckpt = f"supernet:{root / 'run' / 'final.pt'}"
    args = ["train-subnet", str(root / "small2.yaml"), "--space", str(root / "space.yaml"), "--data", str(root / "data"),
            "--max-steps", "3", "--batch-size", "16", "--val-fraction", "0.25", "--format", "torch", "-q"]
    assert main([*args, "--out", str(root / "cli-distil"), "--init", ckpt, "--distill-from", ckpt, "--label-smoothing",
                 "0.1"]) == 0
    card = json.loads((root / "cli-distil" / "model_card.json").read_text())
    assert card["training"]["distill"] == 0.5 and card["training"]["label_smoothing"] == 0.1
    assert main(["train-subnet", "--out", str(root / "cli-distil"), "--resume", "--distill", "0.9", "-q"]) == 2
    assert "--resume: --distill 0.9 differs from the run's 0.5" in capsys.readouterr().err
    assert main([*args, "--out", str(root / "cli-bad"), "--label-smoothing", "1.5"]) == 2
    assert capsys.readouterr().err.strip().endswith("--label-smoothing: 1.5 is not a share in [0, 1)")
    assert not (root / "cli-bad").exists()
