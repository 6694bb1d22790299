"""Kernelized (linear) attention: linear, relu-linear, cosformer:M, performer:M.

All four compute  out_i = sum_{j<=i} (phi_q(i) . phi_k(j)) v_j / (sum_{j<=i} phi_q(i) . phi_k(j) + eps)
with a non-negative feature map phi; they differ only in phi (:meth:`KernelType.features`, the one
definition the full forward, the decode step and the ONNX graphs all use).  The fast path (every
device, and the ONNX export) is :func:`causal_linear_chunked`, O(T * C * F) in chunks of C tokens;
the reference writes out the (T, T) matrix.  Decoding carries the running state
s = sum_j phi_k(j) v_j^T and z = sum_j phi_k(j), in fp32.

The bidirectional form (an encoder) sums over every j, not j <= i: no prefix sums, one
(F, Dv) state per sequence, :func:`bidirectional_linear`; its reference writes out the unmasked (T, T) matrix.
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from search_spaces.attention import AttentionSpec

from .base import AttentionType, State, StateSpec
from .blocks import block_count
from .patterns import causal_mask
from . import native
from .registry import register

LINEAR_EPS = 1e-6
CHUNK = 64
PERFORMER_SEED = 20200930  # Performer (arXiv 2009.14794); the random features are fixed by it


# --------------------------------------------------------------------------- the two computations


def kernel_reference(fq: Tensor, fk: Tensor, v: Tensor) -> Tensor:
    """Written-out causal kernel attention of features fq, fk (B, H, T, F) and v (B, H, T, Dv)."""
    a = (fq @ fk.transpose(-2, -1)) * causal_mask(fq.shape[-2], fq.device)  # (B, H, T, T)
    return (a @ v) / (a.sum(-1, keepdim=True) + LINEAR_EPS)


def bidirectional_kernel_reference(fq: Tensor, fk: Tensor, v: Tensor) -> Tensor:
    """Written-out bidirectional kernel attention: every query sees every key. (B, H, T, F) x2, (B, H, T, Dv)."""
    a = fq @ fk.transpose(-2, -1)  # (B, H, T, T)
    return (a @ v) / (a.sum(-1, keepdim=True) + LINEAR_EPS)


def bidirectional_linear(fq: Tensor, fk: Tensor, v: Tensor) -> Tensor:
    """The same in O(T F Dv): phi(q) (sum_j phi(k_j) v_j^T) / (phi(q) . sum_j phi(k_j) + eps)."""
    s = fk.transpose(-2, -1) @ v  # (B, H, F, Dv)
    den = fq @ fk.sum(2).unsqueeze(-1)  # (B, H, T, 1)
    return (fq @ s) / (den + LINEAR_EPS)  # (B, H, T, Dv)


def _exclusive_cumsum(x: Tensor) -> Tensor:
    """Prefix sums over dim 2 that exclude the current entry, shifted rather than subtracted so
    that no later value ever enters an earlier result, not even as rounding.

    Eager: one add per chunk in fp32 (:class:`_ExclusiveSums`; torch's CPU ``cumsum`` over a middle
    axis accumulates in float64, element by element: several times slower).  Exporting: one
    ``CumSum`` node over a symbolic chunk count."""
    if torch.compiler.is_exporting():
        return torch.cat((torch.zeros_like(x[:, :, :1]), torch.cumsum(x[:, :, :-1], dim=2)), dim=2)
    return _ExclusiveSums.apply(x)


def _running_sums(x: Tensor, reverse: bool) -> Tensor:
    """out[i] = sum of x[j] over j < i (reverse: j > i), along dim 2, one vectorised add per entry."""
    n = x.shape[2]
    out = torch.empty_like(x)
    order = range(n - 1, -1, -1) if reverse else range(n)
    prev = None
    for i in order:
        if prev is None:
            out[:, :, i].zero_()
        else:
            torch.add(out[:, :, prev], x[:, :, prev], out=out[:, :, i])
        prev = i
    return out


class _ExclusiveSums(torch.autograd.Function):
    """Exclusive prefix sums over dim 2; the gradient is the exclusive suffix sums of the incoming one."""

    @staticmethod
    def forward(ctx, x: Tensor) -> Tensor:
        return _running_sums(x, reverse=False)

    @staticmethod
    def backward(ctx, g: Tensor) -> Tensor:
        return _running_sums(g, reverse=True)


def causal_linear_chunked(q: Tensor, k: Tensor, v: Tensor, chunk: int = CHUNK, normalize: bool = True) -> Tensor:
    """Causal linear attention in O(T * C * D) using chunks of C tokens, as batched GEMMs.

    Inside a chunk the (C, C) masked product is exact; across chunks a running
    sum of k^T v (the recurrent state) carries the prefix: one GEMM per chunk for its
    increment, a cumulative sum over the chunks, one GEMM per chunk to read it. q and k are
    already feature-mapped. Shapes: q, k (B, H, T, D), v (B, H, T, Dv).  ``normalize=False``:
    the numerator sum_{j<=i} (q_i . k_j) v_j alone.
    """
    out = native.causal_linear(q, k, v, "none", normalize, LINEAR_EPS)  # inference on the CPU, where it applies
    if out is not None:
        return out
    b, h, t, d = q.shape
    dv = v.shape[-1]
    c = chunk
    n = block_count(t, c)
    # Exporting: always pad (by 0..C-1 tokens) so that one traced graph serves every length; zero
    # keys and values after the end are never seen by a real (earlier) query.
    if torch.compiler.is_exporting() or n * c != t:
        q, k, v = (F.pad(x, (0, 0, 0, n * c - t)) for x in (q, k, v))
    m = b * h * n  # every chunk of every row: one batch of GEMMs
    qc, kc, vc = q.reshape(m, c, d), k.reshape(m, c, d), v.reshape(m, c, dv)
    a = torch.bmm(qc, kc.transpose(1, 2)).tril_()  # (M, C, C), causal inside the chunk
    kv = torch.bmm(kc.transpose(1, 2), vc).view(b, h, n, d, dv)  # per-chunk state increments
    # in place (bmm's and sum's backward need not their outputs): inside the chunk + the state before it
    num = torch.bmm(a, vc).baddbmm_(qc, _exclusive_cumsum(kv).view(m, d, dv))  # (M, C, Dv)
    if normalize:
        z = _exclusive_cumsum(kc.view(b, h, n, c, d).sum(-2)).view(m, d, 1)  # (M, D, 1) key sums before the chunk
        den = a.sum(-1, keepdim=True).baddbmm_(qc, z)  # (M, C, 1)
        num = num / den.add_(LINEAR_EPS)
    return num.view(b, h, n * c, dv)[:, :, :t]


def recurrent_step(fq: Tensor, fk: Tensor, v: Tensor, s: Tensor, z: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """One token of causal linear attention from its features fq, fk (B, H, 1, F) and v (B, H, 1, Dv), in fp32:
    s += phi(k) v^T, z += phi(k); out = phi(q) s / (phi(q) . z + eps).  Returns out (B, H, 1, Dv), s, z."""
    s = s + fk.transpose(-2, -1) @ v  # (B, H, F, Dv)
    z = z + fk[:, :, 0]  # (B, H, F)
    den = (fq[:, :, 0] * z).sum(-1)  # (B, H)
    return (fq @ s) / (den[:, :, None, None] + LINEAR_EPS), s, z


class KernelType(AttentionType):
    """A linear-attention type, given its feature map."""

    forms = ("causal", "bidirectional")
    family = "kernel-feature"
    native_feature: str | None = None  # the feature map by name where the compiled kernel applies it itself

    def features(self, q: Tensor, k: Tensor, spec: AttentionSpec, start: int | Tensor = 0) -> tuple[Tensor, Tensor]:
        """(phi(q), phi(k)) for tokens at positions ``start``, ``start + 1``, ... (B, H, T, D) -> (B, H, T, F)."""
        raise NotImplementedError

    def feature_dim(self, spec: AttentionSpec, head_dim: int) -> int:
        """F, the width of phi(k)."""
        return head_dim

    def reference(self, q, k, v, spec, w):
        return kernel_reference(*self.features(q, k, spec), v)

    def forward(self, q, k, v, spec, w):
        if self.native_feature is not None:  # inference on the CPU: the kernel maps q and k block by block
            out = native.causal_linear(q, k, v, self.native_feature, True, LINEAR_EPS)
            if out is not None:
                return out
        # Features and running sums in fp32 whatever the input: prefix sums over thousands of
        # tokens (and exp features) lose too much in bf16 / fp16.
        return causal_linear_chunked(*self.features(q.float(), k.float(), spec), v.float()).to(v.dtype)

    def bidirectional_reference(self, q, k, v, spec, w):
        return bidirectional_kernel_reference(*self.features(q, k, spec), v)

    def bidirectional(self, q, k, v, spec, w):
        return bidirectional_linear(*self.features(q.float(), k.float(), spec), v.float()).to(v.dtype)

    def state(self, spec, heads, head_dim):
        f = self.feature_dim(spec, head_dim)
        return {"s": StateSpec((heads, f, head_dim), fp32=True), "z": StateSpec((heads, f), fp32=True, positive=True)}

    def prefill_state(self, spec, q, k, v, w, capacity) -> State:
        _, fk = self.features(k.float(), k.float(), spec, start=0)  # (B, H, T, F)
        return {"s": fk.transpose(-2, -1) @ v.float(), "z": fk.sum(2)}  # (B, H, F, Dv), (B, H, F)

    def step(self, spec, state, q, k, v, w, pos, length):
        fq, fk = self.features(q.float(), k.float(), spec, start=pos)  # (B, H, 1, F) x2
        y, s, z = recurrent_step(fq, fk, v.float(), state["s"], state["z"])
        return y.to(v.dtype), {"s": s, "z": z}

    def prefill_flops(self, spec, batch, t, heads, head_dim):
        # a (C, C) product inside each chunk and an (F, D) state across chunks, scores and values each
        f = self.feature_dim(spec, head_dim)
        return 2.0 * batch * heads * (2 * t * CHUNK * f + 2 * t * f * head_dim)

    def decode_flops(self, spec, batch, context, heads, head_dim):
        return 4.0 * batch * heads * self.feature_dim(spec, head_dim) * head_dim  # update the state, then read it

    def bidirectional_flops(self, spec, batch, t, heads, head_dim):
        # one (F, D) state over every token (2 T F D), read by every query (2 T F D), and the normaliser (2 T F)
        f = self.feature_dim(spec, head_dim)
        return 2.0 * batch * heads * t * f * (2 * head_dim + 1)


# --------------------------------------------------------------------------- feature maps


def elu_feature_map(x: Tensor) -> Tensor:
    if torch.onnx.is_in_onnx_export() or torch.compiler.is_exporting():
        # the same values as elu(x) + 1 (x + 1 above 0, exp(x) below); ONNX Runtime runs Relu, Min, Exp, Add in about
        # 0.65 of the time of its Elu and Add (12 x 4k x 64, one thread)
        return torch.relu(x) + torch.exp(torch.clamp_max(x, 0.0))
    if torch.is_grad_enabled() and x.requires_grad:
        return F.elu(x) + 1.0
    return F.elu(x).add_(1.0)  # inference: no second buffer


class Linear(KernelType):
    name = "linear"
    doc = "linear attention with the elu(x)+1 feature map, causal via prefix sums"
    native_feature = "elu1"

    def features(self, q, k, spec, start=0):
        return elu_feature_map(q), elu_feature_map(k)


class ReluLinear(KernelType):
    name = "relu-linear"
    doc = "linear attention with the ReLU feature map (EfficientViT), causal via prefix sums"
    native_feature = "relu"

    def features(self, q, k, spec, start=0):
        return F.relu(q), F.relu(k)


linear = register(Linear())
relu_linear = register(ReluLinear())


def cosformer_features(x: Tensor, horizon: int, start: int | Tensor = 0) -> Tensor:
    """[relu(x) cos(a_i), relu(x) sin(a_i)], a_i = pi/2 * i / M for positions i = start, start+1, ...

    Then phi(q_i) . phi(k_j) = relu(q_i) . relu(k_j) cos(pi/2 * (i - j) / M).  (B, H, T, D) -> (B, H, T, 2D).
    ``start`` may be a traced tensor (the decode step's position).
    """
    pos = (start + torch.arange(x.shape[-2], device=x.device)).to(x.dtype)  # (T,)
    angle = (math.pi / 2 / horizon) * pos[:, None]  # (T, 1)
    r = F.relu(x)
    return torch.cat((r * torch.cos(angle), r * torch.sin(angle)), dim=-1)


class CosFormer(KernelType):
    name = "cosformer"
    params = ("M",)
    doc = "cosFormer: ReLU features re-weighted by cos(pi/2 * (i-j)/M), causal via prefix sums"

    def features(self, q, k, spec, start=0):
        m = spec.param("M")
        return cosformer_features(q, m, start), cosformer_features(k, m, start)

    def feature_dim(self, spec, head_dim):
        return 2 * head_dim  # [relu(x) cos, relu(x) sin]

    def forward(self, q, k, v, spec, w):
        """Inference on the CPU: the kernel maps each block's rows itself (no (B, H, T, 2D) feature tensors), from
        the positions' cos and sin as torch computes them."""
        if q.dtype == torch.float32:
            angle = (math.pi / 2 / spec.param("M")) * torch.arange(q.shape[-2], device=q.device).to(q.dtype)
            table = torch.stack((torch.cos(angle), torch.sin(angle)), dim=-1)  # (T, 2)
            out = native.causal_linear(q, k, v, "cosformer", True, LINEAR_EPS, proj=table)
            if out is not None:
                return out
        return super().forward(q, k, v, spec, w)

    def problems(self, spec, max_seq_len, heads):
        if spec.param("M") < max_seq_len:
            return [f"M={spec.param('M')} must be at least max_seq_len {max_seq_len} (the cosine weights turn negative beyond M)"]
        return []

    def position_limit(self, spec):
        return spec.param("M")  # keys more than M back get negative weights

    def reference(self, q, k, v, spec, w):
        return self._from_definition(q, k, v, spec, causal=True)

    def bidirectional_reference(self, q, k, v, spec, w):
        return self._from_definition(q, k, v, spec, causal=False)

    def _from_definition(self, q, k, v, spec, causal: bool):
        # Directly from the definition, not via the cos/sin decomposition the fast path uses.
        i = torch.arange(q.shape[-2], device=q.device, dtype=q.dtype)
        weight = torch.cos((math.pi / 2 / spec.param("M")) * (i[:, None] - i[None, :]))  # (T, T), symmetric
        a = (F.relu(q) @ F.relu(k).transpose(-2, -1)) * weight  # (B, H, T, T)
        if causal:
            a = a * causal_mask(q.shape[-2], q.device)
        return (a @ v) / (a.sum(-1, keepdim=True) + LINEAR_EPS)


cosformer = register(CosFormer())


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
    or a device never changes them): every model and every device uses the same features.

    On a GPU the tensor is made once per (shape, device, dtype) and kept: a CUDA graph capture may not copy from the
    host (an H200 refused performer's every call under ``--runtime cudagraph``), and the features never change.  Traced
    (torch.export, ONNX, torch.compile) it is made afresh, a constant of the trace."""
    device = torch.device(device)
    if device.type == "cuda" and not (torch.compiler.is_compiling() or torch.compiler.is_exporting()):
        return _projection_on(m, d, device, dtype)
    return torch.tensor(_orthogonal_features(m, d), dtype=dtype, device=device)


@lru_cache(maxsize=64)
def _projection_on(m: int, d: int, device: torch.device, dtype: torch.dtype) -> Tensor:
    return torch.tensor(_orthogonal_features(m, d), dtype=dtype, device=device)


def performer_features(x: Tensor, w: Tensor, is_query: bool) -> Tensor:
    """FAVOR+ positive features exp(w x' - |x'|^2 / 2) / sqrt(M), x' = x / D^(1/4).

    A query's features are divided by their maximum (it cancels in the ratio), which cancels its |x'|^2 / 2 too
    (the same for every feature of a row); a key's are not, since any shared stabiliser over keys would leak later
    tokens into earlier outputs.  The scale D^(-1/4) rides on w and 1 / sqrt(M) in the exponent: one product, one
    exp, in place.
    """
    d, m = x.shape[-1], w.shape[0]
    logits = x @ (w.T * d**-0.25)  # (B, H, T, M)
    if is_query:
        shift = logits.detach().amax(-1, keepdim=True)
    else:
        shift = torch.linalg.vector_norm(x, dim=-1, keepdim=True).square() * (0.5 / math.sqrt(d))  # no (x * x) tensor
    return logits.sub_(shift + 0.5 * math.log(m)).exp_()


class Performer(KernelType):
    name = "performer"
    params = ("M",)
    doc = "Performer FAVOR+: M positive orthogonal random features (fixed seed), causal via prefix sums"

    def features(self, q, k, spec, start=0):
        w = performer_projection(spec.param("M"), q.shape[-1], q.device, q.dtype)
        return performer_features(q, w, True), performer_features(k, w, False)

    def forward(self, q, k, v, spec, w):
        """Inference on the CPU: the kernel computes each block's features itself (no (B, H, T, M) feature tensors)."""
        if q.dtype == torch.float32:
            d = q.shape[-1]
            proj = performer_projection(spec.param("M"), d, q.device, q.dtype) * d**-0.25
            out = native.causal_linear(q, k, v, "performer", True, LINEAR_EPS, proj=proj)
            if out is not None:
                return out
        return super().forward(q, k, v, spec, w)

    def feature_dim(self, spec, head_dim):
        return spec.param("M")


performer = register(Performer())
