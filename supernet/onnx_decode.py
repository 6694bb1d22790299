"""ONNX export of the decode step, and a generation loop on ONNX Runtime.

Two forms of the step graph, named as ONNX Runtime's and optimum's users expect (:func:`state_name`):

* **the cached decoder**, for a causal model whose every layer keeps exactly a growing key/value cache
  (:func:`supernet.decode.keeps_kv_cache`: softmax, gqa, the sparse types that reach arbitrarily far back):
  ``input_ids`` (batch, sequence) int64, any number of new tokens, and ``past_key_values.{i}.key``,
  ``past_key_values.{i}.value`` (batch, Hkv, past, D) -> ``logits`` (batch, sequence, vocab) and
  ``present.{i}.key``, ``present.{i}.value`` (batch, Hkv, past + sequence, D).  The positions are read off the
  cache's length, so an empty past (``past`` = 0) runs a prompt and one token runs a decode step: optimum's
  ``ORTModelForCausalLM`` runs it as it runs a ``text-generation-with-past`` export (:func:`supernet.decode.extend`);
* **the step** of every other causal model: ``input_ids`` (batch, 1) int64, the new token of each sequence;
  ``position`` (1,) int64, its position (the tokens already seen); layer i's state, as in
  :class:`~supernet.decode.DecodeCache`: a growing key/value cache as ``past_key_values.{i}.key`` / ``.value``
  (batch, Hkv, past, D), any other state as ``past.{i}.{name}``: a rolling window ``k``, ``v`` (batch, Hkv, span,
  D) (+ ``gk``, ``gv`` (batch, Hkv, G, D) for longformer), ``s`` (batch, H, F, D) and ``z`` (batch, H, F) fp32 for
  the linear family, ...  Outputs ``logits`` (batch, 1, vocab) and ``present.*``, the states after the token (a
  growing cache one entry longer), to feed back (:func:`past_of`) at the next step.  A model with a memory
  (:mod:`supernet.memory`) takes this form whatever its layers: its layout's ``position`` carries ``memory`` and
  ``window``, and the generation loops here trim its growing caches to the last ``memory`` entries whenever they
  hold a window (:func:`supernet.memory.trim_feed`), as torch's decoding cache does.

Batch and ``past`` are dynamic.  The graph carries its input layout in its metadata (``decode_inputs``), so
:func:`decode_feed` and :func:`empty_feed` can build inputs from the graph file alone.  A graph exported before
these names (``token``, ``past.0.k``) is refused in one line that says to export again.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

import numpy as np
import torch
import torch.nn as nn
from torch import Tensor

from search_spaces import UserError, tasks

from .decode import extend, keeps_kv_cache, layer_states, step
from .memory import attended, trim_feed
from .model import Transformer
from .onnx_export import DEFAULT_OPSET, INPUT_IDS, LOGITS, _quiet, check_inputs, onnx_session

META_KEY = "decode_inputs"
POSITION = "position"
_NP = {torch.float32: "float32", torch.float16: "float16"}
_KV = {"k": "key", "v": "value"}


# --------------------------------------------------------------------------- names


def state_name(i: int, name: str, grows: bool, part: str = "") -> str:
    """The input that carries layer ``i``'s state ``name``: ``past_key_values.{i}.key`` / ``.value`` for a growing
    key/value cache (``k`` / ``v``: optimum's names; ``part`` ``"decoder"`` / ``"encoder"`` inserts
    ``.decoder`` / ``.encoder`` as in its encoder-decoders), ``past.{i}.{name}`` for any other state (a rolling
    window, a linear type's sums, a convolution's last inputs)."""
    if grows and name in _KV:
        return f"past_key_values.{i}.{part + '.' if part else ''}{_KV[name]}"
    return f"past.{i}.{name}"


def is_state(name: str) -> bool:
    """Whether a step graph's input ``name`` is a state fed back from the step before (:func:`state_name`)."""
    return name.startswith(("past_key_values.", "past."))


def present_of(past: str) -> str:
    """The output that returns the state of input ``past``: ``present.{i}.key``, ``present.{i}.{name}``."""
    return "present." + past.split(".", 1)[1]


def past_of(present: str) -> str:
    """The input that takes back the output ``present`` at the next step (the inverse of :func:`present_of`)."""
    rest = present.split(".", 1)[1]
    return ("past_key_values." if rest.endswith((".key", ".value")) else "past.") + rest


