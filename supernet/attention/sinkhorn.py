"""``sinkhorn:B``: Sparse Sinkhorn attention (Tay et al. 2020), an encoder-only type of Long Range Arena's lineup.

The sequence is cut into N = ceil(T/B) blocks of B tokens.  A sorting network scores every pair of blocks:
each block's mean key through a two-layer ReLU network per head, ``R = relu(kbar W1) W2[:, :N]`` (W1 (D, D),
W2 (D, ceil(max_seq_len/B)): the paper's meta sorting network on the block embeddings, its last layer one unit
per block, so it spans the sequence as Linformer's projections do and a layer uses its leading N columns).
Sinkhorn normalisation turns ``R / tau`` into a doubly stochastic (N, N) matrix P (:data:`SINKHORN_ITERATIONS`
alternating row and column normalisations in log space, temperature :data:`TEMPERATURE`: the paper's best);
the sorted keys and values of block n are ``sum_m P[n, m]`` times block m's.  Each query attends, under one
softmax, to the B keys of its own block and the B sorted keys of its block: O(T B D) plus O(N^2 B D) = O(T^2 D/B)
for the sorting, small next to the attention while N < B.

The paper adds Gumbel noise to R while training; this type does not (no random draw: training and inference
compute the same function).  A length T that B does not divide: the last block is padded with zero rows; a
padding key is hidden in its own block, and a sorted key slot is weighted by the share of real tokens that P
mixes into it (its score plus ``log(P @ real)``: a slot mixing only padding is hidden; with N >= 2 every
slot mixes some real token).  Bidirectional only: the paper's causal variant needs a causal Sinkhorn
balancing and a decoding state of block sums, which LRA's classification tasks do not use.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from .blocks import block_count
from .encoder import EncoderType
from .registry import register

SINKHORN_ITERATIONS = 7  # the paper's best (and the reference code's default)
TEMPERATURE = 0.75


def sinkhorn(logits: Tensor, iterations: int = SINKHORN_ITERATIONS, temperature: float = TEMPERATURE) -> Tensor:
    """(..., N, N) logits -> a doubly stochastic matrix: rows then columns normalised in log space, ``iterations`` times."""
    r = logits / temperature
    for _ in range(iterations):
        r = r - _logsumexp(r, -1)
        r = r - _logsumexp(r, -2)
    return torch.exp(r)


def _logsumexp(x: Tensor, dim: int) -> Tensor:
    """torch.logsumexp written out (torch's checks for an empty tensor guard on a symbolic block count when exporting)."""
    m = x.amax(dim, keepdim=True).detach()
    return m + torch.log(torch.exp(x - m).sum(dim, keepdim=True))


def _safe_log(x: Tensor) -> Tensor:
    """log x, -inf where x == 0, with a zero (not NaN) gradient there."""
    pos = x > 0
    return torch.where(pos, torch.log(torch.where(pos, x, torch.ones_like(x))), torch.full_like(x, float("-inf")))


class Sinkhorn(EncoderType):
    name = "sinkhorn"
    params = ("B",)
    doc = "Sparse Sinkhorn attention: blocks of B see their own block and one sorted to them by a learned Sinkhorn permutation"

    def problems(self, spec, max_seq_len, heads):
        b = spec.param("B")
        if b > max_seq_len:
            return [f"{spec}: B={b} exceeds max_seq_len {max_seq_len} (a block longer than the sequence)"]
        return []

    def weights(self, spec, heads, head_dim, max_seq_len=None):
        if max_seq_len is None:
            raise ValueError(f"{spec}: its sorting network scores every block: its weights need the space's max_seq_len")
        return {"w1": (heads, head_dim, head_dim), "w2": (heads, head_dim, -(-max_seq_len // spec.param("B")))}

    def init_weight(self, name, weight, generator):
        torch.nn.init.normal_(weight, 0.0, weight.shape[1] ** -0.5, generator=generator)

    @staticmethod
    def _permutation(kbar: Tensor, w: dict, n) -> Tensor:
        """kbar (B, H, N, D) the blocks' mean keys -> P (B, H, N, N): P[n, m] how much of block m is sorted to block n."""
        if torch.compiler.is_exporting():  # (symbolic sizes: the block count fits the layer, no size is 0)
            torch._check(n <= w["w2"].shape[-1])
            torch._check(kbar.shape[0] >= 1)
            torch._check(kbar.shape[1] >= 1)
        hidden = torch.relu(kbar @ w["w1"][None])  # (B, H, N, D)
        return sinkhorn(hidden @ w["w2"][None, :, :, :n])  # (B, H, N, N)

    def bidirectional_reference(self, q, k, v, spec, w):
        bsz, h, t, d = q.shape
        c = spec.param("B")
        n = -(-t // c)
        pad = lambda x: torch.cat([x, x.new_zeros(bsz, h, n * c - t, d)], dim=2)  # noqa: E731
        kp, vp = pad(k), pad(v)
        real = (torch.arange(n * c, device=q.device) < t).to(q.dtype)  # (NC,)
        blocks = [slice(i * c, (i + 1) * c) for i in range(n)]
        kbar = torch.stack([kp[:, :, s].sum(2) / c for s in blocks], dim=2)  # (B, H, N, D)
        p = self._permutation(kbar, w, n)
        out = torch.empty_like(q)
        for i, s in enumerate(blocks):
            ks = sum(p[:, :, i, m, None, None] * kp[:, :, sm] for m, sm in enumerate(blocks))  # (B, H, C, D): sorted to i
            vs = sum(p[:, :, i, m, None, None] * vp[:, :, sm] for m, sm in enumerate(blocks))
            share = sum(p[:, :, i, m, None] * real[sm] for m, sm in enumerate(blocks))  # (B, H, C): real tokens mixed in
            own = (q[:, :, s] @ kp[:, :, s].transpose(-2, -1)) / math.sqrt(d)  # (B, H, rows, C)
            own = own.masked_fill(real[s] == 0, float("-inf"))
            sorted_ = (q[:, :, s] @ ks.transpose(-2, -1)) / math.sqrt(d) + _safe_log(share)[:, :, None, :]
            scores = torch.cat([own, sorted_], dim=-1)  # (B, H, rows, 2C)
            e = torch.exp(scores - scores.amax(-1, keepdim=True))
            out[:, :, s] = (e / e.sum(-1, keepdim=True)) @ torch.cat([vp[:, :, s], vs], dim=2)
        return out

    def bidirectional(self, q, k, v, spec, w):
        bsz, h, t, d = q.shape
        c = spec.param("B")
        n = block_count(t, c)
        pad = n * c - t
        qb, kb, vb = (F.pad(x, (0, 0, 0, pad)).reshape(bsz, h, n, c, d) for x in (q, k, v))  # (B, H, N, C, D)
        real = F.pad(torch.ones(t, dtype=q.dtype, device=q.device), (0, pad)).reshape(n, c)  # (N, C)
        p = self._permutation(kb.sum(3) / c, w, n)  # (B, H, N, N)
        ks = torch.einsum("bhnm,bhmcd->bhncd", p, kb)  # sorted to each block
        vs = torch.einsum("bhnm,bhmcd->bhncd", p, vb)
        share = p @ real  # (B, H, N, C)
        qs = qb * d**-0.5
        own = (qs @ kb.transpose(-2, -1)).masked_fill(real[:, None, :] == 0, float("-inf"))  # (B, H, N, C, C)
        sorted_ = qs @ ks.transpose(-2, -1) + _safe_log(share)[..., None, :]
        a = torch.softmax(torch.cat([own, sorted_], dim=-1), dim=-1)  # (B, H, N, C, 2C)
        out = a[..., :c] @ vb + a[..., c:] @ vs  # (B, H, N, C, D)
        return out.reshape(bsz, h, n * c, d)[:, :, :t]

    def bidirectional_flops(self, spec, batch, t, heads, head_dim):
        c, d = spec.param("B"), head_dim
        n = -(-t // c)
        per_head = (
            n * c * d  # the block means
            + 2 * n * d * d + n * d + 2 * n * d * n  # the sorting network
            + n * n + SINKHORN_ITERATIONS * 2 * 4 * n * n + n * n  # / tau; each normalisation exp, sum, log, subtract; exp
            + 2 * (2 * n * n * c * d)  # sorted keys and values
            + 2 * n * n * c + n * c  # the real-token share and its log
            + 2 * (n * c) * (2 * c) * d + n * c * c + 3 * (n * c) * (2 * c)  # scores, the share added, softmax
            + 2 * (n * c) * (2 * c) * d  # the weighted sum
        )
        return 1.0 * batch * heads * per_head


sinkhorn_attention = register(Sinkhorn())
