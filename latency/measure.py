"""Measuring one model and saying what was predicted for it: what ``nas export`` and the tasks' exports put in a card.

:func:`measure_model` times a static model on a device with the measurement protocol (on ONNX Runtime's CPU provider,
the exported files themselves); :func:`predicted_latency` is a predictor's estimate with where it holds;
:func:`workload_text` and :func:`predicted_line` say them in words.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import numpy as np

from search_spaces import Subnet, Workload
from supernet.files import sha256_file
from supernet.model import Transformer
from supernet.onnx_decode import decode_feed
from supernet.onnx_export import onnx_session

from .device import INFORMATIONAL
from .protocol import measure
from .report import latency_error_pct
from .timing_core import prefill_tokens


def predictor_source(source: str | Path) -> dict[str, Any]:
    """Which predictor, as a card says it without this machine's paths: its folder's name and the sha256 of its
    ``predictor.json`` (what it is, wherever it lies)."""
    path = Path(source)
    folder = path if path.is_dir() else path.parent
    doc = folder / "predictor.json"
    return {"name": folder.resolve().name, "sha256": sha256_file(doc) if doc.is_file() else None}


def predicted_latency(predictor, space, subnet: Subnet, source: str) -> dict[str, Any]:
    """The predictor's estimate for ``subnet`` and where it holds (workload, device); ``source``: the predictor's folder
    (recorded by name and digest, :func:`predictor_source`)."""
    predictor.check_space(space)
    w = predictor.workload_spec
    fp = predictor.fingerprint or {}
    return {
        "predicted_ms": float(predictor.predict([subnet])[0]),
        "predictor": predictor_source(source),
        "model": predictor.name,
        "workload": w.record(),
        "device": {k: fp[k] for k in ("device", "runtime", "threads", "clock", "cpu_model", "onnxruntime", "torch") if k in fp},
    }


def workload_text(workload: Workload) -> str:
    """What a timed call runs: ``prefill 1x256`` (batch x tokens) or ``decode 1x1@255`` (one token at context 255)."""
    return f"{workload.name} {workload.label.split(':', 1)[1]}"


def predicted_line(predicted: dict[str, Any]) -> str:
    """The card's prediction, one line of the export's summary."""
    w = Workload.from_record(predicted["workload"], "the predictor's workload")
    return (f"  predicted         {predicted['predicted_ms']:.3f} ms  ({predicted['model']} predictor, {workload_text(w)}, "
            f"{predicted['device'].get('device', 'unknown device')})")


class _FileDevice:
    """A device that times ``target`` from its exported ONNX files (the wrapped device's ``prepare_file``) and every
    other model (the protocol's reference) as the wrapped device does.

    A prefill workload runs ``model.onnx`` on seeded tokens; a decode workload runs the decode step graph ``step_path``
    on inputs of ``context`` tokens seen (:func:`supernet.onnx_decode.decode_feed`).
    """

    def __init__(self, device, target: Transformer, onnx_path: Path, step_path: Path | None = None, seed: int = 0):
        self.device, self.target, self.onnx_path, self.step_path, self.seed = device, target, onnx_path, step_path, seed
        self.name = device.name

    def fingerprint(self) -> dict:
        return self.device.fingerprint()

    def prepare(self, model, workload: Workload):
        if model is not self.target:
            return self.device.prepare(model, workload)
        if workload.kind == "decode":
            assert self.step_path is not None, "a decode workload is timed on the decode step graph"
            feed = decode_feed(onnx_session(self.step_path, threads=1), workload.batch_size, workload.context,
                               np.random.default_rng(self.seed))
            return self.device.prepare_file(self.step_path, feed)
        return self.device.prepare_file(self.onnx_path,
                                        prefill_tokens(model.config.vocab_size, workload.batch_size, workload.seq_len))


def card_fingerprint(fingerprint: dict[str, Any]) -> dict[str, Any]:
    """A device fingerprint as a model card keeps it: what makes a timing comparable (CPU, runtime, threads,
    versions), not the informational host name, date or command line (a card travels with the model)."""
    return {k: v for k, v in fingerprint.items() if k not in INFORMATIONAL}


def on_files(device, onnx_path: Path | None) -> bool:
    """Whether :func:`measure_model` times the exported files (ONNX Runtime's CPU provider, given a file) rather than
    the static model: a decode workload then needs the step graph beside the model."""
    return onnx_path is not None and hasattr(device, "prepare_file") and getattr(device, "provider", "cpu") == "cpu"


def measure_model(
    device,
    model: Transformer,
    workload: Workload,
    settings,
    *,
    onnx_path: Path | None = None,
    predicted_ms: float | None = None,
    budget_ms: float | None = None,
    seed: int = 0,
    baseline_ms: float | None = None,
    progress: Callable[[int, int, str], None] | None = None,
    step_path: Path | None = None,
) -> dict[str, Any]:
    """Time ``model`` on ``device`` with the measurement protocol; compare with prediction and budget.

    On ``onnxruntime`` (CPU provider) with ``onnx_path`` the exported files themselves are timed:
    ``model.onnx`` for a prefill workload; for a decode workload the decode step graph ``step_path`` (the caller
    exports it beside, :func:`supernet.export.export_step`).
    Elsewhere the static model is handed to the device.  ``baseline_ms`` (a predictor's
    ``reference_ms``) anchors the drift correction to the timing campaign the predictor learned
    from, so measured and predicted are in the same units on a machine whose speed drifts.
    The error is :func:`latency.report.latency_error_pct`: (measured - predicted) / predicted.
    """
    timed = "static model"
    if on_files(device, onnx_path):
        assert workload.kind != "decode" or step_path is not None, "a decode workload is timed on the step graph"
        device = _FileDevice(device, model, onnx_path, step_path if workload.kind == "decode" else None, seed=seed)
        timed = (step_path or onnx_path).name
    result = measure(
        device, {"model": model.eval()}, workload, settings, seed=seed, baseline_ms=baseline_ms, progress=progress
    ).results["model"]
    entry: dict[str, Any] = {
        "device": card_fingerprint(device.fingerprint()),
        "timed": timed,
        "workload": workload.record(),
        "settings": settings.to_dict(),
        "median_ms": result.median_ms,
        "iqr_ms": result.iqr_ms,
        "flags": list(result.flags),
        "anchored_to_reference_ms": baseline_ms,
        "predicted_ms": predicted_ms,
        "error_pct": None if predicted_ms is None else latency_error_pct(result.median_ms, predicted_ms),
        "budget_ms": budget_ms,
        "over_budget": None if budget_ms is None else bool(result.median_ms > budget_ms),
    }
    return entry
