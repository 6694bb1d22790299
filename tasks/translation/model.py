"""Encoder-decoder Transformers for translation: the elastic supernet, the static model, and one forward.

Both models hand their weights to the same pure functions as a :class:`TranslationWeights` (the supernet
its leading slices for a subnet, the static model its own tensors), so the static model that
:meth:`TranslationSuperTransformer.extract` returns computes exactly what the supernet computes under
that subnet, and decoding (:mod:`tasks.translation.decode`) runs either.

* encoder layer: :func:`~supernet.model.block` with ``causal=False`` (bidirectional self-attention, MLP);
* decoder layer: :func:`~supernet.model.attention_sublayer` (causal self-attention, with the LM's
  decoding cache), :func:`cross_attention` (softmax over the encoder's memory, source padding
  masked), :func:`~supernet.model.mlp_sublayer`;
* HAT's arbitrary encoder-decoder attention, :func:`memory`: decoder layer i attends to the
  concatenation along the sequence of the final (normalised) encoder output and the raw outputs
  of the ``cross_layers[i] - 1`` encoder layers before the last (HAT's ``encoder_out``,
  ``encoder_out_all[-2]``, ``encoder_out_all[-3]``), its key padding mask repeated as many times.

Source and target ids are bytes plus PAD / BOS / EOS (:mod:`tasks.translation.data`).  The decoder's
output projection is tied to its token embedding.  Known limit: the encoder's self-attention
types take no padding mask, so in a padded batch a source sees the PAD bytes after it (batches
group similar lengths; translating one sentence pads nothing); cross-attention masks them.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from search_spaces import LayerChoice, UserError
from search_spaces.attention import AttentionSpec
from supernet.attention import State
from supernet.elastic import (
    ElasticBlock,
    ElasticLayerNorm,
    _copy_linear,
    _copy_norm,
    _max_shapes,
    copy_into,
    embedding_slice,
    linear_slice,
    norm_slice,
)
from supernet.model import (
    Block,
    BlockWeights,
    Pair,
    Prefill,
    Step,
    _heads,
    _pair,
    attention_sublayer,
    block,
    embed,
    init_weights,
    lm_head,
    mlp_sublayer,
    rope_at,
)

from .data import BOS, PAD
from .space import TranslationSpace, TranslationSubnet

# --------------------------------------------------------------------------- the functions


@dataclass(frozen=True)
class CrossWeights:
    """One decoder layer's cross-attention: its pre-norm, q from the decoder's width, k and v from the encoder's, o."""

    ln: Pair
    q: Pair
    k: Pair
    v: Pair
    o: Pair


@dataclass(frozen=True)
class TranslationWeights:
    """Everything a forward pass reads, for one architecture (tensors, possibly views of a supernet's)."""

    head_dim: int
    positions: str  # "rope" or "learned"
    enc_tok: Tensor  # (V, Ee)
    enc_pos: Tensor | None  # (max_seq_len, Ee) for learned positions
    enc_blocks: tuple[BlockWeights, ...]
    enc_specs: tuple[AttentionSpec, ...]
    ln_enc: Pair
    dec_tok: Tensor  # (V, Ed), also the output projection
    dec_pos: Tensor | None
    dec_blocks: tuple[BlockWeights, ...]
    dec_specs: tuple[AttentionSpec, ...]
    cross: tuple[CrossWeights, ...]
    cross_layers: tuple[int, ...]
    ln_dec: Pair


@dataclass(frozen=True)
class Memory:
    """What the decoder reads from one encoded batch: per decoder layer its cross keys and values (B, H, k*S, hd)
    and key mask (B, 1, 1, k*S), True where a source byte is real.  Computed once per source."""

    kv: tuple[tuple[Tensor, Tensor], ...]
    mask: tuple[Tensor, ...]

    def select(self, index: Tensor) -> "Memory":
        """The memory of the batch rows ``index`` (beam search: each hypothesis its source's row)."""
        return Memory(tuple((k[index], v[index]) for k, v in self.kv), tuple(m[index] for m in self.mask))


def _rope(w: TranslationWeights, positions: Tensor) -> tuple[Tensor, Tensor] | None:
    return rope_at(positions, w.head_dim) if w.positions == "rope" else None


def encode(w: TranslationWeights, src: Tensor) -> tuple[Tensor, list[Tensor]]:
    """src (B, S) -> the final normalised output (B, S, Ee) and every encoder layer's raw output."""
    positions = torch.arange(src.shape[1], device=src.device)
    x = embed(src, w.enc_tok, w.enc_pos, positions if w.enc_pos is not None else None)  # (B, S, Ee)
    rope = _rope(w, positions)
    outs = []
    for bw, spec in zip(w.enc_blocks, w.enc_specs):
        x, _ = block(x, bw, spec, w.head_dim, rope, causal=False)
        outs.append(x)
    return F.layer_norm(x, (x.shape[-1],), *w.ln_enc), outs


