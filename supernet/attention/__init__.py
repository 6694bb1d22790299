"""Attention types: the token-mixing function of a layer, one registry for all of them.

Every type takes the layer's projected queries ``(B, H, T, D)``, keys and values
``(B, Hkv, T, D)`` and returns the mixed values ``(B, H, T, D)``.  The Q/K/V/O projections
(and rotary positions) are shared by all types and live in the model; only this function
differs from type to type.  See :mod:`.registry` for what a type registers (fast path per
device, reference, ONNX form, pattern).  The families, one file each:

* :mod:`.softmax`: ``softmax``, ``gqa:G`` (SDPA);
* :mod:`.sparse`: ``local:W``, ``dilated:W:D``, ``strided:S``, ``fixed:S``, ``longformer:W:G``,
  ``bigbird:W:G:R`` (patterns in :mod:`.patterns`; CPU block engine :mod:`.blocks`; CUDA
  FlexAttention :mod:`.flex`);
* :mod:`.linear`: ``linear``, ``relu-linear``, ``cosformer:M``, ``performer:M`` (chunked prefix sums).

To add a type: add its signature to :data:`search_spaces.attention.SIGNATURES`, then
register its functions with :func:`register` in the family's file.
"""

from . import linear, softmax, sparse  # noqa: F401  (importing registers the types)
from .linear import causal_linear_chunked, elu_feature_map
from .patterns import causal_mask, window_mask
from .registry import REGISTRY, AttentionType, MixFn, attend, attend_reference, attended_pairs, check_registry, get, register

__all__ = [
    "REGISTRY",
    "AttentionType",
    "MixFn",
    "attend",
    "attend_reference",
    "attended_pairs",
    "causal_linear_chunked",
    "causal_mask",
    "check_registry",
    "elu_feature_map",
    "get",
    "register",
    "window_mask",
]
