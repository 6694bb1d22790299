"""Weight-stripped ONNX graphs of static models, cached on disk, and sessions over them.

Timing does not depend on weight values, so a model's graph is kept without its weights: every
weight is an initializer in an external-data layout (offset, bytes, dtype) whose file is not
kept.  A session writes random weights into that layout in a temporary folder, opens the model,
and deletes the folder.  Graphs are a few hundred KB instead of up to ~340 MB, so hundreds fit in
a cache and in the ARM bundle.  (Sessions: :func:`latency.timing_core.ort_session`.)  Graphs are
stitched from shape-generic parts, exported once per attention type (see below): the prefill
graph ``input_ids -> logits`` (:func:`cached_graph`) and the decode-step graph (:func:`cached_decode_graph`,
the inputs and outputs of :mod:`supernet.onnx_decode`'s one-token step).

Cache: ``$NAS_CACHE`` or ``~/.cache/nas-transformers``, under ``onnx/torch-<version>-opset<N>-format<F>/``:
``generic/<key hash>.onnx`` per part (+ ``.json``: what it is), and per model shape one
``<config hash>.onnx`` (prefill) or ``step-<config hash>.onnx`` (decode step) + ``.json`` (the layout).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import tempfile
from dataclasses import asdict
from pathlib import Path

import torch

from search_spaces.attention import AttentionSpec
from supernet.onnx_export import INPUT_IDS

ALIGN = 4096


def cache_root() -> Path:
    return Path(os.environ.get("NAS_CACHE") or Path.home() / ".cache" / "nas-transformers")


def config_key(config) -> str:
    """A stable name for a static model's shape (its TransformerConfig; a memory only where there is one, so the
    graphs of models without one keep the names they had before memory was a field)."""
    fields = {k: v for k, v in asdict(config).items() if k != "memory" or v}
    return hashlib.sha256(json.dumps(fields, sort_keys=True, default=str).encode()).hexdigest()[:16]


# Bump when what a cached graph holds changes (names, inputs, layout): older entries are then not reused.
# 2: prefill and decode graphs stitched from generic parts, weights named as in the state dict.
# 3: parts keyed by head count where not generic in it (one block function; types with weights of their own).
# 4: the field's input names: input_ids (was tokens / token), past_key_values.{i}.key / .value for growing caches.
GRAPH_FORMAT = 4


def graph_dir() -> Path:
    import torch

    from supernet.onnx_export import DEFAULT_OPSET

    from supernet.attention import ort_ops

    custom = "-nas.kernels" if ort_ops.active() else ""  # --custom-ops: graphs of their own
    return cache_root() / "onnx" / f"torch-{torch.__version__}-opset{DEFAULT_OPSET}-format{GRAPH_FORMAT}{custom}"


def weights_location(name: str) -> str:
    return f"{name}.weights"


# --------------------------------------------------------------------------- shape-generic parts
#
# Exporting costs seconds per layer here (tracing, decompositions, optimisation: 3-30 s per block
# on this 2-core machine, the linear family the most), and a space has hundreds of distinct layer
# choices.  So parts are exported *shape-generic*: a part's weights are graph inputs whose sizes
# are symbols (E embedding width, A = heads x head_dim, K = key/value width, F FFN width), and one
# export per attention type serves every width, head count and FFN size.  A model's graph is
# stitched from the embedding, one generic block per layer and the head; each weight input becomes
# an initializer of the model's shape in the external-data layout (so no weights are needed: a
# meta-device model is enough).  ONNX Runtime folds the shape arithmetic on those constant
# initializers, so the session runs the same compute ops as a one-piece export (tested; timing
# compared side by side by ``scripts/bench_latency_graphs.py``).  The decode step is stitched the
# same way from a step embedding (token, position -> x and the rotary angles), one generic decode
# block per layer (its state in, the next state out; a growing cache's length is a symbol too) and
# the prefill head.

# distinct, none 0 or 1 nor a multiple of 4 (heads x head_dim): the exporter would merge or specialise them
EXAMPLE_SIZES = {"E": 50, "F": 82, "past": 5}
PROBE_SIZES = (58, 90)  # other E, F: which axes of a weight are E or F is read by probing
FORM_HEADS = (13, 17)  # head counts at which a layer's head-dependent sizes are read (the first is traced)


class _Embed(torch.nn.Module):
    def __init__(self, learned: bool):
        super().__init__()
        self.learned = learned

    def forward(self, idx, tok, pos=None):
        from supernet.model import embed

        return embed(idx, tok, pos if self.learned else None)  # (B, T, E)


class _Block(torch.nn.Module):
    """:func:`supernet.model.block` with its weights as inputs (``names``: their state-dict names, in order)."""

    def __init__(self, spec: AttentionSpec, head_dim: int, max_seq_len: int, rope: bool, names: list[str], causal: bool = True):
        super().__init__()
        from supernet.model import rope_tables

        self.spec, self.head_dim, self.rope, self.names = spec, head_dim, rope, names
        self.causal = causal
        if rope:
            cos, sin = rope_tables(max_seq_len, head_dim)
            self.register_buffer("rope_cos", cos)
            self.register_buffer("rope_sin", sin)

    def forward(self, x, *weights):
        from supernet.model import BlockWeights, block

        t = x.shape[1]
        rope = (self.rope_cos[:t], self.rope_sin[:t]) if self.rope else None
        w = BlockWeights.from_named(dict(zip(self.names, weights)))
        return block(x, w, self.spec, self.head_dim, rope, causal=self.causal)[0]  # (B, T, E)


class _Head(torch.nn.Module):
    def forward(self, x, ln_w, ln_b, tok):
        from supernet.model import lm_head

        return lm_head(x, (ln_w, ln_b), tok)  # (B, T, vocab)


class _DecodeEmbed(torch.nn.Module):
    """The step's input (:func:`supernet.decode.step`): the token's embedding (B, 1, E), plus its learned
    position, or for rotary models also cos, sin (1, D/2) at its position, which every block takes."""

    def __init__(self, learned: bool, head_dim: int):
        super().__init__()
        self.learned, self.head_dim = learned, head_dim

    def forward(self, token, position, tok, pos=None):
        from supernet.model import embed, rope_at

        x = embed(token, tok, pos if self.learned else None, position)  # (B, 1, E)
        return x if self.learned else (x, *rope_at(position, self.head_dim))


class _DecodeBlock(torch.nn.Module):
    """One layer of the decode step (:func:`supernet.model.block` with a functional :class:`~supernet.model.Step`),
    its state and weights as inputs: ``forward(x, position, [cos, sin,] *state, *weights) -> (x', *new state)``."""

    def __init__(self, spec: AttentionSpec, head_dim: int, rope: bool, state_names: list[str], names: list[str]):
        super().__init__()
        self.spec, self.head_dim, self.rope = spec, head_dim, rope
        self.state_names, self.names = state_names, names

    def forward(self, x, position, *rest):
        from supernet.model import BlockWeights, Step, block

        rope, rest = (rest[:2], rest[2:]) if self.rope else (None, rest)
        n = len(self.state_names)
        state, w = dict(zip(self.state_names, rest[:n])), BlockWeights.from_named(dict(zip(self.names, rest[n:])))
        x, new = block(x, w, self.spec, self.head_dim, rope, Step(state, position, None))
        return (x, *(new[name] for name in self.state_names))


# --------------------------------------------------------------------------- heads: generic or static
#
# A part is generic in the layer's head count H when every head-dependent size of the layer (its
# key / value heads, its type's own weights and decoding state) is a constant or c x H: read at
# two head counts (FORM_HEADS) and checked at the layer's own.  Key / value heads fixed at another
# count (grouped-query) keep the part static: the exporter's fused Attention needs both head
# counts static.  A static part is exported per head count.


def _head_sizes(typ, spec, heads: int, hd: int, max_seq_len: int | None = None) -> dict[str, tuple]:
    """Every head-dependent size of a layer: key / value heads, the type's weights and states (batch axis left out;
    an encoder-only type has no decoding state)."""
    hk, hv = typ.heads(spec, heads)
    out = {"heads:k": (hk,), "heads:v": (hv,)}
    out.update({f"w:{n}": tuple(s) for n, s in typ.weights(spec, heads, hd, max_seq_len=max_seq_len).items()})
    if "causal" in typ.forms:
        out.update({f"s:{n}": tuple(s.shape) for n, s in typ.state(spec, heads, hd).items()})
    return out


def _per_head(x, y, hx: int, hy: int) -> int | None:
    """c if sizes x, y at head counts hx, hy are c x hx and c x hy (c >= 1); 0 if constant; None otherwise."""
    if x == y:
        return 0
    if isinstance(x, int) and isinstance(y, int) and x % hx == 0 and x // hx >= 1 and y == x // hx * hy:
        return x // hx
    return None


def generic_in_heads(typ, spec, heads: int, hd: int, max_seq_len: int | None = None) -> bool:
    """Whether a part traced at another head count serves this layer (see above)."""
    (a, b), c = FORM_HEADS, heads
    sa, sb, sc = (_head_sizes(typ, spec, h, hd, max_seq_len) for h in (a, b, c))
    if not (sa.keys() == sb.keys() == sc.keys()) or any(len({len(sa[n]), len(sb[n]), len(sc[n])}) != 1 for n in sa):
        return False
    for name in sa:
        for x, y, z in zip(sa[name], sb[name], sc[name]):
            per = _per_head(x, y, a, b)
            if per is None or (per == 0 and z != x) or (per and z != per * c):
                return False
    return all(sa[f"heads:{p}"][0] in (0, a) for p in "kv")


def _weights(names: list[str]) -> dict[str, str]:
    """A part's weight inputs ``w0, w1, ...`` bound to the model's state-dict ``names``."""
    return {f"w{j}": n for j, n in enumerate(names)}


def _shared(model) -> dict:
    c = model.config
    # an encoder's parts are bidirectional; "causal" is left out of a causal model's keys (its cached parts stay valid)
    form = {} if c.causal else {"causal": False}
    return {"vocab": c.vocab_size, "max_seq_len": c.max_seq_len, "head_dim": c.head_dim, "positions": c.positions, **form}


def _block_key(model, i: int, part: str) -> dict:
    """A block part's key: the attention spelling and, unless the part is generic in the head count, the count."""
    from supernet.attention import get

    attn = model.blocks[i].attn
    generic = generic_in_heads(get(attn.spec), attn.spec, attn.heads, model.config.head_dim, model.config.max_seq_len)
    return {**_shared(model), "part": part, "attention": str(attn.spec), "heads": None if generic else attn.heads}


def _block_names(model, i: int) -> list[str]:
    """The block's weights (state-dict names within the block) in the order its part takes them."""
    from supernet.model import block_weight_shapes

    attn, layer = model.blocks[i].attn, model.config.layers[i]
    return list(
        block_weight_shapes(
            attn.typ, attn.spec, model.config.embed_dim, attn.heads, layer.ffn_dim, model.config.head_dim,
            max_seq_len=model.config.max_seq_len,
        )
    )


def _head(model, x: str) -> dict:
    return {
        "key": {**_shared(model), "part": "head"},
        "bind": {"x": x, **_weights(["ln_f.weight", "ln_f.bias", "tok_emb.weight"]), "y": "logits"},
    }


def _parts(model) -> list[dict]:
    """Every part of ``model``'s prefill graph in order: its generic key and how its inputs and outputs bind.

    ``key`` names the generic graph (what it depends on: never a width); ``bind`` maps each input
    and output of the part to a value of the model's graph: a state-dict name (a weight), a graph
    input or output, or ``h{i}``, the activations between parts.
    """
    learned = model.config.positions == "learned"
    embed = ["tok_emb.weight"] + (["pos_emb.weight"] if learned else [])
    out = [{"key": {**_shared(model), "part": "embed"}, "bind": {"x": INPUT_IDS, **_weights(embed), "y": "h0"}}]
    for i in range(len(model.blocks)):
        weights = _weights([f"blocks.{i}.{n}" for n in _block_names(model, i)])
        out.append({"key": _block_key(model, i, "block"), "bind": {"x": f"h{i}", **weights, "y": f"h{i + 1}"}})
    return out + [_head(model, f"h{len(model.blocks)}")]


def _name(fields: dict) -> str:
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:16]


