"""The masked-LM task (issue 17): batches, losses and held-out scoring of ``tasks.masked_lm.learner.MaskedLM``, sandwich
training of an encoder supernet with exact resume, and the ``--mask-rate`` flag of train-supernet / train-subnet."""

import json

import numpy as np
import pytest
import torch
import torch.multiprocessing as mp

from nas.cli import main
from search_spaces import UserError, load_space, parse_space
from supernet import SuperTransformer, extract
from supernet.data import prepare_corpus
from supernet.distributed import Dist
from tasks.masked_lm.masking import IGNORE, MASK_BYTE
from supernet.task import task_for
from tasks.causal_lm.learner import CAUSAL_LM
from tasks.masked_lm.learner import MaskedLM
from supernet.train import PlainObjective, SandwichObjective, SupernetCheckpointer, TrainConfig, evaluate_bpb, train

from tests.supernet.test_data import write_docs
from tests.supernet.test_train import max_diff, one_thread, state_of  # noqa: F401  (one_thread: autouse)

ENCODER = """\
name: micro-encoder
task: masked-lm
vocab_size: 256
max_seq_len: 32
head_dim: 8
positions: rope
embed_dim: [16, 24]
depth: [1, 2]
layers: {heads: [1, 2], ffn_dim: [32, 64], attention: [softmax, 'local:8', linear]}
latency: {prefill: {batch_size: 1, seq_len: 32}}
"""
CONFIG = dict(batch_size=4, seq_len=16, warmup_steps=2, eval_interval=4, eval_batches=2, ckpt_interval=3, log_interval=1)


@pytest.fixture(scope="module")
def encoder():
    return parse_space(ENCODER, where="micro-encoder.yaml")


@pytest.fixture(scope="module")
def docs(tmp_path_factory):
    return write_docs(tmp_path_factory.mktemp("data") / "docs", n=10)


@pytest.fixture(scope="module")
def space_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("space") / "micro-encoder.yaml"
    path.write_text(ENCODER)
    return path


TOKENS = np.frombuffer(bytes(range(200)) * 40, dtype=np.uint8)


# --------------------------------------------------------------------------- the task


def test_task_follows_the_space_and_refuses_a_bad_mask_rate(encoder, tiny):
    task = task_for(encoder, seed=3, mask_rate=0.3)
    assert isinstance(task, MaskedLM) and task.masking.rate == 0.3 and task.seed == 3
    assert task_for(encoder).masking.rate == 0.15
    assert task_for(tiny) is CAUSAL_LM
    for bad in (0.0, 1.0, -0.1, 1.5, float("nan")):
        with pytest.raises(UserError, match=r"^--mask-rate: .* is not a fraction strictly between 0 and 1"):
            task_for(encoder, mask_rate=bad)
    with pytest.raises(UserError, match=r"^--mask-rate: only for a masked-lm space; .* is task causal-lm"):
        task_for(tiny, mask_rate=0.15)


def test_batch_masks_are_seeded_per_step_and_the_same_whatever_the_ranks():
    task = MaskedLM(seed=1)
    starts = np.array([0, 100, 900, 3000])
    x, y = task.batch(TOKENS, starts, slice(0, 4), 40, step=5)  # (4, 40) each
    assert x.shape == y.shape == (4, 40)
    chosen = y != IGNORE
    assert chosen.sum(1).tolist() == [6] * 4  # round(0.15 * 40) per window
    windows = torch.from_numpy(np.stack([TOKENS[s : s + 40] for s in starts]).astype(np.int64))
    assert torch.equal(y[chosen], windows[chosen]) and torch.equal(x[~chosen], windows[~chosen])  # targets: the bytes
    assert (x[chosen] == MASK_BYTE).any() and not (x == MASK_BYTE).all()
    # two ranks, two rows each: the rows of the global batch, masks included (DDP sees what one process sees)
    halves = [task.batch(TOKENS, starts, slice(r * 2, r * 2 + 2), 40, step=5) for r in (0, 1)]
    assert torch.equal(torch.cat([h[0] for h in halves]), x) and torch.equal(torch.cat([h[1] for h in halves]), y)
    again = task.batch(TOKENS, starts, slice(0, 4), 40, step=5)
    assert torch.equal(again[0], x) and torch.equal(again[1], y)  # a function of (seed, step): resume sees the same
    assert not torch.equal(task.batch(TOKENS, starts, slice(0, 4), 40, step=6)[1], y)
    assert not torch.equal(MaskedLM(seed=2).batch(TOKENS, starts, slice(0, 4), 40, step=5)[1], y)


