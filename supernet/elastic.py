"""The weight-shared SuperTransformer and its elastic modules.

Every elastic module holds its weights at the maximum size of the space and, for
the active choice, uses the leading slice (the first ``out`` rows and ``in``
columns).  The choice is always passed in: ``model(idx, subnet)``,
``block(x, layer_choice)``; no module stores an "active" subnet.

The slices are taken by small pure functions (:func:`linear_slice`, ...), used
both by ``forward`` and by ``extract``, so the extracted static model computes
exactly what the supernet computes under that subnet.
"""

from __future__ import annotations

from functools import lru_cache

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from search_spaces import LayerChoice, Space, Subnet

from .attention import REGISTRY, get
from .memory import detach_memory
from .model import (
    MLP,
    Attention,
    Block,
    BlockWeights,
    Prefill,
    Step,
    Transformer,
    TransformerConfig,
    block,
    check_tokens,
    embed,
    init_weights,
    lm_head,
    rope_tables,
)

# --------------------------------------------------------------------------- slicing (pure)


def linear_slice(layer: nn.Linear, in_dim: int, out_dim: int) -> tuple[Tensor, Tensor | None]:
    """Leading (out_dim, in_dim) block of a max-size linear layer, and its bias."""
    assert in_dim <= layer.in_features and out_dim <= layer.out_features, (in_dim, out_dim, layer)
    bias = layer.bias[:out_dim] if layer.bias is not None else None
    return layer.weight[:out_dim, :in_dim], bias


def norm_slice(norm: nn.LayerNorm, dim: int) -> tuple[Tensor, Tensor]:
    assert dim <= norm.normalized_shape[0], (dim, norm)
    return norm.weight[:dim], norm.bias[:dim]


def embedding_slice(emb: nn.Embedding, dim: int, rows: int | None = None) -> Tensor:
    """The leading ``dim`` columns (and ``rows`` rows: a nested vocabulary's ids, ``supernet.tokenizer``) of an embedding."""
    assert dim <= emb.embedding_dim and (rows is None or rows <= emb.num_embeddings), (dim, rows, emb)
    return emb.weight[:rows, :dim]


def leading_slice(weight: Tensor, shape: tuple[int, ...]) -> Tensor:
    """The leading ``shape`` block of a max-size weight (an attention type's own weights)."""
    assert len(shape) == weight.dim() and all(s <= m for s, m in zip(shape, weight.shape)), (shape, tuple(weight.shape))
    return weight[tuple(slice(0, s) for s in shape)]


def linear_params(in_dim: int, out_dim: int, bias: bool = True) -> int:
    return in_dim * out_dim + (out_dim if bias else 0)


@torch.no_grad()
def copy_into(dst: Tensor, src: Tensor) -> None:
    """Copy a slice into a static parameter, asserting the shapes agree (no shared storage)."""
    assert dst.shape == src.shape, f"shape mismatch: {tuple(dst.shape)} vs {tuple(src.shape)}"
    dst.copy_(src)


def _copy_linear(dst: nn.Linear, src: nn.Linear) -> None:
    w, b = linear_slice(src, dst.in_features, dst.out_features)
    copy_into(dst.weight, w)
    copy_into(dst.bias, b)


def _copy_norm(dst: nn.LayerNorm, src: nn.LayerNorm) -> None:
    w, b = norm_slice(src, dst.normalized_shape[0])
    copy_into(dst.weight, w)
    copy_into(dst.bias, b)


# --------------------------------------------------------------------------- elastic modules


class ElasticLayerNorm(nn.LayerNorm):
    """LayerNorm over the leading ``x.shape[-1]`` features."""

    def forward(self, x: Tensor) -> Tensor:
        e = x.shape[-1]
        return F.layer_norm(x, (e,), *norm_slice(self, e), self.eps)

    def num_params(self, embed_dim: int) -> int:
        return 2 * embed_dim