def memory(final: Tensor, outs: list[Tensor], k: int) -> Tensor:
    """HAT's arbitrary encoder-decoder attention: the final output and the raw outputs of the ``k - 1`` layers
    before the last, concatenated along the sequence: (B, k*S, Ee)."""
    assert 1 <= k <= len(outs), (k, len(outs))
    return torch.cat([final] + [outs[-i] for i in range(2, k + 1)], dim=1)


def cross_kv(c: CrossWeights, mem: Tensor, head_dim: int) -> tuple[Tensor, Tensor]:
    """Cross-attention keys and values of a memory (B, M, Ee): (B, H, M, hd) each."""
    return _heads(mem, c.k, head_dim), _heads(mem, c.v, head_dim)


def cross_attention(x: Tensor, c: CrossWeights, kv: tuple[Tensor, Tensor], mask: Tensor, head_dim: int) -> Tensor:
    """x + softmax cross-attention of ln(x) (B, T, Ed) over the memory's keys / values, padding masked (B, 1, 1, M)."""
    b, t, e = x.shape
    q = _heads(F.layer_norm(x, (e,), *c.ln), c.q, head_dim)  # (B, H, T, hd)
    y = F.scaled_dot_product_attention(q, kv[0], kv[1], attn_mask=mask)  # (B, H, T, hd)
    return x + F.linear(y.transpose(1, 2).reshape(b, t, -1), *c.o)  # (B, T, Ed)


def encode_memory(w: TranslationWeights, src: Tensor) -> Memory:
    """Encode src (B, S) and compute every decoder layer's cross keys and values once."""
    final, outs = encode(w, src)
    real = (src != PAD)[:, None, None, :]  # (B, 1, 1, S)
    kv, masks = [], []
    for c, k in zip(w.cross, w.cross_layers):
        kv.append(cross_kv(c, memory(final, outs, k), w.head_dim))
        masks.append(real.repeat(1, 1, 1, k))  # (B, 1, 1, k*S)
    return Memory(tuple(kv), tuple(masks))


def decode(
    w: TranslationWeights, tgt: Tensor, mem: Memory, start: int = 0, caches: list[Prefill | Step] | None = None
) -> tuple[Tensor, list[State | None]]:
    """Decoder inputs tgt (B, T) at positions start.. -> logits (B, T, V), and each layer's self-attention state
    (``caches``: per layer None for a plain pass, :class:`Prefill` or :class:`Step`, as :func:`~supernet.model.block`)."""
    positions = torch.arange(start, start + tgt.shape[1], device=tgt.device)
    x = embed(tgt, w.dec_tok, w.dec_pos, positions if w.dec_pos is not None else None)  # (B, T, Ed)
    rope = _rope(w, positions)
    states = []
    for i, (bw, spec, c) in enumerate(zip(w.dec_blocks, w.dec_specs, w.cross)):
        x, state = attention_sublayer(x, bw, spec, w.head_dim, rope, None if caches is None else caches[i])
        x = cross_attention(x, c, mem.kv[i], mem.mask[i], w.head_dim)
        x = mlp_sublayer(x, bw)
        states.append(state)
    return lm_head(x, w.ln_dec, w.dec_tok), states  # (B, T, V), tied head


def forward(w: TranslationWeights, src: Tensor, tgt: Tensor) -> Tensor:
    """Teacher forcing: source (B, S) and decoder inputs (B, T) (BOS + target) -> logits (B, T, V)."""
    return decode(w, tgt, encode_memory(w, src))[0]


def check_ids(ids: Tensor, vocab_size: int, max_seq_len: int, what: str) -> None:
    if ids.dim() != 2 or ids.dtype not in (torch.int64, torch.int32):
        raise UserError(f"{what}: expected ids of shape (batch, length) and an integer dtype, got {tuple(ids.shape)} {ids.dtype}")
    if ids.shape[1] > max_seq_len:
        raise UserError(f"{what}: length {ids.shape[1]} exceeds max_seq_len {max_seq_len}")


# --------------------------------------------------------------------------- static model


class CrossAttention(nn.Module):
    def __init__(self, embed_dim: int, encoder_dim: int, heads: int, head_dim: int):
        super().__init__()
        width = heads * head_dim
        self.ln = nn.LayerNorm(embed_dim)
        self.q = nn.Linear(embed_dim, width)
        self.k = nn.Linear(encoder_dim, width)
        self.v = nn.Linear(encoder_dim, width)
        self.o = nn.Linear(width, embed_dim)

    def weights(self) -> CrossWeights:
        return CrossWeights(_pair(self.ln), _pair(self.q), _pair(self.k), _pair(self.v), _pair(self.o))


