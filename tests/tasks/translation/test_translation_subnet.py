"""``nas train-subnet`` on a seq2seq space: one encoder-decoder retrained from scratch on a token budget, resumed
exactly, written as an export that ``nas translate`` reads."""

from __future__ import annotations

import json
import os
import signal
from dataclasses import replace
from pathlib import Path

import torch
from safetensors.torch import load_file

from nas.cli import main
from tasks.translation.workflows import TranslationSubnetTraining, train_translation_subnet
from supernet.runs import TrainingInterrupted
from tasks.translation.space import TranslationSubnet
from tasks.translation.artifact import load_translation_model
from tasks.translation.train import steps_for_tokens
from supernet.train import TrainConfig
from tasks.translation.data import prepare_pairs

from tests.tasks.translation.translation_fakes import MINI_SEQ2SEQ, mini_space, write_toy_tsv

CONFIG = TrainConfig(batch_size=8, warmup_steps=2, eval_interval=3, eval_batches=2, ckpt_interval=3, log_interval=1,
                     lr=1e-2, min_lr=1e-3)  # fmt: skip
TOKENS = 2500


def _settings(tmp_path: Path, name: str, data: Path, **kw) -> TranslationSubnetTraining:
    space = mini_space()
    subnet = TranslationSubnet.from_dict(
        {"encoder": {"embed_dim": 24, "depth": 3, "heads": [2, 1, 2], "ffn_dim": [32, 16, 32],
                     "attention": ["softmax", "local:4", "linear"]},
         "decoder": {"embed_dim": 16, "depth": 2, "heads": [1, 2], "ffn_dim": [16, 32], "attention": ["linear", "softmax"],
                     "cross_heads": [2, 1], "cross_layers": [3, 1]}})  # fmt: skip
    return TranslationSubnetTraining(space=space, subnet=subnet, out=tmp_path / name, tokens=TOKENS, config=CONFIG,
                                     data=str(data), **kw)  # fmt: skip


def _losses(path: Path) -> list:
    return [e["loss"] for e in map(json.loads, path.read_text().splitlines()) if e["event"] == "train"]


def test_token_budget_resume_and_export(tmp_path, monkeypatch):
    data = write_toy_tsv(tmp_path / "toy.tsv")
    full = train_translation_subnet(_settings(tmp_path, "full", data))
    corpus = prepare_pairs(str(data), tmp_path / "full" / "train")
    steps, total = steps_for_tokens(corpus.train, 8, 40, 0, TOKENS)
    assert (full.steps, full.tokens) == (steps, total) and steps >= 6 and TOKENS - 8 * 40 < total <= TOKENS
    assert full.stopped == "max_steps" and full.val_ce < full.val_ce_before

    # interrupted after step 4 (SIGINT: the step ends, latest.pt is saved), then resumed: the same weights and losses
    def stop(info):
        if info.step == 4:
            os.kill(os.getpid(), signal.SIGINT)

    cut = _settings(tmp_path, "cut", data)
    try:
        train_translation_subnet(cut, progress=stop)
        raise AssertionError("the run was not interrupted")
    except TrainingInterrupted as e:
        assert e.step == 4
    resumed = train_translation_subnet(_settings(tmp_path, "cut", data, resume=True))
    assert (resumed.steps, resumed.tokens, resumed.val_ce) == (full.steps, full.tokens, full.val_ce)
    want, got = (load_file(str(tmp_path / d / "model.safetensors")) for d in ("full", "cut"))
    assert want.keys() == got.keys() and all(torch.equal(want[k], got[k]) for k in want)
    assert _losses(tmp_path / "cut" / "train" / "log.jsonl") == _losses(tmp_path / "full" / "train" / "log.jsonl")

    # the export: a static model of the subnet, the card records the budget and the corpus
    model, card = load_translation_model(tmp_path / "full")
    assert model.subnet == _settings(tmp_path, "x", data).subnet and card["task"] == "seq2seq"
    assert card["training"]["token_budget"] == TOKENS and card["training"]["tokens"] == total
    assert card["validation"]["ce_per_target_byte"] == full.val_ce and card["corpus"]["corpus_hash"] == corpus.hash

    # a rerun of the finished run returns its result without training
    stamp = (tmp_path / "full" / "model.safetensors").stat().st_mtime_ns
    again = train_translation_subnet(_settings(tmp_path, "full", data, resume=True))
    assert again == replace(full, seconds=round(full.seconds, 1))  # the card keeps seconds to 0.1
    assert (tmp_path / "full" / "model.safetensors").stat().st_mtime_ns == stamp


