"""Inherited-weight fitness on a real (small, untrained) supernet, and ``nas search`` end to end."""

from __future__ import annotations

import json
import math
import sys
import types

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from nas.cli import main
from nas.search import AnalyticLatency, CachedFitness, InheritedLoss, param_counter
from search_spaces import Subnet, UserError, load_space
from supernet import SuperTransformer, extract
from supernet.checkpoint import save_checkpoint


@pytest.fixture(scope="module")
def supernet(tiny):
    return SuperTransformer(tiny, generator=torch.Generator().manual_seed(0)).eval()


def test_inherited_loss_equals_the_extracted_models_loss(tiny, supernet):
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 256, size=32 + 3).astype(np.uint8)  # exactly 3 windows of 32 + 1 tokens
    fitness = InheritedLoss(supernet, tokens, seq_len=32, windows=3, batch_size=2, seed=5)
    subnets = [tiny.largest(), tiny.smallest()] + [tiny.sample(rng) for _ in range(3)]
    got = fitness(subnets)
    data = torch.from_numpy(np.stack([tokens[s : s + 33] for s in range(3)]).astype(np.int64))
    for subnet, loss in zip(subnets, got):
        with torch.no_grad():
            logits = extract(supernet, subnet)(data[:, :-1])
        want = F.cross_entropy(logits.flatten(0, 1), data[:, 1:].flatten()).item() / math.log(2)
        assert loss == pytest.approx(want, abs=1e-5)
    assert np.array_equal(fitness(subnets[::-1]), got[::-1])  # deterministic, order-independent
    assert 7.0 < got.mean() < 9.5  # an untrained byte model is near log2(256) = 8 bits


def test_separability_reports_the_standard_error_and_paired_differences(tiny, supernet):
    from nas.search.fitness import separability, separability_text

    rng = np.random.default_rng(1)
    tokens = rng.integers(0, 256, size=4000).astype(np.uint8)
    fitness = InheritedLoss(supernet, tokens, seq_len=32, windows=12, batch_size=5, seed=2)
    subnets = [tiny.largest(), tiny.smallest(), tiny.sample(rng)]
    sep = separability(fitness, subnets)
    per = np.stack([fitness.heldout.window_bits(supernet, s) for s in subnets])  # (3, 12) per-window bits
    assert sep["windows"] == 12 and sep["tokens"] == 12 * 32
    assert np.allclose(sep["means"], fitness(subnets), atol=1e-9)  # the windows' mean is the fitness
    assert sep["se"] == pytest.approx(np.median(per.std(1, ddof=1) / np.sqrt(12)))
    d = per[1] - per[0]
    assert sep["vs_first"][0]["diff"] == pytest.approx(d.mean()) and sep["vs_first"][0]["se"] == pytest.approx(
        d.std(ddof=1) / np.sqrt(12)
    )
    assert sep["spread"] == pytest.approx(per.mean(1).max() - per.mean(1).min())
    text = separability_text("3ms", sep)
    assert text.startswith("3ms: fitness on 12 windows (384 tokens)") and "paired SE" in text


def test_fitness_checks_its_input(supernet):
    with pytest.raises(UserError, match="fewer than one window"):
        InheritedLoss(supernet, np.zeros(10, np.uint8), seq_len=32)
    with pytest.raises(UserError, match="--seq-len: 999"):
        InheritedLoss(supernet, np.zeros(2000, np.uint8), seq_len=999)


def test_cached_fitness_evaluates_each_subnet_once(tiny):
    calls = []

    def fitness(subnets):
        calls.append(list(subnets))
        return np.array([float(s.embed_dim) for s in subnets])

    cached = CachedFitness(fitness)
    a, b = tiny.largest(), tiny.smallest()
    assert cached([a, b, a]).tolist() == [128.0, 64.0, 128.0]
    assert cached([b, a]).tolist() == [64.0, 128.0]
    assert calls == [[a, b]] and cached.evaluations == 2


# --------------------------------------------------------------------------- the CLI


