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
                   help="the subnet to run: a YAML / JSON file (as `nas space --samples` prints), largest or smallest "
                   "(default largest)")  # fmt: skip
    p.add_argument("--beam", type=int, metavar="B", help="beam width; 1 = greedy (default 1 for text, 5 for --eval)")
    p.add_argument("--max-bytes", type=int, metavar="N", help="longest translation in bytes (default the space's max_seq_len)")
    p.add_argument("--eval", choices=("val", "test"), help="translate the split's sources of the run's corpus and print "
                   "chrF and BLEU against its references (sacrebleu)")  # fmt: skip
    p.add_argument("--limit", type=int, metavar="N", help="--eval: the first N pairs of the split only")
    p.add_argument("--device", default="cpu", metavar="DEVICE", help="auto, cpu (default), cuda or cuda:N")
    p.add_argument("--engine", default="torch", choices=("torch", "onnxruntime"),
                   help="torch (default), or onnxruntime: an export's encoder.onnx and decoder_step.onnx (the same "
                        "greedy and beam search, --eval too)")  # fmt: skip


def run(args: argparse.Namespace) -> int:
    from functools import partial
    from pathlib import Path

    from supernet.progress import progress_bar
    from search_spaces import UserError

    from .data import check_pairs, prepare_pairs
    from .decode import evaluate_translation, spell, translate

    for flag, value in (("--beam", args.beam), ("--max-bytes", args.max_bytes), ("--limit", args.limit)):
        if value is not None and value < 1:
            raise UserError(f"{flag}: {value} is not a positive integer")
    if not args.text and args.eval is None:
        raise UserError("give text to translate, or --eval val|test to score the model on its corpus")
    if args.eval is not None:
        try:
            import sacrebleu  # noqa: F401  (the translate extra; checked before anything is loaded)
        except ImportError:
            raise UserError("--eval: chrF and BLEU need sacrebleu, which is not installed: "
                            "pip install 'nas-transformers[translate]' (python3 scripts/install.py translate)") from None
    from supernet.scoring import pick_device

    args.device = pick_device(args.device)  # auto, cpu, cuda, cuda:N: checked (and auto resolved) before loading
    if args.engine == "onnxruntime":
        max_seq_len, record, cache, export_dir, subnet, translator = _load_onnx(Path(args.model), args.device)
        from .artifact import read_card

        vocab = read_card(export_dir)["space"]["vocab_size"]
    else:
        model, record, cache, export_dir = _load(Path(args.model), args.subnet, args.device)
        max_seq_len, subnet, w = model.space.max_seq_len, model.subnet, model.weights()
        translator = partial(translate, w, max_seq_len=max_seq_len)
        vocab = model.space.vocab_size
    words = _vocabulary(export_dir, record)  # the model's tokenizer.json: reads the text, spells the translation
    if args.beam is not None and args.beam > vocab:  # the first step has vocab candidates: wider beams stay empty
        raise UserError(f"--beam: {args.beam} is more than the model's {vocab} tokens; a beam holds at most one hypothesis "
                        f"per token at the first step (give at most {vocab}; 4-8 is the usual width)")
    if args.max_bytes is not None and args.max_bytes > max_seq_len:
        raise UserError(f"--max-bytes: {args.max_bytes} is more than the model's max_seq_len of {max_seq_len} bytes, the "
                        "longest translation it decodes (give at most that)")
    check_lengths(args.text, max_seq_len)  # every text before the first translation is printed
    for text in args.text:
        source = words.encode(text.encode("utf-8")).tolist() if words.kind == "bpe" else text.encode("utf-8")
        hyp = translator(source, beam=args.beam or 1, max_len=args.max_bytes)
        print(spell(hyp.tokens, words).decode("utf-8", errors="replace").replace("\n", "\\n"))
    if args.eval is None:
        return 0
    corpus = prepare_pairs(record["data"], cache, seed=record["data_seed"] or 0, lang=record["lang"] or "de")
    check_pairs(corpus, record["corpus_hash"], args.model)
    if words.kind == "bpe":  # the pairs read at the model's joint vocabulary (the run's cache; trained again if gone)
        from search_spaces.space import TokenizerSpec

        from .data import VOCAB_SIZE, tokenize_pairs

        corpus = tokenize_pairs(corpus, TokenizerSpec("bpe", (words.size,), VOCAB_SIZE), cache)
        if corpus.vocabulary.sha256 != words.sha256:
            raise UserError(f"--eval: the corpus's vocabulary {corpus.vocabulary.sha256[:16]} is not the model's "
                            f"({words.sha256[:16]}, its tokenizer.json): scores would not mean the model's")
    pairs = corpus.split(args.eval)
    beam = args.beam or 5
    bar = progress_bar(total=min(len(pairs), args.limit or len(pairs)), desc=f"translating {args.eval}", unit="pair",
                       leave=False)  # fmt: skip
    try:
        result = evaluate_translation(partial(translator, beam=beam, max_len=args.max_bytes), pairs, max_seq_len,
                                      limit=args.limit, progress=lambda n, total: bar.update(n - bar.n),
                                      vocabulary=words if words.kind == "bpe" else None)  # fmt: skip
    finally:
        bar.close()
    print(f"{args.eval}: {result['pairs']} pairs ({corpus.meta['corpus']}; {result['skipped']} skipped: source over "
          f"{max_seq_len} bytes), beam {beam}, {args.engine}, subnet {subnet}")  # fmt: skip
    print(f"chrF {result['chrf']:.2f}  BLEU {result['bleu']:.2f}")
    if export_dir is not None:
        from supernet.artifact import read_card, update_card

        key = args.eval if args.engine == "torch" else f"{args.eval}.onnxruntime"  # torch's figure stays as it was
        quality = dict(read_card(export_dir).get("quality") or {})
        quality[key] = {k: result[k] for k in ("chrf", "bleu", "pairs", "skipped")} | {
            "beam": beam, "max_bytes": args.max_bytes, "limit": args.limit, "runtime": args.engine,
            "scorer": "sacrebleu corpus_chrf / corpus_bleu"}  # fmt: skip
        update_card(export_dir, quality=quality)
        print(f"recorded in {export_dir / 'model_card.json'} (quality.{key})")
    return 0


