"""Sparse softmax attention: local, dilated, strided, fixed, longformer, bigbird.

Each type has a pattern (:mod:`.patterns`) from which its reference (masked softmax), its ONNX
form (one masked SDPA) and its CUDA path (a FlexAttention block mask) are derived, and a CPU
fast path built here from the block engine (:mod:`.blocks`) whose cost grows as O(T * keys
per query).  The fast paths branch on the sequence length freely (padding, block counts): the
ONNX exporter never traces them.

The masks of a fast path depend only on (type, length, device, dtype); they are built once
and cached (:func:`_cached`).
"""

from __future__ import annotations

from functools import lru_cache

import torch
from torch import Tensor

from search_spaces.attention import AttentionSpec

from . import patterns
from .blocks import Blocks, as_bias, attend_groups, column_group, gathered_group, shared_group, window_group
from .flex import flex_path
from .registry import register

MIN_BLOCK, MAX_BLOCK = 16, 64


def register_pattern(kind: str, pattern):
    """Register a sparse type's CPU fast path; its reference, ONNX form and CUDA path all come from ``pattern``."""
    return register(
        kind,
        reference=patterns.reference_for(pattern),
        cuda=flex_path(pattern),
        onnx=patterns.masked_sdpa_for(pattern),
        pattern=pattern,
    )


def _block_size(window: int) -> int:
    """Query block C for a window of W keys: about W (keys per query W + C), bounded so bmm stays efficient."""
    return max(MIN_BLOCK, min(window, MAX_BLOCK))


def _positions(lay: Blocks, before: int, device) -> tuple[Tensor, Tensor]:
    """Absolute query positions (N, C, 1) and window key positions (N, 1, (before+1)*C)."""
    n, c = lay.n, lay.c
    blk = torch.arange(n, device=device)[:, None, None]
    i = blk * c + torch.arange(c, device=device)[None, :, None]
    j = (blk - before) * c + torch.arange((before + 1) * c, device=device)[None, None, :]
    return i, j


@lru_cache(maxsize=128)
def _cached(kind: str, spec: AttentionSpec, t: int, b_h: tuple[int, int], device: torch.device, dtype: torch.dtype):
    """The layout and masks (and BigBird's picks) of one (type, shape, device, dtype), built once."""
    return _BUILDERS[kind](spec, t, b_h, device, dtype)


def _plan(spec: AttentionSpec, q: Tensor):
    b, h, t, _ = q.shape
    return _cached(spec.kind, spec, t, (b, h), q.device, q.dtype)


# --------------------------------------------------------------------------- local:W (and the window of others)


def _window_bias(lay: Blocks, before: int, allowed, device, dtype) -> Tensor:
    i, j = _positions(lay, before, device)
    return as_bias(allowed(i, j) & (j >= 0), dtype)  # (N, C, (before+1)*C)


