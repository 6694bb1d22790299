"""Timing HAT's ``translate`` workload of seq2seq subnets: the translation task's latency parts.

:mod:`latency.campaign` and the devices ask the task (:class:`tasks.translation.TranslationTask`), which answers
from here: the static model timed is a
:class:`tasks.translation.model.Seq2SeqTransformer` (laid out on the meta device, parameters tiled from one seeded block:
timing needs shapes, not trained values), the reference timed beside every visit is the space's smallest subnet
(a fixed model of the same vocabulary, head size and positions), and a table row's features are the seq2seq subnet
encoding (``space.encode``), its parameters and the analytic terms of :func:`tasks.translation.features.translate_terms`.
The workload itself is :func:`tasks.translation.decode.translate_runner`: one encoder pass over ``source`` random bytes,
cross keys / values once, ``steps`` cached decoder steps at batch ``beam``; on ``onnxruntime`` the same loop runs the
model's encoder and decoder-step graphs (:mod:`latency.devices.onnxruntime`); ``cuda`` runs the cpu device's loop on
the GPU (eager); the ``arm`` bundle (and ``ssh://``) carries both graphs per subnet and runs the onnxruntime loop on the
board (:func:`latency.devices.arm.write_bundle`).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import torch

from latency.onnx_graphs import folder_once, graph_dir, strip_weights, write_json
from latency.protocol import fill_parameters
from supernet.shapes import params as shape_params
from search_spaces import UserError

from .features import translate_terms
from .space import Seq2SeqSpace, Seq2SeqSubnet, TranslateWorkload

def require_device(space: Seq2SeqSpace, device: str, precision: str | None = "fp32", for_transfer: bool = False) -> None:
    """Refuse, in one line, a precision or transfer sampling that cannot time a seq2seq space yet (any registered
    device times it: its models run in torch, in ONNX Runtime and in a bundle)."""
    if precision not in (None, "fp32"):
        raise UserError(f"--precision {precision}: a seq2seq space ({space.name}) is timed in fp32 only so far")
    if for_transfer:
        raise UserError(f"--for-transfer: not for a seq2seq space ({space.name}) yet; time uniform samples")


def seq2seq_params(space: Seq2SeqSpace, subnet: Seq2SeqSubnet) -> int:
    """Parameters of the static encoder-decoder (``Seq2SeqSuperTransformer.num_params`` on the meta device)."""
    return shape_params(space, subnet)


def seq2seq_timing_model(space: Seq2SeqSpace, subnet: Seq2SeqSubnet, *, materialize: bool = True):
    """The static encoder-decoder of ``subnet`` with arbitrary (seeded, tiled) weights; on the meta device without
    ``materialize``."""
    from .model import Seq2SeqTransformer

    with torch.device("meta"):
        model = Seq2SeqTransformer(space, subnet)
    return fill_parameters(model).eval() if materialize else model.eval()


def seq2seq_reference(space: Seq2SeqSpace):
    """The model timed beside every visit: the space's smallest subnet (fixed for the space)."""
    return seq2seq_timing_model(space, space.smallest())


def seq2seq_table_features(space: Seq2SeqSpace, subnet: Seq2SeqSubnet, workload: TranslateWorkload) -> dict[str, float]:
    """A timing-table row's feature columns: ``space.encode``, parameters, then the translate cost terms
    (``flops`` their sum)."""
    enc = dict(zip(space.feature_names(), space.encode(subnet).tolist()))
    enc["params"] = float(seq2seq_params(space, subnet))
    enc.update(translate_terms(space, subnet, workload))
    return enc


def translate_call(model, workload: TranslateWorkload, runtime: str = "eager"):
    """``call()`` running the workload once on ``model`` (its source drawn once, seeded): the cpu device's loop, and
    the cuda device's (eager only)."""
    from .decode import translate_runner

    if runtime != "eager":
        raise UserError(f"--runtime {runtime}: a translate workload (an encoder-decoder) is timed with "
                        "--runtime eager only so far (its decoding loop grows its caches step by step)")  # fmt: skip

    return translate_runner(model, workload, generator=torch.Generator().manual_seed(0))


def seq2seq_additive_terms(space: Seq2SeqSpace, subnet: Seq2SeqSubnet, workload: TranslateWorkload) -> dict[str, float]:
    """The additive predictor's columns for a seq2seq subnet (it adds the constant): each translate cost term of
    :func:`~tasks.translation.features.translate_terms` (GFLOPs; the memory positions and cache MB), plus the layer
    counts of each side (per-layer overheads: launches, norms, the decoder's per-step work)."""
    terms = translate_terms(space, subnet, workload)
    out = {k: v / 1e9 for k, v in terms.items() if k.endswith("_flops")}
    out["memory_positions"] = terms["memory_positions"] / 1e3
    out["cache_mb"] = terms["cache_bytes"] / 2**20
    out["encoder_layers"] = float(subnet.encoder.depth)
    out["decoder_layer_steps"] = float(subnet.decoder.depth * workload.steps)
    out["cross_layer_steps"] = float(sum(subnet.cross_layers) * workload.steps)
    return out


