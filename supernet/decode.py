"""Incremental decoding of a static Transformer: prefill a prompt, then one token per step.

A :class:`DecodeCache` holds, per layer, what that layer's attention type needs to score one new
query without the past tokens (plain tensors in a dict, no code), and ``length``, the tokens seen.
What a layer keeps depends on its type (:func:`state_kind`):

* ``"kv"``: a key/value cache that grows with the context: ``softmax``, ``gqa:G`` (only its
  ``kv_heads``), and the sparse types whose pattern reaches arbitrarily far back (``strided:S``,
  ``fixed:S``, ``bigbird:W:G:R``): the pattern's row for the new position masks the cache.
  In torch the buffers ``k``, ``v`` (B, Hkv, capacity, D) have spare room (doubled when full);
  the first ``length`` entries are valid.
* ``"window"``: a rolling window of the last ``span`` keys/values (constant memory): ``local:W``
  (span W), ``dilated:W:D`` (span (W-1)D+1, masked by the pattern), ``longformer:W:G`` (span W,
  plus the first G tokens as global keys ``gk``, ``gv``).  Entry s of a window holds position
  ``length - span + s``; negative positions are padding and masked.
* ``"linear"``: the recurrent state of the linear family (``linear``, ``relu-linear``,
  ``cosformer:M``, ``performer:M``): ``s`` = sum_j phi(k_j) v_j^T (B, H, F, Dv) and ``z`` =
  sum_j phi(k_j) (B, H, F), in fp32 like the prefix sums of the full forward.

Positions: rotary angles are computed for any position (:func:`supernet.model.rope_at`), so a
rope model decodes past ``max_seq_len`` (for timing at long contexts; quality there is whatever
the model extrapolates to).  A model with learned positions has none beyond ``max_seq_len`` and
``decode_step`` refuses there.  cosFormer's re-weighting cos(pi/2 (i-j)/M) turns negative for
keys more than M back; decoding computes it as defined.

The step math (:func:`step`) is one function shared with the ONNX step graph
(:mod:`supernet.onnx_decode`), which runs it "functionally" (caches in, new caches out).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from search_spaces import UserError
from search_spaces.attention import AttentionSpec, kv_heads

from .attention import attend, get
from .attention.linear import LINEAR_EPS, kernel_features
from .model import Attention, Transformer, apply_rope, check_tokens, rope_at

KV_KINDS = ("softmax", "gqa", "strided", "fixed", "bigbird")
WINDOW_KINDS = ("local", "dilated", "longformer")
LINEAR_KINDS = ("linear", "relu-linear", "cosformer", "performer")
SPARE = 256  # spare key/value slots a fresh or synthetic cache gets before its first regrowth


@dataclass
class DecodeCache:
    """Per-layer states (name -> tensor, see the module doc) and ``length``, the tokens already seen."""

    layers: list[dict[str, Tensor]]
    length: int = 0
    batch_size: int = 0  # sequences per step (0: not checked)


def state_kind(spec: AttentionSpec) -> str:
    """``"kv"``, ``"window"`` or ``"linear"``: what a layer of this type keeps while decoding."""
    if spec.kind in KV_KINDS:
        return "kv"
    if spec.kind in WINDOW_KINDS:
        return "window"
    assert spec.kind in LINEAR_KINDS, spec
    return "linear"


def window_span(spec: AttentionSpec) -> int:
    """Positions a ``"window"`` layer keeps: the furthest its pattern reaches back, plus one."""
    if spec.kind == "dilated":
        return (spec.param("W") - 1) * spec.param("D") + 1
    return spec.param("W")


def feature_dim(spec: AttentionSpec, head_dim: int) -> int:
    """F, the width of phi(k) of a linear-family type."""
    if spec.kind == "cosformer":
        return 2 * head_dim  # [relu(x) cos, relu(x) sin]
    if spec.kind == "performer":
        return spec.param("M")
    return head_dim


def state_names(spec: AttentionSpec) -> tuple[str, ...]:
    """The names of a layer's state tensors, in the order :func:`state_shapes` and the step graphs list them."""
    kind = state_kind(spec)
    if kind == "linear":
        return ("s", "z")
    return ("k", "v", "gk", "gv") if spec.kind == "longformer" else ("k", "v")


