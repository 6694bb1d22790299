"""``nas export`` of a subnet of an encoder-decoder supernet (task seq2seq): safetensors + model card.

The command (:mod:`nas.commands.export`) hands a seq2seq checkpoint here.  The card records the corpus the
supernet was trained on and the subnet's held-out cross-entropy per target byte (the extracted model's, on the
validation batches training evaluated on); ``nas translate --model DIR --eval test`` adds chrF and BLEU.
Not yet: ONNX of the encoder and the decoder step, ``--measure``, ``--predictor``, ``--budget``, ``--precision``.
"""

from __future__ import annotations

import argparse
from pathlib import Path


def is_seq2seq_checkpoint(path: str) -> bool:
    from nas.train_seq2seq import stored_task

    return stored_task(Path(path)) == "seq2seq"


def corpus_record(meta: dict) -> dict:
    """What a card keeps of a run's corpus: enough to rebuild it and check it is the same."""
    return {k: meta.get(k) for k in ("corpus", "data", "data_seed", "lang", "corpus_hash")}


def write_seq2seq_onnx(static, out: Path, target_ort: str | None, seed: int = 0) -> dict:
    """Write and parity-check the two graphs of ``static`` into ``out``; record them in the card; return the record."""
    from nas.export import PARITY_TOL, choose_opset
    from search_spaces import UserError
    from supernet.artifact import update_card
    from supernet.onnx_seq2seq import DECODER, ENCODER, export_seq2seq_onnx, seq2seq_parity

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
    from nas.export import parse_formats
    from search_spaces import UserError
    from supernet.onnx_seq2seq import DECODER, ENCODER
    from search_spaces.seq2seq import Seq2SeqSubnet
    from supernet.seq2seq_artifact import save_seq2seq_model
    from supernet.seq2seq_train import eval_batches, heldout_ce, load_seq2seq_supernet
    from supernet.translation import check_pairs, prepare_pairs

    for flag in ("predictor", "measure", "budget"):
        if getattr(args, flag, None):
            raise UserError(f"--{flag}: not for an encoder-decoder (task seq2seq) model yet")
    if getattr(args, "precision", "fp32") not in (None, "fp32"):
        raise UserError(f"--precision {args.precision}: an encoder-decoder (task seq2seq) exports in fp32 only so far")
    formats = parse_formats(args.format)
    supernet, payload = load_seq2seq_supernet(args.supernet)
    space, meta = supernet.space, payload["meta"]
    subnet = space.check(Seq2SeqSubnet.load(args.subnet))
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
        "not_yet": "model.pt2; latency in the card",
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
    return 0
