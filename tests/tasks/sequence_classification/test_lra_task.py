"""The sequence-classification task (issue 41) through the commands: train-supernet on a TSV of one's own, an
exact record of its data and vocabulary, the refusals of bad data in one line, extraction, measure-latency,
fit-predictor, search and export (ONNX parity, accuracy and the vocabulary on the card)."""

import json
import re

import numpy as np
import pytest
import torch

from nas.cli import main

SYMBOLS = list("abcdefgh")
SPACE = """
task: sequence-classification
vocab_size: 16
max_seq_len: 24
head_dim: 8
embed_dim: [16, 24]
depth: [1, 2]
layers: {heads: [1, 2], ffn_dim: [16, 32], attention: [softmax, "local:4", linear]}
latency: {prefill: {batch_size: 1, seq_len: 24}}
"""
TRAIN = ["--batch-size", "16", "--lr", "1e-2", "--lr-warmup", "5", "--eval-interval", "20", "--eval-batches", "2",
         "--ckpt-interval", "20", "--log-interval", "20", "-q"]
QUICK = ["--timing-threads", "1", "--timing-warmup", "1", "--repeats", "2", "--rounds", "1", "--min-sample-ms", "1"]


def rows(n: int, seed: int) -> list[tuple[int, list[str]]]:
    """Class c's sequences are of the symbols whose index is c modulo 3 (a rule every attention type reads at [CLS])."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        c = i % 3
        toks = list(rng.choice(SYMBOLS[c::3], int(rng.integers(4, 20))))
        out.append((c, toks))
    return out


def write(path, examples) -> None:
    path.write_text("".join(f"{y}\t{' '.join(t)}\n" for y, t in examples))


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    root = tmp_path_factory.mktemp("lra-task")
    (root / "space.yaml").write_text(SPACE)
    write(root / "own.tsv", rows(480, 0))
    assert main(["train-supernet", str(root / "space.yaml"), "--data", str(root / "own.tsv"), "--classes", "3",
                 "--out", str(root / "run"), "--max-steps", "60", *TRAIN]) == 0
    return root


def test_train_supernet_learns_and_records_data_and_vocabulary(root, capsys):
    ckpt = torch.load(root / "run" / "final.pt", weights_only=True)
    meta = ckpt["meta"]
    assert (meta["classes"], meta["symbols"], meta["val_fraction"]) == (3, SYMBOLS, 0.1)
    assert meta["corpus_sizes"] == {"train": 432, "val": 48}
    evals = [e for e in map(json.loads, (root / "run" / "log.jsonl").read_text().splitlines()) if e["event"] == "eval"]
    first, last = evals[0]["bpb"]["largest"], evals[-1]["bpb"]["largest"]
    assert last < first and last < 1.0, (first, last)  # log2(3) = 1.58 bits for a guess among 3 classes
    assert main(["train-supernet", "--out", str(root / "run"), "--resume", "--classes", "4", "-q"]) == 2
    assert capsys.readouterr().err == "nas train-supernet: error: --classes 4 differs from the run's 3\n"


def test_bad_data_is_refused_in_one_line(root, tmp_path, capsys):
    space = str(root / "space.yaml")

    def refused(*flags: str) -> str:
        assert main(["train-supernet", space, "--out", str(tmp_path / "r"), "--max-steps", "2", *flags, "-q"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1, err
        return err.removeprefix("nas train-supernet: error: ").strip()

    assert refused().startswith("--data: a sequence-classification space needs data")
    assert refused("--data", str(root / "own.tsv")) == (f"--data {root / 'own.tsv'}: a TSV file of your own needs "
                                                         "--classes N (its labels are 0..N-1)")
    write(tmp_path / "five.tsv", [(0, ["a"]), (1, ["b"]), (5, ["c"])])
    assert refused("--data", str(tmp_path / "five.tsv"), "--classes", "3") == (
        f"{tmp_path / 'five.tsv'} line 3: label 5 is outside the declared classes 0..2")
    (tmp_path / "nolabel.tsv").write_text("0\ta b\n\ta\n")
    assert refused("--data", str(tmp_path / "nolabel.tsv"), "--classes", "2") == (
        f"{tmp_path / 'nolabel.tsv'} line 2: no label (expected 'label<TAB>space-separated tokens')")
    long = rows(40, 1)
    long[17] = (0, ["a"] * 30)
    write(tmp_path / "long.tsv", long)
    assert refused("--data", str(tmp_path / "long.tsv"), "--classes", "3", "--val-fraction", "0.5") == (
        f"{tmp_path / 'long.tsv'} line 18: 30 tokens (+1 for [CLS]) exceed the space's max_seq_len 24")
    write(tmp_path / "wide.tsv", [(i % 3, [f"s{i}"]) for i in range(40)])
    assert refused("--data", str(tmp_path / "wide.tsv"), "--classes", "3") == (
        "the training data needs 45 token ids (3 classes + [CLS] + padding + 40 symbols); the space's vocab_size is 16")
    assert main(["data", "listops", "--out", str(tmp_path / "lo"), "--n", "8", "-q"]) == 0
    capsys.readouterr()
    (tmp_path / "s32.yaml").write_text(SPACE.replace("vocab_size: 16", "vocab_size: 32"))
    space = str(tmp_path / "s32.yaml")  # holds ListOps' 27 ids, not its lengths
    assert re.fullmatch(rf"{re.escape(str(tmp_path / 'lo' / 'train.tsv'))} line \d+: 1,\d\d\d tokens \(\+1 for \[CLS\]\) "
                        r"exceed the space's max_seq_len 24", refused("--data", str(tmp_path / "lo")))
    assert not (tmp_path / "r" / "latest.pt").exists()


def test_extraction_computes_what_the_supernet_computes(root):
    from supernet.checkpoint import load_supernet
    from tasks import get

    supernet, payload = load_supernet(root / "run" / "final.pt")
    task = get("sequence-classification")
    held = task.learner(supernet.space).heldout(task.prepare_data(task.data_record(payload["meta"], "x"), root).val, 8)
    rng = np.random.default_rng(0)
    for subnet in [supernet.space.largest(), supernet.space.smallest(), *(supernet.space.sample(rng) for _ in range(3))]:
        static = supernet.extract(subnet).eval()
        with torch.no_grad():
            assert (static(held.x) - supernet(held.x, subnet)).abs().max().item() <= 1e-5, subnet


def test_measure_latency_search_and_export(root, capsys):
    from supernet import load_model

    assert main(["measure-latency", str(root / "space.yaml"), "--device", "cpu", "--out", str(root / "cpu.csv"),
                 "--samples", "12", "--retest", "0.5", *QUICK, "-q"]) == 0
    assert main(["fit-predictor", str(root / "cpu.csv"), "--models", "additive", "--out", str(root / "pred"), "-q"]) == 0
    capsys.readouterr()
    assert main(["search", str(root / "run" / "final.pt"), "--predictor", str(root / "pred"), "--out", str(root / "search"),
                 "--budget", "1s", "--population", "6", "--parents", "2", "--mutations", "2", "--crossovers", "2",
                 "--generations", "2", "--val-windows", "3", "--eval-batch-size", "16", "--no-progress", "-q"]) == 0
    summary = json.loads((root / "search" / "search.json").read_text())
    assert summary["config"]["fitness"]["task"] == "sequence-classification" and summary["config"]["fitness"]["examples"] == 48
    best = root / "search" / "best_1s.yaml"
    assert main(["export", str(root / "run" / "final.pt"), "--subnet", str(best), "--out", str(root / "model"),
                 "--val-windows", "3", "-q"]) == 0  # 3 x 16: the search's 48 examples
    card = json.loads((root / "model" / "model_card.json").read_text())
    v = card["validation"]
    assert v["metric"] == "bits/label" and v["classes"] == 3 and v["symbols"] == SYMBOLS and v["examples"] == 48
    assert v["accuracy"] > 0.5  # 1/3 by chance
    assert card["onnx"]["parity_max_abs"] <= 1e-4
    loss = [b["best"]["loss_bpb"] for b in summary["budgets"].values()][0]
    assert loss == pytest.approx(v["bits_per_byte"], abs=1e-5)  # the search's score of the found subnet is the card's
    assert load_model(root / "model").num_params() > 0


def test_train_subnet_from_the_supernet_and_resume(root, capsys):
    best = root / "search" / "best_1s.yaml"
    if not best.exists():  # (run alone: the search's subnet is not there; the largest is as good a subnet)
        best = root / "largest.yaml"
        from search_spaces import load_space

        best.write_text(load_space(root / "space.yaml").largest().to_yaml())
    out = root / "sub"
    args = ["train-subnet", str(best), "--space", str(root / "space.yaml"), "--data", str(root / "own.tsv"), "--classes",
            "3", "--init", f"supernet:{root / 'run' / 'final.pt'}", "--out", str(out), "--batch-size", "16", "--lr", "1e-2",
            "--lr-warmup", "2", "--format", "torch", "-q"]
    assert main([*args, "--max-steps", "10"]) == 0
    card = json.loads((out / "model_card.json").read_text())
    v = card["validation"]
    assert v["metric"] == "bits/label" and v["classes"] == 3 and v["symbols"] == SYMBOLS and v["accuracy"] > 0.5
    assert card["training"]["steps"] == 10 and card["training"]["before"]["accuracy"] > 0.5  # the supernet's weights
    assert main(["train-subnet", "--out", str(out), "--resume", "--max-steps", "14", "-q"]) == 0
    assert json.loads((out / "model_card.json").read_text())["training"]["steps"] == 14


def test_train_subnet_distils_from_the_supernets_largest_and_resumes_exactly(root, capsys):
    """``--distill-from``: the teacher's soft targets at [CLS] change what is learned (the same init, seed and batches
    end elsewhere) and are recorded; a distilled run stopped at step 3 and resumed equals the uninterrupted one."""
    import os
    import signal

    from safetensors.torch import load_file

    from search_spaces import load_space
    from supernet.runs import SubnetTraining, TrainingInterrupted
    from supernet.train import TrainConfig
    from tasks.sequence_classification.train import run_subnet_training

    space = load_space(root / "space.yaml")
    teacher = f"supernet:{root / 'run' / 'final.pt'}"
    config = TrainConfig(batch_size=16, lr=1e-2, min_lr=1e-3, warmup_steps=2, max_steps=6, eval_interval=100,
                         eval_batches=2, ckpt_interval=100, log_interval=1, seq_len=24)

    def settings(name, **kw):
        return SubnetTraining(space=space, subnet=space.smallest(), out=root / name, init=teacher, config=config,
                              data=str(root / "own.tsv"), options={"classes": 3}, formats=("torch",), **kw)

    plain = run_subnet_training(settings("plain"))
    taught = run_subnet_training(settings("taught", distill_from=teacher, distill=0.5))
    a, b = (load_file(str(r.out / "model.safetensors")) for r in (plain, taught))
    assert plain.val_bpb_before == taught.val_bpb_before and any(not torch.equal(a[k], b[k]) for k in a)
    card = json.loads((taught.out / "model_card.json").read_text())
    assert (card["training"]["teacher"], card["training"]["distill"]) == (teacher, 0.5)

    def stop(info):
        if info.step == 3:
            os.kill(os.getpid(), signal.SIGINT)

    with pytest.raises(TrainingInterrupted):
        run_subnet_training(settings("cut", distill_from=teacher, distill=0.5), progress=stop)
    again = run_subnet_training(settings("cut", distill_from=teacher, distill=0.5, resume=True))
    c = load_file(str(again.out / "model.safetensors"))
    assert again.steps == 6 and again.val_bpb == taught.val_bpb and all(torch.equal(b[k], c[k]) for k in b)
    capsys.readouterr()
    assert main(["train-subnet", "--out", str(root / "cut"), "--resume", "--distill", "0.9", "-q"]) == 2
    assert "--resume: --distill 0.9 differs from the run's 0.5" in capsys.readouterr().err


# --------------------------------------------------------------------------- self-pretraining (issue 51)


def test_mask_tokens_masks_tokens_only_and_targets_the_originals():
    from supernet.heldout import IGNORE
    from tasks.sequence_classification.learner import mask_tokens

    x = np.array([[3, 7, 8, 9, 4, 4], [3, 9, 9, 4, 4, 4]])  # [CLS]=3, padding=4
    masked, y = mask_tokens(x, np.random.default_rng(0), 0.99, 13, 4)
    assert (masked[:, 0] == 3).all() and (masked[x == 4] == 4).all()  # never [CLS], never padding
    chosen = y != IGNORE
    assert chosen.sum() == 5 and (masked[chosen] == 13).all() and (y[chosen] == x[chosen]).all()
    again, y2 = mask_tokens(x, np.random.default_rng(0), 0.99, 13, 4)
    assert np.array_equal(again, masked) and np.array_equal(y, y2)  # seeded
    none, y3 = mask_tokens(x, np.random.default_rng(0), 1e-9, 13, 4)
    assert (y3 != IGNORE).sum() == 1 and none[0, 1] == 13  # a draw of none still scores one token


def test_self_pretraining_runs_first_restarts_the_schedule_and_resumes_exactly(tmp_path, capsys):
    """``--pretrain-steps 4`` of 8: the first 4 steps denoise the inputs, the schedule warms up again at step 4, the
    objective records it; stopped at step 3 (inside the pretraining) and resumed, the run equals the uninterrupted one;
    a space without a spare token id for the mask is refused in one line."""
    import os
    import signal

    from safetensors.torch import load_file

    from search_spaces import parse_space
    from supernet.runs import SubnetTraining, TrainingInterrupted
    from supernet.train import TrainConfig
    from tasks.sequence_classification.train import run_subnet_training

    write(tmp_path / "own.tsv", rows(240, 0))
    space = parse_space(SPACE, where="space.yaml")
    config = TrainConfig(batch_size=8, lr=1e-2, min_lr=1e-3, warmup_steps=2, max_steps=8, eval_interval=100,
                         eval_batches=2, ckpt_interval=100, log_interval=1, seq_len=24)

    def settings(name, **kw):
        return SubnetTraining(space=space, subnet=space.smallest(), out=tmp_path / name, config=config,
                              data=str(tmp_path / "own.tsv"), options={"classes": 3, "pretrain_steps": 4},
                              formats=("torch",), **kw)

    straight = run_subnet_training(settings("straight"))
    events = [json.loads(line) for line in (tmp_path / "straight" / "train" / "log.jsonl").read_text().splitlines()]
    lr = {e["step"]: e["lr"] for e in events if e["event"] == "train"}
    assert lr[1] == pytest.approx(5e-3) and lr[5] == pytest.approx(5e-3) and lr[4] < lr[3]  # warm-up again at step 4
    assert any(e["event"] == "note" and e["step"] == 4 for e in events)
    final = torch.load(tmp_path / "straight" / "train" / "final.pt", weights_only=True)
    assert final["meta"]["objective"]["pretrain_steps"] == 4 and "masked by" in final["state"]["data"]["sampler"]

    def stop(info):
        if info.step == 3:
            os.kill(os.getpid(), signal.SIGINT)

    with pytest.raises(TrainingInterrupted):
        run_subnet_training(settings("cut"), progress=stop)
    again = run_subnet_training(settings("cut", resume=True))
    a, b = (load_file(str(r.out / "model.safetensors")) for r in (straight, again))
    assert again.steps == 8 and again.val_bpb == straight.val_bpb and all(torch.equal(a[k], b[k]) for k in a)

    (tmp_path / "tight.yaml").write_text(SPACE.replace("vocab_size: 16", "vocab_size: 13"))
    (tmp_path / "small.yaml").write_text(space.smallest().to_yaml())
    capsys.readouterr()
    assert main(["train-subnet", str(tmp_path / "small.yaml"), "--space", str(tmp_path / "tight.yaml"), "--data",
                 str(tmp_path / "own.tsv"), "--classes", "3", "--out", str(tmp_path / "tight"), "--max-steps", "6",
                 "--pretrain-steps", "2", "--batch-size", "8", "-q"]) == 2
    assert capsys.readouterr().err.strip().endswith("--pretrain-steps: the masked denoising needs one token id past the "
                                                    "data's 13 (its mask); the space's vocab_size is 13: give vocab_size "
                                                    "14 or more")


def test_a_supernet_self_pretrains_too_and_its_resume_keeps_the_steps(tmp_path, capsys):
    """``nas train-supernet --pretrain-steps 3`` of 6: the sandwich's first 3 steps denoise the inputs (the schedule
    warms up again at step 3, the checkpoint's objective records it), so a search's supernet learns as its retrained
    models do; resumed with other pretraining steps, it is refused in one line that names the flag."""
    (tmp_path / "space.yaml").write_text(SPACE)
    write(tmp_path / "own.tsv", rows(240, 0))
    base = ["--out", str(tmp_path / "run"), "--batch-size", "8", "--lr", "1e-2", "--lr-warmup", "2", "--eval-interval",
            "100", "--eval-batches", "1", "--ckpt-interval", "100", "--log-interval", "1", "-q"]
    assert main(["train-supernet", str(tmp_path / "space.yaml"), "--data", str(tmp_path / "own.tsv"), "--classes", "3",
                 "--max-steps", "6", "--pretrain-steps", "3", *base]) == 0
    events = [json.loads(line) for line in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    lr = {e["step"]: e["lr"] for e in events if e["event"] == "train"}
    assert lr[1] == pytest.approx(5e-3) and lr[4] == pytest.approx(5e-3) and lr[3] < lr[2]  # warm-up again at step 3
    assert any(e["event"] == "note" and e["step"] == 3 for e in events)
    final = torch.load(tmp_path / "run" / "final.pt", weights_only=True)
    assert final["meta"]["objective"]["pretrain_steps"] == 3
    capsys.readouterr()
    assert main(["train-supernet", "--resume", "--max-steps", "8", "--pretrain-steps", "2", *base]) == 2
    assert "--pretrain-steps 2 differs from the run's 3" in capsys.readouterr().err


def test_the_benchmarks_training_pretrains_first_on_the_same_steps():
    from search_spaces import parse_space
    from tasks.sequence_classification.data import encode
    from tasks.sequence_classification.train import Schedule, train_subnet

    examples = rows(64, 1)
    data = encode([(c, t) for c, t in examples], [f"row {i}" for i in range(64)], 3, SYMBOLS, 20)
    space = parse_space(SPACE, where="space.yaml")
    model, result = train_subnet(space, space.smallest(), data, data, Schedule(steps=3, pretrain_steps=2, batch_size=4,
                                                                              warmup=1))
    assert result.step == 5 and model.num_params() > 0
