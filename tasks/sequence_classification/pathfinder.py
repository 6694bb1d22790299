"""Pathfinder-32, generated with numpy: are the two marked endpoints joined by one dashed path?

The task is Linsley et al.'s (NeurIPS 2018, "Learning long-range spatial dependencies with horizontal gated
recurrent units"), the one Long Range Arena reads as 1,024 pixel tokens (its 32 x 32 images of contour length
14).  LRA ships pre-rendered images; this module draws images of the same kind from a seed, no download:

* a **path** is ``CONTOUR_LENGTH`` (14) dashes: from a random start and heading, each step turns by a uniform
  angle in ``[-MAX_TURN, MAX_TURN]`` and advances ``STEP`` pixels, of which the first ``DASH`` are drawn (the rest
  is the gap that makes the path dashed); a step that would leave the canvas margin is redrawn (a bounded number
  of times, then the path restarts; a canvas where no path fits raises ValueError);
* every image has two full paths, ``DISTRACTORS`` short distractor paths (``DISTRACTOR_LENGTH`` dashes) and two
  endpoint markers (3 x 3 squares, brighter than a path's 1-pixel dashes); each path has its own intensity in
  ``160 .. 255``, the background is 0;
* **positive** (label 1): both markers on the two ends of the first path; **negative** (label 0): one marker on
  an end of each full path.  The pixel statistics of the two classes are the same (two full paths, two markers),
  so only the connection tells them apart;
* the classes are balanced (alternating, then shuffled by the seed); tokens are the 1,024 intensities row by row.

What differs from Linsley et al.: their paths are chains of anti-aliased "paddles" with a continuity
constraint and distractors of the same length, rendered at 300 x 300 and resized; here dashes are rasterised
straight onto the 32 x 32 grid (1-pixel, not anti-aliased), with fewer intensity levels.
"""

from __future__ import annotations

import math

import numpy as np

SIZE = 32
CONTOUR_LENGTH = 14  # dashes per full path (LRA's 32 x 32 set: contour length 14)
DISTRACTORS, DISTRACTOR_LENGTH = 2, 5
STEP, DASH = 3.0, 1.2  # pixels per step; the drawn part of each step (the rest is the gap)
MAX_TURN = math.pi / 5
MARGIN = 1.0
SYMBOLS = tuple(str(v) for v in range(256))
VERSION = 1


def _path(rng: np.random.Generator, length: int, size: int = SIZE, tries: int = 200) -> np.ndarray:
    """The dash starts and ends of one path: (length, 2, 2) [(y0, x0), (y1, x1)] per dash."""
    lo, hi = MARGIN, size - 1 - MARGIN
    for _ in range(tries):
        pos = rng.uniform(lo, hi, size=2)
        heading = rng.uniform(0, 2 * math.pi)
        dashes = []
        for _ in range(length):
            for _ in range(20):
                turn = heading + rng.uniform(-MAX_TURN, MAX_TURN)
                d = np.array([math.sin(turn), math.cos(turn)])
                nxt = pos + STEP * d
                if lo <= nxt[0] <= hi and lo <= nxt[1] <= hi:
                    break
            else:
                break  # boxed in: start the path again
            dashes.append((pos.copy(), pos + DASH * d))
            pos, heading = nxt, turn
        if len(dashes) == length:
            return np.array(dashes)
    raise ValueError(f"pathfinder: no path of {length} dashes of {STEP} pixels fits a {size} x {size} canvas in {tries} tries")


def _draw(canvas: np.ndarray, dashes: np.ndarray, intensity: int) -> None:
    for (a, b) in dashes:
        for t in np.linspace(0.0, 1.0, 5):
            y, x = np.rint(a + t * (b - a)).astype(int)
            canvas[y, x] = max(canvas[y, x], intensity)


def _mark(canvas: np.ndarray, point: np.ndarray) -> None:
    y, x = np.rint(point).astype(int)
    canvas[max(y - 1, 0): y + 2, max(x - 1, 0): x + 2] = 255


def image(rng: np.random.Generator, label: int, size: int = SIZE) -> np.ndarray:
    """One (size, size) uint8 image of class ``label`` (1: the markers are joined by one path, 0: they are not)."""
    if label not in (0, 1):
        raise ValueError(f"pathfinder: label {label} is not 0 or 1")
    canvas = np.zeros((size, size), dtype=np.uint8)
    first, second = _path(rng, CONTOUR_LENGTH, size), _path(rng, CONTOUR_LENGTH, size)
    for dashes in (first, second, *(_path(rng, DISTRACTOR_LENGTH, size) for _ in range(DISTRACTORS))):
        _draw(canvas, dashes, int(rng.integers(160, 256)))
    ends = lambda p: (p[0, 0], p[-1, 1])  # noqa: E731 - the first dash's start, the last dash's end
    if label == 1:
        a, b = ends(first)
    else:
        a, b = ends(first)[int(rng.integers(0, 2))], ends(second)[int(rng.integers(0, 2))]
    _mark(canvas, a)
    _mark(canvas, b)
    return canvas


def generate(n: int, seed: int, size: int = SIZE, progress=None) -> list[tuple[int, list[str]]]:
    """``n`` examples (label, the size x size intensities as tokens), balanced classes, drawn from ``seed``."""
    return list(rows(n, seed, size, progress))


def rows(n: int, seed: int, size: int = SIZE, progress=None):
    """Yield :func:`generate`'s examples one by one (the tokens are the shared strings of ``SYMBOLS``)."""
    if n < 0:
        raise ValueError(f"n: {n} is negative")
    rng = np.random.default_rng([seed, 2])
    labels = rng.permutation(np.arange(n) % 2)
    for i, label in enumerate(labels):
        yield int(label), [SYMBOLS[v] for v in image(rng, int(label), size).reshape(-1)]
        if progress is not None:
            progress(i + 1, n)