def generic_part(key: dict) -> tuple[torch.nn.Module, tuple, tuple, list[str], list[str]]:
    """The module of a generic part, example inputs, their dynamic shapes (as the exporter takes them),
    and the names of its inputs and outputs."""
    Dim = torch.export.Dim
    L, V, hd = key["max_seq_len"], key["vocab"], key["head_dim"]
    batch, seq = Dim("batch", max=4096), Dim("seq", max=L)
    E, F_ = Dim("E", min=2, max=1 << 16), Dim("F", min=2, max=1 << 20)
    e = EXAMPLE_SIZES["E"]
    learned = key["positions"] == "learned"
    if key["part"] in ("embed", "decode-embed"):
        weights = (torch.randn(V, e),) + ((torch.randn(L, e),) if learned else ())
        wshapes = ({1: E},) + (({1: E},) if learned else ())
        names = [f"w{j}" for j in range(len(weights))]
        if key["part"] == "embed":
            tokens = torch.zeros(2, L, dtype=torch.long)  # (2, T)
            return _Embed(learned), (tokens, *weights), ({0: batch, 1: seq}, *wshapes), ["x", *names], ["y"]
        token, position = torch.zeros(2, 1, dtype=torch.long), torch.tensor([EXAMPLE_SIZES["past"]])
        outputs = ["y"] + (
            [] if learned else ["rope_cos", "rope_sin"]
        )  # ("cos" would clash: the exporter names Cos nodes' outputs so)
        return (
            _DecodeEmbed(learned, hd),
            (token, position, *weights),
            ({0: batch}, None, *wshapes),
            ["token", "position", *names],
            outputs,
        )
    if key["part"] == "head":
        x = torch.randn(2, L, e)  # (2, T, E)
        return (
            _Head(),
            (x, torch.ones(e), torch.zeros(e), torch.randn(V, e)),
            ({0: batch, 1: seq, 2: E}, {0: E}, {0: E}, {1: E}),
            ["x", "w0", "w1", "w2"],
            ["y"],
        )
    return _block_part(key, batch, seq, E, F_)


