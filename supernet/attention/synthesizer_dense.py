"""``synthesizer-dense``: the Dense Synthesizer (Tay et al. 2021), an encoder-only type of Long Range Arena's lineup.

No keys: each token's attention logits over the T positions come from the token alone, through a two-layer
MLP ``B_i = W2 relu(W1 x_i + b1) + b2`` whose output layer has one unit per position.  Here the first layer
is the block's query projection (per head: ``q_i = W1 x_i + b1``, width head_dim), so a head's logits are
``relu(q_i) W2[:, :T] + b2[:T]`` and ``out = softmax(logits) v``.  W2 (head_dim, max_seq_len) and b2
(max_seq_len) per head are the type's weights and span the sequence as Linformer's do: a layer over T tokens
uses their leading T columns (elastic like every weight: the supernet keeps them for the most heads).

The queries get no rotary positions (``rotary_heads`` 0): the logits' columns are absolute positions already.
Family ``gating``: the query alone decides how v is mixed (no key is compared with it); of
:data:`~.base.FAMILIES` the nearest meaning.  Bidirectional only: a causal form (the logits masked to j <= i)
is cheap to write, but decoding it needs a growing value cache and each query's row of W2, which the LRA
classification tasks never use; not done.  O(T^2 D): quadratic, as the paper says.

Fast path: one SDPA with relu(q) as the queries, W2[:, :T]^T as the keys (scale 1) and b2 as an additive
mask (an opset-23 ``Attention`` node when exported).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .encoder import EncoderType
from .registry import register


class SynthesizerDense(EncoderType):
    name = "synthesizer-dense"
    family = "gating"  # relu(q) alone gives the attention over positions; no keys
    doc = "Dense Synthesizer: each token's logits over the T positions from relu(q) and a learned (D, max_seq_len) layer"
    fused_onnx = True  # one Attention node: relu(q) against the layer's columns, its bias as the mask

    def heads(self, spec, heads):
        return 0, heads

    def rotary_heads(self, spec, heads):
        return 0

    def weights(self, spec, heads, head_dim, max_seq_len=None):
        if max_seq_len is None:
            raise ValueError(f"{spec}: its output layer spans the sequence: its weights need the space's max_seq_len")
        return {"w": (heads, head_dim, max_seq_len), "b": (heads, max_seq_len)}

    def init_weight(self, name, weight, generator):
        if name == "b":
            torch.nn.init.zeros_(weight)
        else:  # logits of the scale of one relu(q) . w product over head_dim terms
            torch.nn.init.normal_(weight, 0.0, weight.shape[1] ** -0.5, generator=generator)

    def bidirectional_reference(self, q, k, v, spec, w):
        t = q.shape[2]
        logits = torch.einsum("bhid,hdj->bhij", torch.relu(q), w["w"][:, :, :t]) + w["b"][None, :, None, :t]
        e = torch.exp(logits - logits.amax(-1, keepdim=True))
        return torch.einsum("bhij,bhjd->bhid", e / e.sum(-1, keepdim=True), v)

    def bidirectional(self, q, k, v, spec, w):
        b, h, t, d = q.shape
        keys = w["w"][:, :, :t].transpose(-2, -1).expand(b, h, t, d)  # (B, H, T, D): position j's column as a key
        bias = w["b"][:, None, :t].expand(b, h, t, t)  # (B, H, T, T): b2[j] for every query
        return F.scaled_dot_product_attention(torch.relu(q), keys, v, attn_mask=bias, scale=1.0)

    def bidirectional_flops(self, spec, batch, t, heads, head_dim):
        # relu (T D), logits (2 T^2 D) and their bias (T^2), softmax (3 T^2), the weighted sum (2 T^2 D)
        return 1.0 * batch * heads * (t * head_dim + 4 * t * t * head_dim + 4 * t * t)


synthesizer_dense = register(SynthesizerDense())
