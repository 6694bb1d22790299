"""Weight-stripped ONNX graphs of static models, cached on disk, and sessions over them.

Timing does not depend on weight values, so a model is exported once with
:func:`supernet.onnx_export.export_onnx` and kept as its *graph*: every float initializer of
1 KB or more is moved to an external-data layout (offset, bytes, dtype) whose file is not
kept.  A session writes random weights into that layout in a temporary folder, opens the
model, and deletes the folder.  Graphs are a few hundred KB instead of up to ~340 MB, so
hundreds fit in a cache and in the ARM bundle.  (Sessions: :func:`latency.timing_core.ort_session`.)

Cache: ``$NAS_CACHE`` or ``~/.cache/nas-transformers``, under ``onnx/<torch version>/``,
one ``<config hash>.onnx`` + ``.json`` (the layout) per model shape.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from dataclasses import asdict
from pathlib import Path

import torch

from .timing_core import materialize_weights

FLOAT_TYPES = {1: "float32", 10: "float16"}  # onnx.TensorProto.FLOAT, FLOAT16
MIN_BYTES = 1024
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


def strip_weights(src: Path, dst: Path, location: str) -> list[dict]:
    """Write ``src`` to ``dst`` with large float initializers pointing into ``location`` (not written)."""
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


# --------------------------------------------------------------------------- parts, exported one layer at a time
#
# Exporting a whole model costs ~3 s per layer here (tracing, decompositions, optimisation), so a
# campaign of 300 subnets of ~7 layers would spend hours exporting.  A subnet's graph is instead
# stitched from the graphs of its parts: the embedding, one graph per distinct layer choice, and the
# head; each part is exported once (by the same exporter settings as supernet.onnx_export) and
# cached.  The stitched graph computes what the model computes (tested: ONNX Runtime output vs
# torch, and the same counts of every compute op as export_onnx's graph).


class _Embed(torch.nn.Module):
    def __init__(self, model):
        super().__init__()
        self.tok_emb, self.pos_emb = model.tok_emb, model.pos_emb

    def forward(self, idx):
        x = self.tok_emb(idx)  # (B, T, E)
        return x if self.pos_emb is None else x + self.pos_emb.weight[: idx.shape[1]]


class _Block(torch.nn.Module):
    def __init__(self, model, i: int):
        super().__init__()
        self.block = model.blocks[i]
        self.rope = model.pos_emb is None
        if self.rope:
            self.register_buffer("rope_cos", model.rope_cos)
            self.register_buffer("rope_sin", model.rope_sin)

    def forward(self, x):
        return self.block(x, (self.rope_cos, self.rope_sin) if self.rope else None)  # (B, T, E)


class _Head(torch.nn.Module):
    def __init__(self, model):
        super().__init__()
        self.ln_f, self.tok_emb = model.ln_f, model.tok_emb

    def forward(self, x):
        return torch.nn.functional.linear(self.ln_f(x), self.tok_emb.weight)  # (B, T, vocab)


def _parts(model) -> list[tuple[str, torch.nn.Module, torch.Tensor]]:
    """(cache name, module, example input) of every part, in order."""
    c = model.config
    shared = {"vocab": c.vocab_size, "max_seq_len": c.max_seq_len, "head_dim": c.head_dim, "positions": c.positions, "embed": c.embed_dim}
    tokens = torch.zeros(2, c.max_seq_len, dtype=torch.long)  # (2, T): no size 0 or 1 (the exporter would specialise)
    x = torch.zeros(2, c.max_seq_len, c.embed_dim)  # (2, T, E)
    out = [(_name({**shared, "part": "embed"}), _Embed(model), tokens)]
    out += [(_name({**shared, "part": "block", "layer": asdict(layer)}), _Block(model, i), x) for i, layer in enumerate(c.layers)]
    return out + [(_name({**shared, "part": "head"}), _Head(model), x)]


def _name(fields: dict) -> str:
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:16]


def export_part(module: torch.nn.Module, example: torch.Tensor, path: Path) -> Path:
    """One part to ONNX: dynamic batch and sequence axes, opset and exporter of supernet.onnx_export."""
    from supernet.onnx_export import DEFAULT_OPSET, _quiet

    dims = {0: torch.export.Dim("batch", max=4096), 1: torch.export.Dim("seq", max=example.shape[1])}
    with _quiet():
        program = torch.onnx.export(
            module.eval(), (example,), dynamo=True, opset_version=DEFAULT_OPSET, dynamic_shapes=(dims,),
            input_names=["x"], output_names=["y"], verbose=False,
        )
        program.save(str(path))
    return path


def stitch(parts: list[tuple["onnx.ModelProto", list[dict]]], location: str) -> tuple["onnx.ModelProto", list[dict]]:
    """Chain part graphs (each one input, one output) into one model ``tokens -> logits``.

    Names are prefixed per part; external weights are laid end to end in ``location``.
    """
    import onnx

    graph = onnx.GraphProto(name="stitched")
    tensors, base, prev = [], 0, None
    for i, (part, layout) in enumerate(parts):
        g, last = part.graph, i == len(parts) - 1
        src_in, src_out = g.input[0].name, g.output[0].name
        offsets = {t["name"]: t for t in layout}

        def rename(n: str) -> str:
            if not n:
                return n
            if n == src_in and prev is not None:
                return prev
            if n == src_out and last:
                return "logits"
            return f"p{i}/{n}"

        for init in g.initializer:
            new = graph.initializer.add()
            new.CopyFrom(init)
            new.name = rename(init.name)
            if init.name in offsets:
                t = offsets[init.name]
                for e in new.external_data:
                    if e.key == "location":
                        e.value = location
                    elif e.key == "offset":
                        e.value = str(base + t["offset"])
                tensors.append({**t, "name": new.name, "offset": base + t["offset"]})
        for node in g.node:
            assert not any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute), node.op_type
            new = graph.node.add()
            new.CopyFrom(node)
            new.name = f"p{i}/{node.name}"
            new.input[:] = [rename(n) for n in node.input]
            new.output[:] = [rename(n) for n in node.output]
        for vi in g.value_info:
            new = graph.value_info.add()
            new.CopyFrom(vi)
            new.name = rename(vi.name)
        if i == 0:
            graph.input.add().CopyFrom(g.input[0])
            graph.input[0].name = "tokens"
            for node in graph.node:
                node.input[:] = ["tokens" if n == f"p0/{src_in}" else n for n in node.input]
        if layout:
            base = -(-(max(t["offset"] + t["nbytes"] for t in layout) + base) // ALIGN) * ALIGN
        prev = rename(src_out)
    out = graph.output.add()
    out.CopyFrom(parts[-1][0].graph.output[0])
    out.name = "logits"
    model = onnx.helper.make_model(graph, opset_imports=list(parts[0][0].opset_import), producer_name="nas-transformers")
    model.ir_version = parts[0][0].ir_version
    return model, tensors


def cached_graph(model, directory: Path | None = None) -> tuple[Path, list[dict]]:
    """The weight-stripped graph of ``model`` and its weight layout, exporting missing parts."""
    import onnx

    directory = directory or graph_dir()
    (directory / "parts").mkdir(parents=True, exist_ok=True)
    name = config_key(model.config)
    graph, layout = directory / f"{name}.onnx", directory / f"{name}.json"
    if graph.exists() and layout.exists():
        return graph, json.loads(layout.read_text())["tensors"]
    missing = [n for n, _, _ in _parts(model) if not (directory / "parts" / f"{n}.json").exists()]
    if missing and any(p.is_meta for p in model.parameters()):  # exporting a part needs real tensors
        from .protocol import fill_weights

        model = fill_weights(model)
    parts = []
    for part_name, module, example in _parts(model):
        parts.append(_cached_part(directory / "parts", part_name, module, example))
    stitched, tensors = stitch([(onnx.load(str(p), load_external_data=False), t) for p, t in parts], weights_location(name))
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


def _cached_part(directory: Path, name: str, module, example) -> tuple[Path, list[dict]]:
    graph, layout = directory / f"{name}.onnx", directory / f"{name}.json"
    if not (graph.exists() and layout.exists()):
        with tempfile.TemporaryDirectory(dir=directory) as tmp:
            full = export_part(module, example, Path(tmp) / "full.onnx")
            tensors = strip_weights(full, Path(tmp) / "graph.onnx", weights_location(name))
            os.replace(Path(tmp) / "graph.onnx", graph)  # graph first: the layout's presence marks a complete entry
            _write_json(layout, {"tensors": tensors})
    return graph, json.loads(layout.read_text())["tensors"]


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
