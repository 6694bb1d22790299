"""The layer-composed latency predictor (``latency.predictors.layered``) and the MLP's bounded output.

The device here is synthetic and per-layer: each attention type has its own per-layer overhead, FLOP rate for its
token mixing (counted by the type's own cost model) and cost per q/k/v element; the projections and the MLP run at a
matmul rate that sags at small widths; lognormal noise on top.  It is not the predictor's own family term for term
(the matmul rate bends with the width), but it is per-layer, as the predictor assumes.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from latency.features import mixing_flops, projection_flops
from latency.predictors import Predictor, load_predictor
from latency.predictors.layered import Layered, column_groups, pulled_nnls
from latency.predictors.mlp import MLP
from latency.predictors.models import new_model, subnet_matrix
from latency.predictors.transfer import layered_columns, load_sources, source_columns
from latency.report import agreement
from latency.sampling import campaign_subnets
from nas.cli import main
from search_spaces import UserError, Workload, load_space, parse_attention
from tasks.image_classification.timing import image_terms

from tests.latency.test_latency_transfer import write_table

KINDS = ("mlp", "gbt", "additive", "layered")


def device_params(kinds, device: int) -> dict:
    """Each type's per-layer overhead (ms), mixing rate (FLOPs per ms) and cost per q/k/v element (ms), seeded."""
    rng = np.random.default_rng([device, 99])
    return {k: {"over": rng.uniform(0.02, 0.3), "rate": math.exp(rng.uniform(math.log(2e6), math.log(4e7))),
                "elem": rng.uniform(0.5e-6, 3e-6)} for k in kinds}


def layer_ms(p: dict, kind: str, wl: Workload, e: int, heads: int, hd: int, ffn: int, causal: bool) -> float:
    bt, spec = wl.batch_size * wl.tokens, parse_attention(kind)
    matmul = (projection_flops(spec, bt, e, heads, hd) + 4.0 * bt * e * ffn) / (3e7 * e / (e + 48))  # slower when narrow
    t = p[kind]
    mixing = mixing_flops(spec, wl, heads, hd, causal) / t["rate"]
    return t["over"] + matmul + mixing + t["elem"] * bt * heads * hd + 1e-6 * bt * e


def device_ms(space, subnets, device: int = 0, noise: float = 0.02, seed: int = 0, scale: dict | None = None) -> np.ndarray:
    """The synthetic device's milliseconds for ``subnets`` of an LM/encoder or vision space (``scale``: a second device,
    its overheads and mixing rates rescaled by kind)."""
    p = device_params(space.attention, device)
    f = scale or {}
    p = {k: {"over": v["over"] * f.get("over", 1.0), "rate": v["rate"] / f.get("mix", 1.0), "elem": v["elem"]}
         for k, v in p.items()}
    w, out = space.workload(), []
    for s in subnets:
        if hasattr(s, "tokens"):  # a vision subnet: T = its patch count; the stem, patch embedding and head at a matmul rate
            wl, causal = Workload("prefill", w.batch_size, s.tokens), False
            terms = image_terms(space, s, w.batch_size)
            ms = 0.3 + (terms["stem_flops"] + terms["patch_flops"] + terms["head_flops"]) / 2e7 + 1e-6 * s.tokens * s.embed_dim
        else:
            wl, causal = w, space.causal
            ms = 0.3 + 4e-7 * w.batch_size * w.tokens * s.embed_dim
        ms += sum(layer_ms(p, la.attention, wl, s.embed_dim, la.heads, space.head_dim, la.ffn_dim, causal) for la in s.layers)
        out.append(ms * f.get("const", 1.0))
    ms = np.array(out)
    return ms * np.exp(np.random.default_rng([seed, 5]).normal(0, noise, len(ms))) if noise else ms


def held_out_mape(space, kind: str, subnets, y, train, test) -> float:
    x, names = subnet_matrix(kind, space, space.workload(), subnets)
    model = new_model(kind, names).fit(x[train], y[train], 0)
    return agreement(model.predict(x[test]), y[test])["mape"]


MARGIN = {"lra-tiny": 0.7, "vision-tiny": 0.95}  # measured here: 0.51 and 0.86 of the additive model's MAPE


