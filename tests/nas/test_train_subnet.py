"""nas train-subnet: exact resume after kill -9, inherited weights equal extract's, equal token budgets, the card, bad input."""

import json
import os
import shutil
import signal
from dataclasses import replace

import pytest
import torch
import torch.multiprocessing as mp

import supernet.train as supernet_train
from nas.cli import main
from nas.train_subnet import train_subnet
from supernet.runs import SubnetTraining, resumable, stored_settings
from supernet.scoring import Scoring, validation_bpb
from tasks.stack.train import initial_model
from search_spaces import Subnet, UserError, parse_space
from supernet import SuperTransformer, extract, load_model
from supernet.artifact import read_card
from supernet.checkpoint import save_checkpoint
from supernet.data import prepare_corpus
from supernet.train import TrainConfig

from tests.supernet.test_data import write_docs
from tests.supernet.test_train import MICRO

A = Subnet(24, 2, (2, 1), (64, 32), ("softmax", "linear"))
B = Subnet(16, 1, (1,), (32,), ("local:8",))
CONFIG = TrainConfig(batch_size=4, seq_len=16, lr=1e-3, min_lr=1e-4, warmup_steps=2, eval_interval=4, eval_batches=2,
                     ckpt_interval=3, log_interval=1, max_steps=10)
SCORING = Scoring(windows=8, seq_len=16, batch_size=8)
STEP = CONFIG.batch_size * CONFIG.seq_len  # tokens per step


@pytest.fixture(autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def micro():
    return parse_space(MICRO, where="micro.yaml")


@pytest.fixture(scope="module")
def files(micro, tmp_path_factory):
    """A space file, a corpus, subnet files, a supernet checkpoint of micro and one of another space (tiny)."""
    root = tmp_path_factory.mktemp("train-subnet")
    (root / "micro.yaml").write_text(MICRO)
    write_docs(root / "docs", n=10)
    for name, subnet in (("a", A), ("b", B)):
        (root / f"{name}.yaml").write_text(subnet.to_yaml())
    (root / "outside.yaml").write_text(replace(A, embed_dim=20).to_yaml())
    save_checkpoint(root / "micro.pt", SuperTransformer(micro, generator=torch.Generator().manual_seed(1)), {}, step=7)
    from search_spaces import load_space

    save_checkpoint(root / "tiny.pt", SuperTransformer(load_space("tiny")), {}, step=0)
    return root


def settings(micro, files, out, subnet=A, **changes):
    base = dict(data=str(files / "docs"), config=CONFIG, formats=(), val_fraction=0.2, scoring=SCORING)
    return SubnetTraining(space=micro, subnet=subnet, out=out, **{**base, **changes})


def cli(files, out, *extra):
    return ["train-subnet", str(files / "a.yaml"), "--space", str(files / "micro.yaml"), "--out", str(out), "--data",
            str(files / "docs"), "--val-fraction", "0.2", "--batch-size", "4", "--seq-len", "16", "--lr", "1e-3", "--min-lr",
            "1e-4", "--lr-warmup", "2", "--eval-interval", "4", "--eval-batches", "2", "--ckpt-interval", "3", "--threads", "1",
            *extra]


def weights(out):
    return load_model(out).state_dict()


# --------------------------------------------------------------------------- resume


def _train_and_die(space_text, files, out, kill_at):
    torch.set_num_threads(1)
    space = parse_space(space_text, where="micro.yaml")

    def die(info):
        if info.step == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)  # no cleanup, no last checkpoint

    train_subnet(settings(space, files, out), progress=die)


def test_kill_9_then_resume_equals_an_uninterrupted_run(micro, files, tmp_path, capsys):
    straight = train_subnet(settings(micro, files, tmp_path / "straight"))
    assert (straight.steps, straight.tokens, straight.stopped) == (10, 10 * STEP, "max_steps")

    killed = tmp_path / "killed"
    child = mp.get_context("spawn").Process(target=_train_and_die, args=(MICRO, files, killed, 8))
    child.start()
    child.join(120)
    assert child.exitcode == -signal.SIGKILL
    assert torch.load(killed / "train" / "latest.pt", weights_only=True)["meta"]["step"] == 6  # ckpt_interval 3; died at 8
    assert resumable(killed) and not (killed / "model_card.json").exists()
    stored = stored_settings(killed)  # what the CLI's --resume starts from
    assert replace(stored, resume=False) == settings(micro, files, killed)

    assert main(["train-subnet", "--out", str(killed), "--resume", "--threads", "1"]) == 0  # the run's settings from latest.pt
    assert "trained 10 steps (640 tokens)" in capsys.readouterr().out
    a, b = weights(tmp_path / "straight"), weights(killed)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    opt_a, opt_b = (torch.load(d / "train" / "final.pt", weights_only=True)["state"]["optimizer"]["state"]
                    for d in (tmp_path / "straight", killed))
    assert all(torch.equal(opt_a[i][k], opt_b[i][k]) for i in opt_a for k in opt_a[i])
    card = read_card(killed)["training"]
    assert card["bits_per_byte_after"] == straight.val_bpb and card["steps"] == 10
    steps = [json.loads(line)["step"] for line in (killed / "train" / "log.jsonl").read_text().splitlines() if '"train"' in line]
    assert steps == list(range(1, 11))  # steps 7 and 8 of the killed run were dropped and redone

    # A rerun of the finished run returns its result without training again.
    def no_training(*args, **kwargs):
        raise AssertionError("a finished run should not train again")

    original = supernet_train.train
    supernet_train.train = no_training
    try:
        again = train_subnet(replace(settings(micro, files, killed), resume=True))
    finally:
        supernet_train.train = original
    assert (again.steps, again.tokens, again.val_bpb) == (10, 10 * STEP, straight.val_bpb)


