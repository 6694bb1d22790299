"""The softmax family's base: softmax attention under a pattern of which keys each query sees.

A pattern is ``pattern(i, j, spec) -> bool`` on broadcastable integer tensors of query and key
positions.  From it come the dense ``(T, T)`` mask (reference and ONNX form: one masked SDPA,
an opset-23 ``Attention`` node), the FlexAttention ``mask_mod`` on CUDA (:mod:`.flex`), the
decode step's mask over the cached keys, and the pair count the cost model uses.  A type's
CPU fast path (:mod:`.sparse`, :mod:`.softmax`) is written independently and tested against it.

Decoding: a pattern that reaches a bounded distance back (``window(spec)`` positions) keeps a
rolling window of that many keys and values, plus ``global_tokens(spec)`` first tokens that
every query sees (Longformer); one that reaches arbitrarily far back keeps a growing key/value
cache, and the pattern's row for the new position masks it.
"""

from __future__ import annotations

import math
from functools import lru_cache

import torch
import torch.nn.functional as F
from torch import Tensor

from search_spaces.attention import AttentionSpec

from . import cache
from .base import AttentionType, State, StateSpec, Weights
from .flex import flex_attend


def causal(i: Tensor, j: Tensor, spec: AttentionSpec | None = None) -> Tensor:
    return j <= i


def dense_mask(pattern, spec: AttentionSpec | None, t: int, device: torch.device | None = None) -> Tensor:
    """(T, T) bool, True where query i may see key j under ``pattern``."""
    i = torch.arange(t, device=device)
    return pattern(i[:, None], i[None, :], spec)


def causal_mask(t: int, device: torch.device | None = None) -> Tensor:
    """(T, T) bool, True where query i may see key j (j <= i)."""
    return dense_mask(causal, None, t, device)


