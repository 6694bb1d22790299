"""Weight-stripped ONNX graphs of static models, cached on disk, and sessions over them.

Timing does not depend on weight values, so a model's graph is kept without its weights: every
weight is an initializer in an external-data layout (offset, bytes, dtype) whose file is not
kept.  A session writes random weights into that layout in a temporary folder, opens the model,
and deletes the folder.  Graphs are a few hundred KB instead of up to ~340 MB, so hundreds fit in
a cache and in the ARM bundle.  (Sessions: :func:`latency.timing_core.ort_session`.)  Graphs are
stitched from shape-generic parts, exported once per attention type (see below).

Cache: ``$NAS_CACHE`` or ``~/.cache/nas-transformers``, under ``onnx/<torch version>-opset<N>/``:
``generic/<key hash>.onnx`` per part (+ ``.json``: what it is), and one ``<config hash>.onnx`` +
``.json`` (the layout) per model shape.
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
import torch.nn.functional as F

ALIGN = 4096


def cache_root() -> Path:
    return Path(os.environ.get("NAS_CACHE") or Path.home() / ".cache" / "nas-transformers")


def config_key(config) -> str:
    """A stable name for a static model's shape (its TransformerConfig)."""
    return hashlib.sha256(json.dumps(asdict(config), sort_keys=True, default=str).encode()).hexdigest()[:16]


def graph_dir() -> Path:
    import torch

    from supernet.onnx_export import DEFAULT_OPSET

    return cache_root() / "onnx" / f"torch-{torch.__version__}-opset{DEFAULT_OPSET}"


FLOAT_TYPES = {1: "float32", 10: "float16"}  # onnx.TensorProto.FLOAT, FLOAT16
MIN_BYTES = 1024


