"""Incremental decoding of a static Transformer: prefill a prompt, then one token per step.

A :class:`DecodeCache` holds, per layer, what that layer's attention type needs to score one new
query without the past tokens (plain tensors in a dict, no code), and ``length``, the tokens seen.
What a layer keeps is its type's business (``AttentionType.state``): a growing key/value cache
(softmax, gqa, and the sparse types whose pattern reaches arbitrarily far back, masked by the
pattern's row), a rolling window (local, dilated, longformer with its global tokens), the
recurrent state of the linear family, a convolution's last inputs, ...  In torch a growing cache
is a buffer with spare room (doubled when full) whose first ``length`` entries are valid.

Positions: rotary angles are computed for any position (:func:`supernet.model.rope_at`), so a
rope model decodes past ``max_seq_len`` (for timing at long contexts; quality there is whatever
the model extrapolates to).  A model with learned positions has none beyond ``max_seq_len`` and
``decode_step`` refuses there.

Prefill and the step run the one block function (:func:`supernet.model.block`) with a cache
argument; the ONNX step graph (:mod:`supernet.onnx_decode`) traces :func:`step` functionally
(caches in, new caches out).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from search_spaces import UserError, tasks

from .attention import StateSpec
from .attention.cache import SPARE
from .memory import attended, segment_slots, trim_states
from .model import Extend, Prefill, Step, Transformer, check_tokens, embed, lm_head, rope_at


@dataclass
class DecodeCache:
    """Per-layer states (name -> tensor, see the module doc) and ``length``, the tokens already seen; ``slots``, the
    valid entries of the growing caches when they differ from ``length`` (a model with a memory trims them at each
    segment: :mod:`supernet.memory`; None: ``length``)."""

    layers: list[dict[str, Tensor]]
    length: int = 0
    batch_size: int = 0  # sequences per step (0: not checked)
    slots: int | None = None

    @property
    def valid(self) -> int:
        """Valid entries of the growing caches."""
        return self.length if self.slots is None else self.slots


def layer_states(model: Transformer) -> list[dict[str, StateSpec]]:
    """Per layer, what its type keeps while decoding: name -> :class:`StateSpec`."""
    hd = model.config.head_dim
    return [b.attn.typ.state(b.attn.spec, b.attn.heads, hd) for b in model.blocks]


def state_shapes(model: Transformer, batch_size: int, kv_len: int) -> list[dict[str, tuple[tuple[int, ...], torch.dtype]]]:
    """Per layer, name -> (shape, dtype) of its state with ``kv_len`` slots in its growing caches."""
    dtype = model.tok_emb.weight.dtype
    return [
        {n: ((batch_size, *s.resolve(kv_len)), torch.float32 if s.fp32 else dtype) for n, s in states.items()}
        for states in layer_states(model)
    ]


# --------------------------------------------------------------------------- public API


def new_cache(model: Transformer, batch_size: int, *, capacity: int = SPARE) -> DecodeCache:
    """An empty cache (nothing seen yet) for ``batch_size`` sequences."""
    if batch_size < 1:
        raise UserError(f"batch_size: {batch_size}; expected a positive count")
    device = model.tok_emb.weight.device
    layers = [
        {name: torch.zeros(shape, dtype=dtype, device=device) for name, (shape, dtype) in shapes.items()}
        for shapes in state_shapes(model, batch_size, capacity)
    ]
    return DecodeCache(layers, 0, batch_size)


def synthetic_cache(
    model: Transformer, batch_size: int, context: int, generator: torch.Generator | None = None, *, spare: int = SPARE
) -> DecodeCache:
    """A cache of the right shapes and dtypes filled with random values, as if ``context`` tokens had been seen.

    No prefill runs, so it is cheap even at 16k tokens: it is for timing one :func:`decode_step` at
    a context length.  Growing caches get ``context + spare`` slots (no regrowth in the next
    ``spare`` steps); linear normalisers ``z`` are positive, so outputs stay finite.  To time many
    steps at the same context, set ``cache.length = context`` before each: the growing caches then
    overwrite the same slots (window and linear states are constant-size anyway).
    """
    if context < 0:
        raise UserError(f"context: {context}; expected >= 0 tokens")
    slots = attended(context, model.config.memory, model.config.max_seq_len)  # a memory bounds what a step reads
    cache = new_cache(model, batch_size, capacity=slots + spare)
    for layer, states in zip(cache.layers, layer_states(model)):
        for name, t in layer.items():
            if t.dtype.is_floating_point:
                r = torch.randn(t.shape, generator=generator, dtype=torch.float32).to(t.device, t.dtype)
                layer[name] = r.abs() + 1.0 if states[name].positive else r
    cache.length, cache.slots = context, (slots if slots != context else None)
    return cache


@torch.no_grad()
def prefill(model: Transformer, idx: Tensor, *, capacity: int | None = None) -> tuple[Tensor, DecodeCache]:
    """Run the prompt ``idx`` (B, T) through the model: logits (B, T, V) (equal to ``model(idx)``) and the cache after it.

    ``capacity``: slots of the growing key/value caches (default T + SPARE; they double when full).
    """
    if not model.config.causal:
        raise UserError(f"this model is a bidirectional encoder (task {tasks.with_form('bidirectional')}): it has no decoding "
                        "cache")
    check_tokens(idx, model.config.vocab_size, model.config.max_seq_len)
    b, t = idx.shape
    positions = torch.arange(t, device=idx.device)
    x, rope = _embed(model, idx, positions)  # (B, T, E)
    cache = Prefill(max(t, capacity if capacity is not None else t + SPARE))
    layers = []
    for blk in model.blocks:
        x, state = blk(x, rope, cache)
        layers.append(state)
    return lm_head(x, (model.ln_f.weight, model.ln_f.bias), model.tok_emb.weight), DecodeCache(layers, t, b)


@torch.no_grad()
def decode_step(model: Transformer, token: Tensor, cache: DecodeCache) -> tuple[Tensor, DecodeCache]:
    """Feed one token per sequence, ``token`` (B, 1), at position ``cache.length``: logits (B, 1, V).

    Updates ``cache`` in place (and returns it).
    """
    if token.dim() != 2 or token.shape[1] != 1 or token.dtype not in (torch.int64, torch.int32):
        raise UserError(
            f"decode_step: expected one token per sequence, shape (batch, 1) integer, got {tuple(token.shape)} {token.dtype}"
        )
    if cache.batch_size and token.shape[0] != cache.batch_size:
        raise UserError(f"decode_step: {token.shape[0]} tokens for a cache of batch size {cache.batch_size}")
    p = cache.length
    if model.pos_emb is not None and p >= model.config.max_seq_len:
        raise UserError(
            f"decode position {p} is past max_seq_len {model.config.max_seq_len}: this model has learned positions, "
            "which end there (rotary models decode at any position)"
        )
    pos = torch.tensor([p], device=token.device)
    memory, slots = model.config.memory, cache.valid
    if segment_slots(slots, memory, model.config.max_seq_len) != slots:  # the window is full: a new segment, its memory
        cache.layers, slots = trim_states(cache.layers, growing_axes(model), slots, memory), memory
    logits, layers = step(model, token, pos, cache.layers, length=slots)
    cache.layers, cache.length = layers, p + 1
    if memory or cache.slots is not None:
        cache.slots = slots + 1
    return logits, cache


def growing_axes(model: Transformer) -> list[dict[str, int]]:
    """Per layer, the growing states' ``past`` axis in the cache's tensors (batch first)."""
    return [{n: 1 + s.shape.index("past") for n, s in states.items() if s.grows} for states in layer_states(model)]


def cache_bytes(cache: DecodeCache) -> int:
    """Bytes held by the cache's tensors (allocated, spare slots included)."""
    return sum(t.numel() * t.element_size() for layer in cache.layers for t in layer.values())


