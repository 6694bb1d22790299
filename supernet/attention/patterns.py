"""Which keys each query sees, for the softmax-family types: one function per pattern.

A pattern is ``pattern(i, j, spec) -> bool`` on broadcastable integer tensors of query and
key positions.  The same function gives the dense ``(T, T)`` mask (reference path and ONNX
export) and, on CUDA, the FlexAttention ``mask_mod``; the CPU fast paths in
:mod:`.sparse` are written independently and tested against it.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from search_spaces.attention import AttentionSpec

from .registry import PatternFn

# The BigBird random blocks: a fixed seed, and a small multiplicative generator (MINSTD,
# modulus 2^31 - 1) that every path evaluates on index tensors, so the pattern is defined for
# every length without a stored table and traces into ONNX / FlexAttention alike.
BIGBIRD_SEED = 20200728
_MINSTD = 2147483647


def causal(i: Tensor, j: Tensor, spec: AttentionSpec | None = None) -> Tensor:
    return j <= i


def local(i: Tensor, j: Tensor, spec: AttentionSpec) -> Tensor:
    d = i - j
    return (d >= 0) & (d < spec.param("W"))


def dilated(i: Tensor, j: Tensor, spec: AttentionSpec) -> Tensor:
    w, step = spec.param("W"), spec.param("D")
    d = i - j
    return (d >= 0) & (d % step == 0) & (d < w * step)


def strided(i: Tensor, j: Tensor, spec: AttentionSpec) -> Tensor:
    s = spec.param("S")
    d = i - j
    return (d >= 0) & ((d < s) | (d % s == 0))


def fixed(i: Tensor, j: Tensor, spec: AttentionSpec) -> Tensor:
    s = spec.param("S")
    return (j <= i) & ((j // s == i // s) | (j % s == s - 1))


def longformer(i: Tensor, j: Tensor, spec: AttentionSpec) -> Tensor:
    return (j <= i) & ((i - j < spec.param("W")) | (j < spec.param("G")))


def bigbird_random_block(block: Tensor, r: int, seed: int = BIGBIRD_SEED) -> Tensor:
    """The ``r``-th random key block of query block ``block`` (blocks of W tokens): in ``[0, block - 2]``.

    Only meaningful for ``block >= 2`` (earlier blocks have no block outside their window).
    Pure integer arithmetic, below 2^48 throughout, so int64 never overflows.
    """
    x = (block.to(torch.int64) * 92821 + (r + 1) * 68917 + seed) % _MINSTD
    x = (x * 48271) % _MINSTD
    x = (x * 48271) % _MINSTD
    return x % (block.to(torch.int64) - 1).clamp(min=1)


def bigbird(i: Tensor, j: Tensor, spec: AttentionSpec) -> Tensor:
    w = spec.param("W")
    bi, bj = i // w, j // w
    rand = torch.zeros_like(bi == bj)
    for r in range(spec.param("R")):
        rand = rand | (bj == bigbird_random_block(bi, r))
    return longformer(i, j, spec) | (rand & (bi >= 2))


# --------------------------------------------------------------------------- dense forms


def dense_mask(pattern: PatternFn, spec: AttentionSpec, t: int, device: torch.device | None = None) -> Tensor:
    """(T, T) bool, True where query i may see key j."""
    i = torch.arange(t, device=device)
    return pattern(i[:, None], i[None, :], spec)


def causal_mask(t: int, device: torch.device | None = None) -> Tensor:
    """(T, T) bool, True where query i may see key j (j <= i)."""
    return dense_mask(causal, None, t, device)


def window_mask(t: int, window: int, device: torch.device | None = None) -> Tensor:
    """(T, T) bool, True where i - window < j <= i."""
    return dense_mask(local, AttentionSpec("local", (window,)), t, device)


def masked_softmax_reference(q: Tensor, k: Tensor, v: Tensor, mask: Tensor) -> Tensor:
    """softmax(q k^T / sqrt(D) where mask, else -inf) v, written out. (B, H, T, D)."""
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])  # (B, H, T, T)
    scores = scores.masked_fill(~mask, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v  # (B, H, T, D)


def reference_for(pattern: PatternFn):
    """The reference path of a pattern: the written-out masked softmax."""

    def reference(q: Tensor, k: Tensor, v: Tensor, spec: AttentionSpec) -> Tensor:
        return masked_softmax_reference(q, k, v, dense_mask(pattern, spec, q.shape[-2], q.device))

    return reference


def masked_sdpa_for(pattern: PatternFn):
    """The ONNX path of a pattern: one masked SDPA (an opset-23 ``Attention`` node), mask built in-graph."""

    def masked_sdpa(q: Tensor, k: Tensor, v: Tensor, spec: AttentionSpec) -> Tensor:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=dense_mask(pattern, spec, q.shape[-2], q.device))

    return masked_sdpa
