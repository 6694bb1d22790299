"""The export of a one-stack model (the causal and masked LMs, and the classifier encoder): safetensors + card, a
``torch.export`` program and ``model.onnx``, each parity-checked (:func:`write_model`), scored on the search's
held-out windows (:func:`stack_validation`), quantized at an INT8 precision (:mod:`latency.precision`).

:meth:`tasks.stack.StackTask.export` is :func:`export_stack`; ``nas train-subnet`` and ``nas finetune`` write their
models with :func:`write_model`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from latency.measure import measure_model, on_files, predicted_line
from latency.precision import export_quantized, quantize_step
from search_spaces import Space, Subnet, UserError, tasks
from supernet.artifact import PROGRAM, export_program, load_model, load_program, read_card, save_model, update_card
from supernet.data import DEFAULT_CORPUS, DEFAULT_LICENCE
from supernet.decode import keeps_kv_cache
from supernet.elastic import SuperTransformer, extract
from supernet.export import (
    FORMATS,
    ONNX_FILE,
    PARITY_TOL,
    Exported,
    ExportResult,
    ExportSettings,
    choose_opset,
    export_step,
    onnx_metadata,
    onnx_opset,
)
from supernet.files import check_room, named_digest, without_paths
from supernet.model import Transformer
from supernet.onnx_export import INPUT_IDS, LOGITS, add_metadata, export_onnx, onnx_parity, op_counts
from supernet.scoring import Scoring, validation_bpb, validation_tokens
from supernet.task import trained_options
from supernet.tokenizer import Vocabulary


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
    tokenizer: str | None = None,
) -> ExportResult:
    """Write a static model's artifacts into ``out``; every exported form is parity-checked or removed.  ``tokenizer``:
    the text of the model's ``tokenizer.json`` (None: bytes), written beside and named in the ONNX metadata.

    ``torch``: ``model.safetensors`` + ``subnet.yaml`` + ``model_card.json`` (always, with ``README.md`` and
    ``config.json`` rendered from it) and ``model.pt2`` (a torch.export program, within 1e-4 of eager).  ``onnx``:
    ``model.onnx`` (``input_ids`` -> ``logits``; opset 23 where the target ONNX Runtime runs it), within 1e-4 of
    torch in ONNX Runtime, described by its metadata (:func:`onnx_metadata`); for a causal model whose layers all
    keep a key/value cache also ``step.onnx``, the cached decoder (optimum's ``past_key_values`` / ``present``,
    :func:`supernet.export.export_step`), checked the same way; for a model with a memory ``step.onnx`` is the
    one-token step (the position an input), checked past the window too (:func:`supernet.export.memory_parity`).
    """
    out = Path(out)
    model = model.eval().cpu()
    out.mkdir(parents=True, exist_ok=True)
    # each form holds the weights once (fp32); checked before writing: ONNX's writer aborts the process on a full disk
    check_room(out, model.num_params() * 4 * (1 + len(formats)) + (16 << 20), "the exported model")
    save_model(model, out, space, card, tokenizer)
    said = Vocabulary(tokenizer).metadata() if tokenizer is not None else "bytes"
    result = ExportResult(out=out, subnet=model.subnet, parameters=model.num_params())
    tokens = parity_tokens(space, seed).clamp(max=model.config.vocab_size - 1)  # (a nested vocabulary's ids)
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
    add_metadata(path, onnx_metadata(space, model.subnet, said))  # before update_card below takes the file's sha256
    parity = onnx_parity(path, model, tokens)
    if not parity <= PARITY_TOL:  # also catches NaN
        path.unlink(missing_ok=True)
        raise UserError(
            f"{path}: ONNX Runtime output differs from torch by {parity:.3g} (max abs, fp32), over the {PARITY_TOL:g} limit; "
            "the ONNX model was not kept"
        )
    result.onnx_path, result.parity = path, parity
    result.op_counts = dict(op_counts(path))
    update_card(out, files=[ONNX_FILE], onnx={"opset": opset, "parity_max_abs": parity, "op_counts": result.op_counts,
                                               "inputs": [INPUT_IDS], "outputs": [LOGITS], "notes": notes})  # fmt: skip
    if keeps_kv_cache(model) or model.config.memory:  # the cached decoder (optimum runs it); a memory's one-token step
        result.step_path, result.step_parity = export_step(model, out, opset=opset, seed=seed)
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
    tokenizer: str | None = None,
) -> ExportResult:
    """Extract ``subnet`` and write it to ``out`` (see :func:`write_model`)."""
    supernet.space.check(subnet)
    model = extract(supernet, subnet)
    return write_model(model, supernet.space, out, formats=formats, target_ort=target_ort, card=card, seed=seed,
                       tokenizer=tokenizer)


def subnet_tokenizer(payload: dict[str, Any], space: Space, subnet: Subnet) -> str | None:
    """The ``tokenizer.json`` text of ``subnet`` of a supernet checkpoint (``payload``): the run's vocabulary at the
    subnet's size (nested: its first ids and merges); None for a byte space."""
    trained = (payload.get("meta") or {}).get("vocabulary")
    if not space.tokenizer.bpe:
        return None
    if trained is None:
        raise UserError(f"{payload.get('path', 'the supernet checkpoint')}: a subword space's checkpoint without its "
                        "vocabulary (meta lacks vocabulary)")
    return Vocabulary(trained["json"]).at(space.vocab_of(subnet)).text


