"""INT8 precisions of an ONNX model, through ONNX Runtime's quantization tools (``onnxruntime.quantization``).

Precisions (``--precision``):

- ``fp32``: the model as exported.
- ``int8-dynamic``: :func:`onnxruntime.quantization.quantize_dynamic`: weights INT8 (symmetric, per tensor),
  activations quantized at run time (``DynamicQuantizeLinear``: uint8, asymmetric, the range of each call's
  tensor), ``MatMulInteger``.
- ``int8-static``: :func:`onnxruntime.quantization.quantize_static` in QDQ format: weights INT8 (symmetric,
  per tensor), activations uint8 (asymmetric) with ranges calibrated (MinMax) on held-out windows of the
  corpus (:func:`calibration_feeds`); ONNX Runtime fuses the QDQ pairs into integer kernels.

What is quantized: the ``MatMul`` nodes whose second input is a weight (an initializer after ONNX Runtime's
basic, provider-independent graph optimizations: constant folding turns the exporter's ``Transpose(weight)``
into a plain initializer, for a whole export and a stitched timing graph alike, see :func:`prepare`).  So
every linear layer (Q/K/V/O projections, FFN, the tied head) runs INT8; attention itself (the fused opset-23
``Attention`` node, the linear family's activation-by-activation products) stays fp32.  (ONNX Runtime's
``QAttention`` does not take opset 23's ``Attention`` attributes, and the simulated estimate of
:mod:`supernet` quantizes exactly the linear layers.)

**The per-layer rule** (``max_error``): a weight ``MatMul`` stays fp32 when its own INT8 output error on the
calibration windows is large: the relative RMS error ``||Y_int8 - Y|| / ||Y||`` of the node's output,
computed on the node's fp32 inputs (fp32 everywhere else, so errors of earlier layers do not count against
it), with the precision's scheme (:func:`simulate_matmul`), is above ``max_error`` (default
:data:`MAX_ERROR`, 0.1 = 10%).  Outlier channels in an activation or a weight stretch the per-tensor range
and raise this error; those layers are listed in the report and passed to the quantizer as
``nodes_to_exclude``.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from search_spaces import UserError
from supernet.quantized import CALIBRATION_WINDOWS, MAX_ERROR, calibration_feeds  # noqa: F401  (below the search's INT8 fitness)

PRECISIONS = ("fp32", "int8-dynamic", "int8-static")
INT8 = PRECISIONS[1:]


def check_precision(precision: str | None, flag: str = "--precision") -> str:
    """The precision named, ``fp32`` when none is; a :class:`UserError` names an unknown one."""
    precision = precision or "fp32"
    if precision not in PRECISIONS:
        raise UserError(f"{flag}: {precision!r} is not one of {', '.join(PRECISIONS)}")
    return precision


def check_device(precision: str, device: str, provider: str | None = None) -> None:
    """Refuse an INT8 precision on a device that cannot run it (its class's ``precisions``; ONNX Runtime's INT8 with
    the CPU provider only), naming the devices that can."""
    from .device import DEVICES, precisions_of

    if precision == "fp32":
        return
    if precision not in precisions_of(device) or (provider or "cpu") != "cpu":
        where = f"--device {device}" + (f" --provider {provider}" if provider else "")
        can = [n for n, c in DEVICES.all().items() if precision in getattr(c, "precisions", ("fp32",))]
        raise UserError(f"--precision {precision}: {where} runs fp32 only; {precision} runs on "
                        + " or ".join(f"--device {n}" for n in can) + " (--provider cpu; the ARM bundle will follow)")


def precision_of(fingerprint: dict) -> str:
    """The precision a timing table or predictor was measured at (tables written before precisions: fp32)."""
    return fingerprint.get("precision", "fp32")


# --------------------------------------------------------------------------- graph preparation


def prepare(src: str | Path, dst: str | Path) -> Path:
    """``src`` after ONNX Runtime's basic (provider-independent) optimizations, written to ``dst``: constant folding
    makes every ``Transpose(weight)`` a plain initializer, so the quantizer sees the weights of a stitched
    timing graph as it sees those of a whole export."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    options.optimized_model_filepath = str(dst)
    options.log_severity_level = 3
    ort.InferenceSession(str(src), options, providers=["CPUExecutionProvider"])
    return Path(dst)


