import json

import numpy as np
import pytest
import torch

from latency import features as F
from latency.predictors import Predictor, load_predictor
from latency.predictors.additive import Additive
from latency.predictors.gbt import GBT
from latency.predictors.mlp import MLP
from latency.predictors.predictor import subnet_matrix
from latency.report import agreement
from nas.cli import main
from search_spaces import Subnet, UserError, load_space
from supernet import SuperTransformer


def sample(space, n, seed):
    rng = np.random.default_rng(seed)
    return [space.sample(rng) for _ in range(n)]


def synthetic_ms(space, subnets):
    """A latency that is exactly constant + per-layer costs (the additive model's family)."""
    w = space.workload()
    x, names = subnet_matrix("additive", space, w, subnets)
    cost = np.array(
        [1e-6 if "mix" in n else 2e-9 if ("proj" in n or "mlp" in n) else 5e-3 if "count" in n else 1e-8 for n in names]
    )
    return 0.5 + x @ cost


def test_params_match_the_supernet_and_flops_grow_with_the_subnet(tiny):
    model = SuperTransformer(tiny, generator=torch.Generator().manual_seed(0))
    for s in sample(tiny, 30, 1) + [tiny.largest(), tiny.smallest()]:
        assert F.params(tiny, s) == model.num_params(s)
    base = load_space("base")
    with torch.device("meta"):
        big = SuperTransformer(base)
    assert F.params(base, base.largest()) == big.num_params(base.largest())
    w = base.workload()
    assert F.flops(base, base.largest(), w) > 10 * F.flops(base, base.smallest(), w)
    from search_spaces import Workload, parse_attention

    def mix(attention, t, heads=2, hd=8):  # FLOPs of the token mixing: 4 x pairs x heads x hd for the softmax family
        return F.mixing_flops(parse_attention(attention), Workload("prefill", 1, t), heads, hd)

    assert mix("local:4", 6) == 4 * (1 + 2 + 3 + 4 + 4 + 4) * 2 * 8 and mix("softmax", 6) == 4 * 21 * 2 * 8
    assert mix("linear", 6) == 2 * 2 * (2 * 6 * 64 * 8 + 2 * 6 * 8 * 8)  # a chunked state, not pairs
    gqa = Subnet(base.max_embed_dim, 1, (12,), (768,), ("gqa:2",))
    full = Subnet(base.max_embed_dim, 1, (12,), (768,), ("softmax",))
    assert F.flops(base, gqa, w) < F.flops(base, full, w)  # fewer key/value projections


def test_additive_model_recovers_costs_and_extrapolates_to_unseen_depth(tiny):
    shallow = [s for s in sample(tiny, 400, 2) if s.depth <= 3][:80]
    deep = [s for s in sample(tiny, 400, 3) if s.depth == 4][:20]
    w = tiny.workload()
    x, _ = subnet_matrix("additive", tiny, w, shallow)
    model = Additive().fit(x, synthetic_ms(tiny, shallow))
    xd, _ = subnet_matrix("additive", tiny, w, deep)
    pred = model.predict(xd)
    assert np.allclose(pred, synthetic_ms(tiny, deep), rtol=1e-3)  # depth 4 never seen in training
    assert all(v >= 0 for v in model.costs().values())


def test_gbt_numpy_walk_equals_sklearn_and_mlp_learns_a_smooth_target(tiny):
    subnets = sample(tiny, 120, 4)
    y = synthetic_ms(tiny, subnets)
    x, _ = subnet_matrix("gbt", tiny, tiny.workload(), subnets)
    gbt = GBT(n_estimators=50).fit(x[:100], y[:100], seed=0)
    assert np.allclose(gbt.predict(x), np.exp(gbt.sklearn.predict(x)), rtol=1e-12)
    mlp = MLP().fit(x[:100], y[:100], seed=0)
    assert agreement(mlp.predict(x[100:]), y[100:])["mape"] < 0.15
    assert np.array_equal(MLP().fit(x[:100], y[:100], seed=0).predict(x), mlp.predict(x))  # same seed, same model


