"""What an attention type is: one object that knows everything about its type.

A type mixes a layer's projected queries ``q (B, H, T, D)`` with its keys ``k (B, Hk, T, D)``
(or ``None`` for a type without keys) and values ``v (B, Hv, T, D)`` into ``(B, H, T, D)``.  The
Q/K/V/O projections, rotary positions and the MLP belong to the block
(:func:`supernet.model.block`), which every model, decode step and ONNX graph calls; everything
that differs between types is a method here, in this order:

* **spelling** (``name``, ``params``, ``doc``), ``forms`` and ``problems``: the space layer validates
  spellings against them (:mod:`search_spaces.attention`); ``forms`` says which of the causal
  (decoder) and bidirectional (encoder) forms the type has;
* **shape**: ``heads`` (how many key / value heads the projections give, e.g. ``gqa``),
  ``rotary_heads`` (leading heads that get rotary positions), ``weights`` (the type's own
  weights, e.g. a convolution kernel: sliced elastically like every other weight);
* **math**: ``reference`` (plain and obviously right: the tests hold every path to it),
  ``forward`` (the CPU fast path), ``forward_cuda``, ``forward_onnx`` (what the ONNX exporter
  traces: opset-23 ``Attention`` for the softmax family where ``fused_onnx``); the bidirectional
  form (every query sees every key, for an encoder task) has its own ``bidirectional_reference``,
  fast path ``bidirectional`` and traced form ``bidirectional_onnx``;
* **decoding**: ``state`` (what a layer keeps per sequence: named tensors, see
  :class:`StateSpec`), ``prefill_state`` (that state after a prompt) and ``step`` (one new token);
* **cost**: ``prefill_flops`` and ``decode_flops`` of the token mixing (``bidirectional_flops`` for the
  encoder form; ``mixing_flops`` picks by the task's form); the bytes a decode step
  reads come from ``state`` (:func:`state_bytes`).  Latency features, the search's analytic
  proxy and the benchmarks read these, never the type's name;
* ``position_limit``: a position past which the type's definition changes (cosFormer's horizon);
* ``family``: how the type uses the block's projections (``dot-product``: q and k rotated and compared;
  ``kernel-feature``: q and k through a feature map or a normalisation; ``gating``: q gates v).  A supernet
  trained with ``--split families`` gives each family its own Q/K/V/O (few-shot NAS's split by operator).

A type with weights receives them as ``w`` (name -> tensor, already sliced to the layer); others
get an empty dict.  Every method receives the parsed ``spec`` (``local:64`` ->
``spec.param("W") == 64``): the object is shared by every spelling of its type.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch
from torch import Tensor

from search_spaces.attention import AttentionSpec

FAMILIES = ("dot-product", "kernel-feature", "gating")
Weights = dict[str, Tensor]
State = dict[str, Tensor]
INIT_STD = 0.02


@dataclass(frozen=True)
class StateSpec:
    """One state tensor of a decoding layer, per sequence (the batch axis comes first and is not listed).

    ``shape``: ints, and ``"past"`` for the axis that grows by one entry per token (a key/value
    cache).  ``fp32``: kept in float32 whatever the model's dtype (running sums).  ``positive``:
    a normaliser; a synthetic state for timing draws it positive so outputs stay finite.
    """

    shape: tuple[int | str, ...]
    fp32: bool = False
    positive: bool = False

    @property
    def grows(self) -> bool:
        return "past" in self.shape

    def resolve(self, past: int) -> tuple[int, ...]:
        return tuple(past if d == "past" else int(d) for d in self.shape)


class AttentionType:
    """Base class of the attention types; subclasses override what differs (see the module doc)."""

    name: str = ""
    params: tuple[str, ...] = ()
    doc: str = ""
    fused_onnx: bool = False  # exports as one opset-23 Attention node (the block-local sparse types do not)
    forms: tuple[str, ...] = ("causal",)  # of search_spaces.attention.FORMS; "bidirectional" needs the two methods below
    family: str = "dot-product"  # of FAMILIES: how the type uses q, k, v (the projections a --split families supernet gives it)
    memory: bool = False  # may carry a memory (a space's ``memory:``): its decoding cache attends to every key it holds

    # ------------------------------------------------------------------ spelling and shape

    def problems(self, spec: AttentionSpec, max_seq_len: int, heads: tuple[int, ...]) -> list[str]:
        """Why ``spec`` does not fit a space with this ``max_seq_len`` and these ``heads`` choices."""
        return []

    def heads(self, spec: AttentionSpec, heads: int) -> tuple[int, int]:
        """Key and value heads of a layer with ``heads`` query heads (0 keys: the type uses none)."""
        return heads, heads

    def rotary_heads(self, spec: AttentionSpec, heads: int) -> int:
        """How many leading query (and key) heads get rotary positions in a rope model."""
        return heads

    def weights(
        self, spec: AttentionSpec, heads: int, head_dim: int, max_seq_len: int | None = None
    ) -> dict[str, tuple[int, ...]]:
        """The type's own weights of a layer: name -> shape.  Elastic like every weight: the
        supernet keeps the largest shape over the space and a layer uses the leading slice.
        ``max_seq_len``: the model's longest sequence, for a weight that spans the sequence
        (Linformer's projections, which a layer over T tokens uses the leading T columns of)."""
        return {}

    def init_weight(self, name: str, weight: Tensor, generator: torch.Generator | None) -> None:
        torch.nn.init.normal_(weight, 0.0, INIT_STD, generator=generator)

    def trace_length(self, max_seq_len: int) -> int:
        """The length a shape-generic graph of the type is traced at (:mod:`latency.onnx_graphs`): below
        ``max_seq_len``, where the exporter would fix the length of a type that slices a (., max_seq_len) weight
        to the first T columns (linformer's projections); a 2D type needs a square grid: its ``max_seq_len``."""
        return max(max_seq_len - 1, 2)

    def position_limit(self, spec: AttentionSpec) -> int | None:
        """A position past which the type computes something else than it was trained on, or None."""
        return None

    # ------------------------------------------------------------------ math

    def reference(self, q: Tensor, k: Tensor | None, v: Tensor, spec: AttentionSpec, w: Weights) -> Tensor:
        raise NotImplementedError

    def forward(self, q: Tensor, k: Tensor | None, v: Tensor, spec: AttentionSpec, w: Weights) -> Tensor:
        """The CPU fast path (and any device without its own)."""
        return self.reference(q, k, v, spec, w)

    def forward_cuda(self, q: Tensor, k: Tensor | None, v: Tensor, spec: AttentionSpec, w: Weights) -> Tensor:
        return self.forward(q, k, v, spec, w)

    def forward_onnx(self, q: Tensor, k: Tensor | None, v: Tensor, spec: AttentionSpec, w: Weights) -> Tensor:
        """What ``torch.onnx.export`` / ``torch.export`` trace: no data-dependent Python branches on the length."""
        return self.forward(q, k, v, spec, w)

    def bidirectional_reference(self, q: Tensor, k: Tensor | None, v: Tensor, spec: AttentionSpec, w: Weights) -> Tensor:
        """The encoder form, plain and obviously right: query i may see every key j (before and after it)."""
        raise NotImplementedError(f"{self.name} has no bidirectional form")

    def bidirectional(self, q: Tensor, k: Tensor | None, v: Tensor, spec: AttentionSpec, w: Weights) -> Tensor:
        """The encoder form's fast path (every device)."""
        return self.bidirectional_reference(q, k, v, spec, w)

    def bidirectional_onnx(self, q: Tensor, k: Tensor | None, v: Tensor, spec: AttentionSpec, w: Weights) -> Tensor:
        """What the ONNX exporter traces of the encoder form (no data-dependent branches on the length)."""
        return self.bidirectional(q, k, v, spec, w)

    def path(self, device_type: str, exporting: bool = False, causal: bool = True) -> Callable[..., Tensor]:
        if not causal:
            return self.bidirectional_onnx if exporting else self.bidirectional
        if exporting:
            return self.forward_onnx
        return self.forward_cuda if device_type == "cuda" else self.forward

    # ------------------------------------------------------------------ decoding

    def state(self, spec: AttentionSpec, heads: int, head_dim: int) -> dict[str, StateSpec]:
        raise NotImplementedError

    def prefill_state(self, spec: AttentionSpec, q: Tensor, k: Tensor | None, v: Tensor, w: Weights, capacity: int) -> State:
        """The state after a prompt whose projections are q, k, v (``capacity`` slots for a growing cache)."""
        raise NotImplementedError

    def step(
        self,
        spec: AttentionSpec,
        state: State,
        q: Tensor,
        k: Tensor | None,
        v: Tensor,
        w: Weights,
        pos: Tensor,
        length: int | None,
    ) -> tuple[Tensor, State]:
        """Mix one new token (q (B, H, 1, D), k, v of it) at position ``pos`` (1,) with the layer's past.

        ``length``: valid entries of a growing cache kept as a spare-room buffer written in place
        (torch decoding); ``None``: functional (the ONNX step graph): the cache holds exactly the
        past and the new entry is concatenated.  Returns (B, H, 1, D) and the new state.
        """
        raise NotImplementedError

    def extends(self, spec: AttentionSpec) -> bool:
        """Whether decoding keeps exactly a growing key/value cache (``k``, ``v``) that :meth:`extend` reads: the
        cached decoder graph (several new tokens after any past, optimum's ``past_key_values``) then serves the layer."""
        return False

    def extend(self, spec: AttentionSpec, state: State, q: Tensor, k: Tensor, v: Tensor, w: Weights,
               positions: Tensor) -> tuple[Tensor, State]:  # fmt: skip
        """Mix S new tokens (q (B, H, S, D), k, v of them) at ``positions`` (S,) with a growing cache holding exactly
        the past (functional: the new entries are concatenated): (B, H, S, D) and the cache S entries longer.  Only
        for a type that :meth:`extends`."""
        raise NotImplementedError(f"{self.name} keeps no plain key/value cache")

    # ------------------------------------------------------------------ cost

    def prefill_flops(self, spec: AttentionSpec, batch: int, t: int, heads: int, head_dim: int) -> float:
        """FLOPs of the token mixing over ``t`` tokens (a multiply-add counts 2)."""
        raise NotImplementedError

    def decode_flops(self, spec: AttentionSpec, batch: int, context: int, heads: int, head_dim: int) -> float:
        """FLOPs of mixing one new token with ``context`` tokens already seen."""
        raise NotImplementedError

    def bidirectional_flops(self, spec: AttentionSpec, batch: int, t: int, heads: int, head_dim: int) -> float:
        """FLOPs of the bidirectional (encoder) form over ``t`` tokens."""
        raise NotImplementedError(f"{self.name} has no bidirectional form")

    def mixing_flops(self, spec: AttentionSpec, batch: int, t: int, heads: int, head_dim: int, causal: bool = True) -> float:
        """FLOPs of the token mixing of the form a task uses: ``prefill_flops`` (causal) or ``bidirectional_flops``."""
        return (self.prefill_flops if causal else self.bidirectional_flops)(spec, batch, t, heads, head_dim)

    def __repr__(self) -> str:
        return f"<attention type {self.name}>"


def state_bytes(typ: AttentionType, spec: AttentionSpec, context: int, heads: int, head_dim: int, batch: int = 1) -> int:
    """fp32 bytes of the state a decode step reads at ``context`` (a growing cache holds ``context + 1``
    entries then: the past and the new token)."""
    return sum(4 * batch * math.prod(s.resolve(context + 1)) for s in typ.state(spec, heads, head_dim).values())
