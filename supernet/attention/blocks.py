"""Block-local softmax attention for CPU: cost O(T * keys per query) instead of O(T^2).

The sequence of every (batch, head) row is cut into N blocks of C tokens.  A query block
sees a few *groups* of keys, each group bringing its own scores (already scaled and masked,
``-inf`` where not allowed) and a way to apply its probabilities to its values:

* a **window**: the block itself and the ``before`` blocks preceding it, read through an
  overlapping strided view of the keys (no copy), with hand-written backward passes that
  fold the window gradients back (:class:`WindowScores`, :class:`WindowApply`);
* **shared keys** seen by every block (global tokens, block summaries);
* **gathered blocks** (BigBird's random blocks);
* **columns** (the strided pattern's every-S-th token).

:func:`attend_groups` takes one softmax over the union of the groups; the groups of a type
must not overlap (each allowed key in exactly one group).  FlexAttention would do this job,
but it has no backward pass on CPU; this engine trains.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch
from torch import Tensor

NEG_INF = float("-inf")


# --------------------------------------------------------------------------- layout


@dataclass(frozen=True)
class Blocks:
    """The block layout of (B, H, T, D) tensors: N blocks of C tokens per row, T padded to N*C."""

    b: int
    h: int
    t: int
    c: int

    @property
    def n(self) -> int:
        return -(-self.t // self.c)

    @property
    def rows(self) -> int:
        return self.b * self.h

    def padded(self, x: Tensor) -> Tensor:
        """x (B, H, T, D) -> (B*H, N*C, D), zero-padded at the end."""
        x = x.reshape(self.rows, self.t, x.shape[-1])
        pad = self.n * self.c - self.t
        return torch.cat((x, x.new_zeros(self.rows, pad, x.shape[-1])), dim=1) if pad else x

    def blocked(self, x: Tensor) -> Tensor:
        """x (B, H, T, D) -> (B*H*N, C, D)."""
        return self.padded(x).reshape(self.rows * self.n, self.c, x.shape[-1])

    def flat(self, x: Tensor, before: int) -> Tensor:
        """x (B, H, T, D) -> ((B*H*N + before) * C, D) contiguous, with ``before`` zero blocks in front.

        Window w of :func:`windows` then covers query block w and the ``before`` blocks ahead of
        it; for the first blocks of a row those are padding or the previous row, which the
        window's mask hides.
        """
        rows = self.padded(x).reshape(-1, x.shape[-1])  # (B*H*N*C, D)
        return torch.cat(
            (rows.new_zeros(before * self.c, rows.shape[-1]), rows)
        )  # cat writes each row once; F.pad fills all first

    def centred_flat(self, x: Tensor, before: int, after: int) -> Tensor:
        """Like :meth:`flat`, also with ``after`` zero blocks at the end: window w of :func:`windows` then
        covers the ``before`` blocks ahead of query block w, the block and the ``after`` blocks behind it."""
        rows = self.padded(x).reshape(-1, x.shape[-1])  # (B*H*N*C, D)
        return torch.cat((rows.new_zeros(before * self.c, rows.shape[-1]), rows, rows.new_zeros(after * self.c, rows.shape[-1])))

    def unblock(self, y: Tensor) -> Tensor:
        """y (B*H*N, C, Dv) -> (B, H, T, Dv)."""
        return y.reshape(self.b, self.h, self.n * self.c, y.shape[-1])[:, :, : self.t]


def windows(flat: Tensor, n: int, c: int, span: int) -> Tensor:
    """Overlapping view (n, span, D) of ``flat`` (rows, D): window w is rows [w*c, w*c + span)."""
    assert flat.is_contiguous() and flat.shape[0] >= (n - 1) * c + span, (flat.shape, n, c, span)
    d = flat.shape[-1]
    return flat.as_strided((n, span, d), (c * d, d, 1), flat.storage_offset())


def fold_windows(g: Tensor, c: int, rows: int) -> Tensor:
    """Adjoint of :func:`windows`: sum window gradients g (n, span, D) back into (rows, D)."""
    n, span, d = g.shape
    out = g.new_zeros(rows, d)
    for s in range(span // c):
        out[s * c : s * c + n * c].view(n, c, d).add_(g[:, s * c : (s + 1) * c])
    return out


class WindowScores(torch.autograd.Function):
    """scores[w] = q[w] @ windows(k)[w]^T, without materialising the overlapping windows."""

    @staticmethod
    def forward(ctx, q: Tensor, k_flat: Tensor, span: int) -> Tensor:  # q (N, C, D) -> (N, C, span)
        ctx.save_for_backward(q, k_flat)
        ctx.span = span
        return torch.bmm(q, windows(k_flat, q.shape[0], q.shape[1], span).transpose(1, 2))

    @staticmethod
    def backward(ctx, ds: Tensor):
        q, k_flat = ctx.saved_tensors
        n, c, _ = q.shape
        ds = ds.contiguous()  # bmm takes a slow per-matrix path on odd strides (e.g. an expanded grad)
        dq = torch.bmm(ds, windows(k_flat, n, c, ctx.span)) if ctx.needs_input_grad[0] else None  # (N, C, D)
        dk = fold_windows(torch.bmm(ds.transpose(1, 2), q), c, k_flat.shape[0]) if ctx.needs_input_grad[1] else None
        return dq, dk, None


class WindowApply(torch.autograd.Function):
    """out[w] = p[w] @ windows(v)[w]."""

    @staticmethod
    def forward(ctx, p: Tensor, v_flat: Tensor) -> Tensor:  # p (N, C, span) -> (N, C, Dv)
        ctx.save_for_backward(p, v_flat)
        return torch.bmm(p, windows(v_flat, p.shape[0], p.shape[1], p.shape[2]))

    @staticmethod
    def backward(ctx, dout: Tensor):
        p, v_flat = ctx.saved_tensors
        n, c, span = p.shape
        dout = dout.contiguous()
        dp = torch.bmm(dout, windows(v_flat, n, c, span).transpose(1, 2)) if ctx.needs_input_grad[0] else None
        dv = fold_windows(torch.bmm(p.transpose(1, 2), dout), c, v_flat.shape[0]) if ctx.needs_input_grad[1] else None
        return dp, dv


# --------------------------------------------------------------------------- groups


@dataclass(frozen=True)
class Group:
    """Keys of one kind: ``scores`` (B*H*N, C, L) scaled and masked; ``apply(p)`` -> (B*H*N, C, Dv)."""

    scores: Tensor
    apply: Callable[[Tensor], Tensor]


def _biased(scores: Tensor, bias: Tensor, lay: Blocks, scale: float) -> Tensor:
    """scale * scores + bias, scores (B*H*N, C, L), bias broadcastable to (N, C, L)."""
    s = scores.view(lay.rows, lay.n, lay.c, scores.shape[-1])
    return torch.add(bias, s, alpha=scale).view_as(scores)


def window_group(lay: Blocks, q_blocks: Tensor, k: Tensor, v: Tensor, before: int, bias: Tensor) -> Group:
    """Each block with its ``before`` preceding blocks; bias (N, C, (before+1)*C), 0 or -inf."""
    span = (before + 1) * lay.c
    k_flat, v_flat = lay.flat(k, before), lay.flat(v, before)
    scores = WindowScores.apply(q_blocks, k_flat, span)  # (BHN, C, span)
    return Group(_biased(scores, bias, lay, 1.0 / math.sqrt(q_blocks.shape[-1])), lambda p: WindowApply.apply(p, v_flat))


def centred_window_group(lay: Blocks, q_blocks: Tensor, k: Tensor, v: Tensor, before: int, after: int, bias: Tensor) -> Group:
    """Each block with ``before`` blocks before it and ``after`` behind it (a bidirectional window);
    bias (N, C, (before+1+after)*C), 0 or -inf, hides what lies outside the row's sequence."""
    span = (before + 1 + after) * lay.c
    k_flat, v_flat = lay.centred_flat(k, before, after), lay.centred_flat(v, before, after)
    scores = WindowScores.apply(q_blocks, k_flat, span)  # (BHN, C, span)
    return Group(_biased(scores, bias, lay, 1.0 / math.sqrt(q_blocks.shape[-1])), lambda p: WindowApply.apply(p, v_flat))