def seq2seq_matrix(kind: str, space: Seq2SeqSpace, workload: TranslateWorkload, subnets) -> tuple:
    """What predictor ``kind`` reads of seq2seq subnets: the additive terms for ``additive``, the table's features
    (encoding, parameters, cost terms) otherwise."""
    from latency.features import matrix

    if kind == "additive":
        return matrix([seq2seq_additive_terms(space, s, workload) for s in subnets])
    return matrix([seq2seq_table_features(space, s, workload) for s in subnets])


# --------------------------------------------------------------------------- the two graphs, exported once


def seq2seq_key(model) -> str:
    """A stable name for a static encoder-decoder's shape: what of its space the graphs depend on, and its subnet."""
    space = model.space
    fields = {"vocab": space.vocab_size, "max_seq_len": space.max_seq_len, "head_dim": space.head_dim,
              "positions": space.positions, "subnet": model.subnet.to_dict()}  # fmt: skip
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:16]


def cached_seq2seq_graphs(model, directory: Path | None = None) -> dict:
    """The weight-stripped ``encoder`` and ``decoder_step`` graphs of a static encoder-decoder (paths), their weight
    layouts (``encoder_tensors``, ``decoder_step_tensors``) and the step's input layout (``inputs``), exported once per
    architecture.  ``model`` may live on the meta device (seeded weights are drawn for the export, then stripped)."""
    directory, key = directory or graph_dir(), seq2seq_key(model)
    folder = directory / f"s2s-{key}"
    names = {"encoder": f"{key}-encoder.onnx", "decoder_step": f"{key}-decoder_step.onnx"}  # unique: a bundle holds many

    def build(tmp: Path) -> None:
        from .onnx import DECODER, ENCODER, export_seq2seq_onnx, step_layout

        exported = seq2seq_timing_model(model.space, model.subnet) if any(p.is_meta for p in model.parameters()) else model
        export_seq2seq_onnx(exported, tmp)
        os.replace(tmp / ENCODER, tmp / names["encoder"])
        os.replace(tmp / DECODER, tmp / names["decoder_step"])
        write_json(tmp / "layout.json", {"encoder_tensors": strip_weights(tmp / names["encoder"]),
                                         "decoder_step_tensors": strip_weights(tmp / names["decoder_step"]),
                                         "inputs": step_layout(exported), "subnet": exported.subnet.to_dict()})  # fmt: skip

    data = folder_once(folder, build)
    return {"encoder": folder / names["encoder"], "decoder_step": folder / names["decoder_step"], **data}


def translate_ort_runner_of(model, workload: TranslateWorkload, threads: int | None, provider: str, clock: str,
                            precision: str):
    """The onnxruntime device's runner of the workload: HAT's loop on the model's two graphs (exported once per
    architecture, weights drawn in the session): one encoder run over ``source`` random bytes, then ``steps``
    decoder-step runs at batch ``beam``, each feeding back the states of the one before."""
    from latency.timing_core import ort_session, translate_ort_runner

    if precision != "fp32":
        raise UserError(f"--precision {precision}: a translate workload (an encoder-decoder) is timed in fp32 only "
                        "so far")  # fmt: skip
    g = cached_seq2seq_graphs(model)
    encoder = ort_session(str(g["encoder"]), g["encoder_tensors"], threads=threads, provider=provider)
    step = ort_session(str(g["decoder_step"]), g["decoder_step_tensors"], threads=threads, provider=provider)
    return translate_ort_runner(encoder, step, g["inputs"], workload.source, workload.steps, workload.beam, clock)


def bundle_graphs(model) -> tuple[dict, dict]:
    """A latency bundle's entry of ``model`` (``graph`` the encoder, ``step_graph`` the decoder step, the step's
    inputs; the board's runner runs HAT's loop on them) and the graph files it names."""
    g = cached_seq2seq_graphs(model)
    entry = {"graph": f"models/{g['encoder'].name}", "tensors": g["encoder_tensors"],
             "step_graph": f"models/{g['decoder_step'].name}", "step_tensors": g["decoder_step_tensors"],
             "inputs": g["inputs"]}  # fmt: skip
    return entry, {g["encoder"].name: g["encoder"], g["decoder_step"].name: g["decoder_step"]}