def _max_shapes(space: Space) -> dict[str, dict[str, tuple[int, ...]]]:
    """Per attention kind of the space that has weights of its own: each weight's largest shape over
    the kind's spellings and the heads choices (the elastic weights slice their leading block)."""
    out: dict[str, dict[str, tuple[int, ...]]] = {}
    for spec in space.attention_specs:
        typ = get(spec)
        for h in space.heads:
            for name, shape in typ.weights(spec, h, space.head_dim, max_seq_len=space.max_seq_len).items():
                have = out.setdefault(typ.name, {}).get(name, shape)
                assert len(have) == len(shape), f"{typ.name}.{name}: shapes of different ranks {have}, {shape}"
                out[typ.name][name] = tuple(max(a, b) for a, b in zip(have, shape))
    return out


class _Weights(nn.Module):
    """One attention kind's own weights at their largest shapes."""

    def __init__(self, shapes: dict[str, tuple[int, ...]]):
        super().__init__()
        self.w = nn.ParameterDict({n: nn.Parameter(torch.empty(s)) for n, s in shapes.items()})


class Projections(nn.Module):
    """Q/K/V/O at max size (``heads`` x head_dim of them are active)."""

    def __init__(self, max_embed_dim: int, width: int):
        super().__init__()
        self.q = nn.Linear(max_embed_dim, width)
        self.k = nn.Linear(max_embed_dim, width)
        self.v = nn.Linear(max_embed_dim, width)
        self.o = nn.Linear(width, max_embed_dim)


PROJECTIONS = ("q", "k", "v", "o")


class ElasticAttention(nn.Module):
    """Q/K/V/O projections at max size (``heads`` x head_dim of them are active) and each attention
    kind's own weights at max size (``mix.<kind>``).  With ``families`` (a ``--split families`` supernet),
    also one set of Q/K/V/O per attention family (``fam.<family>``), which a layer uses once ``split`` is
    passed True (:meth:`SuperTransformer.split_families`); the shared ones serve before that."""

    def __init__(
        self, max_embed_dim: int, max_heads: int, head_dim: int, mix_shapes: dict[str, dict[str, tuple[int, ...]]],
        max_seq_len: int | None = None, families: tuple[str, ...] = (),
    ):
        super().__init__()
        width = max_heads * head_dim
        self.head_dim, self.max_seq_len = head_dim, max_seq_len
        self.q = nn.Linear(max_embed_dim, width)
        self.k = nn.Linear(max_embed_dim, width)
        self.v = nn.Linear(max_embed_dim, width)
        self.o = nn.Linear(width, max_embed_dim)
        self.mix = nn.ModuleDict({kind: _Weights(shapes) for kind, shapes in mix_shapes.items()})
        self.fam = nn.ModuleDict({f: Projections(max_embed_dim, width) for f in families}) if families else None

    def mix_params(self):
        return [(REGISTRY[kind], n, p) for kind, m in self.mix.items() for n, p in m.w.items()]

    def projections(self, family: str, split: bool) -> nn.Module:
        """The module whose q, k, v, o a layer of ``family`` uses: its family's once split, else the shared ones."""
        return self.fam[family] if split else self

    @torch.no_grad()
    def split_families(self) -> None:
        """Warm-start every family's Q/K/V/O from the shared ones."""
        for proj in self.fam.values():
            for name in PROJECTIONS:
                for a, b in zip(getattr(proj, name).parameters(), getattr(self, name).parameters()):
                    a.copy_(b)

    def slices(self, e: int, layer: LayerChoice, split: bool = False) -> tuple:
        """(q, k or None, v, o, mix) of ``layer`` at embedding width ``e``: leading slices."""
        spec, hd = layer.attention_spec, self.head_dim
        typ, a = get(spec), layer.heads * hd
        hk, hv = typ.heads(spec, layer.heads)
        shapes = typ.weights(spec, layer.heads, hd, max_seq_len=self.max_seq_len)
        mix = {n: leading_slice(self.mix[typ.name].w[n], s) for n, s in shapes.items()}
        p = self.projections(typ.family, split)
        k = linear_slice(p.k, e, hk * hd) if hk else None
        return linear_slice(p.q, e, a), k, linear_slice(p.v, e, hv * hd), linear_slice(p.o, a, e), mix

    def num_params(self, embed_dim: int, layer: LayerChoice) -> int:
        q, k, v, o, mix = self.slices(embed_dim, layer)
        return sum(t.numel() for pair in (q, k, v, o) if pair is not None for t in pair) + sum(t.numel() for t in mix.values())

    def extract_into(self, static: Attention, split: bool = False) -> None:
        p = self.projections(static.typ.family, split)
        for name in PROJECTIONS:
            if getattr(static, name) is not None:
                _copy_linear(getattr(static, name), getattr(p, name))
        for name, w in static.mix.items():
            copy_into(w, leading_slice(self.mix[static.typ.name].w[name], tuple(w.shape)))


