"""scripts/bench_translate.py: the translation claim's protocol end to end on the mini encoder-decoder (--quick, timed on
cpu) and its resume; its rules (verdict within noise, ladder gate) and the library parts it reads (whole-split
cross-entropy, sacrebleu's paired bootstrap, the type-balanced sandwich over an encoder-decoder's types)."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.tasks.translation.translation_fakes import write_toy_tsv
from tests.script_loader import load_script

ROOT = Path(__file__).resolve().parents[2]
SPACE = ROOT / "tests" / "fixtures" / "translate_quick.yaml"
STAGES = 12  # the stages of run(), "fit the ranker" among them


@pytest.fixture(scope="module")
def bench():
    module = load_script("bench_translate")
    yield module
    sys.modules.pop("bench_translate", None)


@pytest.mark.timeout(600)
def test_bench_translate_quick_runs_end_to_end_and_resumes(tmp_path, bench):
    env = {**os.environ, "NAS_CACHE": str(tmp_path / "cache"), "PYTHONPATH": str(ROOT)}
    data = write_toy_tsv(tmp_path / "toy.tsv", n=200)
    cmd = [sys.executable, str(ROOT / "scripts" / "bench_translate.py"), "--quick", "--space", str(SPACE), "--data",
           str(data), "--out", str(tmp_path / "run"), "--device", "cpu", "--threads", "1", "--max-load", "0"]  # fmt: skip
    first = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-4000:]
    run = tmp_path / "run"
    result = json.loads((run / "translate.json").read_text())
    rows = list(csv.DictReader((run / "translate.csv").open()))
    assert (run / "translate.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert {"budgets", "speedup_vs_softmax", "ladder_gate", "seed_sd", "command", "machine", "loads", "ranker"} <= set(result)
    assert len(result["budgets"]) == len(result["speedup_vs_softmax"]) == 3
    largest = max(b["budget_ms"] for b in result["budgets"])
    held = [float(r["chrf_mean"]) for r in rows if float(r["measured_ms"]) <= largest]
    assert result["best_chrf"] == (pytest.approx(max(held)) if held else None)  # issue 54: the best model's chrF
    # the search ranked by the ranker calibrated on the retrained baselines (nas fit-accuracy on seq2seq)
    ranker = json.loads((run / "ranker" / "ranker.json").read_text())
    assert result["ranker"]["kind"] == "calibrated" and result["ranker"]["models"] == ranker["report"]["n"] >= 4
    summary = json.loads((run / "search" / "search.json").read_text())
    assert summary["config"]["fitness"]["ranker_kind"] == ranker["kind"]
    # hurdles from scratch among the candidates whose measured latency held (the quick search's budgets are tight and
    # timed on a shared cpu, so which hold varies from run to run; nas search's hurdles on encoder-decoders are tested
    # deterministically in test_translate_latency): trained encoder-decoders scored on the search's pairs, and each
    # budget's found model is the hurdles' winner, else the verified one, else the predictor's
    verify = json.loads((run / "search" / "verify.json").read_text())["budgets"]
    held = {(label, c["key"]) for label, v in verify.items() for c in v["checks"] if c["holds"]}
    hurdles = list(csv.DictReader((run / "search" / "hurdles.csv").open()))
    assert {(h["budget"], h["key"]) for h in hurdles} <= held
    assert all(0 < float(h["trained_bpb"]) < 10 for h in hurdles)
    for e in (e for e in result["budgets"] if e["found"] is not None):
        trained = {h["key"] for h in hurdles if h["budget"] == e["label"]}
        want = "hurdles" if trained else "verified" if verify[e["label"]]["verified"] else "predicted"
        assert e["found"]["how"] == want, (e["label"], e["found"]["how"], want)
        assert e["found"]["key"] in trained or not trained
    roles = ";".join(r["roles"] for r in rows)
    assert "found@" in roles and "uniform softmax@" in roles and bench.LADDER_ROLE in roles
    # every retrained model: one budget in target bytes, so the same steps and bytes, the same corpus
    cards = {p.parts[-3]: json.loads(p.read_text()) for p in (run / "retrain").glob("*/model/model_card.json")}
    seeded = [name for name in cards if name.endswith("-s1")]
    assert len(cards) == len(rows) + len(seeded) and 1 <= len(seeded) <= 6
    assert {c["training"]["token_budget"] for c in cards.values()} == {2000}
    assert len({c["training"]["corpus_hash"] for c in cards.values()}) == 1
    for group in ([c for n, c in cards.items() if n not in seeded], [cards[n] for n in seeded]):  # per seed: one batch order
        assert len({(c["training"]["steps"], c["training"]["tokens"]) for c in group}) == 1
    # cross-entropy over the whole test split (every pair that fits), chrF over the first 6 decoded pairs
    scores = [json.loads(p.read_text()) for p in (run / "retrain").glob("*/model/score.json")]
    assert len(scores) == len(cards) and {s["test_pairs"] for s in scores} == {6} and {s["beam"] for s in scores} == {5}
    assert {s["ce_pairs"] for s in scores} == {scores[0]["split_pairs"]} and scores[0]["split_pairs"] > 6
    for r in rows:
        assert float(r["measured_ms"]) > 0 and 0 <= float(r["chrf"]) <= 100 and float(r["test_ce"]) > 0

    # the ladder gate, recomputed from the rows
    from scipy.stats import spearmanr

    lad = [r for r in rows if bench.LADDER_ROLE in r["roles"].split(";")]
    gate = result["ladder_gate"]
    assert gate["models"] == len(lad) == 3 and gate["retrain_bytes"] == 2000
    size = [int(r["params"]) for r in lad]
    rho_ce = spearmanr(size, [-float(r["test_ce_mean"]) for r in lad]).statistic
    rho_chrf = spearmanr(size, [float(r["chrf_mean"]) for r in lad]).statistic
    assert gate["spearman_ce"] == pytest.approx(rho_ce) and gate["spearman_chrf"] == pytest.approx(rho_chrf)
    assert gate["passed"] == (rho_ce >= 0.8 and rho_chrf >= 0.8)

    # each budget's verdict follows the rule from its comparisons (or is withheld when the gate failed)
    sd = result["seed_sd"]["ce"]
    assert np.isfinite(sd) and sd > 0
    for e, sp in zip(result["budgets"], result["speedup_vs_softmax"]):
        assert e["budget_ms"] == sp["budget_ms"] and {"ratio", "bound"} <= set(sp["chrf"]) and {"ratio", "bound"} <= set(sp["ce"])
        if e["found"] is None:
            continue
        assert e["within_budget"] == (e["found"]["measured_ms"] <= e["budget_ms"] * 1.02)
        assert len(e["found"]["test_ce_seeds"]) == 2  # --quick: 2 seeds
        for c in e["comparisons"]:
            d = np.mean(e["found"]["test_ce_seeds"]) - np.mean(c["test_ce"])
            assert c["ce"] == ("better" if d < -2 * sd else "worse" if d > 2 * sd else "tie")
            d_chrf = c["chrf_found"] - c["chrf_baseline"]
            assert c["chrf_bootstrap"] == ("tie" if c["chrf_p"] >= 0.05 or d_chrf == 0 else "better" if d_chrf > 0
                                           else "worse")  # fmt: skip
            assert c["chrf"] == (c["chrf_bootstrap"] if c["chrf_bootstrap"] == c["chrf_seeds"] else "tie")
            assert c["measured_ms"] <= e["found"]["measured_ms"]
        if not gate["passed"]:
            assert e["verdict"] == "withheld (ladder gate failed)"
            continue
        if not e["comparisons"]:
            assert e["verdict"] == "no baseline at or below" and e["best_uniform"] is None
            continue
        best = min(e["comparisons"], key=lambda c: (np.mean(c["test_ce"]), c["key"]))
        assert e["best_uniform"]["key"] == best["key"] and e["p_value"] == best["chrf_p"]
        if any("worse" in (c["ce"], c["chrf"]) for c in e["comparisons"]):
            assert e["verdict"] == "worse"
        else:  # tie iff within 2 seed SD and a chrF tie (p >= 0.05, or equal scores) against the best baseline
            assert (e["verdict"] == "tie") == (best["ce"] == "tie" and best["chrf"] == "tie")
            assert e["verdict"] in ("tie", "better")
    assert "ladder gate:" in first.stdout and "stage wall times:" in first.stdout
    curves = (run / "curves.csv").read_text().splitlines()
    assert curves[0] == "model,step,elapsed_s,loss" and len(curves) > 1 and (run / "curves.png").stat().st_size > 0

    # run again: every stage is skipped, the same report
    again = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tmp_path)
    assert again.returncode == 0, again.stderr[-4000:]
    assert again.stderr.count("finished in an earlier run, skipped") == STAGES
    assert json.loads((run / "translate.json").read_text())["budgets"] == result["budgets"]

    # reporting that run with another retraining budget is refused (the cards say what each model was trained on)
    other = subprocess.run([*cmd, "--retrain-bytes", "4K"], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert other.returncode == 2, other.stderr[-2000:]
    assert "models there were retrained on 2,000 tokens each, not 4,000: give --tokens 2000" in other.stderr


def test_bench_translate_refuses_bad_input(tmp_path, capsys, bench):
    assert bench.main(["--out", str(tmp_path / "run"), "--space", "tiny", "--device", "cpu"]) == 2
    assert capsys.readouterr().err == ("bench_translate: error: --space tiny: task causal-lm, not seq2seq (an "
                                       "encoder-decoder translation space)\n")  # fmt: skip
    assert bench.main(["--out", str(tmp_path / "run"), "--quick", "--jobs", "0"]) == 2
    assert capsys.readouterr().err == ("bench_translate: error: --test-pairs / --train-steps / --jobs / --seeds: give a "
                                       "positive integer (--test-pairs 0: all)\n")  # fmt: skip


def test_verdict_rule(bench):
    c = lambda key, ce, chrf: {"key": key, "ce": ce, "chrf": chrf}  # noqa: E731
    assert bench.budget_verdict([c("a", "tie", "tie"), c("b", "better", "better")], "a") == "tie"
    assert bench.budget_verdict([c("a", "better", "tie"), c("b", "tie", "tie")], "a") == "better"
    assert bench.budget_verdict([c("a", "tie", "better")], "a") == "better"
    assert bench.budget_verdict([c("a", "better", "better"), c("b", "tie", "worse")], "a") == "worse"  # worse than any
    assert bench.budget_verdict([c("a", "better", "worse")], "a") == "worse"
    assert bench.budget_verdict([], None) == "no baseline at or below"
    assert bench.chrf_word(0.01, 20.0, 18.0) == "better" and bench.chrf_word(0.01, 18.0, 20.0) == "worse"
    assert bench.chrf_word(0.05, 20.0, 18.0) == "tie" and bench.chrf_word(0.2, 18.0, 20.0) == "tie"
    assert bench.chrf_word(0.001, 18.0, 18.0) == "tie"  # identical scores (sacrebleu's p is then its smallest)


def test_chrf_is_judged_over_seeds_beside_the_paired_bootstrap(bench):
    """A chrF difference counts only when seed 0's paired bootstrap and the seed means (against 2 pooled seed SD of
    chrF) both say so: the issue's "worse" verdicts at 0.85-1.85 seed SD become ties."""
    assert bench.chrf_seed_word([15.0, 15.4], [13.0, 13.2], 0.5) == "better"  # 2.1 points > 2 SD = 1.0
    assert bench.chrf_seed_word([15.0, 15.4], [15.6, 16.0], 0.5) == "tie"  # 0.6 points: within
    assert bench.chrf_seed_word([15.0, 15.4], [17.0, 17.6], 0.5) == "worse"
    assert bench.both_say("worse", "tie") == "tie" and bench.both_say("tie", "better") == "tie"
    assert bench.both_say("better", "better") == "better" and bench.both_say("worse", "worse") == "worse"


