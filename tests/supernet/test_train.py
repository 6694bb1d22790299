import json
import math
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch
import torch.multiprocessing as mp

from nas.cli import main
from search_spaces import UserError, parse_space
from supernet import SuperTransformer, extract
from supernet.checkpoint import save_checkpoint
from supernet.data import prepare_corpus
from supernet.distributed import Dist
from supernet.task import task_for
from supernet.train import (
    PlainObjective,
    SandwichObjective,
    SupernetCheckpointer,
    TrainConfig,
    WarmupCosine,
    evaluate_bpb,
    train,
)

from tests.conftest import ROOT
from tests.supernet.test_data import write_docs

MICRO = """\
name: micro
task: causal-lm
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


@pytest.fixture(autouse=True)
def one_thread():
    """Micro models gain nothing from a second thread, and on a busy machine OpenMP waits for it on every op."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def micro():
    return parse_space(MICRO, where="micro.yaml")


@pytest.fixture(scope="module")
def docs(tmp_path_factory):
    return write_docs(tmp_path_factory.mktemp("data") / "docs", n=10)


@pytest.fixture(scope="module")
def space_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("space") / "micro.yaml"
    path.write_text(MICRO)
    return path


def run(space, docs, out, max_steps, resume=False, progress=None, dist=Dist(), batch_size=4, log="jsonl"):
    """What the CLI does, at library level: corpus, supernet, sandwich objective, train."""
    corpus = prepare_corpus(str(docs), out, seed=0, val_fraction=0.2)
    model = SuperTransformer(space, generator=torch.Generator().manual_seed(0))
    config = TrainConfig(**{**CONFIG, "batch_size": batch_size}, max_steps=max_steps, log=log)
    meta = {"data": str(docs), "data_seed": 0, "val_fraction": 0.2, "corpus_hash": corpus.hash}
    result = train(
        model, SandwichObjective(space, seed=0), corpus.train, corpus.val, config,
        out=out, checkpointer=SupernetCheckpointer(space), meta=meta, resume=resume, progress=progress, dist=dist,
    )
    return model, result


def state_of(path):
    payload = torch.load(path, weights_only=True)
    return payload["model"], payload["state"]["optimizer"]["state"]


def max_diff(a, b):
    assert a.keys() == b.keys()
    return max((a[k].double() - b[k].double()).abs().max().item() for k in a)


# --------------------------------------------------------------------------- evaluation and objectives


def test_evaluate_bpb_is_fixed_and_agrees_with_the_extracted_model(tiny):
    tokens = np.frombuffer(bytes(range(256)) * 64, dtype=np.uint8)
    model = SuperTransformer(tiny, generator=torch.Generator().manual_seed(0))
    subnet = tiny.sample(np.random.default_rng(5))
    a = evaluate_bpb(model, subnet, tokens, 4, 64, 2, seed=1)
    assert a == evaluate_bpb(model, subnet, tokens, 4, 64, 2, seed=1)
    assert a != evaluate_bpb(model, subnet, tokens, 4, 64, 2, seed=2)
    assert abs(a - 8.0) < 0.1  # untrained: about uniform over 256 bytes
    static = extract(model, subnet)
    assert abs(evaluate_bpb(static, None, tokens, 4, 64, 2, seed=1) - a) < 1e-5
    assert model.training and static.training  # mode restored


def test_sandwich_plan_and_distillation(micro):
    obj = SandwichObjective(micro, n_random=2, distill=0.5, seed=0)
    plan = obj.plan(7)
    assert [name for name, _ in plan] == ["largest", "smallest", "random0", "random1"]
    t = micro.attention[7 % len(micro.attention)]  # the sandwich's type rotates with the step (--balance types)
    assert plan[0][1] == micro.largest(t) and plan[1][1] == micro.smallest(t)
    assert plan == obj.plan(7) and plan != obj.plan(8)
    assert all(s in micro for _, s in plan)
    assert list(obj.eval_subnets()) == ["largest", "smallest", "random0", "random1", "random2"]

    gen = torch.Generator().manual_seed(0)
    teacher, student = torch.randn(2, 5, 256, generator=gen), torch.randn(2, 5, 256, generator=gen)
    y = torch.randint(0, 256, (2, 5), generator=gen)
    memo = {}
    loss0, ce0 = obj.loss(0, teacher, y, memo)
    assert torch.equal(loss0, ce0)
    # Distilling a student equal to the teacher costs only the CE part.
    loss_same, ce_same = obj.loss(1, teacher.clone(), y, memo)
    assert torch.allclose(loss_same, 0.5 * ce_same, atol=1e-6)
    loss1, ce1 = obj.loss(1, student, y, memo)
    kl = torch.nn.functional.kl_div(
        student.log_softmax(-1).flatten(0, 1), teacher.log_softmax(-1).flatten(0, 1), log_target=True, reduction="batchmean"
    )
    assert torch.allclose(loss1, 0.5 * ce1 + 0.5 * kl, atol=1e-6)
    with pytest.raises(UserError, match="--distill: 1.5 is not between 0 and 1"):
        SandwichObjective(micro, distill=1.5)


