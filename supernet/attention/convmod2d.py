"""Conv2Former's convolutional modulation over the token grid: ``convmod2d:K`` (Hou et al. 2022).

A K x K depthwise convolution of q over the S x S grid (:mod:`.grid`: centred, zeros outside the grid) gates v:
``out = DWConv_KxK(q) * v``, per channel (heads x head_dim, head by head).  No keys, no rotary positions.  The
paper's A = DWConv(GELU(W1 x)) has a GELU between the projection and the convolution; like the causal
``convmod:K`` (:mod:`.conv`) this one leaves it out: q is the projection, as for every type.

* weight: ``dw`` (H*D, K, K), taps nearest-first on each axis (an elastic ``convmod2d:5`` uses the 5 x 5 centre
  of the ``convmod2d:11`` kernel), initialised near the identity;
* reference and ONNX form: K * K shifted multiply-adds (:func:`.grid.conv2d_reference`); fast path: one
  grouped ``conv2d`` (:func:`.grid.dwconv2d`);
* cost: 2 K^2 FLOPs per channel and token for the convolution, 1 for the gate.
"""

from __future__ import annotations

from .grid import Conv2dType, conv2d_reference, dwconv2d
from .registry import register


class ConvMod2d(Conv2dType):
    name = "convmod2d"
    family = "gating"  # dwconv(q) * v
    doc = "Conv2Former convolutional modulation over a square grid of tokens: a K x K depthwise convolution of q gates v"

    def heads(self, spec, heads):
        return 0, heads

    def rotary_heads(self, spec, heads):
        return 0

    def weights(self, spec, heads, head_dim, max_seq_len=None):
        k = spec.param("K")
        return {"dw": (heads * head_dim, k, k)}

    def bidirectional_reference(self, q, k, v, spec, w):
        return conv2d_reference(q, w["dw"]) * v

    def bidirectional(self, q, k, v, spec, w):
        return dwconv2d(q, w["dw"]) * v

    def bidirectional_onnx(self, q, k, v, spec, w):
        return conv2d_reference(q, w["dw"]) * v

    def bidirectional_flops(self, spec, batch, t, heads, head_dim):
        c = heads * head_dim
        return self.conv2d_flops(batch, t, c, spec.param("K")) + 1.0 * batch * t * c  # the convolution, the gate


convmod2d = register(ConvMod2d())
