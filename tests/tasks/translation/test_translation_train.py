"""Training the encoder-decoder supernet: the sandwich loop learns, and a resumed run equals an uninterrupted one."""

import json
import os
import signal

import torch

from supernet.train import SandwichObjective, SupernetCheckpointer, TrainConfig, train
from tasks.translation.data import prepare_pairs
from tasks.translation.model import TranslationSuperTransformer
from tasks.translation.train import TranslationLearner, heldout_ce, load_translation_supernet

from tests.tasks.translation.translation_fakes import mini_space, write_toy_tsv

CONFIG = dict(batch_size=8, max_steps=6, warmup_steps=2, eval_interval=3, eval_batches=2, ckpt_interval=3, log_interval=1,
              lr=1e-2, min_lr=1e-3)  # fmt: skip


def run(space, corpus, out, resume=None, stop_at=None):
    model = TranslationSuperTransformer(space, generator=torch.Generator().manual_seed(0))

    def progress(info):
        if info.step == stop_at:
            os.kill(os.getpid(), signal.SIGINT)  # caught by the loop: it finishes the step, saves latest.pt, stops

    result = train(model, sandwich(space), corpus.train, corpus.val, TrainConfig(**CONFIG), out=out,
                   checkpointer=SupernetCheckpointer(space), resume=resume if resume is not None else False,
                   progress=progress)  # fmt: skip
    return model, result


def sandwich(space):
    """The one training loop's sandwich objective with the translation task's learner (two random subnets evaluated)."""
    return SandwichObjective(space, n_random=1, n_eval_random=2, task=TranslationLearner(space.max_seq_len))


def train_losses(path):
    return [e["loss"] for e in map(json.loads, path.read_text().splitlines()) if e["event"] == "train"]


def test_resumed_run_equals_the_uninterrupted_run(tmp_path):
    space = mini_space()
    corpus = prepare_pairs(str(write_toy_tsv(tmp_path / "toy.tsv")), tmp_path / "cache")
    full, result = run(space, corpus, tmp_path / "full")
    assert result.stopped == "max_steps" and result.step == 6 and (tmp_path / "full" / "final.pt").exists()

    _, cut = run(space, corpus, tmp_path / "cut", stop_at=4)
    assert cut.stopped == "interrupted" and cut.step == 4
    ckpt = load_translation_supernet(tmp_path / "cut" / "latest.pt", space)[1]
    resumed, result2 = run(space, corpus, tmp_path / "cut", resume=ckpt)
    assert result2.step == 6 and result2.stopped == "max_steps"
    want, got = full.state_dict(), resumed.state_dict()
    assert all(torch.equal(want[k], got[k]) for k in want)
    assert train_losses(tmp_path / "cut" / "log.jsonl") == train_losses(tmp_path / "full" / "log.jsonl")
    assert result2.evals[-1] == result.evals[-1]

    # The held-out loss is per target byte, with the supernet's inherited weights, and training lowered it.
    fresh = TranslationSuperTransformer(space, generator=torch.Generator().manual_seed(0))
    from tasks.translation.train import eval_batches

    batches = eval_batches(corpus.val, 8, space.max_seq_len, 2, 0)
    before, after = (heldout_ce(m, space.largest(), corpus.val, batches) for m in (fresh, full))
    assert after < before - 0.5 and abs(before - torch.log(torch.tensor(259.0)).item()) < 0.5
    assert result.evals[-1]["ce"]["largest"] == after


def _rank(rank, world, tsv, out, store):
    torch.set_num_threads(1)
    torch.distributed.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    from supernet.distributed import Dist

    space = mini_space()
    corpus = prepare_pairs(str(tsv), out / "cache")
    model = TranslationSuperTransformer(space, generator=torch.Generator().manual_seed(0))
    plans = []
    config = TrainConfig(**{**CONFIG, "max_steps": 3, "eval_interval": 100})
    train(model, sandwich(space), corpus.train, corpus.val, config, out=out / f"rank{rank}",
          checkpointer=SupernetCheckpointer(space), dist=Dist(rank, world, rank),
          progress=lambda info: plans.append(info.subnets))  # fmt: skip
    torch.save({"model": model.state_dict(), "plans": plans}, out / f"weights{rank}.pt")
    torch.distributed.destroy_process_group()


def test_two_ranks_over_gloo_equal_one_process(tmp_path):
    import torch.multiprocessing as mp

    tsv = write_toy_tsv(tmp_path / "toy.tsv")
    mp.spawn(_rank, args=(2, tsv, tmp_path, tmp_path / "store"), nprocs=2, join=True)
    r0, r1 = (torch.load(tmp_path / f"weights{r}.pt", weights_only=True) for r in (0, 1))
    assert r0["plans"] == r1["plans"] and len(r0["plans"]) == 3
    assert all(torch.equal(r0["model"][k], r1["model"][k]) for k in r0["model"])
    assert (tmp_path / "rank0" / "final.pt").exists() and not (tmp_path / "rank1").exists()
    # Two ranks with half of each batch's rows compute what one process computes with the whole batch.
    space = mini_space()
    corpus = prepare_pairs(str(tsv), tmp_path / "cache")
    single = TranslationSuperTransformer(space, generator=torch.Generator().manual_seed(0))
    config = TrainConfig(**{**CONFIG, "max_steps": 3, "eval_interval": 100})
    train(single, sandwich(space), corpus.train, corpus.val, config)
    assert max((single.state_dict()[k] - r0["model"][k]).abs().max().item() for k in r0["model"]) <= 1e-5
