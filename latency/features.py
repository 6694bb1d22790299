"""What a subnet costs, analytically: parameters, FLOPs, and the per-layer terms predictors use.

Everything is a pure function of (space, subnet, workload).  ``B`` batch, ``T`` sequence
length, ``E`` embedding width, ``A = heads * head_dim`` attention width, ``F`` FFN width,
``V`` vocabulary.  FLOPs count a multiply-add as 2 and causal attention as what a causal
kernel computes (query i sees i+1 keys, or min(W, i+1) for ``local:W``).
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from search_spaces import Space, Subnet, Workload
from search_spaces.attention import kv_heads
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


def flops(space: Space, subnet: Subnet, workload: Workload) -> float:
    """Forward FLOPs at ``workload`` (batch x seq tokens)."""
    b, t, e, hd = workload.batch_size, workload.seq_len, subnet.embed_dim, space.head_dim
    total = 2.0 * b * t * e * space.vocab_size  # tied LM head
    for layer in subnet.layers:
        a, kv = layer.heads * hd, kv_heads(layer.attention_spec, layer.heads) * hd
        total += 2.0 * b * t * e * (2 * a + 2 * kv) + 2.0 * b * t * 2 * e * layer.ffn_dim  # q, o; k, v; MLP
        total += attention_flops(layer.attention, b, t, layer.heads, hd)
    return total


def seq_term(attention: str, t: int, heads: int, hd: int) -> float:
    """The sequence-dependent size of one layer's token mixing: pairs x heads (softmax ~T^2/2, local:W ~T W, ...),
    or T x heads x hd for the linear family."""
    pairs = attended_pairs(attention, t)
    return float(pairs * heads) if pairs else float(t * heads * hd)


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
