"""What every task's export shares (the contract of :meth:`tasks.base.Task.export`): the settings of an export
(:class:`ExportSettings`), what a task's export returns (:class:`Exported`), the formats and file names, the ONNX
opset for a target ONNX Runtime (:func:`choose_opset`), the metadata every graph carries (:func:`onnx_metadata`), the
one parity limit (:data:`PARITY_TOL`), and a one-stack model's decode step graph (:func:`export_step`).

``nas export`` (:mod:`nas.export`) loads the supernet, asks the space's task to export, and times the result
(:func:`latency.measure.measure_model`); the task writes its files with these helpers and never calls back up.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from search_spaces import Subnet, UserError, tasks
from search_spaces.version import __version__

from .artifact import card_space, read_card, update_card
from .model import Transformer
from .onnx_decode import export_decode_onnx, is_cached, onnx_decode_logits, read_layout
from .onnx_export import add_metadata, onnx_session

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
    step_path: Path | None = None  # the cached decoder (step.onnx), for a model whose layers all keep a key/value cache
    step_parity: float | None = None
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


def onnx_metadata(space, subnet, tokenizer: str = "bytes") -> dict[str, str]:
    """The ``nas.*`` entries of the ONNX metadata (``metadata_props``; in ONNX Runtime
    ``session.get_modelmeta().custom_metadata_map``) of every graph an export writes, so that the file describes
    itself without its card: ``nas.task``, ``nas.vocab_size``, ``nas.max_seq_len`` (the longest input the model
    reads), ``nas.tokenizer`` (``bytes``: UTF-8 bytes are the ids 0-255; ``bpe:SIZE:sha256=HEX``: the byte-level BPE
    of the folder's ``tokenizer.json`` of that digest, :meth:`supernet.tokenizer.Vocabulary.metadata`), ``nas.specials``
    (JSON: the task's ids of
    special meaning, :attr:`tasks.base.Task.specials`; ``{}`` for a causal LM), ``nas.subnet`` (the subnet's canonical
    JSON, whose sha256 prefix is its key), ``nas.space_hash`` and ``nas.version`` (this package's).

    No card hash: the card is written after the graphs and lists their sha256, so a graph cannot hold the hash of
    the card that hashes it; the graph and its card agree through that checksum (add the metadata before it)."""
    return {
        "nas.task": space.task,
        "nas.vocab_size": str(space.vocab_of(subnet) if hasattr(space, "vocab_of") else space.vocab_size),
        "nas.max_seq_len": str(space.max_seq_len),
        "nas.tokenizer": tokenizer,
        "nas.specials": json.dumps(tasks.of(space).specials, sort_keys=True),
        "nas.subnet": subnet.to_json(),
        "nas.space_hash": space.hash,
        "nas.version": __version__,
    }


def export_step(model: Transformer, out: str | Path, *, opset: int, seed: int = 0, tokens: int = 8) -> tuple[Path, float]:
    """Write ``model``'s decode step graph to ``out/step.onnx`` and check it against torch: (path, max abs).

    The form is :func:`supernet.onnx_decode.export_decode_onnx`'s default: the cached decoder (optimum's
    ``past_key_values`` / ``present``) where every layer keeps a key/value cache, else the one-token step.  The
    check feeds ``tokens`` seeded tokens through the graph (the cached decoder: the first half as a prompt in one
    call, then one at a time; the step: one at a time) and compares the logits with the model's forward pass; over
    :data:`PARITY_TOL` the file is removed and a :class:`UserError` says so.  The card lists the file (checksum), its
    form, inputs and outputs and the parity; the graph carries :func:`onnx_metadata` (of the space in ``out``'s card)
    as ``model.onnx`` does.  A model with a memory (the one-token step) is also checked past its window
    (:func:`memory_parity`, in the card's ``decode_step.memory``).
    """
    out = Path(out)
    model = model.eval().cpu()
    path = export_decode_onnx(model, out / STEP_FILE, opset=opset)
    card = read_card(out)
    said = (card.get("tokenizer") or {}).get("metadata", "bytes")
    add_metadata(path, onnx_metadata(card_space(out, card), model.subnet, said))  # beside decode_inputs; before the card's sha256
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, model.config.vocab_size, (2, min(tokens, model.config.max_seq_len)), generator=g)  # (B, T)
    with torch.no_grad():
        want = model(x).numpy()  # (B, T, V)
    session = onnx_session(path, threads=1)
    layout = read_layout(session)
    got = onnx_decode_logits(session, x.numpy(), prompt=x.shape[1] // 2 if is_cached(layout) else 0)  # (B, T, V)
    gap = float(np.abs(got - want).max())
    if not gap <= PARITY_TOL:  # also catches NaN
        path.unlink(missing_ok=True)
        raise UserError(
            f"{path}: the decode step graph differs from torch by {gap:.3g} (max abs, fp32) over {x.shape[1]} tokens, "
            f"over the {PARITY_TOL:g} limit; the step graph was not kept"
        )
    record = {"file": STEP_FILE, "opset": opset, "parity_max_abs": gap,
              "form": "cached decoder" if is_cached(layout) else "one-token step",
              "inputs": list(layout), "outputs": [o.name for o in session.get_outputs()]}  # fmt: skip
    if model.config.memory:  # past the window too: the generation loop's memory against torch's decoding cache
        record["memory"] = memory_parity(model, path, seed)
    update_card(out, files=[STEP_FILE], decode_step=record)
    return path, gap


def memory_parity(model: Transformer, path: Path, seed: int = 0) -> dict:
    """The step graph of a model with a memory fed past its window (two segments and a token) by the ONNX generation
    loop, which trims the caches to the memory, against torch's decoding cache; over :data:`PARITY_TOL` the file is
    removed and a :class:`UserError` says so."""
    from .decode import decode_logits

    c = model.config
    g = torch.Generator().manual_seed(seed + 1)
    x = torch.randint(0, c.vocab_size, (2, 2 * c.max_seq_len - c.memory + 1), generator=g)  # (B, T): three segments
    want = decode_logits(model, x).numpy()
    got = onnx_decode_logits(onnx_session(path, threads=1), x.numpy())
    gap = float(np.abs(got - want).max())
    if not gap <= PARITY_TOL:
        path.unlink(missing_ok=True)
        raise UserError(f"{path}: past the window (memory {c.memory} tokens) the decode step graph differs from torch by "
                        f"{gap:.3g} (max abs, fp32) over {x.shape[1]} tokens, over the {PARITY_TOL:g} limit; the step graph "
                        "was not kept")
    return {"tokens": c.memory, "window": c.max_seq_len, "checked_tokens": int(x.shape[1]), "parity_max_abs": gap}


def onnx_opset(path: Path) -> int:
    """The default-domain opset of an ONNX file."""
    import onnx  # (heavy: loaded where a file is read)

    graph = onnx.load(str(path), load_external_data=False)
    return next(o.version for o in graph.opset_import if o.domain in ("", "ai.onnx"))



# --------------------------------------------------------------------------- the contract of a task's export


@dataclass(frozen=True)
class ExportSettings:
    """What ``nas export`` is asked to do, from its flags (the subnet and the supernet are loaded by the caller)."""

    out: Path
    formats: tuple[str, ...] = FORMATS
    target_ort: str | None = None
    seed: int = 0  # the parity inputs' and the measurement order's
    scoring: Any = None  # supernet.scoring.FitnessSettings: the held-out scoring (the search's defaults)
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