def masked_softmax_reference(q: Tensor, k: Tensor, v: Tensor, mask: Tensor) -> Tensor:
    """softmax(q k^T / sqrt(D) where mask, else -inf) v, written out; k, v with fewer heads are repeated. (B, H, T, D)."""
    k, v = repeat_kv(k, q.shape[1]), repeat_kv(v, q.shape[1])
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])  # (B, H, T, T)
    scores = scores.masked_fill(~mask, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v  # (B, H, T, D)


def repeat_kv(x: Tensor, heads: int) -> Tensor:
    """(B, G, T, D) -> (B, H, T, D): query head h reads key/value head h // (H / G)."""
    return x if x.shape[1] == heads else x.repeat_interleave(heads // x.shape[1], dim=1)


def grouped(q: Tensor, k: Tensor) -> bool:
    """Whether SDPA needs ``enable_gqa`` (a plain flag also when exporting with symbolic head counts)."""
    return bool(k.shape[1] != q.shape[1])


class PatternType(AttentionType):
    """Softmax attention under ``pattern``; subclasses give the pattern, its reach and a CPU fast path."""

    fused_onnx = True

    def pattern(self, i: Tensor, j: Tensor, spec: AttentionSpec) -> Tensor:
        raise NotImplementedError

    def window(self, spec: AttentionSpec) -> int | None:
        """How far back the pattern reaches, plus one (the decode window), or None: unbounded (a growing cache)."""
        return None

    def global_tokens(self, spec: AttentionSpec) -> int:
        """The first tokens every later query sees beside its window (Longformer's global keys)."""
        return 0

    def bidirectional_pattern(self, i: Tensor, j: Tensor, spec: AttentionSpec) -> Tensor:
        """Which keys query i sees in the encoder form (a type with ``bidirectional`` in ``forms`` gives it)."""
        raise NotImplementedError(f"{self.name} has no bidirectional form")

    def row_mask(self, spec: AttentionSpec, pos: Tensor, j: Tensor) -> Tensor | None:
        """Which of the keys at positions ``j`` the query at ``pos`` sees (None: all of them)."""
        return self.pattern(pos, j, spec)

    # math: the reference and the ONNX form come from the pattern
    def reference(self, q: Tensor, k: Tensor, v: Tensor, spec: AttentionSpec, w: Weights) -> Tensor:
        return masked_softmax_reference(q, k, v, dense_mask(self.pattern, spec, q.shape[-2], q.device))

    def forward_onnx(self, q: Tensor, k: Tensor, v: Tensor, spec: AttentionSpec, w: Weights) -> Tensor:
        mask = dense_mask(self.pattern, spec, q.shape[-2], q.device)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=grouped(q, k))

    def forward_cuda(self, q: Tensor, k: Tensor, v: Tensor, spec: AttentionSpec, w: Weights) -> Tensor:
        return flex_attend(q, k, v, spec, self.pattern)

    def bidirectional_reference(self, q: Tensor, k: Tensor, v: Tensor, spec: AttentionSpec, w: Weights) -> Tensor:
        return masked_softmax_reference(q, k, v, dense_mask(self.bidirectional_pattern, spec, q.shape[-2], q.device))

    def bidirectional_onnx(self, q: Tensor, k: Tensor, v: Tensor, spec: AttentionSpec, w: Weights) -> Tensor:
        """One SDPA under the dense (T, T) mask of the pattern (an opset-23 ``Attention`` node when exported)."""
        mask = dense_mask(self.bidirectional_pattern, spec, q.shape[-2], q.device)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=grouped(q, k))

    def bidirectional(self, q: Tensor, k: Tensor, v: Tensor, spec: AttentionSpec, w: Weights) -> Tensor:
        """The fast path: the dense-mask SDPA unless the type has a sparse one (:mod:`.sparse`)."""
        return self.bidirectional_onnx(q, k, v, spec, w)

    # decoding
    def state(self, spec: AttentionSpec, heads: int, head_dim: int) -> dict[str, StateSpec]:
        hk, hv = self.heads(spec, heads)
        span, g = self.window(spec), self.global_tokens(spec)
        length = "past" if span is None else span
        out = {"k": StateSpec((hk, length, head_dim)), "v": StateSpec((hv, length, head_dim))}
        if g:
            out.update(gk=StateSpec((hk, g, head_dim)), gv=StateSpec((hv, g, head_dim)))
        return out

    def prefill_state(self, spec: AttentionSpec, q: Tensor, k: Tensor, v: Tensor, w: Weights, capacity: int) -> State:
        span, g = self.window(spec), self.global_tokens(spec)
        if span is None:
            return {"k": cache.grown(k, capacity), "v": cache.grown(v, capacity)}
        state = {"k": cache.last(k, span), "v": cache.last(v, span)}
        if g:
            state.update(gk=cache.first(k, g), gv=cache.first(v, g))
        return state

    def step(self, spec, state, q, k, v, w, pos, length):
        span, g = self.window(spec), self.global_tokens(spec)
        if span is None:
            keys, new_k = cache.append(state["k"], k, length)  # (B, Hk, L, D)
            values, new_v = cache.append(state["v"], v, length)
            mask = self.row_mask(spec, pos, torch.arange(keys.shape[2], device=q.device))  # (L,) over positions 0..p
            return attend_one(q, keys, values, mask), {"k": new_k, "v": new_v}
        keys, values = cache.roll(state["k"], k), cache.roll(state["v"], v)  # (B, Hk, span, D)
        new = {"k": keys, "v": values}
        j = pos - (span - 1) + torch.arange(span, device=q.device)  # (span,) absolute positions, negative = padding
        mask = self.pattern(pos, j, spec) & (j >= 0)
        if g:
            jg = torch.arange(g, device=q.device)  # (G,)
            slot = (jg == pos)[None, None, :, None]  # the new token is global while pos < G
            gk, gv = torch.where(slot, k, state["gk"]), torch.where(slot, v, state["gv"])  # (B, Hk, G, D)
            new.update(gk=gk, gv=gv)
            keys, values = torch.cat((gk, keys), dim=2), torch.cat((gv, values), dim=2)  # (B, Hk, G + span, D)
            mask = torch.cat((jg <= pos, mask & (j >= g)))  # window keys below G are already global
        return attend_one(q, keys, values, mask), new

    def extends(self, spec):
        return self.window(spec) is None and not self.global_tokens(spec)

    def extend(self, spec, state, q, k, v, w, positions):
        assert self.extends(spec), f"{spec}: a window or global keys, not a plain key/value cache"
        keys, values = torch.cat((state["k"], k), dim=2), torch.cat((state["v"], v), dim=2)  # (B, Hk, P + S, D)
        j = torch.arange(keys.shape[2], device=q.device)  # (P + S,) the keys' positions
        mask = self.pattern(positions[:, None], j[None, :], spec)  # (S, P + S): the pattern's rows at the new positions
        y = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, enable_gqa=grouped(q, keys))  # (B, H, S, D)
        return y, {"k": keys, "v": values}

    # cost
    def prefill_flops(self, spec, batch, t, heads, head_dim):
        return 4.0 * batch * heads * attended_pairs(self, spec, t) * head_dim  # scores and weighted sum over the pairs

    def bidirectional_flops(self, spec, batch, t, heads, head_dim):
        return 4.0 * batch * heads * attended_pairs(self, spec, t, bidirectional=True) * head_dim

    def decode_flops(self, spec, batch, context, heads, head_dim):
        span = self.window(spec)
        keys = context + 1 if span is None else span + self.global_tokens(spec)  # a growing cache: every past key, masked
        return 4.0 * batch * heads * keys * head_dim


def attend_one(q: Tensor, keys: Tensor, values: Tensor, mask: Tensor | None) -> Tensor:
    """softmax(q k^T / sqrt(D), masked) v for one query per row: q (B, H, 1, D), keys (B, Hk, L, D), mask (L,)."""
    mask = None if mask is None else mask[None, :]  # (1, L)
    return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, enable_gqa=grouped(q, keys))


@lru_cache(maxsize=1024)
def attended_pairs(typ: PatternType, spec: AttentionSpec, t: int, bidirectional: bool = False) -> int:
    """How many (query, key) pairs a layer of this type scores at length ``t`` (the pattern's non-zeros;
    ``bidirectional``: of the encoder form's pattern)."""
    pattern = typ.bidirectional_pattern if bidirectional else typ.pattern
    j = torch.arange(t)
    rows = max(1, 2**22 // t)  # count in row chunks: never a (t, t) tensor, even at 16k tokens
    return sum(int(pattern(j[s : s + rows, None], j[None, :], spec).sum()) for s in range(0, t, rows))
