"""Block-local softmax attention for CPU: cost O(T * keys per query) instead of O(T^2).

The sequence of every (batch, head) row is cut into N blocks of C tokens.  A query block
sees a few *groups* of keys, each group bringing its own scores (already scaled and masked,
``-inf`` where not allowed) and a way to apply its probabilities to its values:

* a **window**: the block itself and the ``before`` blocks preceding it, read through an
  overlapping strided view of the keys (no copy, :func:`window_bmm`), with hand-written backward
  passes whose key / value gradients are GEMMs accumulated into the blocks they land on
  (:func:`window_grad`; :class:`WindowScores`, :class:`WindowApply`);
* **shared keys** seen by every block (global tokens, block summaries);
* **gathered blocks** (BigBird's random blocks);
* **columns** (the strided pattern's every-S-th token).

:func:`attend_groups` takes one softmax over the union of the groups; the groups of a type
must not overlap (each allowed key in exactly one group).  FlexAttention would do this job,
but it has no backward pass on CPU; this engine trains.
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Callable

import torch
from torch import Tensor

NEG_INF = float("-inf")


def block_count(t, c: int):
    """ceil(t / c), the number of blocks; under ``torch.export`` (and the ONNX exporter) an unbacked size.

    A traced length ``t`` is a symbol; torch's shape checks would specialise on ``ceil(t / c)``
    being 0 or 1 (contiguity, broadcasting), which is false for some lengths and true for others,
    so the export would fail or serve only lengths over ``c``.  As an unbacked size (read from a
    tensor), the count gets no such guards; the checks below are run-time asserts of the program.
    """
    n = (t + c - 1) // c
    if not torch.compiler.is_exporting():
        return n
    n = torch.tensor(n).item()  # unbacked: no 0/1 specialisation
    torch._check(n >= 1)
    torch._check(n * c >= t)
    torch._check(n * c < t + c)
    return n


# --------------------------------------------------------------------------- workspace

_POOL: ContextVar[dict | None] = ContextVar("block_workspace", default=None)
RESULT = "result"  # the key of the buffer the last apply writes: the caller's output, when it registered one


def scratch(key: str | None, shape: tuple[int, ...], like: Tensor) -> Tensor:
    """An uninitialised (shape) buffer of ``like``'s dtype and device.

    Within :func:`reusing`, the same (key, shape) hands out the same buffer again: the head
    chunks of one inference call then write their scores into memory already touched, instead
    of a fresh allocation whose first write page-faults (a 1.5 MB score buffer costs about as
    much to fault in as its GEMM takes).  ``RESULT`` may be a view of the caller's output
    (:func:`reusing`'s ``into``), so the last GEMM writes the answer in place.  A None key, or no
    :func:`reusing` around the call (training, backward), allocates."""
    pool = _POOL.get()
    if pool is None or key is None:
        return like.new_empty(shape)
    if key == RESULT and pool.get(RESULT) is not None and pool[RESULT].numel() == math.prod(shape):
        return pool[RESULT].view(shape)
    slot = (key, tuple(shape), like.dtype, like.device)
    if slot not in pool:
        pool[slot] = like.new_empty(shape)
    return pool[slot]


@contextmanager
def reusing():
    """Buffers handed out by :func:`scratch` are reused until the context ends (inference only: a buffer
    is overwritten by the next call that asks for it, so each call's result must be consumed first).
    Yields a ``set_result(view)`` to register the caller's output slice for the next call."""
    pool: dict = {}
    token = _POOL.set(pool)

    def set_result(view: Tensor | None) -> None:
        pool[RESULT] = view if view is not None and view.is_contiguous() else None

    try:
        yield set_result
    finally:
        _POOL.reset(token)


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

    def unblock(self, y: Tensor) -> Tensor:
        """y (B*H*N, C, Dv) -> (B, H, T, Dv)."""
        y = y.reshape(self.b, self.h, self.n * self.c, y.shape[-1])
        return y[:, :, : self.t] if self.n * self.c != self.t else y  # a full slice would still cost a copy in backward


def windows(flat: Tensor, n: int, c: int, span: int) -> Tensor:
    """Overlapping view (n, span, D) of ``flat`` (rows, D): window w is rows [w*c, w*c + span)."""
    assert flat.is_contiguous() and flat.shape[0] >= (n - 1) * c + span, (flat.shape, n, c, span)
    d = flat.shape[-1]
    return flat.as_strided((n, span, d), (c * d, d, 1), flat.storage_offset())


def window_bmm(
    a: Tensor, x: Tensor, before: int, transpose: bool, alpha: float = 1.0, after: int = 0, key: str | None = None
) -> Tensor:
    """out[w] = alpha * a[w] @ win(w) (or @ win(w)^T), win(w) the rows of blocks w-before .. w+after of x.

    a (M, C, L); x (M*C, D) contiguous, M blocks of C rows.  Rows before the first block (and past the
    last) read as zeros.  The windows are an overlapping strided view of x (no copy); only the first
    ``before`` windows, which reach before the start, read a small zero-padded copy of the first blocks.
    A centred window (``after`` > 0, the bidirectional forms) reads one zero-padded copy of x.
    ``key``: the output's :func:`scratch` key.
    """
    m, c = a.shape[0], a.shape[1]
    span = (before + 1 + after) * c
    out = scratch(key, (m, c, x.shape[-1] if not transpose else span), a)
    if after:
        z = x.new_zeros
        flat = torch.cat((z(before * c, x.shape[-1]), x, z(after * c, x.shape[-1])))
        win = windows(flat, m, c, span)
        return torch.baddbmm(out, a, win.transpose(1, 2) if transpose else win, beta=0.0, alpha=alpha, out=out)
    head = min(before, m)  # windows reaching before row 0
    lead = torch.cat((x.new_zeros(before * c, x.shape[-1]), x[: head * c]))  # ((before + head) * C, D)
    parts = [(a[:head], windows(lead, head, c, span))]
    if m > head:
        parts.append((a[head:], windows(x, m - head, c, span)))
    for (ai, wi), o in zip(parts, (out[:head], out[head:])):
        wi = wi.transpose(1, 2) if transpose else wi
        if alpha == 1.0:
            torch.bmm(ai, wi, out=o)
        else:
            torch.baddbmm(o, ai, wi, beta=0.0, alpha=alpha, out=o)
    return out


def window_grad(a: Tensor, b: Tensor, before: int, alpha: float = 1.0, after: int = 0) -> Tensor:
    """The gradient :func:`window_bmm` sends to x: alpha * sum over windows of a[w]^T @ b[w], each window's
    sub-block s added into block w - before + s (those outside the rows, the zeros, dropped).

    a (M, C, span), b (M, C, D) -> (M*C, D).  One GEMM per sub-block, accumulated in place (beta = 1)
    into the blocks it lands on: no (M, span, D) window gradient is materialised and folded."""
    m, c, _ = a.shape
    own = a[:, :, before * c : (before + 1) * c].transpose(1, 2)
    out = torch.baddbmm(b.new_empty(()), own, b, beta=0.0, alpha=alpha)  # block w itself
    for s in range(before + 1 + after):
        shift = s - before  # window w's sub-block s is block w + shift
        if shift == 0 or abs(shift) >= m:
            continue
        sub = a[:, :, s * c : (s + 1) * c].transpose(1, 2)
        if shift < 0:
            out[: m + shift].baddbmm_(sub[-shift:], b[-shift:], alpha=alpha)
        else:
            out[shift:].baddbmm_(sub[: m - shift], b[: m - shift], alpha=alpha)
    return out.view(m * c, b.shape[-1])


class WindowScores(torch.autograd.Function):
    """scores[w] = scale * q[w] @ win(k)[w]^T, without materialising the overlapping windows."""

    @staticmethod
    def forward(ctx, q: Tensor, k_rows: Tensor, before: int, scale: float, after: int = 0) -> Tensor:  # -> (M, C, span)
        ctx.save_for_backward(q, k_rows)
        ctx.before, ctx.scale, ctx.after = before, scale, after
        return window_bmm(q, k_rows, before, transpose=True, alpha=scale, after=after, key="scores")

    @staticmethod
    def backward(ctx, ds: Tensor):
        q, k_rows = ctx.saved_tensors
        ds = ds.contiguous()  # bmm takes a slow per-matrix path on odd strides (e.g. an expanded grad)
        dq = None
        if ctx.needs_input_grad[0]:
            dq = window_bmm(ds, k_rows, ctx.before, transpose=False, alpha=ctx.scale, after=ctx.after)
        dk = None
        if ctx.needs_input_grad[1]:
            dk = window_grad(ds, q, ctx.before, alpha=ctx.scale, after=ctx.after)
        return dq, dk, None, None, None


class WindowApply(torch.autograd.Function):
    """out[w] = p[w] @ win(v)[w]."""

    @staticmethod
    def forward(ctx, p: Tensor, v_rows: Tensor, before: int, after: int = 0) -> Tensor:  # p (M, C, span) -> (M, C, Dv)
        ctx.save_for_backward(p, v_rows)
        ctx.before, ctx.after = before, after
        return window_bmm(p, v_rows, before, transpose=False, after=after, key=RESULT)

    @staticmethod
    def backward(ctx, dout: Tensor):
        p, v_rows = ctx.saved_tensors
        dout = dout.contiguous()
        dp = window_bmm(dout, v_rows, ctx.before, transpose=True, after=ctx.after) if ctx.needs_input_grad[0] else None
        dv = window_grad(p, dout, ctx.before, after=ctx.after) if ctx.needs_input_grad[1] else None
        return dp, dv, None, None


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


def _rows(lay: Blocks, x: Tensor) -> Tensor:
    """x (B, H, T, D) as the contiguous rows (B*H*N*C, D) the window views need: x itself when it is contiguous and
    T % C == 0; else a copy (one head of a fused projection reshapes to a strided view, which windows() cannot use)."""
    return lay.padded(x).reshape(-1, x.shape[-1]).contiguous()


def window_group(lay: Blocks, q_blocks: Tensor, k: Tensor, v: Tensor, before: int, bias: Tensor) -> Group:
    """Each block with its ``before`` preceding blocks; bias (N, C, (before+1)*C), 0 or -inf.

    Blocks before the first one of a row are the previous row's last blocks (or zeros for the first
    row): the bias must hide them (-inf where the key position is negative).
    """
    k_rows, v_rows = (_rows(lay, x) for x in (k, v))
    scores = WindowScores.apply(q_blocks, k_rows, before, 1.0 / math.sqrt(q_blocks.shape[-1]))  # (BHN, C, span), scaled
    scores.view(lay.rows, lay.n, lay.c, -1).add_(bias)  # in place: its backward needs neither operand
    return Group(scores, lambda p: WindowApply.apply(p, v_rows, before))


def centred_window_group(lay: Blocks, q_blocks: Tensor, k: Tensor, v: Tensor, before: int, after: int, bias: Tensor) -> Group:
    """Each block with ``before`` blocks before it and ``after`` behind it (a bidirectional window);
    bias (N, C, (before+1+after)*C), 0 or -inf, hides what lies outside the row's sequence."""
    k_rows, v_rows = (_rows(lay, x) for x in (k, v))
    scores = WindowScores.apply(q_blocks, k_rows, before, 1.0 / math.sqrt(q_blocks.shape[-1]), after)
    scores.view(lay.rows, lay.n, lay.c, -1).add_(bias)
    return Group(scores, lambda p: WindowApply.apply(p, v_rows, before, after))


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


def _softmax(scores: Tensor) -> Tensor:
    """Softmax over the last axis, in place when no gradient is recorded (saves a (BHN, C, L) buffer)."""
    if torch.is_grad_enabled() and scores.requires_grad:
        return torch.softmax(scores, dim=-1)
    return torch.softmax(scores, dim=-1, out=scores)


def attend_groups(lay: Blocks, groups: list[Group]) -> Tensor:
    """One softmax over the union of ``groups``' keys; returns (B, H, T, Dv)."""
    if len(groups) == 1:
        probs = [_softmax(groups[0].scores)]
    else:
        scores = torch.cat([g.scores for g in groups], dim=-1)  # (BHN, C, sum L)
        probs = _softmax(scores).split([g.scores.shape[-1] for g in groups], dim=-1)
    out = groups[0].apply(probs[0])
    for g, p in zip(groups[1:], probs[1:]):
        out = out + g.apply(p) if torch.is_grad_enabled() else out.add_(g.apply(p))
    return lay.unblock(out)


def as_bias(allowed: Tensor, dtype: torch.dtype) -> Tensor:
    """0 where allowed, -inf elsewhere."""
    return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill(~allowed, NEG_INF)


# --------------------------------------------------------------------------- the traced (ONNX) form


@dataclass
class TracedBlocks:
    """What a traced type's extra key groups read: queries, keys and values cut into N blocks of C
    ((B, H, N, C, D), zero-padded at the end, the queries already scaled) and the absolute query
    positions ``i`` (N, C, 1)."""

    q: Tensor
    k: Tensor
    v: Tensor
    i: Tensor


TracedGroup = tuple[Tensor, Callable[[Tensor], Tensor]]  # scores (B, H, N, C, L), masked; apply(p) -> (B, H, N, C, Dv)


def traced_shared(x: TracedBlocks, k_s: Tensor, v_s: Tensor, allowed: Tensor) -> TracedGroup:
    """Keys every block may see: k_s, v_s (B, H, S, D) (global tokens, block summaries); ``allowed``
    broadcastable to (N, C, S)."""
    scores = (x.q @ k_s[:, :, None].transpose(-2, -1)).masked_fill(~allowed, NEG_INF)  # (B, H, N, C, S)
    return scores, lambda p: p @ v_s[:, :, None]


def traced_gathered(x: TracedBlocks, picks: Tensor, allowed: Tensor) -> TracedGroup:
    """Per query block n, the key blocks picks[n] (N, R) (BigBird's random blocks, a Gather in ONNX);
    ``allowed`` broadcastable to (N, C, R*C)."""
    b, h, n, c, d = x.k.shape
    r = picks.shape[1]
    kg, vg = (y[:, :, picks.reshape(-1)].reshape(b, h, n, r * c, y.shape[-1]) for y in (x.k, x.v))
    scores = (x.q @ kg.transpose(-2, -1)).masked_fill(~allowed, NEG_INF)  # (B, H, N, C, R*C)
    return scores, lambda p: p @ vg


def traced_columns(x: TracedBlocks, allowed: Tensor) -> TracedGroup:
    """The same position in other blocks: query (n, a) sees keys (m, a) (the strided pattern's column);
    ``allowed`` broadcastable to (N, C, N): one (N, N) product per position a."""
    scores = (x.q.transpose(2, 3) @ x.k.transpose(2, 3).transpose(-2, -1)).transpose(2, 3)  # (B, H, N, C, N)
    vc = x.v.transpose(2, 3)  # (B, H, C, N, Dv)
    return scores.masked_fill(~allowed, NEG_INF), lambda p: (p.transpose(2, 3) @ vc).transpose(2, 3)


def traced_window_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    c: int,
    before: int,
    allowed: Callable[[Tensor, Tensor], Tensor],
    extra: Callable[[TracedBlocks], list[TracedGroup]] | None = None,
    *,
    after: int = 0,
    real: Tensor | None = None,
) -> Tensor:
    """Block-local softmax attention as plain MatMul / Softmax nodes, O(T * (before+1) * C): what the ONNX
    exporter traces for a sparse type (ONNX Runtime runs it block by block instead of a dense (T, T) mask).

    q, k, v (B, H, T, D); blocks of ``c`` queries see their own block, the ``before`` blocks ahead of it
    and the ``after`` blocks behind it (a bidirectional window) where ``allowed(i, j)`` (absolute
    positions, broadcast; keys before 0 and past the end are hidden here);
    ``extra(blocks)``: further key groups every query block scores too (global tokens, summaries, random
    blocks, columns: :func:`traced_shared`, :func:`traced_gathered`, :func:`traced_columns`), not
    overlapping the window's allowed keys nor each other; one softmax over them all.  ``real`` (bool,
    (B or 1, H or 1, T)): which keys hold tokens, when a row's sequence ends before T (dilated's
    residue streams); by default every key before T.  No branch on the
    length: the sequence is always padded to whole blocks (a symbolic, unbacked block count when exporting).
    """
    b, h, t, d = q.shape
    n = block_count(t, c)
    span = (before + 1 + after) * c
    qb = torch.nn.functional.pad(q, (0, 0, 0, n * c - t)).reshape(b, h, n, c, d) * (1.0 / math.sqrt(d))

    def window(xb: Tensor) -> Tensor:  # (B, H, N, C, D) -> (B, H, N, span, D): blocks m-before .. m+after
        xb = torch.nn.functional.pad(xb, (0, 0, 0, 0, before, after))  # (B, H, before+N+after, C, D)
        return torch.cat([xb[:, :, s : s + n] for s in range(before + 1 + after)], dim=3) if before + after else xb

    blk = torch.arange(n, device=q.device)[:, None, None]
    i = blk * c + torch.arange(c, device=q.device)[None, :, None]  # (N, C, 1)
    j = (blk - before) * c + torch.arange(span, device=q.device)[None, None, :]  # (N, 1, span)
    # Each block's keys and values by one Gather from the unpadded tensors (rows clamped into the sequence; the mask
    # hides those): ONNX Runtime spent more on the Pad / Slice / Concat that cut the windows out than on the MatMuls.
    rows = j.reshape(n * span).clamp(min=0, max=t - 1)
    kw, vw = (x.index_select(2, rows).reshape(b, h, n, span, x.shape[-1]) for x in (k, v))  # (B, H, N, span, D)
    seen = allowed(i, j) & (j >= 0)
    if real is not None:  # keys that hold no token hidden (a padded query keeps itself: no empty row)
        ok = torch.nn.functional.pad(real.to(q.dtype), (0, n * c - t)).reshape(*real.shape[:2], n, c, 1)
        seen = seen & ((window(ok).transpose(-2, -1) > 0) | (j == i))  # (B or 1, H or 1, N, C, span)
    elif after:
        seen = seen & ((j < t) | (j == i))
    scores = (qb @ kw.transpose(-2, -1)).masked_fill(~seen, NEG_INF)  # (B, H, N, C, span)
    groups = [(scores, lambda p: p @ vw)]
    if extra:  # further key groups read the keys and values cut into blocks
        kb, vb = (torch.nn.functional.pad(x, (0, 0, 0, n * c - t)).reshape(b, h, n, c, x.shape[-1]) for x in (k, v))
        groups += extra(TracedBlocks(qb, kb, vb, i))
    if len(groups) == 1:
        out = torch.softmax(scores, dim=-1) @ vw
    else:
        p = torch.softmax(torch.cat([s for s, _ in groups], dim=-1), dim=-1)
        parts = p.split([s.shape[-1] for s, _ in groups], dim=-1)
        out = groups[0][1](parts[0])
        for (_, apply), part in zip(groups[1:], parts[1:]):
            out = out + apply(part)
    return out.reshape(b, h, n * c, -1)[:, :, :t]
