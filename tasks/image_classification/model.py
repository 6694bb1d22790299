"""The vision Transformer of an image-classification space: the elastic supernet and the static model, one forward.

``x`` (B, C, H, W) floats in [0, 1] (the data's size) -> logits (B, 1, classes): one scored position per image, so
the generic learners, held-out scores and distillation (:mod:`supernet.task`, :mod:`supernet.heldout`) score it as a
sequence whose one position is the label.  The steps, written once as pure functions of explicit weights
(:func:`embed_image`, :func:`classify`) and shared by both models:

1. normalise (``(x - 0.5) / 0.5``), resize to the subnet's resolution (bilinear) when it differs from the data's;
2. the stem (:func:`stem_map`): ``conv``, a 3 x 3 convolution (padding 1) to ``stem_channels`` channels, GELU;
   ``cct`` (CCT's convolutional tokenizer), the same convolution with its own weights, ReLU, a 3 x 3 max-pool of
   stride 2 (padding 1): the map is half the size, its patches half the size, the grid the same; ``linear``: none;
3. cut the S x S patches in **row-major order** (token ``t`` = row ``t // S``, column ``t % S``), map each patch's
   values linearly to the width E;
4. add 2D positions: a learned row embedding plus a learned column embedding (S, E) each, one pair per grid size;
5. with ``pool: cls``, put a learned class token (no position) before the grid: T + 1 tokens;
6. the encoder blocks (:func:`supernet.model.block`, bidirectional, no rotary positions) over the tokens (a layer
   keeping a share < 1 of the grid runs its block on its best-scored grid tokens, and the class token, only:
   :mod:`.tokens`);
7. the final norm, the pooling (:func:`pool_tokens`: the mean over the tokens; CCT's sequence pooling, a softmax over
   the tokens of a learned linear score weighting their sum; or the class token's output), a linear head.

The elastic model (:class:`SuperViT`) holds each weight at its largest shape and slices the leading block (a patch
embedding per (stem, patch) pair and a position pair per grid size, at the widest E; the class token and the sequence
pooling's score at the widest E); :meth:`SuperViT.extract` copies the slices into the static :class:`ViT` of the
subnet, which computes the same numbers.
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


def stem_map(x: Tensor, stem: str, conv: Pair | None, patch: int) -> tuple[Tensor, int]:
    """(the map the patches are cut from, their size): the image itself (``linear``), its 3 x 3 convolution and GELU
    (``conv``), or CCT's tokenizer, the convolution, ReLU and a 3 x 3 max-pool of stride 2, then patches of half the
    size (``cct``: the same grid)."""
    if stem == "linear":
        return x, patch
    x = F.conv2d(x, *conv, padding=1)  # (B, stem_channels, R, R)
    if stem == "conv":
        return F.gelu(x), patch
    return F.max_pool2d(F.relu(x), 3, stride=2, padding=1), patch // 2  # (B, stem_channels, R / 2, R / 2)


def embed_image(x: Tensor, resolution: int, patch: int, conv: Pair | None, proj: Pair, row: Tensor, col: Tensor,
                stem: str | None = None) -> Tensor:
    """Images (B, C, H, W) in [0, 1] -> patch tokens with 2D positions (B, T, E) (steps 1-4 of the module doc);
    ``stem`` None: ``conv`` when ``conv`` is given, else ``linear``."""
    x = (x - 0.5) / 0.5
    if x.shape[-1] != resolution or x.shape[-2] != resolution:
        x = F.interpolate(x, size=(resolution, resolution), mode="bilinear", align_corners=False)
    x, cut = stem_map(x, stem or ("conv" if conv is not None else "linear"), conv, patch)
    tokens = F.linear(patches(x, cut), *proj)  # (B, T, E)
    s, e = row.shape
    pos = (row[:, None, :] + col[None, :, :]).reshape(s * s, e)  # (T, E): row i, column j at i * S + j
    return tokens + pos


def with_class_token(x: Tensor, token: Tensor | None) -> Tensor:
    """(B, T, E) -> (B, T + 1, E) with the class token (1, 1, E) first; unchanged without one."""
    if token is None:
        return x
    return torch.cat([token.expand(x.shape[0], 1, x.shape[2]), x], dim=1)


def pool_tokens(h: Tensor, pool: str, score: Pair | None = None) -> Tensor:
    """(B, T, E) normed outputs -> (B, 1, E): their ``mean``; ``seq``, their sum weighted by a softmax over the tokens of
    the linear ``score`` (E -> 1; CCT's sequence pooling); ``cls``, the first token's (the class token's)."""
    if pool == "cls":
        return h[:, :1]
    if pool == "seq":
        weights = torch.softmax(F.linear(h, *score), dim=1)  # (B, T, 1)
        return (weights * h).sum(1, keepdim=True)  # (B, 1, E)
    return h.mean(1, keepdim=True)


def classify(x: Tensor, ln: Pair, head: Pair, pool: str = "mean", score: Pair | None = None) -> Tensor:
    """(B, T, E) -> logits (B, 1, classes): final norm, the pooling (:func:`pool_tokens`), linear head."""
    h = pool_tokens(F.layer_norm(x, (x.shape[-1],), *ln), pool, score)  # (B, 1, E)
    return F.linear(h, *head)


def leading(subnet: VisionSubnet) -> int:
    """Tokens before the grid that every layer runs whatever its share (:func:`.tokens.keep_tokens`' ``always``): the
    class token with ``pool: cls`` (its output is what the head reads), none otherwise."""
    return int(subnet.pool == "cls")


def check_images(x: Tensor, space: VisionSpace) -> None:
    want = (space.channels, space.image_size, space.image_size)
    if x.dim() != 4 or tuple(x.shape[1:]) != want or not x.is_floating_point():
        raise ValueError(f"expected float images of shape (batch, {', '.join(map(str, want))}), got {tuple(x.shape)} {x.dtype}")


def patch_key(stem: str, patch: int) -> str:
    return f"{stem}{patch}"


def stem_in(space: VisionSpace, stem: str) -> int:
    """Channels the patch embedding reads: the image's (linear stem) or the conv / cct stem's."""
    return space.stem_channels if stem in ("conv", "cct") else space.channels


def patch_inputs(space: VisionSpace, stem: str, patch: int) -> int:
    """Values of one patch the patch embedding maps to E: channels x its pixels (a cct patch is half the size)."""
    cut = patch // 2 if stem == "cct" else patch
    return stem_in(space, stem) * cut * cut


# --------------------------------------------------------------------------- static


class ViT(nn.Module):
    """The static vision Transformer of one subnet (what extraction returns and what trains from scratch)."""

    def __init__(self, space: VisionSpace, subnet: VisionSubnet, generator: torch.Generator | None = None):
        super().__init__()
        self.space, self.subnet = space, space.check(subnet)
        e, p, s = subnet.embed_dim, subnet.patch, subnet.grid
        self.stem = nn.Conv2d(space.channels, space.stem_channels, 3, padding=1) if subnet.stem != "linear" else None
        self.proj = nn.Linear(patch_inputs(space, subnet.stem, p), e)
        self.row, self.col = nn.Parameter(torch.empty(s, e)), nn.Parameter(torch.empty(s, e))
        self.blocks = nn.ModuleList(Block(e, space.head_dim, layer, space.max_seq_len) for layer in subnet.layers)
        self.scores = nn.ModuleDict({str(i): nn.Linear(e, 1) for i, v in enumerate(subnet.keeps) if v < 1})  # token scores
        self.ln_f = nn.LayerNorm(e)
        self.head = nn.Linear(e, space.classes)
        # the pooling's own weights, only where the subnet pools so (a mean-pooled model's weights as before)
        self.cls_token = nn.Parameter(torch.empty(1, 1, e)) if subnet.pool == "cls" else None
        self.pool_score = nn.Linear(e, 1) if subnet.pool == "seq" else None
        init_weights(self, n_layers=subnet.depth, generator=generator)

    def forward(self, x: Tensor) -> Tensor:
        """x (B, C, H, W) in [0, 1] -> logits (B, 1, classes)."""
        check_images(x, self.space)
        conv = (self.stem.weight, self.stem.bias) if self.stem is not None else None
        s = self.subnet
        h = embed_image(x, s.resolution, s.patch, conv, (self.proj.weight, self.proj.bias), self.row, self.col,
                        s.stem)  # (B, T, E)
        h = with_class_token(h, self.cls_token)  # (B, T + 1, E) with pool cls
        for i, (blk, keep) in enumerate(zip(self.blocks, s.keeps)):
            rank = (self.scores[str(i)].weight, self.scores[str(i)].bias) if keep < 1 else None
            h = keep_tokens(h, rank, keep, lambda t, blk=blk: blk(t, None, causal=False)[0], always=leading(s))
        score = (self.pool_score.weight, self.pool_score.bias) if self.pool_score is not None else None
        return classify(h, (self.ln_f.weight, self.ln_f.bias), (self.head.weight, self.head.bias), s.pool, score)

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
        self.proj = nn.ModuleDict({patch_key(st, p): nn.Linear(patch_inputs(space, st, p), e)
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
        # weights of the choices beyond the first stems and the mean pooling, only where the space lists them (the
        # supernets of spaces from before keep their weights and their seeded initialisation)
        self.tokenizer = nn.Conv2d(space.channels, space.stem_channels, 3, padding=1) if "cct" in space.stems else None
        self.cls_token = nn.Parameter(torch.empty(1, 1, e)) if "cls" in space.pools else None
        self.pool_score = nn.Linear(e, 1) if "seq" in space.pools else None
        init_weights(self, n_layers=space.max_depth, generator=generator)
        self._check = lru_cache(maxsize=4096)(space.check)

    def _weights(self, subnet: VisionSubnet) -> tuple:
        e, s = subnet.embed_dim, subnet.grid
        conv_layer = {"conv": self.stem, "cct": self.tokenizer}.get(subnet.stem)
        conv = (conv_layer.weight, conv_layer.bias) if conv_layer is not None else None
        proj = self.proj[patch_key(subnet.stem, subnet.patch)]
        row, col = self.row[f"g{s}"][:, :e], self.col[f"g{s}"][:, :e]
        token = self.cls_token[:, :, :e] if subnet.pool == "cls" else None
        score = linear_slice(self.pool_score, e, 1) if subnet.pool == "seq" else None
        return (conv, linear_slice(proj, proj.in_features, e), row, col, norm_slice(self.ln_f, e),
                linear_slice(self.head, e, self.space.classes), token, score)

    def forward(self, x: Tensor, subnet: VisionSubnet) -> Tensor:
        """x (B, C, H, W) in [0, 1] -> logits (B, 1, classes) of ``subnet``."""
        self._check(subnet)
        check_images(x, self.space)
        conv, proj, row, col, ln, head, token, score = self._weights(subnet)
        h = embed_image(x, subnet.resolution, subnet.patch, conv, proj, row, col, subnet.stem)  # (B, T, E)
        h = with_class_token(h, token)  # (B, T + 1, E) with pool cls
        for i, (blk, layer, keep) in enumerate(zip(self.blocks, subnet.layers, subnet.keeps)):
            h = keep_tokens(h, self._score(i, subnet.embed_dim, keep), keep,
                            lambda t, blk=blk, layer=layer: blk(t, layer, None, causal=False)[0], always=leading(subnet))
        return classify(h, ln, head, subnet.pool, score)

    def _score(self, i: int, e: int, keep: float) -> Pair | None:
        """Layer ``i``'s token score at width ``e`` (None when it keeps every token)."""
        return linear_slice(self.scores[i], e, 1) if keep < 1 else None

    def num_params(self, subnet: VisionSubnet) -> int:
        """Parameters of ``subnet``'s static model (what :meth:`extract` returns holds exactly this many)."""
        self.space.check(subnet)
        conv, proj, row, col, ln, head, token, score = self._weights(subnet)
        n = sum(t.numel() for t in (*(conv or ()), *proj, row, col, *ln, *head, *((token,) if token is not None else ()),
                                    *(score or ())))
        n += sum(subnet.embed_dim + 1 for v in subnet.keeps if v < 1)  # the token scores
        return n + sum(blk.num_params(subnet.embed_dim, layer) for blk, layer in zip(self.blocks, subnet.layers))

    @torch.no_grad()
    def extract(self, subnet: VisionSubnet) -> ViT:
        """The static :class:`ViT` of ``subnet`` with copied (not shared) weights."""
        device = self.head.weight.device
        static = ViT(self.space, subnet).to(device)
        conv, proj, row, col, ln, head, token, score = self._weights(subnet)
        pairs = [((static.proj.weight, static.proj.bias), proj), ((static.ln_f.weight, static.ln_f.bias), ln),
                 ((static.head.weight, static.head.bias), head)]  # fmt: skip
        if conv is not None:
            pairs.append(((static.stem.weight, static.stem.bias), conv))
        if score is not None:
            pairs.append(((static.pool_score.weight, static.pool_score.bias), score))
        if token is not None:
            copy_into(static.cls_token, token)
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
