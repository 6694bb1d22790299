"""Fashion-MNIST as a sequence of 784 pixel intensities: the stand-in for LRA's grayscale CIFAR-10 "Image" task.

LRA's Image task reads CIFAR-10 as 1,024 gray pixels; CIFAR-10 does not ship with the system, Fashion-MNIST
does (Debian's ``dataset-fashion-mnist``, Xiao et al. 2017, MIT licence: 28 x 28 gray images of 10 kinds of
clothing), so this task reads it instead: 784 tokens, 256 symbols (the intensities), 10 classes.  Every result of
it says "Fashion-MNIST pixels (in place of LRA's CIFAR-10)".  The files are read with the small IDX reader below
(the format of LeCun's MNIST: a big-endian header, then the raw bytes), gzip-compressed or not.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

DEFAULT_DIR = Path("/usr/share/datasets/fashion-mnist")
ENV = "NAS_FASHION_MNIST"  # another folder of the four IDX files
FILES = {"train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
         "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")}
SYMBOLS = tuple(str(v) for v in range(256))
CLASSES = 10
VERSION = 1
MAX_IDX_BYTES = 1 << 30  # an IDX file, decompressed (Fashion-MNIST's largest: 47 MB); beyond it a gzip bomb is refused
NOTE = "Fashion-MNIST pixels (in place of LRA's CIFAR-10, which does not ship offline)"


def read_idx(path: str | Path) -> np.ndarray:
    """An IDX file (``.gz`` or raw) as a uint8 array of its shape; ValueError naming the file when it is not one."""
    from supernet.files import read_bounded

    path = Path(path)
    data = read_bounded(path, MAX_IDX_BYTES, "an IDX file", gunzip=True)  # a gzip bomb or a damaged stream: one line
    if len(data) < 4 or data[0] != 0 or data[1] != 0:
        raise ValueError(f"{path}: not an IDX file (its first bytes are {data[:4].hex() or 'missing'})")
    if data[2] != 0x08:
        raise ValueError(f"{path}: IDX type 0x{data[2]:02x}, expected 0x08 (unsigned bytes)")
    ndim = data[3]
    header = 4 + 4 * ndim
    dims = tuple(int.from_bytes(data[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim))
    if len(data) != header + int(np.prod(dims)):
        raise ValueError(f"{path}: {len(data) - header} bytes of data, its header says {dims} ({int(np.prod(dims))} bytes)")
    return np.frombuffer(data, dtype=np.uint8, offset=header).reshape(dims)


def folder() -> Path:
    return Path(os.environ.get(ENV) or DEFAULT_DIR)


def _find(base: Path, stem: str) -> Path:
    for name in (stem + ".gz", stem):
        if (base / name).is_file():
            return base / name
    raise ValueError(f"{base}: no {stem}(.gz) (install Debian's dataset-fashion-mnist, or set {ENV} to a folder of the "
                     "four IDX files)")


def load(split: str, base: str | Path | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(images (N, 28, 28) uint8, labels (N,) uint8) of ``split`` (train: 60,000, test: 10,000)."""
    base = Path(base) if base is not None else folder()
    images, labels = (read_idx(_find(base, stem)) for stem in FILES[split])
    if images.ndim != 3 or labels.ndim != 1 or len(images) != len(labels):
        raise ValueError(f"{base}: {split} images {images.shape} and labels {labels.shape} do not pair up")
    if labels.max(initial=0) >= CLASSES:
        raise ValueError(f"{base}: a {split} label is {int(labels.max())}, outside 0..{CLASSES - 1}")
    return images, labels


def examples(images: np.ndarray, labels: np.ndarray, rows: np.ndarray):
    """Yield the rows ``rows`` as (label, the pixel intensities row by row as tokens: the shared strings of ``SYMBOLS``)."""
    for i in rows:
        yield int(labels[i]), [SYMBOLS[v] for v in images[i].reshape(-1)]
