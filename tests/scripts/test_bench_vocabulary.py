"""scripts/bench_vocabulary.py (issue 54): its pure parts, and the whole path in --quick mode on a tiny fixture space
pair writes vocabulary.json with the contract keys; a second run resumes without training again."""

import csv
import json
import math
import shutil
from pathlib import Path

import pytest

from tests.supernet.test_tokenizer import corpus_docs
from tests.script_loader import load_script

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures"


def load_bench():
    return load_script("bench_vocabulary")


bench = load_bench()


def test_tokens_budgets_picks_and_verdicts():
    assert bench.budgets_from([1.0, 2.0, 3.0, 4.0, 5.0], None) == [2.0, 3.0, 4.0]
    assert bench.budgets_from([1.0], [3.0, 1.5]) == [1.5, 3.0]
    cands = [{"ms": 1.0, "val_bpb": 3.0}, {"ms": 2.0, "val_bpb": 2.0}, {"ms": 3.0, "val_bpb": 1.0}]
    assert bench.best_under(cands, 2.5)["val_bpb"] == 2.0 and bench.best_under(cands, 0.5) is None
    assert bench.pooled_sd([[1.0, 1.2], [2.0, 2.2], [5.0]]) == pytest.approx(math.sqrt(0.02))
    assert math.isnan(bench.pooled_sd([[1.0]]))
    assert bench.verdict(2.0, 1.5, 0.1) == "better" and bench.verdict(2.0, 1.9, 0.1) == "tie"
    assert bench.verdict(2.0, 2.5, 0.1) == "worse"


def test_quick_run_writes_the_contract(tmp_path):
    data = tmp_path / "corpus"
    data.mkdir()
    for i, doc in enumerate(corpus_docs(40)):
        (data / f"d{i}.py").write_bytes(doc)
    argv = ["--out", str(tmp_path / "run"), "--quick", "--bytes-space", str(FIXTURES / "vocab_quick.yaml"),
            "--vocab-space", str(FIXTURES / "vocab_quick_bpe.yaml"), "--data", str(data), "--val-fraction", "0.2"]
    assert bench.main(argv) == 0
    report = json.loads((tmp_path / "run" / "vocabulary.json").read_text())
    assert {"seed_sd", "budgets", "command", "machine", "date"} <= set(report)
    assert report["bytes_per_token"]["bytes"] == {"256": 1.0}
    assert set(report["bytes_per_token"]["searched"]) == {"256", "320", "384"}
    assert len(report["budgets"]) == 3 and math.isfinite(report["seed_sd"])
    for row in report["budgets"]:
        assert set(row) >= {"budget_ms", "bytes_only", "searched", "verdict"}
        for key in ("bytes_only", "searched"):
            if row[key] is None:
                continue
            assert {"subnet", "test_bpb", "measured_ms"} <= set(row[key])
            assert row[key]["measured_ms"] <= row["budget_ms"] and 0 < row[key]["test_bpb"] < 12
        if row["searched"] is not None:
            assert row["searched"]["vocab"] in (256, 320, 384)
        if row["bytes_only"] is not None:  # the check beside the verdict: the bytes-only model of the most parameters
            assert row["bytes_largest"]["params"] >= row["bytes_only"]["params"]
            assert row["verdict_vs_bytes_largest"] in ("better", "tie", "worse")
    run = tmp_path / "run"
    assert 0 < report["simple_baselines"]["byte_unigram_bpb"] <= 8.01  # a unigram of 256 ids: at most 8 bits a byte
    assert {"supernets", "candidates", "timing", "retrain"} <= set(report["wall"])
    assert report["seconds"] == pytest.approx(sum(e["seconds"] for e in report["wall"].values()), abs=0.2)
    models = list(csv.DictReader(open(run / "models.csv")))
    assert len(models) == sum(len(r[k]["seeds"]) for r in report["budgets"] for k in ("bytes_only", "bytes_largest", "searched")
                              if r[k])
    curves = load_script("curves").read_curves(run / "curves.csv")
    assert curves and all(points for points in curves.values())  # every retrained model's training loss
    assert (run / "vocabulary.png").stat().st_size > 0 and (run / "curves.png").stat().st_size > 0
    candidates = json.loads((tmp_path / "run" / "candidates.json").read_text())
    assert len(list(csv.DictReader(open(run / "candidates.csv")))) == len(candidates)
    searched = [c for c in candidates if c["space"] == "searched"]
    assert {c["prefill_tokens"] for c in searched if c["vocab"] == 256} == {64}  # the prefill's 64 bytes, one a token
    assert all(c["prefill_tokens"] < 64 for c in searched if c["vocab"] > 256)  # fewer tokens for the same bytes
    before = (tmp_path / "run" / "supernet-bytes" / "final.pt").stat().st_mtime_ns
    wall = json.loads((run / "wall.json").read_text())
    assert bench.main(argv) == 0  # resumed: nothing trained again
    assert json.loads((run / "wall.json").read_text()) == wall  # and no stage's time counted twice
    assert (tmp_path / "run" / "supernet-bytes" / "final.pt").stat().st_mtime_ns == before

    # --jobs 2: the same retrainings in two `python -m nas` processes at a time give the same models (the supernets
    # and the timed candidates copied: only the retraining stage runs again)
    again = tmp_path / "jobs2"
    again.mkdir()
    for name in ("supernet-bytes", "supernet-searched", "candidates.json"):
        (shutil.copytree if (tmp_path / "run" / name).is_dir() else shutil.copy)(tmp_path / "run" / name, again / name)
    argv2 = [a if a != str(tmp_path / "run") else str(again) for a in argv] + ["--jobs", "2"]
    assert bench.main(argv2) == 0
    parallel = json.loads((again / "vocabulary.json").read_text())
    assert parallel["seed_sd"] == pytest.approx(report["seed_sd"], rel=1e-6)
    for one, two in zip(report["budgets"], parallel["budgets"]):
        for key in ("bytes_only", "bytes_largest", "searched"):
            if one[key] is not None:
                assert two[key]["seeds"] == pytest.approx(one[key]["seeds"], rel=1e-6)


def test_jobs_must_be_positive(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        bench.main(["--out", str(tmp_path / "run"), "--jobs", "0"])
    assert e.value.code == 2
    assert "--jobs: 0 is not a positive number of trainings at a time" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()
