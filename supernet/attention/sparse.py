"""Sparse softmax attention: local, dilated, strided, fixed, longformer, bigbird.

Each type is a :class:`~.patterns.PatternType`: its pattern gives its reference (masked
softmax), its CUDA path (a FlexAttention block mask) and its decode mask; its CPU fast path is
built here from the block engine (:mod:`.blocks`), whose cost grows as O(T * keys per query);
local, dilated, longformer, fixed, bigbird's causal form and strided's inference first try the compiled window
kernel (:mod:`.native`; each type's :meth:`BlockSparse.native_window` says how its pattern reads there).
The fast paths branch on the sequence length freely (padding, block counts): the ONNX exporter
never traces them.  ONNX form: every causal form, and the bidirectional local, dilated and
longformer, trace a block-local graph (:func:`.blocks.traced_window_attention`, O(T * keys per
query), no branch on the length); the bidirectional bigbird one masked SDPA under the pattern's
dense (T, T) mask (its transposed random blocks have no fixed number per block).

The masks of a fast path depend only on (type, length, device, dtype); they are built once
and cached (:func:`_cached`).
"""

from __future__ import annotations

import math
from functools import lru_cache

import torch
import torch.nn.functional as F
from torch import Tensor

from search_spaces.attention import AttentionSpec

from .blocks import (
    NEG_INF,
    Blocks,
    as_bias,
    attend_groups,
    block_count,
    centred_window_group,
    column_group,
    gathered_group,
    reusing,
    TracedBlocks,
    TracedGroup,
    shared_group,
    traced_columns,
    traced_gathered,
    traced_shared,
    traced_window_attention,
    window_group,
)
from . import native
from .patterns import PatternType
from .registry import register

MIN_BLOCK, MAX_BLOCK = 16, 32
SCORE_BYTES = 2 << 20  # inference: heads per call so that their scores fit about this much (a core's L2)

# The BigBird random blocks: a fixed seed, and a small multiplicative generator (MINSTD,
# modulus 2^31 - 1) that every path evaluates on index tensors, so the pattern is defined for
# every length without a stored table and traces into ONNX / FlexAttention alike.
BIGBIRD_SEED = 20200728
_MINSTD = 2147483647


def _exceeds(spec: AttentionSpec, max_seq_len: int, *names: str) -> list[str]:
    """A problem for each parameter that is longer than the space's sequences."""
    return [f"{n}={spec.param(n)} exceeds max_seq_len {max_seq_len}" for n in names if spec.param(n) > max_seq_len]


def _block_size(window: int) -> int:
    """Query block C for a window of W keys: each query block scores (ceil((W-1)/C) + 1) * C keys, so a
    smaller block wastes fewer scores, while bmm on fewer than 16 rows loses its speed.  local:64 at 4k
    tokens, one thread: C=16 and 32 forward alike, 32 faster forward+backward, 64 slower both ways."""
    return max(MIN_BLOCK, min(window, MAX_BLOCK))


