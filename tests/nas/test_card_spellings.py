"""The toolkit's headline spellings work exactly as written, with no warning: `nas train-supernet`, `nas measure-latency
--device D`, `nas search --budget 50ms`, `nas export` (the card users were given), and `--device` takes every value the
documentation promises (auto, cpu, cuda, cuda:N) wherever torch computes."""

from __future__ import annotations

import pytest
import torch

from nas.cli import main

from tests.supernet.test_data import write_docs
from tests.supernet.test_train import MICRO

QUICK = ["--timing-warmup", "1", "--repeats", "2", "--rounds", "1", "--min-sample-ms", "1"]


def test_the_card_runs_as_written_without_a_warning(tmp_path, capsys):
    space = tmp_path / "micro.yaml"
    space.write_text(MICRO)
    docs = write_docs(tmp_path / "docs", n=10)
    steps = [
        ["train-supernet", str(space), "--out", str(tmp_path / "run"), "--data", str(docs), "--max-steps", "4",
         "--batch-size", "4", "--seq-len", "16", "--val-fraction", "0.2"],
        ["measure-latency", str(space), "--device", "onnxruntime", "--samples", "12", "--out", str(tmp_path / "t.csv"),
         "--timing-threads", "1", *QUICK],
        ["fit-predictor", str(tmp_path / "t.csv"), "--out", str(tmp_path / "pred")],
        ["search", str(tmp_path / "run" / "final.pt"), "--predictor", str(tmp_path / "pred"), "--budget", "50ms",
         "--out", str(tmp_path / "search"), "--population", "4", "--parents", "2", "--mutations", "1", "--crossovers",
         "1", "--generations", "1", "--val-windows", "2", "--seq-len", "16"],
        ["export", str(tmp_path / "run" / "final.pt"), "--subnet", str(tmp_path / "search" / "best_50ms.yaml"), "--out",
         str(tmp_path / "model"), "--val-windows", "2", "--seq-len", "16"],
    ]
    for argv in steps:
        assert main(argv) == 0, argv
        err = capsys.readouterr().err
        assert "warning" not in err and "old spelling" not in err, (argv[0], err[-2000:])
    assert (tmp_path / "model" / "model.onnx").is_file()


def test_measure_latency_takes_its_other_name_and_requires_one_of_them(tmp_path, capsys):
    from nas.cli import parse

    _, args = parse(["measure-latency", "tiny", "--timing-target", "cpu", "--out", "t.csv"])
    assert args.device == "cpu" and capsys.readouterr().err == ""  # silently: the name search and export use
    with pytest.raises(SystemExit):
        parse(["measure-latency", "tiny", "--out", "t.csv"])
    assert "the following arguments are required: --device" in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
@pytest.mark.parametrize("command", [["train-supernet", "tiny"], ["train-subnet", "SUBNET", "--space", "tiny"],
                                     ["fit-accuracy", "ck.pt", "m"]])
def test_cuda_n_is_a_device_everywhere_torch_computes(command, tmp_path, capsys):
    argv = [*command, "--out", str(tmp_path / "o"), "--device", "cuda:1"]
    if command[0] == "train-subnet":
        (tmp_path / "s.yaml").write_text("embed_dim: 64\ndepth: 2\nheads: [2, 2]\nffn_dim: [128, 128]\n"
                                         "attention: [softmax, softmax]\n")
        argv[1] = str(tmp_path / "s.yaml")
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--device" in err[0] and "cuda:1" in err[0] and "CUDA" in err[0], err
    assert "invalid choice" not in err[0]
    assert main([*argv[:-1], "gpu7"]) == 2
    assert "is not one of auto, cpu, cuda, cuda:N" in capsys.readouterr().err