def test_cli_trains_translates_and_refuses_bad_flags(tmp_path, capsys):
    data = write_toy_tsv(tmp_path / "toy.tsv")
    (tmp_path / "mini.yaml").write_text(MINI_SEQ2SEQ.format(positions="rope"))
    sub = tmp_path / "sub.yaml"
    sub.write_text(mini_space().smallest().to_yaml())
    out = tmp_path / "model"
    base = ["train-subnet", str(sub), "--space", str(tmp_path / "mini.yaml"), "--data", str(data), "--out", str(out),
            "--batch-size", "8", "--threads", "1", "-q"]  # fmt: skip
    assert main([*base, "--mask-rate", "0.2"]) == 2
    assert "--mask-rate: not for an encoder-decoder (task seq2seq) subnet" in capsys.readouterr().err
    assert main([*base, "--lang", "fr"]) == 2
    assert "give --data (your own source<TAB>target file) or --lang" in capsys.readouterr().err
    assert not out.exists()
    assert main([*base, "--tokens", "1500"]) == 0
    printed = capsys.readouterr().out
    assert "target bytes" in printed and f"nas translate --model {out}" in printed
    card = json.loads((out / "model_card.json").read_text())
    assert card["training"]["token_budget"] == 1500 and card["training"]["init"] == "scratch"
    assert main(["translate", "--model", str(out), "file open"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 1
    # --resume of the finished run (no --space: the run's own): nothing to train, the same model
    before = (out / "model.safetensors").read_bytes()
    assert main(["train-subnet", "--out", str(out), "--resume", "-q"]) == 0
    assert (out / "model.safetensors").read_bytes() == before
    # a resumed run may not change its schedule
    assert main(["train-subnet", "--out", str(out), "--resume", "--lr", "0.1", "-q"]) == 2
    assert "--resume: --lr 0.1 differs from the run's 0.003" in capsys.readouterr().err
    # a new run into it is refused
    assert main([*base, "--tokens", "1500"]) == 2
    assert "already holds a training run (train/latest.pt); add --resume" in capsys.readouterr().err


def test_init_model_trains_on_from_a_trained_model_of_the_same_subnet(tmp_path):
    """``init="model:DIR"`` (the hurdles' next round): the weights of DIR's model, not fresh ones; another subnet's
    model is refused in one line."""
    import pytest

    from search_spaces import UserError

    data = write_toy_tsv(tmp_path / "toy.tsv")
    first = train_translation_subnet(replace(_settings(tmp_path, "round0", data), tokens=600))
    again = train_translation_subnet(replace(_settings(tmp_path, "round1", data, init=f"model:{first.out}"), tokens=300))
    assert again.val_ce_before == pytest.approx(first.val_ce, abs=1e-6)  # it starts where round 0 ended
    assert abs(first.val_ce_before - first.val_ce) > 1e-3  # (from scratch it would not: round 0 moved)
    other = replace(_settings(tmp_path, "other", data, init=f"model:{first.out}"), subnet=mini_space().smallest())
    with pytest.raises(UserError, match=r"--init model:.*round0: a model of enc .* not of enc "):
        train_translation_subnet(other)
    assert not (tmp_path / "other").exists()


def _supernet_file(tmp_path: Path) -> Path:
    """A seeded encoder-decoder supernet of the mini space, saved as train-supernet saves one (its weights need not
    have learned: inheritance and distillation read them as they are)."""
    from supernet.checkpoint import save_checkpoint
    from tasks.translation.model import TranslationSuperTransformer

    path = tmp_path / "super.pt"
    save_checkpoint(path, TranslationSuperTransformer(mini_space(), generator=torch.Generator().manual_seed(3)), {}, step=0)
    return path


def test_inherit_starts_from_the_slice_and_distillation_changes_what_is_learned(tmp_path):
    """``init="supernet:PATH"`` starts from the subnet's slice (at lr 0 it stays it); ``distill_from`` adds the largest
    subnet's soft targets (the same init, seed and pairs end elsewhere) and is recorded; a distilled run interrupted and
    resumed equals the uninterrupted one."""
    import pytest

    from supernet.checkpoint import load_supernet

    data = write_toy_tsv(tmp_path / "toy.tsv")
    ckpt = _supernet_file(tmp_path)
    source = f"supernet:{ckpt}"
    frozen = train_translation_subnet(replace(_settings(tmp_path, "lr0", data, init=source), tokens=600,
                                              config=replace(CONFIG, lr=0.0, min_lr=0.0)))
    supernet, _ = load_supernet(ckpt)
    sliced = supernet.extract(_settings(tmp_path, "x", data).subnet).state_dict()
    got = load_file(str(frozen.out / "model.safetensors"))
    assert got.keys() == sliced.keys() and all(torch.equal(got[k], sliced[k]) for k in got)

    plain = train_translation_subnet(replace(_settings(tmp_path, "plain", data, init=source), tokens=1200))
    taught = train_translation_subnet(replace(_settings(tmp_path, "taught", data, init=source, distill_from=source,
                                                        distill=0.5), tokens=1200))
    assert plain.val_ce_before == taught.val_ce_before and plain.steps == taught.steps
    a, b = (load_file(str(r.out / "model.safetensors")) for r in (plain, taught))
    assert any(not torch.equal(a[k], b[k]) for k in a)
    card = json.loads((taught.out / "model_card.json").read_text())
    assert (card["training"]["distill_from"], card["training"]["distill"]) == (source, 0.5)

    def stop(info):
        if info.step == 2:
            os.kill(os.getpid(), signal.SIGINT)

    cut = replace(_settings(tmp_path, "cut", data, init=source, distill_from=source, distill=0.5), tokens=1200)
    with pytest.raises(TrainingInterrupted):
        train_translation_subnet(cut, progress=stop)
    again = train_translation_subnet(replace(cut, resume=True))
    c = load_file(str(again.out / "model.safetensors"))
    assert again.val_ce == taught.val_ce and all(torch.equal(b[k], c[k]) for k in b)
    with pytest.raises(Exception, match=r"--resume: --distill 0.9 differs from the run's 0.5"):
        train_translation_subnet(replace(cut, resume=True, distill=0.9))
