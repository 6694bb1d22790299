"""The one registry of attention types, and the dispatch from a layer's type to a path.

An attention type mixes the layer's projected queries ``(B, H, T, D)`` with its keys and
values ``(B, Hkv, T, D)`` (``Hkv == H`` except for ``gqa``) into ``(B, H, T, D)``.  Each
registered type has

* ``fast``: what the models run on CPU (and on any device without its own entry);
* ``reference``: a plain, obviously-correct version the tests compare every path against;
* ``cuda``: the CUDA path where it differs from ``fast`` (FlexAttention for sparse patterns);
* ``onnx``: what the ONNX exporter traces where it differs from ``fast`` (one masked
  ``scaled_dot_product_attention``, which becomes a single opset-23 ``Attention`` node);
* ``pattern``: for the sparse types, ``pattern(i, j, spec) -> bool``, which keys ``j`` query
  ``i`` sees, written on broadcastable index tensors (the dense mask, a FlexAttention
  ``mask_mod``, and a future decode step all come from it).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Callable

import torch
from torch import Tensor

from search_spaces.attention import SIGNATURES, AttentionSpec, parse_attention

MixFn = Callable[[Tensor, Tensor, Tensor, AttentionSpec], Tensor]
PatternFn = Callable[[Tensor, Tensor, AttentionSpec], Tensor]


@dataclass(frozen=True)
class AttentionType:
    kind: str
    fast: MixFn
    reference: MixFn
    doc: str
    cuda: MixFn | None = None
    onnx: MixFn | None = None
    pattern: PatternFn | None = None

    def path(self, device_type: str, exporting: bool = False) -> MixFn:
        """The function that runs on ``device_type`` ('cpu', 'cuda', ...), or under ONNX export."""
        if exporting:
            return self.onnx or self.fast
        if device_type == "cuda" and self.cuda is not None:
            return self.cuda
        return self.fast


REGISTRY: dict[str, AttentionType] = {}


def register(
    kind: str,
    *,
    reference: MixFn,
    cuda: MixFn | None = None,
    onnx: MixFn | None = None,
    pattern: PatternFn | None = None,
) -> Callable[[MixFn], MixFn]:
    """Decorator: register ``fast`` (the decorated function) and its other paths for ``kind``."""
    if kind not in SIGNATURES:
        raise KeyError(f"attention type {kind!r} has no signature in search_spaces.attention.SIGNATURES")

    def wrap(fast: MixFn) -> MixFn:
        REGISTRY[kind] = AttentionType(kind, fast, reference, SIGNATURES[kind][1], cuda, onnx, pattern)
        return fast

    return wrap


def get(spec: AttentionSpec | str) -> AttentionType:
    if isinstance(spec, str):
        spec = parse_attention(spec)
    return REGISTRY[spec.kind]


def attend(q: Tensor, k: Tensor, v: Tensor, spec: AttentionSpec) -> Tensor:
    """Mix ``v`` by the layer's attention type on the fast path of ``q``'s device. ``(B, H, T, D)``."""
    exporting = torch.onnx.is_in_onnx_export() or torch.compiler.is_exporting()  # ONNX or torch.export: the traceable path
    return REGISTRY[spec.kind].path(q.device.type, exporting)(q, k, v, spec)


def attend_reference(q: Tensor, k: Tensor, v: Tensor, spec: AttentionSpec) -> Tensor:
    return REGISTRY[spec.kind].reference(q, k, v, spec)


def check_registry() -> None:
    """Every signature has an implementation (and nothing else is registered)."""
    missing = set(SIGNATURES) - set(REGISTRY)
    extra = set(REGISTRY) - set(SIGNATURES)
    assert not missing and not extra, f"attention registry out of sync: missing {missing}, extra {extra}"


@lru_cache(maxsize=1024)
def attended_pairs(attention: str, t: int) -> int:
    """How many (query, key) pairs a layer of this type scores at sequence length ``t``.

    The non-zeros of the type's pattern (``t (t + 1) / 2`` for causal softmax, about ``t W`` for
    ``local:W``, ...); 0 for the linear family, which carries a state instead of scoring pairs.
    Cost models (FLOPs, latency features, the search's analytic proxy) all read it from here.
    """
    spec = parse_attention(attention)
    typ = REGISTRY[spec.kind]
    if typ.pattern is None:
        return 0
    j = torch.arange(t)
    rows = max(1, 2**22 // t)  # count in row chunks: never a (t, t) tensor, even at 16k tokens
    return sum(int(typ.pattern(j[s : s + rows, None], j[None, :], spec).sum()) for s in range(0, t, rows))
