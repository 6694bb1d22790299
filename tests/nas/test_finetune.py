"""nas finetune: trains an exported model; interrupted + resumed equals uninterrupted; the card reports before/after."""

import os
import signal

import pytest
import torch

from nas.cli import main
from tasks.stack.export import export_subnet
from search_spaces import Subnet
from supernet import SuperTransformer, load_model
from supernet.artifact import read_card
from supernet.checkpoint import save_checkpoint

SUBNET = Subnet(64, 2, (2, 1), (128, 128), ("softmax", "linear"))


@pytest.fixture(scope="module")
def setup(tiny, tmp_path_factory):
    root = tmp_path_factory.mktemp("ft")
    supernet = SuperTransformer(tiny, generator=torch.Generator().manual_seed(0)).eval()
    ckpt = save_checkpoint(root / "ck.pt", supernet, {}, step=1)
    export_subnet(supernet, SUBNET, root / "model", formats=())
    docs = root / "docs"
    docs.mkdir()
    g = torch.Generator().manual_seed(0)
    for i in range(12):  # small documents: some go to the validation split
        words = torch.randint(0, 40, (600,), generator=g).tolist()
        (docs / f"d{i}.txt").write_text(" ".join("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMN"[w] * (1 + w % 4) for w in words))
    return root, ckpt


def interrupting_bar(real_bar, step):
    """A progress bar factory like ``real_bar`` whose hook sends this process SIGINT after ``step`` (Ctrl-C)."""

    def bar():
        close, update = real_bar()

        def hook(info):
            update(info)
            if info.step == step:
                os.kill(os.getpid(), signal.SIGINT)

        return close, hook

    return bar


def args(root, out, *extra):
    return ["finetune", "--model", str(root / "model"), "--out", str(out), "--data", str(root / "docs"), "--batch-size", "4",
            "--seq-len", "64", "--max-steps", "6", "--ckpt-interval", "2", "--eval-interval", "3", "--eval-batches", "2",
            "--lr-warmup", "2", "--lr", "1e-3", *extra]


def test_finetune_interrupted_and_resumed_equals_uninterrupted(setup, capsys, monkeypatch):
    import nas.commands.finetune as ft

    root, ckpt = setup
    assert main(args(root, root / "straight", "--supernet", str(ckpt), "--distill", "0.5")) == 0
    out = capsys.readouterr().out
    card = read_card(root / "straight")
    f = card["training"]
    assert f["steps"] == 6 and f["distill"] == 0.5 and f["bits_per_byte_after"] < f["bits_per_byte_before"]
    assert f"{f['bits_per_byte_before']:.4f} -> {f['bits_per_byte_after']:.4f}" in out
    assert card["validation"]["bits_per_byte"] == f["bits_per_byte_after"] and "model.pt2" in card["files"]

    # Ctrl-C at step 3 (the step finishes, latest.pt is written), then --resume to the end.
    real_bar = ft._progress_bar
    monkeypatch.setattr(ft, "_progress_bar", interrupting_bar(real_bar, 3))
    assert main(args(root, root / "resumed", "--supernet", str(ckpt), "--distill", "0.5")) == 130
    assert "--resume" in capsys.readouterr().out
    monkeypatch.setattr(ft, "_progress_bar", real_bar)
    assert main(args(root, root / "resumed", "--supernet", str(ckpt), "--distill", "0.5")) == 2  # refuses to start over
    assert "add --resume" in capsys.readouterr().err
    assert main(args(root, root / "resumed", "--resume")) == 2  # the teacher is part of the run
    assert "keeps its teacher" in capsys.readouterr().err
    assert main(args(root, root / "resumed", "--supernet", str(ckpt), "--resume")) == 0
    a, b = load_model(root / "straight"), load_model(root / "resumed")
    for (name, x), (_, y) in zip(a.state_dict().items(), b.state_dict().items()):
        assert torch.equal(x, y), name
    assert read_card(root / "resumed")["training"]["bits_per_byte_after"] == f["bits_per_byte_after"]


def test_finetune_without_teacher_and_refusals(setup, capsys):
    root, ckpt = setup
    assert main(args(root, root / "plain", "--max-steps", "2")) == 0
    card = read_card(root / "plain")
    assert card["training"]["teacher"] is None and card["training"]["steps"] == 2
    assert load_model(root / "plain").subnet == SUBNET
    capsys.readouterr()
    assert main(args(root, root / "x", "--distill", "0.3")) == 2
    assert "--distill: needs --supernet" in capsys.readouterr().err
    assert main(args(root, root / "model")) == 2
    assert "is the source model directory" in capsys.readouterr().err
