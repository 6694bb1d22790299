"""What a subnet costs, analytically: parameters, FLOPs, and the per-layer terms predictors use.

Everything is a pure function of (space, subnet, workload).  ``B`` batch, ``T`` sequence
length, ``E`` embedding width, ``A = heads * head_dim`` attention width, ``F`` FFN width,
``V`` vocabulary (the subnet's, where the space searches it: the output projection costs ``E x V`` per token).
FLOPs count a multiply-add as 2.  The token mixing of a layer is its
attention type's own count (``AttentionType.prefill_flops`` / ``decode_flops``: the pairs its
pattern keeps, a linear-attention state, a convolution, ...), and the bytes a decode step reads
are the type's decoding state at that context (``supernet.attention.state_bytes``).

A ``decode`` workload costs one new token per sequence at context ``c``: the projections, MLP and
head of one token, plus its token mixing as the type's decode step computes it and the cache
bytes it reads.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from supernet.shapes import params as shape_params
from search_spaces import Space, Subnet, Workload
from search_spaces.attention import AttentionSpec
from supernet.attention import get, state_bytes
from supernet.memory import attended


def params(space: Space, subnet: Subnet) -> int:
    """Parameters of the static model (the supernet's ``num_params`` on the meta device, the one count)."""
    return shape_params(space, subnet)


def vocab_rows(space: Space, subnet: Subnet) -> int:
    """The vocabulary ``subnet`` reads (its embedding and output rows): its gene in a space that searches it."""
    return space.vocab_of(subnet) if hasattr(space, "vocab_of") else space.vocab_size


def layer_cache_bytes(spec: AttentionSpec, context: int, heads: int, hd: int, batch: int = 1) -> int:
    """fp32 bytes one layer's decode step reads from its state at ``context`` (the type's state)."""
    return state_bytes(get(spec), spec, context, heads, hd, batch)


def read_workload(space: Space, workload: Workload, subnet: Subnet | None = None) -> Workload:
    """The workload as ``subnet``'s step computes it: a prefill stated in bytes of text as its vocabulary's tokens
    (:meth:`Workload.at_vocab`); a decode step of a model with a memory reads at most ``max_seq_len - 1`` cached entries
    at any context (:func:`supernet.memory.attended`), so its features are those of that context."""
    if subnet is not None:
        workload = workload.at_vocab(vocab_rows(space, subnet))
    if workload.kind != "decode" or not getattr(space, "memory", 0):
        return workload
    return replace(workload, context=attended(workload.context, space.memory, space.max_seq_len))


def cache_bytes(space: Space, subnet: Subnet, workload: Workload) -> float:
    """fp32 bytes of every layer's decode cache read for one new token (0 for prefill)."""
    if workload.kind != "decode":
        return 0.0
    w, hd = read_workload(space, workload, subnet), space.head_dim
    return float(sum(layer_cache_bytes(layer.attention_spec, w.context, layer.heads, hd, w.batch_size)
                     for layer in subnet.layers))


def mixing_flops(spec: AttentionSpec, workload: Workload, heads: int, hd: int, causal: bool = True) -> float:
    """FLOPs of one layer's token mixing at ``workload`` (prefill: every token; decode: the new token's),
    in the task's form (``causal`` False: the bidirectional form of an encoder)."""
    typ = get(spec)
    if workload.kind == "prefill":
        return typ.mixing_flops(spec, workload.batch_size, workload.seq_len, heads, hd, causal)
    return typ.decode_flops(spec, workload.batch_size, workload.context, heads, hd)


def projection_flops(spec: AttentionSpec, tokens: int, embed_dim: int, heads: int, hd: int) -> float:
    """FLOPs of one layer's q, k, v, o projections over ``tokens`` (k and v with the type's heads)."""
    hk, hv = get(spec).heads(spec, heads)
    return 2.0 * tokens * embed_dim * (2 * heads + hk + hv) * hd


def flops(space: Space, subnet: Subnet, workload: Workload) -> float:
    """Forward FLOPs at ``workload``: batch x seq tokens (prefill), or batch x 1 new token at its context (decode)."""
    workload = read_workload(space, workload, subnet)
    b, t, e, hd = workload.batch_size, workload.tokens, subnet.embed_dim, space.head_dim
    total = 2.0 * b * t * e * vocab_rows(space, subnet)  # tied LM head: the subnet's vocabulary
    for layer in subnet.layers:
        total += projection_flops(layer.attention_spec, b * t, e, layer.heads, hd) + 2.0 * b * t * 2 * e * layer.ffn_dim  # MLP
        total += mixing_flops(layer.attention_spec, workload, layer.heads, hd, space.causal)
    return total


def additive_terms(space: Space, subnet: Subnet, workload: Workload) -> dict[str, float]:
    """The additive model's columns (it adds the constant): a per-model part plus, summed over layers, each layer's terms.

    Each column multiplies a learned non-negative cost (ms per unit), so the prediction is
    constant + sum over layers of per-layer cost; a depth never seen is just more terms.
    """
    workload = read_workload(space, workload, subnet)
    bt, e, v, hd = workload.batch_size * workload.tokens, subnet.embed_dim, vocab_rows(space, subnet), space.head_dim
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
        out[f"layer[{layer.attention}]:mix"] += (
            mixing_flops(layer.attention_spec, workload, layer.heads, hd, space.causal) / hd
        )  # per head_dim: the scale of the others
        out["layer:embed"] += bt * e  # layer norms, residual adds
        out["layer:proj"] += bt * e * a  # q, k, v, o projections
        out["layer:mlp"] += bt * e * layer.ffn_dim  # fc1, fc2
        out["layer:ffn"] += bt * layer.ffn_dim  # gelu, bias
        out["layer:heads"] += bt * a  # rope, reshapes
        if workload.kind == "decode":  # the cache read per new token (MB, so the column is of the others' scale)
            out["layer:cache"] += (
                layer_cache_bytes(layer.attention_spec, workload.context, layer.heads, hd, workload.batch_size) / 2**20
            )
    return out


def layer_terms(spec: AttentionSpec, workload: Workload, embed_dim: int, heads: int, hd: int, ffn_dim: int,
                causal: bool = True) -> dict[str, float]:
    """One layer's cost terms for the layer-composed predictor (:mod:`latency.predictors.layered`), each a physical
    count whose cost per unit the predictor fits: ``layer:*`` terms cost alike whatever the layer's attention type
    (the projections' and the MLP's FLOPs, the norms' and the activation's elements), ``type[KIND]:*`` terms cost per
    type: a per-layer overhead (``count``: launches, dispatch), the q/k/v elements the type reads (``qkv``: ``T * A``),
    its token mixing as its own cost model counts it (``mix``: ``AttentionType.mixing_flops``: ``~T^2 * A`` for a
    quadratic type, ``~T * w * A`` for a window of ``w``, ``~T * A * hd`` for a linear one) and, decoding, the bytes of
    state its step reads (``cache``)."""
    bt, a, attention = workload.batch_size * workload.tokens, heads * hd, str(spec)  # (the columns: the spelling)
    out = {
        "layer:norm": float(bt * embed_dim),  # layer norms, residual adds
        "layer:proj": projection_flops(spec, bt, embed_dim, heads, hd),  # q, k, v, o (k and v with the type's heads)
        "layer:mlp": 4.0 * bt * embed_dim * ffn_dim,  # fc1, fc2
        "layer:act": float(bt * ffn_dim),  # the activation, the biases
        f"type[{attention}]:count": 1.0,
        f"type[{attention}]:qkv": float(bt * a),
        f"type[{attention}]:mix": mixing_flops(spec, workload, heads, hd, causal),
    }
    if workload.kind == "decode":
        out[f"type[{attention}]:cache"] = float(layer_cache_bytes(spec, workload.context, heads, hd, workload.batch_size))
    return out


def type_columns(kinds, decode: bool = False) -> dict[str, float]:
    """Every ``layer:*`` and ``type[KIND]:*`` column of :func:`layer_terms` for the attention types ``kinds``, at 0."""
    out = dict.fromkeys(("layer:norm", "layer:proj", "layer:mlp", "layer:act"), 0.0)
    for kind in kinds:
        out.update(dict.fromkeys([f"type[{kind}]:{t}" for t in ("count", "qkv", "mix", *(("cache",) if decode else ()))], 0.0))
    return out


def add_terms(total: dict[str, float], terms: dict[str, float]) -> dict[str, float]:
    """``total`` with each of ``terms`` added to its column (in place; returned)."""
    for k, v in terms.items():
        total[k] += v
    return total


def layered_terms(space: Space, subnet: Subnet, workload: Workload) -> dict[str, float]:
    """The layer-composed predictor's columns of a one-stack subnet: the model's own terms (``model:*``: the embedding's
    and the head's: the subnet's vocabulary) and, summed along the stack, each layer's :func:`layer_terms` (a prefill
    in bytes of text at the subnet's vocabulary's tokens)."""
    workload = workload.at_vocab(vocab_rows(space, subnet))
    bt, e = workload.batch_size * workload.tokens, subnet.embed_dim
    out = {"model:embed": float(bt * e), "model:head": float(bt * e * vocab_rows(space, subnet)),
           **type_columns(space.attention, workload.kind == "decode")}
    for layer in subnet.layers:
        add_terms(out, layer_terms(layer.attention_spec, workload, e, layer.heads, space.head_dim, layer.ffn_dim, space.causal))
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


def stack_matrix(kind: str, space: Space, workload: Workload, subnets) -> tuple[np.ndarray, list[str]]:
    """What a predictor of kind ``kind`` reads of one-stack subnets: the additive terms for ``additive``, the layer-composed
    terms for ``layered``; the encoding and the summaries otherwise (a ``transfer``'s view: those, then the layered terms
    as ``cost:*`` columns, last, so that the columns of a view saved before them keep their places)."""
    if kind == "additive":
        rows = [additive_terms(space, s, workload) for s in subnets]
    elif kind == "layered":
        rows = [layered_terms(space, s, workload) for s in subnets]
    else:
        rows = [{**dict(zip(space.feature_names(), space.encode(s).tolist())), **summary_features(space, s, workload)}
                for s in subnets]
        if kind == "transfer":
            rows = [{**r, **{f"cost:{k}": v for k, v in layered_terms(space, s, workload).items()}}
                    for r, s in zip(rows, subnets)]
    return matrix(rows)