def held_out_tokens(payload: dict[str, Any], scoring) -> tuple[np.ndarray, str, Scoring]:
    """(held-out tokens, where they come from, the windows): the search's scoring of a one-stack LM (``scoring``:
    :class:`supernet.scoring.FitnessSettings`)."""
    tokens, where = validation_tokens(scoring.path, payload, val_data=scoring.val_data, data_cache=scoring.data_cache)
    return tokens, where, Scoring(windows=scoring.windows, seq_len=scoring.seq_len, seed=scoring.val_seed)


def stack_validation(model, payload: dict[str, Any], scoring) -> dict[str, Any]:
    """The card's ``validation`` of a one-stack LM: :func:`validation_bpb` on the search's held-out windows, scored as
    the supernet was trained (a masked LM: at its mask rate); where they came from named without this machine's
    folders."""
    space = payload["space"]
    tokens, where, windows = held_out_tokens(payload, scoring)
    where = without_paths(where, [scoring.val_data, payload.get("meta", {}).get("data")])
    return validation_bpb(model, space, tokens, windows, where, trained_options(space, payload.get("meta", {})))


def data_record(meta: dict[str, Any]) -> dict[str, Any]:
    """The data a supernet was trained on, as a card says it: the corpus by name (the default corpus, or a file or
    pattern by its last component), its hash, split seed and fraction, and its licence where known."""
    data = meta.get("data")
    record = {"name": Path(data).name if data else meta.get("corpus"), "corpus": meta.get("corpus"),
              "hash": meta.get("corpus_hash"), "data_seed": meta.get("data_seed"), "val_fraction": meta.get("val_fraction")}
    if meta.get("corpus") == DEFAULT_CORPUS:
        record["licence"] = DEFAULT_LICENCE
    return {k: v for k, v in record.items() if v is not None}


def validation_text(validation: dict[str, Any]) -> str:
    """What a card's validation was scored on, in words."""
    if "windows" in validation and "seq_len" in validation:
        return f"{validation['windows']} x {validation['seq_len']} tokens of the {validation['source']}"
    return f"{validation.get('examples', '?')} examples of the {validation.get('source', 'validation data')}"


def export_stack(supernet, payload: dict[str, Any], subnet: Subnet, settings: ExportSettings,
                 predicted: dict[str, Any] | None) -> Exported:
    """A one-stack subnet's export: safetensors + card, ``model.pt2`` and ``model.onnx`` (parity-checked), scored on the
    search's held-out windows (``validation``), quantized at ``settings.precision`` (INT8: the quantized ONNX beside)."""
    s, space = settings, supernet.space
    if s.precision != "fp32" and "onnx" not in s.formats:
        raise UserError(f"--precision {s.precision}: quantizes the ONNX model; --format must include onnx")
    if s.measure == "onnxruntime" and "onnx" in s.formats:
        choose_opset(s.target_ort)  # fail early on a bad --target-ort
    card = {"source": {"supernet": named_digest(s.scoring.path), "step": payload["meta"].get("step"), "space_hash": space.hash},
            "data": data_record(payload["meta"])}
    validation = tasks.of(space).validation(extract(supernet, subnet).eval(), payload, s.scoring) if s.evaluate else None
    if s.precision != "fp32":  # INT8: calibration windows from the same held-out tokens
        tokens, where, scoring = held_out_tokens(payload, s.scoring)
    card.update(validation=validation, latency=predicted)
    result = export_subnet(supernet, subnet, s.out, formats=s.formats, target_ort=s.target_ort, card=card, seed=s.seed,
                           tokenizer=subnet_tokenizer(payload, space, subnet))

    quantized = None
    if s.precision != "fp32":
        quantized = export_quantized(extract(supernet, subnet).eval(), space, result.onnx_path, s.precision, tokens, scoring,
                                     where)
        update_card(result.out, files=[quantized["file"]], quantized=quantized)

    said = read_card(result.out).get("tokenizer")
    lines = [f"exported {subnet}", f"  parameters        {result.parameters:,}",
             *([f"  tokenizer         {result.out / said['file']}  ("
                + ("bytes" if said["kind"] == "bytes" else f"byte-level BPE of {said['vocab']:,} ids") + ")"] if said else []),
             f"  torch             {result.out / 'model.safetensors'}  (load: supernet.load_model({str(result.out)!r}))"]
    if result.program_path:
        lines.append(f"  torch.export      {result.program_path}  (torch.export.load(...).module(); max |program - eager| = "
                     f"{result.program_parity:.1e})")
    if result.onnx_path:
        lines.append(f"  onnx              {result.onnx_path}  (opset {result.opset}, {result.attention_nodes} fused Attention "
                     "nodes)")
        lines.append(f"  parity            max |onnxruntime - torch| = {result.parity:.2e}")
    if result.step_path:
        lines.append(f"  cached decoder    {result.step_path}  (past_key_values in, present out: optimum's "
                     f"ORTModelForCausalLM runs it; max |onnxruntime - torch| = {result.step_parity:.2e})")
    lines.append(f"  model card        {result.out / 'README.md'}, {result.out / 'config.json'}")
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
        model = load_model(result.out)
        timed = result.out / quantized["file"] if quantized else result.onnx_path  # INT8: the quantized files themselves
        step = None
        if workload.kind == "decode" and on_files(device, timed):  # the decode step graph (the cached decoder: written)
            step = result.step_path or export_step(model, result.out, opset=onnx_opset(result.onnx_path),
                                                   seed=kw.get("seed", 0))[0]
            if quantized:  # quantized as the model was
                step, entry = quantize_step(step, s.precision, tokens, min(s.scoring.seq_len, space.max_seq_len), where)
                update_card(result.out, files=[step.name], quantized_step=entry)
        return measure_model(device, model, workload, protocol, onnx_path=timed, step_path=step, **kw)

    return Exported(result.out, lines, list(result.notes), time)
