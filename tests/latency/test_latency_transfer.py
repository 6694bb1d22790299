"""Few-shot latency predictors (``nas fit-predictor NEW.csv --from PRED_DIR``) and ``--for-transfer`` sampling.

The devices here are synthetic: latency is a constant plus per-layer costs (the additive model's family), and
a "new device" rescales each kind of cost by its own factor, as a real one does (token mixing, projections and
per-layer overhead do not speed up alike across runtimes and thread counts).
"""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest

from latency.features import table_features
from latency.predictors import Predictor, load_predictor
from latency.predictors.additive import Additive
from latency.predictors.gbt import GBT
from latency.predictors.mlp import MLP
from latency.predictors.predictor import subnet_matrix
from latency.predictors.transfer import (
    fit_scale,
    fit_scratch,
    fit_sources,
    fit_terms,
    fit_transfer,
    load_sources,
    scratch_columns,
    term_factors,
)
from latency.report import agreement
from latency.sampling import campaign_subnets, transfer_subnets
from latency.table import TimingTable, make_meta, read_timings
from latency.timing_core import Result, Settings, format_row
from nas.cli import main

from tests.latency.latency_fakes import MICRO

SETTINGS = Settings(warmup=1, repeats=4, rounds=2, min_sample_ms=1.0, ref_samples=1)
TARGET = {"const": 2.0, "mix": 2.5, "proj": 0.6, "mlp": 0.6, "count": 1.5}  # the new device's factor per kind of cost


def term_costs(names: list[str]) -> np.ndarray:
    """The source device's cost per unit of each additive column."""
    per = {"mix": 1e-6, "proj": 2e-9, "mlp": 2e-9, "count": 5e-3}
    return np.array([next((v for k, v in per.items() if k in n), 1e-8) for n in names])


def device_ms(space, workload, subnets, factors=None, noise=0.0, seed=0) -> np.ndarray:
    """Synthetic latency: 0.5 ms + per-term costs; ``factors`` rescale kinds of cost; ``noise``: lognormal sd."""
    x, names = subnet_matrix("additive", space, workload, subnets)
    f = factors or {}
    scale = np.array([next((v for k, v in f.items() if k in n), 1.0) for n in names])
    ms = 0.5 * f.get("const", 1.0) + x @ (term_costs(names) * scale)
    return ms * np.exp(np.random.default_rng(seed).normal(0, noise, len(ms))) if noise else ms


def write_table(path, space, workload, subnets, ms, retest=(), device="fake-a"):
    """A timing table (CSV + sidecar) of ``subnets`` measured at ``ms``; ``retest``: (subnet, ms) measured again."""
    fp = {"device": device, "runtime": "synthetic", "threads": 1, "cpu_model": "none"}
    names = list(table_features(space, subnets[0], workload))
    table = TimingTable(path, make_meta(fp, space, workload, SETTINGS.to_dict(), 0, names))
    table.set_baseline(1.0)

    def rows(pairs, pass_):
        return [
            format_row(s.key, pass_, s.to_json(), table_features(space, s, workload),
                       Result(float(m), 0.0, float(m), [float(m)], 4, 2, 1, 1.0, 0.0, []), workload.label)
            for s, m in pairs
        ]

    table.append(rows(zip(subnets, ms), "measure"), "measure")
    if retest:
        table.append(rows(retest, "retest"), "retest")
    return path


def source_predictor(space, workload, folder, kind="additive", factors=None, n=150, seed=11):
    """A source device's predictor fitted on ``n`` uniform subnets of its synthetic latency."""
    subnets = campaign_subnets(space, n, seed)
    y = device_ms(space, workload, subnets, factors, noise=0.01, seed=seed)
    x, names = subnet_matrix(kind, space, workload, subnets)
    model = {"additive": lambda: Additive(names), "gbt": lambda: GBT(n_estimators=80), "mlp": lambda: MLP(max_iter=300)}[kind]()
    Predictor(kind, model.fit(x, y, 0), space, workload, {"device": f"source-{kind}"}).save(folder)
    return folder


def test_term_factors_recover_each_terms_scale_and_a_strong_ridge_gives_one_common_factor():
    rng = np.random.default_rng(0)
    contrib = rng.uniform(0.1, 1.0, (12, 4))
    contrib[:, 3] = 0.0  # a term no row exercises
    truth = np.array([2.0, 0.5, 1.5])
    y = contrib[:, :3] @ truth
    free = term_factors(contrib, y, lam=1e-9)
    assert np.allclose(free[:3], truth, rtol=1e-4)  # exact data, no pull: every factor found
    strong = term_factors(contrib, y, lam=1e6)
    assert np.ptp(strong) < 1e-3 and 0.5 < strong[0] < 2.0  # pulled together: one factor, between the true ones
    assert free[3] == pytest.approx(truth.mean(), rel=1e-3)  # the unexercised term gets the common factor: their mean