def state_shapes(model: Transformer, batch_size: int, kv_len: int) -> list[dict[str, tuple[tuple[int, ...], torch.dtype]]]:
    """Per layer, name -> (shape, dtype) of its state with ``kv_len`` slots in its growing caches."""
    hd = model.config.head_dim
    dtype = model.tok_emb.weight.dtype
    out = []
    for block in model.blocks:
        spec, h = block.attn.spec, block.attn.heads
        kvh = kv_heads(spec, h)
        kind = state_kind(spec)
        if kind == "kv":
            shapes = {"k": ((batch_size, kvh, kv_len, hd), dtype), "v": ((batch_size, kvh, kv_len, hd), dtype)}
        elif kind == "window":
            span = window_span(spec)
            shapes = {"k": ((batch_size, kvh, span, hd), dtype), "v": ((batch_size, kvh, span, hd), dtype)}
            if spec.kind == "longformer":
                g = spec.param("G")
                shapes.update(gk=((batch_size, kvh, g, hd), dtype), gv=((batch_size, kvh, g, hd), dtype))
        else:
            f = feature_dim(spec, hd)
            shapes = {"s": ((batch_size, h, f, hd), torch.float32), "z": ((batch_size, h, f), torch.float32)}
        out.append(shapes)
    return out


# --------------------------------------------------------------------------- public API


def new_cache(model: Transformer, batch_size: int, *, capacity: int = SPARE) -> DecodeCache:
    """An empty cache (nothing seen yet) for ``batch_size`` sequences."""
    if batch_size < 1:
        raise UserError(f"batch_size: {batch_size}; expected a positive count")
    device = model.tok_emb.weight.device
    layers = [
        {name: torch.zeros(shape, dtype=dtype, device=device) for name, (shape, dtype) in shapes.items()}
        for shapes in state_shapes(model, batch_size, capacity)
    ]
    return DecodeCache(layers, 0, batch_size)


def synthetic_cache(
    model: Transformer, batch_size: int, context: int, generator: torch.Generator | None = None, *, spare: int = SPARE
) -> DecodeCache:
    """A cache of the right shapes and dtypes filled with random values, as if ``context`` tokens had been seen.

    No prefill runs, so it is cheap even at 16k tokens: it is for timing one :func:`decode_step` at
    a context length.  Growing caches get ``context + spare`` slots (no regrowth in the next
    ``spare`` steps); linear normalisers ``z`` are positive, so outputs stay finite.  To time many
    steps at the same context, set ``cache.length = context`` before each: the growing caches then
    overwrite the same slots (window and linear states are constant-size anyway).
    """
    if context < 0:
        raise UserError(f"context: {context}; expected >= 0 tokens")
    cache = new_cache(model, batch_size, capacity=context + spare)
    for layer in cache.layers:
        for name, t in layer.items():
            if t.dtype.is_floating_point:
                r = torch.randn(t.shape, generator=generator, dtype=torch.float32).to(t.device, t.dtype)
                layer[name] = r.abs() + 1.0 if name == "z" else r
    cache.length = context
    return cache


@torch.no_grad()
def prefill(model: Transformer, idx: Tensor, *, capacity: int | None = None) -> tuple[Tensor, DecodeCache]:
    """Run the prompt ``idx`` (B, T) through the model: logits (B, T, V) (equal to ``model(idx)``) and the cache after it.

    ``capacity``: slots of the growing key/value caches (default T + SPARE; they double when full).
    """
    check_tokens(idx, model.config.vocab_size, model.config.max_seq_len)
    b, t = idx.shape
    positions = torch.arange(t, device=idx.device)
    x = _embed(model, idx, positions)  # (B, T, E)
    rope = _rope(model, positions)
    layers = []
    for block in model.blocks:
        q, k, v = project(block.attn, block.ln1(x), rope)  # (B, H, T, hd), (B, Hkv, T, hd) x2
        y = attend(q, k, v, block.attn.spec)  # (B, H, T, hd)
        layers.append(_state_from_prompt(block.attn.spec, k, v, max(t, capacity if capacity is not None else t + SPARE)))
        x = x + block.attn.o(y.transpose(1, 2).reshape(b, t, -1))
        x = x + block.mlp(block.ln2(x))
    logits = F.linear(model.ln_f(x), model.tok_emb.weight)  # (B, T, V)
    return logits, DecodeCache(layers, t, b)


@torch.no_grad()
def decode_step(model: Transformer, token: Tensor, cache: DecodeCache) -> tuple[Tensor, DecodeCache]:
    """Feed one token per sequence, ``token`` (B, 1), at position ``cache.length``: logits (B, 1, V).

    Updates ``cache`` in place (and returns it).
    """
    if token.dim() != 2 or token.shape[1] != 1 or token.dtype not in (torch.int64, torch.int32):
        raise UserError(
            f"decode_step: expected one token per sequence, shape (batch, 1) integer, got {tuple(token.shape)} {token.dtype}"
        )
    if cache.batch_size and token.shape[0] != cache.batch_size:
        raise UserError(f"decode_step: {token.shape[0]} tokens for a cache of batch size {cache.batch_size}")
    p = cache.length
    if model.pos_emb is not None and p >= model.config.max_seq_len:
        raise UserError(
            f"decode position {p} is past max_seq_len {model.config.max_seq_len}: this model has learned positions, "
            "which end there (rotary models decode at any position)"
        )
    pos = torch.tensor([p], device=token.device)
    logits, layers = step(model, token, pos, cache.layers, length=p)
    cache.layers, cache.length = layers, p + 1
    return logits, cache


