"""measure-latency / fit-predictor / predict of a seq2seq space on the cpu: HAT's translate workload timed."""

import csv
import json
from pathlib import Path

import numpy as np
import pytest

from latency.predictors import load_predictor
from latency.table import read_timings
from tasks.translation.features import translate_terms
from nas.cli import main
from tests.tasks.translation.translation_fakes import MINI_SEQ2SEQ, mini_space

FAST = ["--timing-threads", "1", "--timing-warmup", "1", "--repeats", "2", "--rounds", "2", "--min-sample-ms", "1"]


@pytest.fixture(scope="module")
def timed(tmp_path_factory):
    root = tmp_path_factory.mktemp("tl")
    space = root / "mini.yaml"
    space.write_text(MINI_SEQ2SEQ.format(positions="rope"))
    table = root / "t.csv"
    assert main(["measure-latency", str(space), "--device", "cpu", "--samples", "6", "--out", str(table), "-q",
                 *FAST]) == 0
    first = table.read_text()
    # resumed with more samples: the first rows stay as they were, only the new subnets are timed
    assert main(["measure-latency", str(space), "--device", "cpu", "--samples", "24", "--retest", "0.25", "--out",
                 str(table), "-q", *FAST]) == 0  # fmt: skip
    return root, space, table, first


def test_table_holds_translate_rows_with_translation_features_and_resumes(timed, capsys):
    root, space_path, table, first = timed
    space = mini_space()
    t = read_timings(table)
    assert t.workload.kind == "translate" and t.workload.label == "translate:16->16x3"
    measured, retest = t.passes("measure"), t.passes("retest")
    assert len(measured) == 24 and len(retest) >= 1 and set(retest) <= set(measured)
    assert measured[space.largest().key].subnet == space.largest()  # read back as seq2seq subnets
    rows = list(csv.DictReader(table.open()))
    assert {r["workload"] for r in rows} == {"translate:16->16x3"}
    for r in rows[:3]:
        s = space.subnet_type.from_json(r["subnet"])
        terms = translate_terms(space, s, t.workload)
        assert float(r["cross_kv_flops"]) == pytest.approx(terms["cross_kv_flops"])
        assert float(r["flops"]) == pytest.approx(terms["flops"])
        assert [float(r[n]) for n in space.feature_names()] == space.encode(s).tolist()
    # the 6 rows of the first run are the first rows of the grown table, unchanged
    first_rows = [line for line in first.splitlines()[1:] if ",measure," in line]
    assert len(first_rows) == 6 and all(line in table.read_text().splitlines() for line in first_rows)
    # nothing left: a third run measures nothing
    assert main(["measure-latency", str(space_path), "--device", "cpu", "--samples", "24", "--retest", "0.25", "--out",
                 str(table), *FAST]) == 0  # fmt: skip
    assert capsys.readouterr().out.strip() == f"{table}: nothing left to measure"
    meta = json.loads((root / "t.csv.json").read_text())
    assert meta["workload"] == {"name": "translate", "kind": "translate", "source": 16, "steps": 16, "beam": 3}
    assert meta["fingerprint"]["device"] == "cpu" and meta["baseline_ms"] > 0


def test_fit_and_predict_a_translate_predictor(timed, capsys):
    root, _, table, _ = timed
    pred = root / "pred"
    assert main(["fit-predictor", str(table), "--out", str(pred), "--models", "additive,gbt", "--folds", "3", "-q"]) == 0
    out = capsys.readouterr().out
    assert "cv additive" in out and "cv gbt" in out and "test-retest (ceiling)" in out and "chosen:" in out
    p = load_predictor(pred)
    space = mini_space()
    assert p.workload_spec.kind == "translate"
    big, small = space.largest(), space.smallest()
    ms = p.predict([big, small])
    assert np.all(np.isfinite(ms))
    (root / "big.yaml").write_text(big.to_yaml())
    assert main(["predict", "--predictor", str(pred), str(root / "big.yaml"), "-q"]) == 0
    line = capsys.readouterr().out.strip()
    assert line.startswith(f"{ms[0]:.3f} ms  {root / 'big.yaml'}  {big}")


def test_a_device_that_cannot_time_a_translation_space_is_refused_in_one_line(timed, capsys):
    root, space_path, _, _ = timed
    for device in ("tpu",):
        assert main(["measure-latency", str(space_path), "--device", device, "--out", str(root / "x.csv")]) == 2
        assert capsys.readouterr().err == (
            f"nas measure-latency: error: --device: {device!r} is not a device (available: cpu, cuda, onnxruntime, "
            "arm --bundle FILE, ssh://user@host)\n"
        )  # refused with the flags, before the space is read
    assert not (root / "x.csv").exists()


