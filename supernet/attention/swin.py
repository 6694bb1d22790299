"""Swin Transformer's window attention over the token grid: ``swin:W`` and ``swin-shift:W`` (Liu et al. 2021).

Softmax attention inside non-overlapping W x W windows of the S x S grid (:mod:`.grid`); W must divide S.
``swin-shift:W`` is the shifted partition: the windows offset by ``W // 2`` rows and columns, cut at the
grid's border (so the border windows are smaller).  Swin alternates the two from layer to layer; a type
is not told its layer, so the alternation is two spellings of one object (``swin:W``, then
``swin-shift:W`` in the next layer): a space lists both and a search may alternate them, or not.  (A
shift parameter would not do: a parameter is a positive integer, and the unshifted layer's is 0.)

* reference: the dense (T, T) mask of the definition (query i sees key j when they fall in the same
  window: ``floor((row - shift) / W)`` and ``floor((col - shift) / W)`` equal) under a full softmax;
* fast path: Swin's cyclic shift (``torch.roll`` by -W // 2) and window partition (reshapes), softmax
  attention over the (B, H, windows, W*W, D) windows as batched GEMMs (:func:`.grid.small_softmax`) under
  Swin's mask (made once per grid) where tokens that came round the border share a window with others
  (its ``calculate_mask``), then the windows merged and rolled back;
* ONNX form: the same roll and reshapes, one SDPA over (B, H x windows, W*W, D) (an opset-23 ``Attention``
  node, with the shifted form's mask built in the graph), no branch on the traced length;
* cost: 4 D FLOPs per (query, key) pair computed: T * W * W pairs (the mask skips nothing in SDPA).

No relative position bias: positions are the model's (its learned or rotary positions).
"""

from __future__ import annotations

import math
from functools import lru_cache

import torch
import torch.nn.functional as F
from torch import Tensor

from .grid import GridType, grid_side, small_softmax
from .patterns import masked_softmax_reference
from .registry import register


def window_groups(s, w: int, shift: int, device=None) -> Tensor:
    """(S,) the window index along one axis of each row (or column): ``floor((r - shift) / W)``."""
    return torch.div(torch.arange(s, device=device) - shift, w, rounding_mode="floor")


def window_mask(s: int, w: int, shift: int, device=None) -> Tensor:
    """(T, T) bool: query i sees key j when they share a window (the definition, row-major tokens)."""
    g = window_groups(s, w, shift, device)
    rows, cols = g[:, None].expand(s, s).reshape(-1), g[None, :].expand(s, s).reshape(-1)  # (T,) per token
    return (rows[:, None] == rows[None, :]) & (cols[:, None] == cols[None, :])


def _rolled_groups(s, w: int, shift: int, device=None) -> Tensor:
    """(S / W, W): the window index, in the original grid, of each row of the rolled grid's windows."""
    rolled = torch.roll(torch.arange(s, device=device), -shift)  # the row that rolled row r' holds (as the grid rolls)
    return torch.div(rolled - shift, w, rounding_mode="floor").reshape(-1, w)


def rolled_window_mask(s, w: int, shift: int, device=None) -> Tensor:
    """(nW, W*W, W*W) bool: Swin's mask of each window of the rolled grid (windows row-major; a window's
    tokens row-major): True where both tokens came from the same window of the shifted partition."""
    g = _rolled_groups(s, w, shift, device)  # (n, W)
    n = g.shape[0]
    rows = g[:, None, :, None].expand(n, n, w, w).reshape(n * n, w * w)  # (nW, L): row group of each token
    cols = g[None, :, None, :].expand(n, n, w, w).reshape(n * n, w * w)
    return (rows[:, :, None] == rows[:, None, :]) & (cols[:, :, None] == cols[:, None, :])


@lru_cache(maxsize=64)
def _additive_mask(s: int, w: int, shift: int, device: torch.device, dtype: torch.dtype) -> Tensor:
    """The fast path's mask of the rolled windows: (nW, L, L), 0 where allowed, -inf elsewhere (made once)."""
    allowed = rolled_window_mask(s, w, shift, device)
    return torch.zeros(allowed.shape, dtype=dtype, device=device).masked_fill_(~allowed, float("-inf"))