def weight_matmuls(model) -> dict[str, tuple[str, np.ndarray]]:
    """``{node name: (activation input, weight (K, N))}`` of every MatMul whose second input is a 2-D initializer."""
    from onnx import numpy_helper

    weights = {i.name: i for i in model.graph.initializer if len(i.dims) == 2}
    return {n.name: (n.input[0], numpy_helper.to_array(weights[n.input[1]]))
            for n in model.graph.node if n.op_type == "MatMul" and n.input[1] in weights}


# --------------------------------------------------------------------------- the scheme, simulated


def simulate_matmul(inputs: list[np.ndarray], w: np.ndarray, precision: str) -> float:
    """The per-layer rule's error of ``x @ w`` (``w`` an ONNX MatMul weight, (K, N)) over the calibration ``inputs``:
    the relative RMS error of its INT8 output (:mod:`supernet.quantized`, the scheme in torch) against fp32.

    ``int8-dynamic``: the input's range per call (per input).  ``int8-static``: the input's and the product's
    ranges over all the inputs (MinMax calibration; QDQ quantizes a MatMul's output too).
    """
    import torch
    import torch.nn.functional as F

    from supernet.quantized import activation_range, int8_linear, relative_error

    assert precision in INT8
    wt = torch.from_numpy(np.ascontiguousarray(w.T))  # F.linear's (N, K)
    xs = [torch.from_numpy(x) for x in inputs]
    ys = [F.linear(x, wt) for x in xs]
    inp = out = None
    if precision == "int8-static":
        inp = activation_range(torch.cat([x.reshape(-1) for x in xs]))
        out = activation_range(torch.cat([y.reshape(-1) for y in ys]))
    return relative_error((int8_linear(x, wt, None, inp, out), y) for x, y in zip(xs, ys))


# --------------------------------------------------------------------------- quantizing a file


@dataclass
class QuantReport:
    """What :func:`quantize_model` did: the precision, the layers quantized, those kept fp32 and every layer's error."""

    precision: str
    quantized: list[str] = field(default_factory=list)
    kept_fp32: list[str] = field(default_factory=list)
    errors: dict[str, float] = field(default_factory=dict)  # node -> relative RMS error (when the rule ran)
    max_error: float | None = None

    def record(self) -> dict:
        """For a model card: the scheme, the rule and its outcome."""
        return {"precision": self.precision, "quantized_matmuls": len(self.quantized), "kept_fp32": self.kept_fp32,
                "max_error": self.max_error, "errors": {k: round(v, 6) for k, v in sorted(self.errors.items())},
                "scheme": "weights int8 symmetric per tensor; activations uint8 asymmetric per tensor ("
                + ("calibrated MinMax, QDQ" if self.precision == "int8-static" else "dynamic, per call") + ")"}


def layer_errors(path: str | Path, feeds: list[dict], precision: str) -> dict[str, float]:
    """The per-layer rule's error of every weight MatMul of the (prepared) model ``path`` on ``feeds``."""
    import onnx
    import onnxruntime as ort

    model = onnx.load(str(path))
    nodes = weight_matmuls(model)
    acts = sorted({a for a, _ in nodes.values()})
    have = {o.name for o in model.graph.output}
    model.graph.output.extend([onnx.ValueInfoProto(name=a) for a in acts if a not in have])
    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    runs = [dict(zip(acts, session.run(acts, feed))) for feed in feeds]
    return {name: simulate_matmul([r[a] for r in runs], w, precision) for name, (a, w) in nodes.items()}


class _Reader:
    """A ``CalibrationDataReader`` over a list of feeds (the interface ``quantize_static`` calls: ``get_next``)."""

    def __init__(self, feeds: list[dict]):
        self._it = iter(feeds)

    def get_next(self):
        return next(self._it, None)

    def rewind(self):  # some calibrators read twice
        pass


