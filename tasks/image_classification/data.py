"""Images and labels for the image-classification task: readers, the validation split, the seeded augmentation.

Every function here is pure (arrays in, arrays out; a seeded ``np.random.Generator`` where something is drawn):

* :func:`read_idx` reads one IDX file (LeCun's format, as Fashion-MNIST and MNIST ship it; gzip or plain): the magic
  number (two zero bytes, a dtype code, the number of dimensions), the big-endian dimensions, then exactly their
  product of values.  Anything else is a ``ValueError`` naming the file and what was expected.
* :func:`read_png_folder` reads a folder of class folders of PNG files (``root/<class>/*.png``; the classes sorted by
  name), all of one size and one mode (grayscale or RGB).
* :func:`split` holds out a seeded share of the training images for validation (stratified per class).
* :func:`augment` is the light training augmentation: a random crop of the image padded by ``pad`` pixels (zeros) on
  each side, and a horizontal flip with probability one half (clothes are left-right symmetric; digits are not: a
  space turns flips off with ``flip: false``), drawn per image from the generator given.

Images are ``uint8`` arrays (N, C, H, W); labels ``int64`` (N,).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from search_spaces.errors import first_line

FASHION_MNIST = Path("/usr/share/datasets/fashion-mnist")  # Debian's dataset-fashion-mnist
FASHION_CLASSES = ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot")
IDX_FILES = {"train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
             "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")}  # fmt: skip
IDX_DTYPES = {0x08: ">u1", 0x09: ">i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}
MAX_IMAGES = 10_000_000  # a header's sizes above this are a corrupt file, not a data set
MAX_IDX_BYTES = 1 << 30  # an IDX file, decompressed (Fashion-MNIST's largest: 47 MB); beyond it a gzip bomb is refused
MAX_PIXELS = 1 << 24  # an image's width x height (4096 x 4096), checked from its header before it is decoded


# --------------------------------------------------------------------------- IDX


def read_idx(path: str | Path) -> np.ndarray:
    """The array an IDX file holds (gzip-compressed or plain), checked against its header."""
    from supernet.files import read_bounded

    path = Path(path)
    raw = read_bounded(path, MAX_IDX_BYTES, "an IDX file", gunzip=True)  # a gzip bomb or a damaged stream: one line
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] not in IDX_DTYPES or not 1 <= raw[3] <= 4:
        raise ValueError(f"{path}: not an IDX file (expected the magic number 0x0000 then a dtype code "
                         f"{', '.join(f'0x{c:02X}' for c in IDX_DTYPES)} and 1 to 4 dimensions, "
                         f"got {raw[:4].hex() or 'nothing'})")
    ndim = raw[3]
    if len(raw) < 4 + 4 * ndim:
        raise ValueError(f"{path}: IDX header cut short (expected {ndim} dimensions of 4 bytes each)")
    dims = tuple(int(d) for d in np.frombuffer(raw, ">u4", ndim, 4))
    dtype = np.dtype(IDX_DTYPES[raw[2]])
    count = int(np.prod(dims, dtype=np.int64))
    if dims[0] > MAX_IMAGES or count * dtype.itemsize != len(raw) - 4 - 4 * ndim:
        raise ValueError(f"{path}: IDX header says {' x '.join(map(str, dims))} values of {dtype.itemsize} byte(s) "
                         f"({count * dtype.itemsize:,} bytes), the file holds {len(raw) - 4 - 4 * ndim:,}")
    return np.frombuffer(raw, dtype, count, 4 + 4 * ndim).reshape(dims).astype(dtype.newbyteorder("="))


def idx_file(folder: Path, stem: str) -> Path:
    """``folder/stem.gz`` or ``folder/stem`` (the Debian package ships the gzip)."""
    for name in (f"{stem}.gz", stem):
        if (folder / name).is_file():
            return folder / name
    raise ValueError(f"{folder}: has no {stem}.gz (nor {stem}): expected the IDX files of Fashion-MNIST / MNIST")


def read_idx_pair(images: Path, labels: Path) -> tuple[np.ndarray, np.ndarray]:
    """(images (N, 1, H, W) uint8, labels (N,) int64) of an IDX image file and its label file."""
    x, y = read_idx(images), read_idx(labels)
    if x.ndim != 3 or x.dtype != np.uint8:
        raise ValueError(f"{images}: expected uint8 images of 3 dimensions (N, H, W), got {x.dtype} of shape {x.shape}")
    if y.ndim != 1 or len(y) != len(x):
        raise ValueError(f"{labels}: expected {len(x)} labels (one per image of {images.name}), got shape {y.shape}")
    return x[:, None], y.astype(np.int64)


# --------------------------------------------------------------------------- PNG folders


def read_png(path: str | Path) -> np.ndarray:
    """One PNG as uint8 (C, H, W): C 1 (grayscale) or 3 (RGB; an alpha channel is dropped).

    Its size is read from the header and checked (:data:`MAX_PIXELS`) before any pixel is decoded: a few hundred bytes
    may declare 20,000 x 20,000 pixels.  A 16-bit grayscale PNG is converted to 8 bits by scaling (``v * 255 / 65535``,
    rounded: 0 stays 0, 65535 becomes 255), never clipped (Pillow's own conversion clips every value above 255)."""
    import warnings

    from PIL import Image, UnidentifiedImageError

    path = Path(path)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)  # over Pillow's limit: refused below, not said
            with Image.open(path) as im:
                if im.format != "PNG":
                    raise ValueError(f"{path}: not a PNG file (it is {im.format})")
                width, height = im.size
                if width * height > MAX_PIXELS:
                    raise ValueError(f"{path}: {width:,} x {height:,} pixels; an image here is at most {MAX_PIXELS:,} pixels "
                                     "(4096 x 4096)")
                if im.mode in SIXTEEN_BIT:
                    return _sixteen_bit(path, np.asarray(im))[None]
                mode = "L" if im.mode in ("1", "L", "P", "LA") and _gray(im) else "RGB"
                a = np.asarray(im.convert(mode))
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as e:
        raise ValueError(f"{path}: {first_line(e)}; an image here is at most {MAX_PIXELS:,} pixels") from None
    except (OSError, UnidentifiedImageError, SyntaxError) as e:
        raise ValueError(f"{path}: not a readable PNG file: {e}") from None
    return a[None] if a.ndim == 2 else np.ascontiguousarray(a.transpose(2, 0, 1))