def shared_group(lay: Blocks, q: Tensor, k_shared: Tensor, v_shared: Tensor, bias: Tensor) -> Group:
    """Keys every block may see: k_shared, v_shared (B*H, S, D); bias (N, C or 1, S)."""
    q_rows = lay.padded(q)  # (BH, N*C, D)
    s = torch.bmm(q_rows, k_shared.transpose(1, 2)).view(lay.rows * lay.n, lay.c, -1)  # (BHN, C, S)

    def apply(p: Tensor) -> Tensor:
        out = torch.bmm(p.reshape(lay.rows, lay.n * lay.c, -1), v_shared)  # (BH, N*C, Dv)
        return out.view(lay.rows * lay.n, lay.c, -1)

    return Group(_biased(s, bias, lay, 1.0 / math.sqrt(q.shape[-1])), apply)


def gathered_group(lay: Blocks, q_blocks: Tensor, k: Tensor, v: Tensor, picks: Tensor, bias: Tensor) -> Group:
    """Per query block n, the key blocks picks[n] (N, R) (copied); bias (N, C or 1, R*C)."""
    n, r = picks.shape

    def gather(x: Tensor) -> Tensor:
        xb = lay.padded(x).view(lay.rows, n, lay.c, x.shape[-1])  # (BH, N, C, D)
        return xb.index_select(1, picks.reshape(-1)).view(lay.rows * n, r * lay.c, x.shape[-1])  # (BHN, R*C, D)

    kg, vg = gather(k), gather(v)
    s = torch.bmm(q_blocks, kg.transpose(1, 2))  # (BHN, C, R*C)
    return Group(_biased(s, bias, lay, 1.0 / math.sqrt(q_blocks.shape[-1])), lambda p: torch.bmm(p, vg))


