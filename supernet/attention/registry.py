"""The one registry of attention types, and the dispatch from a layer's type to a path.

``register(SomeType())`` puts a type object (:class:`~.base.AttentionType`) here and declares its
spelling to the space layer (:func:`search_spaces.attention.declare`); everything else looks a
type up with :func:`get`.
"""

from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar
from typing import Callable, Iterator, TypeVar

import torch
from torch import Tensor

from search_spaces.attention import TYPES, AttentionSpec, declare, parse_attention, withdraw

from .base import FAMILIES, AttentionType, Weights

REGISTRY = TYPES._items  # noqa: SLF001  (the type objects by name: the one registry, read without loading plugins)
# What an export traces in place of a type's own form, where it gives one (not None): set for the length of a block by
# export_form() (supernet.attention.ort_ops.emitting, an export with --custom-ops), so that the registry does not
# import it and no module-level switch outlives the block.
_EXPORT_FORM: ContextVar[Callable | None] = ContextVar("attention_export_form", default=None)
T = TypeVar("T", bound=AttentionType)


def register(typ: T) -> T:
    """Register a type object (and declare its spelling to the space layer); returns it."""
    assert typ.name and typ.doc, f"{type(typ).__name__}: a type needs a name and one line of doc"
    assert typ.family in FAMILIES, f"{typ.name}: family {typ.family!r} is not one of {FAMILIES}"
    declare(typ)
    return typ


def unregister(name: str) -> None:
    """Remove a type (tests that define one of their own)."""
    withdraw(name)


def get(spec: AttentionSpec | str) -> AttentionType:
    """The type object of a spelling or spec."""
    if isinstance(spec, str):
        spec = parse_attention(spec)
    return REGISTRY[spec.kind]


# Set while this project's own torch.compile'd code runs (latency's compile runtime, train-supernet --compile): torch
# 2.11 says is_exporting() is True under torch.compile too (an H200, 2026-11-27), which sent compiled runs down the
# traceable export forms instead of the fast paths.
_FAST_PATHS: ContextVar[bool] = ContextVar("attention_fast_paths", default=False)


@contextmanager
def fast_paths() -> Iterator[None]:
    """Run ``torch.compile``d model code inside this: the types take their fast paths, not the export forms."""
    token = _FAST_PATHS.set(True)
    try:
        yield
    finally:
        _FAST_PATHS.reset(token)


@contextmanager
def export_form(form: Callable) -> Iterator[None]:
    """Inside this block an export traces ``form(q, k, v, spec, w, causal)`` in place of a type's own export form where
    it returns a tensor (None: the type's standard graph)."""
    token = _EXPORT_FORM.set(form)
    try:
        yield
    finally:
        _EXPORT_FORM.reset(token)


def exporting() -> bool:
    """Under ``torch.onnx.export`` or ``torch.export``: the traceable path (not under :func:`fast_paths`)."""
    if torch.onnx.is_in_onnx_export():
        return True
    return torch.compiler.is_exporting() and not _FAST_PATHS.get()


def attend(q: Tensor, k: Tensor | None, v: Tensor, spec: AttentionSpec, w: Weights | None = None, causal: bool = True) -> Tensor:
    """Mix ``v`` by the layer's attention type on the fast path of ``q``'s device. ``(B, H, T, D)``.

    ``causal=False``: the type's bidirectional form (an encoder task); the space layer has checked it has one.

    Under autocast (bf16 training and scoring on CUDA) the type runs with autocast off, on the dtype of ``q``
    (what the autocast projections gave), its own weights and ``k``, ``v`` cast to it: the bf16 path that
    ``scripts/gpu_check_attention.py`` holds to the reference.  Autocast inside a type would run some of its
    steps in bf16 and others in fp32 (the linear family's fp32 prefix sums took bf16 products in place)."""
    path = REGISTRY[spec.kind].path(q.device.type, exporting(), causal)
    w = w or {}
    form = _EXPORT_FORM.get()
    if form is not None and exporting():  # an export with --custom-ops: the type's nas.kernels operator, where it has one
        out = form(q, k, v, spec, w, causal)
        if out is not None:
            return out
    if q.device.type == "meta" or not torch.is_autocast_enabled(q.device.type):  # (meta: shapes only; no autocast there)
        return path(q, k, v, spec, w)
    dt = q.dtype
    with torch.autocast(q.device.type, enabled=False):
        return path(q, None if k is None else k.to(dt), v.to(dt), spec, {n: x.to(dt) for n, x in w.items()})


def attend_reference(
    q: Tensor, k: Tensor | None, v: Tensor, spec: AttentionSpec, w: Weights | None = None, causal: bool = True
) -> Tensor:
    typ = REGISTRY[spec.kind]
    return (typ.reference if causal else typ.bidirectional_reference)(q, k, v, spec, w or {})


def kv_heads(spec: AttentionSpec | str, heads: int) -> tuple[int, int]:
    """Key and value heads of a layer of this type with ``heads`` query heads."""
    return get(spec).heads(spec if isinstance(spec, AttentionSpec) else parse_attention(spec), heads)
