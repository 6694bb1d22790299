"""Softmax-free attention with normalised queries and keys: ``hydra`` and ``sima``, causal and bidirectional forms.

* ``hydra`` (Hydra attention, Bolya et al. 2022: as many heads as features, the cosine kernel):
  ``out_i = n(q_i) * mean_{j<=i} n(k_j) * v_j`` elementwise, n = L2 normalisation over the head's
  channels.  The paper sums over all tokens of an image; a causal sum would grow with the position,
  so the causal form takes the mean (the count is the position + 1).  O(T D) by a prefix sum.
* ``sima`` (SimA, Koohpayegani and Pirsiavash 2022: softmax-free attention with l1-normalised Q and
  K): ``out_i = sum_c q^_i[c] (sum_{j<=i} k_j[c] v_j) / (sum_{j<=i} |k_j[c]|)``, q^ = q / |q|_1 over
  its channels, and each key channel l1-normalised over the tokens so far (the paper normalises
  over all tokens; causally, over the prefix).  Linear in T: causal linear attention of the
  queries divided by the key norms' prefix sums (:func:`.linear.causal_linear_chunked`).

The bidirectional forms (an encoder) take the same over every token instead of the prefix: Hydra
``n(q_i) * mean_j n(k_j) * v_j`` (the mean over all T tokens), SimA
``sum_c q^_i[c] (sum_j k_j[c] v_j) / (sum_j |k_j[c]|)`` (keys l1-normalised per channel over all tokens,
as in the paper); no prefix sums, O(T D) and O(T D^2).

Both decode with a constant state: Hydra the running sum (H, D), SimA the (D x D) sum of k v^T
and the key norms (D) per head; in fp32 like the linear family.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from . import native
from .base import AttentionType, StateSpec
from .linear import CHUNK, LINEAR_EPS, causal_linear_chunked
from .patterns import causal_mask
from .registry import register

NORM_EPS = 1e-6


def _l2(x: Tensor) -> Tensor:
    return F.normalize(x.float(), dim=-1, eps=NORM_EPS)


def _counts(t: int, start, device) -> Tensor:
    """(T, 1) tokens seen at positions start .. start + T - 1 (the mean's divisor)."""
    return (start + torch.arange(1, t + 1, device=device)).to(torch.float32)[:, None]


class Hydra(AttentionType):
    name = "hydra"
    family = "kernel-feature"  # n(q), n(k): normalised, not compared
    doc = "Hydra attention, causal: n(q) * running mean of n(k) * v per channel (n: L2 normalisation), O(T D)"
    forms = ("causal", "bidirectional")

    def reference(self, q, k, v, spec, w):
        t = q.shape[2]
        mean = causal_mask(t, q.device).float() / _counts(t, 0, q.device)  # (T, T): 1/(i+1) for j <= i
        return (_l2(q) * (mean @ (_l2(k) * v.float()))).to(v.dtype)

    def forward(self, q, k, v, spec, w):
        out = native.hydra(q, k, v, causal=True, eps=NORM_EPS)  # inference on the CPU: one pass, no tensors between
        if out is not None:
            return out
        running = torch.cumsum(_l2(k) * v.float(), dim=2)  # (B, H, T, D)
        return (_l2(q) * running / _counts(q.shape[2], 0, q.device)).to(v.dtype)

    def state(self, spec, heads, head_dim):
        return {"s": StateSpec((heads, head_dim), fp32=True)}

    def prefill_state(self, spec, q, k, v, w, capacity):
        return {"s": (_l2(k) * v.float()).sum(2)}  # (B, H, D)

    def step(self, spec, state, q, k, v, w, pos, length):
        s = state["s"] + (_l2(k) * v.float())[:, :, 0]  # (B, H, D)
        return (_l2(q) * s[:, :, None] / _counts(1, pos, q.device)).to(v.dtype), {"s": s}

    def prefill_flops(self, spec, batch, t, heads, head_dim):
        # normalise q and k (3 each: square, sum, divide), k * v, the running sum, the mean, the gate by q
        return 10.0 * batch * heads * t * head_dim

    def decode_flops(self, spec, batch, context, heads, head_dim):
        return 10.0 * batch * heads * head_dim

    def bidirectional_reference(self, q, k, v, spec, w):
        t = q.shape[2]
        mean = torch.full((t, t), 1.0 / t, device=q.device)  # (T, T): every token, weight 1/T
        return (_l2(q) * (mean @ (_l2(k) * v.float()))).to(v.dtype)

    def bidirectional(self, q, k, v, spec, w):
        out = native.hydra(q, k, v, causal=False, eps=NORM_EPS)
        if out is not None:
            return out
        return (_l2(q) * (_l2(k) * v.float()).mean(2, keepdim=True)).to(v.dtype)  # (B, H, T, D)

    def bidirectional_flops(self, spec, batch, t, heads, head_dim):
        # normalise q and k (3 each per channel), k * v, the sum over tokens, the gate by q; the mean's division (D)
        return 9.0 * batch * heads * t * head_dim + batch * heads * head_dim


def _l1(x: Tensor) -> Tensor:
    return x.float() / (x.float().abs().sum(-1, keepdim=True) + NORM_EPS)


class SimA(AttentionType):
    name = "sima"
    family = "kernel-feature"  # l1-normalised q and k
    doc = "SimA, causal: l1-normalised queries, keys l1-normalised per channel over the prefix, no softmax, O(T D^2)"
    forms = ("causal", "bidirectional")

    def _queries(self, q: Tensor, k: Tensor) -> Tensor:
        """q^ / (prefix sums of |k| per channel): then out is causal linear attention of these and k, unnormalised."""
        return _l1(q) / (torch.cumsum(k.float().abs(), dim=2) + LINEAR_EPS)

    def reference(self, q, k, v, spec, w):
        a = (self._queries(q, k) @ k.float().transpose(-2, -1)) * causal_mask(q.shape[2], q.device)  # (B, H, T, T)
        return (a @ v.float()).to(v.dtype)

    def forward(self, q, k, v, spec, w):
        out = native.causal_linear(q, k, v, "sima", False, LINEAR_EPS, NORM_EPS)  # inference on the CPU: queries mapped there
        if out is not None:
            return out
        return causal_linear_chunked(self._queries(q, k), k.float(), v.float(), normalize=False).to(v.dtype)

    def state(self, spec, heads, head_dim):
        return {
            "s": StateSpec((heads, head_dim, head_dim), fp32=True),
            "z": StateSpec((heads, head_dim), fp32=True, positive=True),
        }

    def prefill_state(self, spec, q, k, v, w, capacity):
        return {"s": k.float().transpose(-2, -1) @ v.float(), "z": k.float().abs().sum(2)}

    def step(self, spec, state, q, k, v, w, pos, length):
        s = state["s"] + k.float().transpose(-2, -1) @ v.float()  # (B, H, D, D)
        z = state["z"] + k.float().abs()[:, :, 0]  # (B, H, D)
        return ((_l1(q) / (z[:, :, None] + LINEAR_EPS)) @ s).to(v.dtype), {"s": s, "z": z}

    def prefill_flops(self, spec, batch, t, heads, head_dim):
        chunked = 2.0 * batch * heads * (2 * t * CHUNK * head_dim + 2 * t * head_dim * head_dim)  # as relu-linear
        return chunked + 6.0 * batch * heads * t * head_dim  # + the l1 norms, key prefix sums, division

    def decode_flops(self, spec, batch, context, heads, head_dim):
        return 4.0 * batch * heads * head_dim * head_dim + 6.0 * batch * heads * head_dim

    def _all_queries(self, q: Tensor, k: Tensor) -> Tensor:
        """q^ / (sums of |k| per channel over every token): (B, H, T, D)."""
        return _l1(q) / (k.float().abs().sum(2, keepdim=True) + LINEAR_EPS)

    def bidirectional_reference(self, q, k, v, spec, w):
        a = self._all_queries(q, k) @ k.float().transpose(-2, -1)  # (B, H, T, T), no mask
        return (a @ v.float()).to(v.dtype)

    def bidirectional(self, q, k, v, spec, w):
        return (self._all_queries(q, k) @ (k.float().transpose(-2, -1) @ v.float())).to(v.dtype)  # k^T v: (B, H, D, D)

    def bidirectional_flops(self, spec, batch, t, heads, head_dim):
        # k^T v and q^ (k^T v) (2 T D^2 each); l1 norms of q (3 T D), |k| summed (2 T D), the division (T D)
        return 4.0 * batch * heads * t * head_dim * head_dim + 6.0 * batch * heads * t * head_dim


hydra = register(Hydra())
sima = register(SimA())