def _symbolic(sizes: list[tuple], probes: list[tuple[list[tuple], object, int, int]]) -> list[dict]:
    """Per tensor, {axis: Dim} for the axes that change in a probe: ``(sizes', dim, n, n')``, n -> n' scales them."""
    out = []
    for j, shape in enumerate(sizes):
        axes = {}
        for other, dim, n, n2 in probes:
            for axis, (x, y) in enumerate(zip(shape, other[j])):
                if x != y:
                    per = _per_head(x, y, n, n2)
                    assert per, (shape, other[j], n, n2)
                    axes[axis] = dim if per == 1 else per * dim
        out.append(axes)
    return out


def _block_part(key: dict, batch, seq, E, F_):
    """A block part (prefill or decode step) at the traced head count; E, F (and H where generic) symbolic.

    Which axis of which weight or state is E, F or c x H is read by probing the shapes at other
    sizes (nothing is inferred from equal numbers)."""
    from search_spaces import parse_attention
    from supernet.attention import get
    from supernet.model import block_weight_shapes

    Dim = torch.export.Dim
    L, hd, e, f = key["max_seq_len"], key["head_dim"], EXAMPLE_SIZES["E"], EXAMPLE_SIZES["F"]
    spec = parse_attention(key["attention"])
    typ = get(spec)
    generic, heads = key["heads"] is None, key["heads"] or FORM_HEADS[0]
    H, (e2, f2), h2 = Dim("H", min=1, max=4096), PROBE_SIZES, FORM_HEADS[1]

    def shapes(e_, h_, f_):
        return list(block_weight_shapes(typ, spec, e_, h_, f_, hd, max_seq_len=L).values())

    names = list(block_weight_shapes(typ, spec, e, heads, f, hd, max_seq_len=L))
    wsizes = shapes(e, heads, f)
    probes = [(shapes(e2, heads, f), E, e, e2), (shapes(e, heads, f2), F_, f, f2)]
    if generic:
        probes.append((shapes(e, h2, f), H, heads, h2))
    wdims = _symbolic(wsizes, probes)
    weights = [torch.randn(*shape) * 0.02 for shape in wsizes]
    wnames = [f"w{j}" for j in range(len(weights))]
    rope = key["positions"] == "rope"
    if key["part"] == "block":
        # (2, T, E) with T below max_seq_len: at T == L the exporter would fix T where a type slices a (., L)
        # weight to the first T columns (linformer's projections); a 2D type's T: a square grid (its trace_length)
        x = torch.randn(2, typ.trace_length(L), e)
        module = _Block(spec, hd, L, rope, names, key.get("causal", True))
        return module, (x, *weights), ({0: batch, 1: seq, 2: E}, tuple(wdims)), ["x", *wnames], ["y"]  # forward(x, *weights)
    assert key["part"] == "decode-block", key
    states, past = typ.state(spec, heads, hd), Dim("past", max=1 << 20)
    ssizes = [(2, *s.resolve(EXAMPLE_SIZES["past"])) for s in states.values()]
    probes = (
        [([(2, *s.resolve(EXAMPLE_SIZES["past"])) for s in typ.state(spec, h2, hd).values()], H, heads, h2)] if generic else []
    )
    extra = [torch.rand(shape) + 1.0 if s.positive else torch.randn(shape) for shape, s in zip(ssizes, states.values())]
    extra_dims = [{0: batch, **{axis + 1: past for axis, d in enumerate(s.shape) if d == "past"}, **axes}
                  for s, axes in zip(states.values(), _symbolic(ssizes, probes))]  # fmt: skip
    module = _DecodeBlock(spec, hd, rope, list(states), names)
    if rope:
        from supernet.model import rope_at

        extra, extra_dims = [*rope_at(torch.tensor([EXAMPLE_SIZES["past"]]), hd), *extra], [None, None, *extra_dims]
    snames = (["rope_cos", "rope_sin"] if rope else []) + [f"s{j}" for j in range(len(states))]
    x, position = torch.randn(2, 1, e), torch.tensor([EXAMPLE_SIZES["past"]])
    inputs, outputs = ["x", "position", *snames, *wnames], ["y"] + [f"n{j}" for j in range(len(states))]
    return module, (x, position, *extra, *weights), ({0: batch, 2: E}, None, (*extra_dims, *wdims)), inputs, outputs