class TranslationTransformer(nn.Module):
    """An encoder-decoder of one fixed shape (``subnet`` of ``space``): what ``extract`` returns and users ship."""

    def __init__(self, space: TranslationSpace, subnet: TranslationSubnet, generator: torch.Generator | None = None):
        super().__init__()
        space.check(subnet)
        self.space, self.subnet = space, subnet
        enc, dec, hd = subnet.encoder, subnet.decoder, space.head_dim
        learned = space.positions == "learned"
        self.enc_tok = nn.Embedding(space.vocab_size, enc.embed_dim)
        self.enc_pos = nn.Embedding(space.max_seq_len, enc.embed_dim) if learned else None
        self.enc_blocks = nn.ModuleList(Block(enc.embed_dim, hd, layer) for layer in enc.layers)
        self.ln_enc = nn.LayerNorm(enc.embed_dim)
        self.dec_tok = nn.Embedding(space.vocab_size, dec.embed_dim)
        self.dec_pos = nn.Embedding(space.max_seq_len, dec.embed_dim) if learned else None
        self.dec_blocks = nn.ModuleList(Block(dec.embed_dim, hd, layer) for layer in dec.layers)
        self.cross = nn.ModuleList(CrossAttention(dec.embed_dim, enc.embed_dim, h, hd) for h in subnet.cross_heads)
        self.ln_dec = nn.LayerNorm(dec.embed_dim)
        init_weights(self, n_layers=enc.depth + dec.depth, generator=generator)

    def weights(self) -> TranslationWeights:
        s = self.subnet
        return TranslationWeights(
            self.space.head_dim, self.space.positions,
            self.enc_tok.weight, self.enc_pos.weight if self.enc_pos is not None else None,
            tuple(b.weights() for b in self.enc_blocks), tuple(b.attn.spec for b in self.enc_blocks), _pair(self.ln_enc),
            self.dec_tok.weight, self.dec_pos.weight if self.dec_pos is not None else None,
            tuple(b.weights() for b in self.dec_blocks), tuple(b.attn.spec for b in self.dec_blocks),
            tuple(c.weights() for c in self.cross), s.cross_layers, _pair(self.ln_dec),
        )  # fmt: skip

    def forward(self, src: Tensor, tgt: Tensor) -> Tensor:
        """src (B, S), decoder inputs tgt (B, T) -> logits (B, T, V)."""
        check_ids(src, self.space.vocab_size, self.space.max_seq_len, "source")
        check_ids(tgt, self.space.vocab_size, self.space.max_seq_len, "target")
        return forward(self.weights(), src, tgt)

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())


# --------------------------------------------------------------------------- the supernet


class ElasticCross(nn.Module):
    """A cross-attention at max size: q (max Ed -> max heads x hd), k / v (max Ee -> ...), o back to max Ed."""

    def __init__(self, max_embed_dim: int, max_encoder_dim: int, max_heads: int, head_dim: int):
        super().__init__()
        width = max_heads * head_dim
        self.head_dim = head_dim
        self.ln = ElasticLayerNorm(max_embed_dim)
        self.q = nn.Linear(max_embed_dim, width)
        self.k = nn.Linear(max_encoder_dim, width)
        self.v = nn.Linear(max_encoder_dim, width)
        self.o = nn.Linear(width, max_embed_dim)

    def weights(self, e: int, ee: int, heads: int) -> CrossWeights:
        a = heads * self.head_dim
        return CrossWeights(norm_slice(self.ln, e), linear_slice(self.q, e, a), linear_slice(self.k, ee, a),
                            linear_slice(self.v, ee, a), linear_slice(self.o, a, e))  # fmt: skip

    def extract_into(self, static: CrossAttention) -> None:
        _copy_norm(static.ln, self.ln)
        for name in ("q", "k", "v", "o"):
            _copy_linear(getattr(static, name), getattr(self, name))


