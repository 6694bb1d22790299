"""``nas translate``: translate text with an encoder-decoder, or score it (chrF, BLEU) on a split of its corpus."""

from __future__ import annotations

import argparse

NAME = "translate"
HELP = "translate text with an encoder-decoder (task seq2seq) trained by train-supernet; --eval scores chrF and BLEU"
EXAMPLE = 'nas translate --model runs/tr-tiny "File not found" --beam 5'


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("text", nargs="*", help="sentences to translate (one translation per line on stdout)")
    p.add_argument("--model", required=True, metavar="PATH", help="a model written by `nas export`, or a train-supernet "
                   "run directory of a seq2seq space (its final.pt, else latest.pt) or a checkpoint")  # fmt: skip
    p.add_argument("--subnet", default="largest", metavar="FILE",
                   help="the subnet to run: a YAML / JSON file (as `nas space --sample` prints), largest or smallest "
                   "(default largest)")  # fmt: skip
    p.add_argument("--beam", type=int, metavar="B", help="beam width; 1 = greedy (default 1 for text, 5 for --eval)")
    p.add_argument("--max-bytes", type=int, metavar="N", help="longest translation in bytes (default the space's max_seq_len)")
    p.add_argument("--eval", choices=("val", "test"), help="translate the split's sources of the run's corpus and print "
                   "chrF and BLEU against its references (sacrebleu)")  # fmt: skip
    p.add_argument("--limit", type=int, metavar="N", help="--eval: the first N pairs of the split only")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"), help="default cpu")
    p.add_argument("--runtime", default="torch", choices=("torch", "onnxruntime"),
                   help="torch (default), or onnxruntime: an export's encoder.onnx and decoder_step.onnx (greedy)")  # fmt: skip


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from tqdm import tqdm

    from nas.cli import show_progress
    from search_spaces import UserError
    from supernet.translate import evaluate_translation, translate
    from supernet.translation import check_pairs, prepare_pairs

    for flag, value in (("--beam", args.beam), ("--max-bytes", args.max_bytes), ("--limit", args.limit)):
        if value is not None and value < 1:
            raise UserError(f"{flag}: {value} is not a positive integer")
    if not args.text and args.eval is None:
        raise UserError("give text to translate, or --eval val|test to score the model on its corpus")
    if args.runtime == "onnxruntime":
        return _translate_onnx(args)
    model, record, cache, export_dir = _load(Path(args.model), args.subnet, args.device)
    space = model.space
    w = model.weights()
    for text in args.text:
        hyp = translate(w, text.encode("utf-8"), space.max_seq_len, args.beam or 1, args.max_bytes)
        print(hyp.text.decode("utf-8", errors="replace").replace("\n", "\\n"))
    if args.eval is None:
        return 0
    corpus = prepare_pairs(record["data"], cache, seed=record["data_seed"] or 0, lang=record["lang"] or "de")
    check_pairs(corpus, record["corpus_hash"], args.model)
    pairs = corpus.split(args.eval)
    beam = args.beam or 5
    bar = tqdm(total=min(len(pairs), args.limit or len(pairs)), desc=f"translating {args.eval}", unit="pair",
               disable=not show_progress(), leave=False)  # fmt: skip
    try:
        result = evaluate_translation(w, pairs, space.max_seq_len, beam, args.limit, args.max_bytes,
                                      lambda n, total: bar.update(n - bar.n))  # fmt: skip
    finally:
        bar.close()
    print(f"{args.eval}: {result['pairs']} pairs ({corpus.meta['corpus']}; {result['skipped']} skipped: source over "
          f"{space.max_seq_len} bytes), beam {beam}, subnet {model.subnet}")  # fmt: skip
    print(f"chrF {result['chrf']:.2f}  BLEU {result['bleu']:.2f}")
    if export_dir is not None:
        from supernet.artifact import read_card, update_card

        quality = dict(read_card(export_dir).get("quality") or {})
        quality[args.eval] = {k: result[k] for k in ("chrf", "bleu", "pairs", "skipped")} | {
            "beam": beam, "max_bytes": args.max_bytes, "limit": args.limit, "scorer": "sacrebleu corpus_chrf / corpus_bleu"}
        update_card(export_dir, quality=quality)
        print(f"recorded in {export_dir / 'model_card.json'} (quality.{args.eval})")
    return 0


def _translate_onnx(args: argparse.Namespace) -> int:
    """Greedy translations through an export's two ONNX graphs (what ``nas export`` wrote and parity-checked)."""
    from pathlib import Path

    from search_spaces import UserError
    from supernet.onnx_seq2seq import OnnxSeq2Seq, onnx_greedy
    from supernet.seq2seq_artifact import is_seq2seq_export, read_card

    path = Path(args.model)
    if not (path.is_dir() and is_seq2seq_export(path)):
        raise UserError(f"--runtime onnxruntime: --model {path} is not a folder written by `nas export` of a seq2seq subnet")
    for flag, bad in (("--beam", (args.beam or 1) > 1), ("--eval", args.eval), ("--device", args.device != "cpu")):
        if bad:
            raise UserError(f"{flag}: not with --runtime onnxruntime so far (it decodes greedily on the CPU)")
    max_seq_len = read_card(path)["space"]["max_seq_len"]
    model = OnnxSeq2Seq.load(path)
    for text in args.text:
        source = text.encode("utf-8")
        if len(source) > max_seq_len:
            raise UserError(f"the source is {len(source)} bytes; this model reads at most {max_seq_len} (its max_seq_len)")
        tokens, _ = onnx_greedy(model, source, min(args.max_bytes or max_seq_len, max_seq_len))
        print(bytes(t for t in tokens if t < 256).decode("utf-8", errors="replace").replace("\n", "\\n"))
    return 0


def _load(path, subnet_arg: str, device: str):
    """(static model, corpus record, corpus cache folder, export folder or None) of ``--model``: an export of
    ``nas export``, a train-supernet run folder or a checkpoint (then ``--subnet`` picks the subnet)."""
    from search_spaces import UserError
    from search_spaces.seq2seq import Seq2SeqSubnet
    from supernet.seq2seq_artifact import is_seq2seq_export, load_seq2seq_model
    from supernet.seq2seq_train import load_seq2seq_supernet

    from nas.export_seq2seq import corpus_record

    if path.is_dir() and is_seq2seq_export(path):
        if subnet_arg != "largest":
            raise UserError(f"--subnet: {path} is an exported model of one subnet; --subnet is for a supernet")
        model, card = load_seq2seq_model(path, device)
        return model, card["corpus"], path, path
    if path.is_dir():
        found = [p for p in (path / "final.pt", path / "latest.pt") if p.exists()]
        if not found:
            raise UserError(f"--model {path}: holds no checkpoint (final.pt or latest.pt of `nas train-supernet`) "
                            "and no exported model (model_card.json of `nas export`)")  # fmt: skip
        path = found[0]
    supernet, payload = load_seq2seq_supernet(path, device=device)
    space = supernet.space
    if subnet_arg in ("largest", "smallest"):
        subnet = getattr(space, subnet_arg)()
    else:
        subnet = space.check(Seq2SeqSubnet.load(subnet_arg))
    return supernet.extract(subnet).eval(), corpus_record(payload["meta"]), path.parent, None
