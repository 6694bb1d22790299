"""The vision Transformer of an image-classification space: the elastic supernet and the static model, one forward.

``x`` (B, C, H, W) floats in [0, 1] (the data's size) -> logits (B, 1, classes): one scored position per image, so
the generic learners, held-out scores and distillation (:mod:`supernet.task`, :mod:`supernet.heldout`) score it as a
sequence whose one position is the label.  The steps, written once as pure functions of explicit weights
(:func:`embed_image`, :func:`classify`) and shared by both models:

1. normalise (``(x - 0.5) / 0.5``), resize to the subnet's resolution (bilinear) when it differs from the data's;
2. the ``conv`` stem: a 3 x 3 convolution (padding 1) to ``stem_channels`` channels, GELU (the ``linear`` stem: none);
3. cut the S x S patches of ``patch`` x ``patch`` pixels in **row-major order** (token ``t`` = row ``t // S``, column
   ``t % S``), map each patch's pixels linearly to the width E;
4. add 2D positions: a learned row embedding plus a learned column embedding (S, E) each, one pair per grid size;
5. the encoder blocks (:func:`supernet.model.block`, bidirectional, no rotary positions) over the T = S * S tokens
   (a layer keeping a share < 1 of them runs its block on its best-scored tokens only: :mod:`.tokens`);
6. the final norm, the mean over the tokens (no class token), a linear head.

The elastic model (:class:`SuperViT`) holds each weight at its largest shape and slices the leading block (a patch
embedding per (stem, patch) pair and a position pair per grid size, at the widest E); :meth:`SuperViT.extract`
copies the slices into the static :class:`ViT` of the subnet, which computes the same numbers.
"""

from __future__ import annotations

from functools import lru_cache

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from supernet.elastic import ElasticBlock, ElasticLayerNorm, _max_shapes, copy_into, linear_slice, norm_slice
from supernet.model import Block, init_weights

from .space import VisionSpace, VisionSubnet
from .tokens import keep_tokens

Pair = tuple[Tensor, Tensor]


# --------------------------------------------------------------------------- the forward, once


def patches(x: Tensor, patch: int) -> Tensor:
    """(B, C, R, R) -> (B, S*S, C*patch*patch): the S x S patches in row-major order, each flattened (C, py, px)."""
    b, c, r, _ = x.shape
    s = r // patch
    x = x.reshape(b, c, s, patch, s, patch).permute(0, 2, 4, 1, 3, 5)  # (B, S, S, C, P, P)
    return x.reshape(b, s * s, c * patch * patch)


def embed_image(x: Tensor, resolution: int, patch: int, conv: Pair | None, proj: Pair, row: Tensor, col: Tensor) -> Tensor:
    """Images (B, C, H, W) in [0, 1] -> patch tokens with 2D positions (B, T, E) (steps 1-4 of the module doc)."""
    x = (x - 0.5) / 0.5
    if x.shape[-1] != resolution or x.shape[-2] != resolution:
        x = F.interpolate(x, size=(resolution, resolution), mode="bilinear", align_corners=False)
    if conv is not None:
        x = F.gelu(F.conv2d(x, *conv, padding=1))  # (B, stem_channels, R, R)
    tokens = F.linear(patches(x, patch), *proj)  # (B, T, E)
    s, e = row.shape
    pos = (row[:, None, :] + col[None, :, :]).reshape(s * s, e)  # (T, E): row i, column j at i * S + j
    return tokens + pos


def classify(x: Tensor, ln: Pair, head: Pair) -> Tensor:
    """(B, T, E) -> logits (B, 1, classes): final norm, mean over the tokens, linear head."""
    h = F.layer_norm(x, (x.shape[-1],), *ln).mean(1, keepdim=True)  # (B, 1, E)
    return F.linear(h, *head)


def check_images(x: Tensor, space: VisionSpace) -> None:
    want = (space.channels, space.image_size, space.image_size)
    if x.dim() != 4 or tuple(x.shape[1:]) != want or not x.is_floating_point():
        raise ValueError(f"expected float images of shape (batch, {', '.join(map(str, want))}), got {tuple(x.shape)} {x.dtype}")


def patch_key(stem: str, patch: int) -> str:
    return f"{stem}{patch}"


def stem_in(space: VisionSpace, stem: str) -> int:
    """Channels the patch embedding reads: the image's (linear stem) or the conv stem's."""
    return space.stem_channels if stem == "conv" else space.channels


# --------------------------------------------------------------------------- static


class ViT(nn.Module):
    """The static vision Transformer of one subnet (what extraction returns and what trains from scratch)."""

    def __init__(self, space: VisionSpace, subnet: VisionSubnet, generator: torch.Generator | None = None):
        super().__init__()
        self.space, self.subnet = space, space.check(subnet)
        e, p, s = subnet.embed_dim, subnet.patch, subnet.grid
        self.stem = nn.Conv2d(space.channels, space.stem_channels, 3, padding=1) if subnet.stem == "conv" else None
        self.proj = nn.Linear(stem_in(space, subnet.stem) * p * p, e)
        self.row, self.col = nn.Parameter(torch.empty(s, e)), nn.Parameter(torch.empty(s, e))
        self.blocks = nn.ModuleList(Block(e, space.head_dim, layer, space.max_seq_len) for layer in subnet.layers)
        self.scores = nn.ModuleDict({str(i): nn.Linear(e, 1) for i, v in enumerate(subnet.keeps) if v < 1})  # token scores
        self.ln_f = nn.LayerNorm(e)
        self.head = nn.Linear(e, space.classes)
        init_weights(self, n_layers=subnet.depth, generator=generator)

    def forward(self, x: Tensor) -> Tensor:
        """x (B, C, H, W) in [0, 1] -> logits (B, 1, classes)."""
        check_images(x, self.space)
        conv = (self.stem.weight, self.stem.bias) if self.stem is not None else None
        s = self.subnet
        h = embed_image(x, s.resolution, s.patch, conv, (self.proj.weight, self.proj.bias), self.row, self.col)  # (B, T, E)
        for i, (blk, keep) in enumerate(zip(self.blocks, s.keeps)):
            score = (self.scores[str(i)].weight, self.scores[str(i)].bias) if keep < 1 else None
            h = keep_tokens(h, score, keep, lambda t, blk=blk: blk(t, None, causal=False)[0])  # (B, T, E)
        return classify(h, (self.ln_f.weight, self.ln_f.bias), (self.head.weight, self.head.bias))

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())