class TranslationSuperTransformer(nn.Module):
    """All encoder-decoders of ``space`` in one set of weights; ``forward(src, tgt, subnet)`` runs one of them."""

    def __init__(self, space: TranslationSpace, generator: torch.Generator | None = None):
        super().__init__()
        self.space = space
        enc, dec = space.encoder, space.decoder
        learned = space.positions == "learned"
        self.enc_tok = nn.Embedding(space.vocab_size, enc.max_embed_dim)
        self.enc_pos = nn.Embedding(space.max_seq_len, enc.max_embed_dim) if learned else None
        self.enc_blocks = nn.ModuleList(ElasticBlock(enc, _max_shapes(enc)) for _ in range(enc.max_depth))
        self.ln_enc = ElasticLayerNorm(enc.max_embed_dim)
        self.dec_tok = nn.Embedding(space.vocab_size, dec.max_embed_dim)
        self.dec_pos = nn.Embedding(space.max_seq_len, dec.max_embed_dim) if learned else None
        self.dec_blocks = nn.ModuleList(ElasticBlock(dec, _max_shapes(dec)) for _ in range(dec.max_depth))
        self.cross = nn.ModuleList(
            ElasticCross(dec.max_embed_dim, enc.max_embed_dim, space.max_cross_heads, space.head_dim)
            for _ in range(dec.max_depth)
        )
        self.ln_dec = ElasticLayerNorm(dec.max_embed_dim)
        init_weights(self, n_layers=enc.max_depth + dec.max_depth, generator=generator)
        self._check = lru_cache(maxsize=4096)(space.check)

    def weights(self, subnet: TranslationSubnet) -> TranslationWeights:
        """The leading slices of ``subnet`` (views: gradients reach the shared weights)."""
        self._check(subnet)
        enc, dec = subnet.encoder, subnet.decoder
        ee, ed = enc.embed_dim, dec.embed_dim

        def blocks(mods, layers: tuple[LayerChoice, ...], e: int) -> tuple[BlockWeights, ...]:
            return tuple(m.weights(e, layer) for m, layer in zip(mods, layers))

        return TranslationWeights(
            self.space.head_dim, self.space.positions,
            embedding_slice(self.enc_tok, ee), embedding_slice(self.enc_pos, ee) if self.enc_pos is not None else None,
            blocks(self.enc_blocks, enc.layers, ee), enc.attention_specs, norm_slice(self.ln_enc, ee),
            embedding_slice(self.dec_tok, ed), embedding_slice(self.dec_pos, ed) if self.dec_pos is not None else None,
            blocks(self.dec_blocks, dec.layers, ed), dec.attention_specs,
            tuple(c.weights(ed, ee, h) for c, h in zip(self.cross, subnet.cross_heads)), subnet.cross_layers,
            norm_slice(self.ln_dec, ed),
        )  # fmt: skip

    def forward(self, src: Tensor, tgt: Tensor, subnet: TranslationSubnet) -> Tensor:
        """src (B, S), decoder inputs tgt (B, T) -> logits (B, T, V) of ``subnet``."""
        check_ids(src, self.space.vocab_size, self.space.max_seq_len, "source")
        check_ids(tgt, self.space.vocab_size, self.space.max_seq_len, "target")
        return forward(self.weights(subnet), src, tgt)

    def num_params(self, subnet: TranslationSubnet) -> int:
        """Parameters of ``subnet`` as a static model (what ``extract`` returns holds exactly this many)."""
        w = self.weights(subnet)
        tensors = [w.enc_tok, w.enc_pos, w.dec_tok, w.dec_pos, *w.ln_enc, *w.ln_dec]
        tensors += [t for b in w.enc_blocks + w.dec_blocks for t in b.named().values()]
        tensors += [t for c in w.cross for pair in (c.ln, c.q, c.k, c.v, c.o) for t in pair]
        return sum(t.numel() for t in tensors if t is not None)

    @torch.no_grad()
    def extract(self, subnet: TranslationSubnet) -> TranslationTransformer:
        """A static :class:`TranslationTransformer` of ``subnet`` with copied (not shared) weights."""
        static = TranslationTransformer(self.space, subnet).to(self.enc_tok.weight.device)
        ee, ed = subnet.encoder.embed_dim, subnet.decoder.embed_dim
        copy_into(static.enc_tok.weight, embedding_slice(self.enc_tok, ee))
        copy_into(static.dec_tok.weight, embedding_slice(self.dec_tok, ed))
        if self.enc_pos is not None:
            copy_into(static.enc_pos.weight, embedding_slice(self.enc_pos, ee))
            copy_into(static.dec_pos.weight, embedding_slice(self.dec_pos, ed))
        _copy_norm(static.ln_enc, self.ln_enc)
        _copy_norm(static.ln_dec, self.ln_dec)
        for mods, statics in ((self.enc_blocks, static.enc_blocks), (self.dec_blocks, static.dec_blocks),
                              (self.cross, static.cross)):  # fmt: skip
            for m, s in zip(mods, statics):
                m.extract_into(s)
        return static.train(self.training)


def decoder_start(batch: int, device: torch.device | str = "cpu") -> Tensor:
    """The decoder's first input: BOS per sequence, (B, 1)."""
    return torch.full((batch, 1), BOS, dtype=torch.long, device=device)


__all__ = ["Memory", "TranslationSuperTransformer", "TranslationTransformer", "TranslationWeights", "Step", "Prefill", "decode",
           "encode_memory", "forward", "memory"]  # fmt: skip
