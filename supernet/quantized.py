"""Simulated INT8 in torch: ONNX Runtime's quantization scheme applied to every linear layer of a forward pass.

ONNX Runtime's quantizer (:mod:`latency.quantize`) turns the weight ``MatMul`` nodes of an export into INT8; in
this codebase every one of them is an ``F.linear`` call of :func:`supernet.model.block` or
:func:`supernet.model.lm_head` (Q/K/V/O, FFN, the tied head), for a static model and for the supernet's sliced
weights alike.  :func:`simulated` intercepts those calls (a ``TorchFunctionMode``, active only inside the
``with``) and computes each as ONNX Runtime would:

- weights INT8 symmetric per tensor: scale ``max|w| / 127``, zero point 0, values in [-127, 127];
- the input uint8 asymmetric per tensor over [min(0, lo), max(0, hi)]: ``int8-dynamic`` the range of each call's
  tensor (``DynamicQuantizeLinear``), ``int8-static`` the range calibrated (MinMax) on the fp32 model;
- ``int8-static`` quantizes the product (before the bias) too, over its calibrated range (QDQ puts a pair on a
  quantized MatMul's output);
- rounding half to even, as ``QuantizeLinear`` does.

Two outlier-aware precisions add a per-channel step before ``int8-dynamic`` (the per-channel statistic of a layer's
input: each input channel's largest magnitude over the calibration windows, :func:`channel_max`):

- ``int8-smooth`` (SmoothQuant, Xiao et al. 2023): the input is divided channel-wise by
  ``s_j = max|X_j|^a / max|W_j|^(1-a)`` (a = :data:`SMOOTH_ALPHA`; ``W_j`` the weights reading channel j, over every
  layer that reads the same tensor: Q, K and V share one scale) and the weights multiplied by it, so an outlier
  channel's range moves into the weights before both are quantized per tensor;
- ``int8-outlier`` (LLM.int8, Dettmers et al. 2022): the :data:`OUTLIER_SHARE` of input channels with the largest
  magnitude (at least one; a fixed count, so a layer's cost depends on its shape alone) multiply in fp32, the rest
  in INT8 with those channels zeroed (they no longer stretch the input's range), the two products summed.

:func:`calibrate` runs the fp32 forward on calibration inputs, records the ranges and applies the per-layer rule
of :mod:`latency.quantize`: a layer whose own INT8 output error (relative RMS, on its fp32 inputs) is above
``max_error`` stays fp32.  Layers are numbered by call order within one forward, which is fixed for a model.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterable

import numpy as np
import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from search_spaces import UserError

MAX_ERROR = 0.1  # relative RMS output error of one layer above which it stays fp32
CALIBRATION_WINDOWS = 8  # held-out windows the static ranges (and the per-layer errors) are measured on


def calibration_feeds(tokens: np.ndarray, seq_len: int, windows: int = CALIBRATION_WINDOWS, seed: int = 1,
                      where: str = "calibration tokens", batch_size: int = 1) -> list[dict[str, np.ndarray]]:
    """``windows`` held-out windows of ``seq_len`` tokens (seeded starts) as ``{"input_ids": (batch, seq_len)}`` feeds.

    A corpus shorter than one window of the workload is refused with one line naming both lengths.
    """
    tokens = np.asarray(tokens).reshape(-1)
    if windows < 1:
        raise UserError(f"calibration windows: {windows} is not a positive number")
    if len(tokens) < seq_len * batch_size:
        raise UserError(f"{where}: {len(tokens):,} tokens are too short to calibrate the workload: one calibration input is "
                        f"{batch_size} x {seq_len} tokens; give a longer held-out split (--data) or a shorter workload")
    rng = np.random.default_rng(seed)
    n_starts = len(tokens) - seq_len + 1
    feeds = []
    for _ in range(windows):
        starts = rng.integers(0, n_starts, size=batch_size)
        feeds.append({"input_ids": np.stack([tokens[s : s + seq_len] for s in starts]).astype(np.int64)})  # (B, T)
    return feeds


INT8 = ("int8-dynamic", "int8-static", "int8-smooth", "int8-outlier")
CHANNELWISE = ("int8-smooth", "int8-outlier")  # the precisions that read per-channel input statistics
SMOOTH_ALPHA = 0.5  # SmoothQuant's migration strength (its paper's default, and ONNX Runtime's SmoothQuantAlpha)
OUTLIER_SHARE = 1 / 32  # share of a layer's input channels int8-outlier keeps in fp32 (at least one)
Range = tuple[float, float]


def channel_max(x: torch.Tensor) -> torch.Tensor:
    """Each channel's (last dimension's) largest magnitude over every other dimension: (..., K) -> (K,) float32."""
    return x.detach().abs().reshape(-1, x.shape[-1]).amax(0).float()


def smooth_scales(act_max: torch.Tensor, weight_max: torch.Tensor, alpha: float = SMOOTH_ALPHA) -> torch.Tensor:
    """SmoothQuant's per-channel divisors ``s_j = max|X_j|^alpha / max|W_j|^(1 - alpha)`` (K,), both maxima floored at
    1e-5 (a silent channel or weight row keeps a finite scale)."""
    a, w = act_max.float().clamp_min(1e-5), weight_max.float().clamp_min(1e-5)
    return (a**alpha / w ** (1 - alpha)).float()


def outlier_channels(act_max: torch.Tensor, share: float = OUTLIER_SHARE) -> torch.Tensor:
    """The ``ceil(K * share)`` (at least one) input channels of largest magnitude, ascending: (k,) int64."""
    k = max(1, int(np.ceil(len(act_max) * share)))
    order = torch.sort(-act_max.float().cpu(), stable=True).indices  # ties: the lower channel
    return torch.sort(order[:k]).values.to(torch.int64)


def outlier_ratio(act_max: torch.Tensor) -> float:
    """How far a layer's input has outlier channels: its largest channel magnitude over the median channel's."""
    med = float(act_max.float().median())
    return float(act_max.max()) / med if med > 0 else float("inf")


def quantize_weight(w: torch.Tensor) -> torch.Tensor:
    """INT8 symmetric per-tensor fake quantization: scale ``max|w| / 127``, zero point 0, round half to even."""
    scale = float(w.abs().max()) / 127.0
    if scale == 0.0:
        return w.clone()
    return torch.clamp(torch.round(w / scale), -127, 127) * scale


def activation_range(x: torch.Tensor) -> Range:
    """The range a uint8 activation quantizer covers: the values' min and max, widened to include 0."""
    return min(0.0, float(x.min())), max(0.0, float(x.max()))