# --------------------------------------------------------------------------- the graph


class DecodeStep(nn.Module):
    """The step as a module of flat tensors: (input_ids, position, *past) -> (logits, *present); the cached decoder
    (``cached``): (input_ids, *past_key_values) -> (logits, *present)."""

    def __init__(self, model: Transformer, cached: bool = False):
        super().__init__()
        self.model, self.cached = model, cached
        self.names = [list(states) for states in layer_states(model)]

    def forward(self, input_ids: Tensor, *rest: Tensor) -> tuple[Tensor, ...]:
        flat = iter(rest if self.cached else rest[1:])
        layers = [{name: next(flat) for name in names} for names in self.names]
        if self.cached:
            logits, new = extend(self.model, input_ids, layers)
        else:
            logits, new = step(self.model, input_ids, rest[0], layers, length=None)
        return (logits, *(layer[name] for layer, names in zip(new, self.names) for name in names))


def input_layout(model: Transformer, cached: bool | None = None) -> dict[str, dict]:
    """Every input of the step graph: name -> {"shape": [...] with "batch" / "sequence" / "past" for the dynamic axes,
    "dtype"}.  ``cached``: the cached decoder's (None: that form where the model :func:`~supernet.decode.keeps_kv_cache`,
    what :func:`export_decode_onnx` writes by default)."""
    if model.tok_emb.weight.dtype not in _NP:
        raise UserError(f"decode step graph: weights of dtype {model.tok_emb.weight.dtype}; expected float32 or float16")
    if cached is None:
        cached = keeps_kv_cache(model)
    elif cached and not keeps_kv_cache(model):
        why = "has a memory" if model.config.memory else "does not"
        raise UserError(f"the cached decoder graph needs every layer to keep a key/value cache and no memory; "
                        f"{model.subnet} {why}")
    dtype = _NP[model.tok_emb.weight.dtype]
    limit = model.config.max_seq_len if model.pos_emb is not None else None  # learned positions end there
    ids = {"shape": ["batch", "sequence" if cached else 1], "dtype": "int64", "vocab_size": model.config.vocab_size}
    layout = {INPUT_IDS: ids if not cached else {**ids, "limit": limit}}
    if not cached:
        layout[POSITION] = {"shape": [1], "dtype": "int64", "limit": limit}
    for i, states in enumerate(layer_states(model)):
        for name, s in states.items():
            layout[state_name(i, name, s.grows)] = {
                "shape": ["batch", *s.shape],
                "dtype": "float32" if s.fp32 else dtype,
                "positive": s.positive,
            }
    if model.config.memory:  # (the one-token step:) a generation loop trims the growing caches to the memory when full
        layout[POSITION].update(memory=model.config.memory, window=model.config.max_seq_len)
    return layout


def is_cached(layout: dict[str, dict]) -> bool:
    """Whether a layout is the cached decoder's (several new tokens, positions read off the past: no ``position``)."""
    return POSITION not in layout


def output_names(layout: dict[str, dict]) -> list[str]:
    """The step graph's outputs for an input layout: ``logits``, then ``present.*`` for each state input, in order."""
    return [LOGITS] + [present_of(n) for n in layout if is_state(n)]


def export_decode_onnx(model: Transformer, path: str | Path, *, opset: int = DEFAULT_OPSET, cached: bool | None = None) -> Path:
    """Write the decode step of ``model`` to ``path`` (dynamic batch and past length; the cached decoder's sequence
    too); return the path.  ``cached``: which form (None: the cached decoder where every layer keeps a key/value
    cache, else the step)."""
    import onnx

    if not model.config.causal:
        raise UserError(f"this model is a bidirectional encoder (task {tasks.with_form('bidirectional')}): it has no decode "
                        "step to export")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    model = model.eval()
    layout = input_layout(model, cached)
    cached = is_cached(layout)
    wrapper = DecodeStep(model, cached).eval()
    dims = {"batch": torch.export.Dim("batch", max=4096), "past": torch.export.Dim("past", max=1 << 20),
            "sequence": torch.export.Dim("sequence", max=max(model.config.max_seq_len, 3))}  # fmt: skip
    example = _zeros_feed(layout, batch_size=2, past=3, position=3, sequence=2)
    dynamic = []
    for spec in layout.values():
        axes = {axis: dims[d] for axis, d in enumerate(spec["shape"]) if isinstance(d, str)}
        dynamic.append(axes or None)
    with _quiet(), torch.no_grad():
        program = torch.onnx.export(
            wrapper,
            tuple(torch.from_numpy(a) for a in example.values()),
            dynamo=True,
            opset_version=opset,
            dynamic_shapes=(dynamic[0], tuple(dynamic[1:])),  # forward(input_ids, *rest): the rest is one varargs entry
            input_names=list(layout),
            output_names=output_names(layout),
            verbose=False,
        )
        program.save(str(path))
    graph = onnx.load(str(path))
    graph.metadata_props.add(key=META_KEY, value=json.dumps(layout))
    onnx.save(graph, str(path))
    return path


