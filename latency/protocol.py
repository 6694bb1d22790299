"""Measuring static models on a device: :func:`measure` (the protocol of :mod:`latency.timing_core`
applied to torch models) and the fixed reference model timed beside every visit."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import numpy as np
import torch

from search_spaces import LayerChoice, Space, Subnet, Workload

from .device import Device
from .timing_core import Journal, Progress, Result, Settings, run_protocol


def timing_model(space: Space, subnet: Subnet, *, materialize: bool = True):
    """The static model of ``subnet`` with arbitrary weights, built fast: what timing needs.

    Timing does not depend on weight values, only on their shapes (and on their being ordinary
    numbers), so the model is laid out on the meta device and, with ``materialize``, its
    parameters filled from one seeded random block (no supernet, no initialisation; the
    memory's first touch is the only cost).  Without ``materialize`` it stays on the meta
    device (no memory), for devices that bring their own weights (ONNX Runtime).
    """
    from supernet import Transformer, TransformerConfig

    with torch.device("meta"):
        model = Transformer(TransformerConfig.from_subnet(space, subnet))
    return fill_weights(model) if materialize else model.eval()


def fill_weights(model):
    """Give a meta-device static model real CPU memory: tiled seeded N(0, 0.02) weights, true rope tables."""
    from supernet.model import rope_tables

    model = fill_parameters(model)
    with torch.no_grad():
        if model.pos_emb is None:
            cos, sin = rope_tables(model.config.max_seq_len, model.config.head_dim)
            model.rope_cos.copy_(cos)
            model.rope_sin.copy_(sin)
    return model.eval()


def fill_parameters(model):
    """Move a meta-device module to CPU memory, every parameter tiled from one seeded N(0, 0.02) block."""
    model = model.to_empty(device="cpu")
    block = torch.randn(1 << 12, generator=torch.Generator().manual_seed(0)) * 0.02  # (4096,)
    with torch.no_grad():
        for p in model.parameters():
            flat, b = p.view(-1), block.numel()
            whole = flat.numel() // b * b
            flat[:whole].view(-1, b).copy_(block.expand(whole // b, b))  # one pass, no temporary
            flat[whole:].copy_(block[: flat.numel() - whole])
    return model


def reference_config(config):
    """A fixed, mid-sized model of the same vocabulary, head size and attention form (causal or an encoder's):
    2 softmax layers, width 8 heads."""
    from supernet import TransformerConfig

    hd = config.head_dim
    layer = LayerChoice(heads=8, ffn_dim=32 * hd, attention="softmax")
    return TransformerConfig(config.vocab_size, config.max_seq_len, hd, config.positions, 8 * hd, (layer, layer),
                             causal=config.causal)


def reference_model(config):
    from supernet import Transformer

    return Transformer(reference_config(config), generator=torch.Generator().manual_seed(0)).eval()


@dataclass
class Measurement:
    results: dict[str, Result]
    baseline_ms: float  # the reference's time that drift correction scales to (reuse it to chain calls)


def default_reference(model):
    """The model timed beside every visit when none is given: :func:`reference_model` of a one-stack model's config; a
    model of a task's own shape carries its space, whose task says it (the encoder-decoder's smallest subnet)."""
    from search_spaces import tasks

    space = getattr(model, "space", None)
    return tasks.of(space).timing_reference(space) if space is not None else reference_model(model.config)


def model_workload(workload: Workload, model) -> Workload:
    """The workload ``model`` runs: a prefill stated in bytes of text at the tokens of the model's vocabulary (a
    one-stack model's ``config.vocab_size``: :meth:`Workload.at_vocab`), so every model of a campaign reads the same
    text; any other workload as it is."""
    if not getattr(workload, "text_bytes", 0):
        return workload
    return workload.at_vocab(model.config.vocab_size)


def measure(
    device: Device,
    models: Mapping[str, "torch.nn.Module"],
    workload: Workload,
    settings: Settings = Settings(),
    *,
    seed: int = 0,
    reference=None,
    baseline_ms: float | None = None,
    progress: Progress | None = None,
    journal: Journal | None = None,
) -> Measurement:
    """Time each static model in ``models`` (key -> :class:`supernet.Transformer`, or a task's own static model at
    a workload kind of that task's) at ``workload`` (a prefill in bytes of text: each at its vocabulary's tokens).

    ``reference`` (default :func:`reference_model` of the first model's config) is timed beside
    every visit to correct drift and detect interference; ``baseline_ms`` chains calls of one
    campaign to one anchor. Returns per-key :class:`~latency.timing_core.Result` (median ms, IQR,
    repeats, flags).  ``journal`` keeps every visit as it finishes (see :func:`~latency.timing_core.run_protocol`).
    """
    assert models, "measure() needs at least one model"
    runners = {k: device.prepare(m, model_workload(workload, m)) for k, m in models.items()}
    ref = reference if reference is not None else default_reference(next(iter(models.values())))
    ref = device.prepare(ref, model_workload(workload, ref))
    results, baseline = run_protocol(
        runners, ref, settings, np.random.default_rng(seed), baseline_ms=baseline_ms, progress=progress, journal=journal
    )
    return Measurement(results, baseline)
