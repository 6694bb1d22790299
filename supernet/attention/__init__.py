"""Attention types: the token-mixing function of a layer, one object per type, one registry.

A type (:class:`~.base.AttentionType`) is everything about it in one place: spelling and
parameters, shape (key/value heads, rotary heads, its own weights), reference and fast paths,
decoding state and step, cost.  The block around it (projections, rotary positions, MLP) is
one function, :func:`supernet.model.block`.  The families, one file each:

* :mod:`.softmax`: ``softmax``, ``gqa:G`` (SDPA); base :mod:`.patterns` (softmax under a pattern);
* :mod:`.sparse`: ``local:W``, ``dilated:W:D``, ``strided:S``, ``fixed:S``, ``longformer:W:G``,
  ``bigbird:W:G:R`` (CPU block engine :mod:`.blocks`; CUDA FlexAttention :mod:`.flex`);
* :mod:`.linear`: ``linear``, ``relu-linear``, ``cosformer:M``, ``performer:M`` (chunked prefix sums);
* :mod:`.normalized`: ``hydra``, ``sima`` (softmax-free, normalised queries and keys);
* :mod:`.conv`: ``lsra:K``, ``msla:K``, ``convmod:K`` (causal depthwise convolutions);
* :mod:`.encoder`: ``linformer:K``, ``additive``, ``xca`` (encoder-only: bidirectional, no causal form);
* over a square grid of image tokens (:mod:`.grid`; encoder-only): :mod:`.swin` (``swin:W``, ``swin-shift:W``),
  :mod:`.axial` (``axial``), :mod:`.convmod2d` (``convmod2d:K``), :mod:`.msla2d` (``msla2d:K``).

To add a type: subclass :class:`~.base.AttentionType` (or a family's base) in one file and
``register(MyType())``; the space layer, models, decoding, latency features and ONNX graphs
then know it.
"""

from . import softmax, sparse, linear, normalized, conv, encoder  # noqa: F401, I001  (importing registers the types, in this order)
from . import swin, axial, convmod2d, msla2d  # noqa: F401, I001  (the 2D types, issue 40)
from .base import AttentionType, State, StateSpec, Weights, state_bytes
from .patterns import PatternType, causal_mask
from .registry import REGISTRY, attend, attend_reference, exporting, get, kv_heads, register, unregister

__all__ = [
    "REGISTRY",
    "AttentionType",
    "PatternType",
    "State",
    "StateSpec",
    "Weights",
    "attend",
    "attend_reference",
    "causal_mask",
    "exporting",
    "get",
    "kv_heads",
    "register",
    "state_bytes",
    "unregister",
]