def read_layout(graph) -> dict[str, dict]:
    """The input layout stored in a step graph (a path or an ``onnxruntime.InferenceSession``); a graph of an older
    export (``token``, ``past.0.k``) is refused in one line."""
    if isinstance(graph, (str, Path)):
        import onnx

        props = {p.key: p.value for p in onnx.load(str(graph), load_external_data=False).metadata_props}
        where = str(graph)
    else:
        props = graph.get_modelmeta().custom_metadata_map
        where = "the ONNX session"
    if META_KEY not in props:
        raise UserError(f"{where}: not a decode-step graph (no {META_KEY!r} metadata); write one with export_decode_onnx")
    layout = json.loads(props[META_KEY])
    check_inputs(layout, where)
    return layout


def _layout_of(model_or_graph) -> dict[str, dict]:
    return input_layout(model_or_graph) if isinstance(model_or_graph, Transformer) else read_layout(model_or_graph)


def _zeros_feed(layout: dict[str, dict], batch_size: int, past: int, position: int, sequence: int = 1) -> dict[str, np.ndarray]:
    sizes = {"batch": batch_size, "past": past, "sequence": sequence}
    feed = {}
    for name, spec in layout.items():
        shape = [sizes.get(d, d) if isinstance(d, str) else d for d in spec["shape"]]
        feed[name] = np.zeros(shape, dtype=spec["dtype"])
    if POSITION in feed:
        feed[POSITION][:] = position
    return feed


def empty_feed(model_or_graph, batch_size: int) -> dict[str, np.ndarray]:
    """Inputs of the first step (nothing seen; the token is still to be set): empty caches, zero states."""
    return _zeros_feed(_layout_of(model_or_graph), batch_size, past=0, position=0)


