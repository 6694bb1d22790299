"""Full causal softmax attention, and grouped-query attention (``gqa:G``); both also bidirectional.

Both run ``scaled_dot_product_attention`` on every device (CPU flash kernel; CUDA Flash /
memory-efficient kernels); SDPA exports to one opset-23 ``Attention`` node (for gqa with
fewer key/value heads than queries, the op's native grouped-query form).  Decoding keeps a
growing key/value cache (gqa only its key/value heads).  The bidirectional form (an encoder) is
the same SDPA without the causal mask (an ``Attention`` node without the causal flag).
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor

from search_spaces.attention import AttentionSpec

from .patterns import PatternType, causal, grouped
from .registry import register


class Softmax(PatternType):
    name = "softmax"
    doc = "full causal softmax attention"
    forms = ("causal", "bidirectional")
    memory = True  # every key held is seen: a cache trimmed to the previous segment's last keys is Transformer-XL's memory

    def pattern(self, i, j, spec):
        return causal(i, j)

    def row_mask(self, spec, pos, j):
        return None  # the cache holds exactly the past: every key is seen

    def forward(self, q: Tensor, k: Tensor, v: Tensor, spec: AttentionSpec, w) -> Tensor:
        # Head counts are static (never the traced length); the ONNX exporter refuses enable_gqa with equal counts.
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=grouped(q, k))

    forward_onnx = forward
    forward_cuda = forward

    def bidirectional_pattern(self, i, j, spec):
        return (i >= 0) & (j >= 0)  # every key

    def bidirectional(self, q: Tensor, k: Tensor, v: Tensor, spec: AttentionSpec, w) -> Tensor:
        return F.scaled_dot_product_attention(q, k, v, is_causal=False, enable_gqa=grouped(q, k))

    bidirectional_onnx = bidirectional  # one Attention node without a mask or the causal flag


class GroupedQuery(Softmax):
    """Elastic like the rest: a gqa layer uses the leading ``kv_heads * head_dim`` rows of K and V."""

    name = "gqa"
    params = ("G",)
    doc = "causal softmax attention with G shared key/value heads (grouped-query attention)"

    def heads(self, spec, heads):
        g = min(spec.param("G"), heads)
        return g, g

    def problems(self, spec, max_seq_len, heads):
        bad = [h for h in heads if h % self.heads(spec, h)[0]]
        if bad:
            return [
                f"{spec}: heads choice(s) {', '.join(map(str, bad))} are not a multiple of min(G, heads); "
                f"every heads choice must be divisible by min({spec.param('G')}, heads)"
            ]
        return []


softmax = register(Softmax())
gqa = register(GroupedQuery())