def _local_plan(spec, t, b_h, device, dtype):
    w = spec.param("W")
    lay = Blocks(*b_h, t, _block_size(w))
    before = -(-(w - 1) // lay.c)
    return lay, before, _window_bias(lay, before, lambda i, j: (i - j < w) & (j <= i), device, dtype)


@register_pattern("local", patterns.local)
def local_attention(q: Tensor, k: Tensor, v: Tensor, spec: AttentionSpec) -> Tensor:
    lay, before, bias = _plan(spec, q)
    return attend_groups(lay, [window_group(lay, lay.blocked(q), k, v, before, bias)])


# --------------------------------------------------------------------------- dilated:W:D


def _streams(x: Tensor, step: int) -> Tensor:
    """(B, H, T, D) -> (B, H*step, ceil(T/step), D): stream r holds positions r, r+step, r+2*step, ..."""
    b, h, t, d = x.shape
    m = -(-t // step)
    x = torch.nn.functional.pad(x, (0, 0, 0, m * step - t)) if m * step != t else x
    return x.view(b, h, m, step, d).transpose(2, 3).reshape(b, h * step, m, d)


def _unstream(y: Tensor, h: int, step: int, t: int) -> Tensor:
    b, _, m, d = y.shape
    return y.view(b, h, step, m, d).transpose(2, 3).reshape(b, h, m * step, d)[:, :, :t]


@register_pattern("dilated", patterns.dilated)
def dilated_attention(q: Tensor, k: Tensor, v: Tensor, spec: AttentionSpec) -> Tensor:
    # Keys i, i-D, i-2D, ... are the W-token window of i's residue class mod D: local:W per class.
    step = spec.param("D")
    window = AttentionSpec("local", (spec.param("W"),))
    out = local_attention(*(_streams(x, step) for x in (q, k, v)), window)  # (B, H*D, T/D, Dv)
    return _unstream(out, q.shape[1], step, q.shape[2])


# --------------------------------------------------------------------------- longformer:W:G, bigbird:W:G:R


def _global_bias(lay: Blocks, g: int, w: int, device, dtype) -> Tensor:
    """Global keys j < G that are not already in the window (i - j >= W) and not after i."""
    i, _ = _positions(lay, 0, device)
    j = torch.arange(g, device=device)[None, None, :]
    return as_bias((i - j >= w) & (j <= i), dtype)  # (N, C, G)


def _longformer_plan(spec, t, b_h, device, dtype):
    lay, before, win = _local_plan(AttentionSpec("local", (spec.param("W"),)), t, b_h, device, dtype)
    g = min(spec.param("G"), lay.n * lay.c)
    return lay, before, win, g, _global_bias(lay, g, spec.param("W"), device, dtype)


def _global_keys(lay: Blocks, x: Tensor, g: int) -> Tensor:
    return lay.padded(x)[:, :g]  # (BH, G, D)


@register_pattern("longformer", patterns.longformer)
def longformer_attention(q: Tensor, k: Tensor, v: Tensor, spec: AttentionSpec) -> Tensor:
    lay, before, win, g, glob = _plan(spec, q)
    groups = [
        window_group(lay, lay.blocked(q), k, v, before, win),
        shared_group(lay, q, _global_keys(lay, k, g), _global_keys(lay, v, g), glob),
    ]
    return attend_groups(lay, groups)


def _bigbird_plan(spec, t, b_h, device, dtype):
    w, g, r = spec.param("W"), spec.param("G"), spec.param("R")
    lay = Blocks(*b_h, t, w)  # BigBird's blocks are W tokens: the random pattern is defined on them
    win = _window_bias(lay, 1, lambda i, j: (i - j < w) & (j <= i), device, dtype)
    g_eff = min(g, lay.n * lay.c)
    glob = _global_bias(lay, g_eff, w, device, dtype)
    blk = torch.arange(lay.n, device=device)
    picks = torch.stack([patterns.bigbird_random_block(blk, k) for k in range(r)], dim=1)  # (N, R) in [0, n-2]
    # a pick counts once (repeats hidden), only for blocks >= 2; its global tokens belong to the global group
    repeat = (picks[:, :, None] == picks[:, None, :]).tril(diagonal=-1).any(-1)  # (N, R)
    ok = (blk[:, None] >= 2) & ~repeat
    j = picks[:, :, None] * w + torch.arange(w, device=device)  # (N, R, W) key positions
    rand = as_bias((ok[:, :, None] & (j >= g)).reshape(lay.n, 1, r * w), dtype)  # (N, 1, R*W)
    return lay, win, g_eff, glob, picks, rand


@register_pattern("bigbird", patterns.bigbird)
def bigbird_attention(q: Tensor, k: Tensor, v: Tensor, spec: AttentionSpec) -> Tensor:
    lay, win, g, glob, picks, rand = _plan(spec, q)
    qb = lay.blocked(q)
    groups = [
        window_group(lay, qb, k, v, 1, win),
        shared_group(lay, q, _global_keys(lay, k, g), _global_keys(lay, v, g), glob),
        gathered_group(lay, qb, k, v, picks, rand),
    ]
    return attend_groups(lay, groups)


# --------------------------------------------------------------------------- strided:S, fixed:S


def _strided_plan(spec, t, b_h, device, dtype):
    s = spec.param("S")
    lay = Blocks(*b_h, t, s)  # block = one row of the (T/S, S) grid; the column keys are the grid's columns
    win = _window_bias(lay, 1, lambda i, j: (i - j < s) & (j <= i), device, dtype)
    m = torch.arange(lay.n, device=device)
    col = as_bias((m[None, :] < m[:, None])[:, None, :], dtype)  # (N, 1, N): earlier rows, same column
    return lay, win, col


@register_pattern("strided", patterns.strided)
def strided_attention(q: Tensor, k: Tensor, v: Tensor, spec: AttentionSpec) -> Tensor:
    lay, win, col = _plan(spec, q)
    return attend_groups(lay, [window_group(lay, lay.blocked(q), k, v, 1, win), column_group(lay, q, k, v, col)])


def _fixed_plan(spec, t, b_h, device, dtype):
    s = spec.param("S")
    lay = Blocks(*b_h, t, s)
    own = _window_bias(lay, 0, lambda i, j: j <= i, device, dtype)  # (N, S, S) causal within the block
    m = torch.arange(lay.n, device=device)
    summary = as_bias((m[None, :] < m[:, None])[:, None, :], dtype)  # (N, 1, N): last tokens of earlier blocks
    return lay, own, summary


def _summaries(lay: Blocks, x: Tensor) -> Tensor:
    return lay.padded(x).view(lay.rows, lay.n, lay.c, -1)[:, :, -1]  # (BH, N, D)


@register_pattern("fixed", patterns.fixed)
def fixed_attention(q: Tensor, k: Tensor, v: Tensor, spec: AttentionSpec) -> Tensor:
    lay, own, summary = _plan(spec, q)
    groups = [window_group(lay, lay.blocked(q), k, v, 0, own), shared_group(lay, q, _summaries(lay, k), _summaries(lay, v), summary)]
    return attend_groups(lay, groups)


_BUILDERS = {
    "local": _local_plan,
    "longformer": _longformer_plan,
    "bigbird": _bigbird_plan,
    "strided": _strided_plan,
    "fixed": _fixed_plan,
}
