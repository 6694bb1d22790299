"""Attention types: the token-mixing function of a layer, one registry for all of them.

Every type takes the layer's projected queries, keys and values, each of shape
``(B, H, T, D)``, and returns the mixed values ``(B, H, T, D)``.  The Q/K/V/O
projections (and rotary positions) are shared by all types and live in the model;
only this function differs from type to type.

Each registered type has
  * ``fast``: the implementation the models run (SDPA, chunked prefix sums, ...);
  * ``reference``: a plain, obviously-correct version that tests compare against.

To add a type: add its signature to :data:`search_spaces.attention.SIGNATURES`,
then register its two functions here with :func:`register`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from search_spaces.attention import SIGNATURES, AttentionSpec, parse_attention

MixFn = Callable[[Tensor, Tensor, Tensor, AttentionSpec], Tensor]


@dataclass(frozen=True)
class AttentionType:
    kind: str
    fast: MixFn
    reference: MixFn
    doc: str


REGISTRY: dict[str, AttentionType] = {}


def register(kind: str, *, reference: MixFn) -> Callable[[MixFn], MixFn]:
    """Decorator: register ``fast`` (the decorated function) and its ``reference`` for ``kind``."""
    if kind not in SIGNATURES:
        raise KeyError(f"attention type {kind!r} has no signature in search_spaces.attention.SIGNATURES")

    def wrap(fast: MixFn) -> MixFn:
        REGISTRY[kind] = AttentionType(kind, fast, reference, SIGNATURES[kind][1])
        return fast

    return wrap


def get(spec: AttentionSpec | str) -> AttentionType:
    if isinstance(spec, str):
        spec = parse_attention(spec)
    return REGISTRY[spec.kind]


def attend(q: Tensor, k: Tensor, v: Tensor, spec: AttentionSpec) -> Tensor:
    """Mix ``v`` by the layer's attention type (fast path). All tensors ``(B, H, T, D)``."""
    return REGISTRY[spec.kind].fast(q, k, v, spec)


def attend_reference(q: Tensor, k: Tensor, v: Tensor, spec: AttentionSpec) -> Tensor:
    return REGISTRY[spec.kind].reference(q, k, v, spec)


# --------------------------------------------------------------------------- masks


def causal_mask(t: int, device: torch.device | None = None) -> Tensor:
    """(T, T) bool, True where query i may see key j (j <= i)."""
    i = torch.arange(t, device=device)
    return i[:, None] >= i[None, :]


def window_mask(t: int, window: int, device: torch.device | None = None) -> Tensor:
    """(T, T) bool, True where i - window < j <= i."""
    i = torch.arange(t, device=device)
    d = i[:, None] - i[None, :]
    return (d >= 0) & (d < window)


def _masked_softmax_reference(q: Tensor, k: Tensor, v: Tensor, mask: Tensor) -> Tensor:
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])  # (B, H, T, T)
    scores = scores.masked_fill(~mask, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v  # (B, H, T, D)


# --------------------------------------------------------------------------- softmax


def _softmax_reference(q: Tensor, k: Tensor, v: Tensor, spec: AttentionSpec) -> Tensor:
    return _masked_softmax_reference(q, k, v, causal_mask(q.shape[-2], q.device))


@register("softmax", reference=_softmax_reference)
def softmax_attention(q: Tensor, k: Tensor, v: Tensor, spec: AttentionSpec) -> Tensor:
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


# --------------------------------------------------------------------------- local:W


def _local_reference(q: Tensor, k: Tensor, v: Tensor, spec: AttentionSpec) -> Tensor:
    return _masked_softmax_reference(q, k, v, window_mask(q.shape[-2], spec.param("W"), q.device))


@register("local", reference=_local_reference)
def local_attention(q: Tensor, k: Tensor, v: Tensor, spec: AttentionSpec) -> Tensor:
    # No branch on the sequence length: one traced (ONNX) graph must serve every length.
    return F.scaled_dot_product_attention(q, k, v, attn_mask=window_mask(q.shape[-2], spec.param("W"), q.device))


# --------------------------------------------------------------------------- linear

LINEAR_EPS = 1e-6


def elu_feature_map(x: Tensor) -> Tensor:
    return F.elu(x) + 1.0


def _linear_reference(q: Tensor, k: Tensor, v: Tensor, spec: AttentionSpec) -> Tensor:
    # out_i = phi(q_i) . sum_{j<=i} phi(k_j) v_j^T / (phi(q_i) . sum_{j<=i} phi(k_j))
    q, k = elu_feature_map(q), elu_feature_map(k)
    a = (q @ k.transpose(-2, -1)) * causal_mask(q.shape[-2], q.device)  # (B, H, T, T)
    return (a @ v) / (a.sum(-1, keepdim=True) + LINEAR_EPS)


def _exclusive_cumsum(x: Tensor) -> Tensor:
    """Prefix sums over dim 2 that exclude the current entry, shifted rather than subtracted so
    that no later value ever enters an earlier result, not even as rounding."""
    return torch.cat((torch.zeros_like(x[:, :, :1]), torch.cumsum(x[:, :, :-1], dim=2)), dim=2)


def causal_linear_chunked(q: Tensor, k: Tensor, v: Tensor, chunk: int = 64) -> Tensor:
    """Causal linear attention in O(T * C * D) using chunks of C tokens.

    Inside a chunk the (C, C) masked product is exact; across chunks a running
    sum of k^T v (the recurrent state) carries the prefix. q and k are already
    feature-mapped. Shapes: q, k (B, H, T, D), v (B, H, T, Dv).
    """
    b, h, t, d = q.shape
    dv = v.shape[-1]
    c = chunk
    # Always pad (by 0..C-1 tokens) so that one traced graph serves every length; zero keys and
    # values after the end are never seen by a real (earlier) query.
    pad = (c - t % c) % c
    q, k, v = (F.pad(x, (0, 0, 0, pad)) for x in (q, k, v))
    n = (t + pad) // c
    qc, kc, vc = q.view(b, h, n, c, d), k.view(b, h, n, c, d), v.view(b, h, n, c, dv)
    a = (qc @ kc.transpose(-2, -1)) * causal_mask(c, q.device)  # (B, H, N, C, C)
    num = a @ vc  # (B, H, N, C, Dv)
    den = a.sum(-1)  # (B, H, N, C)
    kv = kc.transpose(-2, -1) @ vc  # (B, H, N, D, Dv) per-chunk state increments
    ks = kc.sum(-2)  # (B, H, N, D)
    state = _exclusive_cumsum(kv)  # state before each chunk
    zsum = _exclusive_cumsum(ks)
    num = num + qc @ state
    den = den + (qc * zsum.unsqueeze(-2)).sum(-1)
    out = num / (den.unsqueeze(-1) + LINEAR_EPS)
    return out.reshape(b, h, n * c, dv)[:, :, :t]


@register("linear", reference=_linear_reference)
def linear_attention(q: Tensor, k: Tensor, v: Tensor, spec: AttentionSpec) -> Tensor:
    return causal_linear_chunked(elu_feature_map(q), elu_feature_map(k), v)


def check_registry() -> None:
    """Every signature has an implementation (and nothing else is registered)."""
    missing = set(SIGNATURES) - set(REGISTRY)
    extra = set(REGISTRY) - set(SIGNATURES)
    assert not missing and not extra, f"attention registry out of sync: missing {missing}, extra {extra}"
