"""Export a subnet: the static model (safetensors + card), its ONNX graph, and a parity check.

``export_subnet`` is the library entry point behind ``nas export`` (and ``nas search --verify``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from search_spaces import Subnet, UserError
from supernet.artifact import save_model, update_card
from supernet.elastic import SuperTransformer, extract

ONNX_FILE = "model.onnx"
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
    op_counts: dict[str, int] = field(default_factory=dict)
    parity: float | None = None
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
    """Extract ``subnet`` and write it to ``out``; with ``onnx``, export, then check parity (<= 1e-4) or stop."""
    from supernet.onnx_export import export_onnx, onnx_parity, op_counts

    space = supernet.space
    space.check(subnet)
    out = Path(out)
    model = extract(supernet, subnet).eval().cpu()
    save_model(model, out, space, card)
    result = ExportResult(out=out, subnet=subnet, parameters=model.num_params())
    if "onnx" not in formats:
        return result
    opset, notes = choose_opset(target_ort)
    result.opset, result.notes = opset, notes
    path = export_onnx(model, out / ONNX_FILE, opset=opset)
    workload = space.workload("prefill")
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, space.vocab_size, (max(2, workload.batch_size), workload.seq_len), generator=g)
    parity = onnx_parity(path, model, tokens)
    if not parity <= PARITY_TOL:  # also catches NaN
        path.unlink(missing_ok=True)
        raise UserError(
            f"{path}: ONNX Runtime output differs from torch by {parity:.3g} (max abs, fp32), over the {PARITY_TOL:g} limit; "
            "the ONNX model was not kept"
        )
    result.onnx_path, result.parity = path, parity
    result.op_counts = dict(op_counts(path))
    update_card(out, files=[ONNX_FILE], onnx={"opset": opset, "parity_max_abs": parity, "op_counts": result.op_counts, "notes": notes})
    return result