def test_best_chrf_is_the_best_model_at_or_under_the_largest_budget(bench):
    rows = [{"key": "a", "subnet": "A", "chrf_mean": 20.0, "measured_ms": 1.0, "test_pairs": 9},
            {"key": "b", "subnet": "B", "chrf_mean": 31.5, "measured_ms": 3.0, "test_pairs": 9},
            {"key": "c", "subnet": "C", "chrf_mean": 40.0, "measured_ms": 3.5, "test_pairs": 9}]
    assert bench.best_chrf(rows, 3.0) == {"key": "b", "subnet": "B", "chrf": 31.5, "measured_ms": 3.0, "test_pairs": 9}
    assert bench.best_chrf(rows, 4.0)["key"] == "c" and bench.best_chrf(rows, 0.5) is None


def test_ladder_gate(bench):
    def rows(ce, chrf):
        return [{"roles": bench.LADDER_ROLE, "params": p, "test_ce_mean": a, "chrf_mean": b}
                for p, a, b in zip((10, 20, 30, 40), ce, chrf)]  # fmt: skip

    ok = bench.ladder_gate(rows([3.0, 2.9, 2.8, 2.7], [10, 11, 12, 13]))
    assert ok["passed"] and ok["spearman_ce"] == pytest.approx(1.0) and ok["spearman_chrf"] == pytest.approx(1.0)
    # chrF not ordered by size (the 300-pair run of the issue: the largest model below smaller ones): no verdicts
    bad = bench.ladder_gate(rows([3.0, 2.9, 2.8, 2.7], [10, 13, 12, 9]))
    assert not bad["passed"] and bad["spearman_ce"] == pytest.approx(1.0) and bad["spearman_chrf"] < 0.8
    assert not bench.ladder_gate(rows([3.0, 2.9], [10, 11]))["passed"]  # fewer than 3 models


