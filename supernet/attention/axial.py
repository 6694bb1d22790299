"""Axial attention over the token grid: ``axial`` (Ho et al. 2019, Axial Attention in Multidimensional Transformers).

Softmax attention along each row of the S x S grid (:mod:`.grid`), then along each column on the row
attention's output: ``y = A_row v`` then ``out = A_col y``, both with the layer's q and k
(``A_row[i, j] = softmax over the S keys j of i's row of q_i . k_j / sqrt(D)``, ``A_col`` likewise over i's
column).  So every token reaches every other one in one layer (through the token at its row and the
other's column), as the paper's row-then-column stack does, here with one set of projections.

* reference: the two dense (T, T) masks (same row; same column) under a full softmax each, composed;
* fast path: rows are a free view of (B, H, T, D) as (B, H * S, S, D), the columns a transposed copy of
  q, k and the row output; each softmax attention over the S-token sequences as batched GEMMs
  (:func:`.grid.small_softmax`); transposed back;
* ONNX form: the same views and two SDPAs (two opset-23 ``Attention`` nodes), no branch on the length;
* cost: 4 D FLOPs per (query, key) pair: 2 S pairs per token.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from .grid import GridType, grid_side, small_softmax
from .patterns import masked_softmax_reference
from .registry import register


def axis_masks(s: int, device=None) -> tuple[Tensor, Tensor]:
    """(T, T) bool each: same row, same column (row-major tokens)."""
    t = torch.arange(s * s, device=device)
    row, col = t // s, t % s
    return row[:, None] == row[None, :], col[:, None] == col[None, :]


def _columns(x: Tensor, s) -> Tensor:
    """(B, H, T, D) row-major -> (B, H * S, S, D): one batch entry per column, its tokens top to bottom."""
    b, h, t, d = x.shape
    return x.reshape(b, h, s, s, d).transpose(2, 3).reshape(b, h * s, s, d)


class Axial(GridType):
    name = "axial"
    doc = "axial attention over a square grid of tokens: softmax along each row, then along each column on its output"
    fused_onnx = True  # two Attention nodes: rows, then columns

    def bidirectional_reference(self, q, k, v, spec, w):
        same_row, same_col = axis_masks(grid_side(q.shape[2]), q.device)
        return masked_softmax_reference(q, k, masked_softmax_reference(q, k, v, same_row), same_col)

    def _mix(self, q, k, v, attention):
        b, h, t, d = q.shape
        s = grid_side(t)
        rows = attention(*(x.reshape(b, h * s, s, d) for x in (q, k, v)))  # (B, H*S, S, D): a free view of each
        y = attention(_columns(q, s), _columns(k, s), _columns(rows.reshape(b, h, t, d), s))  # (B, H*S, S, D)
        return y.reshape(b, h, s, s, d).transpose(2, 3).reshape(b, h, t, d)  # (B, H, T, D) row-major again

    def bidirectional(self, q, k, v, spec, w):
        return self._mix(q, k, v, small_softmax)

    def bidirectional_onnx(self, q, k, v, spec, w):
        return self._mix(q, k, v, F.scaled_dot_product_attention)  # two Attention nodes

    def bidirectional_flops(self, spec, batch, t, heads, head_dim):
        s = grid_side(t)
        return 4.0 * batch * heads * t * 2 * s * head_dim  # S keys along the row, then S along the column


axial = register(Axial())