def test_schedule_and_config_checks():
    s = WarmupCosine(lr=1.0, min_lr=0.1, warmup_steps=10, max_steps=100, max_time=None)
    assert s(0, 0) == pytest.approx(0.1 * (0.1 + 0.9 * 0.5 * (1 + math.cos(0))))
    assert s(50, 0) == pytest.approx(0.55) and s(100, 0) == pytest.approx(0.1)
    timed = WarmupCosine(lr=1.0, min_lr=0.0, warmup_steps=0, max_steps=None, max_time=60)
    assert timed(1000, 30.0) == pytest.approx(0.5)
    with pytest.raises(UserError, match="give --max-steps or --max-time"):
        TrainConfig(max_steps=None)
    with pytest.raises(UserError, match="--min-lr: 0.1 exceeds --lr 0.01"):
        TrainConfig(lr=0.01, min_lr=0.1)


# --------------------------------------------------------------------------- training, checkpoints, resume


def test_training_learns_and_checkpoints_carry_what_search_needs(micro, docs, tmp_path):
    model, result = run(micro, docs, tmp_path, max_steps=40)
    assert result.stopped == "max_steps" and result.step == 40
    first, last = result.evals[0]["bpb"], result.evals[-1]["bpb"]
    assert list(last) == ["largest", "smallest", "random0", "random1", "random2"]
    assert last["largest"] < first["largest"] - 1.0 and last["smallest"] < first["smallest"] - 0.5

    payload = torch.load(tmp_path / "final.pt", weights_only=True)
    meta = payload["meta"]
    assert {"data", "data_seed", "val_fraction", "seed", "step", "corpus_hash"} <= set(meta)
    assert meta["step"] == 40 and meta["data"] == str(docs) and meta["stopped"] == "max_steps"
    assert set(payload["state"]) >= {"optimizer", "schedule", "rng", "data", "step"}
    # The search rebuilds the same validation split from the checkpoint alone and gets the same number.
    corpus = prepare_corpus(meta["data"], tmp_path, seed=meta["data_seed"], val_fraction=meta["val_fraction"])
    assert corpus.hash == meta["corpus_hash"]
    bpb = evaluate_bpb(model, micro.largest(), corpus.val, 4, 16, 2, seed=meta["seed"])
    assert bpb == pytest.approx(last["largest"], abs=1e-9)

    events = [json.loads(line) for line in (tmp_path / "log.jsonl").read_text().splitlines()]
    train_steps = [e["step"] for e in events if e["event"] == "train"]
    assert train_steps == list(range(1, 41)) and events[-1]["event"] == "end"
    assert {"largest", "smallest", "random0", "random1"} == set(events[1]["loss"])
    assert [e["step"] for e in events if e["event"] == "eval"] == list(range(4, 41, 4))


def _train_and_die(space_text, docs, out, kill_at, threads, log="jsonl"):
    torch.set_num_threads(threads)
    space = parse_space(space_text, where="micro.yaml")

    def die(info):
        if info.step == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)  # no cleanup, no last checkpoint

    run(space, docs, out, max_steps=10, progress=die, log=log)


def test_kill_9_and_resume_equals_uninterrupted(micro, docs, tmp_path):
    _, straight = run(micro, docs, tmp_path / "straight", max_steps=10)

    killed = tmp_path / "killed"
    child = mp.get_context("spawn").Process(target=_train_and_die, args=(MICRO, docs, killed, 8, torch.get_num_threads()))
    child.start()
    child.join(60)
    assert child.exitcode == -signal.SIGKILL
    assert torch.load(killed / "latest.pt", weights_only=True)["meta"]["step"] == 6  # ckpt_interval 3; died at 8
    assert not (killed / "final.pt").exists()

    _, resumed = run(micro, docs, killed, max_steps=10, resume=True)
    assert resumed.step == 10
    model_a, opt_a = state_of(tmp_path / "straight" / "final.pt")
    model_b, opt_b = state_of(killed / "final.pt")
    assert max_diff(model_a, model_b) <= 1e-6
    assert max(max_diff(opt_a[i], opt_b[i]) for i in opt_a) <= 1e-6
    assert straight.evals[-1]["bpb"] == pytest.approx(resumed.evals[-1]["bpb"], abs=1e-6)
    # The log of the resumed run has each step once (steps 7 and 8 of the killed run were dropped and redone).
    steps = [json.loads(line)["step"] for line in (killed / "log.jsonl").read_text().splitlines() if '"train"' in line]
    assert steps == list(range(1, 11))


