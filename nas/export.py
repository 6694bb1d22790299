"""Export a subnet: the static model (safetensors + card + torch.export program), its ONNX graph,
a parity check, and what the card reports about it (bits per byte, predicted / measured latency).

``export_subnet`` is the library entry point behind ``nas export``; ``write_model`` writes the
artifacts of any static model (also used by ``nas train-subnet`` and ``nas finetune``);
``validation_bpb`` scores a static model exactly as the search scores a subnet;
``predicted_latency`` and ``measure_model`` fill the card's latency entries.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from search_spaces import Space, Subnet, UserError, Workload
from supernet.files import check_room
from supernet.heldout import StaticAsSupernet
from supernet.artifact import PROGRAM, export_program, load_program, save_model, update_card
from supernet.elastic import SuperTransformer, extract
from supernet.model import Transformer


ONNX_FILE = "model.onnx"
STEP_FILE = "step.onnx"  # the decode step graph, written when a decode workload is timed on ONNX Runtime
# One fp32 parity limit for every exported form (max abs over the logits): the program and ONNX Runtime
# compute the same model with other kernels and another order of summation; at 1,024-token windows that
# alone reaches 1e-5 (a sima model of long.yaml: 1.05e-5 between torch.export and eager).
PARITY_TOL = 1e-4
FORMATS = ("torch", "onnx")

# The oldest ONNX Runtime that runs each opset we may export (opset 23 brings the fused Attention op).
ORT_FOR_OPSET = {23: (1, 23), 18: (1, 14)}


@dataclass
class ExportResult:
    out: Path
    subnet: Subnet
    parameters: int
    opset: int | None = None
    onnx_path: Path | None = None
    program_path: Path | None = None
    op_counts: dict[str, int] = field(default_factory=dict)
    parity: float | None = None
    program_parity: float | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def attention_nodes(self) -> int:
        return self.op_counts.get("Attention", 0)


def parse_formats(text: str) -> tuple[str, ...]:
    formats = tuple(f.strip() for f in text.split(",") if f.strip())
    bad = [f for f in formats if f not in FORMATS]
    if bad or not formats:
        raise UserError(f"--format: {text!r}; expected a comma-separated list of {', '.join(FORMATS)}")
    return formats


def parse_version(text: str, flag: str = "--target-ort") -> tuple[int, int]:
    try:
        major, minor = (int(p) for p in text.split(".")[:2])
    except ValueError:
        raise UserError(f"{flag}: {text!r} is not a version like 1.20") from None
    return major, minor


def choose_opset(target_ort: str | None) -> tuple[int, list[str]]:
    """Opset 23 (fused ``Attention``) where the target ONNX Runtime runs it, else 18 with a note."""
    if target_ort is None:
        import onnxruntime

        target_ort = onnxruntime.__version__
    version = parse_version(target_ort)
    for opset, needs in sorted(ORT_FOR_OPSET.items(), reverse=True):
        if version >= needs:
            if opset == 23:
                return opset, []
            return opset, [
                f"ONNX Runtime {target_ort} is older than {'.'.join(map(str, ORT_FOR_OPSET[23]))}, which opset 23 needs: "
                f"exported at opset {opset}, where attention is not one fused node (MatMul/Softmax/MatMul instead)"
            ]
    raise UserError(f"--target-ort: ONNX Runtime {target_ort} is too old; this tool exports opset >= 18 (ONNX Runtime >= 1.14)")


def onnx_metadata(space, subnet) -> dict[str, str]:
    """The ``nas.*`` entries of the ONNX metadata (``metadata_props``; in ONNX Runtime
    ``session.get_modelmeta().custom_metadata_map``) of every graph an export writes, so that the file describes
    itself without its card: ``nas.task``, ``nas.vocab_size``, ``nas.max_seq_len`` (the longest input the model
    reads), ``nas.tokenizer`` (``bytes``: UTF-8 bytes are the ids 0-255), ``nas.specials`` (JSON: the task's ids of
    special meaning, :attr:`tasks.base.Task.specials`; ``{}`` for a causal LM), ``nas.subnet`` (the subnet's canonical
    JSON, whose sha256 prefix is its key), ``nas.space_hash`` and ``nas.version`` (this package's).

    No card hash: the card is written after the graphs and lists their sha256, so a graph cannot hold the hash of
    the card that hashes it; the graph and its card agree through that checksum (add the metadata before it)."""
    import json

    from nas import __version__
    from search_spaces import tasks

    return {
        "nas.task": space.task,
        "nas.vocab_size": str(space.vocab_size),
        "nas.max_seq_len": str(space.max_seq_len),
        "nas.tokenizer": "bytes",
        "nas.specials": json.dumps(tasks.of(space).specials, sort_keys=True),
        "nas.subnet": subnet.to_json(),
        "nas.space_hash": space.hash,
        "nas.version": __version__,
    }


def parity_tokens(space: Space, seed: int) -> torch.Tensor:
    """The inputs of the parity checks: (max(2, batch), seq_len) of the prefill workload, seeded."""
    workload = space.workload("prefill")
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, space.vocab_size, (max(2, workload.batch_size), workload.seq_len), generator=g)  # (B, T)


def program_parity(program: torch.nn.Module, model: Transformer, lengths: tuple[int, ...], seed: int = 0) -> float:
    """Max abs difference between the exported program and the eager model over several (batch, length) inputs."""
    g = torch.Generator().manual_seed(seed)
    worst = 0.0
    with torch.no_grad():
        for batch, t in ((1, lengths[0]), *((3, t) for t in lengths[1:])):
            x = torch.randint(0, model.config.vocab_size, (batch, t), generator=g)  # (B, T)
            worst = max(worst, float((program(x) - model(x)).abs().max()))
    return worst


def write_model(
    model: Transformer,
    space: Space,
    out: str | Path,
    *,
    formats: tuple[str, ...] = FORMATS,
    target_ort: str | None = None,
    card: dict[str, Any] | None = None,
    seed: int = 0,
) -> ExportResult:
    """Write a static model's artifacts into ``out``; every exported form is parity-checked or removed.

    ``torch``: ``model.safetensors`` + ``subnet.yaml`` + ``model_card.json`` (always) and
    ``model.pt2`` (a torch.export program, within 1e-4 of eager).  ``onnx``: ``model.onnx``
    (opset 23 where the target ONNX Runtime runs it), within 1e-4 of torch in ONNX Runtime, described by its
    metadata (:func:`onnx_metadata`).
    """
    from supernet.onnx_export import add_metadata, export_onnx, onnx_parity, op_counts

    out = Path(out)
    model = model.eval().cpu()
    out.mkdir(parents=True, exist_ok=True)
    # each form holds the weights once (fp32); checked before writing: ONNX's writer aborts the process on a full disk
    check_room(out, model.num_params() * 4 * (1 + len(formats)) + (16 << 20), "the exported model")
    save_model(model, out, space, card)
    result = ExportResult(out=out, subnet=model.subnet, parameters=model.num_params())
    tokens = parity_tokens(space, seed)
    if "torch" in formats:
        path = export_program(model, out / PROGRAM)
        update_card(out, files=[PROGRAM])
        lengths = tuple(sorted({1, max(1, tokens.shape[1] // 3), tokens.shape[1]}))
        gap = program_parity(load_program(out), model, lengths, seed)
        if not gap <= PARITY_TOL:
            path.unlink(missing_ok=True)
            raise UserError(f"{path}: the torch.export program differs from the eager model by {gap:.3g} (max abs) at lengths "
                            f"{', '.join(map(str, lengths))}, over the {PARITY_TOL:g} limit; the program was not kept")
        result.program_path, result.program_parity = path, gap
        update_card(
            out,
            torch_program={"file": PROGRAM, "parity_max_abs": gap, "lengths_checked": list(lengths), "torch": torch.__version__},
        )
    if "onnx" not in formats:
        return result
    opset, notes = choose_opset(target_ort)
    result.opset, result.notes = opset, notes
    path = export_onnx(model, out / ONNX_FILE, opset=opset)
    add_metadata(path, onnx_metadata(space, model.subnet))  # before update_card below takes the file's sha256
    parity = onnx_parity(path, model, tokens)
    if not parity <= PARITY_TOL:  # also catches NaN
        path.unlink(missing_ok=True)
        raise UserError(
            f"{path}: ONNX Runtime output differs from torch by {parity:.3g} (max abs, fp32), over the {PARITY_TOL:g} limit; "
            "the ONNX model was not kept"
        )
    result.onnx_path, result.parity = path, parity
    result.op_counts = dict(op_counts(path))
    update_card(
        out, files=[ONNX_FILE], onnx={"opset": opset, "parity_max_abs": parity, "op_counts": result.op_counts, "notes": notes}
    )
    return result


def export_subnet(
    supernet: SuperTransformer,
    subnet: Subnet,
    out: str | Path,
    *,
    formats: tuple[str, ...] = FORMATS,
    target_ort: str | None = None,
    card: dict[str, Any] | None = None,
    seed: int = 0,
) -> ExportResult:
    """Extract ``subnet`` and write it to ``out`` (see :func:`write_model`)."""
    supernet.space.check(subnet)
    model = extract(supernet, subnet)
    return write_model(model, supernet.space, out, formats=formats, target_ort=target_ort, card=card, seed=seed)


# --------------------------------------------------------------------------- bits per byte


@dataclass(frozen=True)
class Scoring:
    """The held-out windows: the search's fitness defaults (``nas search --val-windows/--seq-len/--val-seed``)."""

    windows: int = 16
    seq_len: int = 128
    seed: int = 0
    batch_size: int = 16


def validation_bpb(
    model: Transformer, space: Space, tokens: np.ndarray, scoring: Scoring = Scoring(), where: str = "validation tokens",
    options: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Bits per byte of ``model`` on fixed held-out windows: the number ``nas search`` reports as the subnet's loss
    (scored as the space's task scores, ``options`` its settings: a masked LM's bits per masked byte, the description
    says ``metric``)."""
    from nas.search.fitness import InheritedLoss

    seq_len = min(scoring.seq_len, space.max_seq_len)
    score = InheritedLoss(StaticAsSupernet(model.eval(), space), tokens, seq_len=seq_len, windows=scoring.windows,
                          batch_size=scoring.batch_size, seed=scoring.seed, where=where, options=options)
    bpb = float(score([model.subnet])[0])
    return {"bits_per_byte": bpb, **score.description, "source": where}


# --------------------------------------------------------------------------- latency


def predicted_latency(predictor, space: Space, subnet: Subnet, source: str) -> dict[str, Any]:
    """The predictor's estimate for ``subnet`` and where it holds (workload, device)."""
    predictor.check_space(space)
    w = predictor.workload_spec
    fp = predictor.fingerprint or {}
    return {
        "predicted_ms": float(predictor.predict([subnet])[0]),
        "predictor": source,
        "model": predictor.name,
        "workload": w.record(),
        "device": {k: fp[k] for k in ("device", "runtime", "threads", "clock", "cpu_model", "onnxruntime", "torch") if k in fp},
    }


def workload_text(workload: Workload) -> str:
    """What a timed call runs: ``prefill 1x256`` (batch x tokens) or ``decode 1x1@255`` (one token at context 255)."""
    return f"{workload.name} {workload.label.split(':', 1)[1]}"


def export_step(model: Transformer, out: str | Path, *, opset: int, seed: int = 0, tokens: int = 8) -> tuple[Path, float]:
    """Write ``model``'s decode step graph to ``out/step.onnx`` and check it against torch: (path, max abs).

    The check feeds ``tokens`` seeded tokens through the step graph one at a time and compares the
    logits with the model's forward pass; over :data:`PARITY_TOL` the file is removed and a
    :class:`UserError` says so.  The card lists the file (checksum) and the parity; the graph carries
    :func:`onnx_metadata` (of the space in ``out``'s card) as ``model.onnx`` does.
    """
    from supernet.artifact import card_space
    from supernet.onnx_decode import export_decode_onnx, onnx_decode_logits
    from supernet.onnx_export import add_metadata, onnx_session

    out = Path(out)
    model = model.eval().cpu()
    path = export_decode_onnx(model, out / STEP_FILE, opset=opset)
    add_metadata(path, onnx_metadata(card_space(out), model.subnet))  # beside decode_inputs; before the card's sha256
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, model.config.vocab_size, (2, min(tokens, model.config.max_seq_len)), generator=g)  # (B, T)
    with torch.no_grad():
        want = model(x).numpy()  # (B, T, V)
    got = onnx_decode_logits(onnx_session(path, threads=1), x.numpy())  # (B, T, V)
    gap = float(np.abs(got - want).max())
    if not gap <= PARITY_TOL:  # also catches NaN
        path.unlink(missing_ok=True)
        raise UserError(
            f"{path}: the decode step graph differs from torch by {gap:.3g} (max abs, fp32) over {x.shape[1]} tokens, "
            f"over the {PARITY_TOL:g} limit; the step graph was not kept"
        )
    update_card(out, files=[STEP_FILE], decode_step={"file": STEP_FILE, "opset": opset, "parity_max_abs": gap})
    return path, gap


def onnx_opset(path: Path) -> int:
    """The default-domain opset of an ONNX file."""
    import onnx

    graph = onnx.load(str(path), load_external_data=False)
    return next(o.version for o in graph.opset_import if o.domain in ("", "ai.onnx"))


class _FileDevice:
    """A device that times ``target`` from its exported ONNX files (ONNX Runtime, CPU provider) and
    every other model (the protocol's reference) as the wrapped device does.

    A prefill workload runs ``model.onnx`` on seeded tokens; a decode workload runs the decode step
    graph ``step_path`` on inputs of ``context`` tokens seen (:func:`supernet.onnx_decode.decode_feed`).
    """

    def __init__(self, device, target: Transformer, onnx_path: Path, step_path: Path | None = None, seed: int = 0):
        self.device, self.target, self.onnx_path, self.step_path, self.seed = device, target, onnx_path, step_path, seed
        self.name = device.name

    def fingerprint(self) -> dict:
        return self.device.fingerprint()

    def prepare(self, model, workload: Workload):
        if model is not self.target:
            return self.device.prepare(model, workload)
        from latency.timing_core import ort_runner, prefill_tokens
        from supernet.onnx_export import onnx_session

        if workload.kind == "decode":
            from supernet.onnx_decode import decode_feed

            assert self.step_path is not None, "a decode workload is timed on the decode step graph"
            session = onnx_session(self.step_path, threads=self.device.threads)
            feed = decode_feed(session, workload.batch_size, workload.context, np.random.default_rng(self.seed))
            return ort_runner(session, feed, self.device.clock)
        session = onnx_session(self.onnx_path, threads=self.device.threads)
        return ort_runner(
            session, prefill_tokens(model.config.vocab_size, workload.batch_size, workload.seq_len), self.device.clock
        )


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
    step_transform: Callable[[Path], Path] | None = None,
) -> dict[str, Any]:
    """Time ``model`` on ``device`` with the measurement protocol; compare with prediction and budget.

    On ``onnxruntime`` (CPU provider) with ``onnx_path`` the exported files themselves are timed:
    ``model.onnx`` for a prefill workload; for a decode workload the decode step graph, exported
    beside it as ``step.onnx`` (same opset, parity-checked, listed in the card; :func:`export_step`).
    Elsewhere the static model is handed to the device.  ``baseline_ms`` (a predictor's
    ``reference_ms``) anchors the drift correction to the timing campaign the predictor learned
    from, so measured and predicted are in the same units on a machine whose speed drifts.
    The error is :func:`latency.report.latency_error_pct`: (measured - predicted) / predicted.
    """
    from latency.protocol import measure
    from latency.report import latency_error_pct

    timed = "static model"
    if onnx_path is not None and device.name == "onnxruntime" and getattr(device, "provider", "cpu") == "cpu":
        step_path = None
        if workload.kind == "decode":
            step_path, _ = export_step(model, onnx_path.parent, opset=onnx_opset(onnx_path), seed=seed)
            if step_transform is not None:  # e.g. the step graph quantized as the model was (nas export --precision)
                step_path = step_transform(step_path)
        device = _FileDevice(device, model, onnx_path, step_path, seed=seed)
        timed = (step_path or onnx_path).name
    result = measure(
        device, {"model": model.eval()}, workload, settings, seed=seed, baseline_ms=baseline_ms, progress=progress
    ).results["model"]
    entry: dict[str, Any] = {
        "device": device.fingerprint(),
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


# --------------------------------------------------------------------------- nas export: the workflow


@dataclass(frozen=True)
class ExportSettings:
    """What ``nas export`` is asked to do, from its flags (the subnet and the supernet are loaded by the caller)."""

    out: Path
    formats: tuple[str, ...] = FORMATS
    target_ort: str | None = None
    seed: int = 0  # the parity inputs' and the measurement order's
    scoring: Any = None  # nas.search.fitness.FitnessSettings: the held-out scoring (the search's defaults)
    evaluate: bool = True  # score the model for the card
    precision: str = "fp32"
    predictor: str | None = None
    measure: str | None = None  # a device to time the exported model on
    device_options: dict[str, Any] = field(default_factory=dict)  # threads, runtime, provider, clock
    workload: str | None = None
    budget_ms: float | None = None
    protocol: Any = None  # latency.timing_core.Settings of the measurement


@dataclass
class Exported:
    """What a task's export wrote: the lines the command prints, the notes it logs, and how to time the export
    (``time(device, workload, protocol, **measure_model's keywords) -> its measured entry``; None: not timed)."""

    out: Path
    lines: list[str]
    notes: list[str] = field(default_factory=list)
    time: Callable[..., dict[str, Any]] | None = None


@dataclass
class ExportOutcome:
    exported: Exported
    predicted: dict[str, Any] | None = None
    workload: Any = None
    measured: dict[str, Any] | None = None


def export_chosen(supernet, payload: dict[str, Any], subnet, settings: ExportSettings,
                  progress: Callable[[int, int, str], None] | None = None) -> ExportOutcome:
    """``nas export``: the subnet's artifacts as its task writes them (:meth:`tasks.base.Task.export`), the predictor's
    estimate and, with ``settings.measure``, the exported model timed on the device (both in the card)."""
    from search_spaces import tasks

    space = supernet.space
    task = tasks.of(space)
    s = settings
    if s.budget_ms is not None and not s.measure:
        raise UserError("--budget: needs --timing-target DEVICE (the budget is checked against the measured latency)")
    predicted, reference_ms = None, None
    if s.predictor:
        from latency.predictors import load_predictor
        from latency.quantize import check_predictor_precision

        predictor = load_predictor(s.predictor)
        check_predictor_precision(predictor, s.predictor, s.precision)
        predicted, reference_ms = predicted_latency(predictor, space, subnet, str(s.predictor)), predictor.reference_ms
    workload = device = None
    if s.measure:
        from latency.device import get_device

        task.check_timing(space, s.measure, s.precision)
        workload = choose_workload(space, s.workload, predicted, default=task.default_workload)
        device = get_device(s.measure, **{k: v for k, v in s.device_options.items() if v is not None},
                            precision=None if s.precision == "fp32" else s.precision)
    exported = task.export(supernet, payload, subnet, settings, predicted)
    outcome = ExportOutcome(exported, predicted, workload)
    if s.measure:
        assert exported.time is not None, f"task {task.name}: an export that cannot be timed"
        outcome.measured = exported.time(device, workload, s.protocol, budget_ms=s.budget_ms, seed=s.seed,
                                         baseline_ms=reference_ms, progress=progress,
                                         predicted_ms=predicted["predicted_ms"] if predicted else None)
        update_card(exported.out, measured=outcome.measured)
    return outcome


def choose_workload(space, name: str | None, predicted: dict | None, default: str | None = "prefill"):
    """``--workload``, else the predictor's, else ``default`` (None: the space's first); a predictor fitted at another
    workload is refused."""
    wanted = name or (predicted["workload"]["name"] if predicted else default)
    workload = space.workload(wanted)
    if predicted and predicted["workload"]["name"] != workload.name:
        raise UserError(f"--workload {workload.name}: the predictor was fitted at workload {predicted['workload']['name']!r}; "
                        "its estimate would not be comparable (drop --workload or use a predictor of that workload)")
    return workload


def predicted_line(predicted: dict[str, Any]) -> str:
    """The card's prediction, one line of the export's summary."""
    from search_spaces import Workload

    w = Workload.from_record(predicted["workload"], "the predictor's workload")
    return (f"  predicted         {predicted['predicted_ms']:.3f} ms  ({predicted['model']} predictor, {workload_text(w)}, "
            f"{predicted['device'].get('device', 'unknown device')})")


def held_out_tokens(payload: dict[str, Any], scoring) -> tuple[np.ndarray, str, Scoring]:
    """(held-out tokens, where they come from, the windows): the search's scoring of a one-stack LM (``scoring``:
    :class:`nas.search.fitness.FitnessSettings`)."""
    from nas.search.fitness import validation_tokens

    tokens, where = validation_tokens(scoring.path, payload, val_data=scoring.val_data, data_cache=scoring.data_cache)
    return tokens, where, Scoring(windows=scoring.windows, seq_len=scoring.seq_len, seed=scoring.val_seed)


def stack_validation(model, payload: dict[str, Any], scoring) -> dict[str, Any]:
    """The card's ``validation`` of a one-stack LM: :func:`validation_bpb` on the search's held-out windows, scored as
    the supernet was trained (a masked LM: at its mask rate)."""
    from supernet.task import trained_options

    space = payload["space"]
    tokens, where, windows = held_out_tokens(payload, scoring)
    return validation_bpb(model, space, tokens, windows, where, trained_options(space, payload.get("meta", {})))


def validation_text(validation: dict[str, Any]) -> str:
    """What a card's validation was scored on, in words."""
    if "windows" in validation and "seq_len" in validation:
        return f"{validation['windows']} x {validation['seq_len']} tokens of the {validation['source']}"
    return f"{validation.get('examples', '?')} examples of the {validation.get('source', 'validation data')}"


def export_stack(supernet, payload: dict[str, Any], subnet: Subnet, settings: ExportSettings,
                 predicted: dict[str, Any] | None) -> Exported:
    """A one-stack subnet's export: safetensors + card, ``model.pt2`` and ``model.onnx`` (parity-checked), scored on the
    search's held-out windows (``validation``), quantized at ``settings.precision`` (INT8: the quantized ONNX beside)."""
    from search_spaces import tasks

    s, space = settings, supernet.space
    if s.precision != "fp32" and "onnx" not in s.formats:
        raise UserError(f"--precision {s.precision}: quantizes the ONNX model; --format must include onnx")
    if s.measure == "onnxruntime" and "onnx" in s.formats:
        choose_opset(s.target_ort)  # fail early on a bad --target-ort
    card = {"source": {"supernet": str(s.scoring.path), "step": payload["meta"].get("step"), "space_hash": space.hash}}
    validation = tasks.of(space).validation(extract(supernet, subnet).eval(), payload, s.scoring) if s.evaluate else None
    if s.precision != "fp32":  # INT8: calibration windows from the same held-out tokens
        tokens, where, scoring = held_out_tokens(payload, s.scoring)
    card.update(validation=validation, latency=predicted)
    result = export_subnet(supernet, subnet, s.out, formats=s.formats, target_ort=s.target_ort, card=card, seed=s.seed)

    quantized = None
    if s.precision != "fp32":
        from nas.precision import export_quantized

        quantized = export_quantized(extract(supernet, subnet).eval(), space, result.onnx_path, s.precision, tokens, scoring,
                                     where)
        update_card(result.out, files=[quantized["file"]], quantized=quantized)

    lines = [f"exported {subnet}", f"  parameters        {result.parameters:,}",
             f"  torch             {result.out / 'model.safetensors'}  (load: supernet.load_model({str(result.out)!r}))"]
    if result.program_path:
        lines.append(f"  torch.export      {result.program_path}  (torch.export.load(...).module(); max |program - eager| = "
                     f"{result.program_parity:.1e})")
    if result.onnx_path:
        lines.append(f"  onnx              {result.onnx_path}  (opset {result.opset}, {result.attention_nodes} fused Attention "
                     "nodes)")
        lines.append(f"  parity            max |onnxruntime - torch| = {result.parity:.2e}")
    if quantized:
        b, kept = quantized["bits_per_byte"], quantized["kept_fp32"]
        lines.append(f"  {s.precision:<17} {result.out / quantized['file']}  ({quantized['quantized_matmuls']} MatMuls INT8, "
                     f"{len(kept)} kept fp32 by the {quantized['max_error']:g} error rule)")
        lines.append(f"  onnxruntime bpb   fp32 {b['fp32_onnxruntime']:.4f}, {s.precision} {b['int8_onnxruntime']:.4f} "
                     f"({b['int8_onnxruntime'] - b['fp32_onnxruntime']:+.4f}; torch estimate {b['int8_torch_estimate']:.4f})")
    if validation:
        lines.append(f"  validation        {validation['bits_per_byte']:.4f} {validation.get('metric', 'bits/byte')} "
                     f"({validation_text(validation)})")
    if predicted:
        lines.append(predicted_line(predicted))

    def time(device, workload, protocol, **kw) -> dict[str, Any]:
        from supernet import load_model

        model = load_model(result.out)
        timed, step_transform = result.onnx_path, None
        if quantized:  # INT8: the quantized files themselves (a decode step graph quantized as the model was)
            from nas.precision import quantize_step

            def step_transform(step):
                path, entry = quantize_step(step, s.precision, tokens, min(s.scoring.seq_len, space.max_seq_len), where)
                update_card(result.out, files=[path.name], quantized_step=entry)
                return path

            timed = result.out / quantized["file"]
        return measure_model(device, model, workload, protocol, onnx_path=timed, step_transform=step_transform, **kw)

    return Exported(result.out, lines, list(result.notes), time)
