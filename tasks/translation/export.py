"""``nas export`` of a subnet of an encoder-decoder supernet (task seq2seq): safetensors + model card.

The command (:mod:`nas.commands.export`) hands a seq2seq checkpoint here.  The card records the corpus the
supernet was trained on and the subnet's held-out cross-entropy per target byte (the extracted model's, on the
validation batches training evaluated on); ``nas translate --model DIR --eval test`` adds chrF and BLEU.
ONNX: the encoder and the decoder step (parity-checked; each carries :func:`supernet.export.onnx_metadata`).
``--predictor`` records the predicted latency of the subnet at the predictor's translate workload; ``--timing-target TARGET
[--budget T]`` times the exported model on that workload with the measurement protocol (on ``onnxruntime`` the same
two graphs, exported by the device).
Not yet: ``--precision`` (fp32 only), ``model.pt2``.
"""

from __future__ import annotations

from pathlib import Path

from .workflows import corpus_record


def write_seq2seq_onnx(static, out: Path, target_ort: str | None, seed: int = 0) -> dict:
    """Write and parity-check the two graphs of ``static`` into ``out``; record them in the card; return the record."""
    from supernet.export import PARITY_TOL, choose_opset, onnx_metadata
    from search_spaces import UserError
    from supernet.artifact import read_card, update_card
    from supernet.onnx_export import add_metadata

    from .onnx import DECODER, ENCODER, export_seq2seq_onnx, seq2seq_parity

    opset, notes = choose_opset(target_ort)
    said = (read_card(out).get("tokenizer") or {}).get("metadata", "bytes")  # the folder's tokenizer.json (issue 54)
    for path in export_seq2seq_onnx(static, out, opset=opset):  # described (beside seq2seq_inputs) before the card's sha256
        add_metadata(path, onnx_metadata(static.space, static.subnet, said))
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


def export_seq2seq(supernet, payload: dict, subnet, settings, predicted: dict | None):
    """The translation task's export (:meth:`tasks.base.Task.export`): safetensors + card (the corpus, the held-out
    cross-entropy per target byte on the batches training evaluated on), the two ONNX graphs (parity-checked)."""
    from latency.measure import measure_model, predicted_line
    from supernet.export import Exported
    from search_spaces import UserError

    from .artifact import save_seq2seq_model
    from .data import check_pairs, prepare_pairs, tokenize_pairs
    from .onnx import DECODER, ENCODER
    from .train import eval_batches, heldout_ce

    s, space, meta = settings, supernet.space, payload["meta"]
    if s.precision != "fp32":
        raise UserError(f"--precision {s.precision}: an encoder-decoder (task seq2seq) exports in fp32 only so far")
    path = Path(s.scoring.path)
    static = supernet.extract(subnet).eval()
    record = corpus_record(meta)
    corpus = prepare_pairs(record["data"], path.parent, seed=record["data_seed"] or 0, lang=record["lang"] or "de")
    check_pairs(corpus, record["corpus_hash"], str(path))
    trained = meta.get("vocabulary")  # a joint subword vocabulary: the pairs read at it, its file in the folder
    if space.tokenizer.bpe:
        if trained is None:
            raise UserError(f"{path}: a subword space's checkpoint without its vocabulary (meta lacks vocabulary)")
        corpus = tokenize_pairs(corpus, space.tokenizer, path.parent)
        if corpus.vocabulary.sha256 != trained["sha256"]:
            raise UserError(f"{path}: trained with tokenizer {trained['sha256'][:16]}, but the data cache now gives "
                            f"{corpus.vocabulary.sha256[:16]}")
    config = meta["train_config"]
    batches = eval_batches(corpus.val, config["batch_size"], space.max_seq_len, config["eval_batches"], config["seed"])
    ce = heldout_ce(static, None, corpus.val, batches)
    card = {
        "corpus": record,
        "validation": {"ce_per_target_byte": ce, "unit": "nats per target byte (EOS included)",
                       "pairs": int(sum(len(b) for b in batches))},  # fmt: skip
        "supernet": {"checkpoint": str(path.resolve()), "step": meta.get("step")},
        "latency": predicted,
        "not_yet": "model.pt2",
    }
    out = Path(s.out)
    for name in (ENCODER, DECODER):  # an earlier export's graphs are not this model's
        (out / name).unlink(missing_ok=True)
    save_seq2seq_model(static, out, card, trained["json"] if space.tokenizer.bpe else None)
    lines = [f"wrote {s.out}: {static.num_params():,} parameters, subnet {subnet}"]
    if "onnx" in s.formats:
        onnx = write_seq2seq_onnx(static, out, s.target_ort, s.seed)
        p = onnx["parity_max_abs"]
        lines.append(f"  onnx              {out / ENCODER}, {out / DECODER}  (opset {onnx['opset']})")
        lines.append(f"  parity            max |onnxruntime - torch| = {p['encoder']:.2e} (encoder), {p['decoder_step']:.2e} "
                     "(decoder step)")  # fmt: skip
    if "torch" in s.formats:
        lines.append("not written for an encoder-decoder yet: model.pt2 (the safetensors and the card are)")
    lines.append(f"validation {ce:.4f} nats/target byte; chrF / BLEU: nas translate --model {s.out} --eval test --beam 5")
    if predicted:
        lines.append(predicted_line(predicted))

    def time(device, workload, protocol, **kw) -> dict:
        return measure_model(device, static, workload, protocol, **kw)

    return Exported(out, lines, [], time)