def test_split_ce_scores_every_pair_whatever_the_batching(tmp_path):
    from tasks.translation.data import prepare_pairs
    from tasks.translation.model import TranslationTransformer
    from tasks.translation.train import heldout_ce, split_ce

    from tests.tasks.translation.translation_fakes import mini_space

    space = mini_space()
    model = TranslationTransformer(space, space.largest(), generator=torch.Generator().manual_seed(0)).eval()
    pairs = prepare_pairs(str(write_toy_tsv(tmp_path / "toy.tsv", n=200)), tmp_path, seed=0).split("test")
    ce, n_pairs, n_bytes = split_ce(model, pairs, space.max_seq_len, batch_size=3)
    assert n_pairs == len(pairs) and n_bytes == int(pairs.tgt_lengths.sum()) + len(pairs)
    assert split_ce(model, pairs, space.max_seq_len, batch_size=64)[0] == pytest.approx(ce, rel=1e-5)
    one_each = [np.array([i]) for i in range(len(pairs))]  # per pair, weighted by its target bytes
    per = [heldout_ce(model, None, pairs, [b]) for b in one_each]
    weights = pairs.tgt_lengths + 1
    assert ce == pytest.approx(float(np.dot(per, weights) / weights.sum()), rel=1e-5)
    with pytest.raises(ValueError, match="batch_size: 0 is not a positive integer"):
        split_ce(model, pairs, space.max_seq_len, batch_size=0)