# --------------------------------------------------------------------------- elastic


class SuperViT(nn.Module):
    """Every subnet of ``space`` in one set of weights: ``forward(x, subnet)``; ``extract(subnet)`` -> :class:`ViT`."""

    def __init__(self, space: VisionSpace, generator: torch.Generator | None = None):
        super().__init__()
        self.space = space
        e = space.max_embed_dim
        self.stem = nn.Conv2d(space.channels, space.stem_channels, 3, padding=1) if "conv" in space.stems else None
        self.proj = nn.ModuleDict({patch_key(st, p): nn.Linear(stem_in(space, st) * p * p, e)
                                   for st in space.stems for p in space.patches})  # fmt: skip
        grids = sorted({r // p for r in space.resolutions for p in space.patches})
        self.row = nn.ParameterDict({f"g{s}": nn.Parameter(torch.empty(s, e)) for s in grids})
        self.col = nn.ParameterDict({f"g{s}": nn.Parameter(torch.empty(s, e)) for s in grids})
        mix = _max_shapes(space)
        self.blocks = nn.ModuleList(ElasticBlock(space, mix) for _ in range(space.max_depth))
        if len(space.keeps) > 1:  # each layer's token score at the widest E (none: checkpoints as before)
            self.scores = nn.ModuleList(nn.Linear(e, 1) for _ in range(space.max_depth))
        self.ln_f = ElasticLayerNorm(e)
        self.head = nn.Linear(e, space.classes)
        init_weights(self, n_layers=space.max_depth, generator=generator)
        self._check = lru_cache(maxsize=4096)(space.check)

    def _weights(self, subnet: VisionSubnet) -> tuple:
        e, s = subnet.embed_dim, subnet.grid
        conv = (self.stem.weight, self.stem.bias) if subnet.stem == "conv" else None
        proj = self.proj[patch_key(subnet.stem, subnet.patch)]
        row, col = self.row[f"g{s}"][:, :e], self.col[f"g{s}"][:, :e]
        return conv, linear_slice(proj, proj.in_features, e), row, col, norm_slice(self.ln_f, e), linear_slice(
            self.head, e, self.space.classes)

    def forward(self, x: Tensor, subnet: VisionSubnet) -> Tensor:
        """x (B, C, H, W) in [0, 1] -> logits (B, 1, classes) of ``subnet``."""
        self._check(subnet)
        check_images(x, self.space)
        conv, proj, row, col, ln, head = self._weights(subnet)
        h = embed_image(x, subnet.resolution, subnet.patch, conv, proj, row, col)  # (B, T, E)
        for i, (blk, layer, keep) in enumerate(zip(self.blocks, subnet.layers, subnet.keeps)):
            h = keep_tokens(h, self._score(i, subnet.embed_dim, keep), keep,
                            lambda t, blk=blk, layer=layer: blk(t, layer, None, causal=False)[0])  # (B, T, E)
        return classify(h, ln, head)

    def _score(self, i: int, e: int, keep: float) -> Pair | None:
        """Layer ``i``'s token score at width ``e`` (None when it keeps every token)."""
        return linear_slice(self.scores[i], e, 1) if keep < 1 else None

    def num_params(self, subnet: VisionSubnet) -> int:
        """Parameters of ``subnet``'s static model (what :meth:`extract` returns holds exactly this many)."""
        self.space.check(subnet)
        conv, proj, row, col, ln, head = self._weights(subnet)
        n = sum(t.numel() for t in (*(conv or ()), *proj, row, col, *ln, *head))
        n += sum(subnet.embed_dim + 1 for v in subnet.keeps if v < 1)  # the token scores
        return n + sum(blk.num_params(subnet.embed_dim, layer) for blk, layer in zip(self.blocks, subnet.layers))

    @torch.no_grad()
    def extract(self, subnet: VisionSubnet) -> ViT:
        """The static :class:`ViT` of ``subnet`` with copied (not shared) weights."""
        device = self.head.weight.device
        static = ViT(self.space, subnet).to(device)
        conv, proj, row, col, ln, head = self._weights(subnet)
        pairs = [((static.proj.weight, static.proj.bias), proj), ((static.ln_f.weight, static.ln_f.bias), ln),
                 ((static.head.weight, static.head.bias), head)]  # fmt: skip
        if conv is not None:
            pairs.append(((static.stem.weight, static.stem.bias), conv))
        for dst, src in pairs:
            copy_into(dst[0], src[0])
            copy_into(dst[1], src[1])
        copy_into(static.row, row)
        copy_into(static.col, col)
        for dst_blk, src_blk in zip(static.blocks, self.blocks):
            src_blk.extract_into(dst_blk)
        for i, score in static.scores.items():
            w, b = self._score(int(i), subnet.embed_dim, 0.0)
            copy_into(score.weight, w)
            copy_into(score.bias, b)
        return static.eval()