class FakePredictor:
    """Stands in for a fitted predictor file (issue 6's ``load_predictor``): the analytic proxy, bound to a space."""

    def __init__(self, space):
        self._proxy = AnalyticLatency(space)
        self.space_hash, self.name, self.workload = space.hash, "analytic", space.workload().name
        self.fingerprint = {"device": "cpu", "runtime": "torch-eager", "threads": 1, "cpu_model": "Fake CPU"}

    def predict(self, subnets):
        return self._proxy.predict(subnets)

    def check_space(self, space):
        if space.hash != self.space_hash:
            raise UserError(f"predictor: fit on space hash {self.space_hash}, not {space.name!r} ({space.hash})")


@pytest.fixture
def run_dir(tmp_path, tiny, supernet, monkeypatch):
    """A checkpoint of the untrained tiny supernet, held-out bytes, and a predictor loader that returns the fake."""
    ckpt = save_checkpoint(tmp_path / "supernet.pt", supernet)
    (tmp_path / "val.txt").write_bytes((b"def f(x):\n    return x * 2\n" * 40))
    (tmp_path / "pred.json").write_text("{}")
    try:
        import latency.predictors as predictors
    except ImportError:  # issue 6 not merged yet: a module with just the loader
        predictors = types.ModuleType("latency.predictors")
        monkeypatch.setitem(sys.modules, "latency.predictors", predictors)
    spaces = {"pred.json": FakePredictor(tiny)}
    monkeypatch.setattr(predictors, "load_predictor", lambda path: spaces[str(path).rsplit("/", 1)[-1]], raising=False)
    return tmp_path, ckpt, spaces


def search_args(tmp, ckpt, *extra):
    return [
        "search",
        str(ckpt),
        "--predictor",
        str(tmp / "pred.json"),
        "--val-data",
        str(tmp / "val.txt"),
        "--val-windows",
        "2",
        "--seq-len",
        "32",
        "--population",
        "8",
        "--parents",
        "3",
        "--mutations",
        "4",
        "--crossovers",
        "4",
        "--generations",
        "3",
        "--out",
        str(tmp / "out"),
        "--no-progress",
        *extra,
    ]