def export_part(key: dict, path: Path) -> Path:
    """One generic part to ONNX (opset and exporter of supernet.onnx_export), inputs and outputs named as
    :func:`generic_part` says (``x``, ``w0, w1, ...`` for the weights, ``y``, ...)."""
    from supernet.attention import ort_ops
    from supernet.onnx_export import DEFAULT_OPSET, _quiet

    module, example, shapes, names, outputs = generic_part(key)
    with _quiet(), torch.no_grad():
        program = torch.onnx.export(
            module.eval(),
            example,
            dynamo=True,
            opset_version=DEFAULT_OPSET,
            dynamic_shapes=shapes,
            input_names=names,
            output_names=outputs,
            verbose=False,
            custom_translation_table=ort_ops.translation_table(),  # --custom-ops: the nas.kernels operators
        )
        program.save(str(path))
    return path


def stitch(parts: list, binds: list[dict[str, str]], shapes: dict[str, tuple[int, ...]], location: str,
           outputs: list[str], input_dims: dict[str, list] | None = None):  # fmt: skip
    """Join generic part graphs into one model of one shape.

    ``binds[i]`` maps every input and output of part ``i`` to a value of the model: a name in
    ``shapes`` is a weight, an initializer of that shape (shared when two parts bind it: the tied
    embedding) stored as float32 external data laid end to end in ``location``; a name no earlier
    part produces is a graph input (its dims from ``input_dims`` where given); ``outputs`` name the
    graph's outputs; other names join one part's output to later parts' inputs.  Returns the model
    and the layout (name, offset, nbytes, dtype) of its weights.
    """
    import onnx

    graph = onnx.GraphProto(name="stitched")
    tensors, offset = [], 0
    for name in dict.fromkeys(n for bind in binds for n in bind.values() if n in shapes):  # each weight once, in order of use
        offset = -(-offset // ALIGN) * ALIGN
        dims = shapes[name]
        nbytes = 4 * math.prod(dims)
        t = graph.initializer.add()
        t.name, t.data_type, t.data_location = name, onnx.TensorProto.FLOAT, onnx.TensorProto.EXTERNAL
        t.dims.extend(dims)
        for k, v in (("location", location), ("offset", str(offset)), ("length", str(nbytes))):
            entry = t.external_data.add()
            entry.key, entry.value = k, v
        tensors.append({"name": name, "offset": offset, "nbytes": nbytes, "dtype": "float32"})
        offset += nbytes
    produced, found = set(), {}
    for i, (part, bind) in enumerate(zip(parts, binds)):
        g = part.graph
        missing = [v.name for v in (*g.input, *g.output) if v.name not in bind]
        assert not missing, f"part {i}: inputs/outputs {missing} not bound"

        def rename(n: str) -> str:
            return bind.get(n, f"p{i}/{n}") if n else n

        for inp in g.input:
            name = bind[inp.name]
            if name not in shapes and name not in produced and all(x.name != name for x in graph.input):
                new = graph.input.add()
                new.CopyFrom(inp)
                new.name = name
                if input_dims and name in input_dims:
                    _set_dims(new, input_dims[name])
        for init in g.initializer:  # the part's own constants (rope tables, shape constants): kept inline
            new = graph.initializer.add()
            new.CopyFrom(init)
            new.name = rename(init.name)
        for node in g.node:
            assert not any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute), (
                node.op_type
            )
            new = graph.node.add()
            new.CopyFrom(node)
            new.name = f"p{i}/{node.name}"
            new.input[:] = [rename(n) for n in node.input]
            new.output[:] = [rename(n) for n in node.output]
        # No value_info: its symbolic sizes (E, A, F) mean other numbers in different parts, which
        # would mislead ONNX Runtime's memory planner; it infers the shapes itself.
        for out in g.output:
            produced.add(bind[out.name])
            found[bind[out.name]] = out
    for name in outputs:
        new = graph.output.add()
        new.CopyFrom(found[name])
        new.name = name
        for d in new.type.tensor_type.shape.dim:  # keep static sizes; symbolic ones are the part's own symbols
            if d.HasField("dim_param"):
                d.ClearField("dim_param")
    opsets: dict[str, int] = {}
    for part in parts:
        for o in part.opset_import:
            opsets[o.domain] = max(opsets.get(o.domain, 0), o.version)
    model = onnx.helper.make_model(
        graph, opset_imports=[onnx.helper.make_opsetid(d, v) for d, v in opsets.items()], producer_name="nas-transformers"
    )
    model.ir_version = max(p.ir_version for p in parts)
    return model, tensors