SIXTEEN_BIT = ("I;16", "I;16B", "I;16L", "I")  # Pillow's modes of a 16-bit grayscale PNG ("I" in older releases)


def _sixteen_bit(path: Path, a: np.ndarray) -> np.ndarray:
    """16-bit gray values (H, W) as uint8 by scaling 0..65535 onto 0..255, rounded to the nearest."""
    a = a.astype(np.int64)
    if a.size and (a.min() < 0 or a.max() > 65535):
        raise ValueError(f"{path}: gray values from {a.min()} to {a.max()}, outside the 16 bits of a PNG")
    return ((a * 255 + 32767) // 65535).astype(np.uint8)


def _gray(im) -> bool:
    """A palette image is grayscale when its palette is."""
    if im.mode != "P":
        return True
    rgb = np.asarray(im.convert("RGB"))
    return bool((rgb[..., 0] == rgb[..., 1]).all() and (rgb[..., 1] == rgb[..., 2]).all())


def read_png_folder(root: str | Path) -> tuple[np.ndarray, np.ndarray, tuple[str, ...]]:
    """(images (N, C, H, W) uint8, labels (N,), class names) of ``root/<class>/*.png``, classes sorted by name."""
    root = Path(root)
    classes = tuple(sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")))
    if len(classes) < 2:
        raise ValueError(f"{root}: expected a folder of at least 2 class folders of PNG files, found "
                         f"{len(classes)} ({', '.join(classes) or 'none'})")
    images, labels, first = [], [], None
    for k, name in enumerate(classes):
        files = sorted((root / name).glob("*.png"))
        if not files:
            raise ValueError(f"{root / name}: a class folder without PNG files")
        for f in files:
            a = read_png(f)
            if first is None:
                first = (f, a.shape)
            elif a.shape != first[1]:
                what = "grayscale" if a.shape[0] == 1 else "RGB"
                raise ValueError(f"{f}: {what} {a.shape[1]} x {a.shape[2]}, but {first[0]} is "
                                 f"{'grayscale' if first[1][0] == 1 else 'RGB'} {first[1][1]} x {first[1][2]}: the "
                                 "images of a data set are of one size and one mode")
            images.append(a)
            labels.append(k)
    return np.stack(images), np.array(labels, dtype=np.int64), classes


# --------------------------------------------------------------------------- the data set


@dataclass(frozen=True)
class Split:
    """Images (N, C, H, W) uint8 and labels (N,) int64 of one split."""

    images: np.ndarray
    labels: np.ndarray

    def __post_init__(self) -> None:
        assert self.images.ndim == 4 and self.images.dtype == np.uint8, (self.images.shape, self.images.dtype)
        assert self.labels.shape == (len(self.images),), (self.labels.shape, self.images.shape)

    def __len__(self) -> int:
        return len(self.labels)


@dataclass(frozen=True)
class ImageData:
    """A run's images: the training images (less the validation ones), the validation and the test split."""

    train: Split
    val: Split
    test: Split | None
    classes: tuple[str, ...]
    source: str
    path: Path = field(default=Path("."))

    @property
    def hash(self) -> str:
        h = hashlib.sha256()
        for s in (self.train, self.val, self.test):
            if s is not None:
                h.update(s.images.tobytes())
                h.update(s.labels.tobytes())
        return h.hexdigest()

    @property
    def meta(self) -> dict:
        return {"corpus": self.source, "classes": list(self.classes),
                "sizes": {"train": len(self.train), "val": len(self.val), "test": len(self.test) if self.test else 0}}

    @property
    def shape(self) -> tuple[int, int, int]:
        """(C, H, W) of every image."""
        return tuple(self.train.images.shape[1:])


def split(images: np.ndarray, labels: np.ndarray, fraction: float, seed: int) -> tuple[Split, Split]:
    """(train, validation): ``fraction`` of each class's images held out, drawn by ``default_rng([seed, 1])``."""
    if not 0 < fraction < 1:
        raise ValueError(f"validation fraction {fraction} is not strictly between 0 and 1")
    rng = np.random.default_rng([seed, 1])
    held = np.zeros(len(labels), dtype=bool)
    for k in np.unique(labels):
        members = np.flatnonzero(labels == k)
        n = int(round(fraction * len(members)))
        if n < 1 or n >= len(members):
            raise ValueError(f"class {k}: {len(members)} image(s), too few to hold out {fraction:.0%} for validation")
        held[rng.choice(members, size=n, replace=False)] = True
    val_order = np.flatnonzero(held)[rng.permutation(int(held.sum()))]  # mixed classes: a prefix of it is a fair sample
    return Split(images[~held], labels[~held]), Split(images[val_order], labels[val_order])


def load_images(source: str | Path | None, val_fraction: float, seed: int) -> ImageData:
    """The data set of ``source``: None for Fashion-MNIST as Debian installs it, a folder of IDX files (train-* and
    t10k-*), or a folder of class folders of PNGs (no test split then)."""
    folder = Path(source) if source is not None else FASHION_MNIST
    if not folder.is_dir():
        hint = " (install the Debian package dataset-fashion-mnist, or give --data)" if source is None else ""
        raise ValueError(f"{folder}: no such folder{hint}")
    names = {p.name for p in folder.iterdir()}
    if any(n.startswith("train-images-idx") for n in names):
        x, y = read_idx_pair(*(idx_file(folder, s) for s in IDX_FILES["train"]))
        test = Split(*read_idx_pair(*(idx_file(folder, s) for s in IDX_FILES["test"])))
        if test.images.shape[1:] != x.shape[1:]:
            raise ValueError(f"{folder}: test images of {test.images.shape[2:]}, training images of {x.shape[2:]}")
        n_classes = int(max(y.max(), test.labels.max())) + 1
        classes = FASHION_CLASSES if source is None else tuple(str(k) for k in range(n_classes))
        what = "Fashion-MNIST (Debian dataset-fashion-mnist)" if source is None else f"IDX files in {folder}"
    else:
        x, y, classes = read_png_folder(folder)
        test, what = None, f"PNG class folders in {folder}"
    if len(np.unique(y)) < 2:
        raise ValueError(f"{folder}: the training labels hold {len(np.unique(y))} class; a classifier needs at least 2")
    train, val = split(x, y, val_fraction, seed)
    return ImageData(train, val, test, tuple(classes), what)


# --------------------------------------------------------------------------- augmentation


def augment(images: np.ndarray, rng: np.random.Generator, pad: int = 2, flip: bool = True) -> np.ndarray:
    """A random crop of each image padded by ``pad`` zero pixels per side (the same size back), then a horizontal flip
    with probability 1/2 when ``flip``: (N, C, H, W) uint8 -> (N, C, H, W) uint8, a new array."""
    n, _, h, w = images.shape
    out = np.empty_like(images)
    padded = np.pad(images, ((0, 0), (0, 0), (pad, pad), (pad, pad))) if pad else images
    dy, dx = rng.integers(0, 2 * pad + 1, size=(2, n))
    flips = rng.random(n) < 0.5 if flip else np.zeros(n, dtype=bool)
    for i in range(n):
        crop = padded[i, :, dy[i] : dy[i] + h, dx[i] : dx[i] + w]
        out[i] = crop[..., ::-1] if flips[i] else crop
    return out


def to_float(images: np.ndarray) -> np.ndarray:
    """uint8 images -> float32 in [0, 1] (what a model takes; it normalises inside)."""
    return images.astype(np.float32) / 255.0
