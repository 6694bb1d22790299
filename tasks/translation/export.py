"""``nas export`` of a subnet of an encoder-decoder supernet (task seq2seq): safetensors + model card.

The command (:mod:`nas.commands.export`) hands a seq2seq checkpoint here.  The card records the corpus the
supernet was trained on and the subnet's held-out cross-entropy per target byte (the extracted model's, on the
validation batches training evaluated on); ``nas translate --model DIR --eval test`` adds chrF and BLEU.
ONNX: the encoder and the decoder step (parity-checked).  ``--predictor`` records the predicted latency of the
subnet at the predictor's translate workload; ``--measure DEVICE [--budget T]`` times the exported model on that
workload with the measurement protocol (on ``onnxruntime`` the same two graphs, exported by the device).
Not yet: ``--precision`` (fp32 only), ``model.pt2``.
"""

from __future__ import annotations

import argparse
from pathlib import Path


def is_seq2seq_checkpoint(path: str) -> bool:
    from .workflows import stored_task

    return stored_task(Path(path)) == "seq2seq"


def corpus_record(meta: dict) -> dict:
    """What a card keeps of a run's corpus: enough to rebuild it and check it is the same."""
    return {k: meta.get(k) for k in ("corpus", "data", "data_seed", "lang", "corpus_hash")}


def write_seq2seq_onnx(static, out: Path, target_ort: str | None, seed: int = 0) -> dict:
    """Write and parity-check the two graphs of ``static`` into ``out``; record them in the card; return the record."""
    from nas.export import PARITY_TOL, choose_opset
    from search_spaces import UserError
    from supernet.artifact import update_card

    from .onnx import DECODER, ENCODER, export_seq2seq_onnx, seq2seq_parity

    opset, notes = choose_opset(target_ort)
    export_seq2seq_onnx(static, out, opset=opset)
    parity = seq2seq_parity(static, out, batch=2, seed=seed)
    worst = max(parity.values())
    if not worst <= PARITY_TOL:  # also catches NaN
        for name in (ENCODER, DECODER):
            (out / name).unlink(missing_ok=True)
        raise UserError(f"{out / DECODER}: ONNX Runtime differs from torch by {worst:.3g} (max abs, fp32; encoder "
                        f"{parity['encoder']:.3g}, decoder step {parity['decoder_step']:.3g}), over the {PARITY_TOL:g} "
                        "limit; the ONNX graphs were not kept")  # fmt: skip
    record = {"opset": opset, "encoder": ENCODER, "decoder_step": DECODER, "parity_max_abs": parity, "notes": notes}
    update_card(out, files=[ENCODER, DECODER], onnx=record)
    return record


def export_seq2seq(args: argparse.Namespace) -> int:
    from nas.commands.export import choose_workload, measurement_bar, report_measured
    from nas.commands.measure_latency import settings_from
    from nas.export import measure_model, parse_formats, predicted_latency, workload_text
    from nas.search.budget import parse_budget
    from search_spaces import UserError
    from supernet.artifact import update_card

    from .artifact import save_seq2seq_model
    from .data import check_pairs, prepare_pairs
    from .onnx import DECODER, ENCODER
    from .space import Seq2SeqSubnet, TranslateWorkload
    from .train import eval_batches, heldout_ce, load_seq2seq_supernet

    if getattr(args, "precision", "fp32") not in (None, "fp32"):
        raise UserError(f"--precision {args.precision}: an encoder-decoder (task seq2seq) exports in fp32 only so far")
    formats = parse_formats(args.format)
    budget = parse_budget(args.budget) if getattr(args, "budget", None) else None
    if budget is not None and not args.measure:
        raise UserError("--budget: needs --measure DEVICE (the budget is checked against the measured latency)")
    settings = settings_from(args) if getattr(args, "measure", None) else None
    supernet, payload = load_seq2seq_supernet(args.supernet)
    space, meta = supernet.space, payload["meta"]
    subnet = space.check(Seq2SeqSubnet.load(args.subnet))
    predicted, reference_ms = None, None
    if getattr(args, "predictor", None):
        from latency.predictors import load_predictor

        predictor = load_predictor(args.predictor)
        predicted, reference_ms = predicted_latency(predictor, space, subnet, str(args.predictor)), predictor.reference_ms
    workload, device = None, None
    if args.measure:
        from latency.device import get_device

        from .timing import require_device

        require_device(space, args.measure)
        workload = choose_workload(space, args.workload, predicted, default=None)  # the space's first translate workload
        device = get_device(args.measure, threads=args.threads, runtime=args.runtime, provider=args.provider,
                            clock=args.clock)  # fmt: skip
    static = supernet.extract(subnet).eval()
    record = corpus_record(meta)
    corpus = prepare_pairs(record["data"], Path(args.supernet).parent, seed=record["data_seed"] or 0,
                           lang=record["lang"] or "de")  # fmt: skip
    check_pairs(corpus, record["corpus_hash"], args.supernet)
    config = meta["train_config"]
    batches = eval_batches(corpus.val, config["batch_size"], space.max_seq_len, config["eval_batches"], config["seed"])
    ce = heldout_ce(static, None, corpus.val, batches)
    card = {
        "corpus": record,
        "validation": {"ce_per_target_byte": ce, "unit": "nats per target byte (EOS included)",
                       "pairs": int(sum(len(b) for b in batches))},  # fmt: skip
        "supernet": {"checkpoint": str(Path(args.supernet).resolve()), "step": meta.get("step")},
        "latency": predicted,
        "not_yet": "model.pt2",
    }
    out = Path(args.out)
    for name in (ENCODER, DECODER):  # an earlier export's graphs are not this model's
        (out / name).unlink(missing_ok=True)
    save_seq2seq_model(static, out, card)
    print(f"wrote {args.out}: {static.num_params():,} parameters, subnet {subnet}")
    if "onnx" in formats:
        onnx = write_seq2seq_onnx(static, out, getattr(args, "target_ort", None), getattr(args, "seed", 0) or 0)
        p = onnx["parity_max_abs"]
        print(f"  onnx              {out / ENCODER}, {out / DECODER}  (opset {onnx['opset']})")
        print(f"  parity            max |onnxruntime - torch| = {p['encoder']:.2e} (encoder), {p['decoder_step']:.2e} "
              "(decoder step)")  # fmt: skip
    if "torch" in formats:
        print("not written for an encoder-decoder yet: model.pt2 (the safetensors and the card are)")
    print(f"validation {ce:.4f} nats/target byte; chrF / BLEU: nas translate --model {args.out} --eval test --beam 5")
    if predicted:
        w = TranslateWorkload.from_record(predicted["workload"], "the predictor's workload")
        print(f"  predicted         {predicted['predicted_ms']:.3f} ms  ({predicted['model']} predictor, {workload_text(w)}, "
              f"{predicted['device'].get('device', 'unknown device')})")
    if not args.measure:
        return 0
    bar, update = measurement_bar(f"measuring on {args.measure}")
    try:
        measured = measure_model(device, static, workload, settings, budget_ms=budget, seed=args.seed, baseline_ms=reference_ms,
                                 predicted_ms=predicted["predicted_ms"] if predicted else None, progress=update)  # fmt: skip
    finally:
        bar.close()
    update_card(out, measured=measured)
    return report_measured(args, measured, workload, predicted, budget)
