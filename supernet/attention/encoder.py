"""Encoder-only token mixers (bidirectional by design, no causal form): ``linformer:K``, ``additive``, ``xca``.

Each mixes every token with every other one at a cost linear in the length T; none has a decoding
state (an encoder reads the whole sequence at once), so the space layer refuses them for a causal
task (``forms = ("bidirectional",)``).  Shapes: q (B, H, T, D), k (B, Hk, T, D), v (B, H, T, D).

* ``linformer:K`` (Linformer, Wang et al. 2020): keys and values are projected along the sequence
  to K rows by learned (K, max_seq_len) matrices E and F shared by the layer's heads
  (k' = E[:, :T] k, v' = F[:, :T] v), then softmax(q k'^T / sqrt(D)) v'.  The projections are the
  type's weights, elastic like every weight: the supernet keeps (K_max, max_seq_len) and a layer of
  K rows over T tokens uses the leading block E[:K, :T].  O(T K D).
* ``additive`` (SwiftFormer's efficient additive attention, Shaker et al. 2023): q and the value
  projection (SwiftFormer's "key") L2-normalised over channels; a learned vector w_a per head scores
  each token, alpha = softmax over tokens of q^ . w_a / sqrt(D); the global query g = sum_i alpha_i q^_i;
  out = (g * v^) P^T + q^ with a learned (D, D) linear layer P per head.  No keys; O(T D^2).
* ``xca`` (XCiT's cross-covariance attention, as in EdgeNeXt): q and k L2-normalised along the
  tokens (each channel a unit vector over T); per head a (D, D) attention across channels
  A = softmax over the key channels of tau * q^T k (tau a learned temperature per head); out = v A^T.
  O(T D^2).

Each has a reference written out from the definition and a fast path (``bidirectional``, also what
the ONNX exporter traces: no branch on the traced length).  Linformer's fast path is one SDPA over
the K projected keys (an opset-23 ``Attention`` node without the causal flag when exported).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from .base import AttentionType
from .registry import register

NORM_EPS = 1e-6


class EncoderType(AttentionType):
    """An encoder-only type: the bidirectional form is its only form; its cost is :meth:`bidirectional_flops`."""

    forms = ("bidirectional",)

    def reference(self, q, k, v, spec, w):
        raise NotImplementedError(f"{self.name} has no causal form (an encoder-only type)")

    def prefill_flops(self, spec, batch, t, heads, head_dim):
        return self.bidirectional_flops(spec, batch, t, heads, head_dim)  # its only form

    def decode_flops(self, spec, batch, context, heads, head_dim):
        raise NotImplementedError(f"{self.name} has no decoding (an encoder-only type)")

    def state(self, spec, heads, head_dim):
        raise NotImplementedError(f"{self.name} has no decoding state (an encoder-only type)")


# --------------------------------------------------------------------------- linformer:K


class Linformer(EncoderType):
    name = "linformer"
    params = ("K",)
    doc = "Linformer: keys and values projected along the sequence to K rows by learned (K, max_seq_len) matrices"
    fused_onnx = True  # softmax over the projected keys: one Attention node

    def problems(self, spec, max_seq_len, heads):
        k = spec.param("K")
        if k > max_seq_len:
            return [f"{spec}: K={k} exceeds max_seq_len {max_seq_len} (projecting to more rows than tokens)"]
        return []

    def weights(self, spec, heads, head_dim, max_seq_len=None):
        if max_seq_len is None:
            raise ValueError(f"{spec}: the projections span the sequence: its weights need the space's max_seq_len")
        shape = (spec.param("K"), max_seq_len)
        return {"e": shape, "f": shape}

    def init_weight(self, name, weight, generator):
        # k' = E k sums over up to max_seq_len tokens: std 1/sqrt(L) keeps k' at the scale of one key
        torch.nn.init.normal_(weight, 0.0, weight.shape[1] ** -0.5, generator=generator)

    @staticmethod
    def _project(x: Tensor, p: Tensor) -> Tensor:
        """p (K, L) over x (B, H, T, D) -> (B, H, K, D): the leading T columns of p (elastic in the length)."""
        return p[:, : x.shape[2]] @ x

    def bidirectional_reference(self, q, k, v, spec, w):
        e, f = w["e"][:, : q.shape[2]], w["f"][:, : q.shape[2]]  # (K, T)
        kp = torch.einsum("nt,bhtd->bhnd", e, k)  # (B, Hk, K, D)
        vp = torch.einsum("nt,bhtd->bhnd", f, v)
        scores = torch.einsum("bhtd,bhnd->bhtn", q, kp) / math.sqrt(q.shape[-1])  # (B, H, T, K)
        return torch.einsum("bhtn,bhnd->bhtd", torch.softmax(scores, dim=-1), vp)

    def bidirectional(self, q, k, v, spec, w):
        return F.scaled_dot_product_attention(q, self._project(k, w["e"]), self._project(v, w["f"]))

    def bidirectional_flops(self, spec, batch, t, heads, head_dim):
        # E k and F v (2 K T D each), then scores and the weighted sum over K keys (2 T K D each)
        return 8.0 * batch * heads * spec.param("K") * t * head_dim


# --------------------------------------------------------------------------- additive


def _l2(x: Tensor, dim: int) -> Tensor:
    return F.normalize(x, dim=dim, eps=NORM_EPS)


def _l2_reference(x: Tensor, dim: int) -> Tensor:
    return x / (x * x).sum(dim, keepdim=True).sqrt().clamp(min=NORM_EPS)


class Additive(EncoderType):
    name = "additive"
    family = "gating"  # a pooled query gates v
    doc = "SwiftFormer efficient additive attention: a learned global query (softmax-pooled q) gates v, O(T D^2)"

    def heads(self, spec, heads):
        return 0, heads  # q and the value projection (SwiftFormer's key); no keys

    def weights(self, spec, heads, head_dim, max_seq_len=None):
        return {"wa": (heads, head_dim), "proj": (heads, head_dim, head_dim)}

    def bidirectional_reference(self, q, k, v, spec, w):
        b, h, t, d = q.shape
        qn, vn = _l2_reference(q, -1), _l2_reference(v, -1)
        logits = (qn * w["wa"][None, :, None, :]).sum(-1) / math.sqrt(d)  # (B, H, T)
        e = torch.exp(logits - logits.amax(-1, keepdim=True))
        alpha = e / e.sum(-1, keepdim=True)  # softmax over the tokens
        g = (alpha[..., None] * qn).sum(2, keepdim=True)  # (B, H, 1, D) the global query
        gated = g * vn  # (B, H, T, D)
        out = torch.einsum("bhtd,hcd->bhtc", gated, w["proj"])  # P per head: (g * v^) P^T
        return out + qn

    def bidirectional(self, q, k, v, spec, w):
        qn, vn = _l2(q, -1), _l2(v, -1)
        alpha = torch.softmax(qn @ (w["wa"][None, :, :, None] / math.sqrt(q.shape[-1])), dim=2)  # (B, H, T, 1)
        g = alpha.transpose(-2, -1) @ qn  # (B, H, 1, D)
        return ((g * vn) @ w["proj"].transpose(-2, -1)).add_(qn)  # (B, H, T, D); the matmul's output is not saved

    def bidirectional_flops(self, spec, batch, t, heads, head_dim):
        # per token and head: normalise q and v (3 D each), q^ . w_a (2 D), the pooling sum (2 D),
        # the gate (D), the (D, D) layer (2 D^2), the residual (D); the softmax over tokens (3 per token)
        return 1.0 * batch * heads * t * (12 * head_dim + 2 * head_dim * head_dim + 3)


# --------------------------------------------------------------------------- xca


class CrossCovariance(EncoderType):
    name = "xca"
    family = "kernel-feature"  # l2-normalised q and k across tokens
    doc = "XCiT/EdgeNeXt cross-covariance (transposed) attention: a (D, D) softmax across channels per head, O(T D^2)"

    def weights(self, spec, heads, head_dim, max_seq_len=None):
        return {"temperature": (heads,)}

    def init_weight(self, name, weight, generator):
        torch.nn.init.ones_(weight)  # XCiT's initial temperature

    def bidirectional_reference(self, q, k, v, spec, w):
        qn, kn = _l2_reference(q, 2), _l2_reference(k, 2)  # each channel a unit vector over the tokens
        a = torch.einsum("bhtc,bhte->bhce", qn, kn) * w["temperature"][None, :, None, None]  # (B, H, D, D)
        e = torch.exp(a - a.amax(-1, keepdim=True))
        attn = e / e.sum(-1, keepdim=True)  # softmax over the key channels
        return torch.einsum("bhce,bhte->bhtc", attn, v)  # out[t, c] = sum_e attn[c, e] v[t, e]

    def bidirectional(self, q, k, v, spec, w):
        # q^T k first, then divide the (D, D) result by the channel norms: no normalised (T, D) copies
        nq = torch.linalg.vector_norm(q, dim=2).clamp(min=NORM_EPS)  # (B, H, D)
        nk = torch.linalg.vector_norm(k, dim=2).clamp(min=NORM_EPS)
        scale = w["temperature"][:, None, None] / (nq[..., :, None] * nk[..., None, :])  # (B, H, D, D)
        attn = torch.softmax((q.transpose(-2, -1) @ k) * scale, dim=-1)  # (B, H, D, D)
        return v @ attn.transpose(-2, -1)  # (B, H, T, D)

    def bidirectional_flops(self, spec, batch, t, heads, head_dim):
        # normalise q and k over the tokens (3 T D each), q^T k and v A^T (2 T D^2 each), scale and softmax (4 D^2)
        return 1.0 * batch * heads * (6 * t * head_dim + 4 * t * head_dim * head_dim + 4 * head_dim * head_dim)


# in the order the documentation lists them
linformer, additive, xca = (register(t()) for t in (Linformer, Additive, CrossCovariance))