def strip_weights(src: Path, dst: Path, location: str) -> list[dict]:
    """Write ``src`` to ``dst`` with large float initializers pointing into ``location`` (not written).

    For whole exports (the decode-step graph); prefill graphs are stitched weight-free from generic parts.
    """
    import onnx

    model = onnx.load(str(src))
    tensors, offset = [], 0
    for t in model.graph.initializer:
        if t.data_type not in FLOAT_TYPES or not t.raw_data or len(t.raw_data) < MIN_BYTES:
            continue
        offset = -(-offset // ALIGN) * ALIGN
        nbytes = len(t.raw_data)
        t.ClearField("raw_data")
        t.data_location = onnx.TensorProto.EXTERNAL
        del t.external_data[:]
        for k, v in (("location", location), ("offset", str(offset)), ("length", str(nbytes))):
            entry = t.external_data.add()
            entry.key, entry.value = k, v
        tensors.append({"name": t.name, "offset": offset, "nbytes": nbytes, "dtype": FLOAT_TYPES[t.data_type]})
        offset += nbytes
    onnx.save(model, str(dst))
    return tensors


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
# compared side by side by ``scripts/bench_latency_graphs.py``).

# A block's weights in the order the generic block takes them, with the symbolic size of each axis.
BLOCK_PARAMS = {
    "ln1.weight": "E", "ln1.bias": "E",
    "attn.q.weight": "AE", "attn.q.bias": "A", "attn.k.weight": "KE", "attn.k.bias": "K",
    "attn.v.weight": "KE", "attn.v.bias": "K", "attn.o.weight": "EA", "attn.o.bias": "E",
    "ln2.weight": "E", "ln2.bias": "E",
    "mlp.fc1.weight": "FE", "mlp.fc1.bias": "F", "mlp.fc2.weight": "EF", "mlp.fc2.bias": "E",
}  # fmt: skip
EXAMPLE_SIZES = {"E": 48, "H": 3, "F": 80}  # distinct, none 0 or 1: the exporter would merge or specialise them


class _Embed(torch.nn.Module):
    def __init__(self, learned: bool):
        super().__init__()
        self.learned = learned

    def forward(self, idx, tok, pos=None):
        x = torch.nn.functional.embedding(idx, tok)  # (B, T, E)
        return x + pos[: idx.shape[1]] if self.learned else x


class _Block(torch.nn.Module):
    """:class:`supernet.model.Block` with its weights as inputs: x + attn(ln1(x)), then x + mlp(ln2(x))."""

    def __init__(self, attention: str, head_dim: int, max_seq_len: int, rope: bool):
        super().__init__()
        from search_spaces import parse_attention
        from supernet.model import rope_tables

        self.spec, self.head_dim, self.rope = parse_attention(attention), head_dim, rope
        if rope:
            cos, sin = rope_tables(max_seq_len, head_dim)
            self.register_buffer("rope_cos", cos)
            self.register_buffer("rope_sin", sin)

    def forward(self, x, *weights):
        from supernet.model import attention_forward, mlp_forward

        w = dict(zip(BLOCK_PARAMS, weights))
        p = lambda name: (w[f"{name}.weight"], w[f"{name}.bias"])  # noqa: E731
        e = (x.shape[-1],)
        heads = w["attn.q.weight"].shape[0] // self.head_dim
        rope = (self.rope_cos, self.rope_sin) if self.rope else None
        x = x + attention_forward(F.layer_norm(x, e, *p("ln1")), p("attn.q"), p("attn.k"), p("attn.v"), p("attn.o"), heads, self.spec, rope)
        return x + mlp_forward(F.layer_norm(x, e, *p("ln2")), p("mlp.fc1"), p("mlp.fc2"))  # (B, T, E)


class _Head(torch.nn.Module):
    def forward(self, x, ln_w, ln_b, tok):
        return F.linear(F.layer_norm(x, (x.shape[-1],), ln_w, ln_b), tok)  # (B, T, vocab)


def _kv_mode(layer) -> str:
    """``fixed``: a gqa layer with fewer key/value heads than queries (K and A static); else ``same`` (K = A)."""
    from search_spaces import parse_attention
    from search_spaces.attention import kv_heads

    return "fixed" if kv_heads(parse_attention(layer.attention), layer.heads) != layer.heads else "same"


def _parts(model) -> list[dict]:
    """Every part of ``model`` in order: its generic key and how its inputs bind to the model's weights.

    ``key`` names the generic graph (what it depends on: never a width); ``bind`` maps each weight
    input (after the first, activation input) to the model's state-dict name, in order.
    """
    c = model.config
    shared = {"vocab": c.vocab_size, "max_seq_len": c.max_seq_len, "head_dim": c.head_dim, "positions": c.positions}
    learned = c.positions == "learned"
    out = [{"key": {**shared, "part": "embed"}, "bind": ["tok_emb.weight"] + (["pos_emb.weight"] if learned else [])}]
    for i, layer in enumerate(c.layers):
        key = {**shared, "part": "block", "attention": layer.attention, "kv": _kv_mode(layer)}
        if key["kv"] == "fixed":
            key["kv_width"], key["width"] = model.blocks[i].attn.k.weight.shape[0], model.blocks[i].attn.q.weight.shape[0]
        out.append({"key": key, "bind": [f"blocks.{i}.{n}" for n in BLOCK_PARAMS]})
    return out + [{"key": {**shared, "part": "head"}, "bind": ["ln_f.weight", "ln_f.bias", "tok_emb.weight"]}]


def _name(fields: dict) -> str:
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:16]