def _set_dims(value_info, dims: list) -> None:
    """Give a graph input the dims ``dims`` (ints, or names of dynamic axes)."""
    shape = value_info.type.tensor_type.shape
    del shape.dim[:]
    for d in dims:
        if isinstance(d, str):
            shape.dim.add().dim_param = d
        else:
            shape.dim.add().dim_value = int(d)


def _stitched(model, directory: Path, name: str, parts: list[dict], outputs: list[str], input_dims: dict | None = None):
    """Stitch ``parts`` of ``model`` (exporting missing generic ones): the model and its weight layout."""
    import onnx

    (directory / "generic").mkdir(parents=True, exist_ok=True)
    graphs = [onnx.load(str(_cached_part(directory / "generic", p["key"])), load_external_data=False) for p in parts]
    shapes = {n: tuple(t.shape) for n, t in model.state_dict().items()}
    return stitch(graphs, [p["bind"] for p in parts], shapes, weights_location(name), outputs, input_dims)


def cached_graph(model, directory: Path | None = None) -> tuple[Path, list[dict]]:
    """The weight-stripped graph ``input_ids -> logits`` of ``model`` and its weight layout, exporting missing generic parts.

    ``model`` may live on the meta device: only its configuration and weight shapes are read.
    """
    directory = directory or graph_dir()
    name = config_key(model.config)
    graph, layout = directory / f"{name}.onnx", directory / f"{name}.json"
    if graph.exists() and layout.exists():
        return graph, json.loads(layout.read_text())["tensors"]
    stitched, tensors = _stitched(model, directory, name, _parts(model), ["logits"])
    _save(directory, name, stitched, {"tensors": tensors, "config": asdict(model.config)})
    return graph, tensors


