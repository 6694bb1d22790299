"""EfficientViT's multi-scale linear attention over the token grid: ``msla2d:K`` (Cai et al. 2023).

ReLU linear attention of q, k, v over every token, plus ReLU linear attention of their aggregates: q, k, v each
through a K x K depthwise convolution over the S x S grid (:mod:`.grid`: centred, zeros outside), the paper's
multi-scale token aggregation (its 5 x 5 depthwise convolution; the 1 x 1 grouped one after it is left to the
projections, as in the 1D ``msla:K`` of :mod:`.conv`, whose bidirectional form is this with a 1D convolution).
The two attentions are each normalised on their own and summed (the paper concatenates the scales' heads
before its output projection; summed, one output projection serves both, as in ``msla:K``).

* weights: ``dw_q``, ``dw_k``, ``dw_v`` (H*D, K, K), taps nearest-first on each axis (elastic in K);
* reference: the convolutions as K * K shifted multiply-adds and each attention written out over the
  (T, T) products; fast path: grouped ``conv2d`` and the (D, D) state k^T v first, O(T D^2), in fp32;
* ONNX form: the shifted multiply-adds and the state form (no grouped Conv: the head count stays symbolic);
* cost: two bidirectional relu-linear attentions and three K x K depthwise convolutions.
"""

from __future__ import annotations

import torch.nn.functional as F

from .grid import Conv2dType, conv2d_reference, dwconv2d
from .linear import bidirectional_kernel_reference, bidirectional_linear
from .registry import register


def _relu_linear(q, k, v):
    return bidirectional_linear(F.relu(q.float()), F.relu(k.float()), v.float())


class MultiScaleLinear2d(Conv2dType):
    name = "msla2d"
    family = "kernel-feature"  # ReLU features of q, k and of their convolutions
    doc = (
        "EfficientViT multi-scale linear attention over a square grid of tokens: ReLU linear attention of q, k, v "
        "plus of their K x K depthwise convolutions"
    )

    def weights(self, spec, heads, head_dim, max_seq_len=None):
        k = spec.param("K")
        shape = (heads * head_dim, k, k)
        return {"dw_q": shape, "dw_k": shape, "dw_v": shape}

    def bidirectional_reference(self, q, k, v, spec, w):
        cq, ck, cv = (conv2d_reference(x, w[f"dw_{n}"]) for x, n in ((q, "q"), (k, "k"), (v, "v")))
        ref = bidirectional_kernel_reference
        return ref(F.relu(q), F.relu(k), v) + ref(F.relu(cq), F.relu(ck), cv)

    def _mix(self, q, k, v, w, conv):
        cq, ck, cv = (conv(x, w[f"dw_{n}"]) for x, n in ((q, "q"), (k, "k"), (v, "v")))
        return (_relu_linear(q, k, v) + _relu_linear(cq, ck, cv)).to(v.dtype)

    def bidirectional(self, q, k, v, spec, w):
        return self._mix(q, k, v, w, dwconv2d)

    def bidirectional_onnx(self, q, k, v, spec, w):
        return self._mix(q, k, v, w, conv2d_reference)

    def bidirectional_flops(self, spec, batch, t, heads, head_dim):
        linear = 2.0 * batch * heads * t * head_dim * (2 * head_dim + 1)  # one bidirectional relu-linear
        return 2 * linear + 3 * self.conv2d_flops(batch, t, heads * head_dim, spec.param("K"))


msla2d = register(MultiScaleLinear2d())