def test_loss_and_distillation_score_the_chosen_positions_only():
    task = MaskedLM(seed=0)
    x, y = task.batch(TOKENS, np.array([0, 50]), slice(0, 2), 20, step=0)
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 20, 256, generator=g)
    teacher = torch.randn(2, 20, 256, generator=g).log_softmax(-1)
    chosen = y != IGNORE
    other = logits.clone()
    other[~chosen] += torch.randn(int((~chosen).sum()), 256, generator=g)  # change what is not scored
    for a, b in ((task.loss(logits, y), task.loss(other, y)),
                 (task.kl(logits.log_softmax(-1), teacher, y), task.kl(other.log_softmax(-1), teacher, y))):
        assert float(a) == pytest.approx(float(b), abs=1e-6)
    # the loss is the mean cross-entropy over the chosen positions, the KL its mean per chosen position
    logp = logits.log_softmax(-1)[chosen]  # (N, V)
    assert float(task.loss(logits, y)) == pytest.approx(float(-logp.gather(1, y[chosen][:, None]).mean()), rel=1e-5)
    kl = (teacher[chosen].exp() * (teacher[chosen] - logp)).sum(-1).mean()
    assert float(task.kl(logits.log_softmax(-1), teacher, y)) == pytest.approx(float(kl), rel=1e-5)
    assert float(task.loss(other, y)) != pytest.approx(float(CAUSAL_LM.loss(other, y.clamp(min=0))), abs=1e-3)


def test_heldout_masks_are_fixed_by_the_seed_and_the_extracted_model_agrees(encoder):
    model = SuperTransformer(encoder, generator=torch.Generator().manual_seed(0))
    subnet = encoder.sample(np.random.default_rng(4))
    task = MaskedLM(seed=1)
    a = evaluate_bpb(model, subnet, TOKENS, 4, 32, 2, seed=1, task=task)
    assert a == evaluate_bpb(model, subnet, TOKENS, 4, 32, 2, seed=1, task=task)  # the same windows and masks
    assert a != evaluate_bpb(model, subnet, TOKENS, 4, 32, 2, seed=1, task=MaskedLM(seed=2))  # other masks
    assert abs(a - 8.0) < 0.3  # untrained: about uniform over 256 bytes
    held = task.heldout(TOKENS, np.array([0, 7, 300]), 32)
    assert held.tokens == 3 * round(0.15 * 32) and (held.x == MASK_BYTE).any()
    assert abs(evaluate_bpb(extract(model, subnet), None, TOKENS, 4, 32, 2, seed=1, task=task) - a) < 1e-5


def test_encoder_base_is_a_bert_base_scale_encoder_space():
    from supernet.attention import get
    from supernet.model import Transformer, TransformerConfig

    space = load_space("encoder-base")
    largest = space.largest()
    assert space.task == "masked-lm" and not space.causal and space.max_seq_len == 512 and space.head_dim == 64
    assert (largest.embed_dim, largest.depth, max(largest.heads), max(largest.ffn_dim)) == (768, 12, 12, 3072)
    assert [(w.kind, w.batch_size, w.seq_len) for w in space.workloads] == [("prefill", 1, 512)]
    assert all("bidirectional" in get(a).forms for a in space.attention)
    with torch.device("meta"):
        model = Transformer(TransformerConfig.from_subnet(space, largest))
    # BERT-base's encoder stack: 12 x (4 x 768^2 + 2 x 768 x 3072) weights plus biases, norms and a byte embedding
    assert 85_000_000 < model.num_params() < 86_000_000 and not model.config.causal


# --------------------------------------------------------------------------- training


def run(space, docs, out, max_steps, resume=False, progress=None, rate=0.15, dist=Dist(), batch_size=4):
    corpus = prepare_corpus(str(docs), out, seed=0, val_fraction=0.2)
    model = SuperTransformer(space, generator=torch.Generator().manual_seed(0))
    task = task_for(space, seed=0, mask_rate=rate)
    meta = {"data": str(docs), "data_seed": 0, "val_fraction": 0.2, "corpus_hash": corpus.hash}
    config = TrainConfig(**{**CONFIG, "batch_size": batch_size}, max_steps=max_steps)
    result = train(
        model, SandwichObjective(space, seed=0, task=task), corpus.train, corpus.val, config,
        out=out, checkpointer=SupernetCheckpointer(space), meta=meta, resume=resume, progress=progress, dist=dist,
    )
    return model, result


class Crash(Exception):
    pass