def with_weights(graph: Path, tensors: list[dict], model, directory: Path) -> Path:
    """A copy of the weight-stripped ``graph`` in ``directory`` beside ``model``'s own weights (parity checks)."""
    directory.mkdir(parents=True, exist_ok=True)
    state, path = model.state_dict(), directory / graph.name
    path.write_bytes(graph.read_bytes())
    with open(path.with_suffix(".weights"), "wb") as f:
        for t in tensors:
            f.seek(t["offset"])
            f.write(state[t["name"]].detach().cpu().numpy().astype(t["dtype"]).tobytes())
    return path


def _decode_parts(model) -> list[dict]:
    """The parts of ``model``'s decode-step graph (:func:`_parts` for the prefill graph): the step embedding,
    one decode block per layer (its state in, :func:`supernet.onnx_decode.state_name`; ``present.*`` out), the head."""
    from supernet.onnx_decode import POSITION, present_of, state_name

    rope = model.config.positions == "rope"
    embed = ["tok_emb.weight"] + ([] if rope else ["pos_emb.weight"])
    angles = {"rope_cos": "rope.cos", "rope_sin": "rope.sin"} if rope else {}
    out = [
        {
            "key": {**_shared(model), "part": "decode-embed"},
            "bind": {"token": INPUT_IDS, "position": POSITION, **_weights(embed), "y": "h0", **angles},
        }
    ]
    for i, block in enumerate(model.blocks):
        states = block.attn.typ.state(block.attn.spec, block.attn.heads, model.config.head_dim)
        names = [state_name(i, n, s.grows) for n, s in states.items()]
        bind = {
            "x": f"h{i}",
            "position": POSITION,
            **angles,
            **_weights([f"blocks.{i}.{n}" for n in _block_names(model, i)]),
            "y": f"h{i + 1}",
        }
        bind.update({f"s{j}": n for j, n in enumerate(names)})
        bind.update({f"n{j}": present_of(n) for j, n in enumerate(names)})
        out.append({"key": _block_key(model, i, "decode-block"), "bind": bind})
    return out + [_head(model, f"h{len(model.blocks)}")]