def column_group(lay: Blocks, q: Tensor, k: Tensor, v: Tensor, bias: Tensor) -> Group:
    """Same position within the block, other blocks: query (n, a) sees keys (m, a); bias (N, 1, N)."""
    n, c = lay.n, lay.c

    def columns(x: Tensor) -> Tensor:  # (B, H, T, D) -> (BH*C, N, D)
        return lay.padded(x).view(lay.rows, n, c, -1).transpose(1, 2).reshape(lay.rows * c, n, x.shape[-1])

    vc = columns(v)
    s = torch.bmm(columns(q), columns(k).transpose(1, 2))  # (BH*C, N, N): query row, key row
    s = s.view(lay.rows, c, n, n).transpose(1, 2).reshape(lay.rows * n, c, n)  # (BHN, C, N)

    def apply(p: Tensor) -> Tensor:
        pc = p.view(lay.rows, n, c, n).transpose(1, 2).reshape(lay.rows * c, n, n)
        out = torch.bmm(pc, vc)  # (BH*C, N, Dv)
        return out.view(lay.rows, c, n, -1).transpose(1, 2).reshape(lay.rows * n, c, -1)

    return Group(_biased(s, bias, lay, 1.0 / math.sqrt(q.shape[-1])), apply)


def attend_groups(lay: Blocks, groups: list[Group]) -> Tensor:
    """One softmax over the union of ``groups``' keys; returns (B, H, T, Dv)."""
    if len(groups) == 1:
        probs = [torch.softmax(groups[0].scores, dim=-1)]
    else:
        scores = torch.cat([g.scores for g in groups], dim=-1)  # (BHN, C, sum L)
        probs = torch.softmax(scores, dim=-1).split([g.scores.shape[-1] for g in groups], dim=-1)
    out = groups[0].apply(probs[0])
    for g, p in zip(groups[1:], probs[1:]):
        out = out + g.apply(p)
    return lay.unblock(out)


def as_bias(allowed: Tensor, dtype: torch.dtype) -> Tensor:
    """0 where allowed, -inf elsewhere."""
    return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill(~allowed, NEG_INF)