def test_masked_lm_sandwich_training_resumes_exactly(encoder, docs, tmp_path):
    _, straight = run(encoder, docs, tmp_path / "straight", max_steps=8)
    assert set(straight.evals[-1]["bpb"]) == {"largest", "smallest", "random0", "random1", "random2"}

    def crash(info):
        if info.step == 5:
            raise Crash  # after the checkpoint of step 3, before the one of step 6: no last checkpoint
    with pytest.raises(Crash):
        run(encoder, docs, tmp_path / "crashed", max_steps=8, progress=crash)
    assert torch.load(tmp_path / "crashed" / "latest.pt", weights_only=True)["meta"]["step"] == 3
    _, resumed = run(encoder, docs, tmp_path / "crashed", max_steps=8, resume=True)
    assert resumed.step == 8
    model_a, opt_a = state_of(tmp_path / "straight" / "final.pt")
    model_b, opt_b = state_of(tmp_path / "crashed" / "final.pt")
    assert max_diff(model_a, model_b) <= 1e-6
    assert max(max_diff(opt_a[i], opt_b[i]) for i in opt_a) <= 1e-6
    assert straight.evals[-1]["bpb"] == pytest.approx(resumed.evals[-1]["bpb"], abs=1e-6)
    meta = torch.load(tmp_path / "straight" / "final.pt", weights_only=True)["meta"]
    assert meta["objective"]["task"] == "masked-lm" and meta["objective"]["mask_rate"] == 0.15


def _rank(rank, world, docs, out, store):
    torch.set_num_threads(1)
    torch.distributed.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    model, _ = run(parse_space(ENCODER), docs, out / f"rank{rank}", max_steps=3, batch_size=8, dist=Dist(rank, world, rank))
    torch.save(model.state_dict(), out / f"weights{rank}.pt")
    torch.distributed.destroy_process_group()


def test_two_ranks_over_gloo_train_the_encoder_as_one_process(encoder, docs, tmp_path):
    """Each rank masks its rows of the global batch: two ranks of 4 windows compute what one process does with 8."""
    mp.spawn(_rank, args=(2, docs, tmp_path, tmp_path / "store"), nprocs=2, join=True)
    r0, r1 = (torch.load(tmp_path / f"weights{r}.pt", weights_only=True) for r in (0, 1))
    assert max_diff(r0, r1) == 0.0
    single, _ = run(encoder, docs, tmp_path / "single", max_steps=3, batch_size=8)
    assert max_diff(r0, single.state_dict()) <= 1e-5


def test_masked_lm_training_learns_and_a_static_model_trains_on_the_same_task(encoder, docs, tmp_path):
    corpus = prepare_corpus(str(docs), tmp_path, val_fraction=0.2)
    task = task_for(encoder, seed=0)
    static = extract(SuperTransformer(encoder, generator=torch.Generator().manual_seed(0)), encoder.largest())
    before = evaluate_bpb(static, None, corpus.val, 4, 16, 2, seed=0, task=task)
    config = TrainConfig(**{**CONFIG, "eval_interval": 40}, max_steps=40)
    result = train(static, PlainObjective(task), corpus.train, corpus.val, config)
    assert result.evals[-1]["bpb"]["model"] < before - 1.0  # the masked bytes of this corpus are learnable


# --------------------------------------------------------------------------- the CLI


@pytest.mark.parametrize("rate", ["0", "1", "1.5", "-0.2", "nan"])
def test_cli_refuses_a_mask_rate_outside_0_1_in_one_line_and_writes_nothing(space_file, tmp_path, capsys, rate):
    code = main(["train-supernet", str(space_file), "--out", str(tmp_path / "run"), "--max-steps", "1", "--mask-rate", rate])
    assert code == 2 and not (tmp_path / "run").exists()
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--mask-rate" in err[0] and "Traceback" not in err[0], err


def test_cli_trains_an_encoder_and_resume_keeps_its_mask_rate(space_file, docs, tmp_path, capsys):
    out = tmp_path / "run"
    args = ["--data", str(docs), "--batch-size", "4", "--seq-len", "16", "--eval-batches", "1", "--threads", "1"]
    assert main(["train-supernet", str(space_file), "--out", str(out), "--max-steps", "2", "--mask-rate", "0.25", *args]) == 0
    printed = capsys.readouterr().out
    assert "validation bits/masked byte at step 2: largest " in printed
    assert torch.load(out / "final.pt", weights_only=True)["meta"]["objective"]["mask_rate"] == 0.25
    assert main(["train-supernet", "--out", str(out), "--resume", "--mask-rate", "0.15"]) == 2
    assert "--mask-rate 0.15 differs from the run's 0.25" in capsys.readouterr().err
    assert main(["train-supernet", "--out", str(out), "--resume", "--max-steps", "3"]) == 0
    assert "trained 3 steps" in capsys.readouterr().out
    assert main(["train-supernet", "tiny", "--out", str(tmp_path / "causal"), "--mask-rate", "0.2"]) == 2
    assert "--mask-rate: only for a masked-lm space" in capsys.readouterr().err
    assert not (tmp_path / "causal").exists()


