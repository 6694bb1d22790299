"""Bits per byte at a precision: ONNX Runtime's real quantized model, and the torch estimate checked against it.

The search scores thousands of candidates, so at an INT8 precision its fitness is the torch estimate
(:class:`supernet.scoring.InheritedLoss` with ``precision``: :mod:`supernet.quantized` simulates ONNX Runtime's
scheme on the supernet's linear layers).  :func:`agreement` checks that estimate against the real thing on a sample
of subnets: each subnet's static model in ONNX (the stitched graph of :mod:`latency.onnx_graphs` with the model's
own weights: the same compute as a whole export, tested), quantized by :func:`latency.quantize.quantize_model` with
the same calibration windows and per-layer rule, scored by ONNX Runtime on the same held-out windows in the same
batches (dynamic ranges are per call, so the batches must match).
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import torch

from search_spaces import Subnet
from supernet.elastic import extract
from supernet.heldout import IGNORE, StaticAsSupernet
from supernet.onnx_decode import onnx_decode_logits
from supernet.onnx_export import INPUT_IDS, onnx_session
from supernet.scoring import InheritedLoss

from .onnx_graphs import cached_graph, with_weights
from .quantize import CALIBRATION_WINDOWS, MAX_ERROR, calibration_feeds, quantize_model

LN2 = float(np.log(2.0))


def ort_window_bits(session, x: np.ndarray, y: np.ndarray, batch_size: int = 16) -> np.ndarray:
    """Mean bits per scored token of each window (W,) from an ONNX Runtime session ``input_ids -> logits``, in batches of
    ``batch_size`` windows in order (:meth:`supernet.heldout.HeldOut.window_bits`'s batches); targets equal to
    ``supernet.heldout.IGNORE`` (the positions a task does not score: a masked LM's unmasked ones) are not scored."""

    out = []
    for i in range(0, len(x), batch_size):
        logits = session.run(None, {INPUT_IDS: x[i : i + batch_size].astype(np.int64)})[0].astype(np.float64)  # (B, T, V)
        m = logits.max(-1, keepdims=True)
        logz = (m + np.log(np.exp(logits - m).sum(-1, keepdims=True)))[..., 0]  # (B, T)
        yb = y[i : i + batch_size]  # (B, T)
        scored = yb != IGNORE
        target = np.take_along_axis(logits, np.where(scored, yb, 0)[:, :, None], -1)[..., 0]  # (B, T)
        out.append(np.where(scored, logz - target, 0.0).sum(1) / scored.sum(1) / LN2)
    return np.concatenate(out)


def onnx_bits(path: str | Path, fitness, threads: int | None = 1) -> float:
    """Bits per byte of the ONNX model ``path`` in ONNX Runtime on the fitness's held-out windows and batches."""

    held = fitness.heldout
    session = onnx_session(path, threads=threads)
    return float(ort_window_bits(session, held.x.numpy(), held.y.numpy(), fitness.batch_size).mean())


def quantize_export(src: str | Path, dst: str | Path, precision: str, fitness):
    """``src`` (fp32 ONNX) quantized to ``dst`` with the fitness's calibration windows and per-layer rule."""

    feeds = [{INPUT_IDS: t.cpu().numpy()} for t in fitness.calibration]
    return quantize_model(src, dst, precision, feeds, max_error=fitness.max_error)


@dataclass
class Agreement:
    subnets: list[Subnet]
    estimate: np.ndarray  # torch, simulated INT8
    real: np.ndarray  # ONNX Runtime, the quantized model
    fp32: np.ndarray  # torch, fp32

    @property
    def kendall_tau(self) -> float:
        from scipy.stats import kendalltau

        return float(kendalltau(self.estimate, self.real).statistic)

    @property
    def mean_abs_diff(self) -> float:
        return float(np.abs(self.estimate - self.real).mean())

    def summary(self) -> dict:
        return {"subnets": len(self.subnets), "kendall_tau": self.kendall_tau, "mean_abs_diff_bpb": self.mean_abs_diff,
                "max_abs_diff_bpb": float(np.abs(self.estimate - self.real).max()),
                "mean_int8_minus_fp32_bpb": float((self.real - self.fp32).mean())}


def agreement(supernet, fitness, subnets: Sequence[Subnet], progress: Callable[[int, int], None] | None = None) -> Agreement:
    """The torch estimate of each subnet's INT8 bits/byte (``fitness``, an INT8 :class:`InheritedLoss`) beside ONNX
    Runtime's on the real quantized model, and fp32 (torch) for reference."""


    assert isinstance(fitness, InheritedLoss) and fitness.calibration is not None, "an INT8 fitness"
    est, real, fp32 = [], [], []
    for n, subnet in enumerate(subnets):
        est.append(float(fitness([subnet])[0]))
        fp32.append(fitness.heldout.bits(supernet, subnet, fitness.batch_size, mixed_precision=False))
        model = extract(supernet.cpu(), subnet).eval()
        with tempfile.TemporaryDirectory(prefix="nas-agree-") as tmp, torch.no_grad():
            graph, tensors = cached_graph(model)
            own = with_weights(graph, tensors, model, Path(tmp))
            quantize_export(own, Path(tmp) / "int8.onnx", fitness.precision, fitness)
            real.append(onnx_bits(Path(tmp) / "int8.onnx", fitness))
        if progress:
            progress(n + 1, len(subnets))
    return Agreement(list(subnets), np.array(est), np.array(real), np.array(fp32))


def int8_file(precision: str) -> str:
    """The quantized ONNX an export writes beside ``model.onnx``: ``model.int8-dynamic.onnx`` / ``model.int8-static.onnx``."""
    return f"model.{precision}.onnx"


def export_quantized(model, space, onnx_path: Path, precision: str, tokens: np.ndarray, scoring, where: str) -> dict:
    """Write ``model.onnx`` at ``precision`` beside it (calibrated on held-out windows of ``tokens``, the per-layer rule)
    and score both files with ONNX Runtime on the search's windows (``scoring``: :class:`supernet.scoring.Scoring`), plus the
    torch estimate the search uses: the card's ``quantized`` entry."""

    seq_len = min(scoring.seq_len, space.max_seq_len)
    fit = InheritedLoss(StaticAsSupernet(model.eval(), space), tokens, seq_len=seq_len, windows=scoring.windows,
                        batch_size=scoring.batch_size, seed=scoring.seed, where=where, precision=precision)
    path = Path(onnx_path).with_name(int8_file(precision))
    report = quantize_export(onnx_path, path, precision, fit)
    return {
        **report.record(),
        "file": path.name,
        "calibration": fit.description["calibration"],
        "bits_per_byte": {"fp32_onnxruntime": onnx_bits(onnx_path, fit), "int8_onnxruntime": onnx_bits(path, fit),
                          "int8_torch_estimate": float(fit([model.subnet])[0])},
        "scoring": {k: fit.description[k] for k in ("windows", "seq_len", "seed")} | {"source": where},
    }


class _Recording:
    """An ONNX Runtime session that keeps a copy of every feed it runs (the step graph's calibration inputs)."""

    def __init__(self, session):
        self.session, self.feeds = session, []

    def __getattr__(self, name):
        return getattr(self.session, name)

    def run(self, names, feed):
        self.feeds.append(dict(feed))  # the arrays are replaced, not written into, by the next step
        return self.session.run(names, feed)


def quantize_step(step_path: Path, precision: str, tokens: np.ndarray, seq_len: int, where: str,
                  every: int = 4) -> tuple[Path, dict]:
    """The decode step graph ``step_path`` at ``precision`` beside it (``step.int8-dynamic.onnx``): calibrated on the
    steps of teacher-forced held-out windows (every ``every``-th step: states of every length up to ``seq_len``);
    (path, the card's ``quantized_step`` entry)."""

    windows = calibration_feeds(tokens, seq_len, CALIBRATION_WINDOWS, seed=1, where=where)
    recording = _Recording(onnx_session(step_path, threads=1))
    for w in windows:
        onnx_decode_logits(recording, w[INPUT_IDS])
    feeds = recording.feeds[::every]
    path = Path(step_path).with_name(f"step.{precision}.onnx")
    report = quantize_model(step_path, path, precision, feeds, max_error=MAX_ERROR)
    return path, {**report.record(), "file": path.name, "calibration": {"windows": len(windows), "seq_len": seq_len,
                                                                       "steps": len(feeds), "seed": 1}}
