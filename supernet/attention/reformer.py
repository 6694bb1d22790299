"""``reformer:B``: Reformer's LSH attention (Kitaev et al. 2020), an encoder-only type of Long Range Arena's lineup.

Shared QK: the keys are the queries normalised to unit length (the block's key projection is not used:
``heads`` gives no key heads), scores ``q_i . k^_j / sqrt(D)``.  Each query is hashed by a random rotation
(angular LSH: ``bucket = argmax([q R, -q R])``, R (D, n/2) for n buckets), the tokens sorted by (bucket,
position), the sorted sequence cut into chunks of B tokens (B: the bucket size, the paper's 64), and each
token attends to the tokens of its own chunk and of the chunk before it (the first chunk's is the last,
cyclically); a token does not attend to itself unless nothing else is there (its score replaced by -1e5),
as in the paper.  One round of hashing (n_hashes = 1).

The bucket count follows the length so that a bucket holds B tokens on average: ceil(T / B) chunks and
n = 2 ceil(ceil(T/B) / 2) buckets (even: the rotation gives n/2 directions and their opposites), as in the
paper's code (``n_buckets = seqlen // bucket_size``).  The rotations are the leading n/2 rows of one fixed
(:data:`MAX_ROTATIONS`, D) Gaussian table drawn from :data:`REFORMER_SEED` by numpy (no global RNG, not
trained, the same on every device and in every trace: a constant of the ONNX graph), so a length's hash
does not depend on any other length's.  The hash is not differentiated (argmax, sort); the gradients flow
through the scores and values of the chunks it gives, as in the paper.

The reference hashes the same way and applies the rule to a plain (T, T) masked softmax (query i sees key j
when j's chunk is i's or the one before it); the fast path (also what the ONNX exporter traces: TopK,
GatherElements, ScatterElements) sorts, gathers the chunks and runs one batched (C, 2C) attention per chunk:
O(T B D) for the attention, O(T log T) for the sort, and O(T^2 D / B) for the hash (a product with T/(2B)
directions), small next to the attention up to T ~ 8 B^2.

Bidirectional only: a causal LSH attention needs a mask by position inside every chunk and a decoding
state of every past token's bucket; LRA's classification tasks use the encoder form.
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from .blocks import block_count
from .encoder import EncoderType
from .registry import register

REFORMER_SEED = 20200113  # the rotations' numpy seed (with the head size)
MAX_ROTATIONS = 1024  # directions in the table: up to 2048 buckets, T up to 2048 B
SELF_LOGIT = -1e5  # a token's score with itself: it attends to itself only if nothing else is there


@lru_cache(maxsize=16)
def _rotation_table(d: int) -> np.ndarray:
    table = np.random.default_rng([REFORMER_SEED, d]).standard_normal((MAX_ROTATIONS, d))
    table.setflags(write=False)
    return table


def reformer_rotations(n_rot, d: int, device, dtype) -> Tensor:
    """(D, n_rot): the leading ``n_rot`` directions of the fixed table (a symbolic ``n_rot`` when exporting)."""
    if isinstance(n_rot, int):
        return torch.tensor(_rotation_table(d)[:n_rot], dtype=dtype, device=device).T
    return torch.tensor(_rotation_table(d), dtype=dtype, device=device)[:n_rot].T


def reformer_chunks(t, b: int):
    """(chunks, rotations) over ``t`` tokens with bucket size ``b``: ceil(t/b) chunks, ceil(chunks/2) directions."""
    n = block_count(t, b)
    return n, (n + 1) // 2


def reformer_sort(q: Tensor, b: int) -> tuple[Tensor, Tensor]:
    """The LSH of the queries q (B, H, T, D): (buckets (B, H, T), the sort by bucket then position (B, H, T))."""
    t, d = q.shape[2], q.shape[3]
    _, n_rot = reformer_chunks(t, b)
    # in float32 whatever q's dtype: a bf16 product would flip near-ties, and a bucket is all or nothing
    proj = q.detach().float() @ reformer_rotations(n_rot, d, q.device, torch.float32)  # (B, H, T, n/2)
    buckets = torch.cat([proj, -proj], dim=-1).argmax(-1)  # (B, H, T), in [0, n)
    key = buckets * t + torch.arange(t, device=q.device)  # unique: a stable order
    return buckets, torch.argsort(key, dim=-1)


def _shared_keys(q: Tensor) -> Tensor:
    return F.normalize(q, dim=-1, eps=1e-6)


class Reformer(EncoderType):
    name = "reformer"
    params = ("B",)
    doc = "Reformer LSH attention: shared QK, tokens sorted by a random-rotation hash into chunks of B (own + previous chunk)"

    def problems(self, spec, max_seq_len, heads):
        b = spec.param("B")
        if b > max_seq_len:
            return [f"{spec}: B={b} exceeds max_seq_len {max_seq_len} (a bucket longer than the sequence)"]
        if -(-max_seq_len // b) > 2 * MAX_ROTATIONS:
            return [f"{spec}: max_seq_len {max_seq_len} needs more than {2 * MAX_ROTATIONS} buckets of {b}"]
        return []

    def heads(self, spec, heads):
        return 0, heads  # shared QK: the keys are the normalised queries

    def bidirectional_reference(self, q, k, v, spec, w):
        b = spec.param("B")
        t = q.shape[2]
        n, _ = reformer_chunks(t, b)
        _, order = reformer_sort(q, b)
        rank = torch.argsort(order, dim=-1)  # (B, H, T): each token's place in the sorted sequence
        chunk = rank // b
        ci, cj = chunk[..., :, None], chunk[..., None, :]  # (B, H, T, 1), (B, H, 1, T)
        allowed = (cj == ci) | (cj == (ci - 1) % n)  # its own chunk or the one before it (cyclically)
        scores = q @ _shared_keys(q).transpose(-2, -1) / math.sqrt(q.shape[-1])  # (B, H, T, T)
        eye = torch.eye(t, dtype=torch.bool, device=q.device)
        scores = scores.masked_fill(eye, SELF_LOGIT).masked_fill(~allowed, float("-inf"))
        e = torch.exp(scores - scores.amax(-1, keepdim=True))
        return (e / e.sum(-1, keepdim=True)) @ v

    def bidirectional(self, q, k, v, spec, w):
        bsz, h, t, d = q.shape
        c = spec.param("B")
        n, _ = reformer_chunks(t, c)
        _, order = reformer_sort(q, c)  # (B, H, T)
        idx = order[..., None].expand(bsz, h, t, d)
        sq, sv = q.gather(2, idx), v.gather(2, idx)  # sorted (B, H, T, D)
        pad = n * c - t
        pos = F.pad(order, (0, pad), value=-1)  # (B, H, NC): each sorted slot's token, -1 past the end
        qb = F.pad(sq, (0, 0, 0, pad)).reshape(bsz, h, n, c, d)
        kb = F.pad(_shared_keys(sq), (0, 0, 0, pad)).reshape(bsz, h, n, c, d)
        vb = F.pad(sv, (0, 0, 0, pad)).reshape(bsz, h, n, c, d)
        pb = pos.reshape(bsz, h, n, c)

        def with_previous(x: Tensor) -> Tensor:  # own chunk, then the one before it (the last for the first)
            return torch.cat([x, torch.cat([x[:, :, -1:], x[:, :, :-1]], dim=2)], dim=3)

        kw, vw, pw = with_previous(kb), with_previous(vb), with_previous(pb)  # (B, H, N, 2C, ...)
        scores = (qb * d**-0.5) @ kw.transpose(-2, -1)  # (B, H, N, C, 2C)
        scores = scores.masked_fill(pb[..., :, None] == pw[..., None, :], SELF_LOGIT)
        scores = scores.masked_fill((pw < 0)[..., None, :], float("-inf"))  # padding is never a key
        out = (torch.softmax(scores, dim=-1) @ vw).reshape(bsz, h, n * c, d)[:, :, :t]  # sorted order
        undo = torch.empty_like(order).scatter_(-1, order, torch.arange(t, device=q.device).expand(bsz, h, t))
        return out.gather(2, undo[..., None].expand(bsz, h, t, d))

    def bidirectional_flops(self, spec, batch, t, heads, head_dim):
        c, d = spec.param("B"), head_dim
        n = -(-t // c)
        rot = (n + 1) // 2
        per_head = (
            2 * t * d * rot + 2 * t * rot  # the hash: q R, then the argmax over 2 rot
            + t * math.ceil(math.log2(max(t, 2)))  # the sort (comparisons)
            + 3 * t * d  # the shared keys normalised
            + 2 * (n * c) * (2 * c) * d  # the scores, C queries x 2C keys per chunk
            + 3 * (n * c) * (2 * c)  # softmax
            + 2 * (n * c) * (2 * c) * d  # the weighted sum
        )
        return 1.0 * batch * heads * per_head


reformer = register(Reformer())
