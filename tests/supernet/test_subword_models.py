"""Models of a subword vocabulary (issue 54): the supernet's embedding and output rows slice by the subnet's vocabulary,
a step's subnets share one vocabulary (so distillation compares the same ids), held-out bits are per byte of text,
and a model folder carries its tokenizer.json: it generates from its folder alone, and a folder whose tokenizer is
not one, is larger than the embedding or does not match its ONNX metadata is refused in one line (exit 2)."""

import json
import math
import shutil
from dataclasses import replace

import numpy as np
import onnx
import pytest
import torch

from nas.cli import main
from search_spaces import UserError, parse_space
from supernet import SuperTransformer
from supernet.checkpoint import save_checkpoint
from supernet.heldout import HeldOut
from supernet.task import VocabBatches, model_vocab, task_for
from supernet.tokenizer import Tokens, Vocabulary, train_vocabulary
from supernet.train import SandwichObjective, TrainConfig
from tests.supernet.test_tokenizer import corpus_docs

SPACE = """
name: tiny-bpe-test
task: causal-lm
tokenizer: {bpe: [bytes, 320, 384]}
max_seq_len: 64
head_dim: 8
embed_dim: [16, 32]
depth: [1, 2]
layers: {heads: [1, 2], ffn_dim: [32, 64], attention: [softmax, 'local:8']}
latency: {prefill: {batch_size: 1, seq_len: 32}}
"""


@pytest.fixture(scope="module")
def space():
    return parse_space(SPACE, "tiny-bpe-test.yaml")


@pytest.fixture(scope="module")
def vocab(space):
    return train_vocabulary(corpus_docs(), space.tokenizer)


@pytest.fixture(scope="module")
def supernet(space):
    return SuperTransformer(space, generator=torch.Generator().manual_seed(0)).eval()


def test_embedding_rows_slice_by_the_subnets_vocabulary(space, supernet):
    x = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(1))
    for v in space.vocabs:
        subnet = replace(space.largest(), vocab=v)
        logits = supernet(x, subnet)
        assert logits.shape == (2, 16, v)
        static = supernet.extract(subnet)
        assert static.tok_emb.weight.shape == (v, 32) and static.subnet == subnet
        assert torch.allclose(static(x), logits, atol=1e-5)
        assert supernet.num_params(subnet) == static.num_params()
    small, large = (replace(space.largest(), vocab=v) for v in (320, 384))
    # nested: the smaller vocabulary's logits are the larger one's first columns (the rows are shared)
    assert torch.allclose(supernet(x, small), supernet(x, large)[..., :320], atol=1e-5)


def test_a_steps_subnets_share_one_vocabulary_in_turn(space):
    objective = SandwichObjective(space, n_random=3, seed=0)
    seen = []
    for step in range(2 * len(space.attention) * len(space.vocabs)):
        vocabs = {s.vocab for _, s in objective.plan(step)}
        assert len(vocabs) == 1, (step, vocabs)
        seen.append(vocabs.pop())
    assert seen[:4] == [256, 256, 320, 320]  # each vocabulary held for one round of the two types
    assert {(t, v) for t, v in zip([objective.sandwich_type(k) for k in range(12)], seen)} == {
        (t, v) for t in space.attention for v in space.vocabs}
    assert all(s.vocab in space.vocabs for s in objective.fixed_subnets())


def test_the_batches_of_a_step_are_read_at_its_vocabulary(space, vocab):
    data = b"".join(corpus_docs(6))
    arrays = {v: vocab.at(v).encode(data).astype(np.uint16) for v in space.vocabs}
    tokens = Tokens(arrays, vocab.token_lengths())
    learner = task_for(space)
    config = TrainConfig(seq_len=16, batch_size=2)
    batches = learner.train_batches(tokens, config, type("D", (), {"rank": 0, "world": 1})())
    assert isinstance(batches, VocabBatches) and batches.sizes == (256, 320, 384)
    for v in space.vocabs:
        b = batches.at(v)(0)
        assert int(b.inputs[0].max()) < v and b.inputs[0].shape == (2, 16)
    assert int(batches.at(256)(0).inputs[0].max()) < 256