@pytest.mark.parametrize("name", ["lra-tiny", "vision-tiny"])
def test_layered_beats_every_model_from_twenty_timed_subnets_and_nears_the_ceiling(name):
    """Eight devices, each with 20 timed subnets and 40 held out; the learned models (seconds to fit, and far off
    at 20 rows) on the first two."""
    space = load_space(name)
    mape: dict[str, list[float]] = {k: [] for k in KINDS}
    ceiling = []
    for rep in range(8):
        subnets = campaign_subnets(space, 60, seed=rep)
        order = np.random.default_rng(rep).permutation(60)
        train, test = order[:20], order[20:]
        y = device_ms(space, subnets, device=rep, seed=rep)
        again = device_ms(space, subnets, device=rep, seed=rep + 100)  # the same subnets timed a second time
        ceiling.append(agreement(again[test], y[test])["mape"])
        for kind in KINDS if rep < 2 else ("additive", "layered"):
            mape[kind].append(held_out_mape(space, kind, subnets, y, train, test))
    mean = {k: float(np.mean(v)) for k, v in mape.items()}
    first_two = float(np.mean(mape["layered"][:2]))
    assert first_two < mean["mlp"] / 2 and first_two < mean["gbt"] / 2, mape
    assert mean["layered"] < MARGIN[name] * mean["additive"], mape  # the per-layer model it improves on
    assert mean["layered"] <= 2.0 * float(np.mean(ceiling)), (mean, np.mean(ceiling))


def test_pulled_costs_share_a_common_cost_when_data_are_few_and_an_unseen_type_gets_it():
    rng = np.random.default_rng(0)
    a = np.hstack([np.ones((8, 1)), rng.uniform(0.1, 1.0, (8, 3))]) * 0.25
    a[:, 3] = 0.0  # a type no row has
    truth = np.array([1.0, 2.0, 0.5])
    y = a[:, :3] @ truth  # the rows' latencies; rows divided by them give the fit's targets of 1
    groups = np.array([-1, 0, 0, 0])
    free = pulled_nnls(a / y[:, None], groups, 1e-9)
    assert np.allclose(free[:3], truth, rtol=1e-4) and free[3] == pytest.approx(1.25, rel=1e-3)  # unseen: the mean
    pooled = pulled_nnls(a / y[:, None], groups, 1e6)
    assert np.ptp(pooled[1:]) < 1e-3 and 0.5 < pooled[1] < 2.0  # one common cost, between the true ones
    assert column_groups(["model:embed", "layer:mlp", "type[softmax]:mix", "type[local:64]:mix", "type[softmax]:count"],
                         5).tolist() == [-1, -1, 0, 0, 1]


def test_layered_saves_loads_and_refuses_a_tampered_state(tmp_path):
    space = load_space("lra-tiny")
    w = space.workload()
    subnets = campaign_subnets(space, 30, seed=1)
    x, names = subnet_matrix("layered", space, w, subnets)
    model = Layered(names).fit(x, device_ms(space, subnets), 0)
    assert model.names == names and all(v >= 0 for v in model.costs().values())
    Predictor("layered", model, space, w, {"device": "synthetic"}).save(tmp_path / "p")
    loaded = load_predictor(tmp_path / "p")
    held = campaign_subnets(space, 50, seed=2)[30:]
    assert loaded.name == "layered" and np.array_equal(loaded.predict(held), model.predict(subnet_matrix("layered", space,
                                                                                                          w, held)[0]))
    doc = json.loads((tmp_path / "p" / "predictor.json").read_text())
    assert len(doc["model_state"]["lam"]) == 3  # a strength per term group: count, qkv, mix
    doc["model_state"]["lam"] = "strong"
    (tmp_path / "p" / "predictor.json").write_text(json.dumps(doc))
    with pytest.raises(UserError, match=r"predictor.json: not the predictor file this tool writes: model_state.lam: "
                                        r"'strong'; expected a list of numbers"):
        load_predictor(tmp_path / "p")