def test_resume_refuses_other_settings_and_extends_a_run(micro, files, tmp_path, capsys):
    out = tmp_path / "run"
    assert main(cli(files, out, "--max-steps", "3", "--format", "torch")) == 0
    capsys.readouterr()
    for extra, message in (
        (("--lr", "0.01"), "--resume: --lr 0.01 differs from the run's 0.001"),
        (("--seed", "3"), "--seed 3 differs from the run's 0"),
        (("--init", f"supernet:{files / 'micro.pt'}"), f"--init supernet:{files / 'micro.pt'} differs from the run's scratch"),
        (("--data-seed", "2"), "--data-seed 2 differs from the run's 0"),
    ):
        assert main(["train-subnet", "--out", str(out), "--resume", *extra]) == 2
        err = capsys.readouterr().err
        assert message in err and len(err.strip().splitlines()) == 1, err
    assert main(["train-subnet", str(files / "b.yaml"), "--out", str(out), "--resume"]) == 2
    assert f"trains {A} of space 'micro'" in capsys.readouterr().err
    assert main(cli(files, out, "--max-steps", "3")) == 2
    assert "already holds a training run (train/latest.pt); add --resume" in capsys.readouterr().err

    # the bounds may change: 3 more steps, continued from the stored state
    assert main(["train-subnet", "--out", str(out), "--resume", "--tokens", str(6 * STEP)]) == 0
    assert "trained 6 steps" in capsys.readouterr().out
    card = read_card(out)["training"]
    assert (card["steps"], card["token_budget"], card["train_config"]["max_steps"]) == (6, 6 * STEP, 6)


# --------------------------------------------------------------------------- inherited weights


def test_init_supernet_starts_from_the_extracted_weights(micro, files, tmp_path):
    supernet = SuperTransformer(micro, generator=torch.Generator().manual_seed(1))  # the weights in micro.pt
    extracted = extract(supernet, A)
    s = settings(micro, files, tmp_path / "inherited", init=f"supernet:{files / 'micro.pt'}", tokens=2 * STEP)
    start = initial_model(s).state_dict()
    assert start.keys() == extracted.state_dict().keys()
    assert all(torch.equal(start[k], v) for k, v in extracted.state_dict().items())
    scratch = initial_model(replace(s, init="scratch")).state_dict()
    assert not all(torch.equal(scratch[k], v) for k, v in extracted.state_dict().items())

    # The run's "before" figure is the extracted model's, scored on the same windows, before any step.
    result = train_subnet(s)
    corpus = prepare_corpus(str(files / "docs"), tmp_path / "inherited" / "train", val_fraction=0.2)
    before = validation_bpb(extracted, micro, corpus.val, SCORING)["bits_per_byte"]
    card = read_card(tmp_path / "inherited")
    assert result.val_bpb_before == before == card["training"]["bits_per_byte_before"]
    assert card["training"]["init"] == f"supernet:{files / 'micro.pt'}" and card["source"]["step"] == 7
    assert result.steps == 2 and result.val_bpb != before

    # model:DIR continues an exported model of the same subnet
    again = train_subnet(settings(micro, files, tmp_path / "continued", init=f"model:{tmp_path / 'inherited'}", tokens=STEP))
    assert again.val_bpb_before == result.val_bpb
    with pytest.raises(UserError, match=r"holds d24 L2 .*, not the subnet to train \(d16 L1"):
        train_subnet(settings(micro, files, tmp_path / "x", subnet=B, init=f"model:{tmp_path / 'inherited'}"))
    shutil.rmtree(tmp_path / "inherited" / "train")  # a model folder without its run is not overwritten
    with pytest.raises(UserError, match="already holds a model .model_card.json. and no training run"):
        train_subnet(s)


# --------------------------------------------------------------------------- token budgets