@pytest.fixture(scope="module")
def searched(timed):
    """A supernet trained 3 steps on the toy corpus, a translate predictor fitted on the timings, a search under a
    budget between the predicted latencies of the smallest and the largest subnet."""
    from tests.tasks.translation.translation_fakes import write_toy_tsv

    root, space_path, table, _ = timed
    tsv = write_toy_tsv(root / "toy.tsv")
    run = root / "run"
    assert main(["train-supernet", str(space_path), "--data", str(tsv), "--out", str(run), "--max-steps", "3",
                 "--batch-size", "8", "--eval-batches", "1", "--lr-warmup", "1", "-q"]) == 0  # fmt: skip
    pred = root / "pred-search"
    assert main(["fit-predictor", str(table), "--out", str(pred), "--models", "additive", "-q"]) == 0
    p = load_predictor(pred)
    space = mini_space()
    low, high = p.predict([space.smallest(), space.largest()])
    budget = round(float(low + 0.4 * (high - low)), 3)
    return root, run, pred, budget


def _search(run, pred, out, budget, strategy="evolution"):
    budget_flags = ["--budget", f"{budget}ms"] if budget is not None else []
    return main(["search", str(run / "final.pt"), "--predictor", str(pred), "--out", str(out), *budget_flags,
                 "--strategy", strategy, "--population", "6", "--parents", "3", "--mutations", "3", "--crossovers", "3",
                 "--generations", "2", "--val-windows", "2", "--eval-batch-size", "4", "--device", "cpu", "--no-progress",
                 "-q"])  # fmt: skip