def test_transfer_from_twenty_rows_meets_the_targets_and_beats_a_fit_from_scratch(tiny, tmp_path):
    w = tiny.workload()
    few = transfer_subnets(tiny, w, 20, seed=1)
    held = campaign_subnets(tiny, 200, seed=5)
    x_few, names = subnet_matrix("transfer", tiny, w, few)
    folders = [str(source_predictor(tiny, w, tmp_path / k, k, {"mix": 1.0 + i})) for i, k in enumerate(("additive", "mlp"))]
    sources = load_sources(folders, tiny, w, names, "few.csv", load_predictor)
    x_held, _ = subnet_matrix("transfer", tiny, w, held)
    y_few = device_ms(tiny, w, few, TARGET, noise=0.02, seed=1)
    y_held = device_ms(tiny, w, held, TARGET, noise=0.02, seed=2)

    mlp = sources[1]  # a learned source is read as a per-layer sum too (fitted to its predictions), so `terms` can rescale it
    truth = device_ms(tiny, w, held, {"mix": 2.0})  # the mlp source's own device
    read, itself = (agreement(p, truth) for p in (mlp.terms.predict(x_held[:, mlp.terms_index]), mlp.predict(x_held)))
    assert mlp.kind == "mlp" and read["mape"] <= itself["mape"]  # the reading is as close to that device as the mlp itself
    model = fit_transfer(sources, x_few, y_few, scratch_columns(tiny, names))
    got = agreement(model.predict(x_held), y_held)
    assert model.method == "terms" and model.label.startswith(f"terms {folders[0]} lam=")  # factors differ by term: terms win
    assert got["kendall_tau"] >= 0.9 and got["within_10"] >= 0.85, got
    scratch = agreement(fit_scratch(scratch_columns(tiny, names), x_few, y_few).predict(x_held), y_held)
    mlp_gbt = {k: agreement(m.fit(subnet_matrix(k, tiny, w, few)[0], y_few, 0).predict(subnet_matrix(k, tiny, w, held)[0]),
                            y_held) for k, m in (("mlp", MLP()), ("gbt", GBT()))}
    for other in (scratch, *mlp_gbt.values()):  # every model nas fit-predictor fits from scratch, on the same 20 rows
        assert got["mape"] < other["mape"] and got["within_10"] > other["within_10"], (got, other)
    unscaled = agreement(sources[0].predict(x_held), y_held)
    assert unscaled["within_10"] < 0.2  # the source alone is far off on the new device: the transfer did the work


def test_every_method_saves_and_loads_to_the_same_predictions(tiny, tmp_path):
    w = tiny.workload()
    paths = {k: source_predictor(tiny, w, tmp_path / k, k, n=40) for k in ("additive", "gbt")}
    few = transfer_subnets(tiny, w, 12, seed=3)
    x, names = subnet_matrix("transfer", tiny, w, few)
    y = device_ms(tiny, w, few, TARGET)
    add, gbt = load_sources([str(paths["additive"]), str(paths["gbt"])], tiny, w, names, "few.csv", load_predictor)
    models = [fit_scale(gbt, x, y), fit_sources([add, gbt], x, y), fit_terms(add, x, y, 0.01), fit_terms(gbt, x, y, 0.01),
              fit_scratch(scratch_columns(tiny, names), x, y)]
    held = campaign_subnets(tiny, 30, seed=9)
    for i, model in enumerate(models):
        Predictor("transfer", model, tiny, w, {"device": "new"}).save(tmp_path / f"m{i}")
        loaded = load_predictor(tmp_path / f"m{i}")
        assert loaded.name == "transfer" and loaded.regressor.label == model.label
        assert np.array_equal(loaded.predict(held), model.predict(subnet_matrix("transfer", tiny, w, held)[0]))
        with np.load(tmp_path / f"m{i}" / "arrays.npz", allow_pickle=False) as z:
            assert all(z[k].dtype != object for k in z.files)
    # a transferred predictor is itself a source (its sources travel inside it)
    (nested,) = load_sources([str(tmp_path / "m1")], tiny, w, names, "few.csv", load_predictor)
    assert nested.kind == "transfer" and np.array_equal(nested.predict(x), models[1].predict(x))