def decode_feed(model_or_graph, batch_size: int, context: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Inputs to time one step at ``context`` tokens already seen: random tokens and states of the right shapes.

    ``model_or_graph``: a :class:`Transformer`, or a step graph (path or ONNX Runtime session)
    written by :func:`export_decode_onnx`.  Growing key/value caches get ``context`` entries;
    linear normalisers ``z`` are positive, so outputs stay finite.  Usage::

        session = onnx_session(export_decode_onnx(model, "step.onnx"), threads=1)
        feed = decode_feed("step.onnx", 1, 4096, np.random.default_rng(0))
        session.run(["logits"], feed)  # time this
    """
    if batch_size < 1 or context < 0:
        raise UserError(f"decode_feed: batch_size {batch_size}, context {context}; expected batch >= 1 and context >= 0")
    layout = _layout_of(model_or_graph)
    limit = layout[POSITION if POSITION in layout else INPUT_IDS].get("limit")
    if limit is not None and context >= limit:
        raise UserError(
            f"decode_feed: context {context} is past max_seq_len {limit}: the model has learned positions, which end there"
        )
    position = layout.get(POSITION, {})
    past = attended(context, position.get("memory", 0), position.get("window", 0))  # a memory bounds the cache a step reads
    feed = _zeros_feed(layout, batch_size, past=past, position=context)
    ids = layout[INPUT_IDS]
    feed[INPUT_IDS] = rng.integers(0, ids.get("vocab_size", 2), size=feed[INPUT_IDS].shape, dtype=np.int64)
    for name, a in feed.items():
        if is_state(name):
            r = rng.standard_normal(a.shape, dtype=np.float32)
            feed[name] = (np.abs(r) + 1.0 if layout[name].get("positive") else r).astype(a.dtype)
    return feed


def onnx_decode_logits(session, tokens: np.ndarray, progress: Callable[[int], None] | None = None,
                       prompt: int = 0) -> np.ndarray:  # fmt: skip
    """Feed ``tokens`` (B, T) through the step graph one at a time (teacher forcing): logits (B, T, V).  ``prompt``:
    the cached decoder reads the first ``prompt`` tokens in one call (a prompt), the rest one at a time.  A graph with
    a memory has its caches trimmed to it whenever they hold a window (:func:`supernet.memory.trim_feed`), as torch's
    decoding cache does."""
    feed, layout = empty_feed(session, tokens.shape[0]), read_layout(session)
    if prompt and not is_cached(layout):
        raise UserError("onnx_decode_logits: a prompt in one call needs the cached decoder graph; this step graph reads "
                        "one token per call")
    outs, t = [], 0
    while t < tokens.shape[1]:
        n = prompt if t == 0 and prompt else 1
        logits, feed = _run_step(session, trim_feed(feed, layout), tokens[:, t : t + n], t)
        outs.append(logits)
        t += n
        if progress is not None:
            progress(n)
    return np.concatenate(outs, axis=1)


def onnx_generate(
    session,
    prompt: np.ndarray,
    max_new_tokens: int,
    *,
    temperature: float = 0.0,
    rng: np.random.Generator | None = None,
    progress: Callable[[int], None] | None = None,
) -> np.ndarray:
    """Continue ``prompt`` (B, T>=1) int64 by ``max_new_tokens`` on ONNX Runtime: the new tokens (B, N).

    The cached decoder reads the prompt in one call; the step graph reads it token by token (no separate prefill
    graph).  Then each new token is fed back with the states.  ``temperature == 0`` is greedy; otherwise sample
    with ``rng``.
    """
    if prompt.ndim != 2 or prompt.shape[1] < 1:
        raise UserError(f"onnx_generate: prompt of shape {prompt.shape}; expected (batch, at least 1 token)")
    if temperature > 0 and rng is None:
        raise UserError("onnx_generate: sampling (temperature > 0) needs an rng")
    layout = read_layout(session)
    feed = _zeros_feed(layout, prompt.shape[0], past=0, position=0)
    chunks = [prompt] if is_cached(layout) else [prompt[:, t : t + 1] for t in range(prompt.shape[1])]
    seen = 0
    for chunk in chunks:
        logits, feed = _run_step(session, trim_feed(feed, layout), chunk, seen)
        seen += chunk.shape[1]
    new = []
    for n in range(max_new_tokens):
        last = logits[:, -1].astype(np.float64)  # (B, V)
        if temperature <= 0:
            nxt = last.argmax(-1)
        else:
            p = np.exp((last - last.max(-1, keepdims=True)) / temperature)
            p /= p.sum(-1, keepdims=True)
            nxt = np.array([rng.choice(p.shape[1], p=row) for row in p])
        new.append(nxt)
        if progress is not None:
            progress(1)
        if n + 1 < max_new_tokens:
            logits, feed = _run_step(session, trim_feed(feed, layout), nxt[:, None], prompt.shape[1] + n)
    return np.stack(new, axis=1).astype(np.int64)


def _run_step(session, feed: dict[str, np.ndarray], tokens: np.ndarray,
              position: int) -> tuple[np.ndarray, dict[str, np.ndarray]]:  # fmt: skip
    """Run ``tokens`` (B, S) at ``position`` (the tokens already seen; the cached decoder reads it off its caches)."""
    feed[INPUT_IDS] = np.ascontiguousarray(tokens, dtype=np.int64)
    if POSITION in feed:
        feed[POSITION] = np.array([position], dtype=np.int64)
    names = [o.name for o in session.get_outputs()]
    outs = session.run(names, feed)
    for name, value in zip(names[1:], outs[1:]):
        feed[past_of(name)] = value
    return outs[0], feed


__all__ = [
    "DecodeStep",
    "decode_feed",
    "empty_feed",
    "export_decode_onnx",
    "input_layout",
    "is_cached",
    "onnx_decode_logits",
    "onnx_generate",
    "onnx_session",
    "output_names",
    "past_of",
    "present_of",
    "read_layout",
    "state_name",
]