def test_tensorboard_log_holds_the_jsonl_metrics_and_a_resumed_run_has_each_step_once(micro, docs, tmp_path):
    """--log tensorboard: the train losses, lr and validation scores of log.jsonl as TensorBoard scalars (read back as
    TensorBoard reads them); killed at step 8 and resumed from step 6, the curves equal the uninterrupted run's."""
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    def scalars(out):
        acc = EventAccumulator(str(out / "tensorboard"))
        acc.Reload()
        return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}

    run(micro, docs, tmp_path / "straight", max_steps=10, log="tensorboard")
    straight = scalars(tmp_path / "straight")
    events = [json.loads(line) for line in (tmp_path / "straight" / "log.jsonl").read_text().splitlines()]
    train = [e for e in events if e["event"] == "train"]
    assert [s for s, _ in straight["train/loss/largest"]] == [e["step"] for e in train] == list(range(1, 11))
    assert [v for _, v in straight["train/loss/largest"]] == pytest.approx([e["loss"]["largest"] for e in train], rel=1e-6)
    assert [v for _, v in straight["train/lr"]] == pytest.approx([e["lr"] for e in train], rel=1e-6)
    evals = [e for e in events if e["event"] == "eval"]
    assert [v for _, v in straight["validation/bpb/smallest"]] == pytest.approx([e["bpb"]["smallest"] for e in evals], rel=1e-6)

    killed = tmp_path / "killed"
    args = (MICRO, docs, killed, 8, torch.get_num_threads(), "tensorboard")
    child = mp.get_context("spawn").Process(target=_train_and_die, args=args)
    child.start()
    child.join(60)
    assert child.exitcode == -signal.SIGKILL
    run(micro, docs, killed, max_steps=10, resume=True, log="tensorboard")
    resumed = scalars(killed)
    for tag in ("train/loss/largest", "train/loss/smallest", "validation/bpb/largest"):
        assert [s for s, _ in resumed[tag]] == [s for s, _ in straight[tag]], tag  # steps 7 and 8 once, not twice
        assert [v for _, v in resumed[tag]] == pytest.approx([v for _, v in straight[tag]], abs=1e-5), tag


def test_log_is_checked_and_stays_out_of_the_settings_by_default():
    with pytest.raises(UserError, match=r"--log: 'wandb' is not one of jsonl, tensorboard"):
        TrainConfig(log="wandb")
    assert "log" not in TrainConfig().to_dict() and TrainConfig(log="tensorboard").to_dict()["log"] == "tensorboard"


def _rank(rank, world, space_text, docs, out, store, threads):
    torch.set_num_threads(threads)
    torch.distributed.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    space = parse_space(space_text, where="micro.yaml")
    plans = []
    model, _ = run(space, docs, out / f"rank{rank}", max_steps=4, batch_size=8, dist=Dist(rank, world, rank),
                   progress=lambda info: plans.append(info.subnets))
    torch.save({"model": model.state_dict(), "plans": plans}, out / f"weights{rank}.pt")
    torch.distributed.destroy_process_group()


def test_two_ranks_over_gloo_agree_with_one_process(micro, docs, tmp_path):
    mp.spawn(_rank, args=(2, MICRO, docs, tmp_path, tmp_path / "store", 1), nprocs=2, join=True)
    r0, r1 = (torch.load(tmp_path / f"weights{r}.pt", weights_only=True) for r in (0, 1))
    assert r0["plans"] == r1["plans"] and len(r0["plans"]) == 4 and len(set(r0["plans"])) == 4
    assert max_diff(r0["model"], r1["model"]) == 0.0
    assert (tmp_path / "rank0" / "final.pt").exists() and not (tmp_path / "rank1" / "final.pt").exists()
    # Two ranks with 4 windows each compute what one process computes with the 8 windows.
    single, _ = run(micro, docs, tmp_path / "single", max_steps=4, batch_size=8)
    assert max_diff(r0["model"], single.state_dict()) <= 1e-5


def test_plain_objective_fine_tunes_a_static_model(micro, docs, tmp_path):
    corpus = prepare_corpus(str(docs), tmp_path, val_fraction=0.2)
    static = extract(SuperTransformer(micro, generator=torch.Generator().manual_seed(0)), micro.largest())
    before = evaluate_bpb(static, None, corpus.val, 4, 16, 2, seed=0)
    result = train(static, PlainObjective(task_for(micro)), corpus.train, corpus.val, TrainConfig(**CONFIG, max_steps=30))
    assert result.evals[-1]["bpb"]["model"] < before - 1.0


