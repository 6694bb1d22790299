"""Token keeping: per layer, the share of the image's tokens that pass through the block (a searched width, issue 57).

A layer that keeps ``keep`` < 1 of its T tokens scores each token with a small learned linear map of its input
(``score``: E -> 1, one per layer), takes the ``k = ceil(keep * T)`` best (a top-k of static size, the indices sorted
back into the grid's row-major order), runs the block (attention among the kept tokens, then the MLP) on those k
tokens alone and writes them back in place; the other ``T - k`` tokens skip the layer unchanged.  So the model's
token count never shrinks: the grid survives for a later layer's 2D attention type, the final mean pools every token,
and a layer keeping 1.0 is exactly the plain block (no score, no top-k).  This is ToSA's selection (Singh et al.,
2024: a predictor picks the tokens that attend in the next layer, the rest bypass it), with the predictor a linear
score of the layer's input, rather than ToMe's merging, which shrinks the sequence for every later layer (no grid left
for the 2D types) and needs its bipartite matching in the graph; merging is not implemented, so the two were not
measured against each other.

Training the score: top-k picks without a gradient; the kept tokens' update is multiplied by
``1 + g - stop_gradient(g)`` (``g`` their score), which is exactly 1 in value (the forward is the block's) and passes
``d loss / d g = <d loss / d y, block(x) - x>`` to the score: a token whose update lowers the loss is scored up.
Only under autograd; a traced graph (ONNX) and every evaluation compute the plain forward.

A layer whose attention type reads the token grid (a 2D type: :class:`supernet.attention.grid.GridType`) keeps every
token (a subset is no grid): a space lists the shares it searches (``keep: [1.0, 0.7, 0.5]``, 1.0 among them), the
sampler and the operators give a 2D layer 1.0, and :func:`keep_problems` names a subnet that does otherwise.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from search_spaces.errors import shown

Pair = tuple[Tensor, Tensor]
FULL = 1.0


def kept(tokens: int, keep: float) -> int:
    """Tokens a layer keeping the share ``keep`` of ``tokens`` runs: ``ceil(keep * tokens)``, at least 1."""
    return max(1, math.ceil(keep * tokens - 1e-9))


def keep_tokens(h: Tensor, score: Pair | None, keep: float, run: Callable[[Tensor], Tensor], always: int = 0) -> Tensor:
    """One layer with token keeping: ``run`` (the block, (B, k, E) -> (B, k, E)) on the first ``always`` tokens of
    ``h`` (B, always + T, E) (a class token) and the ``kept(T, keep)`` best-scored of the T grid tokens after them, in
    that order; the other grid tokens unchanged.  ``keep`` 1.0 (``score`` None) is ``run(h)``."""
    if keep >= FULL:
        return run(h)
    b, t, e = h.shape
    k = kept(t - always, keep)
    s = F.linear(h[:, always:], *score)[..., 0]  # (B, T): the grid tokens' scores
    idx = torch.sort(torch.topk(s, k, dim=1).indices, dim=1).values + always  # (B, k): the kept ones in grid order
    if always:  # the leading tokens first, at every layer
        idx = torch.cat([torch.arange(always, device=h.device).expand(b, always), idx], dim=1)  # (B, always + k)
        s = torch.cat([s.new_zeros(b, always), s], dim=1)  # (B, always + T): no score, a factor of exactly 1
    gather = idx[..., None].expand(-1, -1, e)  # (B, always + k, E)
    x = torch.gather(h, 1, gather)  # (B, always + k, E)
    y = run(x)
    if torch.is_grad_enabled() and s.requires_grad:
        g = torch.gather(s, 1, idx)[..., None]  # (B, always + k, 1)
        y = x + (y - x) * (1.0 + g - g.detach())  # the same values; the score learns from the update it gates
    return h.scatter(1, gather, y)  # (B, always + T, E)


# --------------------------------------------------------------------------- the space's gene


def reads_grid(attention: str) -> bool:
    """Whether the type mixes over the square token grid (a 2D type): such a layer keeps every token."""
    from supernet.attention import get
    from supernet.attention.grid import GridType

    return isinstance(get(attention), GridType)


def parse_keep(c, value: Any) -> tuple[float, ...]:
    """The space's ``keep`` list (``Checker`` ``c`` collects the problem): distinct shares in (0, 1], 1.0 among them."""
    if value is None:
        return (FULL,)
    ok = isinstance(value, list) and value and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value)
    if not ok or any(not 0 < v <= 1 for v in value) or len(set(value)) != len(value) or FULL not in value:
        c.error("keep", f"{shown(value)} is not a list of distinct token shares in (0, 1] with 1.0 among them "
                "(e.g. [1.0, 0.7, 0.5])")
        return (FULL,)
    return tuple(sorted((float(v) for v in value), reverse=True))