def cached_decode_graph(model, directory: Path | None = None) -> tuple[Path, list[dict], dict]:
    """The weight-stripped decode-step graph of ``model``, its weight layout and its input layout.

    The graph has the inputs, outputs and metadata of :func:`supernet.onnx_decode.export_decode_onnx`'s one-token
    step (``cached=False``: so ``decode_feed`` and ``onnx_generate`` run it), and is stitched from generic parts like
    the prefill graph: one export per attention type, not per model.  ``model`` may live on the meta device.
    """
    from supernet.onnx_decode import META_KEY, input_layout, output_names

    directory = directory or graph_dir()
    name = "step-" + config_key(model.config)
    graph, layout = directory / f"{name}.onnx", directory / f"{name}.json"
    if not (graph.exists() and layout.exists()):
        inputs = input_layout(model, cached=False)
        dims = {n: s["shape"] for n, s in inputs.items()}
        stitched, tensors = _stitched(model, directory, name, _decode_parts(model), output_names(inputs), dims)
        stitched.metadata_props.add(key=META_KEY, value=json.dumps(inputs))
        _save(directory, name, stitched, {"tensors": tensors, "inputs": inputs, "config": asdict(model.config)})
    data = json.loads(layout.read_text())
    return graph, data["tensors"], data["inputs"]


