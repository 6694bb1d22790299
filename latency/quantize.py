"""INT8 precisions of an ONNX model, through ONNX Runtime's quantization tools (``onnxruntime.quantization``).

Precisions (``--precision``):

- ``fp32``: the model as exported.
- ``int8-dynamic``: :func:`onnxruntime.quantization.quantize_dynamic`: weights INT8 (symmetric, per tensor),
  activations quantized at run time (``DynamicQuantizeLinear``: uint8, asymmetric, the range of each call's
  tensor), ``MatMulInteger``.
- ``int8-static``: :func:`onnxruntime.quantization.quantize_static` in QDQ format: weights INT8 (symmetric,
  per tensor), activations uint8 (asymmetric) with ranges calibrated (MinMax) on held-out windows of the
  corpus (:func:`calibration_feeds`); ONNX Runtime fuses the QDQ pairs into integer kernels.
- ``int8-smooth``: SmoothQuant, then ``int8-dynamic``: each weight MatMul's input is divided channel-wise by
  ``s_j = max|X_j|^0.5 / max|W_j|^0.5`` (channel maxima on the calibration windows; one ``Mul`` per input tensor,
  shared by the MatMuls that read it) and the weights' rows multiplied by ``s``.  ONNX Runtime's quantizer has this as
  ``extra_options={"SmoothQuant": True}``, but it runs Intel Neural Compressor's ``ORTSmoothQuant``, a package this
  toolkit does not require, and folds the ``Mul`` into whatever precedes it, which the torch estimate of the search
  would then have to follow; the rewrite here (:func:`channel_rewrite`) is the same formula in a few graph nodes.
- ``int8-outlier``: LLM.int8's decomposition, then ``int8-dynamic``: the ``OUTLIER_SHARE`` (1/32, at least one) input
  channels of largest magnitude on the calibration windows (``Gather``) multiply their weight rows in an fp32
  ``MatMul``; the input with those channels zeroed (``Mul`` by a 0/1 mask) and the weights with those rows zeroed run
  INT8; an ``Add`` sums the two.

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
from supernet.quantized import CHANNELWISE, OUTLIER_SHARE, SMOOTH_ALPHA

PRECISIONS = ("fp32", "int8-dynamic", "int8-static", "int8-smooth", "int8-outlier")
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


def simulate_matmul(inputs: list[np.ndarray], w: np.ndarray, precision: str, channels: dict | None = None) -> float:
    """The per-layer rule's error of ``x @ w`` (``w`` an ONNX MatMul weight, (K, N)) over the calibration ``inputs``:
    the relative RMS error of its INT8 output (:mod:`supernet.quantized`, the scheme in torch) against fp32.

    ``int8-dynamic``: the input's range per call (per input).  ``int8-static``: the input's and the product's
    ranges over all the inputs (MinMax calibration; QDQ quantizes a MatMul's output too).  ``int8-smooth`` /
    ``int8-outlier``: ``channels``, the layer's per-channel step (:func:`channel_steps`), then dynamic.
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
    return relative_error((int8_linear(x, wt, None, inp, out, **(channels or {})), y) for x, y in zip(xs, ys))


def channel_steps(nodes: dict[str, tuple[str, np.ndarray]], act_max: dict[str, np.ndarray],
                  precision: str) -> dict[str, dict]:
    """Each weight MatMul's per-channel step at ``int8-smooth`` / ``int8-outlier`` (``int8_linear``'s ``smooth`` or
    ``outliers``, as torch tensors) from its input's channel maxima ``act_max`` (by tensor name); the simulation's
    :func:`supernet.quantized.channel_plan`, the MatMuls that read one tensor forming one group."""
    import torch

    from supernet.quantized import channel_plan

    names = list(nodes)
    first = {}
    groups = [names.index(first.setdefault(nodes[n][0], n)) for n in names]
    acts = [torch.from_numpy(np.asarray(act_max[nodes[n][0]], dtype=np.float32)) for n in names]
    wmax = [torch.from_numpy(np.abs(nodes[n][1]).max(axis=1).astype(np.float32)) for n in names]  # per input row
    return dict(zip(names, channel_plan(precision, acts, wmax, groups)))


def channel_rewrite(model, nodes: dict[str, tuple[str, np.ndarray]], steps: dict[str, dict]) -> list[str]:
    """Rewrite ``model`` (in place) so that each MatMul of ``steps`` computes its per-channel step before an INT8
    product: the names of the MatMuls the quantizer is then to quantize (the outlier MatMuls stay fp32).

    ``smooth``: ``Mul(x, 1/s)`` once per input tensor, the MatMul's weight a new initializer ``W * s[:, None]``.
    ``outliers``: ``Mul(x, mask)`` and ``Gather(x, idx, axis=-1)`` once per input tensor; the MatMul reads the masked
    input and ``W`` with those rows zeroed, an fp32 ``MatMul`` the gathered channels and ``W[idx]``, and an ``Add``
    of the two writes the MatMul's old output.  Initializers no longer read are dropped.
    """
    from onnx import helper, numpy_helper

    graph = model.graph
    before: dict[str, list] = {}  # node name -> nodes to insert before it (the shared per-tensor ones)
    after: dict[str, list] = {}
    made: dict[str, str] = {}  # (activation, kind) -> the tensor made from it
    inits, quantize = [], []
    for n in graph.node:
        if n.name not in steps:
            continue
        act, w = nodes[n.name]
        step, tag = steps[n.name], f"nas_{len(quantize)}"
        if "smooth" in step:
            s = step["smooth"].numpy().astype(np.float32)
            key = f"{act}|smooth"
            if key not in made:
                made[key] = f"{act}_smoothed_{len(made)}"
                inits.append(numpy_helper.from_array((1.0 / step["smooth"]).numpy().astype(np.float32), made[key] + "_inv"))
                before.setdefault(n.name, []).append(helper.make_node("Mul", [act, made[key] + "_inv"], [made[key]],
                                                                      name=made[key] + "_mul"))
            inits.append(numpy_helper.from_array((w * s[:, None]).astype(np.float32), f"{tag}_w_smooth"))
            n.input[0], n.input[1] = made[key], f"{tag}_w_smooth"
        else:
            idx = step["outliers"].numpy().astype(np.int64)
            mask = np.ones(w.shape[0], dtype=np.float32)
            mask[idx] = 0.0
            key = f"{act}|outliers"
            if key not in made:
                made[key] = f"{act}_outliers_{len(made)}"
                inits += [numpy_helper.from_array(mask, made[key] + "_mask"), numpy_helper.from_array(idx, made[key] + "_idx")]
                before.setdefault(n.name, []).extend([
                    helper.make_node("Mul", [act, made[key] + "_mask"], [made[key] + "_rest"], name=made[key] + "_mul"),
                    helper.make_node("Gather", [act, made[key] + "_idx"], [made[key] + "_high"], axis=-1,
                                     name=made[key] + "_gather")])
            inits += [numpy_helper.from_array((w * mask[:, None]).astype(np.float32), f"{tag}_w_rest"),
                      numpy_helper.from_array(np.ascontiguousarray(w[idx]).astype(np.float32), f"{tag}_w_high")]
            out = n.output[0]
            n.input[0], n.input[1], n.output[0] = made[key] + "_rest", f"{tag}_w_rest", f"{tag}_int8"
            after[n.name] = [helper.make_node("MatMul", [made[key] + "_high", f"{tag}_w_high"], [f"{tag}_fp32"],
                                              name=f"{n.name}_outliers_fp32"),
                             helper.make_node("Add", [f"{tag}_int8", f"{tag}_fp32"], [out], name=f"{n.name}_outliers_add")]
        quantize.append(n.name)
    ordered = []
    for n in graph.node:
        ordered += [*before.get(n.name, []), n, *after.get(n.name, [])]
    graph.initializer.extend(inits)
    del graph.node[:]
    graph.node.extend(ordered)
    read = {i for n in graph.node for i in n.input} | {o.name for o in graph.output}
    keep = [i for i in graph.initializer if i.name in read]
    del graph.initializer[:]
    graph.initializer.extend(keep)
    return quantize


# --------------------------------------------------------------------------- quantizing a file


@dataclass
class QuantReport:
    """What :func:`quantize_model` did: the precision, the layers quantized, those kept fp32 and every layer's error."""

    precision: str
    quantized: list[str] = field(default_factory=list)
    kept_fp32: list[str] = field(default_factory=list)
    errors: dict[str, float] = field(default_factory=dict)  # node -> relative RMS error (when the rule ran)
    outlier_channels: dict[str, int] = field(default_factory=dict)  # int8-outlier: node -> input channels kept fp32
    max_error: float | None = None

    def record(self) -> dict:
        """For a model card: the scheme, the rule and its outcome."""
        return {"precision": self.precision, "quantized_matmuls": len(self.quantized), "kept_fp32": self.kept_fp32,
                "max_error": self.max_error, "errors": {k: round(v, 6) for k, v in sorted(self.errors.items())},
                "scheme": SCHEMES[self.precision] + "weights int8 symmetric per tensor; activations uint8 asymmetric per "
                "tensor (" + ("calibrated MinMax, QDQ" if self.precision == "int8-static" else "dynamic, per call") + ")",
                **({"outlier_channels": dict(sorted(self.outlier_channels.items()))} if self.outlier_channels else {})}


SCHEMES = {"int8-dynamic": "", "int8-static": "", "fp32": "",
           "int8-smooth": f"SmoothQuant (alpha {SMOOTH_ALPHA}, per-channel input maxima on the calibration windows); ",
           "int8-outlier": f"LLM.int8 decomposition (the {OUTLIER_SHARE:.4g} share of input channels of largest magnitude "
                           "on the calibration windows in fp32, at least one); "}


def matmul_inputs(path: str | Path, feeds: list[dict]) -> tuple[dict, list[dict[str, np.ndarray]]]:
    """The weight MatMuls of the (prepared) model ``path`` (:func:`weight_matmuls`) and, for each feed, the fp32
    values of their inputs by tensor name (an ONNX Runtime run with those tensors added as outputs)."""
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
    return nodes, [dict(zip(acts, session.run(acts, feed))) for feed in feeds]


def input_channel_max(runs: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Each tensor's per-channel (last dimension) largest magnitude over the runs: the per-channel activation
    statistics of the calibration windows (:func:`supernet.quantized.channel_max` in numpy)."""
    return {a: np.max([np.abs(r[a]).reshape(-1, r[a].shape[-1]).max(0) for r in runs], axis=0) for a in runs[0]}


def layer_errors(path: str | Path, feeds: list[dict], precision: str) -> dict[str, float]:
    """The per-layer rule's error of every weight MatMul of the (prepared) model ``path`` on ``feeds``."""
    nodes, runs = matmul_inputs(path, feeds)
    steps = channel_steps(nodes, input_channel_max(runs), precision) if precision in CHANNELWISE else {}
    return errors_of(nodes, runs, precision, steps)


def errors_of(nodes: dict, runs: list[dict], precision: str, steps: dict[str, dict]) -> dict[str, float]:
    """The per-layer rule's error of each MatMul of ``nodes`` on its inputs ``runs`` (:func:`matmul_inputs`)."""
    return {name: simulate_matmul([r[a] for r in runs], w, precision, steps.get(name))
            for name, (a, w) in nodes.items()}


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

    ``feeds``: calibration inputs (needed by ``int8-static``, the per-channel statistics of ``int8-smooth`` and
    ``int8-outlier`` and the per-layer rule); ``max_error`` None skips the rule (every weight MatMul quantized).
    ``fp32`` copies the file.
    """
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_dynamic, quantize_static

    precision = check_precision(precision)
    src, dst = Path(src), Path(dst)
    if precision == "fp32":
        shutil.copyfile(src, dst)
        return QuantReport(precision)
    if (precision in ("int8-static", *CHANNELWISE) or max_error is not None) and not feeds:
        raise UserError(f"--precision {precision}: no calibration data (held-out windows) was given")
    import onnx

    tmp = tempfile.mkdtemp(prefix="nas-quant-")
    try:
        inline = Path(tmp) / "inline.onnx"  # weights inside (a timing graph keeps them in a file beside it)
        onnx.save(onnx.load(str(src)), str(inline))
        prepared = prepare(inline, Path(tmp) / "prepared.onnx")
        names = list(weight_matmuls(onnx.load(str(prepared))))
        report = QuantReport(precision, max_error=max_error)
        steps = {}
        if precision in CHANNELWISE or max_error is not None:
            nodes, runs = matmul_inputs(prepared, feeds)
            steps = channel_steps(nodes, input_channel_max(runs), precision) if precision in CHANNELWISE else {}
        if max_error is not None:
            report.errors = errors_of(nodes, runs, precision, steps)
            report.kept_fp32 = sorted(n for n, e in report.errors.items() if not e <= max_error)
        report.quantized = [n for n in names if n not in report.kept_fp32]
        if not report.quantized:  # every layer kept fp32 (or none to quantize): the prepared model as it is
            shutil.copyfile(prepared, dst)
            _keep_metadata(src, dst)
            return report
        targets = report.quantized
        if steps:  # the per-channel step in the graph first, then ONNX Runtime's dynamic quantization
            model = onnx.load(str(prepared))
            targets = channel_rewrite(model, nodes, {n: steps[n] for n in report.quantized})
            report.outlier_channels = {n: len(steps[n]["outliers"]) for n in report.quantized if "outliers" in steps[n]}
            prepared = Path(tmp) / "channels.onnx"
            onnx.save(model, str(prepared))
        common = dict(op_types_to_quantize=["MatMul"], nodes_to_quantize=targets,
                      weight_type=QuantType.QInt8, per_channel=False, reduce_range=False)
        with _quiet_quantizer():
            if precision != "int8-static":
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
