"""ONNX export of the decode step, and a generation loop on ONNX Runtime.

The step graph is :func:`supernet.decode.step` traced functionally.  Inputs:

* ``token`` (batch, 1) int64: the new token of each sequence;
* ``position`` (1,) int64: its position (the tokens already seen);
* ``past.{i}.{name}``: layer i's state, as in :class:`~supernet.decode.DecodeCache`:
  ``k``, ``v`` (batch, Hkv, past, D) for a growing key/value cache (``past`` == position),
  ``k``, ``v`` (batch, Hkv, span, D) for a rolling window (+ ``gk``, ``gv`` (batch, Hkv, G, D)
  for longformer), ``s`` (batch, H, F, D) and ``z`` (batch, H, F) fp32 for the linear family.

Outputs ``logits`` (batch, 1, vocab) and ``present.{i}.{name}``, the states after the token (a
growing cache one entry longer), to feed back as ``past.*`` at the next step.  Batch and
``past`` are dynamic.  The graph carries its input layout in its metadata (``decode_inputs``),
so :func:`decode_feed` and :func:`empty_feed` can build inputs from the graph file alone.
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

from .decode import layer_states, step
from .memory import attended, trim_feed
from .model import Transformer
from .onnx_export import DEFAULT_OPSET, _quiet, onnx_session

META_KEY = "decode_inputs"
_NP = {torch.float32: "float32", torch.float16: "float16"}


class DecodeStep(nn.Module):
    """The step as a module of flat tensors: (token, position, *past) -> (logits, *present)."""

    def __init__(self, model: Transformer):
        super().__init__()
        self.model = model
        self.names = [list(states) for states in layer_states(model)]

    def forward(self, token: Tensor, position: Tensor, *past: Tensor) -> tuple[Tensor, ...]:
        flat = iter(past)
        layers = [{name: next(flat) for name in names} for names in self.names]
        logits, new = step(self.model, token, position, layers, length=None)
        return (logits, *(layer[name] for layer, names in zip(new, self.names) for name in names))


def input_layout(model: Transformer) -> dict[str, dict]:
    """Every input of the step graph: name -> {"shape": [...] with "batch" / "past" for the dynamic axes, "dtype"}."""
    if model.tok_emb.weight.dtype not in _NP:
        raise UserError(f"decode step graph: weights of dtype {model.tok_emb.weight.dtype}; expected float32 or float16")
    dtype = _NP[model.tok_emb.weight.dtype]
    layout = {"token": {"shape": ["batch", 1], "dtype": "int64"}, "position": {"shape": [1], "dtype": "int64"}}
    for i, states in enumerate(layer_states(model)):
        for name, s in states.items():
            layout[f"past.{i}.{name}"] = {
                "shape": ["batch", *s.shape],
                "dtype": "float32" if s.fp32 else dtype,
                "positive": s.positive,
            }
    layout["token"]["vocab_size"] = model.config.vocab_size
    layout["position"]["limit"] = model.config.max_seq_len if model.pos_emb is not None else None  # learned positions end there
    if model.config.memory:  # a generation loop trims the growing caches to the memory when they are full
        layout["position"].update(memory=model.config.memory, window=model.config.max_seq_len)
    return layout


def output_names(layout: dict[str, dict]) -> list[str]:
    """The step graph's outputs for an input layout: ``logits``, then ``present.*`` for each ``past.*`` input, in order."""
    return ["logits"] + [n.replace("past.", "present.", 1) for n in layout if n.startswith("past.")]


