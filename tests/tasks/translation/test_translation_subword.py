"""Translation with a joint subword vocabulary (issue 54, HAT's joint BPE): ``tokenizer: {bpe: N}`` in a seq2seq
space, the vocabulary trained on both sides of the training pairs (PAD, BOS, EOS at 256-258), cross-entropy per target
byte, and an exported model that translates from its folder alone."""

import json
import shutil

import numpy as np
import pytest

from nas.cli import main
from search_spaces import parse_space
from search_spaces.space import SpaceError
from tasks.translation.data import BOS, EOS, PAD, collate, prepare_pairs, tokenize_pairs

from tests.tasks.translation.translation_fakes import MINI_SEQ2SEQ, write_toy_tsv

BPE = MINI_SEQ2SEQ.replace("vocab_size: 259\n", "tokenizer: {{bpe: 300}}\n")  # (a str.format template)


def test_the_space_reads_one_joint_vocabulary():
    space = parse_space(BPE.format(positions="rope"), "b.yaml")
    assert space.vocab_size == 300 and space.tokenizer.base == 259 and space.tokenizer.sizes == (300,)
    assert space.to_dict()["tokenizer"] == {"bpe": 300}
    assert space.encoder.vocab_size == space.decoder.vocab_size == 300
    byte = parse_space(MINI_SEQ2SEQ.format(positions="rope"), "m.yaml")
    assert "tokenizer" not in byte.to_dict() and byte.vocab_size == 259
    with pytest.raises(SpaceError) as e:
        parse_space(BPE.replace("{{bpe: 300}}", "{{bpe: [bytes, 300]}}").format(positions="rope"), "s.yaml")
    assert e.value.errors == ["s.yaml: tokenizer.bpe: a seq2seq space reads one joint vocabulary (give one size: "
                              "{bpe: 8192}); searching the vocabulary is for causal-lm spaces"]
    with pytest.raises(SpaceError, match=r"tokenizer.bpe: 259 is not a vocabulary size: expected bytes or an integer in "
                                         r"260..65536 \(the 259 ids of the bytes and specials come first\)"):
        parse_space(BPE.replace("{{bpe: 300}}", "{{bpe: 259}}").format(positions="rope"), "s.yaml")


def test_pairs_read_at_the_joint_vocabulary(tmp_path):
    corpus = prepare_pairs(str(write_toy_tsv(tmp_path / "toy.tsv")), tmp_path)
    space = parse_space(BPE.format(positions="rope"), "b.yaml")
    tok = tokenize_pairs(corpus, space.tokenizer, tmp_path)
    vocab = tok.vocabulary
    assert vocab.size == 300 and vocab.specials == ("pad", "bos", "eos")
    for i in range(5):  # each side spells its sentence; the ids are fewer than the bytes
        (src, tgt), (sb, tb) = tok.train[i], corpus.train[i]
        assert vocab.decode(src) == sb and vocab.decode(tgt) == tb and len(tgt) <= len(tb)
    assert np.array_equal(tok.train.tgt_bytes, corpus.train.tgt_lengths)
    idx = np.arange(4)
    src, inp, out = collate(tok.train, idx)
    assert (inp[:, 0] == BOS).all() and int((out == EOS).sum()) == 4 and int(src.max()) < 300
    assert PAD not in src[0, : len(tok.train[0][0])]
    assert tok.train.target_units(idx) == corpus.train.target_units(idx) == int(corpus.train.tgt_lengths[idx].sum()) + 4
    assert tokenize_pairs(corpus, space.tokenizer, tmp_path).vocabulary.sha256 == vocab.sha256  # cached, the same