def partition(x: Tensor, s, w: int, shift: int) -> Tensor:
    """(B, H, T, D) row-major -> (B, H, nW, W*W, D): Swin's cyclic shift (``torch.roll`` by -shift) and its
    window partition (windows row-major, a window's tokens row-major)."""
    b, h, t, d = x.shape
    n = s // w
    g = x.reshape(b, h, s, s, d)
    if shift:
        g = torch.roll(g, (-shift, -shift), (2, 3))
    return g.reshape(b, h, n, w, n, w, d).permute(0, 1, 2, 4, 3, 5, 6).reshape(b, h, n * n, w * w, d)


def merge(y: Tensor, s, w: int, shift: int) -> Tensor:
    """The inverse of :func:`partition`: (B, H, nW, W*W, D) -> (B, H, T, D) row-major."""
    b, h, _, _, d = y.shape
    n = s // w
    g = y.reshape(b, h, n, n, w, w, d).permute(0, 1, 2, 4, 3, 5, 6).reshape(b, h, s, s, d)
    if shift:
        g = torch.roll(g, (shift, shift), (2, 3))
    return g.reshape(b, h, s * s, d)


class ShiftedWindows(GridType):
    params = ("W",)
    fused_onnx = True  # one Attention node over the windows (with the shifted form's mask)

    def __init__(self, shifted: bool):
        self.shifted = shifted
        self.name = "swin-shift" if shifted else "swin"
        self.doc = (
            "Swin shifted-window attention: softmax inside W x W windows offset by W // 2 and cut at the grid's "
            "border (the next layer after swin:W), over a square grid of tokens"
            if shifted
            else "Swin window attention: softmax inside non-overlapping W x W windows of a square grid of tokens"
        )

    def problems(self, spec, max_seq_len, heads):
        out = super().problems(spec, max_seq_len, heads)
        w, s = spec.param("W"), math.isqrt(max_seq_len)
        if w < 2:
            out.append(f"{spec}: W must be at least 2 (a 1 x 1 window sees only its own token)")
        elif not out and s % w:
            out.append(f"{spec}: the window W={w} does not divide the grid side {s} of max_seq_len {max_seq_len}")
        return out

    def grid_problems(self, spec, side):
        w = spec.param("W")
        return [f"{spec}: the window W={w} does not divide the grid side {side}"] if w >= 2 and side % w else []

    def geometry(self, spec, t) -> tuple[int, int, int]:
        """(grid side S, window W, shift) of a layer over ``t`` tokens; ``ValueError`` where W does not divide S."""
        s, w = grid_side(t), spec.param("W")
        if isinstance(s, int) and s % w:
            raise ValueError(f"{spec}: the window W={w} does not divide the grid side S={s} of T={t} tokens")
        return s, w, (w // 2 if self.shifted else 0)

    def bidirectional_reference(self, q, k, v, spec, w):
        s, win, shift = self.geometry(spec, q.shape[2])
        return masked_softmax_reference(q, k, v, window_mask(s, win, shift, q.device))

    def bidirectional(self, q, k, v, spec, w):
        s, win, shift = self.geometry(spec, q.shape[2])
        mask = _additive_mask(s, win, shift, q.device, q.dtype) if shift else None  # (nW, L, L), over B and H
        y = small_softmax(*(partition(x, s, win, shift) for x in (q, k, v)), mask)  # (B, H, nW, L, D)
        return merge(y, s, win, shift)

    def bidirectional_onnx(self, q, k, v, spec, w):
        b, h, t, d = q.shape
        s, win, shift = self.geometry(spec, t)
        n = s // win
        qw, kw, vw = (partition(x, s, win, shift).reshape(b, h * n * n, win * win, d) for x in (q, k, v))
        mask = rolled_window_mask(s, win, shift, q.device).repeat(h, 1, 1) if shift else None  # (H * nW, L, L)
        y = F.scaled_dot_product_attention(qw, kw, vw, attn_mask=mask)  # one Attention node
        return merge(y.reshape(b, h, n * n, win * win, d), s, win, shift)

    def bidirectional_flops(self, spec, batch, t, heads, head_dim):
        w = spec.param("W")
        return 4.0 * batch * heads * t * w * w * head_dim  # scores and weighted sum over each window's W*W keys


swin = register(ShiftedWindows(shifted=False))
swin_shift = register(ShiftedWindows(shifted=True))