def export_decode_onnx(model: Transformer, path: str | Path, *, opset: int = DEFAULT_OPSET) -> Path:
    """Write the decode step of ``model`` to ``path`` (dynamic batch and past length); return the path."""
    import onnx

    if not model.config.causal:
        raise UserError(f"this model is a bidirectional encoder (task {tasks.with_form('bidirectional')}): it has no decode "
                        "step to export")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    model = model.eval()
    wrapper = DecodeStep(model).eval()
    layout = input_layout(model)
    batch = torch.export.Dim("batch", max=4096)
    past = torch.export.Dim("past", max=1 << 20)
    example = _zeros_feed(layout, batch_size=2, past=3, position=3)
    dynamic = []
    for spec in layout.values():
        axes = {axis: {"batch": batch, "past": past}[d] for axis, d in enumerate(spec["shape"]) if isinstance(d, str)}
        dynamic.append(axes or None)
    with _quiet(), torch.no_grad():
        program = torch.onnx.export(
            wrapper,
            tuple(torch.from_numpy(a) for a in example.values()),
            dynamo=True,
            opset_version=opset,
            dynamic_shapes=(dynamic[0], dynamic[1], tuple(dynamic[2:])),  # *past is one varargs entry
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
    """The input layout stored in a step graph (a path or an ``onnxruntime.InferenceSession``)."""
    if isinstance(graph, (str, Path)):
        import onnx

        props = {p.key: p.value for p in onnx.load(str(graph), load_external_data=False).metadata_props}
        where = str(graph)
    else:
        props = graph.get_modelmeta().custom_metadata_map
        where = "the ONNX session"
    if META_KEY not in props:
        raise UserError(f"{where}: not a decode-step graph (no {META_KEY!r} metadata); write one with export_decode_onnx")
    return json.loads(props[META_KEY])


def _layout_of(model_or_graph) -> dict[str, dict]:
    return input_layout(model_or_graph) if isinstance(model_or_graph, Transformer) else read_layout(model_or_graph)


def _zeros_feed(layout: dict[str, dict], batch_size: int, past: int, position: int) -> dict[str, np.ndarray]:
    feed = {}
    for name, spec in layout.items():
        shape = [{"batch": batch_size, "past": past}.get(d, d) if isinstance(d, str) else d for d in spec["shape"]]
        feed[name] = np.zeros(shape, dtype=spec["dtype"])
    feed["position"][:] = position
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
    limit = layout["position"].get("limit")
    if limit is not None and context >= limit:
        raise UserError(
            f"decode_feed: context {context} is past max_seq_len {limit}: the model has learned positions, which end there"
        )
    past = attended(context, layout["position"].get("memory", 0), layout["position"].get("window", 0))  # memory: bounded
    feed = _zeros_feed(layout, batch_size, past=past, position=context)
    feed["token"] = rng.integers(0, layout["token"].get("vocab_size", 2), size=feed["token"].shape, dtype=np.int64)
    for name, a in feed.items():
        if name.startswith("past."):
            r = rng.standard_normal(a.shape, dtype=np.float32)
            feed[name] = (np.abs(r) + 1.0 if layout[name].get("positive", name.endswith(".z")) else r).astype(
                a.dtype
            )  # (graphs before "positive": z)
    return feed


def onnx_decode_logits(session, tokens: np.ndarray, progress: Callable[[int], None] | None = None) -> np.ndarray:
    """Feed ``tokens`` (B, T) through the step graph one at a time (teacher forcing): logits (B, T, V)."""
    feed, layout = empty_feed(session, tokens.shape[0]), read_layout(session)
    outs = []
    for t in range(tokens.shape[1]):
        logits, feed = _run_step(session, trim_feed(feed, layout), tokens[:, t : t + 1], t)
        outs.append(logits)
        if progress is not None:
            progress(1)
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

    The prompt goes through the step graph token by token (no separate prefill graph), then each
    new token is fed back with the states.  ``temperature == 0`` is greedy; otherwise sample with ``rng``.
    """
    if prompt.ndim != 2 or prompt.shape[1] < 1:
        raise UserError(f"onnx_generate: prompt of shape {prompt.shape}; expected (batch, at least 1 token)")
    if temperature > 0 and rng is None:
        raise UserError("onnx_generate: sampling (temperature > 0) needs an rng")
    feed, layout = empty_feed(session, prompt.shape[0]), read_layout(session)
    for t in range(prompt.shape[1]):
        logits, feed = _run_step(session, trim_feed(feed, layout), prompt[:, t : t + 1], t)
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


def _run_step(session, feed: dict[str, np.ndarray], token: np.ndarray, position: int) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    feed["token"] = np.ascontiguousarray(token, dtype=np.int64)
    feed["position"] = np.array([position], dtype=np.int64)
    names = [o.name for o in session.get_outputs()]
    outs = session.run(names, feed)
    for name, value in zip(names[1:], outs[1:]):
        feed[name.replace("present.", "past.", 1)] = value
    return outs[0], feed


__all__ = [
    "DecodeStep",
    "decode_feed",
    "empty_feed",
    "export_decode_onnx",
    "input_layout",
    "onnx_decode_logits",
    "onnx_generate",
    "onnx_session",
    "output_names",
    "read_layout",
]