def test_cli_train_subnet_trains_an_encoder_and_its_card_says_bits_per_masked_byte(space_file, docs, tmp_path, capsys):
    space = load_space(str(space_file))
    subnet = tmp_path / "s.yaml"
    subnet.write_text(space.smallest().to_yaml())
    out = tmp_path / "one"
    assert main(["train-subnet", str(subnet), "--space", str(space_file), "--out", str(out), "--mask-rate", "2",
                 "--tokens", "512"]) == 2
    assert "--mask-rate: 2.0 is not a fraction" in capsys.readouterr().err and not out.exists()
    assert main(["train-subnet", str(subnet), "--space", str(space_file), "--out", str(out), "--data", str(docs),
                 "--batch-size", "4", "--seq-len", "16", "--tokens", "256", "--format", "onnx", "--threads", "1"]) == 0
    assert "validation bits/masked byte" in capsys.readouterr().out
    card = json.loads((out / "model_card.json").read_text())
    assert card["validation"]["task"] == "masked-lm" and card["validation"]["metric"] == "bits/masked byte"
    assert card["validation"]["mask_rate"] == 0.15 and card["onnx"]["parity_max_abs"] <= 1e-4


# --------------------------------------------------------------------------- search and export


def test_search_and_export_an_encoder_score_bits_per_masked_byte(encoder, space_file, docs, tmp_path, capsys):
    from nas.search.fitness import InheritedLoss
    from search_spaces import Subnet
    from supernet.checkpoint import load_supernet

    from tests.latency.test_workloads import fit_predictor

    run_dir = tmp_path / "sn"
    assert main(["train-supernet", str(space_file), "--out", str(run_dir), "--data", str(docs), "--batch-size", "4",
                 "--seq-len", "16", "--max-steps", "3", "--mask-rate", "0.2", "--threads", "1"]) == 0
    space = load_space(str(space_file))
    fit_predictor(space, space.workload("prefill"), tmp_path / "pred")
    (tmp_path / "val.txt").write_bytes((docs / "doc00.txt").read_bytes() * 4)
    val = ["--val-data", str(tmp_path / "val.txt"), "--val-windows", "3", "--seq-len", "16"]
    capsys.readouterr()
    assert main(["search", str(run_dir / "final.pt"), *val, "--predictor", str(tmp_path / "pred"), "--budget", "5ms",
                 "--population", "6", "--parents", "2", "--mutations", "3", "--crossovers", "3", "--generations", "2",
                 "--out", str(tmp_path / "search"), "--no-progress"]) == 0
    best_file = tmp_path / "search" / "best_5ms.yaml"
    assert "bits/masked byte with inherited weights" in best_file.read_text()
    best = Subnet.load(best_file)
    summary = json.loads((tmp_path / "search" / "search.json").read_text())
    loss = summary["budgets"]["5ms"]["best"]["loss_bpb"]
    # the search's fitness is bits per masked byte at the trained rate, on fixed masks of the validation seed
    supernet, _ = load_supernet(run_dir / "final.pt")
    tokens = np.frombuffer((tmp_path / "val.txt").read_bytes(), dtype=np.uint8)
    masked = InheritedLoss(supernet, tokens, seq_len=16, windows=3, options={"mask_rate": 0.2})
    assert masked.description["task"] == "masked-lm" and masked.description["mask_rate"] == 0.2
    assert loss == pytest.approx(float(masked([best])[0]), abs=1e-9)
    other = InheritedLoss(supernet, tokens, seq_len=16, windows=3, options={"mask_rate": 0.5})
    assert loss != pytest.approx(float(other([best])[0]))

    assert main(["export", str(run_dir / "final.pt"), "--subnet", str(best_file), "--out", str(tmp_path / "model"),
                 *val, "--format", "onnx"]) == 0
    assert "bits/masked byte" in capsys.readouterr().out
    card = json.loads((tmp_path / "model" / "model_card.json").read_text())
    assert card["validation"]["task"] == "masked-lm" and card["validation"]["metric"] == "bits/masked byte"
    assert card["validation"]["bits_per_byte"] == pytest.approx(loss, abs=1e-5)  # the extracted model scores as the search
    assert card["onnx"]["parity_max_abs"] <= 1e-4