class ElasticMLP(nn.Module):
    def __init__(self, max_embed_dim: int, max_ffn_dim: int):
        super().__init__()
        self.fc1 = nn.Linear(max_embed_dim, max_ffn_dim)
        self.fc2 = nn.Linear(max_ffn_dim, max_embed_dim)

    def num_params(self, embed_dim: int, ffn_dim: int) -> int:
        return linear_params(embed_dim, ffn_dim) + linear_params(ffn_dim, embed_dim)

    def extract_into(self, static: MLP) -> None:
        _copy_linear(static.fc1, self.fc1)
        _copy_linear(static.fc2, self.fc2)


class ElasticBlock(nn.Module):
    def __init__(self, space: Space, mix_shapes: dict[str, dict[str, tuple[int, ...]]], families: tuple[str, ...] = ()):
        super().__init__()
        e = space.max_embed_dim
        self.ln1 = ElasticLayerNorm(e)
        self.attn = ElasticAttention(e, space.max_heads, space.head_dim, mix_shapes, space.max_seq_len, families)
        self.ln2 = ElasticLayerNorm(e)
        self.mlp = ElasticMLP(e, space.max_ffn_dim)

    def weights(self, e: int, layer: LayerChoice, split: bool = False) -> BlockWeights:
        """The block's weights for ``layer`` at embedding width ``e``: leading slices, no copies."""
        q, k, v, o, mix = self.attn.slices(e, layer, split)
        f = layer.ffn_dim
        fc1, fc2 = linear_slice(self.mlp.fc1, e, f), linear_slice(self.mlp.fc2, f, e)
        return BlockWeights(norm_slice(self.ln1, e), q, k, v, o, norm_slice(self.ln2, e), fc1, fc2, mix)

    def forward(
        self, x: Tensor, layer: LayerChoice, rope: tuple[Tensor, Tensor] | None, cache: Prefill | Step | None = None,
        causal: bool = True, split: bool = False,
    ):
        w = self.weights(x.shape[-1], layer, split)
        return block(x, w, layer.attention_spec, self.attn.head_dim, rope, cache, causal)

    def num_params(self, embed_dim: int, layer: LayerChoice) -> int:
        return (
            self.ln1.num_params(embed_dim)
            + self.attn.num_params(embed_dim, layer)
            + self.ln2.num_params(embed_dim)
            + self.mlp.num_params(embed_dim, layer.ffn_dim)
        )

    def extract_into(self, static: Block, split: bool = False) -> None:
        _copy_norm(static.ln1, self.ln1)
        _copy_norm(static.ln2, self.ln2)
        self.attn.extract_into(static.attn, split)
        self.mlp.extract_into(static.mlp)


def space_families(space: Space) -> tuple[str, ...]:
    """The attention families of the space's types, in the order the space first lists one of each."""
    return tuple(dict.fromkeys(get(spec).family for spec in space.attention_specs))