def generic_part(key: dict) -> tuple[torch.nn.Module, tuple, tuple]:
    """The module of a generic part, example inputs, and their dynamic shapes (for the exporter)."""
    Dim = torch.export.Dim
    L, V, hd = key["max_seq_len"], key["vocab"], key["head_dim"]
    batch, seq = Dim("batch", max=4096), Dim("seq", max=L)
    E = Dim("E", min=2, max=1 << 16)
    if key["part"] == "embed":
        learned = key["positions"] == "learned"
        tokens = torch.zeros(2, L, dtype=torch.long)  # (2, T)
        ex = (tokens, torch.randn(V, EXAMPLE_SIZES["E"])) + ((torch.randn(L, EXAMPLE_SIZES["E"]),) if learned else ())
        shapes = ({0: batch, 1: seq}, {1: E}) + (({1: E},) if learned else ())
        return _Embed(learned), ex, shapes
    x = torch.randn(2, L, EXAMPLE_SIZES["E"])  # (2, T, E)
    if key["part"] == "head":
        e = EXAMPLE_SIZES["E"]
        return _Head(), (x, torch.ones(e), torch.zeros(e), torch.randn(V, e)), ({0: batch, 1: seq, 2: E}, {0: E}, {0: E}, {1: E})
    H, F_ = Dim("H", min=1, max=4096), Dim("F", min=2, max=1 << 20)
    sizes = {"E": EXAMPLE_SIZES["E"], "A": hd * EXAMPLE_SIZES["H"], "F": EXAMPLE_SIZES["F"]}
    dims = {"E": E, "A": hd * H, "F": F_}
    if key["kv"] == "fixed":  # grouped heads: the exporter's fused Attention needs both head counts static
        sizes["K"], dims["K"] = key["kv_width"], None
        sizes["A"], dims["A"] = key["width"], None
    else:
        sizes["K"], dims["K"] = sizes["A"], dims["A"]
    ex = [x] + [torch.randn(*(sizes[a] for a in axes)) * 0.02 for axes in BLOCK_PARAMS.values()]
    shapes = [{0: batch, 1: seq, 2: E}] + [{i: dims[a] for i, a in enumerate(axes) if dims[a] is not None} for axes in BLOCK_PARAMS.values()]
    return _Block(key["attention"], hd, L, key["positions"] == "rope"), tuple(ex), tuple(shapes)


def export_part(key: dict, path: Path) -> Path:
    """One generic part to ONNX (opset and exporter of supernet.onnx_export): inputs ``x``, then ``w0, w1, ...``."""
    from supernet.onnx_export import DEFAULT_OPSET, _quiet

    module, example, shapes = generic_part(key)
    names = ["x"] + [f"w{i}" for i in range(len(example) - 1)]
    if isinstance(module, _Block):  # forward(x, *weights): the exporter wants the varargs' shapes as one tuple
        shapes = (shapes[0], tuple(shapes[1:]))
    with _quiet():
        program = torch.onnx.export(
            module.eval(), example, dynamo=True, opset_version=DEFAULT_OPSET, dynamic_shapes=shapes,
            input_names=names, output_names=["y"], verbose=False,
        )
        program.save(str(path))
    return path


def stitch(parts: list["onnx.ModelProto"], binds: list[list[str]], shapes: dict[str, tuple[int, ...]], location: str):
    """Chain generic part graphs into one model ``tokens -> logits`` of one shape.

    Part ``i``'s first input is the previous part's output; its weight inputs ``w0, w1, ...`` become
    initializers named ``binds[i][j]`` (shared when two parts bind the same name: the tied
    embedding) with the sizes in ``shapes``, stored as float32 external data laid end to end in
    ``location``.  Returns the model and the layout (name, offset, nbytes, dtype) of its weights.
    """
    import onnx

    graph = onnx.GraphProto(name="stitched")
    tensors, offset, prev = [], 0, None
    for name in dict.fromkeys(n for bind in binds for n in bind):  # each weight once, in order of use
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
    for i, (part, bind) in enumerate(zip(parts, binds)):
        g, last = part.graph, i == len(parts) - 1
        src_in, src_out = g.input[0].name, g.output[0].name
        weights = {inp.name: bind[j] for j, inp in enumerate(g.input[1:])}

        def rename(n: str) -> str:
            if not n:
                return n
            if n == src_in:
                return prev if prev is not None else "tokens"
            if n in weights:
                return weights[n]
            if n == src_out and last:
                return "logits"
            return f"p{i}/{n}"

        for init in g.initializer:  # the part's own constants (rope tables, shape constants): kept inline
            new = graph.initializer.add()
            new.CopyFrom(init)
            new.name = rename(init.name)
        for node in g.node:
            assert not any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute), node.op_type
            new = graph.node.add()
            new.CopyFrom(node)
            new.name = f"p{i}/{node.name}"
            new.input[:] = [rename(n) for n in node.input]
            new.output[:] = [rename(n) for n in node.output]
        # No value_info: its symbolic sizes (E, A, F) mean other numbers in different parts, which
        # would mislead ONNX Runtime's memory planner; it infers the shapes itself.
        if i == 0:
            graph.input.add().CopyFrom(g.input[0])
            graph.input[0].name = "tokens"
        prev = rename(src_out)
    out = graph.output.add()
    out.CopyFrom(parts[-1].graph.output[0])
    out.name = "logits"
    opsets: dict[str, int] = {}
    for part in parts:
        for o in part.opset_import:
            opsets[o.domain] = max(opsets.get(o.domain, 0), o.version)
    model = onnx.helper.make_model(
        graph, opset_imports=[onnx.helper.make_opsetid(d, v) for d, v in opsets.items()], producer_name="nas-transformers"
    )
    model.ir_version = max(p.ir_version for p in parts)
    return model, tensors