def test_search_a_translation_supernet_under_a_budget(searched, capsys):
    from tasks.translation.space import TranslationSubnet
    from tasks.translation.train import eval_batches, heldout_ce, load_translation_supernet
    from tasks.translation.data import prepare_pairs

    root, run, pred, budget = searched
    out = root / "search"
    assert _search(run, pred, out, budget) == 0
    (best_file,) = out.glob("best_*.yaml")  # one budget, one file
    best = TranslationSubnet.load(best_file)
    summary = json.loads((out / "search.json").read_text())
    entry = next(iter(summary["budgets"].values()))["best"]
    assert entry["key"] == best.key
    # the predicted latency is within the budget, as the predictor says it independently
    assert load_predictor(pred).predict([best])[0] == pytest.approx(entry["latency_ms"]) and entry["latency_ms"] <= budget
    # the fitness is the held-out cross-entropy per target byte of the subnet with the supernet's weights
    supernet, _ = load_translation_supernet(run / "final.pt")
    corpus = prepare_pairs(str(root / "toy.tsv"), run, seed=0)
    batches = eval_batches(corpus.val, 4, supernet.space.max_seq_len, 2, 0)
    assert entry["loss_bpb"] == pytest.approx(heldout_ce(supernet, best, corpus.val, batches), rel=1e-9)
    assert "nats/target byte with inherited weights" in best_file.read_text()
    assert "loss (nats)" in capsys.readouterr().out  # the table's header names the unit
    # a second run of the same command resumes the study: nothing new is evaluated, the same best
    evaluations = summary["evaluations"]
    assert _search(run, pred, out, budget) == 0
    again = json.loads((out / "search.json").read_text())
    assert again["evaluations"] == evaluations and next(iter(again["budgets"].values()))["best"]["key"] == best.key
    # nas export and nas translate accept the best subnet
    export = root / "export"
    assert main(["export", str(run / "final.pt"), "--subnet", str(best_file), "--out", str(export),
                 "--format", "torch", "-q"]) == 0  # fmt: skip
    capsys.readouterr()
    assert main(["translate", "--model", str(export), "file", "--max-bytes", "4", "-q"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 1
    # nas export --predictor --measure --budget: the predicted and the measured latency of the translate workload
    measured = root / "export-measured"
    flags = ["export", str(run / "final.pt"), "--subnet", str(best_file), "--format", "torch", "--predictor",
             str(pred), "--timing-target", "cpu", *FAST, "-q"]  # fmt: skip
    assert main([*flags, "--out", str(measured), "--budget", "10s"]) == 0
    printed = capsys.readouterr().out
    card = json.loads((measured / "model_card.json").read_text())
    m, p = card["measured"], card["latency"]
    assert p["predicted_ms"] == pytest.approx(entry["latency_ms"]) and p["workload"]["kind"] == "translate"
    assert m["workload"] == p["workload"] and m["timed"] == "static model" and m["median_ms"] > 0
    assert m["predicted_ms"] == p["predicted_ms"] and m["over_budget"] is False and m["budget_ms"] == 10000
    assert f"measured          {m['median_ms']:.3f} ms" in printed and "prediction error" in printed
    assert "budget            10s: holds" in printed
    assert main([*flags, "--out", str(root / "export-over"), "--budget", "0.001ms", "--strict"]) == 1
    assert ": OVER" in capsys.readouterr().out


def test_a_translation_search_verified_on_the_device(searched, capsys):
    """--verify: the top candidates of the budget extracted and timed on the cpu (the translate workload of the
    predictor), the best that holds written as verified_<budget>.yaml."""
    from tasks.translation.space import TranslationSubnet

    root, run, pred, budget = searched
    out = root / "search-verified"
    code = main(["search", str(run / "final.pt"), "--predictor", str(pred), "--out", str(out), "--budget", "10s",
                 "--population", "6", "--parents", "3", "--mutations", "3", "--crossovers", "3", "--generations", "1",
                 "--val-windows", "2", "--eval-batch-size", "4", "--device", "cpu", "--no-progress", "-q",
                 "--timing-target", "cpu", "--verify-top", "2", "--timing-threads", "1"])  # fmt: skip
    assert code == 0
    printed = capsys.readouterr().out
    assert "verified on cpu (translate" in printed and "loss (nats)" in printed and "KEPT" in printed
    doc = json.loads((out / "verify.json").read_text())
    (entry,) = doc["budgets"].values()
    assert len(entry["checks"]) == 2 and all(c["measured_ms"] > 0 for c in entry["checks"])
    assert doc["workload"]["steps"] > 0 and entry["verified"] == "verified_10s.yaml"
    kept = next(c for c in entry["checks"] if c["kept"])
    text = (out / "verified_10s.yaml").read_text()
    assert TranslationSubnet.load(out / "verified_10s.yaml").key == kept["key"] and "nats/target byte" in text


def test_random_and_nsga2_search_a_translation_supernet(searched):
    root, run, pred, budget = searched
    for strategy in ("random", "nsga2"):
        out = root / f"search-{strategy}"
        assert _search(run, pred, out, budget, strategy) == 0
        entry = next(iter(json.loads((out / "search.json").read_text())["budgets"].values()))["best"]
        assert entry is not None and entry["latency_ms"] <= budget
    # without --budget: one search for the lowest loss, best_no-budget.yaml
    assert _search(run, pred, root / "search-free", None, "random") == 0
    assert (root / "search-free" / "best_no-budget.yaml").exists()


def test_hurdles_from_scratch_train_the_verified_encoder_decoders(searched, capsys):
    """--hurdles on an encoder-decoder supernet (bench_translate's search): each budget's top candidates that hold on the
    device trained from scratch on the supernet's corpus, scored on the search's validation pairs; the survivor's
    second round continues its first; the best is written as hurdles_<budget>.yaml and loads as a trained model."""
    from tasks.translation.artifact import load_translation_model
    from tasks.translation.space import TranslationSubnet

    root, run, pred, _ = searched
    out = root / "search-hurdles"
    args = ["search", str(run / "final.pt"), "--predictor", str(pred), "--out", str(out), "--budget", "10s",
            "--population", "6", "--parents", "3", "--mutations", "3", "--crossovers", "3", "--generations", "1",
            "--val-windows", "2", "--eval-batch-size", "4", "--device", "cpu", "--no-progress", "-q",
            "--timing-target", "cpu", "--verify-top", "2", "--timing-threads", "1",
            "--hurdles", "2", "--hurdle-candidates", "2", "--hurdle-from", "scratch", "--hurdle-tokens", "2K",
            "--hurdle-batch-size", "8"]  # fmt: skip
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert "hurdles: top 2 per budget, 2 rounds of 2,000 training target bytes (from scratch); nats" in printed
    summary = json.loads((out / "search.json").read_text())
    entry = summary["hurdles"]["budgets"]["10s"]
    held = {c["key"] for c in json.loads((out / "verify.json").read_text())["budgets"]["10s"]["checks"] if c["holds"]}
    first = [r for r in entry["table"] if r["round"] == 0]
    assert len(first) == 2 and {r["key"] for r in first} <= held
    best = entry["best"]
    assert Path(best["model"]).name == "round1" and np.isfinite(best["trained_bpb"]) and best["trained_bpb"] > 0
    model, _ = load_translation_model(best["model"])
    assert model.subnet == TranslationSubnet.load(out / "hurdles_10s.yaml")
    header = (out / "hurdles_10s.yaml").read_text().splitlines()[1]  # the task's own units, not an LM's
    assert header.startswith(f"# trained {best['trained_bpb']:.6f} nats/target byte at round 1 (2 x 2,000 target bytes)")
    card = json.loads((Path(best["model"]) / "model_card.json").read_text())
    # the second round: 2K more target bytes from the first round's weights
    assert card["training"]["token_budget"] == 2000 and card["training"]["init"].endswith("round0")
    # run again: the study resumes, nothing is trained twice, the same best
    assert main(args) == 0
    capsys.readouterr()
    assert json.loads((out / "search.json").read_text())["hurdles"]["budgets"]["10s"]["best"] == best