def test_equal_token_budgets_train_two_subnets_on_the_same_batches(micro, files, tmp_path, monkeypatch):
    seen = []
    real_batch = supernet_train.Trainer.batch

    def recording_batch(self, plan=None):
        batch = real_batch(self, plan)  # (a supernet.task.Batch: the model's inputs, the windows here)
        seen[-1].append(batch.inputs[0].clone())
        return batch

    monkeypatch.setattr(supernet_train.Trainer, "batch", recording_batch)
    budget = 5 * STEP + 7  # not a whole number of steps: the remainder is not trained on
    results = []
    for name, subnet in (("a", A), ("b", B)):
        seen.append([])
        results.append(train_subnet(settings(micro, files, tmp_path / name, subnet=subnet, tokens=budget)))
    assert [(r.steps, r.tokens) for r in results] == [(5, 5 * STEP)] * 2
    assert len(seen[0]) == 5 and all(torch.equal(x, y) for x, y in zip(*seen))
    cards = [read_card(tmp_path / name)["training"] for name in ("a", "b")]
    for card in cards:
        assert (card["token_budget"], card["steps"], card["tokens"], card["seed"]) == (budget, 5, 5 * STEP, 0)
    assert cards[0]["corpus_hash"] == cards[1]["corpus_hash"] and results[0].val_bpb != results[1].val_bpb
    # Another seed draws other windows.
    seen.append([])
    train_subnet(settings(micro, files, tmp_path / "seed1", tokens=budget, config=replace(CONFIG, seed=1)))
    assert not torch.equal(seen[0][0], seen[2][0])


# --------------------------------------------------------------------------- the model folder


def test_cli_writes_an_export_folder_with_its_card(micro, files, tmp_path, capsys):
    out = tmp_path / "model"
    assert main(cli(files, out, "--tokens", "0.32k", "--init", f"supernet:{files / 'micro.pt'}", "--distill-from",
                    f"supernet:{files / 'micro.pt'}")) == 0
    stdout = capsys.readouterr().out
    card = read_card(out)
    t = card["training"]
    assert "trained 5 steps (320 tokens)" in stdout and f"-> {t['bits_per_byte_after']:.4f}" in stdout
    assert {"model.safetensors", "model.pt2", "model.onnx"} <= set(card["files"])
    assert card["onnx"]["parity_max_abs"] <= 1e-4 and card["subnet"] == A.to_dict()
    assert (t["init"], t["token_budget"], t["steps"], t["tokens"], t["seed"]) == (
        f"supernet:{files / 'micro.pt'}", 320, 5, 320, 0)
    assert (t["teacher"], t["distill"], t["stopped"]) == (f"supernet:{files / 'micro.pt'}", 0.5, "max_steps")
    corpus = prepare_corpus(str(files / "docs"), out / "train", val_fraction=0.2)
    assert t["corpus_hash"] == corpus.hash and t["data"] == str(files / "docs")
    assert (t["space_hash"], t["arch_hash"]) == (micro.hash, micro.arch_hash)
    assert t["train_config"]["batch_size"] == 4 and t["train_config"]["max_steps"] == 5
    assert len(t["init_sha256"]) == 64 and t["versions"]["torch"] == torch.__version__
    # the card's figure is the saved model's bits/byte on the search's windows of the validation split
    bpb = validation_bpb(load_model(out), micro, corpus.val, Scoring())["bits_per_byte"]
    assert card["validation"]["bits_per_byte"] == t["bits_per_byte_after"] == bpb


# --------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    "extra, message",
    [
        (("--subnet-file", "outside.yaml"), "outside.yaml: not in space 'micro' ({space}): embed_dim: 20 is not one of 16, 24"),
        (("--tokens", "63"), "--tokens: 63 is below one step of 4 x 16 = 64 tokens (--batch-size x --seq-len); give at least 64"),
        (("--init", "supernet:{files}/tiny.pt"), "--init supernet:{files}/tiny.pt: trained on space 'tiny' (arch hash {tiny}), "
                                                 "not on space 'micro' (arch hash {micro}, {space})"),
        (("--init", "checkpoint:x.pt"), "--init: 'checkpoint:x.pt' is not one of scratch, supernet:CKPT, model:DIR"),
        (("--init", "model:{files}/nothing"), "{files}/nothing: no such model directory"),
        (("--resume",), "--resume: {out} holds no checkpoint (train/latest.pt); start a new run without --resume"),
        (("--tokens", "1M", "--max-steps", "4"), "--tokens 1M and --max-steps 4: give one"),
        (("--tokens", "2.5x"), "--tokens: '2.5x' is not a token budget"),
        (("--distill", "0.5"), "--distill: 0.5 needs a teacher (--distill-from supernet:CKPT)"),
        (("--distill-from", "{files}/micro.pt"), "--distill-from: '{files}/micro.pt' is not one of supernet:CKPT"),
        (("--seq-len", "64"), "--seq-len: 64 exceeds the space's max_seq_len 32"),
    ],
)
def test_bad_input_is_one_line_exit_2_and_writes_nothing(micro, files, tmp_path, capsys, extra, message):
    from search_spaces import load_space

    out = tmp_path / "out"
    fill = {"files": files, "out": out, "space": files / "micro.yaml", "micro": micro.arch_hash,
            "tiny": load_space("tiny").arch_hash}
    extra = [e.format(**fill) for e in extra]
    argv = cli(files, out, *([] if "--tokens" in extra else ["--max-steps", "2"]))
    if extra[0] == "--subnet-file":
        argv[1], extra = str(files / extra[1]), []
    assert main(argv + extra) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and message.format(**fill) in err, err
    assert not out.exists()
