"""Kernelized (linear) attention: linear, relu-linear, cosformer:M, performer:M.

All four compute  out_i = sum_{j<=i} (phi_q(i) . phi_k(j)) v_j / (sum_{j<=i} phi_q(i) . phi_k(j) + eps)
with a non-negative feature map phi; they differ only in phi.  The fast path (every device,
and the ONNX export) is :func:`causal_linear_chunked`, O(T * C * F) in chunks of C tokens;
the reference writes out the (T, T) matrix.  A later decode step carries the running state
sum_j phi_k(j) v_j^T and sum_j phi_k(j).
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from search_spaces.attention import AttentionSpec

from .patterns import causal_mask
from .registry import register

LINEAR_EPS = 1e-6
CHUNK = 64
PERFORMER_SEED = 20200930  # Performer (arXiv 2009.14794); the random features are fixed by it


# --------------------------------------------------------------------------- the two computations


def kernel_reference(fq: Tensor, fk: Tensor, v: Tensor) -> Tensor:
    """Written-out causal kernel attention of features fq, fk (B, H, T, F) and v (B, H, T, Dv)."""
    a = (fq @ fk.transpose(-2, -1)) * causal_mask(fq.shape[-2], fq.device)  # (B, H, T, T)
    return (a @ v) / (a.sum(-1, keepdim=True) + LINEAR_EPS)


def _exclusive_cumsum(x: Tensor) -> Tensor:
    """Prefix sums over dim 2 that exclude the current entry, shifted rather than subtracted so
    that no later value ever enters an earlier result, not even as rounding."""
    return torch.cat((torch.zeros_like(x[:, :, :1]), torch.cumsum(x[:, :, :-1], dim=2)), dim=2)


def causal_linear_chunked(q: Tensor, k: Tensor, v: Tensor, chunk: int = CHUNK) -> Tensor:
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


def _register_kernel(kind: str, features, reference=None) -> None:
    """Register a linear-attention type given its feature map ``features(q, k, spec) -> (fq, fk)``."""

    def _reference(q: Tensor, k: Tensor, v: Tensor, spec: AttentionSpec) -> Tensor:
        return kernel_reference(*features(q, k, spec), v)

    def fast(q: Tensor, k: Tensor, v: Tensor, spec: AttentionSpec) -> Tensor:
        # Features and running sums in fp32 whatever the input: prefix sums over thousands of
        # tokens (and exp features) lose too much in bf16 / fp16.
        qf, kf, vf = q.float(), k.float(), v.float()
        return causal_linear_chunked(*features(qf, kf, spec), vf).to(v.dtype)

    fast.__name__ = fast.__qualname__ = f"{kind.replace('-', '_')}_attention"
    register(kind, reference=reference or _reference)(fast)


# --------------------------------------------------------------------------- feature maps


def elu_feature_map(x: Tensor) -> Tensor:
    return F.elu(x) + 1.0


_register_kernel("linear", lambda q, k, spec: (elu_feature_map(q), elu_feature_map(k)))
_register_kernel("relu-linear", lambda q, k, spec: (F.relu(q), F.relu(k)))


def cosformer_features(x: Tensor, horizon: int, start: int = 0) -> Tensor:
    """[relu(x) cos(a_i), relu(x) sin(a_i)], a_i = pi/2 * i / M for positions i = start, start+1, ...

    Then phi(q_i) . phi(k_j) = relu(q_i) . relu(k_j) cos(pi/2 * (i - j) / M).  (B, H, T, D) -> (B, H, T, 2D).
    """
    pos = torch.arange(start, start + x.shape[-2], device=x.device, dtype=x.dtype)
    angle = (math.pi / 2 / horizon) * pos[:, None]  # (T, 1)
    r = F.relu(x)
    return torch.cat((r * torch.cos(angle), r * torch.sin(angle)), dim=-1)


def _cosformer_reference(q: Tensor, k: Tensor, v: Tensor, spec: AttentionSpec) -> Tensor:
    # Directly from the definition, not via the cos/sin decomposition the fast path uses.
    i = torch.arange(q.shape[-2], device=q.device, dtype=q.dtype)
    weight = torch.cos((math.pi / 2 / spec.param("M")) * (i[:, None] - i[None, :]))  # (T, T)
    a = (F.relu(q) @ F.relu(k).transpose(-2, -1)) * weight * causal_mask(q.shape[-2], q.device)
    return (a @ v) / (a.sum(-1, keepdim=True) + LINEAR_EPS)


_register_kernel(
    "cosformer",
    lambda q, k, spec: (cosformer_features(q, spec.param("M")), cosformer_features(k, spec.param("M"))),
    reference=_cosformer_reference,
)


@lru_cache(maxsize=32)
def _orthogonal_features(m: int, d: int) -> np.ndarray:
    rng = np.random.default_rng([PERFORMER_SEED, m, d])
    blocks = [np.linalg.qr(rng.standard_normal((d, d)))[0].T for _ in range(-(-m // d))]
    w = np.concatenate(blocks)[:m]  # (M, D), orthonormal rows within each block of D
    w = w * np.linalg.norm(rng.standard_normal((m, d)), axis=1, keepdims=True)
    w.setflags(write=False)
    return w


def performer_projection(m: int, d: int, device: torch.device, dtype: torch.dtype) -> Tensor:
    """(M, D) orthogonal random features: blocks of D orthonormal rows (QR of a Gaussian), each row
    scaled to the norm of a Gaussian row, drawn once from :data:`PERFORMER_SEED` (numpy, so a trace
    or a device never changes them): every model and every device uses the same features."""
    return torch.tensor(_orthogonal_features(m, d), dtype=dtype, device=device)


def performer_features(x: Tensor, w: Tensor, is_query: bool) -> Tensor:
    """FAVOR+ positive features exp(w x' - |x'|^2 / 2) / sqrt(M), x' = x / D^(1/4).

    A query's features are divided by their maximum (it cancels in the ratio); a key's are not,
    since any shared stabiliser over keys would leak later tokens into earlier outputs.
    """
    x = x * x.shape[-1] ** -0.25
    logits = x @ w.T - (x * x).sum(-1, keepdim=True) / 2  # (B, H, T, M)
    if is_query:
        logits = logits - logits.amax(-1, keepdim=True).detach()
    return torch.exp(logits) / math.sqrt(w.shape[0])


def _performer(q: Tensor, k: Tensor, spec: AttentionSpec) -> tuple[Tensor, Tensor]:
    w = performer_projection(spec.param("M"), q.shape[-1], q.device, q.dtype)
    return performer_features(q, w, True), performer_features(k, w, False)


_register_kernel("performer", _performer)


# --------------------------------------------------------------------------- decoding


def kernel_features(q: Tensor, k: Tensor, spec: AttentionSpec, start: int | Tensor = 0) -> tuple[Tensor, Tensor]:
    """(phi(q), phi(k)) of a linear-family type for tokens at positions ``start``, ``start + 1``, ...

    The maps the fast path uses, exposed for incremental decoding (:mod:`supernet.decode`), where
    one token at position ``start`` is mapped at a time; only cosformer depends on the position.
    (B, H, T, D) -> (B, H, T, F).
    """
    if spec.kind == "linear":
        return elu_feature_map(q), elu_feature_map(k)
    if spec.kind == "relu-linear":
        return F.relu(q), F.relu(k)
    if spec.kind == "cosformer":
        m = spec.param("M")
        pos = (start + torch.arange(q.shape[-2], device=q.device)).to(q.dtype)  # (T,): start may be a traced tensor
        angle = (math.pi / 2 / m) * pos[:, None]  # (T, 1), as in cosformer_features
        rq, rk = F.relu(q), F.relu(k)
        return (
            torch.cat((rq * torch.cos(angle), rq * torch.sin(angle)), dim=-1),
            torch.cat((rk * torch.cos(angle), rk * torch.sin(angle)), dim=-1),
        )
    if spec.kind == "performer":
        return _performer(q, k, spec)
    raise KeyError(f"{spec} is not a linear-family attention type")