def test_fit_predictor_from_sources_reports_like_a_normal_fit(tiny, tmp_path, capsys):
    w = tiny.workload()
    src = source_predictor(tiny, w, tmp_path / "src", "additive")
    few = transfer_subnets(tiny, w, 20, seed=1)
    ms = device_ms(tiny, w, few, TARGET, noise=0.02, seed=1)
    again = [(s, m * 1.01) for s, m in list(zip(few, ms))[::5]]  # 4 subnets re-measured, 1% apart
    write_table(tmp_path / "few.csv", tiny, w, few, ms, again, device="new")
    assert main(["fit-predictor", str(tmp_path / "few.csv"), "--from", str(src), "--out", str(tmp_path / "p")]) == 0
    out = capsys.readouterr().out
    assert f"source {src}: additive" in out
    assert "scored by the chosen method refitted on the other 16; cross-validation: leave-one-out on all 20" in out
    assert "cv scale" in out and "cv terms" in out and "cv scratch additive" in out
    chosen = next(line for line in out.splitlines() if line.startswith("chosen: "))
    assert "(lowest leave-one-out MAPE)" in chosen
    ceiling = next(line for line in out.splitlines() if line.startswith("test-retest (ceiling)"))
    assert ceiling.split()[2] == "4" and "100.0%" in ceiling  # 4 pairs, all within ±10%
    p = load_predictor(tmp_path / "p")
    assert p.name == "transfer" and p.fingerprint["device"] == "new" and p.metrics["chosen"] == chosen.split(" (")[0][8:]
    assert p.metrics["sources"] == [{"path": str(src), "model": "additive"}] and p.metrics["test_retest"]["n"] == 4
    held = campaign_subnets(tiny, 100, seed=4)
    got = agreement(p.predict(held), device_ms(tiny, w, held, TARGET))
    assert got["kendall_tau"] >= 0.9 and got["within_10"] >= 0.85, got
    assert (tmp_path / "p" / "predicted_vs_measured.png").exists() and (tmp_path / "p" / "report.txt").read_text() in out


def test_plain_tables_transfer_by_column_name(tmp_path, capsys):
    rng = np.random.default_rng(7)

    def plain(path, n, scale, shift, columns=("a", "b", "c")):
        x = dict(zip("abc", rng.uniform(1, 10, (3, n))))
        ms = shift + scale * (0.8 * x["a"] + 1.5 * x["b"] + 0.1 * x["c"])
        rows = zip(*(x[c] for c in columns), ms)
        path.write_text(",".join(columns) + ",ms\n" + "".join(",".join(map(str, r)) + "\n" for r in rows))

    plain(tmp_path / "theirs.csv", 80, 1.0, 0.3)
    theirs = ["fit-predictor", str(tmp_path / "theirs.csv"), "--target", "ms", "--models", "additive,gbt"]
    assert main(theirs + ["--out", str(tmp_path / "src")]) == 0
    plain(tmp_path / "mine.csv", 8, 2.0, 0.6, ("c", "b", "a"))  # other column order, twice as slow
    args = ["fit-predictor", str(tmp_path / "mine.csv"), "--target", "ms", "--from", str(tmp_path / "src")]
    assert main(args + ["--out", str(tmp_path / "p")]) == 0
    assert "chosen: " in capsys.readouterr().out
    p = load_predictor(tmp_path / "p")
    assert p.columns == ["c", "b", "a"] and p.space is None
    probe = np.array([[3.0, 2.0, 1.0]])  # c, b, a
    assert p.predict_features(probe)[0] == pytest.approx(0.6 + 2.0 * (0.8 + 3.0 + 0.3), rel=0.05)


def refusal(argv, capsys) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err


