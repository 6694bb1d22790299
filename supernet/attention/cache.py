"""Small pure helpers for decoding states, shared by the types' ``prefill_state`` / ``step``.

* a **growing** cache (a key/value cache): in torch a spare-room buffer written in place, doubled
  when full (``length`` valid entries); in the ONNX step graph functional (exactly the past, the
  new entry concatenated);
* a **window**: the last ``n`` entries, the oldest dropped as a new one comes (constant size);
* running sums are plain additions and live in the types.
"""

from __future__ import annotations

import torch
from torch import Tensor

SPARE = 256  # spare slots a fresh or synthetic growing cache gets before its first regrowth


def grown(prompt: Tensor, capacity: int) -> Tensor:
    """A growing cache holding ``prompt`` (B, H, T, D) in a buffer of ``max(T, capacity)`` slots."""
    b, h, t, d = prompt.shape
    buf = prompt.new_zeros(b, h, max(t, capacity), d)
    buf[:, :, :t] = prompt
    return buf


def append(buf: Tensor, x: Tensor, length: int | None) -> tuple[Tensor, Tensor]:
    """Add x (B, H, 1, D) to a growing cache: (the valid entries, the new buffer).

    ``length`` valid entries of a spare-room buffer (written in place, regrown when full), or
    ``None``: ``buf`` holds exactly the past and the result is a new tensor.
    """
    if length is None:
        out = torch.cat((buf, x), dim=2)
        return out, out
    if length == buf.shape[2]:  # full: double the room (at least SPARE more slots)
        b, h, _, d = buf.shape
        buf = torch.cat((buf, buf.new_zeros(b, h, max(length, SPARE), d)), dim=2)
    buf[:, :, length : length + 1] = x
    return buf[:, :, : length + 1], buf


def roll(window: Tensor, x: Tensor) -> Tensor:
    """A window (B, H, n, D) with its oldest entry dropped and x (B, H, 1, D) appended."""
    return torch.cat((window[:, :, 1:], x), dim=2)


def last(x: Tensor, n: int) -> Tensor:
    """The last n positions of x (B, H, T, D), zero-padded in front when T < n (a window after a prompt)."""
    t = x.shape[2]
    return x[:, :, t - n :].clone() if t >= n else torch.cat((x.new_zeros(*x.shape[:2], n - t, x.shape[3]), x), dim=2)


def first(x: Tensor, n: int) -> Tensor:
    """The first n positions of x (B, H, T, D), zero-padded at the end when T < n."""
    t = x.shape[2]
    return x[:, :, :n].clone() if t >= n else torch.cat((x, x.new_zeros(*x.shape[:2], n - t, x.shape[3])), dim=2)