def quantize_model(src: str | Path, dst: str | Path, precision: str, feeds: list[dict] | None = None,
                   max_error: float | None = MAX_ERROR) -> QuantReport:
    """Write ``src`` at ``precision`` to ``dst`` with ONNX Runtime's quantizer and return what was done.

    ``feeds``: calibration inputs (needed by ``int8-static`` and by the per-layer rule); ``max_error`` None skips
    the rule (every weight MatMul quantized).  ``fp32`` copies the file.
    """
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_dynamic, quantize_static

    precision = check_precision(precision)
    src, dst = Path(src), Path(dst)
    if precision == "fp32":
        shutil.copyfile(src, dst)
        return QuantReport(precision)
    if (precision == "int8-static" or max_error is not None) and not feeds:
        raise UserError(f"--precision {precision}: no calibration data (held-out windows) was given")
    import onnx

    tmp = tempfile.mkdtemp(prefix="nas-quant-")
    try:
        inline = Path(tmp) / "inline.onnx"  # weights inside (a timing graph keeps them in a file beside it)
        onnx.save(onnx.load(str(src)), str(inline))
        prepared = prepare(inline, Path(tmp) / "prepared.onnx")
        names = list(weight_matmuls(onnx.load(str(prepared))))
        report = QuantReport(precision, max_error=max_error)
        if max_error is not None:
            report.errors = layer_errors(prepared, feeds, precision)
            report.kept_fp32 = sorted(n for n, e in report.errors.items() if not e <= max_error)
        report.quantized = [n for n in names if n not in report.kept_fp32]
        if not report.quantized:  # every layer kept fp32 (or none to quantize): the prepared model as it is
            shutil.copyfile(prepared, dst)
            _keep_metadata(src, dst)
            return report
        common = dict(op_types_to_quantize=["MatMul"], nodes_to_quantize=report.quantized,
                      weight_type=QuantType.QInt8, per_channel=False, reduce_range=False)
        with _quiet_quantizer():
            if precision == "int8-dynamic":
                quantize_dynamic(prepared, dst, **common)
            else:
                quantize_static(prepared, dst, _Reader(feeds), quant_format=QuantFormat.QDQ,
                                activation_type=QuantType.QUInt8, **common)
        _keep_metadata(src, dst)
        return report
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _keep_metadata(src: Path, dst: Path) -> None:
    """The source's metadata (a decode step graph's input layout) on the quantized file too."""
    import onnx

    theirs = onnx.load(str(src), load_external_data=False).metadata_props
    model = onnx.load(str(dst))
    have = {p.key for p in model.metadata_props}
    missing = [p for p in theirs if p.key not in have]
    if missing:
        model.metadata_props.extend(missing)
        onnx.save(model, str(dst))


class _quiet_quantizer:
    """The quantizer logs advice ("consider pre-processing") through the root logger; keep it off the user's screen."""

    def __enter__(self):
        import logging

        self.logger = logging.getLogger()
        self.level = self.logger.level
        self.logger.setLevel(logging.ERROR)

    def __exit__(self, *exc):
        self.logger.setLevel(self.level)


def quantized_copy(graph: str, directory: str, precision: str, feeds: list[dict]) -> str:
    """The timing graph ``graph`` (weights beside it in ``directory``) at ``precision``, every weight MatMul quantized
    (random weights have no outliers: the per-layer rule is an export's, on trained weights); its path."""
    if precision == "fp32":
        return graph
    out = os.path.join(directory, f"model.{precision}.onnx")
    quantize_model(graph, out, precision, feeds, max_error=None)
    return out


def check_predictor_precision(predictor, path, precision: str) -> None:
    """Refuse a predictor fitted on timings at another precision than ``--precision``, naming both."""
    theirs = precision_of(getattr(predictor, "fingerprint", None) or {})
    if theirs != precision:
        raise UserError(f"--predictor {path}: fitted on timings at precision {theirs}, but --precision is {precision}; "
                        f"measure at {precision} (nas measure-latency --device onnxruntime --precision {precision}) "
                        "and fit a predictor on them")