def test_paired_bootstrap_is_sacrebleus():
    import sacrebleu

    from tasks.translation.decode import paired_bootstrap

    refs = ["Datei nicht gefunden", "Fehler beim Lesen", "Hallo Welt", "Speichern unter"] * 5
    good = ["Datei nicht gefunde", "Fehler beim Lesen", "Hallo Welt", "Speichern"] * 5
    bad = ["Date", "Fehl", "Hall", "Spei"] * 5
    out = paired_bootstrap(bad, good, refs, samples=200)
    assert out["chrf"]["system"] == pytest.approx(sacrebleu.corpus_chrf(good, [refs]).score)
    assert out["chrf"]["baseline"] == pytest.approx(sacrebleu.corpus_chrf(bad, [refs]).score)
    assert out["chrf"]["p_value"] < 0.05 and "bs:200" in out["signature"]["chrf"]
    assert paired_bootstrap(bad, good, refs, samples=200) == out  # seeded
    same = paired_bootstrap(good, good, refs, samples=200)["chrf"]  # multeval's convention, kept by sacrebleu: a zero
    assert same["p_value"] == pytest.approx(1 / 201)  # difference gets the smallest p; the benchmark calls equal scores a tie
    with pytest.raises(ValueError, match="3 baseline, 20 system and 20 reference sentences"):
        paired_bootstrap(bad[:3], good, refs)


def test_type_balanced_sandwich_rotates_over_both_sides_types():
    from search_spaces import load_space
    from supernet.train import SandwichObjective

    space = load_space(SPACE)
    assert space.attention == ("softmax", "local:4", "linear")
    big = space.largest("linear")
    assert set(big.encoder.attention) == set(big.decoder.attention) == {"linear"}
    assert big.encoder.embed_dim == max(space.encoder.embed_dim) and space.smallest("local:4").attention == ("local:4",) * 4
    assert space.largest() == space.largest("softmax")
    with pytest.raises(ValueError, match="attention type 'mamba' is not offered by both sides"):
        space.largest("mamba")
    objective = SandwichObjective(space, seed=0)
    plans = [dict(objective.plan(step)) for step in range(3)]
    assert [set(p["largest"].attention) for p in plans] == [{"softmax"}, {"local:4"}, {"linear"}]
    usage = objective.usage(3)
    assert set(usage) == set(space.attention) and all(v > 0 for v in usage.values())
