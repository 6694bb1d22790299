"""The static Transformer: a plain decoder-only causal LM of one fixed shape.

This is the model users ship.  It is what ``extract(supernet, subnet)`` returns,
and the same class a from-scratch model of that shape uses:
``Transformer(TransformerConfig.from_subnet(space, subnet))``.

The math of each piece is written once, as a function of explicit weights
(``attention_forward``, ``mlp_forward``, ...), and shared with the elastic
modules in :mod:`supernet.elastic`, which call it with weight slices.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from search_spaces import LayerChoice, Space, Subnet, UserError, parse_attention
from search_spaces.attention import AttentionSpec, kv_heads

from .attention import attend

INIT_STD = 0.02


# --------------------------------------------------------------------------- shared math


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


def attention_forward(
    x: Tensor,
    q: tuple[Tensor, Tensor],
    k: tuple[Tensor, Tensor],
    v: tuple[Tensor, Tensor],
    o: tuple[Tensor, Tensor],
    heads: int,
    spec: AttentionSpec,
    rope: tuple[Tensor, Tensor] | None,
) -> Tensor:
    """Causal self-attention of x (B, T, E) with (weight, bias) pairs for the four projections.

    The key/value projections have ``kv_heads(spec, heads) * hd`` rows (fewer than the queries for gqa).
    """
    b, t, _ = x.shape
    hd = q[0].shape[0] // heads
    kvh = k[0].shape[0] // hd
    qh = F.linear(x, *q).view(b, t, heads, hd).transpose(1, 2)  # (B, H, T, hd)
    kh = F.linear(x, *k).view(b, t, kvh, hd).transpose(1, 2)  # (B, Hkv, T, hd)
    vh = F.linear(x, *v).view(b, t, kvh, hd).transpose(1, 2)  # (B, Hkv, T, hd)
    if rope is not None:
        cos, sin = rope[0][:t], rope[1][:t]
        qh, kh = apply_rope(qh, cos, sin), apply_rope(kh, cos, sin)
    y = attend(qh, kh, vh, spec)  # (B, H, T, hd)
    y = y.transpose(1, 2).reshape(b, t, heads * hd)  # (B, T, A)
    return F.linear(y, *o)  # (B, T, E)


def mlp_forward(x: Tensor, fc1: tuple[Tensor, Tensor], fc2: tuple[Tensor, Tensor]) -> Tensor:
    return F.linear(F.gelu(F.linear(x, *fc1)), *fc2)  # (B, T, E)


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

    @classmethod
    def from_subnet(cls, space: Space, subnet: Subnet) -> "TransformerConfig":
        space.check(subnet)
        return cls(space.vocab_size, space.max_seq_len, space.head_dim, space.positions, subnet.embed_dim, subnet.layers)

    @property
    def subnet(self) -> Subnet:
        return Subnet(
            self.embed_dim,
            len(self.layers),
            tuple(layer.heads for layer in self.layers),
            tuple(layer.ffn_dim for layer in self.layers),
            tuple(layer.attention for layer in self.layers),
        )


# --------------------------------------------------------------------------- modules


class Attention(nn.Module):
    def __init__(self, embed_dim: int, heads: int, head_dim: int, attention: str):
        super().__init__()
        width = heads * head_dim
        self.heads = heads
        self.spec = parse_attention(attention)
        kv_width = kv_heads(self.spec, heads) * head_dim
        self.q = nn.Linear(embed_dim, width)
        self.k = nn.Linear(embed_dim, kv_width)
        self.v = nn.Linear(embed_dim, kv_width)
        self.o = nn.Linear(width, embed_dim)

    def forward(self, x: Tensor, rope: tuple[Tensor, Tensor] | None) -> Tensor:
        p = lambda m: (m.weight, m.bias)  # noqa: E731
        return attention_forward(x, p(self.q), p(self.k), p(self.v), p(self.o), self.heads, self.spec, rope)


class MLP(nn.Module):
    def __init__(self, embed_dim: int, ffn_dim: int):
        super().__init__()
        self.fc1 = nn.Linear(embed_dim, ffn_dim)
        self.fc2 = nn.Linear(ffn_dim, embed_dim)

    def forward(self, x: Tensor) -> Tensor:
        return mlp_forward(x, (self.fc1.weight, self.fc1.bias), (self.fc2.weight, self.fc2.bias))


class Block(nn.Module):
    """Pre-norm block: x + attn(ln1(x)), then x + mlp(ln2(x))."""

    def __init__(self, embed_dim: int, head_dim: int, layer: LayerChoice):
        super().__init__()
        self.ln1 = nn.LayerNorm(embed_dim)
        self.attn = Attention(embed_dim, layer.heads, head_dim, layer.attention)
        self.ln2 = nn.LayerNorm(embed_dim)
        self.mlp = MLP(embed_dim, layer.ffn_dim)

    def forward(self, x: Tensor, rope: tuple[Tensor, Tensor] | None) -> Tensor:
        x = x + self.attn(self.ln1(x), rope)
        return x + self.mlp(self.ln2(x))


class Transformer(nn.Module):
    """Decoder-only causal LM; the LM head is tied to the token embedding."""

    def __init__(self, config: TransformerConfig, generator: torch.Generator | None = None):
        super().__init__()
        self.config = config
        e = config.embed_dim
        self.tok_emb = nn.Embedding(config.vocab_size, e)
        self.pos_emb = nn.Embedding(config.max_seq_len, e) if config.positions == "learned" else None
        self.blocks = nn.ModuleList(Block(e, config.head_dim, layer) for layer in config.layers)
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
        check_tokens(idx, self.config.vocab_size, self.config.max_seq_len)
        x = self.tok_emb(idx)  # (B, T, E)
        if self.pos_emb is not None:
            x = x + self.pos_emb.weight[: idx.shape[1]]
        rope = (self.rope_cos, self.rope_sin) if self.pos_emb is None else None
        for block in self.blocks:
            x = block(x, rope)
        x = self.ln_f(x)
        return F.linear(x, self.tok_emb.weight)  # (B, T, vocab)

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())


def init_weights(model: nn.Module, n_layers: int, generator: torch.Generator | None = None) -> None:
    """GPT-2 style: N(0, 0.02) for weights, zeros for biases, residual outputs scaled by 1/sqrt(2 n_layers)."""
    for name, p in model.named_parameters():
        if name.endswith("bias"):
            nn.init.zeros_(p)
        elif ".ln" in name or name.startswith("ln"):
            nn.init.ones_(p)
        else:
            std = INIT_STD / math.sqrt(2 * n_layers) if name.endswith(("o.weight", "fc2.weight")) else INIT_STD
            nn.init.normal_(p, mean=0.0, std=std, generator=generator)