def check_keep(keep: Any, depth: int) -> tuple[float, ...]:
    """A subnet's ``keep`` tuple, normalised: floats, and () when every layer keeps every token (as a subnet written
    before token keeping reads); ``ValueError`` names a wrong length or share."""
    if not isinstance(keep, tuple):
        raise ValueError(f"subnet.keep: expected a tuple, got {type(keep).__name__}")
    if keep and len(keep) != depth:
        raise ValueError(f"subnet.keep: has {len(keep)} entries but depth is {depth}")
    for i, v in enumerate(keep):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v <= 1:
            raise ValueError(f"subnet.keep[{i}]: {shown(v)} is not a token share in (0, 1]")
    return () if all(v == FULL for v in keep) else tuple(float(v) for v in keep)


def layer_keeps(keep: tuple[float, ...], depth: int) -> tuple[float, ...]:
    """Every layer's share (``keep`` () means 1.0 everywhere)."""
    return keep or (FULL,) * depth


def keep_problems(keeps: tuple[float, ...], attention: tuple[str, ...], keep: tuple[float, ...]) -> list[str]:
    """Why a subnet's shares are not in a space searching ``keeps`` (a 2D layer keeps every token)."""
    out = []
    for i, (a, v) in enumerate(zip(attention, layer_keeps(keep, len(attention)))):
        if v not in keeps:
            out.append(f"keep[{i}]: {shown(v)} is not one of {', '.join(map(str, keeps))}")
        elif v < FULL and reads_grid(a):
            out.append(f"keep[{i}]: {v} with {a}, a 2D type: a layer over the token grid keeps every token (1.0)")
    return out


def draw_keep(keeps: tuple[float, ...], attention: tuple[str, ...], rng: np.random.Generator) -> tuple[float, ...]:
    """Each layer's share drawn uniformly (a 2D layer: 1.0); no draw at all when the space searches none (its
    subnets, and the random stream of its search, are as before token keeping)."""
    if len(keeps) == 1:
        return ()
    return tuple(FULL if reads_grid(a) else keeps[int(rng.integers(len(keeps)))] for a in attention)


def mutate_keep(keeps: tuple[float, ...], parent: tuple[float, ...], attention: tuple[str, ...],
                rng: np.random.Generator, prob: float) -> tuple[float, ...]:
    """Each layer's share redrawn with probability ``prob`` (layers a deeper child gains: drawn), a 2D layer 1.0."""
    if len(keeps) == 1:
        return ()
    have = layer_keeps(parent, len(parent) or len(attention))
    out = []
    for i, a in enumerate(attention):
        v = have[i] if i < len(have) and rng.random() >= prob else keeps[int(rng.integers(len(keeps)))]
        out.append(FULL if reads_grid(a) else v)
    return tuple(out)


def cross_keep(keeps: tuple[float, ...], a: tuple[float, ...], b: tuple[float, ...], da: int, db: int,
               attention: tuple[str, ...], rng: np.random.Generator) -> tuple[float, ...]:
    """Each layer's share from parent ``a`` (depth ``da``) or ``b`` (``db``) with equal chance; a 2D layer 1.0."""
    if len(keeps) == 1:
        return ()
    ka, kb = layer_keeps(a, da), layer_keeps(b, db)
    out = []
    for i, t in enumerate(attention):
        have = [k[i] for k in (ka, kb) if i < len(k)]
        v = have[int(rng.integers(len(have)))] if have else FULL
        out.append(FULL if reads_grid(t) else v)
    return tuple(out)


def keep_feature_names(keeps: tuple[float, ...], max_depth: int) -> list[str]:
    """The encoding's share per layer slot (none when the space searches no share: encodings as before)."""
    return [f"l{i}.keep" for i in range(max_depth)] if len(keeps) > 1 else []


def keep_features(keeps: tuple[float, ...], keep: tuple[float, ...], depth: int, max_depth: int) -> list[float]:
    """Each layer slot's share (0 for an absent layer), in :func:`keep_feature_names`' order."""
    if len(keeps) == 1:
        return []
    have = layer_keeps(keep, depth)
    return [have[i] if i < depth else 0.0 for i in range(max_depth)]


def layer_tokens(tokens: int, keep: tuple[float, ...], depth: int, always: int = 0) -> list[int]:
    """The tokens each layer's block runs (the latency features' sequence length per layer): its share of the
    ``tokens`` grid tokens plus the ``always`` leading ones (a class token)."""
    return [always + (kept(tokens, v) if v < FULL else tokens) for v in layer_keeps(keep, depth)]
