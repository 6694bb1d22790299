"""What a subnet costs, analytically: parameters, FLOPs, and the per-layer terms predictors use.

Everything is a pure function of (space, subnet, workload).  ``B`` batch, ``T`` sequence
length, ``E`` embedding width, ``A = heads * head_dim`` attention width, ``F`` FFN width,
``V`` vocabulary.  FLOPs count a multiply-add as 2 and causal attention as what a causal
kernel computes (query i sees i+1 keys, or min(W, i+1) for ``local:W``).
"""

from __future__ import annotations

import numpy as np

from search_spaces import Space, Subnet, Workload, parse_attention

LINEAR_CHUNK = 64  # supernet.attention.causal_linear_chunked's default chunk


def params(space: Space, subnet: Subnet) -> int:
    """Parameters of the static model (equals ``SuperTransformer.num_params``; tested)."""
    e, hd = subnet.embed_dim, space.head_dim
    n = space.vocab_size * e + 2 * e + (space.max_seq_len * e if space.positions == "learned" else 0)
    for layer in subnet.layers:
        a, f = layer.heads * hd, layer.ffn_dim
        n += 4 * e + 4 * e * a + 3 * a + e + 2 * e * f + f + e
    return n


def attended_keys(attention: str, t: int) -> int:
    """Sum over the T queries of how many keys each one sees."""
    spec = parse_attention(attention)
    if spec.kind == "local":
        w = min(spec.param("W"), t)
        return w * (w + 1) // 2 + (t - w) * w
    return t * (t + 1) // 2


def attention_flops(attention: str, b: int, t: int, heads: int, hd: int) -> float:
    kind = parse_attention(attention).kind
    if kind == "linear":  # chunked prefix sums: a (C, C) product inside each chunk, a (hd, hd) state across
        return 2.0 * b * heads * (2 * t * LINEAR_CHUNK * hd + 2 * t * hd * hd)
    return 2.0 * b * heads * 2 * attended_keys(attention, t) * hd


def flops(space: Space, subnet: Subnet, workload: Workload) -> float:
    """Forward FLOPs at ``workload`` (batch x seq tokens)."""
    b, t, e, hd = workload.batch_size, workload.seq_len, subnet.embed_dim, space.head_dim
    total = 2.0 * b * t * e * space.vocab_size  # tied LM head
    for layer in subnet.layers:
        a = layer.heads * hd
        total += 2.0 * b * t * 4 * e * a + 2.0 * b * t * 2 * e * layer.ffn_dim
        total += attention_flops(layer.attention, b, t, layer.heads, hd)
    return total


def seq_term(attention: str, t: int, heads: int, hd: int) -> float:
    """The sequence-dependent size of one layer's token mixing: T^2 h (softmax), T min(W,T) h (local:W), T h hd (linear)."""
    spec = parse_attention(attention)
    if spec.kind == "softmax":
        return float(t * t * heads)
    if spec.kind == "local":
        return float(t * min(spec.param("W"), t) * heads)
    if spec.kind == "linear":
        return float(t * heads * hd)
    return float(t * heads)  # a type added later: at least linear in T and heads


def additive_terms(space: Space, subnet: Subnet, workload: Workload) -> dict[str, float]:
    """The additive model's columns (it adds the constant): a per-model part plus, summed over layers, each layer's terms.

    Each column multiplies a learned non-negative cost (ms per unit), so the prediction is
    constant + sum over layers of per-layer cost; a depth never seen is just more terms.
    """
    bt, e, v, hd = workload.batch_size * workload.seq_len, subnet.embed_dim, space.vocab_size, space.head_dim
    out = {"model:embed": float(bt * e), "model:head": float(bt * e * v)}
    for kind in space.attention:
        out[f"layer[{kind}]:count"] = 0.0
        out[f"layer[{kind}]:mix"] = 0.0
    out.update({"layer:embed": 0.0, "layer:proj": 0.0, "layer:mlp": 0.0, "layer:ffn": 0.0, "layer:heads": 0.0})
    for layer in subnet.layers:
        a = layer.heads * hd
        out[f"layer[{layer.attention}]:count"] += 1.0
        out[f"layer[{layer.attention}]:mix"] += seq_term(layer.attention, workload.seq_len, layer.heads, hd) * workload.batch_size
        out["layer:embed"] += bt * e  # layer norms, residual adds
        out["layer:proj"] += bt * e * a  # q, k, v, o projections
        out["layer:mlp"] += bt * e * layer.ffn_dim  # fc1, fc2
        out["layer:ffn"] += bt * layer.ffn_dim  # gelu, bias
        out["layer:heads"] += bt * a  # rope, reshapes
    return out


def summary_features(space: Space, subnet: Subnet, workload: Workload) -> dict[str, float]:
    """Whole-subnet aggregates for the learned models (alongside ``space.encode``)."""
    out = {"params": float(params(space, subnet)), "flops": flops(space, subnet, workload)}
    out.update({f"sum:{k}": v for k, v in additive_terms(space, subnet, workload).items()})
    return out


def table_features(space: Space, subnet: Subnet, workload: Workload) -> dict[str, float]:
    """The feature columns of a timing-table row: ``space.encode`` then params and FLOPs."""
    enc = dict(zip(space.feature_names(), space.encode(subnet).tolist()))
    enc["params"] = float(params(space, subnet))
    enc["flops"] = flops(space, subnet, workload)
    return enc


def matrix(rows: list[dict[str, float]]) -> tuple[np.ndarray, list[str]]:
    names = list(rows[0])
    return np.array([[r[n] for n in names] for r in rows], dtype=np.float64), names