@pytest.mark.parametrize("kind", ["additive", "gbt", "mlp"])
def test_predictor_save_load_round_trip_and_refusals(tiny, tmp_path, kind):
    subnets = sample(tiny, 60, 5)
    y = synthetic_ms(tiny, subnets)
    w = tiny.workload()
    x, _ = subnet_matrix(kind, tiny, w, subnets)
    reg = {"additive": Additive, "gbt": lambda: GBT(n_estimators=40), "mlp": lambda: MLP(max_iter=200)}[kind]().fit(x, y, 0)
    fp = {"device": "cpu", "threads": 2}
    Predictor(kind, reg, tiny, w, fp, reference_ms=12.5).save(tmp_path / "p")
    loaded = load_predictor(tmp_path / "p")
    assert loaded.name == kind and loaded.space_hash == tiny.hash and loaded.workload == "prefill" and loaded.fingerprint == fp
    assert loaded.reference_ms == 12.5  # the campaign's drift anchor travels with the predictor
    assert np.array_equal(loaded.predict(subnets), Predictor(kind, reg, tiny, w, fp).predict(subnets))
    with np.load(tmp_path / "p" / "arrays.npz", allow_pickle=False) as z:
        assert all(z[k].dtype != object for k in z.files)
    loaded.check_space(tiny)
    with pytest.raises(UserError, match=r"fitted on space 'tiny' \(hash .*\); space 'base' .* refit the predictor"):
        loaded.check_space(load_space("base"))
    with pytest.raises(UserError, match="not in space 'tiny'"):
        loaded.predict([load_space("base").largest()])


def test_loading_refuses_foreign_or_tampered_files(tiny, tmp_path):
    subnets = sample(tiny, 30, 6)
    x, _ = subnet_matrix("additive", tiny, tiny.workload(), subnets)
    Predictor("additive", Additive().fit(x, synthetic_ms(tiny, subnets)), tiny, tiny.workload(), {}).save(tmp_path / "p")
    doc = json.loads((tmp_path / "p" / "predictor.json").read_text())
    doc["space"]["vocab_size"] = 999
    (tmp_path / "p" / "predictor.json").write_text(json.dumps(doc))
    with pytest.raises(UserError, match="does not match its space"):
        load_predictor(tmp_path / "p")
    (tmp_path / "p" / "predictor.json").write_text(json.dumps({"format": "something-else"}))
    with pytest.raises(UserError, match="not a latency predictor"):
        load_predictor(tmp_path / "p")
    with pytest.raises(UserError, match="arrays.npz missing|predictor.json missing"):
        load_predictor(tmp_path / "nothing")


def test_fit_predictor_on_a_plain_csv_and_predict_cli(tiny, tmp_path, capsys):
    rng = np.random.default_rng(7)
    a, b = rng.uniform(1, 10, 80), rng.uniform(1, 5, 80)
    ms = 0.3 + 0.8 * a + 1.5 * b
    (tmp_path / "plain.csv").write_text("a,b,ms\n" + "".join(f"{p},{q},{r}\n" for p, q, r in zip(a, b, ms)))
    assert (
        main(
            [
                "fit-predictor",
                str(tmp_path / "plain.csv"),
                "--target",
                "ms",
                "--out",
                str(tmp_path / "pp"),
                "--models",
                "additive,gbt",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "chosen: additive" in out and "test-retest: not available" in out
    plain = load_predictor(tmp_path / "pp")
    assert plain.columns == ["a", "b"] and np.allclose(plain.predict_features([[2.0, 1.0]]), [0.3 + 1.6 + 1.5], rtol=1e-3)
    assert (tmp_path / "pp" / "predicted_vs_measured.png").stat().st_size > 1000

    subnets = sample(tiny, 20, 8)
    x, _ = subnet_matrix("additive", tiny, tiny.workload(), subnets)
    p = Predictor("additive", Additive().fit(x, synthetic_ms(tiny, subnets)), tiny, tiny.workload(), {"device": "cpu"})
    p.save(tmp_path / "sp")
    (tmp_path / "s.yaml").write_text(tiny.largest().to_yaml())
    assert main(["predict", "--predictor", str(tmp_path / "sp"), str(tmp_path / "s.yaml")]) == 0
    line = capsys.readouterr().out
    assert f"{p.predict([tiny.largest()])[0]:10.3f} ms" in line
    assert main(["predict", "--predictor", str(tmp_path / "sp"), "--space", "base", str(tmp_path / "s.yaml")]) == 2
    assert main(["predict", "--predictor", str(tmp_path / "pp"), str(tmp_path / "s.yaml")]) == 2