def _window_blocks(w: int) -> tuple[int, int]:
    """(C, reach) of a W-token window: the query block size and the ceil((W-1)/C) blocks it reaches on a side."""
    c = _block_size(w)
    return c, -(-(w - 1) // c)


def _window_keys(w: int) -> int:
    """Keys a query block of local:W scores: its own block and the ceil((W-1)/C) blocks before it."""
    c, reach = _window_blocks(w)
    return (reach + 1) * c


def _positions(lay: Blocks, before: int, device) -> tuple[Tensor, Tensor]:
    """Absolute query positions (N, C, 1) and window key positions (N, 1, (before+1)*C)."""
    n, c = lay.n, lay.c
    blk = torch.arange(n, device=device)[:, None, None]
    i = blk * c + torch.arange(c, device=device)[None, :, None]
    j = (blk - before) * c + torch.arange((before + 1) * c, device=device)[None, None, :]
    return i, j


class BlockSparse(PatternType):
    """A sparse type whose CPU fast path runs on the block engine with a plan (layout, masks) per shape."""

    def plan(self, spec: AttentionSpec, t: int, b_h: tuple[int, int], device, dtype):
        raise NotImplementedError

    def _plan(self, spec: AttentionSpec, q: Tensor):
        b, h, t, _ = q.shape
        return _cached(self, spec, t, (b, h), q.device, q.dtype)

    def block_forward(self, q: Tensor, k: Tensor, v: Tensor, spec: AttentionSpec) -> Tensor:
        """The block engine's computation for all of q's heads at once."""
        raise NotImplementedError

    def native_window(self, spec: AttentionSpec, t: int, causal: bool) -> native.Window | None:
        """This type's pattern at length ``t`` as the compiled window kernel takes it (causal or the bidirectional
        form), or None where the kernel does not serve it."""
        return None

    def _native(self, q: Tensor, k: Tensor, v: Tensor, spec: AttentionSpec, causal: bool) -> Tensor | None:
        """The compiled window kernel's answer (:mod:`.native`), or None where it does not apply."""
        window = self.native_window(spec, q.shape[2], causal)
        return None if window is None else native.window_attention(q, k, v, window)

    def forward(self, q, k, v, spec, w):
        """The compiled window kernel where it applies; else the block engine, without a gradient a few heads at
        a time, so that the (heads, T, keys) scores of a call stay in the core's cache (:data:`SCORE_BYTES`)
        instead of streaming through memory."""
        out = self._native(q, k, v, spec, causal=True)
        if out is not None:
            return out
        return _in_head_chunks(self.block_forward, q, k, v, spec, self.keys_per_query(spec, q.shape[2]))

    def bidirectional_block(self, q: Tensor, k: Tensor, v: Tensor, spec: AttentionSpec) -> Tensor:
        """The block engine's computation of the bidirectional form for all of q's heads at once."""
        raise NotImplementedError(f"{self.name} has no bidirectional form")

    def bidirectional(self, q, k, v, spec, w):
        """The bidirectional form: the compiled kernel where it applies, else the block engine, a few heads at a time
        without a gradient (as ``forward``; a window on both sides scores about twice the keys)."""
        out = self._native(q, k, v, spec, causal=False)
        return out if out is not None else self._bidirectional_engine(q, k, v, spec)

    def _bidirectional_engine(self, q: Tensor, k: Tensor, v: Tensor, spec: AttentionSpec) -> Tensor:
        return _in_head_chunks(self.bidirectional_block, q, k, v, spec, 2 * self.keys_per_query(spec, q.shape[2]))

    def keys_per_query(self, spec: AttentionSpec, t: int) -> int:
        """How many keys a query block scores (the width of its score rows), for sizing the head chunks."""
        raise NotImplementedError


def _in_head_chunks(fn, q: Tensor, k: Tensor, v: Tensor, spec: AttentionSpec, keys: int) -> Tensor:
    """``fn(q, k, v, spec)`` over all heads; without a gradient, ``SCORE_BYTES // (B * T * keys * 4)`` heads at a
    time, sharing their score buffers and writing into one output (:func:`.blocks.reusing`)."""
    if torch.is_grad_enabled() and any(x.requires_grad for x in (q, k, v)):
        return fn(q, k, v, spec)
    b, h, t, _ = q.shape
    step = max(1, SCORE_BYTES // (b * t * keys * q.element_size()))
    if step >= h:
        return fn(q, k, v, spec)
    out = q.new_empty(q.shape[:-1] + v.shape[-1:])
    with reusing() as into:  # the chunks share their score buffers, and write their answer in place
        for h0 in range(0, h, step):
            dest = out[:, h0 : h0 + step]
            into(dest)
            got = fn(q[:, h0 : h0 + step], k[:, h0 : h0 + step], v[:, h0 : h0 + step], spec)
            if got.data_ptr() != dest.data_ptr():
                dest.copy_(got)
    return out


@lru_cache(maxsize=128)
def _cached(typ: BlockSparse, spec: AttentionSpec, t: int, b_h: tuple[int, int], device: torch.device, dtype: torch.dtype):
    """The layout and masks (and BigBird's picks) of one (type, shape, device, dtype), built once."""
    return typ.plan(spec, t, b_h, device, dtype)


@lru_cache(maxsize=128)
def _cached_bidirectional(
    typ: BlockSparse, spec: AttentionSpec, t: int, b_h: tuple[int, int], device: torch.device, dtype: torch.dtype
):
    """The same for the bidirectional form's plan."""
    return typ.bidirectional_plan(spec, t, b_h, device, dtype)


def _centred_window(lay: Blocks, w: int, device, dtype) -> tuple[int, Tensor]:
    """The symmetric window |i - j| < W on the block engine: blocks reached on each side, and the bias
    (N, C, (2 * reach + 1) * C) that also hides keys past the end (a padded query sees itself)."""
    reach = -(-(w - 1) // lay.c)
    blk = torch.arange(lay.n, device=device)[:, None, None]
    i = blk * lay.c + torch.arange(lay.c, device=device)[None, :, None]  # (N, C, 1) query positions
    j = (blk - reach) * lay.c + torch.arange((2 * reach + 1) * lay.c, device=device)[None, None, :]  # (N, 1, span) keys
    allowed = ((i - j).abs() < w) & (j >= 0) & ((j < lay.t) | (j == i))
    return reach, as_bias(allowed, dtype)


def _window_bias(lay: Blocks, before: int, allowed, device, dtype) -> Tensor:
    i, j = _positions(lay, before, device)
    return as_bias(allowed(i, j) & (j >= 0), dtype)  # (N, C, (before+1)*C)


def _causal_window(w: int):
    return lambda i, j: (i - j < w) & (j <= i)


# --------------------------------------------------------------------------- local:W (and the window of others)


class Local(BlockSparse):
    name = "local"
    params = ("W",)
    fused_onnx = False  # exports block-local MatMul / Softmax nodes (forward_onnx), not one Attention node
    doc = "causal sliding window: each token attends to itself and the W-1 tokens before it (bidirectional: and after it)"
    forms = ("causal", "bidirectional")

    def pattern(self, i, j, spec):
        d = i - j
        return (d >= 0) & (d < spec.param("W"))

    def bidirectional_pattern(self, i, j, spec):
        return (i - j).abs() < spec.param("W")  # symmetric: W-1 tokens on each side and itself

    def window(self, spec):
        return spec.param("W")

    def problems(self, spec, max_seq_len, heads):
        return [f"window {spec.param('W')} exceeds max_seq_len {max_seq_len}"] if spec.param("W") > max_seq_len else []

    def plan(self, spec, t, b_h, device, dtype):
        w = spec.param("W")
        c, before = _window_blocks(w)
        lay = Blocks(*b_h, t, c)
        return lay, before, _window_bias(lay, before, _causal_window(w), device, dtype)

    def keys_per_query(self, spec, t):
        return _window_keys(spec.param("W"))

    def native_window(self, spec, t, causal):
        width = spec.param("W")
        return native.Window(width - 1, 0 if causal else width - 1)

    def block_forward(self, q, k, v, spec):
        lay, before, bias = self._plan(spec, q)
        return attend_groups(lay, [window_group(lay, lay.blocked(q), k, v, before, bias)])

    def bidirectional_plan(self, spec, t, b_h, device, dtype):
        lay = Blocks(*b_h, t, _block_size(spec.param("W")))
        return (lay, *_centred_window(lay, spec.param("W"), device, dtype))

    def bidirectional_block(self, q, k, v, spec):
        """The symmetric window on the block engine: each block with ceil((W-1)/C) blocks on either side."""
        b, h, t, _ = q.shape
        lay, reach, bias = _cached_bidirectional(self, spec, t, (b, h), q.device, q.dtype)
        return attend_groups(lay, [centred_window_group(lay, lay.blocked(q), k, v, reach, reach, bias)])

    def forward_onnx(self, q, k, v, spec, w):
        """Block-local MatMul / Softmax nodes (O(T * W)), not one Attention node under a dense (T, T) mask."""
        width = spec.param("W")
        return traced_window_attention(q, k, v, *_window_blocks(width), _causal_window(width))

    def bidirectional_onnx(self, q, k, v, spec, w):
        """The symmetric window as block-local MatMul / Softmax nodes (O(T * W)): each block with
        ceil((W-1)/C) blocks on either side."""
        width = spec.param("W")
        c, reach = _window_blocks(width)
        return traced_window_attention(q, k, v, c, reach, _centred(width), after=reach)


def _centred(w: int):
    return lambda i, j: (i - j).abs() < w


# --------------------------------------------------------------------------- dilated:W:D


def _streams(x: Tensor, step: int, traced: bool = False) -> Tensor:
    """(B, H, T, D) -> (B, H*step, ceil(T/step), D): stream r holds positions r, r+step, r+2*step, ...

    ``traced``: always pad (the exported graph serves every length)."""
    b, h, t, d = x.shape
    m = block_count(t, step) if traced else -(-t // step)
    x = torch.nn.functional.pad(x, (0, 0, 0, m * step - t)) if traced or m * step != t else x
    return x.view(b, h, m, step, d).transpose(2, 3).reshape(b, h * step, m, d)


def _unstream(y: Tensor, h: int, step: int, t: int) -> Tensor:
    b, _, m, d = y.shape
    return y.view(b, h, step, m, d).transpose(2, 3).reshape(b, h, m * step, d)[:, :, :t]


def _native_streams(q: Tensor, k: Tensor, v: Tensor, step: int, before: int, after: int) -> Tensor | None:
    """The compiled window kernel on the residue streams r, r+step, ... read and written in place (no copies), the
    streams' blocks interleaved (``Window.step``), forward and backward (the kernel's backward writes each stream's
    gradients in place too), or None where it does not apply (the caller copies the streams for the engine).
    dilated:64:4 at 4k, one thread, fwd+bwd: 33-35 ms in place, 48-55 ms through copies of the streams and local's
    kernel (local:64 itself 28-30)."""
    return native.window_attention(q, k, v, native.Window(before, after, step=step))


class Dilated(PatternType):
    name = "dilated"
    params = ("W", "D")
    fused_onnx = False  # local:W's block-local graph on the streams
    doc = "dilated causal window: itself and the W-1 tokens before it at strides of D (i, i-D, ..., i-(W-1)D)"
    forms = ("causal", "bidirectional")

    def pattern(self, i, j, spec):
        w, step = spec.param("W"), spec.param("D")
        d = i - j
        return (d >= 0) & (d % step == 0) & (d < w * step)

    def window(self, spec):
        return (spec.param("W") - 1) * spec.param("D") + 1

    def problems(self, spec, max_seq_len, heads):
        span = self.window(spec)
        return [f"{spec} spans {span} tokens ((W-1)*D+1), more than max_seq_len {max_seq_len}"] if span > max_seq_len else []

    def forward(self, q, k, v, spec, w):
        # Keys i, i-D, i-2D, ... are the W-token window of i's residue class mod D: local:W per class.
        step = spec.param("D")
        out = _native_streams(q, k, v, step, spec.param("W") - 1, 0)
        if out is not None:
            return out
        out = local.forward(*(_streams(x, step) for x in (q, k, v)), AttentionSpec("local", (spec.param("W"),)), w)
        return _unstream(out, q.shape[1], step, q.shape[2])  # from (B, H*D, T/D, Dv)

    def bidirectional_pattern(self, i, j, spec):
        d = (i - j).abs()
        return (d % spec.param("D") == 0) & (d < spec.param("W") * spec.param("D"))  # i, i +- D, ..., i +- (W-1)D

    def bidirectional(self, q, k, v, spec, w):
        """The symmetric local:W on each residue stream; streams of m and of m-1 tokens apart (no padding seen)."""
        b, h, t, _ = q.shape
        step = spec.param("D")
        out = _native_streams(q, k, v, step, spec.param("W") - 1, spec.param("W") - 1)
        if out is not None:
            return out
        m = -(-t // step)
        full = t - (m - 1) * step  # streams 0 .. full-1 hold m tokens, the others m-1
        window = AttentionSpec("local", (spec.param("W"),))
        qs, ks, vs = (_streams(x, step).view(b, h, step, m, x.shape[-1]) for x in (q, k, v))
        parts = []
        for lo, hi, n in ((0, full, m), (full, step, m - 1)):
            if hi == lo:
                continue
            if n == 0:  # streams past the end of a sequence shorter than D
                parts.append(vs.new_zeros(b, h, hi - lo, m, vs.shape[-1]))
                continue
            sub = (x[:, :, lo:hi, :n].reshape(b, h * (hi - lo), n, x.shape[-1]) for x in (qs, ks, vs))
            y = local.bidirectional(*sub, window, w).view(b, h, hi - lo, n, -1)
            parts.append(torch.nn.functional.pad(y, (0, 0, 0, m - n)))
        y = torch.cat(parts, dim=2) if len(parts) > 1 else parts[0]  # (B, H, D, m, Dv)
        return _unstream(y.reshape(b, h * step, m, -1), h, step, t)

    def bidirectional_onnx(self, q, k, v, spec, w):
        """The symmetric local:W's block-local graph on the D residue streams (O(T * W)); a stream's padding
        (its positions at or past T) hidden from its keys."""
        b, h, t, _ = q.shape
        step = spec.param("D")
        qs, ks, vs = (_streams(x, step, traced=True) for x in (q, k, v))
        m = torch.arange(qs.shape[2], device=q.device)  # stream index: position m * D + r on stream r
        real = ((m[None, :] * step + torch.arange(step, device=q.device)[:, None]) < t).repeat(h, 1)[None]  # (1, H*D, M)
        width = spec.param("W")
        c, reach = _window_blocks(width)
        out = traced_window_attention(qs, ks, vs, c, reach, _centred(width), after=reach, real=real)
        return _unstream(out, h, step, t)

    def forward_onnx(self, q, k, v, spec, w):
        """local:W's block-local graph on the D residue streams (O(T * W)); always padded, no branch on the length."""
        step = spec.param("D")
        streams = (_streams(x, step, traced=True) for x in (q, k, v))
        out = local.forward_onnx(*streams, AttentionSpec("local", (spec.param("W"),)), w)
        return _unstream(out, q.shape[1], step, q.shape[2])


# --------------------------------------------------------------------------- longformer:W:G, bigbird:W:G:R


def _global_bias(lay: Blocks, g: int, w: int, device, dtype) -> Tensor:
    """Global keys j < G that are not already in the window (i - j >= W) and not after i."""
    i, _ = _positions(lay, 0, device)
    j = torch.arange(g, device=device)[None, None, :]
    return as_bias((i - j >= w) & (j <= i), dtype)  # (N, C, G)


def _global_keys(lay: Blocks, x: Tensor, g: int) -> Tensor:
    return lay.padded(x)[:, :g]  # (BH, G, D)


def _first(x: Tensor, g: int) -> Tensor:
    """Exactly the first ``g`` positions of x (B, H, T, D) whatever T, zeros past the end (which no real
    query sees): a slice x[:, :, :g] would be min(g, T) long, and the exporter would guard on T >= g."""
    return F.pad(x, (0, 0, 0, g))[:, :, :g]


def _traced_globals(x: TracedBlocks, k_g: Tensor, v_g: Tensor, w: int) -> TracedGroup:
    """The traced form's global keys: the first G tokens outside the causal W-window and not after i."""
    j = torch.arange(k_g.shape[2], device=k_g.device)[None, None, :]
    return traced_shared(x, k_g, v_g, (x.i - j >= w) & (j <= x.i))


class Longformer(BlockSparse):
    """Bidirectional form: the symmetric W-window plus the G global tokens, which every token sees and
    which see every token (Longformer's symmetric global attention)."""

    name = "longformer"
    params = ("W", "G")
    fused_onnx = False  # block-local graph plus the global keys
    doc = "Longformer: the W-token causal window plus the first G tokens (global)"
    forms = ("causal", "bidirectional")

    def pattern(self, i, j, spec):
        return (j <= i) & ((i - j < spec.param("W")) | (j < spec.param("G")))

    def window(self, spec):
        return spec.param("W")

    def global_tokens(self, spec):
        return spec.param("G")

    def problems(self, spec, max_seq_len, heads):
        return _exceeds(spec, max_seq_len, "W", "G")[:1]

    def plan(self, spec, t, b_h, device, dtype):
        lay, before, win = local.plan(AttentionSpec("local", (spec.param("W"),)), t, b_h, device, dtype)
        g = min(spec.param("G"), lay.n * lay.c)
        return lay, before, win, g, _global_bias(lay, g, spec.param("W"), device, dtype)

    def keys_per_query(self, spec, t):
        return _window_keys(spec.param("W")) + spec.param("G")

    def native_window(self, spec, t, causal):
        """The window and the G global keys (the encoder form: every query sees them; their own rows are
        :meth:`bidirectional`'s)."""
        width, g = spec.param("W"), spec.param("G")
        return native.Window(width - 1, 0, g) if causal else native.Window(width - 1, width - 1, g, t)

    def bidirectional(self, q, k, v, spec, w):
        """The kernel's rows (every query sees the window and the global keys), then the G global queries see every
        key (one SDPA); else the block engine."""
        out = self._native(q, k, v, spec, causal=False)
        if out is None:
            return self._bidirectional_engine(q, k, v, spec)
        return _global_rows(q, k, v, min(spec.param("G"), q.shape[2]), out)

    def block_forward(self, q, k, v, spec):
        lay, before, win, g, glob = self._plan(spec, q)
        groups = [
            window_group(lay, lay.blocked(q), k, v, before, win),
            shared_group(lay, q, _global_keys(lay, k, g), _global_keys(lay, v, g), glob),
        ]
        return attend_groups(lay, groups)

    def forward_onnx(self, q, k, v, spec, w):
        """local:W's block-local graph plus the G global keys as a second MatMul (O(T * (W + G)))."""
        width, g = spec.param("W"), spec.param("G")
        k_g, v_g = _first(k, g), _first(v, g)
        return traced_window_attention(
            q, k, v, *_window_blocks(width), _causal_window(width), lambda x: [_traced_globals(x, k_g, v_g, width)]
        )

    def bidirectional_pattern(self, i, j, spec):
        g = spec.param("G")
        return ((i - j).abs() < spec.param("W")) | (j < g) | (i < g)

    def bidirectional_plan(self, spec, t, b_h, device, dtype):
        lay = Blocks(*b_h, t, _block_size(spec.param("W")))
        reach, win = _centred_window(lay, spec.param("W"), device, dtype)
        g = min(spec.param("G"), t)
        return lay, reach, win, g, _outside_window(lay, torch.arange(g, device=device), spec.param("W"), dtype)

    def bidirectional_block(self, q, k, v, spec):
        """Window + global keys on the block engine; the G global queries see every key (one SDPA)."""
        b, h, t, _ = q.shape
        lay, reach, win, g, glob = _cached_bidirectional(self, spec, t, (b, h), q.device, q.dtype)
        return _global_rows(q, k, v, g, attend_groups(lay, [
            centred_window_group(lay, lay.blocked(q), k, v, reach, reach, win),
            shared_group(lay, q, _global_keys(lay, k, g), _global_keys(lay, v, g), glob),
        ]))  # fmt: skip

    def bidirectional_onnx(self, q, k, v, spec, w):
        """The symmetric window's block-local graph plus the G global keys outside it (O(T * (W + G))); the
        G global queries attend to every key (one Attention node of G rows)."""
        width, g = spec.param("W"), spec.param("G")
        c, reach = _window_blocks(width)
        k_g, v_g = _first(k, g), _first(v, g)

        def globals_outside(x: TracedBlocks) -> list[TracedGroup]:
            j = torch.arange(g, device=q.device)[None, None, :]
            return [traced_shared(x, k_g, v_g, (x.i - j).abs() >= width)]

        out = traced_window_attention(q, k, v, c, reach, _centred(width), globals_outside, after=reach)
        return _traced_global_rows(F.scaled_dot_product_attention(_first(q, g), k, v), out)


def _traced_global_rows(out_g: Tensor, out: Tensor) -> Tensor:
    """``out`` (B, H, T, Dv) with its first rows replaced by ``out_g`` (B, H, G, Dv), for any T (also T < G):
    both padded to T + G rows and chosen by position, so the exported graph has no guard on T >= G."""
    g, t = out_g.shape[2], out.shape[2]
    first = torch.arange(t + g, device=out.device)[:, None] < g  # (T + G, 1)
    return torch.where(first, F.pad(out_g, (0, 0, 0, t)), F.pad(out, (0, 0, 0, g)))[:, :, :t]


def _outside_window(lay: Blocks, j: Tensor, w: int, dtype) -> Tensor:
    """Bias (N, C, len(j)) letting each query see the keys at positions ``j`` outside its symmetric window."""
    i = torch.arange(lay.n * lay.c, device=j.device).view(lay.n, lay.c, 1)
    return as_bias((i - j).abs() >= w, dtype)


def _global_rows(q: Tensor, k: Tensor, v: Tensor, g: int, out: Tensor) -> Tensor:
    """``out`` (B, H, T, Dv) with its first g rows replaced: the global tokens attend to every key."""
    return torch.cat((torch.nn.functional.scaled_dot_product_attention(q[:, :, :g], k, v), out[:, :, g:]), dim=2)


def bigbird_random_block(block: Tensor, r: int, seed: int = BIGBIRD_SEED) -> Tensor:
    """The ``r``-th random key block of query block ``block`` (blocks of W tokens): in ``[0, block - 2]``.

    Only meaningful for ``block >= 2`` (earlier blocks have no block outside their window).
    Pure integer arithmetic, below 2^48 throughout, so int64 never overflows.
    """
    x = (block.to(torch.int64) * 92821 + (r + 1) * 68917 + seed) % _MINSTD
    x = (x * 48271) % _MINSTD
    x = (x * 48271) % _MINSTD
    return x % (block.to(torch.int64) - 1).clamp(min=1)


def _random_picks(blk: Tensor, r: int, w: int, g: int) -> tuple[Tensor, Tensor, Tensor]:
    """BigBird's random blocks of the query blocks ``blk`` (N,), blocks of W tokens: picks (N, R), each at most
    its block - 2 (outside the window); ok (N, R): the pick counts (block >= 2, not a repeat of an earlier pick);
    seen (N, 1, R*W): which keys of the picked blocks a query sees (those before G are the global group's)."""
    picks = torch.stack([bigbird_random_block(blk, k) for k in range(r)], dim=1)
    repeat = (picks[:, :, None] == picks[:, None, :]).tril(diagonal=-1).any(-1)
    ok = (blk[:, None] >= 2) & ~repeat
    j = picks[:, :, None] * w + torch.arange(w, device=blk.device)  # (N, R, W) key positions
    return picks, ok, (ok[:, :, None] & (j >= g)).reshape(-1, 1, r * w)


@lru_cache(maxsize=64)
def native_picks(w: int, r: int, t: int, seed: int = BIGBIRD_SEED) -> Tensor:
    """The compiled kernel's picks for a length: (ceil(T / W), R) block indices, -1 where a pick does not count (the
    ONNX Runtime operator draws the same table in C++: kernels/ort_ops.cpp's bigbird_picks)."""
    blk = torch.arange(-(-t // w))
    picks = torch.stack([bigbird_random_block(blk, k, seed) for k in range(r)], dim=1)
    repeat = (picks[:, :, None] == picks[:, None, :]).tril(diagonal=-1).any(-1)
    return torch.where((blk[:, None] >= 2) & ~repeat, picks, -1).contiguous()


class BigBird(BlockSparse):
    """Bidirectional form: Longformer's symmetric window and global tokens, and the random blocks in both
    directions: block a sees block b when either picked the other (the same generator, symmetrised)."""

    name = "bigbird"
    fused_onnx = False  # window, global keys and gathered random blocks (forward_onnx)
    params = ("W", "G", "R")
    doc = "BigBird: W-token window + first G tokens + R random earlier blocks of W tokens (fixed seed)"
    forms = ("causal", "bidirectional")

    def pattern(self, i, j, spec):
        w = spec.param("W")
        bi, bj = i // w, j // w
        rand = torch.zeros_like(bi == bj)
        for r in range(spec.param("R")):
            rand = rand | (bj == bigbird_random_block(bi, r))
        return longformer.pattern(i, j, spec) | (rand & (bi >= 2))

    def problems(self, spec, max_seq_len, heads):
        return _exceeds(spec, max_seq_len, "W", "G")[:1]

    def plan(self, spec, t, b_h, device, dtype):
        w, g, r = spec.param("W"), spec.param("G"), spec.param("R")
        lay = Blocks(*b_h, t, w)  # BigBird's blocks are W tokens: the random pattern is defined on them
        win = _window_bias(lay, 1, _causal_window(w), device, dtype)
        g_eff = min(g, lay.n * lay.c)
        glob = _global_bias(lay, g_eff, w, device, dtype)
        picks, _, seen = _random_picks(torch.arange(lay.n, device=device), r, w, g)
        return lay, win, g_eff, glob, picks, as_bias(seen, dtype)

    def keys_per_query(self, spec, t):
        return (2 + spec.param("R")) * spec.param("W") + spec.param("G")

    def native_window(self, spec, t, causal):
        """The causal form: the window, the global keys and each block's picked blocks (W a multiple of 16, R <= 8)."""
        width, g, r = spec.param("W"), spec.param("G"), spec.param("R")
        if not causal or width % 16 or r > 8:
            return None
        return native.Window(width - 1, 0, g, 0, native_picks(width, r, t), width)

    def block_forward(self, q, k, v, spec):
        lay, win, g, glob, picks, rand = self._plan(spec, q)
        qb = lay.blocked(q)
        groups = [
            window_group(lay, qb, k, v, 1, win),
            shared_group(lay, q, _global_keys(lay, k, g), _global_keys(lay, v, g), glob),
            gathered_group(lay, qb, k, v, picks, rand),
        ]
        return attend_groups(lay, groups)

    def forward_onnx(self, q, k, v, spec, w):
        """Blocks of W: the causal window over a block and the one before it, the G global keys, and the
        R random blocks gathered per query block (a Gather), one softmax: O(T * ((2 + R) * W + G))."""
        width, g, r = spec.param("W"), spec.param("G"), spec.param("R")
        k_g, v_g = _first(k, g), _first(v, g)

        def extra(x: TracedBlocks) -> list[TracedGroup]:
            picks, _, seen = _random_picks(torch.arange(x.k.shape[2], device=q.device), r, width, g)
            return [_traced_globals(x, k_g, v_g, width), traced_gathered(x, picks, seen)]

        return traced_window_attention(q, k, v, width, 1, _causal_window(width), extra)

    def bidirectional_pattern(self, i, j, spec):
        w = spec.param("W")
        bi, bj = i // w, j // w
        rand = torch.zeros_like(bi == bj)
        for r in range(spec.param("R")):
            rand = rand | ((bj == bigbird_random_block(bi, r)) & (bi >= 2)) | ((bi == bigbird_random_block(bj, r)) & (bj >= 2))
        return longformer.bidirectional_pattern(i, j, spec) | rand

    def bidirectional_plan(self, spec, t, b_h, device, dtype):
        """Block a's random keys are the blocks it picked (earlier ones: exactly R, a gathered group as in the
        causal form) and the later blocks that picked it (any number: scored from the key side, one (C, C)
        product per pick, and merged into a's rows by index; :func:`_attend_with_picked_by`)."""
        w, g, r = spec.param("W"), min(spec.param("G"), t), spec.param("R")
        lay = Blocks(*b_h, t, w)  # blocks of W tokens, as the random pattern is defined
        reach, win = _centred_window(lay, w, device, dtype)
        glob = _outside_window(lay, torch.arange(g, device=device), w, dtype)
        blk = torch.arange(lay.n, device=device)
        picks, ok, seen = _random_picks(blk, r, w, g)
        fwd = as_bias(seen, dtype)
        # picked by: block b's keys seen by the queries of block picks[b, r] (their window never reaches b)
        jb = blk[:, None, None] * w + torch.arange(w, device=device)  # (N, 1, W) keys of b itself
        rev = as_bias((ok[:, :, None] & (jb >= g) & (jb < t)).reshape(lay.n * r, 1, w), dtype)  # (N*R, 1, W)
        return lay, reach, win, g, glob, picks, fwd, rev

    def bidirectional_block(self, q, k, v, spec):
        b, h, t, _ = q.shape
        lay, reach, win, g, glob, picks, fwd, rev = _cached_bidirectional(self, spec, t, (b, h), q.device, q.dtype)
        qb = lay.blocked(q)
        groups = [
            centred_window_group(lay, qb, k, v, reach, reach, win),
            shared_group(lay, q, _global_keys(lay, k, g), _global_keys(lay, v, g), glob),
            gathered_group(lay, qb, k, v, picks, fwd),
        ]
        return _global_rows(q, k, v, g, _attend_with_picked_by(lay, groups, qb, k, v, picks, rev))


def _attend_with_picked_by(lay: Blocks, groups: list, qb: Tensor, k: Tensor, v: Tensor, picks: Tensor, rev: Tensor) -> Tensor:
    """One softmax over ``groups`` and the keys of every block b seen by the queries of block picks[b, r] (bias
    ``rev`` (N*R, 1, C)), whose number varies per query block: their scores are computed per (b, r) and merged
    into the rows of picks[b, r] by index (the row maximum by scatter, exponentials' sums and the weighted
    values by index_add), then every row divided by its sum.  The maximum is a constant shift (detached): the
    gradients are the softmax's.  Returns (B, H, T, Dv)."""
    rows, n, c = lay.rows, lay.n, lay.c
    r = picks.shape[1]
    a = picks.reshape(-1)  # (N*R,) the query block of each (b, r)
    scale = 1.0 / math.sqrt(qb.shape[-1])
    kb, vb = (
        lay.padded(x).view(rows, n, 1, c, x.shape[-1]).expand(-1, -1, r, -1, -1).reshape(rows, n * r, c, -1) for x in (k, v)
    )  # fmt: skip  (B*H, N*R, C, D): block b for each of its picks
    qa = qb.view(rows, n, c, -1).index_select(1, a)  # (B*H, N*R, C, D): the queries of block picks[b, r]
    s_rev = torch.add(rev, qa @ kb.transpose(-2, -1), alpha=scale)  # (B*H, N*R, C, C)
    scores = torch.cat([grp.scores for grp in groups], dim=-1).view(rows, n, c, -1)  # (B*H, N, C, L)
    with torch.no_grad():
        top = scores.amax(-1).scatter_reduce(1, a.view(1, -1, 1).expand(rows, -1, c), s_rev.amax(-1), "amax")
        top = top.masked_fill(top == NEG_INF, 0.0)  # (B*H, N, C): every row sees its own token, so never -inf
    if torch.is_grad_enabled() and scores.requires_grad:
        p = torch.exp(scores - top[..., None])
        p_rev = torch.exp(s_rev - top.index_select(1, a)[..., None])
    else:  # inference: in place (both are fresh buffers: the concatenation, the sum)
        p = scores.sub_(top[..., None]).exp_()
        p_rev = s_rev.sub_(top.index_select(1, a)[..., None]).exp_()
    total = p.sum(-1).index_add(1, a, p_rev.sum(-1))  # (B*H, N, C)
    parts = p.view(rows * n, c, -1).split([grp.scores.shape[-1] for grp in groups], dim=-1)
    out = sum(grp.apply(part) for grp, part in zip(groups, parts)).view(rows, n, c, -1)
    out = out.index_add(1, a, p_rev @ vb) / total[..., None]
    return lay.unblock(out.view(rows * n, c, -1))


# --------------------------------------------------------------------------- strided:S, fixed:S


class Strided(BlockSparse):
    name = "strided"
    fused_onnx = False  # block-local graph: window and column (forward_onnx)
    params = ("S",)
    doc = "Sparse Transformer strided pattern: the S-token window plus every S-th token before it"

    def pattern(self, i, j, spec):
        s = spec.param("S")
        d = i - j
        return (d >= 0) & ((d < s) | (d % s == 0))

    def problems(self, spec, max_seq_len, heads):
        return [f"stride {spec.param('S')} exceeds max_seq_len {max_seq_len}"] if spec.param("S") > max_seq_len else []

    def plan(self, spec, t, b_h, device, dtype):
        s = spec.param("S")
        lay = Blocks(*b_h, t, s)  # block = one row of the (T/S, S) grid; the column keys are the grid's columns
        win = _window_bias(lay, 1, _causal_window(s), device, dtype)
        m = torch.arange(lay.n, device=device)
        col = as_bias((m[None, :] < m[:, None])[:, None, :], dtype)  # (N, 1, N): earlier rows, same column
        return lay, win, col

    def keys_per_query(self, spec, t):
        return 2 * spec.param("S") + -(-t // spec.param("S"))

    def native_window(self, spec, t, causal):
        """The S-window, and each residue stream's causal attention (the column keys) joined into its softmax
        (inference only: with a gradient the block engine runs)."""
        s = spec.param("S")
        return native.Window(s - 1, 0, columns=s) if causal else None

    def block_forward(self, q, k, v, spec):
        lay, win, col = self._plan(spec, q)
        return attend_groups(lay, [window_group(lay, lay.blocked(q), k, v, 1, win), column_group(lay, q, k, v, col)])

    def forward_onnx(self, q, k, v, spec, w):
        """Blocks of S (the rows of the (T/S, S) grid): the causal S-window over a block and the one before
        it, and the column (the same position in every earlier row), one softmax: O(T * (2S + T/S))."""
        s = spec.param("S")

        def columns(x: TracedBlocks) -> list[TracedGroup]:
            m = torch.arange(x.k.shape[2], device=q.device)
            return [traced_columns(x, (m[None, :] < m[:, None])[:, None, :])]  # earlier rows only

        return traced_window_attention(q, k, v, s, 1, _causal_window(s), columns)


def _summaries(lay: Blocks, x: Tensor) -> Tensor:
    return lay.padded(x).view(lay.rows, lay.n, lay.c, -1)[:, :, -1]  # (BH, N, D)


class Fixed(BlockSparse):
    name = "fixed"
    fused_onnx = False  # block-local graph: own block and the summaries (forward_onnx)
    params = ("S",)
    doc = "Sparse Transformer fixed pattern: its own block of S tokens plus the last token of every earlier block"

    def pattern(self, i, j, spec):
        s = spec.param("S")
        return (j <= i) & ((j // s == i // s) | (j % s == s - 1))

    problems = Strided.problems

    def plan(self, spec, t, b_h, device, dtype):
        s = spec.param("S")
        lay = Blocks(*b_h, t, s)
        own = _window_bias(lay, 0, lambda i, j: j <= i, device, dtype)  # (N, S, S) causal within the block
        m = torch.arange(lay.n, device=device)
        summary = as_bias((m[None, :] < m[:, None])[:, None, :], dtype)  # (N, 1, N): last tokens of earlier blocks
        return lay, own, summary

    def keys_per_query(self, spec, t):
        return spec.param("S") + -(-t // spec.param("S"))

    def native_window(self, spec, t, causal):
        """S a multiple of 16: a block of 16 queries shares its block of S and its summaries."""
        s = spec.param("S")
        return native.Window(s - 1, 0, blocks=s) if causal and s % 16 == 0 else None

    def block_forward(self, q, k, v, spec):
        lay, own, summary = self._plan(spec, q)
        groups = [
            window_group(lay, lay.blocked(q), k, v, 0, own),
            shared_group(lay, q, _summaries(lay, k), _summaries(lay, v), summary),
        ]
        return attend_groups(lay, groups)

    def forward_onnx(self, q, k, v, spec, w):
        """Blocks of S: causal within the block, and the last token of every earlier block as shared keys,
        one softmax: O(T * (S + T/S))."""

        def summaries(x: TracedBlocks) -> list[TracedGroup]:
            m = torch.arange(x.k.shape[2], device=q.device)
            return [traced_shared(x, x.k[:, :, :, -1], x.v[:, :, :, -1], (m[None, :] < m[:, None])[:, None, :])]

        return traced_window_attention(q, k, v, spec.param("S"), 0, lambda i, j: j <= i, summaries)


# in the order the documentation lists them (error messages list the spellings so)
local, dilated, strided, fixed, longformer, bigbird = (
    register(t()) for t in (Local, Dilated, Strided, Fixed, Longformer, BigBird)
)