# --------------------------------------------------------------------------- the step


def step(
    model: Transformer, token: Tensor, pos: Tensor, layers: list[dict[str, Tensor]], length: int | None
) -> tuple[Tensor, list[dict[str, Tensor]]]:
    """One decode step: token (B, 1) at position ``pos`` (1,) int64 -> logits (B, 1, V), new layer states.

    ``length`` is the number of valid slots of the growing caches when they are spare-room buffers
    written in place (torch); ``None`` means functional (ONNX): they hold exactly the past, and
    the new entry is concatenated.
    """
    x, rope = _embed(model, token, pos)  # (B, 1, E)
    new_layers = []
    for blk, state in zip(model.blocks, layers):
        x, new = blk(x, rope, Step(state, pos, length))
        new_layers.append(new)
    return lm_head(x, (model.ln_f.weight, model.ln_f.bias), model.tok_emb.weight), new_layers  # (B, 1, V)


def keeps_kv_cache(model: Transformer) -> bool:
    """Whether every layer of a causal ``model`` keeps exactly a growing key/value cache (softmax, gqa, the sparse
    types that reach arbitrarily far back) and the cache's length is the next position: then :func:`extend` runs it,
    the cached decoder graph's form.  Not with a memory (:mod:`supernet.memory`): once a segment is full its cache
    holds the last ``memory`` tokens, whose positions its length no longer gives (nor the causal mask its indices), so
    its step graph takes the position as an input (the one-token step)."""
    return model.config.causal and not model.config.memory and all(b.attn.typ.extends(b.attn.spec) for b in model.blocks)


