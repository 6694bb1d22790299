"""What a subnet costs, analytically: parameters, FLOPs, and the per-layer terms predictors use.

Everything is a pure function of (space, subnet, workload).  ``B`` batch, ``T`` sequence
length, ``E`` embedding width, ``A = heads * head_dim`` attention width, ``F`` FFN width,
``V`` vocabulary.  FLOPs count a multiply-add as 2 and causal attention as what a causal
kernel computes (query i sees i+1 keys, or min(W, i+1) for ``local:W``).

A ``decode`` workload costs one new token per sequence at context ``c``: the projections, MLP and
head of one token, plus its token mixing as :mod:`supernet.decode` computes it: scores over the
cached keys (``c + 1`` for softmax, gqa and the sparse types whose pattern row masks the whole
cache; the constant window span for ``local`` / ``dilated`` / ``longformer``) or, for the linear
family, one update and one read of the (F x head_dim) state per head; and the cache bytes it reads.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from search_spaces import Space, Subnet, Workload
from search_spaces.attention import kv_heads, parse_attention
from supernet.attention import attended_pairs

LINEAR_CHUNK = 64  # the chunk of supernet.attention's causal linear family


@lru_cache(maxsize=16)
def _shape_model(space: Space):
    """A supernet on the meta device: shapes only, no memory; it counts parameters exactly."""
    import torch

    from supernet import SuperTransformer

    with torch.device("meta"):
        return SuperTransformer(space)


def params(space: Space, subnet: Subnet) -> int:
    """Parameters of the static model (``SuperTransformer.num_params``, the one count)."""
    return _shape_model(space).num_params(subnet)


def attention_flops(attention: str, b: int, t: int, heads: int, hd: int) -> float:
    """FLOPs of one layer's token mixing: scores and weighted sum over the pairs its pattern keeps,
    or, for the linear family (no pairs), a (C, C) product inside each chunk and a (hd, hd) state across."""
    pairs = attended_pairs(attention, t)
    if pairs == 0:
        return 2.0 * b * heads * (2 * t * LINEAR_CHUNK * hd + 2 * t * hd * hd)
    return 2.0 * b * heads * 2 * pairs * hd


def decode_layout(attention: str, context: int, heads: int, hd: int) -> tuple[int, int]:
    """What one layer's decode step works on at ``context`` (see :mod:`supernet.decode`): ``(keys, state)``.

    ``keys``: the cached keys the new query is scored against (``context + 1`` for the key/value
    types, whose pattern row masks the whole cache; the window span for ``local`` / ``dilated`` /
    ``longformer``, constant); 0 for the linear family, whose ``state`` is the F x hd sum it updates
    and reads per head (F = hd, 2 hd for cosformer, M for performer).
    """
    from supernet.decode import feature_dim, state_kind, window_span

    spec = parse_attention(attention)
    kind = state_kind(spec)
    if kind == "kv":
        return context + 1, 0
    if kind == "window":
        return window_span(spec) + (spec.param("G") if spec.kind == "longformer" else 0), 0
    return 0, feature_dim(spec, hd) * hd


def layer_cache_bytes(attention: str, context: int, heads: int, hd: int, batch: int = 1) -> int:
    """fp32 bytes one layer's decode step reads from its cache: keys and values of its kv heads, or the
    linear state (F x hd plus the F normaliser, per head)."""
    keys, state = decode_layout(attention, context, heads, hd)
    if keys:
        return 4 * batch * keys * 2 * kv_heads(parse_attention(attention), heads) * hd
    return 4 * batch * heads * (state + state // hd)


def cache_bytes(space: Space, subnet: Subnet, workload: Workload) -> float:
    """fp32 bytes of every layer's decode cache read for one new token (0 for prefill)."""
    if workload.kind != "decode":
        return 0.0
    return float(sum(layer_cache_bytes(l.attention, workload.context, l.heads, space.head_dim, workload.batch_size) for l in subnet.layers))


def mixing_flops(attention: str, workload: Workload, heads: int, hd: int) -> float:
    """FLOPs of one layer's token mixing at ``workload`` (prefill: every pair; decode: the new token's row)."""
    b = workload.batch_size
    if workload.kind == "prefill":
        return attention_flops(attention, b, workload.seq_len, heads, hd)
    keys, state = decode_layout(attention, workload.context, heads, hd)
    if keys:
        return 2.0 * b * heads * 2 * keys * hd  # scores and weighted sum over the cached keys
    return 2.0 * b * heads * 2 * state  # update the state, then read it