def quantize_activation(x: torch.Tensor, lo: float, hi: float) -> torch.Tensor:
    """uint8 asymmetric fake quantization over [lo, hi]: scale ``(hi - lo) / 255``, zero point ``round(-lo / scale)``."""
    scale = (hi - lo) / 255.0
    if scale == 0.0:
        return x.clone()
    zero = min(max(round(-lo / scale), 0), 255)
    return (torch.clamp(torch.round(x / scale) + zero, 0, 255) - zero) * scale


def int8_linear(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None, inp: Range | None = None,
                out: Range | None = None, smooth: torch.Tensor | None = None,
                outliers: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, w, bias)`` computed in INT8: ``inp`` the input's range (None: this call's own, as dynamic
    quantization does), ``out`` the product's range (static) or None (the product stays fp32).

    ``smooth`` (K,): SmoothQuant's divisors: ``x * (1 / s)`` and ``w * s`` are quantized (the ONNX graph's ``Mul`` and
    scaled weight, the same float32 products).  ``outliers`` (k,): those input channels multiply in fp32 and are
    zeroed in the INT8 product (the graph's ``Gather`` + fp32 ``MatMul`` beside a masked INT8 one, then ``Add``)."""
    if smooth is not None:
        x, w = x * (1.0 / smooth).to(x), w * smooth.to(w)
    high = None
    if outliers is not None:
        mask = torch.ones(x.shape[-1], dtype=x.dtype, device=x.device)
        outliers = outliers.to(x.device)
        mask[outliers] = 0.0
        high = F.linear(x[..., outliers], w[:, outliers])  # the outlier channels, fp32
        x, w = x * mask, w * mask
    y = F.linear(quantize_activation(x, *(inp or activation_range(x))), quantize_weight(w))
    if high is not None:
        y = y + high
    if out is not None:
        y = quantize_activation(y, *out)
    return y if bias is None else y + bias


@dataclass
class Int8Plan:
    """How each linear layer (by call order) of one model runs: its ranges (static), or fp32 (the rule)."""

    precision: str
    inputs: list[Range] = field(default_factory=list)  # calibrated input ranges (static)
    outputs: list[Range] = field(default_factory=list)  # calibrated product ranges (static)
    errors: list[float] = field(default_factory=list)  # each layer's own INT8 output error (relative RMS)
    fp32: frozenset[int] = frozenset()  # layers kept fp32 by the rule
    channels: list[dict] = field(default_factory=list)  # int8-smooth / int8-outlier: each layer's smooth / outliers

    def linear(self, i: int, x, w, bias):
        if i in self.fp32:
            return F.linear(x, w, bias)
        if self.precision == "int8-static":
            return int8_linear(x, w, bias, self.inputs[i], self.outputs[i])
        return int8_linear(x, w, bias, **(self.channels[i] if self.channels else {}))


def channel_plan(precision: str, act_max: list[torch.Tensor], weight_max: list[torch.Tensor],
                 groups: list[int]) -> list[dict]:
    """Each layer's per-channel step (``int8_linear``'s ``smooth`` / ``outliers``) from its input's channel maxima,
    its weights' (per input channel) and ``groups`` (each layer's first layer reading the same input tensor:
    SmoothQuant's scale is one per tensor, over the weights of every layer that reads it)."""
    if precision == "int8-outlier":
        return [{"outliers": outlier_channels(a)} for a in act_max]
    assert precision == "int8-smooth", precision
    wmax: dict[int, torch.Tensor] = {}
    for g, w in zip(groups, weight_max):
        wmax[g] = w if g not in wmax else torch.maximum(wmax[g], w)
    return [{"smooth": smooth_scales(act_max[g], wmax[g])} for g in groups]


class _Linears(TorchFunctionMode):
    """Calls ``on_linear(i, x, w, bias)`` for the i-th ``F.linear`` call of each forward, in its place; ``groups``
    records each call's first call on the same input tensor (Q, K and V read one ``ln1`` output)."""

    def __init__(self, on_linear: Callable):
        super().__init__()
        self.on_linear, self.count, self.groups, self._last = on_linear, 0, [], None

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.linear:
            x, w = args[0], args[1]
            bias = args[2] if len(args) > 2 else kwargs.get("bias")
            self.groups.append(self.groups[-1] if x is self._last else self.count)
            self._last = x
            self.count += 1
            return self.on_linear(self.count - 1, x, w, bias)
        return func(*args, **kwargs)


def _each(forward: Callable, feeds: Iterable[torch.Tensor], on_linear: Callable) -> list[int]:
    """``forward`` on each feed with ``on_linear`` in place of its linear layers; the layers' groups (``_Linears``)."""
    groups: list[int] = []
    for x in feeds:
        mode = _Linears(on_linear)
        with torch.no_grad(), mode:
            forward(x)
        groups = mode.groups
    return groups


def channel_maxima(forward: Callable, feeds: Iterable[torch.Tensor]) -> list[torch.Tensor]:
    """Each linear layer's input channel maxima (:func:`channel_max`) over the fp32 ``forward`` on ``feeds``: the
    per-channel activation statistics the outlier-aware precisions read (and :func:`outlier_ratio` reports)."""
    act: dict[int, torch.Tensor] = {}

    def record(i, x, w, bias):
        m = channel_max(x)
        act[i] = m if i not in act else torch.maximum(act[i], m)
        return F.linear(x, w, bias)

    _each(forward, feeds, record)
    return [act[i] for i in sorted(act)]


def calibrate(forward: Callable[[torch.Tensor], torch.Tensor], feeds: list[torch.Tensor], precision: str,
              max_error: float | None) -> Int8Plan:
    """Ranges (static) and the per-layer rule (``max_error``; None: every layer INT8) from the fp32 ``forward`` on
    ``feeds`` (token batches): two fp32 passes, one for the ranges, one for each layer's own error."""
    assert precision in INT8, precision
    plan = Int8Plan(precision)
    lo_in, hi_in, lo_out, hi_out, act, wmax = {}, {}, {}, {}, {}, {}

    def ranges(i, x, w, bias):
        y = F.linear(x, w)
        for lo, hi, t in ((lo_in, hi_in, x), (lo_out, hi_out, y)):
            a, b = activation_range(t)
            lo[i], hi[i] = min(lo.get(i, 0.0), a), max(hi.get(i, 0.0), b)
        if precision in CHANNELWISE:
            m = channel_max(x)
            act[i], wmax[i] = (m if i not in act else torch.maximum(act[i], m)), channel_max(w)
        return y if bias is None else y + bias

    groups = []
    if precision in ("int8-static", *CHANNELWISE) or max_error is not None:
        groups = _each(forward, feeds, ranges)
    plan.inputs = [(lo_in[i], hi_in[i]) for i in sorted(lo_in)]
    plan.outputs = [(lo_out[i], hi_out[i]) for i in sorted(lo_out)]
    if precision in CHANNELWISE:
        plan.channels = channel_plan(precision, [act[i] for i in sorted(act)], [wmax[i] for i in sorted(wmax)], groups)
    if max_error is None:
        return plan
    pairs: dict[int, list] = {}

    def errors(i, x, w, bias):
        y = F.linear(x, w)
        static = precision == "int8-static"
        q = int8_linear(x, w, None, plan.inputs[i] if static else None, plan.outputs[i] if static else None,
                        **(plan.channels[i] if plan.channels else {}))
        pairs.setdefault(i, []).append((q, y))
        return y if bias is None else y + bias

    _each(forward, feeds, errors)
    plan.errors = [relative_error(pairs[i]) for i in sorted(pairs)]
    plan.fp32 = frozenset(i for i, e in enumerate(plan.errors) if not e <= max_error)
    return plan


class Simulated(torch.nn.Module):
    """``model`` whose linear layers run as ``plan`` says (INT8, or fp32 where the rule keeps them); the layers are
    numbered from 0 at every call, so each forward pass (a batch of windows) meets them in the same order."""

    def __init__(self, model: torch.nn.Module, plan: Int8Plan):
        super().__init__()
        self.model, self.plan = model, plan

    def forward(self, *args, **kwargs):
        with _Linears(self.plan.linear):
            return self.model(*args, **kwargs)


def relative_error(pairs: Iterable[tuple[torch.Tensor, torch.Tensor]]) -> float:
    """``sqrt(sum |q - y|^2 / sum |y|^2)`` over (quantized, fp32) output pairs: a layer's relative RMS error."""
    num = den = 0.0
    for q, y in pairs:
        num, den = num + float(((q.double() - y.double()) ** 2).sum()), den + float((y.double() ** 2).sum())
    return (num / den) ** 0.5 if den > 0 else 0.0
