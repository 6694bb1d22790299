"""Measuring static models on a device: :func:`measure` (the protocol of :mod:`latency.timing_core`
applied to torch models) and the fixed reference model timed beside every visit."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import numpy as np
import torch

from search_spaces import LayerChoice, Workload

from .device import Device
from .timing_core import Progress, Result, Settings, run_protocol


def reference_config(config):
    """A fixed, mid-sized model of the same vocabulary and head size: 2 softmax layers, width 8 heads."""
    from supernet import TransformerConfig

    hd = config.head_dim
    layer = LayerChoice(heads=8, ffn_dim=32 * hd, attention="softmax")
    return TransformerConfig(config.vocab_size, config.max_seq_len, hd, config.positions, 8 * hd, (layer, layer))


def reference_model(config):
    from supernet import Transformer

    return Transformer(reference_config(config), generator=torch.Generator().manual_seed(0)).eval()


@dataclass
class Measurement:
    results: dict[str, Result]
    baseline_ms: float  # the reference's time that drift correction scales to (reuse it to chain calls)


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
) -> Measurement:
    """Time each static model in ``models`` (key -> :class:`supernet.Transformer`) at ``workload``.

    ``reference`` (default :func:`reference_model` of the first model's config) is timed beside
    every visit to correct drift and detect interference; ``baseline_ms`` chains calls of one
    campaign to one anchor. Returns per-key :class:`~latency.timing_core.Result` (median ms, IQR,
    repeats, flags).
    """
    assert models, "measure() needs at least one model"
    runners = {k: device.prepare(m, workload) for k, m in models.items()}
    ref = device.prepare(reference if reference is not None else reference_model(next(iter(models.values())).config), workload)
    results, baseline = run_protocol(runners, ref, settings, np.random.default_rng(seed), baseline_ms=baseline_ms, progress=progress)
    return Measurement(results, baseline)