def test_bad_sources_and_too_few_rows_are_refused_in_one_line(tiny, tmp_path, capsys):
    w = tiny.workload()
    few = transfer_subnets(tiny, w, 8, seed=1)
    write_table(tmp_path / "few.csv", tiny, w, few, device_ms(tiny, w, few, TARGET))
    write_table(tmp_path / "four.csv", tiny, w, few[:4], device_ms(tiny, w, few[:4], TARGET))
    good = source_predictor(tiny, w, tmp_path / "good", n=40)
    decode = source_predictor(tiny, tiny.workload("decode"), tmp_path / "decode", n=40)
    (tmp_path / "micro.yaml").write_text(MICRO)
    from search_spaces import load_space

    micro = load_space(str(tmp_path / "micro.yaml"))
    other = source_predictor(micro, micro.workload(), tmp_path / "micro", n=3)
    base = ["fit-predictor", str(tmp_path / "few.csv"), "--out", str(tmp_path / "p")]

    err = refusal(base + ["--from", str(other)], capsys)
    assert f"--from {other}: fitted on space 'micro' (hash {micro.hash}); {tmp_path / 'few.csv'} holds subnets of space " \
           f"'tiny' (hash {tiny.hash}): a source must be of the same space" in err
    err = refusal(base + ["--from", str(good), "--from", str(decode)], capsys)
    assert f"--from {decode}: fitted at workload decode (decode 1x1 at context 255); " in err
    assert "holds timings of workload prefill (prefill 1x256): a source must be of the same workload" in err
    err = refusal(["fit-predictor", str(tmp_path / "four.csv"), "--out", str(tmp_path / "p"), "--from", str(good)], capsys)
    assert err.endswith("four.csv: 4 measured subnets; a transfer (--from) needs at least 5")
    err = refusal(base + ["--from", str(good), "--from", str(good)], capsys)
    assert err.endswith(f"--from: {good} given twice; name each source predictor once")
    err = refusal(base + ["--from", str(good), "--models", "gbt"], capsys)
    assert err.endswith("--models: not used with --from (a transfer chooses among its own candidates by leave-one-out)")
    err = refusal(base + ["--from", str(good), "--folds", "3"], capsys)
    assert err.endswith("--folds: not used with --from (a transfer cross-validates leave-one-out: its rows are few)")

    (tmp_path / "ab.csv").write_text("a,b,ms\n" + "".join(f"{i},{i % 3},{1 + i}\n" for i in range(12)))
    (tmp_path / "cd.csv").write_text("c,d,ms\n" + "".join(f"{i},{i % 3},{1 + i}\n" for i in range(6)))
    (tmp_path / "ac.csv").write_text("a,c,ms\n" + "".join(f"{i},{i % 3},{1 + i}\n" for i in range(6)))
    assert main(["fit-predictor", str(tmp_path / "ab.csv"), "--target", "ms", "--out", str(tmp_path / "ab")]) == 0
    capsys.readouterr()
    plain = ["--target", "ms", "--out", str(tmp_path / "p"), "--from", str(tmp_path / "ab")]
    err = refusal(["fit-predictor", str(tmp_path / "cd.csv"), *plain], capsys)
    assert err.endswith(f"--from {tmp_path / 'ab'}: no feature in common with {tmp_path / 'cd.csv'} "
                        "(the source reads a, b; the table has c, d)")
    err = refusal(["fit-predictor", str(tmp_path / "ac.csv"), *plain], capsys)
    assert err.endswith(f"--from {tmp_path / 'ab'}: reads column(s) b that {tmp_path / 'ac.csv'} lacks; "
                        "a source must read only columns the new table has")
    err = refusal(["fit-predictor", str(tmp_path / "cd.csv"), *plain[:4], "--from", str(good)], capsys)
    assert f"--from {good}: a predictor of subnets of space 'tiny'; {tmp_path / 'cd.csv'} is a plain table (--target)" in err
    assert not (tmp_path / "p").exists()  # nothing written by any refusal


def test_for_transfer_picks_spread_subnets_and_the_table_remembers_it(tiny, tmp_path, capsys):
    for workload in ("prefill", "decode"):
        w = tiny.workload(workload)
        picked = transfer_subnets(tiny, w, 20, seed=0)
        assert picked == transfer_subnets(tiny, w, 20, seed=0) and len({s.key for s in picked}) == 20  # seeded, distinct
        assert picked[:2] == [tiny.largest(), tiny.smallest()]
        assert {layer.attention for s in picked for layer in s.layers} == set(tiny.attention)  # every type, in 20 rows
        others, _ = subnet_matrix("additive", tiny, w, campaign_subnets(tiny, 400, seed=7))  # subnets a search will meet
        scale = np.where(others.std(axis=0) > 0, others.std(axis=0), 1.0)

        def coverage(subnets):  # mean squared distance of those subnets to the nearest pick (standardised additive terms)
            x, _ = subnet_matrix("additive", tiny, w, subnets)
            return (((others[:, None] - x[None]) / scale) ** 2).sum(-1).min(axis=1).mean()

        uniform = [coverage(campaign_subnets(tiny, 20, seed=s)) for s in range(3)]
        assert coverage(picked) < min(uniform), (coverage(picked), uniform)  # closer to every subnet than 20 uniform draws

    (tmp_path / "micro.yaml").write_text(MICRO)
    args = ["measure-latency", str(tmp_path / "micro.yaml"), "--device", "cpu", "--timing-threads", "1", "--samples", "3",
            "--out", str(tmp_path / "t.csv"), "--timing-warmup", "0", "--repeats", "1", "--rounds", "1", "--min-sample-ms", "0",
            "--retest", "0"]
    assert main(args + ["--for-transfer"]) == 0
    assert json.loads((tmp_path / "t.csv.json").read_text())["sampling"] == "transfer"
    assert len(read_timings(tmp_path / "t.csv").rows) == 3
    assert main(args) == 2  # resuming it with uniform draws would mix two ways of choosing subnets
    assert "its sampling is transfer, this run's is None" in capsys.readouterr().err
    with open(tmp_path / "t.csv", newline="") as f:
        assert len(list(csv.DictReader(f))) == 3  # nothing added by the refusal
