"""``nystrom:M``: Nyströmformer (Xiong et al. 2021), an encoder-only type of Long Range Arena's lineup.

Softmax attention approximated through M landmarks: the landmark queries and keys are the means of M
contiguous segments of the queries and keys, and

    out = softmax(q kl^T / sqrt(D)) . pinv(softmax(ql kl^T / sqrt(D))) . (softmax(ql k^T / sqrt(D)) v)

with ``pinv`` the paper's iterative Moore-Penrose pseudo-inverse: 6 iterations of
``Z <- Z (13 I - A Z (15 I - A Z (7 I - A Z))) / 4`` from ``Z0 = A^T / (max column sum * max row sum)``.
The paper's code takes those two maxima over the whole mini-batch; here each (sequence, head) takes its own,
so a sequence's output does not depend on the others in its batch (the convergence condition is the same).
The iterative inverse is part of the type (what the paper trains and evaluates), so the reference runs it
too; :func:`nystrom_exact` is the same formula with ``torch.linalg.pinv``, which the tests hold it close to.

A length T that M does not divide: the segments are ceil(T/M) tokens long over the sequence padded with
zero rows, and each landmark is its segment's sum over ceil(T/M), as the paper's code does (its inputs are
zero-padded and masked); the padding is never a key or a query.  T < M gives some all-padding (zero)
landmarks, again as the paper's code would.  The paper's optional depthwise-convolution skip on v (kernel
33) is left out: it is a second token mixer, not part of the approximation.

Bidirectional only: every query's first factor sums over landmarks of the whole sequence (a causal form
would need landmarks per prefix; the paper has none).  No weights of its own; O(T M D + M^3).
"""

from __future__ import annotations

import torch
from torch import Tensor

from .encoder import EncoderType
from .registry import register

PINV_ITERATIONS = 6  # the paper's


def iterative_pinv(a: Tensor, iterations: int = PINV_ITERATIONS) -> Tensor:
    """The Nyströmformer's iterative Moore-Penrose pseudo-inverse of a (..., M, M), per matrix."""
    eye = torch.eye(a.shape[-1], dtype=a.dtype, device=a.device)
    scale = a.abs().sum(-2).amax(-1) * a.abs().sum(-1).amax(-1)  # max column sum x max row sum (rows of a softmax: 1)
    z = a.transpose(-2, -1) / scale[..., None, None]
    for _ in range(iterations):
        az = a @ z
        z = 0.25 * z @ (13 * eye - az @ (15 * eye - az @ (7 * eye - az)))
    return z


def _pinv(a: Tensor) -> Tensor:
    """:func:`iterative_pinv` in float32 at least (bf16 iterations drift; the (M, M) work is small), in a's dtype."""
    return iterative_pinv(a.to(torch.promote_types(a.dtype, torch.float32))).to(a.dtype)


def segment_means(x: Tensor, m: int) -> Tensor:
    """(B, H, T, D) -> (B, H, M, D): sums of M segments of ceil(T/M) tokens (zero-padded at the end) over ceil(T/M),
    as one (M, T) averaging matrix (no padding copy; no reshape by a length-dependent size: it traces)."""
    t = x.shape[2]
    seg = (t + m - 1) // m
    owner = torch.arange(t, device=x.device) // seg  # (T,) the segment of each token
    avg = (owner[None, :] == torch.arange(m, device=x.device)[:, None]).to(x.dtype) / seg  # (M, T)
    return avg @ x


def _softmax(s: Tensor) -> Tensor:
    e = torch.exp(s - s.amax(-1, keepdim=True))
    return e / e.sum(-1, keepdim=True)


def _landmarks_reference(x: Tensor, m: int) -> Tensor:
    """The paper's code: pad with zero rows to M segments of ceil(T/M), reshape, mean."""
    b, h, t, d = x.shape
    seg = -(-t // m)
    padded = torch.cat([x, x.new_zeros(b, h, m * seg - t, d)], dim=2)
    return padded.reshape(b, h, m, seg, d).mean(3)


def _kernels(q: Tensor, k: Tensor, m: int) -> tuple[Tensor, Tensor, Tensor]:
    scale = q.shape[-1] ** -0.25  # q / D^(1/4) and k / D^(1/4), as the paper's code scales them
    q, k = q * scale, k * scale
    ql, kl = _landmarks_reference(q, m), _landmarks_reference(k, m)
    k1 = _softmax(q @ kl.transpose(-2, -1))  # (B, H, T, M)
    k2 = _softmax(ql @ kl.transpose(-2, -1))  # (B, H, M, M)
    k3 = _softmax(ql @ k.transpose(-2, -1))  # (B, H, M, T)
    return k1, k2, k3


def nystrom_exact(q: Tensor, k: Tensor, v: Tensor, m: int) -> Tensor:
    """The Nyström formula with the exact pseudo-inverse (``torch.linalg.pinv``): what the iterations approximate."""
    k1, k2, k3 = _kernels(q, k, m)
    return k1 @ torch.linalg.pinv(k2) @ (k3 @ v)


class Nystrom(EncoderType):
    name = "nystrom"
    params = ("M",)
    doc = "Nystromformer: softmax attention through M segment-mean landmarks and an iterative pseudo-inverse, O(T M D)"

    def problems(self, spec, max_seq_len, heads):
        m = spec.param("M")
        if m > max_seq_len:
            return [f"{spec}: M={m} exceeds max_seq_len {max_seq_len} (more landmarks than tokens)"]
        return []

    def bidirectional_reference(self, q, k, v, spec, w):
        k1, k2, k3 = _kernels(q, k, spec.param("M"))
        z = _pinv(k2)
        return k1 @ z @ (k3 @ v)  # (T, M) (M, M) (M, T) (T, D), left to right

    def bidirectional(self, q, k, v, spec, w):
        m = spec.param("M")
        scale = q.shape[-1] ** -0.25
        ql, kl = segment_means(q, m) * scale, segment_means(k, m) * scale  # (B, H, M, D)
        k1 = torch.softmax((q * scale) @ kl.transpose(-2, -1), dim=-1)  # (B, H, T, M)
        k2 = torch.softmax(ql @ kl.transpose(-2, -1), dim=-1)  # (B, H, M, M)
        k3v = torch.softmax(ql @ (k * scale).transpose(-2, -1), dim=-1) @ v  # (B, H, M, D)
        z = _pinv(k2)
        return k1 @ (z @ k3v)  # the (M, D) product first: O(T M D)

    def bidirectional_flops(self, spec, batch, t, heads, head_dim):
        m, d = spec.param("M"), head_dim
        per_head = (
            2 * t * d  # q and k scaled
            + 2 * (2 * m * t * d)  # the landmarks (the (M, T) averaging matrix over q and k)
            + 2 * t * m * d + 3 * t * m  # kernel 1: q kl^T and its softmax
            + 2 * m * m * d + 3 * m * m  # kernel 2
            + 2 * m * t * d + 3 * m * t  # kernel 3
            + 2 * m * m + PINV_ITERATIONS * (4 * 2 * m**3 + 3 * m * m)  # pinv: init; 4 (M, M) products, 3 I - . a step
            + 2 * m * t * d  # kernel 3 times v
            + 2 * m * m * d  # pinv times that
            + 2 * t * m * d  # kernel 1 times that
        )
        return 1.0 * batch * heads * per_head


nystrom = register(Nystrom())
__all__ = ["Nystrom", "iterative_pinv", "nystrom", "nystrom_exact", "segment_means"]
