"""scripts/bench_translate.py --quick: HAT's table end to end on the mini encoder-decoder (timed on cpu), and its resume."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from .seq2seq_fakes import write_toy_tsv

ROOT = Path(__file__).resolve().parents[1]
SPACE = ROOT / "tests" / "fixtures" / "translate_quick.yaml"


@pytest.mark.timeout(600)
def test_bench_translate_quick_runs_end_to_end_and_resumes(tmp_path):
    env = {**os.environ, "NAS_CACHE": str(tmp_path / "cache"), "PYTHONPATH": str(ROOT)}
    data = write_toy_tsv(tmp_path / "toy.tsv", n=200)
    cmd = [sys.executable, str(ROOT / "scripts" / "bench_translate.py"), "--quick", "--space", str(SPACE), "--data",
           str(data), "--out", str(tmp_path / "run"), "--device", "cpu", "--threads", "1"]  # fmt: skip
    first = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-4000:]
    run = tmp_path / "run"
    result = json.loads((run / "translate.json").read_text())
    rows = list(csv.DictReader((run / "translate.csv").open()))
    assert (run / "translate.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    roles = ";".join(r["roles"] for r in rows)
    assert "found@" in roles and "uniform softmax@" in roles and "uniform softmax ladder" in roles
    # every retrained model: the same token budget and so the same steps and target bytes, the same corpus and test pairs
    cards = [json.loads(p.read_text()) for p in (run / "retrain").glob("*/model/model_card.json")]
    assert len(cards) == len(rows) >= 4
    assert {c["training"]["token_budget"] for c in cards} == {2000}
    assert len({(c["training"]["steps"], c["training"]["tokens"]) for c in cards}) == 1
    assert len({c["training"]["corpus_hash"] for c in cards}) == 1 and {r["test_pairs"] for r in rows} == {"6"}
    for r in rows:
        assert float(r["measured_ms"]) > 0 and 0 <= float(r["chrf"]) <= 100 and 0 <= float(r["bleu"]) <= 100
    # a verdict line per budget, PASS or FAIL, and the verdicts agree with the rows
    verdict_lines = [line for line in first.stdout.splitlines() if line.startswith("budget ") and "percentile)" in line]
    assert len(verdict_lines) == 3 and all(("): PASS (" in v) != ("): FAIL (" in v) for v in verdict_lines)
    by_key = {r["key"]: r for r in rows}
    uniform = [r for r in rows if "uniform" in r["roles"]]
    for label, v in result["verdicts"].items():
        me = by_key[v["found"]]
        faster = [r for r in uniform if r is not me and float(r["measured_ms"]) <= float(me["measured_ms"])]
        assert v["beats_all_at_or_below"] == (bool(faster) and all(float(me["chrf"]) > float(r["chrf"]) for r in faster))
        assert f"budget {label}" in first.stdout
    assert "stage wall times:" in first.stdout

    # run again: every stage is skipped, the same table is printed
    again = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tmp_path)
    assert again.returncode == 0, again.stderr[-4000:]
    assert again.stderr.count("finished in an earlier run, skipped") == 7
    assert json.loads((run / "translate.json").read_text())["rows"] == result["rows"]

    # reporting that run with another token budget is refused (the cards say what each model was trained on)
    other = subprocess.run([*cmd, "--tokens", "4K"], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert other.returncode == 2, other.stderr[-2000:]
    assert "models there were retrained on 2,000 target bytes each, not 4,000: give --tokens 2000" in other.stderr


def test_bench_translate_refuses_a_language_model_space(tmp_path, capsys, monkeypatch):
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_translate", ROOT / "scripts" / "bench_translate.py")
    bench = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "bench_translate", bench)  # its dataclasses look their module up
    spec.loader.exec_module(bench)
    assert bench.main(["--out", str(tmp_path / "run"), "--space", "tiny", "--device", "cpu"]) == 2
    assert capsys.readouterr().err == ("bench_translate: error: --space tiny: task causal-lm, not seq2seq (an "
                                       "encoder-decoder translation space)\n")  # fmt: skip
    assert bench.main(["--out", str(tmp_path / "run"), "--quick", "--jobs", "0"]) == 2
    assert capsys.readouterr().err == "bench_translate: error: --test-pairs / --train-steps / --jobs: give a positive integer\n"