def test_held_out_bits_are_per_byte_of_text(space, supernet, vocab):
    """sum of the tokens' loss / the bytes they spell: the unit in which vocabularies compare."""
    data = b"".join(corpus_docs(4))
    subnet = replace(space.largest(), vocab=384)
    ids = vocab.encode(data)
    starts = np.array([0, 40, 90])
    per_token = HeldOut(ids, starts, 16)
    per_byte = HeldOut(ids, starts, 16, token_lengths=vocab.token_lengths())
    assert per_byte.per_byte and not per_token.per_byte
    with torch.no_grad():
        logits = supernet(per_byte.x, subnet)
        nll = torch.nn.functional.cross_entropy(logits.flatten(0, 1), per_byte.y.flatten(), reduction="sum")
    spelled = int(vocab.token_lengths()[per_byte.y.numpy()].sum())
    assert per_byte.bits(supernet, subnet, mixed_precision=False) == pytest.approx(float(nll) / spelled / math.log(2), rel=1e-5)
    ratio = per_token.bits(supernet, subnet, mixed_precision=False) / per_byte.bits(supernet, subnet, mixed_precision=False)
    assert ratio == pytest.approx(spelled / per_byte.y.numel(), rel=1e-5)  # bytes per token
    static = supernet.extract(replace(space.largest(), vocab=320))
    assert model_vocab(static, None, space.vocabs) == 320 and model_vocab(supernet, subnet, space.vocabs) == 384


# --------------------------------------------------------------------------- a model folder


@pytest.fixture(scope="module")
def exported(space, supernet, vocab, tmp_path_factory):
    root = tmp_path_factory.mktemp("subword")
    meta = {"vocabulary": {"kind": "bpe", "sizes": list(space.vocabs), "sha256": vocab.sha256, "json": vocab.text}}
    ckpt = save_checkpoint(root / "ck.pt", supernet, {}, step=1, **meta)
    subnet = replace(space.largest(), vocab=320)
    (root / "s.yaml").write_text(subnet.to_yaml())
    assert main(["export", str(ckpt), "--subnet", str(root / "s.yaml"), "--out", str(root / "model"), "--format", "onnx",
                 "--no-eval"]) == 0
    return root / "model"


def test_the_folder_carries_its_tokenizer_and_the_onnx_names_it(exported, vocab):
    card = json.loads((exported / "model_card.json").read_text())
    text = (exported / "tokenizer.json").read_text(encoding="utf-8")
    assert text == vocab.at(320).text
    sha = Vocabulary(text).sha256
    assert card["tokenizer"] == {"file": "tokenizer.json", "kind": "bpe", "vocab": 320, "sha256": sha,
                                 "metadata": f"bpe:320:sha256={sha}"}
    meta = {p.key: p.value for p in onnx.load(str(exported / "model.onnx")).metadata_props}
    assert meta["nas.tokenizer"] == f"bpe:320:sha256={sha}" and meta["nas.vocab_size"] == "320"
    from nas.report import build

    assert f"tokenizer: <b>byte-level BPE of 320 ids</b> (tokenizer.json, sha256 {sha[:16]})" in build(exported)