def test_search_cli_end_to_end_and_resume(run_dir, capsys, tiny):
    tmp, ckpt, _ = run_dir
    params = param_counter(tiny)
    assert main(search_args(tmp, ckpt, "--budget", "3ms,6ms", "--max-params", "400k")) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].split() == ["budget", "loss", "(bpb)", "latency", "params", "evals", "subnet"]
    summary = json.loads((tmp / "out" / "search.json").read_text())
    for label in ("3ms", "6ms"):  # the fitness's standard error beside the spread of the budget's top candidates
        sep = summary["separability"][label]
        assert sep["means"][0] == pytest.approx(summary["budgets"][label]["best"]["loss_bpb"], abs=1e-9) and sep["se"] > 0
        assert f"{label}: fitness on {sep['windows']} windows" in out
    proxy = AnalyticLatency(tiny)
    for label, limit in (("3ms", 3.0), ("6ms", 6.0)):
        best = Subnet.load(tmp / "out" / f"best_{label}.yaml")
        assert best in tiny and proxy.predict([best])[0] <= limit and params(best) <= 400_000
        entry = summary["budgets"][label]["best"]
        assert entry["key"] == best.key and entry["latency_ms"] <= limit
        assert f"{label:<10} {entry['loss_bpb']:>10.4f}" in out
    rows = (tmp / "out" / "pareto.csv").read_text().splitlines()
    assert rows[0].startswith("trial,budget,generation,loss_bpb,latency_ms") and len(rows) > 20
    assert (tmp / "out" / "pareto.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    # the same command again: resumes the finished study, evaluates nothing, says the same
    import optuna

    db = f"sqlite:///{tmp / 'out' / 'search.db'}"
    n_trials = len(optuna.load_study(study_name=summary["study"], storage=db).trials)
    assert main(search_args(tmp, ckpt, "--budget", "3ms,6ms", "--max-params", "400k")) == 0
    assert capsys.readouterr().out == out
    assert len(optuna.load_study(study_name=summary["study"], storage=db).trials) == n_trials


def test_search_cli_refuses_an_infeasible_budget_with_the_smallest_latency(run_dir, capsys, tiny):
    tmp, ckpt, _ = run_dir
    from nas.search.constraints import lightest_subnets

    fastest = AnalyticLatency(tiny).predict(lightest_subnets(tiny)).min()
    assert main(search_args(tmp, ckpt, "--budget", "20us,50ms")) == 2
    err = capsys.readouterr().err
    assert err.startswith(
        "nas search: error: --budget 0.02ms is infeasible on cpu (torch-eager, threads 1) on Fake CPU, "
        "analytic predictor from pred.json: the smallest latency"
    )
    assert f"reaches is {fastest:.6g}ms" in err and "50ms" not in err


def test_search_cli_refuses_a_predictor_of_another_space(run_dir, capsys):
    tmp, ckpt, spaces = run_dir
    spaces["pred.json"] = FakePredictor(load_space("base"))
    assert main(search_args(tmp, ckpt, "--budget", "50ms")) == 2
    assert "predictor: fit on space hash" in capsys.readouterr().err


def test_search_cli_reads_the_checkpoints_validation_split(run_dir, capsys, supernet, tmp_path):
    pytest.importorskip("supernet.data")
    tmp, _, _ = run_dir
    (tmp / "corpus").mkdir()
    (tmp / "corpus" / "a.txt").write_text("def f(x):\n    return x + 1\n" * 200)
    (tmp / "corpus" / "b.txt").write_text("class A:\n    pass\n" * 200)
    ckpt = save_checkpoint(tmp / "meta.pt", supernet, data=str(tmp / "corpus"), data_seed=0, val_fraction=0.5)
    args = [a for a in search_args(tmp, ckpt, "--budget", "6ms") if a not in ("--val-data", str(tmp / "val.txt"))]
    assert main(args) == 0
    assert "validation split" in capsys.readouterr().err


def fit_real_predictor(space, directory):
    """A real predictor file of issue 6 (additive model), fitted to the analytic proxy's milliseconds."""
    from latency.predictors.predictor import MODELS, Predictor, subnet_matrix

    rng = np.random.default_rng(0)
    subnets = [space.sample(rng) for _ in range(150)]
    x, names = subnet_matrix("additive", space, space.workload(), subnets)
    regressor = MODELS["additive"](names).fit(x, AnalyticLatency(space).predict(subnets), seed=0)
    fingerprint = {"device": "cpu", "runtime": "torch-eager", "threads": 1, "cpu_model": "Test CPU"}
    return Predictor("additive", regressor, space, space.workload(), fingerprint).save(directory)


def test_search_cli_with_a_real_predictor_file(tmp_path, tiny, supernet, capsys):
    pytest.importorskip("latency.predictors")
    from latency.predictors import load_predictor

    ckpt = save_checkpoint(tmp_path / "supernet.pt", supernet)
    (tmp_path / "val.txt").write_bytes(b"import os\nprint(os.getcwd())\n" * 40)
    pred = fit_real_predictor(tiny, tmp_path / "pred")
    args = [
        "search",
        str(ckpt),
        "--predictor",
        str(pred),
        "--val-data",
        str(tmp_path / "val.txt"),
        "--val-windows",
        "2",
        "--seq-len",
        "32",
        "--population",
        "6",
        "--parents",
        "2",
        "--mutations",
        "3",
        "--crossovers",
        "3",
        "--generations",
        "2",
        "--out",
        str(tmp_path / "out"),
        "--no-progress",
    ]
    assert main(args + ["--budget", "6ms"]) == 0
    best = Subnet.load(tmp_path / "out" / "best_6ms.yaml")
    assert load_predictor(pred).predict([best])[0] <= 6.0
    first = capsys.readouterr()
    assert "nas search: " in first.err and "additive predictor from predictor.json" in first.err  # the notes, through logging
    assert main(args + ["--budget", "6ms", "-q"]) == 0  # the finished study again, quietly: the same table, no notes
    quiet = capsys.readouterr()
    assert quiet.out == first.out and quiet.err == ""

    other = fit_real_predictor(load_space("base"), tmp_path / "base-pred")
    assert main(args + ["--budget", "6ms", "--predictor", str(other)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("nas search: error: predictor was fitted on space 'base'") and "refit the predictor" in err