def _cached_part(directory: Path, key: dict) -> Path:
    path = directory / f"{_name(key)}.onnx"
    if not path.exists():
        with tempfile.TemporaryDirectory(dir=directory) as tmp:
            export_part(key, Path(tmp) / "part.onnx")
            os.replace(Path(tmp) / "part.onnx", path)  # atomic: a present file is a complete one
            write_json(path.with_suffix(".json"), key)  # what it is, for people reading the cache
    return path


def _save(directory: Path, name: str, model, layout: dict) -> None:
    from supernet.files import atomic_stream

    with atomic_stream(directory / f"{name}.onnx") as f:  # a new temporary file of a unique name, gone on failure
        f.write(model.SerializeToString())  # (onnx.save's own file handling wants a path; the graph holds no weights)
    write_json(directory / f"{name}.json", layout)


def write_json(path: Path, data: dict) -> None:
    from supernet.files import atomic_write  # (a new temporary file of a unique name: never a planted one)

    atomic_write(path, json.dumps(data, default=str))


def folder_once(folder: Path, build) -> dict:
    """``folder``'s ``layout.json``, the folder made first where it is missing: ``build(tmp)`` fills a temporary folder
    beside it (ending with its ``layout.json``), which is then moved in at once, so a present folder is a complete one;
    where another process moved its own in first, that one is kept."""
    if not (folder / "layout.json").exists():
        import shutil

        from supernet.files import temp_dir

        folder.parent.mkdir(parents=True, exist_ok=True)
        tmp = temp_dir(f".{folder.name}.", folder.parent)  # published by a rename: 0777 less the umask
        try:
            build(tmp)
            try:
                os.replace(tmp, folder)
            except OSError:  # another process wrote it first (or an old partial folder): keep the one there
                if not (folder / "layout.json").exists():
                    raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return json.loads((folder / "layout.json").read_text())


# --------------------------------------------------------------------------- whole graphs, stripped
#
# A model whose graphs are exported whole (a task's own model: tasks.translation's encoder and decoder step), once
# per architecture, is stripped of its weights like the stitched graphs: every float initializer of rank >= 2 and at
# least STRIP_MIN values (the weight matrices, the embeddings) becomes external data whose file is not kept; small
# ones (biases, norms, rotary frequencies, shape constants) stay inline.

STRIP_MIN = 256


def strip_weights(path: Path) -> list[dict]:
    """Rewrite the ONNX graph ``path`` without its large float initializers (external data ``<stem>.weights``, not
    written): their layout (name, offset, nbytes, dtype), for :func:`latency.timing_core.ort_session`."""
    import onnx

    model = onnx.load(str(path))
    location, tensors, offset = weights_location(path.stem), [], 0
    for t in model.graph.initializer:
        if t.data_type != onnx.TensorProto.FLOAT or len(t.dims) < 2 or math.prod(t.dims) < STRIP_MIN:
            continue
        offset = -(-offset // ALIGN) * ALIGN
        nbytes = 4 * math.prod(t.dims)
        t.ClearField("raw_data")
        t.ClearField("float_data")
        t.data_location = onnx.TensorProto.EXTERNAL
        del t.external_data[:]
        for k, v in (("location", location), ("offset", str(offset)), ("length", str(nbytes))):
            entry = t.external_data.add()
            entry.key, entry.value = k, v
        tensors.append({"name": t.name, "offset": offset, "nbytes": nbytes, "dtype": "float32"})
        offset += nbytes
    onnx.save(model, str(path))
    return tensors
