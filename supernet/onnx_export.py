"""ONNX export of a static :class:`~supernet.model.Transformer`.

torch's dynamo exporter at opset 23 turns ``scaled_dot_product_attention`` into the
standard ONNX ``Attention`` op (one fused node per softmax / masked layer) and layer
norms into ``LayerNormalization``. The exported graph takes ``input_ids`` (batch, sequence) int64
and returns ``logits`` (batch, sequence, vocab), both axes dynamic: the names ONNX Runtime's and optimum's
users expect (:data:`INPUT_IDS`, :data:`LOGITS`).  The model reads no ``attention_mask``: it pads nothing
(a batch is rows of one length).

:func:`add_metadata` writes ONNX model metadata (``metadata_props``, which ONNX Runtime reads as
``session.get_modelmeta().custom_metadata_map``) into a file written; :func:`read_metadata` reads it back.
"""

from __future__ import annotations

import contextlib
import io
import logging
import warnings
from collections import Counter
from pathlib import Path

import numpy as np
import torch

from search_spaces import UserError

from .model import Transformer

DEFAULT_OPSET = 23
INPUT_IDS = "input_ids"  # (batch, sequence) int64: the token ids, as Hugging Face / optimum graphs name them
LOGITS = "logits"  # (batch, sequence, vocab)
# Graphs exported by 0.2.0 and before named them "tokens" / "token" ("source", "cross.*" in an encoder-decoder, "images")
OLD_INPUTS = ("tokens", "token", "source", "images")


def check_inputs(names, where: str) -> None:
    """Refuse, in one line naming ``where``, a graph whose inputs carry the names of an older export (``tokens``,
    ``past.0.k``, ...): its readers here feed the new names (:data:`INPUT_IDS`, ``past_key_values.{i}.key``)."""
    names = list(names)
    if any(n in OLD_INPUTS for n in names):  # every older graph has one of them (a state's name alone does not tell)
        old = [n for n in names if n in OLD_INPUTS or n.startswith(("past.", "cross."))]
        raise UserError(f"{where}: exported by an older nas-transformers (inputs {', '.join(old[:3])}; this version reads "
                        f"{INPUT_IDS}, past_key_values.*): export the model again with `nas export`")


def export_onnx(model: Transformer, path: str | Path, *, opset: int = DEFAULT_OPSET) -> Path:
    """Write ``model`` to ``path`` as ONNX with dynamic batch and sequence axes; return the path.

    The example traced is (2, max_seq_len): no size of 0 or 1 appears anywhere (the exporter
    would specialise on it), and the graph serves every batch and every length up to max_seq_len.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    model = model.eval()
    example = torch.zeros(2, model.config.max_seq_len, dtype=torch.long)
    batch = torch.export.Dim("batch", max=4096)
    seq = torch.export.Dim("seq", max=model.config.max_seq_len)
    from .attention import ort_ops

    with _quiet():
        program = torch.onnx.export(
            model,
            (example,),
            dynamo=True,
            opset_version=opset,
            dynamic_shapes=({0: batch, 1: seq},),
            input_names=[INPUT_IDS],
            output_names=[LOGITS],
            verbose=False,
            custom_translation_table=ort_ops.translation_table(),  # inside ort_ops.emitting(): the nas.kernels ops
        )
        program.save(str(path))
    return path


STACK_TRACE = "pkg.torch.onnx.stack_trace"  # the exporter's note of the source line of each node: this machine's paths


def drop_stack_traces(model) -> int:
    """Remove the exporter's ``pkg.torch.onnx.stack_trace`` from every node (subgraphs and functions too): source file
    paths of the machine that exported it, nothing a runtime reads.  Returns how many were removed."""
    removed = 0

    def nodes(graph):
        for node in graph.node:
            yield node
            for attr in node.attribute:
                for sub in ([attr.g] if attr.HasField("g") else []) + list(attr.graphs):
                    yield from nodes(sub)

    for node in [*nodes(model.graph), *(n for f in model.functions for n in f.node)]:
        kept = [(p.key, p.value) for p in node.metadata_props if p.key != STACK_TRACE]
        if len(kept) != len(node.metadata_props):
            removed += len(node.metadata_props) - len(kept)
            del node.metadata_props[:]
            for key, value in kept:
                node.metadata_props.add(key=key, value=value)
    return removed


def add_metadata(path: str | Path, props: dict[str, str]) -> Path:
    """Set ``props`` in the ``metadata_props`` of the ONNX file ``path`` (a key already there is replaced, every other
    key kept), drop the exporter's stack traces (:func:`drop_stack_traces`: paths of this machine) and rewrite the
    file whole or not at all.  The weights are not read: an external data file beside the graph (``model.onnx.data``)
    stays as it is and is still referenced.  Write before any checksum of the file."""
    import onnx

    from .files import atomic_write

    path = Path(path)
    graph = onnx.load(str(path), load_external_data=False)
    drop_stack_traces(graph)
    kept = [(p.key, p.value) for p in graph.metadata_props if p.key not in props]
    del graph.metadata_props[:]
    for key, value in [*kept, *props.items()]:
        graph.metadata_props.add(key=key, value=str(value))
    atomic_write(path, graph.SerializeToString())
    return path


def read_metadata(graph) -> dict[str, str]:
    """Every ``metadata_props`` entry of an ONNX graph: a path (the weights are not read) or an ONNX Runtime session."""
    if isinstance(graph, (str, Path)):
        import onnx

        return {p.key: p.value for p in onnx.load(str(graph), load_external_data=False).metadata_props}
    return dict(graph.get_modelmeta().custom_metadata_map)


def op_counts(path: str | Path) -> Counter:
    """How many nodes of each op type the top-level graph holds (e.g. ``counts['Attention']``)."""
    import onnx

    return Counter(node.op_type for node in onnx.load(str(path), load_external_data=False).graph.node)


def onnx_session(path: str | Path, threads: int | None = None):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    if threads:
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
    options.log_severity_level = 3
    from .attention import ort_ops

    ort_ops.register_if_used(options, path)  # a graph exported with --custom-ops: their library
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def onnx_parity(path: str | Path, model: Transformer, tokens: torch.Tensor) -> float:
    """Max abs difference between ONNX Runtime and torch logits on ``tokens``."""
    session = onnx_session(path)
    out = session.run(None, {INPUT_IDS: tokens.numpy().astype(np.int64)})[0]
    with torch.no_grad():
        ref = model.eval()(tokens).numpy()
    return float(np.abs(out - ref).max())


@contextlib.contextmanager
def _quiet():
    """The exporter prints progress and warnings meant for its developers; keep them off the user's screen."""
    loggers = [logging.getLogger(n) for n in ("torch.onnx", "torch.export", "torch._dynamo", "onnxscript", "onnx_ir")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            yield
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)