def _vocabulary(export_dir, record: dict):
    """The model's vocabulary: its folder's ``tokenizer.json`` (checked against the card and the encoder graph's
    ``nas.tokenizer``), a checkpoint's (its meta's ``vocabulary``), else the bytes with PAD, BOS and EOS."""
    from supernet.artifact import load_vocabulary
    from supernet.tokenizer import Vocabulary, byte_tokenizer_json

    from .data import SPECIAL_NAMES, VOCAB_SIZE
    from .onnx import ENCODER

    if export_dir is not None:
        return load_vocabulary(export_dir, onnx=ENCODER)
    trained = record.get("vocabulary")
    return Vocabulary(trained["json"]) if trained else Vocabulary(byte_tokenizer_json(VOCAB_SIZE, SPECIAL_NAMES))


def check_lengths(texts: list[str], max_seq_len: int) -> None:
    """Refuse, in one line, a text longer in UTF-8 bytes than the model reads (an encoder-decoder's max_seq_len), naming
    it, before any is translated (the decoders' own check, :func:`tasks.translation.decode.decode_limit`, comes at the
    text's turn, after the translations before it were printed, and names no argument)."""
    from search_spaces import UserError

    for i, text in enumerate(texts, 1):
        n = len(text.encode("utf-8"))
        if n > max_seq_len:
            raise UserError(f"text {i}: {n} bytes (UTF-8); the model reads at most {max_seq_len} (its max_seq_len): shorten "
                            f"it or split it into sentences of at most {max_seq_len} bytes")


def _load_onnx(path, device: str):
    """(max_seq_len, corpus record, corpus cache folder, export folder, subnet, translator) of an export's two ONNX
    graphs (what ``nas export`` wrote and parity-checked, checked against the card's checksums):
    ``translator(source, beam=, max_len=)`` -> Hypothesis.  max_seq_len: the encoder graph's ``nas.max_seq_len``
    (the card's space's for an export written before the graphs carried it)."""
    from functools import partial

    from search_spaces import UserError
    from supernet.artifact import verify_file
    from supernet.onnx_export import read_metadata

    from .artifact import is_seq2seq_export, read_card
    from .onnx import DECODER, ENCODER, OnnxSeq2Seq, onnx_translate
    from .space import Seq2SeqSubnet

    if not (path.is_dir() and is_seq2seq_export(path)):
        raise UserError(f"--engine onnxruntime: --model {path} is not a folder written by `nas export` of a seq2seq subnet")
    if device != "cpu":
        raise UserError("--device: not with --engine onnxruntime (its sessions run on the CPU)")
    card = read_card(path)
    model = OnnxSeq2Seq.load(path)  # (a missing graph named first)
    for name in (ENCODER, DECODER):
        verify_file(path, name, card)
    max_seq_len = int(read_metadata(model.encoder).get("nas.max_seq_len", card["space"]["max_seq_len"]))
    subnet = Seq2SeqSubnet.from_dict(card["subnet"], where=f"{path / 'model_card.json'}: subnet")
    return max_seq_len, card["corpus"], path, path, subnet, partial(onnx_translate, model, max_seq_len=max_seq_len)


def _load(path, subnet_arg: str, device: str):
    """(static model, corpus record, corpus cache folder, export folder or None) of ``--model``: an export of
    ``nas export``, a train-supernet run folder or a checkpoint (then ``--subnet`` picks the subnet)."""
    from search_spaces import UserError

    from .artifact import is_seq2seq_export, load_seq2seq_model
    from .workflows import corpus_record
    from .space import Seq2SeqSubnet
    from .train import load_seq2seq_supernet

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
    record = {**corpus_record(payload["meta"]), "vocabulary": payload["meta"].get("vocabulary")}
    return supernet.extract(subnet).eval(), record, path.parent, None
