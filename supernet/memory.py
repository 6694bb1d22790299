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
  past it is given.
- **Latency**: a decode step of a memory model reads at most ``max_seq_len - 1`` cached entries at any context
  (:func:`attended`): the timing inputs and the latency features use that (the worst case of a segment).
- **Long documents**: :func:`stream_bits` scores documents longer than the window token by token through the
  decoding cache, with its memory (or, without one, restarting the context at each window: what a model without
  memory reads at the same cost per token).
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
    """An ONNX step graph's inputs with its growing caches trimmed to the memory when they hold ``window`` entries
    (the layout's ``position.memory`` / ``position.window``; a graph without a memory: unchanged)."""
    memory, window = layout["position"].get("memory", 0), layout["position"].get("window")
    if not memory:
        return feed
    for name, spec in layout.items():
        if name.startswith("past.") and "past" in spec["shape"]:
            axis = spec["shape"].index("past")
            if feed[name].shape[axis] >= window:
                feed[name] = np.ascontiguousarray(np.take(feed[name], np.arange(feed[name].shape[axis] - memory,
                                                                                   feed[name].shape[axis]), axis=axis))
    return feed


@torch.no_grad()
def decode_logits(model, x: Tensor) -> Tensor:
    """Teacher-forced logits (B, T, V) of ``x`` (B, T) fed one token at a time through the decoding cache (past the
    window: with the model's memory): what an ONNX generation loop over the step graph computes."""
    from .decode import decode_step, new_cache

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
    from .decode import decode_step, new_cache

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
