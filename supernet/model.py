"""The static Transformer: a plain decoder-only causal LM of one fixed shape, and the one block function.

This is the model users ship.  It is what ``extract(supernet, subnet)`` returns,
and the same class a from-scratch model of that shape uses:
``Transformer(TransformerConfig.from_subnet(space, subnet))``.

The block (attention + MLP, pre-norm) is written once, :func:`block`, as a function of explicit
weights (:class:`BlockWeights`) and an optional decoding cache.  The static :class:`Block`, the
elastic supernet (:mod:`supernet.elastic`, with weight slices), prefill and the decode step
(:mod:`supernet.decode`) and the ONNX timing graphs (:mod:`latency.onnx_graphs`, weights as
graph inputs) all call it.  What differs between attention types lives in the type object
(:mod:`supernet.attention`); the block asks it for its heads, rotary heads and mixing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from search_spaces import LayerChoice, Space, Subnet, UserError
from search_spaces.attention import AttentionSpec

from .attention import AttentionType, State, attend, get
from .memory import detach_memory

INIT_STD = 0.02
Pair = tuple[Tensor, Tensor]  # (weight, bias)


# --------------------------------------------------------------------------- positions


def rope_at(positions: Tensor, head_dim: int, base: float = 10000.0) -> tuple[Tensor, Tensor]:
    """cos, sin of shape (T, head_dim // 2) for integer ``positions`` (T,), any position (also past max_seq_len).

    The same float32 arithmetic as :func:`rope_tables`, so a row computed here equals the table's row.
    """
    inv_freq = 1.0 / base ** (torch.arange(0, head_dim, 2, dtype=torch.float32, device=positions.device) / head_dim)
    angles = positions.to(torch.float32)[:, None] * inv_freq[None, :]  # (T, D/2)
    return angles.cos(), angles.sin()


def rope_tables(max_seq_len: int, head_dim: int, base: float = 10000.0) -> tuple[Tensor, Tensor]:
    """cos, sin tables of shape (max_seq_len, head_dim // 2) for rotary positions."""
    return rope_at(torch.arange(max_seq_len), head_dim, base)


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate pairs (x[..., :D/2], x[..., D/2:]) of x (B, H, T, D) by position; cos/sin (T, D/2)."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)


def _rotate(x: Tensor, n: int, rope: tuple[Tensor, Tensor]) -> Tensor:
    """x (B, H, T, D) with rotary positions on its first n heads."""
    if n >= x.shape[1]:
        return apply_rope(x, *rope)
    if n <= 0:
        return x
    return torch.cat((apply_rope(x[:, :n], *rope), x[:, n:]), dim=1)


# --------------------------------------------------------------------------- the block


@dataclass(frozen=True)
class BlockWeights:
    """One block's weights as (weight, bias) pairs; ``k`` is None for a type without keys, ``mix`` the type's own."""

    ln1: Pair
    q: Pair
    k: Pair | None
    v: Pair
    o: Pair
    ln2: Pair
    fc1: Pair
    fc2: Pair
    mix: dict[str, Tensor]

    def named(self) -> dict[str, Tensor]:
        """The weights under their state-dict names within a block (``attn.q.weight``, ``attn.mix.conv``, ...)."""
        out = {}
        for name, pair in (("ln1", self.ln1), ("attn.q", self.q), ("attn.k", self.k), ("attn.v", self.v),
                           ("attn.o", self.o), ("ln2", self.ln2), ("mlp.fc1", self.fc1), ("mlp.fc2", self.fc2)):  # fmt: skip
            if pair is not None:
                out[f"{name}.weight"], out[f"{name}.bias"] = pair
        out.update({f"attn.mix.{n}": t for n, t in self.mix.items()})
        return out

    @classmethod
    def from_named(cls, w: dict[str, Tensor]) -> "BlockWeights":
        """The inverse of :meth:`named`."""
        pair = lambda name: (w[f"{name}.weight"], w[f"{name}.bias"]) if f"{name}.weight" in w else None  # noqa: E731
        mix = {n[len("attn.mix."):]: t for n, t in w.items() if n.startswith("attn.mix.")}
        return cls(pair("ln1"), pair("attn.q"), pair("attn.k"), pair("attn.v"), pair("attn.o"), pair("ln2"),
                   pair("mlp.fc1"), pair("mlp.fc2"), mix)  # fmt: skip


def block_weight_shapes(
    typ: AttentionType, spec: AttentionSpec, embed_dim: int, heads: int, ffn_dim: int, head_dim: int,
    max_seq_len: int | None = None,
) -> dict[str, tuple[int, ...]]:
    """The shapes of a block's weights by state-dict name (what :meth:`BlockWeights.named` holds)."""
    e, a, (hk, hv) = embed_dim, heads * head_dim, typ.heads(spec, heads)
    shapes = {"ln1.weight": (e,), "ln1.bias": (e,), "attn.q.weight": (a, e), "attn.q.bias": (a,)}
    if hk:
        shapes.update({"attn.k.weight": (hk * head_dim, e), "attn.k.bias": (hk * head_dim,)})
    shapes.update({"attn.v.weight": (hv * head_dim, e), "attn.v.bias": (hv * head_dim,), "attn.o.weight": (e, a),
                   "attn.o.bias": (e,), "ln2.weight": (e,), "ln2.bias": (e,), "mlp.fc1.weight": (ffn_dim, e),
                   "mlp.fc1.bias": (ffn_dim,), "mlp.fc2.weight": (e, ffn_dim), "mlp.fc2.bias": (e,)})  # fmt: skip
    shapes.update({f"attn.mix.{n}": s for n, s in typ.weights(spec, heads, head_dim, max_seq_len=max_seq_len).items()})
    return shapes


@dataclass(frozen=True)
class Prefill:
    """Run the block over a prompt and also return its decoding state (``capacity`` slots for growing caches)."""

    capacity: int


@dataclass(frozen=True)
class Step:
    """Run the block on one new token at ``position`` (1,) given the layer's ``state`` (see ``AttentionType.step``)."""

    state: State
    position: Tensor
    length: int | None


@dataclass(frozen=True)
class Extend:
    """Run the block on S new tokens at ``positions`` (S,) after the past in ``state``, a growing key/value cache
    holding exactly the past (a type that ``extends``): the cached decoder graph, functional."""

    state: State
    positions: Tensor


def _heads(x: Tensor, pair: Pair, head_dim: int) -> Tensor:
    """Project x (B, T, E) and split heads: (B, heads, T, head_dim)."""
    b, t, _ = x.shape
    return F.linear(x, *pair).view(b, t, -1, head_dim).transpose(1, 2)


def block(
    x: Tensor,
    w: BlockWeights,
    spec: AttentionSpec,
    head_dim: int,
    rope: tuple[Tensor, Tensor] | None,
    cache: Prefill | Step | Extend | None = None,
    causal: bool = True,
) -> tuple[Tensor, State | None]:
    """One pre-norm block: x + attn(ln1(x)), then x + mlp(ln2(x)).  x (B, T, E) -> (B, T, E).

    ``rope``: cos, sin (T, head_dim/2) at the positions of x (None: learned positions).  ``cache``:
    None (a forward pass), :class:`Prefill` (a prompt: also returns the layer's decoding state),
    :class:`Step` (one token given the state: returns the next state) or :class:`Extend` (T new tokens after a
    key/value cache: returns it T entries longer).  ``causal``: the task's
    attention form (False: an encoder, every token sees every other; no decoding then).
    """
    x, state = attention_sublayer(x, w, spec, head_dim, rope, cache, causal)
    return mlp_sublayer(x, w), state


def attention_sublayer(
    x: Tensor,
    w: BlockWeights,
    spec: AttentionSpec,
    head_dim: int,
    rope: tuple[Tensor, Tensor] | None,
    cache: Prefill | Step | Extend | None = None,
    causal: bool = True,
) -> tuple[Tensor, State | None]:
    """The first half of :func:`block`: x + attn(ln1(x)) (an encoder-decoder's decoder puts its cross-attention
    between the two halves, :mod:`tasks.translation.model`)."""
    assert causal or cache is None, "an encoder (bidirectional attention) does not decode"
    typ = get(spec)
    b, t, e = x.shape
    h = F.layer_norm(x, (e,), *w.ln1)
    q, v = _heads(h, w.q, head_dim), _heads(h, w.v, head_dim)  # (B, H, T, hd), (B, Hv, T, hd)
    k = _heads(h, w.k, head_dim) if w.k is not None else None  # (B, Hk, T, hd)
    if rope is not None:
        n = typ.rotary_heads(spec, q.shape[1])
        q = _rotate(q, n, rope)
        k = _rotate(k, n, rope) if k is not None else None
    state = None
    if isinstance(cache, Step):
        y, state = typ.step(spec, cache.state, q, k, v, w.mix, cache.position, cache.length)  # (B, H, 1, hd)
    elif isinstance(cache, Extend):
        y, state = typ.extend(spec, cache.state, q, k, v, w.mix, cache.positions)  # (B, H, T, hd)
    else:
        y = attend(q, k, v, spec, w.mix, causal)  # (B, H, T, hd)
        if isinstance(cache, Prefill):
            state = typ.prefill_state(spec, q, k, v, w.mix, cache.capacity)
    return x + F.linear(y.transpose(1, 2).reshape(b, t, -1), *w.o), state  # (B, T, E)


def mlp_sublayer(x: Tensor, w: BlockWeights) -> Tensor:
    """The second half of :func:`block`: x + mlp(ln2(x)), (B, T, E) -> (B, T, E)."""
    h = F.layer_norm(x, (x.shape[-1],), *w.ln2)
    return x + F.linear(F.gelu(F.linear(h, *w.fc1)), *w.fc2)


def embed(idx: Tensor, tok: Tensor, pos: Tensor | None, positions: Tensor | None = None) -> Tensor:
    """Token (and learned position) embeddings of idx (B, T) -> (B, T, E); ``positions`` (T,) default 0..T-1."""
    x = F.embedding(idx, tok)  # (B, T, E)
    if pos is None:
        return x
    return x + (pos[: idx.shape[1]] if positions is None else F.embedding(positions, pos))


def lm_head(x: Tensor, ln: Pair, tok: Tensor) -> Tensor:
    """Final norm and the tied output projection: (B, T, E) -> (B, T, vocab)."""
    return F.linear(F.layer_norm(x, (x.shape[-1],), *ln), tok)


def check_tokens(idx: Tensor, vocab_size: int, max_seq_len: int) -> None:
    if idx.dim() != 2 or idx.dtype not in (torch.int64, torch.int32):
        raise UserError(f"expected token ids of shape (batch, seq_len) and an integer dtype, got {tuple(idx.shape)} {idx.dtype}")
    if idx.shape[1] > max_seq_len:
        raise UserError(f"sequence length {idx.shape[1]} exceeds max_seq_len {max_seq_len}")


# --------------------------------------------------------------------------- config


@dataclass(frozen=True)
class TransformerConfig:
    vocab_size: int
    max_seq_len: int
    head_dim: int
    positions: str  # "rope" or "learned"
    embed_dim: int
    layers: tuple[LayerChoice, ...]
    causal: bool = True  # the task's attention form: a causal LM (True) or a masked-LM encoder (False)
    vocab: int | None = None  # the subnet's vocabulary gene (a space that searches it); vocab_size is then that size
    memory: int = 0  # tokens of the previous segment a causal model keeps (supernet.memory; 0: none)

    @classmethod
    def from_subnet(cls, space: Space, subnet: Subnet) -> "TransformerConfig":
        space.check(subnet)
        vocab = space.vocab_of(subnet) if hasattr(space, "vocab_of") else space.vocab_size
        return cls(vocab, space.max_seq_len, space.head_dim, space.positions, subnet.embed_dim, subnet.layers,
                   space.causal, subnet.vocab, space.memory)  # fmt: skip

    @property
    def subnet(self) -> Subnet:
        return Subnet(
            self.embed_dim,
            len(self.layers),
            tuple(layer.heads for layer in self.layers),
            tuple(layer.ffn_dim for layer in self.layers),
            tuple(layer.attention for layer in self.layers),
            vocab=self.vocab,
        )


# --------------------------------------------------------------------------- modules


def _pair(m: nn.Linear | nn.LayerNorm | None) -> Pair | None:
    return None if m is None else (m.weight, m.bias)


class Attention(nn.Module):
    """The projections of one layer (q; k and v with the type's key / value heads; o) and the type's own weights."""

    def __init__(self, embed_dim: int, heads: int, head_dim: int, spec: AttentionSpec, max_seq_len: int | None = None):
        super().__init__()
        width = heads * head_dim
        self.heads, self.head_dim = heads, head_dim
        self.spec = spec
        self.typ = get(self.spec)
        hk, hv = self.typ.heads(self.spec, heads)
        self.q = nn.Linear(embed_dim, width)
        self.k = nn.Linear(embed_dim, hk * head_dim) if hk else None
        self.v = nn.Linear(embed_dim, hv * head_dim)
        self.o = nn.Linear(width, embed_dim)
        shapes = self.typ.weights(self.spec, heads, head_dim, max_seq_len=max_seq_len)
        self.mix = nn.ParameterDict({n: nn.Parameter(torch.empty(s)) for n, s in shapes.items()})
        if shapes and not self.q.weight.is_meta:
            # as nn.Linear does: a layer built alone holds no uninitialised memory (xca's temperature was garbage in
            # a bare Block); a private generator leaves the global one alone; init_weights sets them again, seeded
            g = torch.Generator(self.q.weight.device).manual_seed(0)
            with torch.no_grad():
                for typ, name, p in self.mix_params():
                    typ.init_weight(name, p, g)

    def mix_params(self):
        """(type, name, parameter) of the type's own weights (their initialisation is the type's)."""
        return [(self.typ, n, p) for n, p in self.mix.items()]


class MLP(nn.Module):
    def __init__(self, embed_dim: int, ffn_dim: int):
        super().__init__()
        self.fc1 = nn.Linear(embed_dim, ffn_dim)
        self.fc2 = nn.Linear(ffn_dim, embed_dim)


class Block(nn.Module):
    """Pre-norm block of one fixed shape; its forward is :func:`block` with its own weights."""

    def __init__(self, embed_dim: int, head_dim: int, layer: LayerChoice, max_seq_len: int | None = None):
        super().__init__()
        self.ln1 = nn.LayerNorm(embed_dim)
        self.attn = Attention(embed_dim, layer.heads, head_dim, layer.attention_spec, max_seq_len)
        self.ln2 = nn.LayerNorm(embed_dim)
        self.mlp = MLP(embed_dim, layer.ffn_dim)

    def weights(self) -> BlockWeights:
        a = self.attn
        return BlockWeights(_pair(self.ln1), _pair(a.q), _pair(a.k), _pair(a.v), _pair(a.o), _pair(self.ln2),
                            _pair(self.mlp.fc1), _pair(self.mlp.fc2), dict(a.mix))  # fmt: skip

    def forward(
        self, x: Tensor, rope: tuple[Tensor, Tensor] | None, cache: Prefill | Step | Extend | None = None, causal: bool = True
    ) -> tuple[Tensor, State | None]:
        return block(x, self.weights(), self.attn.spec, self.attn.head_dim, rope, cache, causal)


class Transformer(nn.Module):
    """Decoder-only causal LM (or, with ``config.causal`` False, a bidirectional encoder predicting
    every position's token: the masked-LM task); the LM head is tied to the token embedding."""

    def __init__(self, config: TransformerConfig, generator: torch.Generator | None = None):
        super().__init__()
        self.config = config
        e = config.embed_dim
        self.tok_emb = nn.Embedding(config.vocab_size, e)
        self.pos_emb = nn.Embedding(config.max_seq_len, e) if config.positions == "learned" else None
        self.blocks = nn.ModuleList(Block(e, config.head_dim, layer, config.max_seq_len) for layer in config.layers)
        self.ln_f = nn.LayerNorm(e)
        if config.positions == "rope":
            cos, sin = rope_tables(config.max_seq_len, config.head_dim)
            self.register_buffer("rope_cos", cos, persistent=False)
            self.register_buffer("rope_sin", sin, persistent=False)
        init_weights(self, n_layers=len(config.layers), generator=generator)

    @property
    def subnet(self) -> Subnet:
        return self.config.subnet

    def forward(self, idx: Tensor) -> Tensor:
        """idx (B, T) token ids -> logits (B, T, vocab)."""
        return lm_head(self.hidden(idx), _pair(self.ln_f), self.tok_emb.weight)  # (B, T, vocab)

    def hidden(self, idx: Tensor) -> Tensor:
        """idx (B, T) token ids -> the last block's output (B, T, E), before the final norm (a classifier pools it)."""
        check_tokens(idx, self.config.vocab_size, self.config.max_seq_len)
        t = idx.shape[1]
        x = embed(idx, self.tok_emb.weight, self.pos_emb.weight if self.pos_emb is not None else None)  # (B, T, E)
        rope = (self.rope_cos[:t], self.rope_sin[:t]) if self.pos_emb is None else None
        for blk in self.blocks:
            x, _ = blk(detach_memory(x, self.config.memory), rope, causal=self.config.causal)
        return x

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())


def init_weights(model: nn.Module, n_layers: int, generator: torch.Generator | None = None) -> None:
    """GPT-2 style: N(0, 0.02) for weights, zeros for biases, residual outputs scaled by 1/sqrt(2 n_layers);
    an attention type's own weights (``.mix.``) as the type says, after the rest."""
    for name, p in model.named_parameters():
        if ".mix." in name:
            continue
        if name.endswith("bias"):
            nn.init.zeros_(p)
        elif ".ln" in name or name.startswith("ln"):
            nn.init.ones_(p)
        else:
            std = INIT_STD / math.sqrt(2 * n_layers) if name.endswith(("o.weight", "fc2.weight")) else INIT_STD
            nn.init.normal_(p, mean=0.0, std=std, generator=generator)
    with torch.no_grad():
        for module in model.modules():
            if hasattr(module, "mix_params"):
                for typ, name, p in module.mix_params():
                    typ.init_weight(name, p, generator)
