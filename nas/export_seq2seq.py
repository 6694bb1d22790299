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


def export_seq2seq(args: argparse.Namespace) -> int:
    from search_spaces import UserError
    from search_spaces.seq2seq import Seq2SeqSubnet
    from supernet.seq2seq_artifact import save_seq2seq_model
    from supernet.seq2seq_train import eval_batches, heldout_ce, load_seq2seq_supernet
    from supernet.translation import check_pairs, prepare_pairs

    for flag in ("predictor", "measure", "budget"):
        if getattr(args, flag, None):
            raise UserError(f"--{flag}: not for an encoder-decoder (task seq2seq) model yet (no ONNX encoder / decoder step)")
    if getattr(args, "precision", "fp32") not in (None, "fp32"):
        raise UserError(f"--precision {args.precision}: an encoder-decoder (task seq2seq) exports in fp32 only so far")
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
        "not_yet": "ONNX of the encoder and the decoder step; latency",
    }
    save_seq2seq_model(static, args.out, card)
    print(f"wrote {args.out}: {static.num_params():,} parameters, subnet {subnet}")
    print(f"not written for an encoder-decoder yet (--format {args.format}): model.pt2, the ONNX encoder and decoder step")
    print(f"validation {ce:.4f} nats/target byte; chrF / BLEU: nas translate --model {args.out} --eval test --beam 5")
    return 0
