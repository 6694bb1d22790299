"""``synthesizer-random``: the Random Synthesizer (Tay et al. 2021), an encoder-only type of Long Range Arena's lineup.

Neither queries nor keys: each head has a learned (max_seq_len, max_seq_len) matrix of logits R, the same
for every input, and ``out = softmax(R[:T, :T]) v`` over a layer's T tokens (the paper's trainable Random
Synthesizer; its leading T x T block, elastic like every weight: the supernet keeps R for the most heads).
The block's query projection is computed and unused (its gradient is zero): the block gives every type
queries; a layer of this type could drop it, which the shared block does not do.

Family ``gating`` (of :data:`~.base.FAMILIES` the nearest meaning: v mixed by weights no key comparison
gives).  Bidirectional only: the causal form (R masked to j <= i) would need a value cache to decode, which
LRA's classification tasks never use; not done.  No rotary positions (R's rows and columns are positions).
O(T^2 D) per sequence; the softmax of R is computed once per head and shared by the batch.
"""

from __future__ import annotations

import torch

from .encoder import EncoderType
from .registry import register


class SynthesizerRandom(EncoderType):
    name = "synthesizer-random"
    family = "gating"  # v mixed by a learned matrix, no key comparison
    doc = "Random Synthesizer: a learned (max_seq_len, max_seq_len) logit matrix per head, the same for every input"

    def heads(self, spec, heads):
        return 0, heads

    def rotary_heads(self, spec, heads):
        return 0

    def weights(self, spec, heads, head_dim, max_seq_len=None):
        if max_seq_len is None:
            raise ValueError(f"{spec}: its logits span the sequence: its weights need the space's max_seq_len")
        return {"r": (heads, max_seq_len, max_seq_len)}

    def bidirectional_reference(self, q, k, v, spec, w):
        t = v.shape[2]
        logits = w["r"][None, :, :t, :t].expand(v.shape[0], -1, -1, -1)  # (B, H, T, T), per sequence
        e = torch.exp(logits - logits.amax(-1, keepdim=True))
        return torch.einsum("bhij,bhjd->bhid", e / e.sum(-1, keepdim=True), v)

    def bidirectional(self, q, k, v, spec, w):
        t = v.shape[2]
        return torch.softmax(w["r"][:, :t, :t], dim=-1) @ v  # (H, T, T) once, broadcast over the batch

    def bidirectional_flops(self, spec, batch, t, heads, head_dim):
        # the softmax of R once per head (3 T^2), the weighted sum per sequence (2 T^2 D)
        return 1.0 * heads * 3 * t * t + 2.0 * batch * heads * t * t * head_dim


synthesizer_random = register(SynthesizerRandom())