class SuperTransformer(nn.Module):
    """All subnets of ``space`` in one set of weights. ``forward(idx, subnet)`` runs one of them.

    ``split_families=True`` (a ``--split families`` run): each block also holds one Q/K/V/O per attention family of
    the space; :meth:`split_families` warm-starts them from the shared ones and from then on each layer uses its
    family's (the state is the buffer ``families_split``, saved with the weights).  Extraction copies what the
    subnet's layers use, so the static model is the same class either way."""

    def __init__(self, space: Space, generator: torch.Generator | None = None, split_families: bool = False):
        super().__init__()
        self.space = space
        e = space.max_embed_dim
        self.tok_emb = nn.Embedding(space.vocab_size, e)
        self.pos_emb = nn.Embedding(space.max_seq_len, e) if space.positions == "learned" else None
        mix_shapes = _max_shapes(space)
        self.families = space_families(space) if split_families else ()
        self.blocks = nn.ModuleList(ElasticBlock(space, mix_shapes, self.families) for _ in range(space.max_depth))
        self.ln_f = ElasticLayerNorm(e)
        if space.positions == "rope":
            cos, sin = rope_tables(space.max_seq_len, space.head_dim)
            self.register_buffer("rope_cos", cos, persistent=False)
            self.register_buffer("rope_sin", sin, persistent=False)
        init_weights(self, n_layers=space.max_depth, generator=generator)
        self._check = lru_cache(maxsize=4096)(space.check)
        self._split = False  # a Python copy of the buffer below (no tensor read in forward: torch.compile keeps one graph)
        if self.families:
            self.register_buffer("split_state", torch.zeros((), dtype=torch.bool))  # saved with the weights
            self.register_load_state_dict_post_hook(lambda module, keys: module._sync_split())

    def _sync_split(self) -> None:
        self._split = bool(self.split_state)

    @property
    def families_split(self) -> bool:
        """Whether each attention family uses its own Q/K/V/O now."""
        return self._split

    @torch.no_grad()
    def split_families(self) -> None:
        """From now on each attention family uses its own Q/K/V/O, copied from the shared ones."""
        assert self.families, "a supernet built without split_families"
        for blk in self.blocks:
            blk.attn.split_families()
        self.split_state.fill_(True)
        self._split = True

    def forward(self, idx: Tensor, subnet: Subnet) -> Tensor:
        """idx (B, T) token ids -> logits (B, T, vocab) of ``subnet``."""
        self._check(subnet)
        check_tokens(idx, self.space.vocab_size, self.space.max_seq_len)
        e, t = subnet.embed_dim, idx.shape[1]
        tok = embedding_slice(self.tok_emb, e, self.space.vocab_of(subnet))  # (V, E): the subnet's vocabulary's rows
        x = embed(idx, tok, embedding_slice(self.pos_emb, e) if self.pos_emb is not None else None)  # (B, T, E)
        rope = (self.rope_cos[:t], self.rope_sin[:t]) if self.pos_emb is None else None
        for blk, layer in zip(self.blocks, subnet.layers):
            x, _ = blk(detach_memory(x, self.space.memory), layer, rope, causal=self.space.causal, split=self._split)
        return lm_head(x, norm_slice(self.ln_f, e), tok)  # (B, T, vocab), tied head

    def num_params(self, subnet: Subnet) -> int:
        """Parameters of ``subnet`` (as a static model: what ``extract`` returns holds exactly this many)."""
        self.space.check(subnet)
        e = subnet.embed_dim
        n = self.space.vocab_of(subnet) * e + self.ln_f.num_params(e)
        if self.pos_emb is not None:
            n += self.space.max_seq_len * e
        return n + sum(block.num_params(e, layer) for block, layer in zip(self.blocks, subnet.layers))

    @torch.no_grad()
    def extract(self, subnet: Subnet) -> Transformer:
        """A static :class:`Transformer` of ``subnet`` with copied (not shared) weights."""
        config = TransformerConfig.from_subnet(self.space, subnet)
        static = Transformer(config).to(self.tok_emb.weight.device)
        e = subnet.embed_dim
        copy_into(static.tok_emb.weight, embedding_slice(self.tok_emb, e, config.vocab_size))
        if self.pos_emb is not None:
            copy_into(static.pos_emb.weight, embedding_slice(self.pos_emb, e))
        _copy_norm(static.ln_f, self.ln_f)
        for blk, static_block in zip(self.blocks, static.blocks):
            blk.extract_into(static_block, self._split)
        return static.train(self.training)


def extract(supernet: SuperTransformer, subnet: Subnet) -> Transformer:
    """The static model of ``subnet``; its outputs equal ``supernet(idx, subnet)``."""
    return supernet.extract(subnet)
