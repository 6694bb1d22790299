"""Token mixers built on a causal depthwise convolution of kernel K: ``lsra:K``, ``msla:K``, ``convmod:K``.

The convolution mixes each channel over the current token and the K-1 before it:
``y_t[c] = sum_{s<K} w[c, s] x_{t-s}[c]`` with a weight ``(channels, K)`` whose tap 0 is the current
token (so the leading taps are the nearest: elastic kernels slice them, as Once-for-All does).
Channels are heads x head_dim, head by head.  The CPU path is one grouped ``conv1d``; the ONNX form
is K shifted multiply-adds (its channel count stays symbolic); decoding keeps the last K-1 inputs.

* ``lsra:K`` (Lite Transformer's long-short range attention): the first ceil(H/2) heads attend
  (causal softmax), the other heads run GLU(v, q) = v * sigmoid(q) through the convolution.  Keys
  only for the attention heads; rotary positions only there.
* ``msla:K`` (EfficientViT's multi-scale linear attention): ReLU linear attention of q, k, v plus
  ReLU linear attention of their convolved (aggregated) q, k, v, each normalised on its own.
* ``convmod:K`` (Conv2Former's convolutional modulation, causal): the convolution of q gates v;
  no keys, no rotary positions.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from . import cache, native
from .base import INIT_STD, AttentionType, StateSpec
from .linear import (
    CHUNK,
    LINEAR_EPS,
    bidirectional_kernel_reference,
    bidirectional_linear,
    causal_linear_chunked,
    kernel_reference,
    recurrent_step,
)
from .patterns import attend_one, causal_mask, masked_softmax_reference
from .registry import exporting, register


# --------------------------------------------------------------------------- the convolution


def _channels(x: Tensor) -> Tensor:
    """(B, H, T, D) -> (B, H*D, T)."""
    b, h, t, d = x.shape
    return x.permute(0, 1, 3, 2).reshape(b, h * d, t)


def _heads(y: Tensor, h: int) -> Tensor:
    """(B, H*D, T) -> (B, H, T, D)."""
    b, c, t = y.shape
    return y.view(b, h, c // h, t).permute(0, 1, 3, 2)


def conv_reference(x: Tensor, w: Tensor) -> Tensor:
    """Causal depthwise convolution written as K shifted multiply-adds: x (B, H, T, D), w (H*D, K) -> (B, H, T, D).

    Also the traced (ONNX) form: no grouped Conv whose group count would have to be static."""
    b, h, t, d = x.shape
    taps = w.view(h, d, -1).transpose(1, 2)[None, :, :, None, :]  # (1, H, K, 1, D)
    out = x * taps[:, :, 0]
    for s in range(1, w.shape[1]):
        shifted = F.pad(x, (0, 0, s, 0))[:, :, :t]  # x_{t-s}, zeros before the start
        out = out + shifted * taps[:, :, s]
    return out


def causal_dwconv(x: Tensor, w: Tensor) -> Tensor:
    """The CPU / CUDA path of :func:`conv_reference`: one grouped conv1d (taps flipped: conv1d correlates)."""
    if exporting():
        return conv_reference(x, w)
    k = w.shape[1]
    y = native.depthwise_conv(x, w, [-s for s in range(k)])  # inference on the CPU: in x's layout, no transposes
    if y is not None:
        return y
    y = F.conv1d(F.pad(_channels(x), (k - 1, 0)), w.flip(1)[:, None, :], groups=w.shape[0])  # (B, H*D, T)
    return _heads(y, x.shape[1])


def centred_offset(s: int) -> int:
    """The token offset of tap ``s`` of a centred kernel, nearest first: 0, -1, +1, -2, +2, ... (so an
    elastic kernel's leading taps are still the nearest ones; an even K reaches one more token back)."""
    return -((s + 1) // 2) if s % 2 else s // 2


def centred_conv_reference(x: Tensor, w: Tensor) -> Tensor:
    """Centred depthwise convolution as K shifted multiply-adds: y_t = sum_s w[:, s] x_{t + offset(s)}, zeros
    outside the sequence.  x (B, H, T, D), w (H*D, K) -> (B, H, T, D); also the traced (ONNX) form."""
    b, h, t, d = x.shape
    taps = w.view(h, d, -1).transpose(1, 2)[None, :, :, None, :]  # (1, H, K, 1, D)
    out = x * taps[:, :, 0]
    for s in range(1, w.shape[1]):
        o = centred_offset(s)
        ahead = max(o, 0)
        shifted = F.pad(x, (0, 0, max(-o, 0), ahead))[:, :, ahead : ahead + t]  # x_{t+o}
        out = out + shifted * taps[:, :, s]
    return out


def centred_dwconv(x: Tensor, w: Tensor) -> Tensor:
    """The CPU / CUDA path of :func:`centred_conv_reference`: the taps reordered by offset, one grouped conv1d."""
    if exporting():
        return centred_conv_reference(x, w)
    k = w.shape[1]
    y = native.depthwise_conv(x, w, [centred_offset(s) for s in range(k)])
    if y is not None:
        return y
    before = -min(centred_offset(s) for s in range(k))
    by_offset = sorted(range(k), key=centred_offset)  # tap of offset -before, ..., +after
    y = F.conv1d(F.pad(_channels(x), (before, k - 1 - before)), w[:, by_offset][:, None, :], groups=w.shape[0])
    return _heads(y, x.shape[1])  # (B, H, T, D)


def conv_step(window: Tensor, x: Tensor, w: Tensor) -> tuple[Tensor, Tensor]:
    """One token: window (B, H, K-1, D) of the last inputs (oldest first), x (B, H, 1, D) -> (y (B, H, 1, D), next window)."""
    full = torch.cat((window, x), dim=2)  # (B, H, K, D): positions t-K+1 .. t
    h, d = x.shape[1], x.shape[3]
    taps = w.view(h, d, -1).flip(2).transpose(1, 2)[None]  # (1, H, K, D): oldest first, like the window
    return (full * taps).sum(2, keepdim=True), full[:, :, 1:]


def init_conv(weight: Tensor, generator: torch.Generator | None) -> None:
    """Start near the identity (tap 0 = 1) with small noise, so a fresh layer passes its input through."""
    torch.nn.init.normal_(weight, 0.0, INIT_STD, generator=generator)
    weight[:, 0] += 1.0


class ConvType(AttentionType):
    """Shared by the three: K >= 2 (a one-tap convolution is a per-channel scale), K <= max_seq_len."""

    params = ("K",)

    def problems(self, spec, max_seq_len, heads):
        k = spec.param("K")
        if k < 2:
            return [f"{spec}: K must be at least 2 (one tap is a per-channel scale, not a convolution)"]
        return [f"K={k} exceeds max_seq_len {max_seq_len}"] if k > max_seq_len else []

    def init_weight(self, name, weight, generator):
        init_conv(weight, generator)

    @staticmethod
    def conv_flops(batch: int, tokens: int, channels: int, k: int) -> float:
        return 2.0 * batch * tokens * channels * k


# --------------------------------------------------------------------------- convmod:K


class ConvMod(ConvType):
    name = "convmod"
    family = "gating"  # dwconv(q) * v
    doc = "Conv2Former convolutional modulation, causal: a depthwise convolution of kernel K over q gates v (no keys)"

    def heads(self, spec, heads):
        return 0, heads

    def rotary_heads(self, spec, heads):
        return 0

    def weights(self, spec, heads, head_dim, max_seq_len=None):
        return {"dw": (heads * head_dim, spec.param("K"))}

    def reference(self, q, k, v, spec, w):
        return conv_reference(q, w["dw"]) * v

    def forward(self, q, k, v, spec, w):
        return causal_dwconv(q, w["dw"]) * v

    def state(self, spec, heads, head_dim):
        return {"q": StateSpec((heads, spec.param("K") - 1, head_dim))}

    def prefill_state(self, spec, q, k, v, w, capacity):
        return {"q": cache.last(q, spec.param("K") - 1)}

    def step(self, spec, state, q, k, v, w, pos, length):
        a, window = conv_step(state["q"], q, w["dw"])
        return a * v, {"q": window}

    def prefill_flops(self, spec, batch, t, heads, head_dim):
        return self.conv_flops(batch, t, heads * head_dim, spec.param("K")) + batch * t * heads * head_dim  # conv, gate

    def decode_flops(self, spec, batch, context, heads, head_dim):
        return self.prefill_flops(spec, batch, 1, heads, head_dim)


# --------------------------------------------------------------------------- lsra:K


def _split(heads: int) -> tuple[int, int]:
    """(attention heads, convolution heads) of an lsra layer: ceil(H/2) attend."""
    a = -(-heads // 2)
    return a, heads - a


class LongShortRange(ConvType):
    name = "lsra"
    family = "gating"  # ceil(H/2) heads dot products, the rest GLU(v, q): grouped with the gates
    doc = (
        "Lite Transformer long-short range: ceil(H/2) heads causal softmax, the rest GLU(v, q) "
        "through a causal depthwise convolution of kernel K"
    )
    fused_onnx = True  # the attention heads: one Attention node

    def heads(self, spec, heads):
        return _split(heads)[0], heads

    def rotary_heads(self, spec, heads):
        return _split(heads)[0]

    def weights(self, spec, heads, head_dim, max_seq_len=None):
        conv = _split(heads)[1]
        return {"dw": (conv * head_dim, spec.param("K"))} if conv else {}

    def _mix(self, q, k, v, spec, w, attend, conv):
        a = k.shape[1]
        y = attend(q[:, :a], k, v[:, :a])  # (B, A, T, D)
        if a == q.shape[1]:
            return y
        u = v[:, a:] * torch.sigmoid(q[:, a:])  # GLU
        return torch.cat((y, conv(u, w["dw"])), dim=1)  # (B, H, T, D)

    def reference(self, q, k, v, spec, w):
        def attend(q_, k_, v_):
            return masked_softmax_reference(q_, k_, v_, causal_mask(q.shape[2], q.device))

        return self._mix(q, k, v, spec, w, attend, conv_reference)

    def forward(self, q, k, v, spec, w):
        return self._mix(
            q, k, v, spec, w, lambda q_, k_, v_: F.scaled_dot_product_attention(q_, k_, v_, is_causal=True), causal_dwconv
        )

    def state(self, spec, heads, head_dim):
        a, c = _split(heads)
        out = {"k": StateSpec((a, "past", head_dim)), "v": StateSpec((a, "past", head_dim))}
        if c:
            out["u"] = StateSpec((c, spec.param("K") - 1, head_dim))
        return out

    def prefill_state(self, spec, q, k, v, w, capacity):
        a = k.shape[1]
        out = {"k": cache.grown(k, capacity), "v": cache.grown(v[:, :a], capacity)}
        if a < q.shape[1]:
            out["u"] = cache.last(v[:, a:] * torch.sigmoid(q[:, a:]), spec.param("K") - 1)
        return out

    def step(self, spec, state, q, k, v, w, pos, length):
        a = k.shape[1]
        keys, new_k = cache.append(state["k"], k, length)
        values, new_v = cache.append(state["v"], v[:, :a], length)
        y = attend_one(q[:, :a], keys, values, None)
        new = {"k": new_k, "v": new_v}
        if a == q.shape[1]:
            return y, new
        c, new["u"] = conv_step(state["u"], v[:, a:] * torch.sigmoid(q[:, a:]), w["dw"])
        return torch.cat((y, c), dim=1), new

    def prefill_flops(self, spec, batch, t, heads, head_dim):
        a, c = _split(heads)
        attention = 4.0 * batch * a * (t * (t + 1) // 2) * head_dim  # causal softmax: scores and weighted sum
        return attention + self.conv_flops(batch, t, c * head_dim, spec.param("K")) + 2.0 * batch * t * c * head_dim  # + GLU

    def decode_flops(self, spec, batch, context, heads, head_dim):
        a, c = _split(heads)
        return (
            4.0 * batch * a * (context + 1) * head_dim
            + self.conv_flops(batch, 1, c * head_dim, spec.param("K"))
            + 2.0 * batch * c * head_dim
        )


# --------------------------------------------------------------------------- msla:K


def _relu_linear(q: Tensor, k: Tensor, v: Tensor, plus: Tensor | None = None) -> Tensor:
    """ReLU linear attention of q, k, v (+ ``plus``, into which the compiled kernel adds at inference)."""
    out = native.causal_linear(q, k, v, "relu", True, LINEAR_EPS, into=plus)
    if out is not None:
        return out
    out = causal_linear_chunked(F.relu(q.float()), F.relu(k.float()), v.float()).to(v.dtype)
    return out if plus is None else plus + out


class MultiScaleLinear(ConvType):
    """Bidirectional form: the convolutions centred (:func:`centred_dwconv`, the same kernel weights) and
    both linear attentions over every token (no prefix sums)."""

    name = "msla"
    family = "kernel-feature"  # ReLU features of q, k and of their convolutions
    doc = (
        "EfficientViT multi-scale linear attention: ReLU linear attention of q, k, v plus of their "
        "causal depthwise convolutions (kernel K)"
    )
    forms = ("causal", "bidirectional")

    def weights(self, spec, heads, head_dim, max_seq_len=None):
        shape = (heads * head_dim, spec.param("K"))
        return {"dw_q": shape, "dw_k": shape, "dw_v": shape}

    def reference(self, q, k, v, spec, w):
        cq, ck, cv = (conv_reference(x, w[f"dw_{n}"]) for x, n in ((q, "q"), (k, "k"), (v, "v")))
        return kernel_reference(F.relu(q), F.relu(k), v) + kernel_reference(F.relu(cq), F.relu(ck), cv)

    def forward(self, q, k, v, spec, w):
        cq, ck, cv = (causal_dwconv(x, w[f"dw_{n}"]) for x, n in ((q, "q"), (k, "k"), (v, "v")))
        return _relu_linear(cq, ck, cv, plus=_relu_linear(q, k, v))

    def state(self, spec, heads, head_dim):
        lin = {
            "s": StateSpec((heads, head_dim, head_dim), fp32=True),
            "z": StateSpec((heads, head_dim), fp32=True, positive=True),
        }
        window = StateSpec((heads, spec.param("K") - 1, head_dim))
        return {**lin, **{f"{n}2": s for n, s in lin.items()}, "wq": window, "wk": window, "wv": window}

    def prefill_state(self, spec, q, k, v, w, capacity):
        cq, ck, cv = (causal_dwconv(x, w[f"dw_{n}"]) for x, n in ((q, "q"), (k, "k"), (v, "v")))
        out = {}
        for suffix, (k_, v_) in (("", (k, v)), ("2", (ck, cv))):
            fk = F.relu(k_.float())
            out[f"s{suffix}"], out[f"z{suffix}"] = fk.transpose(-2, -1) @ v_.float(), fk.sum(2)
        n = spec.param("K") - 1
        return {**out, "wq": cache.last(q, n), "wk": cache.last(k, n), "wv": cache.last(v, n)}

    def step(self, spec, state, q, k, v, w, pos, length):
        (cq, wq), (ck, wk), (cv, wv) = (conv_step(state[f"w{n}"], x, w[f"dw_{n}"]) for x, n in ((q, "q"), (k, "k"), (v, "v")))
        y1, s, z = recurrent_step(F.relu(q.float()), F.relu(k.float()), v.float(), state["s"], state["z"])
        y2, s2, z2 = recurrent_step(F.relu(cq.float()), F.relu(ck.float()), cv.float(), state["s2"], state["z2"])
        return (y1 + y2).to(v.dtype), {"s": s, "z": z, "s2": s2, "z2": z2, "wq": wq, "wk": wk, "wv": wv}

    def prefill_flops(self, spec, batch, t, heads, head_dim):
        linear = 2.0 * batch * heads * (2 * t * CHUNK * head_dim + 2 * t * head_dim * head_dim)  # one chunked relu-linear
        return 2 * linear + 3 * self.conv_flops(batch, t, heads * head_dim, spec.param("K"))

    def decode_flops(self, spec, batch, context, heads, head_dim):
        return 2 * 4.0 * batch * heads * head_dim * head_dim + 3 * self.conv_flops(batch, 1, heads * head_dim, spec.param("K"))

    def bidirectional_reference(self, q, k, v, spec, w):
        cq, ck, cv = (centred_conv_reference(x, w[f"dw_{n}"]) for x, n in ((q, "q"), (k, "k"), (v, "v")))
        ref = bidirectional_kernel_reference
        return ref(F.relu(q), F.relu(k), v) + ref(F.relu(cq), F.relu(ck), cv)

    def bidirectional(self, q, k, v, spec, w):
        cq, ck, cv = (centred_dwconv(x, w[f"dw_{n}"]) for x, n in ((q, "q"), (k, "k"), (v, "v")))
        one = lambda q_, k_, v_: bidirectional_linear(F.relu(q_.float()), F.relu(k_.float()), v_.float())  # noqa: E731
        return (one(q, k, v) + one(cq, ck, cv)).to(v.dtype)

    def bidirectional_flops(self, spec, batch, t, heads, head_dim):
        linear = 2.0 * batch * heads * t * head_dim * (2 * head_dim + 1)  # one bidirectional relu-linear
        return 2 * linear + 3 * self.conv_flops(batch, t, heads * head_dim, spec.param("K"))


convmod = register(ConvMod())
lsra = register(LongShortRange())
msla = register(MultiScaleLinear())
