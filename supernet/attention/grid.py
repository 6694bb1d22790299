"""The token grid of the 2D attention types (issue 40), and the 2D depthwise convolution two of them share.

An image model gives its attention a square grid of ``T = S * S`` patch tokens in row-major order (token
``t`` at row ``t // S``, column ``t % S``; no class token), as the usual q, k, v ``(B, H, T, D)``.  A 2D
type infers S from T (:func:`grid_side`: ``ValueError`` naming T when it is not a square) and mixes
over the grid: :mod:`.swin` (``swin:W``, ``swin-shift:W``), :mod:`.axial` (``axial``), :mod:`.convmod2d`
(``convmod2d:K``), :mod:`.msla2d` (``msla2d:K``).  They are encoder types (:class:`GridType`: the
bidirectional form only, no decoding).  The 1D encoder types run on the flattened grid unchanged.

The 2D convolution (``convmod2d``, ``msla2d``) is depthwise over the grid with a weight ``(channels, K, K)``
whose taps are stored nearest-first on each axis (offsets 0, -1, +1, -2, +2, ..., as
:func:`.conv.centred_offset` orders them), so that an elastic kernel's leading ``[:k, :k]`` block is the
centred k x k kernel: ``msla2d:3`` uses the 3 x 3 centre of the ``msla2d:7`` kernel.  Zeros outside the grid.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from .conv import ConvType, centred_offset, init_conv
from .encoder import EncoderType
from .registry import exporting


def grid_side(t) -> int:
    """S of a grid of ``t = S * S`` tokens; ``ValueError`` when ``t`` is not a square.

    Traced (torch.export / ONNX, ``t`` symbolic): sqrt as a float in the graph, rounded (Cast, Pow, Cast),
    so that one graph serves every grid size."""
    if isinstance(t, int):
        s = math.isqrt(t)
        if s * s != t:
            raise ValueError(f"a 2D attention type needs a square grid of tokens (T = S * S, row-major): T={t} is not a square")
        return s
    return torch.sym_int(torch.sym_float(t) ** 0.5 + 0.5)


def square_problems(spec, max_seq_len: int) -> list[str]:
    """A space's longest sequence must be a square grid (the image's patches at the smallest patch size)."""
    s = math.isqrt(max_seq_len)
    if s * s != max_seq_len:
        return [f"{spec}: max_seq_len {max_seq_len} is not a square grid (a 2D type needs T = S * S tokens: an image's patches)"]
    return []


def small_softmax(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None) -> Tensor:
    """softmax(q k^T / sqrt(D) + mask) v over many short sequences (a window's, a row's), any batch axes:
    (..., L, D) each, ``mask`` additive (0 or -inf) broadcast over the batch axes.

    As GEMMs with the scores in memory: for sequences of a few dozen tokens CPU SDPA (flash, or its math path
    under a mask) ran about 1.6x slower on one thread (64 windows of 49 under a mask; 112 rows of 28)."""
    scores = torch.matmul(q, k.transpose(-2, -1)).mul_(q.shape[-1] ** -0.5)  # (..., L, L)
    if mask is not None:
        scores = scores.add_(mask)
    return torch.matmul(torch.softmax(scores, dim=-1), v)  # (..., L, D)


class GridType(EncoderType):
    """A 2D type: bidirectional only (an image encoder), over a square grid (``max_seq_len`` a square)."""

    def problems(self, spec, max_seq_len, heads):
        return square_problems(spec, max_seq_len)

    def grid_problems(self, spec, side: int) -> list[str]:
        """Why a layer of ``spec`` cannot run on an S x S grid of ``side`` S (empty: it can).  A space checks every grid
        it can sample (each resolution at each patch), not only its largest (``problems``): a layer meets them all."""
        return []

    def trace_length(self, max_seq_len):
        return max_seq_len  # the whole grid (one token less is not a square); no weight spans the sequence


# --------------------------------------------------------------------------- the 2D depthwise convolution


def conv2d_reference(x: Tensor, w: Tensor) -> Tensor:
    """Centred depthwise 2D convolution over the grid as K * K shifted multiply-adds:
    ``y[r, c] = sum_{a, b} w[:, a, b] x[r + offset(a), c + offset(b)]``, zeros outside the grid.

    x (B, H, T, D) of T = S * S tokens, w (H*D, K, K) -> (B, H, T, D).  Also the traced (ONNX) form: no grouped
    Conv, whose group count would have to be static (the timing graphs keep the head count symbolic)."""
    b, h, t, d = x.shape
    s, k = grid_side(t), w.shape[1]
    offsets = [centred_offset(a) for a in range(k)]
    before, after = -min(offsets), max(offsets)
    grid = F.pad(x.reshape(b, h, s, s, d), (0, 0, before, after, before, after))  # (B, H, S+K-1, S+K-1, D)
    taps = w.reshape(h, d, k, k).permute(0, 2, 3, 1)[None, :, :, :, None, None, :]  # (1, H, K, K, 1, 1, D)
    out = None
    for a, oa in enumerate(offsets):
        for c, oc in enumerate(offsets):
            term = grid[:, :, before + oa : before + oa + s, before + oc : before + oc + s] * taps[:, :, a, c]
            out = term if out is None else out + term
    return out.reshape(b, h, t, d)


def dwconv2d(x: Tensor, w: Tensor) -> Tensor:
    """The CPU / CUDA path of :func:`conv2d_reference`: the taps reordered by offset, one grouped conv2d."""
    if exporting():
        return conv2d_reference(x, w)
    b, h, t, d = x.shape
    s, k = grid_side(t), w.shape[1]
    before = -min(centred_offset(a) for a in range(k))
    order = sorted(range(k), key=centred_offset)  # taps of offset -before, ..., +after
    kernel = w[:, order][:, :, order][:, None]  # (C, 1, K, K): conv2d correlates, offsets ascending
    grid = x.reshape(b, h, s, s, d).permute(0, 1, 4, 2, 3).reshape(b, h * d, s, s)  # (B, C, S, S)
    if k % 2:
        y = F.conv2d(grid, kernel, padding=before, groups=h * d)
    else:
        y = F.conv2d(F.pad(grid, (before, k - 1 - before, before, k - 1 - before)), kernel, groups=h * d)
    return y.view(b, h, d, s, s).permute(0, 1, 3, 4, 2).reshape(b, h, t, d)  # (B, H, T, D)


class Conv2dType(ConvType, GridType):
    """A type with K x K depthwise kernels over the grid: 2 <= K <= the grid side of ``max_seq_len``."""

    forms = ("bidirectional",)

    def problems(self, spec, max_seq_len, heads):
        square = square_problems(spec, max_seq_len)
        if square:
            return square
        k, s = spec.param("K"), math.isqrt(max_seq_len)
        if k < 2:
            return [f"{spec}: K must be at least 2 (one tap is a per-channel scale, not a convolution)"]
        return [f"{spec}: K={k} exceeds the grid side {s} of max_seq_len {max_seq_len}"] if k > s else []

    def init_weight(self, name, weight, generator):
        init_conv(weight.view(weight.shape[0], -1), generator)  # tap (0, 0), offset (0, 0), starts at 1

    @staticmethod
    def conv2d_flops(batch: int, tokens: int, channels: int, k: int) -> float:
        return 2.0 * batch * tokens * channels * k * k