def flops(space: Space, subnet: Subnet, workload: Workload) -> float:
    """Forward FLOPs at ``workload``: batch x seq tokens (prefill), or batch x 1 new token at its context (decode)."""
    b, t, e, hd = workload.batch_size, workload.tokens, subnet.embed_dim, space.head_dim
    total = 2.0 * b * t * e * space.vocab_size  # tied LM head
    for layer in subnet.layers:
        a, kv = layer.heads * hd, kv_heads(layer.attention_spec, layer.heads) * hd
        total += 2.0 * b * t * e * (2 * a + 2 * kv) + 2.0 * b * t * 2 * e * layer.ffn_dim  # q, o; k, v; MLP
        total += mixing_flops(layer.attention, workload, layer.heads, hd)
    return total


def seq_term(attention: str, t: int, heads: int, hd: int) -> float:
    """The sequence-dependent size of one layer's token mixing: pairs x heads (softmax ~T^2/2, local:W ~T W, ...),
    or T x heads x hd for the linear family."""
    pairs = attended_pairs(attention, t)
    return float(pairs * heads) if pairs else float(t * heads * hd)


def mix_term(attention: str, workload: Workload, heads: int, hd: int) -> float:
    """:func:`seq_term` at a workload: prefill as above; decode: keys of the new token x heads, or
    heads x F x hd (the state) for the linear family."""
    if workload.kind == "prefill":
        return seq_term(attention, workload.seq_len, heads, hd)
    keys, state = decode_layout(attention, workload.context, heads, hd)
    return float(keys * heads) if keys else float(heads * state)


def additive_terms(space: Space, subnet: Subnet, workload: Workload) -> dict[str, float]:
    """The additive model's columns (it adds the constant): a per-model part plus, summed over layers, each layer's terms.

    Each column multiplies a learned non-negative cost (ms per unit), so the prediction is
    constant + sum over layers of per-layer cost; a depth never seen is just more terms.
    """
    bt, e, v, hd = workload.batch_size * workload.tokens, subnet.embed_dim, space.vocab_size, space.head_dim
    out = {"model:embed": float(bt * e), "model:head": float(bt * e * v)}
    for kind in space.attention:
        out[f"layer[{kind}]:count"] = 0.0
        out[f"layer[{kind}]:mix"] = 0.0
    out.update({"layer:embed": 0.0, "layer:proj": 0.0, "layer:mlp": 0.0, "layer:ffn": 0.0, "layer:heads": 0.0})
    if workload.kind == "decode":
        out["layer:cache"] = 0.0
    for layer in subnet.layers:
        a = layer.heads * hd
        out[f"layer[{layer.attention}]:count"] += 1.0
        out[f"layer[{layer.attention}]:mix"] += mix_term(layer.attention, workload, layer.heads, hd) * workload.batch_size
        out["layer:embed"] += bt * e  # layer norms, residual adds
        out["layer:proj"] += bt * e * a  # q, k, v, o projections
        out["layer:mlp"] += bt * e * layer.ffn_dim  # fc1, fc2
        out["layer:ffn"] += bt * layer.ffn_dim  # gelu, bias
        out["layer:heads"] += bt * a  # rope, reshapes
        if workload.kind == "decode":  # the cache read per new token (MB, so the column is of the others' scale)
            out["layer:cache"] += layer_cache_bytes(layer.attention, workload.context, layer.heads, hd, workload.batch_size) / 2**20
    return out


def summary_features(space: Space, subnet: Subnet, workload: Workload) -> dict[str, float]:
    """Whole-subnet aggregates for the learned models (alongside ``space.encode``)."""
    out = {"params": float(params(space, subnet)), "flops": flops(space, subnet, workload)}
    if workload.kind == "decode":
        out["cache_bytes"] = cache_bytes(space, subnet, workload)
    out.update({f"sum:{k}": v for k, v in additive_terms(space, subnet, workload).items()})
    return out


def table_features(space: Space, subnet: Subnet, workload: Workload) -> dict[str, float]:
    """The feature columns of a timing-table row: ``space.encode`` then params and FLOPs."""
    enc = dict(zip(space.feature_names(), space.encode(subnet).tolist()))
    enc["params"] = float(params(space, subnet))
    enc["flops"] = flops(space, subnet, workload)
    if workload.kind == "decode":
        enc["cache_bytes"] = cache_bytes(space, subnet, workload)
    return enc


def matrix(rows: list[dict[str, float]]) -> tuple[np.ndarray, list[str]]:
    names = list(rows[0])
    return np.array([[r[n] for n in names] for r in rows], dtype=np.float64), names