def cache_bytes(cache: DecodeCache) -> int:
    """Bytes held by the cache's tensors (allocated, spare slots included)."""
    return sum(t.numel() * t.element_size() for layer in cache.layers for t in layer.values())


# --------------------------------------------------------------------------- the step


def step(
    model: Transformer, token: Tensor, pos: Tensor, layers: list[dict[str, Tensor]], length: int | None
) -> tuple[Tensor, list[dict[str, Tensor]]]:
    """One decode step: token (B, 1) at position ``pos`` (1,) int64 -> logits (B, 1, V), new layer states.

    ``length`` is the number of valid slots of the growing caches when they are spare-room buffers
    written in place (torch); ``None`` means functional (ONNX): they hold exactly the past, and
    the new entry is concatenated.
    """
    b = token.shape[0]
    x = _embed(model, token, pos)  # (B, 1, E)
    rope = _rope(model, pos)
    new_layers = []
    for block, state in zip(model.blocks, layers):
        q, k, v = project(block.attn, block.ln1(x), rope)  # (B, H, 1, hd), (B, Hkv, 1, hd) x2
        y, new = mix_step(block.attn.spec, state, q, k, v, pos, length)  # (B, H, 1, hd)
        new_layers.append(new)
        x = x + block.attn.o(y.transpose(1, 2).reshape(b, 1, -1))
        x = x + block.mlp(block.ln2(x))
    return F.linear(model.ln_f(x), model.tok_emb.weight), new_layers  # (B, 1, V)


def mix_step(
    spec: AttentionSpec, state: dict[str, Tensor], q: Tensor, k: Tensor, v: Tensor, pos: Tensor, length: int | None
) -> tuple[Tensor, dict[str, Tensor]]:
    """Mix one query q (B, H, 1, D) with the layer's past and its new key/value k, v (B, Hkv, 1, D) at ``pos``."""
    kind = state_kind(spec)
    if kind == "linear":
        return _linear_step(spec, state, q, k, v, pos)
    if kind == "kv":
        keys, values, new = _append(state, k, v, length)  # (B, Hkv, L, D) x2
        mask = None
        if spec.kind not in ("softmax", "gqa"):
            j = torch.arange(keys.shape[2], device=q.device)  # (L,) positions 0..p
            mask = get(spec).pattern(pos, j, spec)[None, :]  # (1, L)
        return _attend_one(q, keys, values, mask), new
    # window: drop the oldest entry, append the new one
    keys = torch.cat((state["k"][:, :, 1:], k), dim=2)  # (B, Hkv, span, D)
    values = torch.cat((state["v"][:, :, 1:], v), dim=2)
    new = {"k": keys, "v": values}
    span = keys.shape[2]
    j = pos - (span - 1) + torch.arange(span, device=q.device)  # (span,) absolute positions
    mask = get(spec).pattern(pos, j, spec) & (j >= 0)  # (span,)
    if spec.kind == "longformer":
        g = spec.param("G")
        jg = torch.arange(g, device=q.device)  # (G,)
        slot = (jg == pos)[None, None, :, None]  # (1, 1, G, 1): the new token is global while pos < G
        gk, gv = torch.where(slot, k, state["gk"]), torch.where(slot, v, state["gv"])  # (B, Hkv, G, D)
        new.update(gk=gk, gv=gv)
        keys, values = torch.cat((gk, keys), dim=2), torch.cat((gv, values), dim=2)  # (B, Hkv, G + span, D)
        mask = torch.cat((jg <= pos, mask & (j >= g)))  # window keys below G are already global
    return _attend_one(q, keys, values, mask[None, :]), new


def _attend_one(q: Tensor, keys: Tensor, values: Tensor, mask: Tensor | None) -> Tensor:
    """softmax(q k^T / sqrt(D), masked) v for one query per row: q (B, H, 1, D), keys (B, Hkv, L, D)."""
    grouped = bool(keys.shape[1] != q.shape[1])  # bool(): a plain flag also when exporting with symbolic head counts
    return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, enable_gqa=grouped)