def extend(model: Transformer, idx: Tensor, layers: list[dict[str, Tensor]]) -> tuple[Tensor, list[dict[str, Tensor]]]:
    """idx (B, S) new tokens after the past held in ``layers`` (per layer ``k``, ``v`` (B, Hkv, P, D), exactly the
    past): logits (B, S, V) and the caches S entries longer.  The positions are P .. P+S-1, read off the caches'
    length, so the past may be empty (P = 0: a prompt) and S may be 1 (a decode step).  Functional, for the cached
    decoder graph (:func:`supernet.onnx_decode.export_decode_onnx`); only for a model that :func:`keeps_kv_cache`."""
    past = layers[0]["k"].shape[2]
    positions = past + torch.arange(idx.shape[1], device=idx.device)  # (S,)
    x, rope = _embed(model, idx, positions)  # (B, S, E)
    new_layers = []
    for blk, state in zip(model.blocks, layers):
        x, new = blk(x, rope, Extend(state, positions))
        new_layers.append(new)
    return lm_head(x, (model.ln_f.weight, model.ln_f.bias), model.tok_emb.weight), new_layers  # (B, S, V)


def _embed(model: Transformer, idx: Tensor, positions: Tensor) -> tuple[Tensor, tuple[Tensor, Tensor] | None]:
    """Embeddings of idx (B, T) at ``positions`` (T,), and the rotary angles there (None: learned positions)."""
    pos = model.pos_emb.weight if model.pos_emb is not None else None
    rope = None if pos is not None else rope_at(positions, model.config.head_dim)
    return embed(idx, model.tok_emb.weight, pos, positions), rope


@torch.no_grad()
def decode_logits(model, x: Tensor) -> Tensor:
    """Teacher-forced logits (B, T, V) of ``x`` (B, T) fed one token at a time through the decoding cache (past the
    window: with the model's memory): what an ONNX generation loop over the step graph computes."""
    cache, outs = new_cache(model, x.shape[0]), []
    for t in range(x.shape[1]):
        logits, cache = decode_step(model, x[:, t : t + 1], cache)
        outs.append(logits)
    return torch.cat(outs, dim=1)


@torch.no_grad()
def stream_bits(model, docs: list[np.ndarray], memory: bool = True, batch_size: int = 8) -> float:
    """Mean bits per predicted byte of the static causal ``model`` over ``docs`` (token arrays, each read from its
    start), token by token through the decoding cache: with the model's memory carried across segments
    (``memory``, a model of a space with one), or without (the context restarts every ``max_seq_len`` tokens: a
    fresh cache, as a new window).  Documents of
    equal length are read in batches of ``batch_size``."""
    window, memory = model.config.max_seq_len, memory and model.config.memory > 0
    total, count = 0.0, 0
    by_length: dict[int, list[np.ndarray]] = {}
    for d in docs:
        by_length.setdefault(len(d), []).append(np.asarray(d, dtype=np.int64))
    device = model.tok_emb.weight.device
    for length, group in sorted(by_length.items()):
        for i in range(0, len(group), batch_size):
            x = torch.from_numpy(np.stack(group[i : i + batch_size])).to(device)  # (B, L)
            cache = new_cache(model, x.shape[0])
            for t in range(length - 1):
                if not memory and cache.length == window:
                    cache = new_cache(model, x.shape[0])  # the window is full: read on from nothing, as a new window
                logits, cache = decode_step(model, x[:, t : t + 1], cache)  # (B, 1, V)
                lp = torch.log_softmax(logits[:, 0].float(), -1)
                total -= float(lp.gather(1, x[:, t + 1 : t + 2]).sum())
                count += x.shape[0]
    return total / max(count, 1) / float(np.log(2.0))
