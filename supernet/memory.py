"""Memory for causal models: Transformer-XL's cached previous segment (a space's ``memory: M``, issue 57).

A model of a space with ``memory: M`` (rotary positions; types whose decoding cache attends to every key it holds)
reads a long text in **segments**: each new token attends to the keys and values of the tokens of its segment so far
and to those of the last ``M`` tokens of the previous segment (the memory), never more than ``max_seq_len`` in all.
So a token's context reaches beyond the window through the depth of the recurrence (the memory's states were
themselves computed with a memory) at a fixed cost per token, where a model without memory re-reads its context when
the window is full (``nas generate --overflow``).  Rotary positions keep every key's distance from the query across
segments.

- **Training** (the causal task's learner, :mod:`tasks.causal_lm.learner`): every window of ``seq_len`` tokens is
  its first ``M`` tokens (the memory) and the segment after them; only the segment is scored, and the memory's hidden
  states enter every layer without gradient (:func:`detach_memory`, as Transformer-XL's ``stop_gradient`` on the
  cached segment: the values are unchanged).  A stateless training loop cannot hand one batch's states to the next,
  so the memory a model trains with is computed from its own tokens alone (one segment of recurrence); at inference it
  was computed with its own memory.
- **Decoding** (:func:`supernet.decode.decode_step`, the ONNX generation loop of :mod:`supernet.onnx_decode`): the
  growing key/value caches hold at most ``max_seq_len`` entries; when they are full only the last ``M`` stay
  (:func:`trim_states`) and the next segment begins.  The step graph itself is unchanged: it attends to whatever
  past it is given, at the position it is given (the one-token step; not the cached decoder, which reads positions
  off its caches' length: :func:`supernet.decode.keeps_kv_cache`).
- **Latency**: a decode step of a memory model reads at most ``max_seq_len - 1`` cached entries at any context
  (:func:`attended`): the timing inputs and the latency features use that (the worst case of a segment).
- **Long documents**: :func:`supernet.decode.stream_bits` scores documents longer than the window token by token
  through the decoding cache, with its memory (or, without one, restarting the context at each window: what a model
  without memory reads at the same cost per token).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor


def detach_memory(x: Tensor, memory: int) -> Tensor:
    """x (B, T, E) with its first ``memory`` positions cut from the gradient (values unchanged; under autograd only)."""
    if not memory or not torch.is_grad_enabled() or not x.requires_grad or x.shape[1] <= memory:
        return x
    return torch.cat((x[:, :memory].detach(), x[:, memory:]), dim=1)


def attended(context: int, memory: int, window: int) -> int:
    """Cached entries a decode step reads after ``context`` tokens: ``context`` without memory, and at most
    ``window - 1`` with one (the worst step of a segment: the cache is trimmed when it holds ``window`` entries)."""
    return min(context, window - 1) if memory else context


def segment_slots(slots: int, memory: int, window: int) -> int:
    """Valid cache entries before the next step: ``memory`` when the cache is full (``window`` entries), else ``slots``."""
    return memory if memory and slots >= window else slots


def trim_states(layers: list[dict[str, Tensor]], grows: list[dict[str, int]], slots: int, memory: int) -> list[dict]:
    """Each layer's growing caches keeping their last ``memory`` of ``slots`` valid entries, moved to the front (the
    buffers keep their room); ``grows``: per layer, state name -> its ``past`` axis (batch first).  Other states as they
    are."""
    out = []
    for layer, axes in zip(layers, grows):
        new = dict(layer)
        for name, axis in axes.items():
            t = layer[name]
            keep = t.narrow(axis, slots - memory, memory).clone()
            t = t.clone()
            t.narrow(axis, 0, memory).copy_(keep)
            new[name] = t
        out.append(new)
    return out


def trim_feed(feed: dict[str, np.ndarray], layout: dict[str, dict]) -> dict[str, np.ndarray]:
    """An ONNX step graph's inputs with its growing caches (the inputs with a ``past`` axis: ``past_key_values.*``)
    trimmed to their last ``memory`` entries when they hold ``window`` (the layout's ``position.memory`` /
    ``position.window``; a graph without a memory, the cached decoder's included: unchanged)."""
    position = layout.get("position", {})
    memory, window = position.get("memory", 0), position.get("window")
    if not memory:
        return feed
    for name, spec in layout.items():
        if "past" in spec["shape"]:
            axis = spec["shape"].index("past")
            if feed[name].shape[axis] >= window:
                feed[name] = np.ascontiguousarray(np.take(feed[name], np.arange(feed[name].shape[axis] - memory,
                                                                                   feed[name].shape[axis]), axis=axis))
    return feed