def _append(state: dict[str, Tensor], k: Tensor, v: Tensor, length: int | None) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
    """Add k, v (B, Hkv, 1, D) to a growing cache; return the valid keys, values and the new state."""
    if length is None:
        keys, values = torch.cat((state["k"], k), dim=2), torch.cat((state["v"], v), dim=2)
        return keys, values, {"k": keys, "v": values}
    buf_k, buf_v = state["k"], state["v"]
    if length == buf_k.shape[2]:  # full: double the room (at least SPARE more slots)
        b, hk, _, d = buf_k.shape
        grow = max(length, SPARE)
        buf_k = torch.cat((buf_k, buf_k.new_zeros(b, hk, grow, d)), dim=2)
        buf_v = torch.cat((buf_v, buf_v.new_zeros(b, hk, grow, d)), dim=2)
    buf_k[:, :, length : length + 1] = k
    buf_v[:, :, length : length + 1] = v
    return buf_k[:, :, : length + 1], buf_v[:, :, : length + 1], {"k": buf_k, "v": buf_v}


def _linear_step(
    spec: AttentionSpec, state: dict[str, Tensor], q: Tensor, k: Tensor, v: Tensor, pos: Tensor
) -> tuple[Tensor, dict[str, Tensor]]:
    """Recurrent linear attention: s += phi(k) v^T, z += phi(k); out = phi(q) s / (phi(q) . z + eps), in fp32."""
    fq, fk = kernel_features(q.float(), k.float(), spec, start=pos)  # (B, H, 1, F) x2
    s = state["s"] + fk.transpose(-2, -1) @ v.float()  # (B, H, F, Dv)
    z = state["z"] + fk[:, :, 0]  # (B, H, F)
    num = fq @ s  # (B, H, 1, Dv)
    den = (fq[:, :, 0] * z).sum(-1)  # (B, H)
    return (num / (den[:, :, None, None] + LINEAR_EPS)).to(v.dtype), {"s": s, "z": z}


# --------------------------------------------------------------------------- prompt -> state


def _state_from_prompt(spec: AttentionSpec, k: Tensor, v: Tensor, capacity: int) -> dict[str, Tensor]:
    """A layer's state after the prompt's keys/values k, v (B, Hkv, T, D)."""
    b, hk, t, d = k.shape
    kind = state_kind(spec)
    if kind == "kv":
        buf = k.new_zeros(2, b, hk, capacity, d)
        buf[0, :, :, :t], buf[1, :, :, :t] = k, v
        return {"k": buf[0], "v": buf[1]}
    if kind == "window":
        state = {"k": _last(k, window_span(spec)), "v": _last(v, window_span(spec))}
        if spec.kind == "longformer":
            g = spec.param("G")
            state.update(gk=_first(k, g), gv=_first(v, g))
        return state
    _, fk = kernel_features(k.float(), k.float(), spec, start=0)  # (B, H, T, F)
    return {"s": fk.transpose(-2, -1) @ v.float(), "z": fk.sum(2)}  # (B, H, F, Dv), (B, H, F)


def _last(x: Tensor, n: int) -> Tensor:
    """The last n positions of x (B, H, T, D), zero-padded in front when T < n."""
    t = x.shape[2]
    return x[:, :, t - n :].clone() if t >= n else torch.cat((x.new_zeros(*x.shape[:2], n - t, x.shape[3]), x), dim=2)


def _first(x: Tensor, n: int) -> Tensor:
    """The first n positions of x (B, H, T, D), zero-padded at the end when T < n."""
    t = x.shape[2]
    return x[:, :, :n].clone() if t >= n else torch.cat((x, x.new_zeros(*x.shape[:2], n - t, x.shape[3])), dim=2)


# --------------------------------------------------------------------------- shared pieces


def _embed(model: Transformer, idx: Tensor, positions: Tensor) -> Tensor:
    x = model.tok_emb(idx)  # (B, T, E)
    if model.pos_emb is not None:
        x = x + model.pos_emb(positions)  # (T, E) broadcast over the batch
    return x


def _rope(model: Transformer, positions: Tensor) -> tuple[Tensor, Tensor] | None:
    return None if model.pos_emb is not None else rope_at(positions, model.config.head_dim)


def project(attn: Attention, x: Tensor, rope: tuple[Tensor, Tensor] | None) -> tuple[Tensor, Tensor, Tensor]:
    """Queries (B, H, T, hd) and rotated keys, values (B, Hkv, T, hd) of x (B, T, E), as the full forward makes them."""
    b, t, _ = x.shape
    hd = attn.q.weight.shape[0] // attn.heads
    q = attn.q(x).view(b, t, attn.heads, hd).transpose(1, 2)  # (B, H, T, hd)
    k = attn.k(x).view(b, t, -1, hd).transpose(1, 2)  # (B, Hkv, T, hd)
    v = attn.v(x).view(b, t, -1, hd).transpose(1, 2)  # (B, Hkv, T, hd)
    if rope is not None:
        q, k = apply_rope(q, *rope), apply_rope(k, *rope)
    return q, k, v