def test_max_time_bounds_a_run(micro, docs, tmp_path):
    corpus = prepare_corpus(str(docs), tmp_path, val_fraction=0.2)
    model = SuperTransformer(micro, generator=torch.Generator().manual_seed(0))
    lrs = []
    config = TrainConfig(**{**CONFIG, "eval_interval": 10**6}, max_steps=None, max_time=2.0)
    result = train(model, SandwichObjective(micro), corpus.train, corpus.val, config, progress=lambda info: lrs.append(info.lr))
    assert result.stopped == "max_time" and 2.0 <= result.elapsed < 20 and result.step == len(lrs) >= 2
    assert lrs[-1] < max(lrs)  # the cosine follows the clock


# --------------------------------------------------------------------------- the CLI


def nas(*args, **kwargs):
    return subprocess.Popen(
        [sys.executable, "-m", "nas", *args], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kwargs
    )


def test_cli_sigint_saves_a_checkpoint_and_resume_continues(space_file, docs, tmp_path, capsys):
    out = tmp_path / "run"
    proc = nas("train-supernet", str(space_file), "--out", str(out), "--data", str(docs), "--batch-size", "4", "--seq-len", "16",
               "--max-steps", "100000", "--log-interval", "1", "--ckpt-interval", "100000", "--threads", "1")
    log = out / "log.jsonl"
    deadline = time.time() + 60
    while time.time() < deadline and not (log.exists() and '"train"' in log.read_text()):
        time.sleep(0.1)
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stderr and "interrupted at step" in stdout and "--resume" in stdout
    meta = torch.load(out / "latest.pt", weights_only=True)["meta"]
    assert meta["stopped"] == "interrupted" and meta["step"] >= 1 and not (out / "final.pt").exists()

    # Resuming may extend the bound; it may not change the maths.
    assert main(["train-supernet", "--out", str(out), "--resume", "--lr", "0.1"]) == 2
    assert "--lr 0.1 differs from the run's 0.003" in capsys.readouterr().err
    assert main(["train-supernet", "--out", str(out), "--resume", "--max-steps", str(meta["step"] + 3)]) == 0
    assert f"trained {meta['step'] + 3} steps" in capsys.readouterr().out
    assert torch.load(out / "final.pt", weights_only=True)["meta"]["step"] == meta["step"] + 3
    # A finished run is not silently overwritten.
    assert main(["train-supernet", str(space_file), "--out", str(out)]) == 2
    assert "already holds a run (latest.pt); add --resume" in capsys.readouterr().err


def test_cli_refuses_bad_checkpoints_in_one_line(micro, tiny, space_file, tmp_path, capsys):
    out = tmp_path / "run"
    out.mkdir()
    latest = out / "latest.pt"
    save_checkpoint(latest, SuperTransformer(micro), {}, step=0)
    data = latest.read_bytes()
    latest.write_bytes(data[: len(data) // 2])
    proc = nas("train-supernet", "--out", str(out), "--resume")
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 2 and "Traceback" not in stderr and len(stderr.strip().splitlines()) == 1
    assert f"{latest}: not a readable supernet checkpoint (truncated or foreign file)" in stderr

    torch.save({"weights": torch.zeros(2)}, latest)
    assert main(["train-supernet", "--out", str(out), "--resume"]) == 2
    assert f"{latest}: not a supernet checkpoint of this tool" in capsys.readouterr().err

    save_checkpoint(latest, SuperTransformer(micro), {}, step=0)
    assert main(["train-supernet", "tiny", "--out", str(out), "--resume"]) == 2
    assert "trained on space 'micro'" in capsys.readouterr().err
    assert main(["train-supernet", "--out", str(out), "--resume"]) == 2  # ours, but not written by train-supernet
    assert f"{latest}: not a train-supernet checkpoint" in capsys.readouterr().err
    assert main(["train-supernet", "--out", str(tmp_path / "empty"), "--resume"]) == 2
    assert "holds no checkpoint (latest.pt)" in capsys.readouterr().err
    assert main(["train-supernet", str(space_file), "--out", str(tmp_path / "x"), "--seq-len", "64"]) == 2
    assert "--seq-len: 64 exceeds the space's max_seq_len 32" in capsys.readouterr().err


def test_cli_help_shows_the_library_defaults():
    from dataclasses import fields

    from nas.commands.train_supernet import HELP_DEFAULTS

    library = {f.name: f.default for f in fields(TrainConfig)} | {f.name: f.default for f in fields(SandwichObjective)}
    assert {k: library[k] for k in HELP_DEFAULTS if k in library} == {k: v for k, v in HELP_DEFAULTS.items() if k in library}