def test_train_export_and_translate_from_the_folder_alone(tmp_path, capsys):
    space = tmp_path / "bpe.yaml"
    space.write_text(BPE.format(positions="rope"))
    tsv = write_toy_tsv(tmp_path / "toy.tsv")
    run = tmp_path / "run"
    assert main(["train-supernet", str(space), "--data", str(tsv), "--out", str(run), "--max-steps", "3", "--batch-size", "8",
                 "--eval-batches", "1", "--lr-warmup", "1", "-q"]) == 0
    (tmp_path / "sub.yaml").write_text(
        "encoder: {embed_dim: 16, depth: 3, heads: [1, 1, 1], ffn_dim: [16, 16, 16], attention: [softmax, linear, softmax]}\n"
        "decoder: {embed_dim: 24, depth: 1, heads: [2], ffn_dim: [32], attention: ['local:4'], cross_heads: [1], "
        "cross_layers: [2]}\n")
    export = tmp_path / "export"
    assert main(["export", str(run / "final.pt"), "--subnet", str(tmp_path / "sub.yaml"), "--out", str(export), "-q"]) == 0
    card = json.loads((export / "model_card.json").read_text())
    assert card["tokenizer"]["kind"] == "bpe" and card["tokenizer"]["vocab"] == 300 and "tokenizer.json" in card["files"]
    import onnx

    meta = {p.key: p.value for p in onnx.load(str(export / "encoder.onnx")).metadata_props}
    assert meta["nas.tokenizer"] == card["tokenizer"]["metadata"]
    alone = tmp_path / "alone"
    shutil.copytree(export, alone)
    shutil.rmtree(run)  # the corpus, the tokenizer cache and the checkpoint gone
    capsys.readouterr()
    for engine in ("torch", "onnxruntime"):
        assert main(["translate", "--model", str(alone), "file not found", "--max-bytes", "6", "--engine", engine,
                     "-q"]) == 0
        assert len(capsys.readouterr().out.splitlines()) == 1


def test_a_split_read_at_the_vocabulary_is_translated_and_scored(tmp_path):
    """The benchmark's scoring path: the test split's pairs read at the joint vocabulary (id arrays, not bytes) are
    beam-searched, spelled by the vocabulary and scored; an over-long source of ids is refused in ids."""
    import torch

    from search_spaces import UserError
    from tasks.translation.decode import decode_limit, evaluate_translation
    from tasks.translation.model import TranslationTransformer

    corpus = prepare_pairs(str(write_toy_tsv(tmp_path / "toy.tsv")), tmp_path)
    space = parse_space(BPE.format(positions="rope"), "b.yaml")
    tok = tokenize_pairs(corpus, space.tokenizer, tmp_path)
    test = tok.split("test")
    assert not isinstance(test[0][0], bytes)  # ids of the vocabulary
    model = TranslationTransformer(space, space.largest(), generator=torch.Generator().manual_seed(0)).eval()
    result = evaluate_translation(model.weights(), test, space.max_seq_len, beam=2, limit=3, max_len=4,
                                  vocabulary=tok.vocabulary)
    assert result["pairs"] == 3 and len(result["hypotheses"]) == 3 and 0 <= result["chrf"] <= 100
    with pytest.raises(UserError, match=r"the source is 41 tokens; this model reads at most 40"):
        decode_limit(np.ones(41, dtype=np.uint16), 40, None)
    with pytest.raises(UserError, match="the source text is empty"):
        decode_limit(np.zeros(0, dtype=np.uint16), 40, None)


def test_a_budget_in_target_bytes_buys_the_same_text_at_any_vocabulary(tmp_path):
    """``--tokens`` (target bytes) and the loop's count are bytes + EOS at a subword vocabulary too, so a budget buys
    about the same text as a byte model's (the batches differ: they are sorted by length in ids); the loss stays per
    token, only the count is in bytes."""
    from tasks.translation.data import length_batches
    from tasks.translation.train import PairBatches, steps_for_tokens

    corpus = prepare_pairs(str(write_toy_tsv(tmp_path / "toy.tsv")), tmp_path)
    space = parse_space(BPE.format(positions="rope"), "b.yaml")
    tok = tokenize_pairs(corpus, space.tokenizer, tmp_path)
    assert np.array_equal(tok.train.unit_lengths, corpus.train.unit_lengths)  # bytes + EOS, not tokens
    budget = 1_000  # (within the first epoch of the toy split: 12 batches)
    steps, total = steps_for_tokens(tok.train, 8, 40, 0, budget)
    batches = length_batches(tok.train, 8, 40, 0, 0)
    assert total == sum(int(corpus.train.tgt_lengths[b].sum()) + len(b) for b in batches[:steps])  # bytes + EOS
    assert budget - total < int(tok.train.unit_lengths[batches[steps]].sum())  # the next batch would pass the budget
    by_bpe = PairBatches(tok.train, 8, 40, 0)
    assert [by_bpe(k).tokens for k in range(steps)] == [tok.train.target_units(b) for b in batches[:steps]]
    first = by_bpe(0)
    assert first.per == int((first.targets != PAD).sum()) < first.tokens  # the loss over tokens; fewer than the bytes
    bytes_steps, bytes_total = steps_for_tokens(corpus.train, 8, 40, 0, budget)
    assert abs(bytes_total - total) < 200 and abs(bytes_steps - steps) <= 1  # about the same text either way
