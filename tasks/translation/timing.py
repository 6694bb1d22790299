"""Timing HAT's ``translate`` workload of seq2seq subnets: the parts of a campaign that differ from an LM's.

:mod:`latency.campaign` dispatches here for a ``task: seq2seq`` space: the static model timed is a
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

from functools import lru_cache

import torch

from latency.protocol import fill_parameters
from search_spaces import UserError

from .features import translate_terms
from .space import Seq2SeqSpace, Seq2SeqSubnet, TranslateWorkload

TIMED_ON = ("cpu", "cuda", "onnxruntime", "arm", "ssh://user@host")  # devices that time a translate workload


def is_seq2seq(space) -> bool:
    return getattr(space, "task", None) == "seq2seq"


def require_device(space: Seq2SeqSpace, device: str, precision: str | None = "fp32") -> None:
    """Refuse, in one line, a device (or a precision) that cannot time a seq2seq space yet."""
    if device not in TIMED_ON[:-1] and not device.startswith("ssh://"):
        raise UserError(
            f"--device {device}: a seq2seq space ({space.name}) is timed on {', '.join(TIMED_ON)} "
            "(README \"Translation (encoder-decoder)\")"
        )
    if precision not in (None, "fp32"):
        raise UserError(f"--precision {precision}: a seq2seq space ({space.name}) is timed in fp32 only so far")


@lru_cache(maxsize=16)
def _shape_model(space: Seq2SeqSpace):
    from .model import Seq2SeqSuperTransformer

    with torch.device("meta"):
        return Seq2SeqSuperTransformer(space)


def seq2seq_params(space: Seq2SeqSpace, subnet: Seq2SeqSubnet) -> int:
    """Parameters of the static encoder-decoder (``Seq2SeqSuperTransformer.num_params``, the one count)."""
    return _shape_model(space).num_params(subnet)


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


def translate_call(model, workload: TranslateWorkload):
    """``call()`` running the workload once on ``model`` (its source drawn once, seeded)."""
    from .decode import translate_runner

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