def cached_graph(model, directory: Path | None = None) -> tuple[Path, list[dict]]:
    """The weight-stripped graph of ``model`` and its weight layout, exporting missing generic parts.

    ``model`` may live on the meta device: only its configuration and weight shapes are read.
    """
    import onnx

    directory = directory or graph_dir()
    (directory / "generic").mkdir(parents=True, exist_ok=True)
    name = config_key(model.config)
    graph, layout = directory / f"{name}.onnx", directory / f"{name}.json"
    if graph.exists() and layout.exists():
        return graph, json.loads(layout.read_text())["tensors"]
    parts = _parts(model)
    graphs = [onnx.load(str(_cached_part(directory / "generic", p["key"])), load_external_data=False) for p in parts]
    shapes = {n: tuple(t.shape) for n, t in model.state_dict().items()}
    stitched, tensors = stitch(graphs, [p["bind"] for p in parts], shapes, weights_location(name))
    _save(directory, name, stitched, {"tensors": tensors, "config": asdict(model.config)})
    return graph, tensors


def cached_decode_graph(model, directory: Path | None = None) -> tuple[Path, list[dict], dict]:
    """The weight-stripped decode-step graph of ``model`` (:func:`supernet.onnx_decode.export_decode_onnx`),
    its weight layout and its input layout; exported once per model shape (whole, not stitched from parts)."""
    directory = directory or graph_dir()
    directory.mkdir(parents=True, exist_ok=True)
    name = "decode-" + config_key(model.config)
    graph, layout = directory / f"{name}.onnx", directory / f"{name}.json"
    if not (graph.exists() and layout.exists()):
        from supernet.onnx_decode import export_decode_onnx, read_layout

        if any(p.is_meta for p in model.parameters()):  # exporting needs real tensors
            from .protocol import fill_weights

            model = fill_weights(model)
        with tempfile.TemporaryDirectory(dir=directory) as tmp:
            full = export_decode_onnx(model, Path(tmp) / "full.onnx")
            tensors = strip_weights(full, Path(tmp) / "graph.onnx", weights_location(name))
            os.replace(Path(tmp) / "graph.onnx", graph)  # graph first: the layout's presence marks a complete entry
            _write_json(layout, {"tensors": tensors, "inputs": read_layout(full), "config": asdict(model.config)})
    data = json.loads(layout.read_text())
    return graph, data["tensors"], data["inputs"]


def _cached_part(directory: Path, key: dict) -> Path:
    path = directory / f"{_name(key)}.onnx"
    if not path.exists():
        with tempfile.TemporaryDirectory(dir=directory) as tmp:
            export_part(key, Path(tmp) / "part.onnx")
            os.replace(Path(tmp) / "part.onnx", path)  # atomic: a present file is a complete one
            _write_json(path.with_suffix(".json"), key)  # what it is, for people reading the cache
    return path


def _save(directory: Path, name: str, model, layout: dict) -> None:
    import onnx

    tmp = directory / f".{name}.onnx.tmp"
    onnx.save(model, str(tmp))
    os.replace(tmp, directory / f"{name}.onnx")
    _write_json(directory / f"{name}.json", layout)


def _write_json(path: Path, data: dict) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, default=str))
    os.replace(tmp, path)
