"""Full causal softmax attention, and grouped-query attention (``gqa:G``).

Both run ``scaled_dot_product_attention`` on every device (CPU flash kernel; CUDA Flash /
memory-efficient kernels); SDPA exports to one opset-23 ``Attention`` node (for gqa with
``kv_num_heads`` < ``q_num_heads``, the op's native grouped-query form).
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor

from search_spaces.attention import AttentionSpec

from . import patterns
from .registry import register


def _softmax_reference(q: Tensor, k: Tensor, v: Tensor, spec: AttentionSpec) -> Tensor:
    return patterns.masked_softmax_reference(q, k, v, patterns.causal_mask(q.shape[-2], q.device))


@register("softmax", reference=_softmax_reference, pattern=patterns.causal)
def softmax_attention(q: Tensor, k: Tensor, v: Tensor, spec: AttentionSpec) -> Tensor:
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def repeat_kv(x: Tensor, heads: int) -> Tensor:
    """(B, G, T, D) -> (B, H, T, D): query head h reads key/value head h // (H / G)."""
    return x.repeat_interleave(heads // x.shape[1], dim=1)


def _gqa_reference(q: Tensor, k: Tensor, v: Tensor, spec: AttentionSpec) -> Tensor:
    h = q.shape[1]
    return _softmax_reference(q, repeat_kv(k, h), repeat_kv(v, h), spec)


@register("gqa", reference=_gqa_reference, pattern=patterns.causal)
def gqa_attention(q: Tensor, k: Tensor, v: Tensor, spec: AttentionSpec) -> Tensor:
    """q (B, H, T, D); k, v (B, G, T, D) with G dividing H."""
    assert q.shape[1] % k.shape[1] == 0, (q.shape, k.shape)
    # Head counts are static (never the traced length); the ONNX exporter refuses enable_gqa with equal counts.
    return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=bool(k.shape[1] != q.shape[1]))
