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


INT8 = ("int8-dynamic", "int8-static")
Range = tuple[float, float]


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
                out: Range | None = None) -> torch.Tensor:
    """``F.linear(x, w, bias)`` computed in INT8: ``inp`` the input's range (None: this call's own, as dynamic
    quantization does), ``out`` the product's range (static) or None (the product stays fp32)."""
    y = F.linear(quantize_activation(x, *(inp or activation_range(x))), quantize_weight(w))
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

    def linear(self, i: int, x, w, bias):
        if i in self.fp32:
            return F.linear(x, w, bias)
        if self.precision == "int8-static":
            return int8_linear(x, w, bias, self.inputs[i], self.outputs[i])
        return int8_linear(x, w, bias)


class _Linears(TorchFunctionMode):
    """Calls ``on_linear(i, x, w, bias)`` for the i-th ``F.linear`` call of each forward, in its place."""

    def __init__(self, on_linear: Callable):
        super().__init__()
        self.on_linear, self.count = on_linear, 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.linear:
            x, w = args[0], args[1]
            bias = args[2] if len(args) > 2 else kwargs.get("bias")
            self.count += 1
            return self.on_linear(self.count - 1, x, w, bias)
        return func(*args, **kwargs)


def _each(forward: Callable, feeds: Iterable[torch.Tensor], on_linear: Callable) -> None:
    for x in feeds:
        mode = _Linears(on_linear)
        with torch.no_grad(), mode:
            forward(x)


def calibrate(forward: Callable[[torch.Tensor], torch.Tensor], feeds: list[torch.Tensor], precision: str,
              max_error: float | None) -> Int8Plan:
    """Ranges (static) and the per-layer rule (``max_error``; None: every layer INT8) from the fp32 ``forward`` on
    ``feeds`` (token batches): two fp32 passes, one for the ranges, one for each layer's own error."""
    assert precision in INT8, precision
    plan = Int8Plan(precision)
    lo_in, hi_in, lo_out, hi_out = {}, {}, {}, {}

    def ranges(i, x, w, bias):
        y = F.linear(x, w)
        for lo, hi, t in ((lo_in, hi_in, x), (lo_out, hi_out, y)):
            a, b = activation_range(t)
            lo[i], hi[i] = min(lo.get(i, 0.0), a), max(hi.get(i, 0.0), b)
        return y if bias is None else y + bias

    if precision == "int8-static" or max_error is not None:
        _each(forward, feeds, ranges)
    plan.inputs = [(lo_in[i], hi_in[i]) for i in sorted(lo_in)]
    plan.outputs = [(lo_out[i], hi_out[i]) for i in sorted(lo_out)]
    if max_error is None:
        return plan
    pairs: dict[int, list] = {}

    def errors(i, x, w, bias):
        y = F.linear(x, w)
        static = precision == "int8-static"
        q = int8_linear(x, w, None, plan.inputs[i] if static else None, plan.outputs[i] if static else None)
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