def test_generate_runs_from_the_folder_alone(exported, tmp_path, capsys):
    alone = tmp_path / "alone"
    shutil.copytree(exported, alone)  # no corpus, no tokenizer cache, no checkpoint beside it
    assert main(["generate", "--model", str(alone), "--prompt", "def value(", "--max-new-tokens", "12",
                 "--temperature", "0"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("def value(") and len(out.encode()) > len("def value(") + 12  # 12 tokens spell more bytes


def _rewrite(folder, name: str, text: str) -> None:
    """Replace a file of a model folder and its checksum in the card (what a hand edit of both does)."""
    from supernet.files import sha256_file

    (folder / name).write_text(text, encoding="utf-8")
    card = json.loads((folder / "model_card.json").read_text())
    card["files"][name] = sha256_file(folder / name)
    (folder / "model_card.json").write_text(json.dumps(card))


@pytest.mark.parametrize("case", ["not-a-tokenizer", "larger-than-embedding", "other-than-onnx"])
def test_a_bad_tokenizer_in_a_folder_is_one_line(case, exported, vocab, tmp_path, capsys):
    folder = tmp_path / case
    shutil.copytree(exported, folder)
    if case == "not-a-tokenizer":
        text, expected = '{"model": {"type": "Unigram"}}', f"{folder / 'tokenizer.json'}: not a tokenizer.json of a BPE"
    elif case == "larger-than-embedding":
        text = vocab.text
        expected = f"{folder / 'tokenizer.json'}: a vocabulary of 384 ids, larger than the model's embedding (320 rows)"
    else:  # the same size, another tokenizer (its last merge another): the ONNX file names the one exported with
        doc = json.loads(vocab.at(319).text)
        doc["model"]["merges"].append(["q", "z"])
        doc["model"]["vocab"]["qz"] = 319
        text = json.dumps(doc, ensure_ascii=False, separators=(",", ":"))
        expected = f"{folder / 'model.onnx'}: its metadata nas.tokenizer is 'bpe:320:sha256="
    _rewrite(folder, "tokenizer.json", text)
    assert main(["generate", "--model", str(folder), "--prompt", "x", "--max-new-tokens", "2"]) == 2
    err = capsys.readouterr().err.strip()
    assert expected in err and len(err.splitlines()) == 1, err


def test_the_latency_features_count_the_subnets_vocabulary(space):
    from latency.features import additive_terms, flops, table_features

    w = space.workload("prefill")
    small, large = (replace(space.largest(), vocab=v) for v in (320, 384))
    t, e = w.batch_size * w.tokens, small.embed_dim
    assert flops(space, large, w) - flops(space, small, w) == pytest.approx(2.0 * t * e * (384 - 320))
    assert additive_terms(space, large, w)["model:head"] - additive_terms(space, small, w)["model:head"] == t * e * 64
    row = table_features(space, large, w)
    assert row["vocab"] == 384 and row["params"] - table_features(space, small, w)["params"] == 64 * e


def test_the_search_fitness_scores_each_subnet_on_its_vocabularys_windows(space, supernet, vocab):
    """InheritedLoss over a corpus read at every vocabulary: a subnet of 256 ids reads byte windows, one of 384 the
    BPE's; the separability report (per-window scores) asks each its own windows."""
    from nas.search.fitness import separability
    from supernet.scoring import InheritedLoss

    data = b"".join(corpus_docs(8))
    tokens = Tokens({v: vocab.at(v).encode(data).astype(np.uint16) for v in space.vocabs}, vocab.token_lengths())
    fit = InheritedLoss(supernet, tokens, seq_len=16, windows=4, batch_size=4)
    subnets = [replace(space.smallest(), vocab=v) for v in space.vocabs]
    scores = fit(subnets)
    assert scores.shape == (3,) and np.isfinite(scores).all()
    assert fit.description["vocabularies"] == {str(v): fit.heldouts[v].tokens for v in space.vocabs}
    assert fit.held(supernet, subnets[0]) is fit.heldouts[256] and int(fit.heldouts[256].x.max()) < 256
    report = separability(fit, subnets)  # the mean of each subnet's per-window bits per byte, on its own windows
    own = [fit.held(supernet, s).window_bits(supernet, s, 4, mixed_precision=False).mean() for s in subnets]
    assert report["means"] == pytest.approx(own, rel=1e-6) and report["means"][0] == pytest.approx(scores[0], rel=1e-6)
    with pytest.raises(UserError, match=r"token 383 is outside the vocabulary of space 'tiny-bpe-test' \(320\)"):
        bad = np.concatenate([tokens.at(320)[:40], np.array([383], dtype=np.uint16)])  # an id of the larger vocabulary
        InheritedLoss(supernet, Tokens({320: bad}, vocab.token_lengths()), seq_len=16, windows=2)