def test_mlp_output_is_bounded_where_a_feature_never_varied_in_training():
    rng = np.random.default_rng(3)
    x = np.column_stack([rng.uniform(1, 2, 12), np.zeros(12), rng.uniform(1e8, 2e8, 12)])  # column 1: a type never seen
    y = 1.0 + x[:, 0] + x[:, 2] / 1e8
    mlp = MLP().fit(x, y, 0)
    probe = np.array([[1.5, 3e8, 1.5e8], [50.0, 0.0, 9e9]])  # the unseen column lit; then far outside every range
    with np.errstate(over="raise"):
        pred = mlp.predict(probe)
    assert np.all(np.isfinite(pred)) and np.all(pred >= y.min() / 4) and np.all(pred <= y.max() * 4), pred
    assert pred[0] == pytest.approx(mlp.predict(probe[:1] * [1, 0, 1])[0])  # the unseen column held at its constant
    meta, arrays = mlp.state()
    old = MLP.from_state(meta, {k: v for k, v in arrays.items() if not k.startswith("bound.")})  # a file from before
    assert np.array_equal(old.predict(x), MLP.from_state(meta, arrays).predict(x))  # inside the box: the same


def test_fit_predictor_on_twenty_lra_subnets_reports_finite_errors_for_every_model(tmp_path, capsys):
    space = load_space("lra-tiny")
    w = space.workload()
    subnets = campaign_subnets(space, 20, seed=1)  # 20 timed subnets: the MLP's cross-validation overflowed to inf% here
    ms = device_ms(space, subnets)
    write_table(tmp_path / "small.csv", space, w, subnets, ms)
    assert main(["fit-predictor", str(tmp_path / "small.csv"), "--out", str(tmp_path / "p")]) == 0
    out = capsys.readouterr().out
    rows = {line.split()[1]: line.split() for line in out.splitlines() if line.startswith("cv ")}
    assert sorted(rows) == sorted(KINDS), out
    for kind, cols in rows.items():
        assert math.isfinite(float(cols[4].rstrip("%"))), (kind, out)  # MAPE
    assert "inf%" not in out


def test_transfer_from_a_layered_source_and_the_layered_scratch_candidate(tmp_path, capsys):
    space = load_space("lra-tiny")
    w = space.workload()
    source_subnets = campaign_subnets(space, 120, seed=11)
    x, names = subnet_matrix("layered", space, w, source_subnets)
    src = tmp_path / "src"
    Predictor("layered", Layered(names).fit(x, device_ms(space, source_subnets, seed=11), 0), space, w,
              {"device": "source"}).save(src)
    view, view_names = subnet_matrix("transfer", space, w, source_subnets[:2])
    assert source_columns(load_predictor(src), view_names) == [f"cost:{n}" for n in names]
    index, stripped = layered_columns(view_names)
    assert stripped == names and [view_names[i] for i in index] == [f"cost:{n}" for n in names]
    (source,) = load_sources([str(src)], space, w, view_names, "few.csv", load_predictor)
    assert np.allclose(source.predict(view), load_predictor(src).predict(source_subnets[:2]))

    new = {"mix": 2.5, "over": 1.5, "const": 1.2}  # the new device: token mixing 2.5x slower, overheads 1.5x
    few = campaign_subnets(space, 20, seed=1)
    ms = device_ms(space, few, seed=1, scale=new)
    write_table(tmp_path / "few.csv", space, w, few, ms, [(s, m * 1.01) for s, m in list(zip(few, ms))[::5]], device="new")
    assert main(["fit-predictor", str(tmp_path / "few.csv"), "--from", str(src), "--out", str(tmp_path / "p")]) == 0
    out = capsys.readouterr().out
    assert f"source {src}: layered" in out and "cv scale" in out and "cv terms" in out and "cv scratch layered" in out
    p = load_predictor(tmp_path / "p")
    assert p.name == "transfer" and p.metrics["sources"] == [{"path": str(src), "model": "layered"}]
    held = campaign_subnets(space, 100, seed=4)[20:]
    got = agreement(p.predict(held), device_ms(space, held, noise=0.0, scale=new))
    assert got["kendall_tau"] >= 0.9 and got["within_10"] >= 0.85, got
