"""The ranking the search trusts: a type-balanced sandwich, Q/K/V/O per attention family, a ranker calibrated on
retrained models, the first generation opened by each type's uniform model, hurdles from scratch."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import numpy as np
import pytest
import torch

from nas.cli import main
from nas.search import Evolution, SearchConfig
from nas.search.calibrated import (
    CalibratedFitness,
    Ranker,
    Retrained,
    best_uniform_per_type,
    fit_ranker,
    load_ranker,
    report_text,
)
from nas.search.hurdles import SubnetTrainer, hurdle_config
from nas.search.verify import Candidate, add_extra
from search_spaces import Subnet, UserError, load_space
from supernet import SuperTransformer
from supernet.checkpoint import load_supernet, save_checkpoint
from supernet.data import prepare_corpus
from supernet.train import SandwichObjective, SupernetCheckpointer, TrainConfig, train

from tests.supernet.test_train import CONFIG, max_diff, state_of
from tests.supernet.test_train import docs as docs  # noqa: F401  (the module's fixture)
from tests.supernet.test_train import micro as micro  # noqa: F401
from tests.supernet.test_train import one_thread as one_thread  # noqa: F401
from tests.supernet.test_train import space_file as space_file  # noqa: F401

# --------------------------------------------------------------------------- the type-balanced sandwich


def test_balanced_sandwich_rotates_the_types_and_the_teacher(micro):  # noqa: F811
    obj = SandwichObjective(micro, seed=0)
    assert obj.balance == "types"
    for step in range(6):
        t = micro.attention[step % 3]
        plan = obj.plan(step)
        assert plan[0] == ("largest", micro.largest(t)) and plan[1] == ("smallest", micro.smallest(t))
        assert set(plan[0][1].attention) == {t}  # the teacher (pass 0) is that step's largest
    first = SandwichObjective(micro, seed=0, balance="first")
    assert all(first.plan(s)[0][1] == micro.largest() for s in range(6))
    assert obj.fixed_subnets() == {micro.largest(t) for t in micro.attention} | {micro.smallest(t) for t in micro.attention}
    with pytest.raises(UserError, match="--balance: 'most' is not one of types, first"):
        SandwichObjective(micro, balance="most")
    with pytest.raises(UserError, match=r"--split-at: 1.5 is not a fraction of the run in \[0, 1\)"):
        SandwichObjective(micro, split="families", split_at=1.5)


def test_layer_passes_per_type_stay_within_1_5x_where_the_first_type_got_12x():
    space = load_space("long")  # 11 types, as the claim's supernet
    balanced = SandwichObjective(space, seed=0).usage(1100)
    old = SandwichObjective(space, seed=0, balance="first").usage(1100)
    assert set(balanced) == set(space.attention)
    assert max(balanced.values()) / min(balanced.values()) <= 1.5
    ratio_old = old[space.attention[0]] / np.mean([v for k, v in old.items() if k != space.attention[0]])
    assert ratio_old > 8  # the rule before: the first type about 12x any other
    # the counts are those of the plans: every layer of every pass
    assert sum(balanced.values()) == sum(s.depth for step in range(1100) for _, s in SandwichObjective(space, seed=0).plan(step))


# --------------------------------------------------------------------------- Q/K/V/O per family


def test_split_families_warm_starts_then_separates_and_extraction_follows(micro):  # noqa: F811
    model = SuperTransformer(micro, generator=torch.Generator().manual_seed(0), split_families=True).eval()
    assert model.families == ("dot-product", "kernel-feature") and not model.families_split
    rng = np.random.default_rng(0)
    subnets = [micro.sample(rng) for _ in range(8)] + [micro.largest(t) for t in micro.attention]
    x = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        before = [model(x, s) for s in subnets]
        model.split_families()
        after = [model(x, s) for s in subnets]
    assert model.families_split
    assert all(torch.equal(a, b) for a, b in zip(before, after))  # the warm start is the shared weights exactly
    with torch.no_grad():
        for blk in model.blocks:
            blk.attn.fam["kernel-feature"].q.weight.mul_(1.5)
        changed = [model(x, s) for s in subnets]
    for s, a, c in zip(subnets, after, changed):
        uses_linear = "linear" in s.attention
        assert torch.equal(a, c) != uses_linear, s  # only subnets with a kernel-feature layer move
        with torch.no_grad():
            assert (model.extract(s)(x) - c).abs().max().item() == 0.0  # extraction copies the family's weights
    assert model.num_params(micro.largest()) == model.extract(micro.largest()).num_params()


def test_split_state_survives_a_checkpoint_and_old_checkpoints_load(micro, tmp_path):  # noqa: F811
    model = SuperTransformer(micro, generator=torch.Generator().manual_seed(0), split_families=True)
    model.split_families()
    save_checkpoint(tmp_path / "split.pt", model)
    loaded, _ = load_supernet(tmp_path / "split.pt")
    assert loaded.families == model.families and loaded.families_split
    s = micro.largest("linear")
    x = torch.randint(0, 256, (1, 12), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        assert torch.equal(loaded(x, s), model.eval()(x, s))
    plain = SuperTransformer(micro, generator=torch.Generator().manual_seed(0))  # a checkpoint of before the split option
    save_checkpoint(tmp_path / "plain.pt", plain)
    loaded, _ = load_supernet(tmp_path / "plain.pt")
    assert loaded.families == () and not loaded.families_split


def _train(space, docs, out, max_steps, resume=False, stop_at=None):  # noqa: F811
    corpus = prepare_corpus(str(docs), out, seed=0, val_fraction=0.2)
    model = SuperTransformer(space, generator=torch.Generator().manual_seed(0), split_families=True)
    config = TrainConfig(**CONFIG, max_steps=max_steps)
    meta = {"data": str(docs), "data_seed": 0, "val_fraction": 0.2, "corpus_hash": corpus.hash}

    def progress(info):
        if info.step == stop_at:
            os.kill(os.getpid(), signal.SIGINT)  # the step finishes, a checkpoint is saved, the run returns

    return model, train(model, SandwichObjective(space, seed=0, split="families", split_at=0.5), corpus.train, corpus.val,
                        config, out=out, checkpointer=SupernetCheckpointer(space), meta=meta, resume=resume, progress=progress)


@pytest.mark.parametrize("stop_at", [3, 7])  # interrupted before the split (at step 5 of 10), and after it
def test_a_split_run_resumed_equals_the_uninterrupted_one(micro, docs, tmp_path, stop_at):  # noqa: F811
    model, straight = _train(micro, docs, tmp_path / "straight", 10)
    assert model.families_split
    notes = [json.loads(line) for line in (tmp_path / "straight" / "log.jsonl").read_text().splitlines()]
    assert [n["step"] for n in notes if n["event"] == "note"] == [5]
    _, stopped = _train(micro, docs, tmp_path / "stopped", 10, stop_at=stop_at)
    assert stopped.stopped == "interrupted" and stopped.step == stop_at
    _, resumed = _train(micro, docs, tmp_path / "stopped", 10, resume=True)
    assert resumed.step == 10
    a, opt_a = state_of(tmp_path / "straight" / "final.pt")
    b, opt_b = state_of(tmp_path / "stopped" / "final.pt")
    assert bool(b["split_state"]) and max_diff(a, b) <= 1e-6
    assert max(max_diff(opt_a[i], opt_b[i]) for i in opt_a) <= 1e-6
    passes = json.loads((tmp_path / "stopped" / "type_passes.json").read_text())
    assert passes["step"] == 10 and passes["passes"] == SandwichObjective(micro, seed=0).usage(10)


def test_a_run_from_before_balance_resumes_with_its_old_rule(space_file, docs, tmp_path, capsys):  # noqa: F811
    out = tmp_path / "run"
    args = ["train-supernet", str(space_file), "--out", str(out), "--data", str(docs), "--batch-size", "4", "--seq-len", "16",
            "--max-steps", "3", "--eval-interval", "3", "--threads", "1"]
    assert main(args) == 0
    payload = torch.load(out / "latest.pt", weights_only=True)
    assert payload["meta"]["objective"]["balance"] == "types"
    del payload["meta"]["objective"]["balance"]  # as a checkpoint written before --balance
    torch.save(payload, out / "latest.pt")
    assert main(["train-supernet", "--out", str(out), "--resume", "--max-steps", "4"]) == 0
    assert torch.load(out / "latest.pt", weights_only=True)["meta"]["objective"]["balance"] == "first"
    assert main(["train-supernet", "--out", str(out), "--resume", "--max-steps", "5", "--balance", "types"]) == 2
    assert "--balance types differs from the run's first" in capsys.readouterr().err
    assert main([*args[:2], "--out", str(tmp_path / "x"), "--split", "all"]) == 2
    assert "--split: 'all' is not one of none, families" in capsys.readouterr().err


# --------------------------------------------------------------------------- the calibrated ranker


def _models(space, n, seed, offsets):
    """Retrained models whose loss is their inherited loss minus a per-type offset (plus noise): what the claim saw."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        s = space.sample(rng)
        inherited = 3.0 - 0.2 * np.log(s.embed_dim * s.depth) + rng.normal(0, 0.02)
        frac = {a: s.attention.count(a) / s.depth for a in space.attention}
        retrained = inherited - sum(offsets[a] * f for a, f in frac.items()) + rng.normal(0, 0.01)
        out.append(Retrained(f"m{i}", s, 1000 * s.embed_dim * s.depth, float(inherited), float(retrained)))
    return out


def test_the_ranker_learns_type_offsets_inherited_loss_misses(micro, tmp_path):  # noqa: F811
    offsets = {"softmax": 0.0, "local:8": 0.1, "linear": 0.6}
    train_models, test_models = _models(micro, 14, 0, offsets), _models(micro, 30, 1, offsets)
    ranker = fit_ranker(micro, train_models, {"windows": 4}, "abc")
    assert ranker.report["chosen"] != "inherited" and ranker.report["candidates"][ranker.kind]["loo_mae"] < 0.05
    from scipy.stats import kendalltau

    truth = [m.retrained for m in test_models]
    inherited_tau = kendalltau([m.inherited for m in test_models], truth).statistic
    pred = ranker.predict(micro, [m.subnet for m in test_models], [m.inherited for m in test_models],
                          [m.params for m in test_models])
    assert kendalltau(pred, truth).statistic > max(0.8, inherited_tau + 0.2)
    ranker.save(tmp_path)
    again = load_ranker(tmp_path)
    assert again.kind == ranker.kind and again.digest == ranker.digest
    np.testing.assert_array_equal(again.predict(micro, [m.subnet for m in test_models], [m.inherited for m in test_models],
                                                [m.params for m in test_models]), pred)
    with pytest.raises(UserError, match="at least 4"):
        fit_ranker(micro, train_models[:3], {}, "abc")


def test_a_ranker_file_is_checked_and_refuses_other_windows(micro, tmp_path):  # noqa: F811
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "ranker.json").write_text('{"format": "something-else"}')
    with pytest.raises(UserError, match="not a ranker of this tool"):
        load_ranker(bad)
    (bad / "ranker.json").write_text("{")
    with pytest.raises(UserError, match="not a ranker file"):
        load_ranker(bad)
    ranker = fit_ranker(micro, _models(micro, 8, 0, {"softmax": 0, "local:8": 0, "linear": 0.5}),
                        {"windows": 4, "seq_len": 16}, "abc")
    doc = ranker.to_dict()
    doc["model"]["coef"] = doc["model"]["coef"][:-1]
    (bad / "ranker.json").write_text(json.dumps(doc))
    with pytest.raises(UserError, match="a damaged ranker"):
        load_ranker(bad)
    with pytest.raises(UserError, match="no ranker.json here"):
        load_ranker(tmp_path / "missing")

    class Inherited:
        heldout, batch_size, description = None, 16, {"windows": 8, "seq_len": 16}

    with pytest.raises(UserError) as e:
        CalibratedFitness(Inherited(), ranker, micro, lambda s: 1, {"windows": 8, "seq_len": 16}, "abc", "R")
    assert "fitted on other fitness windows (windows: 4 there, 8 here)" in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(UserError, match="fitted on the inherited loss of supernet abc, this one is xyz"):
        CalibratedFitness(Inherited(), ranker, micro, lambda s: 1, {"windows": 4, "seq_len": 16}, "xyz", "R")


def test_calibrated_fitness_answers_the_rankers_prediction(micro):  # noqa: F811
    ranker = fit_ranker(micro, _models(micro, 12, 0, {"softmax": 0, "local:8": 0.2, "linear": 0.5}), {"windows": 4}, "abc")

    class Inherited:
        heldout, batch_size, description = None, 16, {"windows": 4}

        def __call__(self, subnets):
            return np.array([2.0 + 0.1 * s.depth for s in subnets])

    fit = CalibratedFitness(Inherited(), ranker, micro, lambda s: 1000 * s.depth, {"windows": 4}, "abc", "R")
    subnets = [micro.largest(t) for t in micro.attention]
    expected = ranker.predict(micro, subnets, [2.0 + 0.1 * s.depth for s in subnets], [1000 * s.depth for s in subnets])
    np.testing.assert_allclose(fit(subnets), expected)
    assert fit.description["ranker"] == ranker.digest  # a search with another ranker is another study
    assert isinstance(ranker, Ranker)


# --------------------------------------------------------------------------- the first generation, hurdles


def test_each_types_largest_feasible_uniform_model_opens_the_first_generation(micro):  # noqa: F811
    def params(s):
        return s.embed_dim * sum(s.ffn_dim)

    def feasible(subnets):
        return np.array([params(s) <= 24 * 64 and "linear" not in s.attention[:1] or s.depth == 1 for s in subnets])

    first = best_uniform_per_type(micro, feasible, params)
    assert [s.attention[0] for s in first] == list(micro.attention)
    for s in first:
        same = [u for u in micro.uniform() if u.attention[0] == s.attention[0] and feasible([u])[0]]
        assert params(s) == max(params(u) for u in same)
    strategy = Evolution(micro, SearchConfig(population=8, parents=2, mutations=3, crossovers=3, generations=2), feasible,
                         np.random.default_rng(0), (), first=first)
    opening = strategy.ask()
    assert opening[: len(first)] == first and len(opening) == 8 and len(set(opening)) == 8


def test_hurdles_from_scratch_train_at_train_subnets_rates(tiny):
    config = hurdle_config(2, 4, "64K", step_tokens=16 * 128, evaluations=50, init="scratch", batch=4)
    assert (config.init, config.batch, config.tokens) == ("scratch", 4, 64000 // 512 * 512)
    trainer = SubnetTrainer(tiny, "sn.pt", config.tokens, 128, None, init="scratch", batch=4)
    c = trainer.config(0)
    assert (c.batch_size, c.lr, c.min_lr, c.max_steps) == (4, 3e-3, 3e-4, config.tokens // 512)
    assert trainer.description["init"] == "scratch"
    inherited = SubnetTrainer(tiny, "sn.pt", config.tokens, 128, None)
    assert inherited.config(0).lr == 3e-4 and "init" not in inherited.description  # the tag of earlier runs
    with pytest.raises(UserError) as e:
        hurdle_config(2, 4, "1K", step_tokens=16 * 128, evaluations=50, init="warm", batch=0)
    assert "--hurdle-from: 'warm' is not one of inherited, scratch" in str(e.value)
    assert "--hurdle-batch-size: 0 is not a positive number of windows" in str(e.value)
    from nas.search.hurdles import HurdleOutcome, report

    for cfg, said in ((config, "(from scratch)"), (hurdle_config(2, 4, "64K", step_tokens=16 * 128, evaluations=50),
                                                   "(from inherited weights)")):
        assert f"2 rounds of {cfg.tokens:,} training tokens {said}" in report(HurdleOutcome(cfg, "t", Path("r"), {}))


def test_the_hurdle_cohort_is_timed_after_the_top_candidates(tiny):
    rng = np.random.default_rng(0)
    subs = [tiny.sample(rng) for _ in range(4)]

    class R:
        def __init__(self, i, s):
            self.subnet, self.loss, self.latency, self.params, self.trial = s, 1.0 + i, 2.0, 10, i

    records = [R(i, s) for i, s in enumerate(subs)]
    top = {"b": [Candidate(subs[0], 1.0, 2.0, 10, 0)]}
    out = add_extra(top, {"b": [subs[2], subs[0], subs[3]]}, records)
    assert [c.subnet for c in out["b"]] == [subs[0], subs[2], subs[3]] and out["b"][1].trial == 2


def test_space_largest_and_smallest_of_a_type(tiny):
    assert tiny.largest() == tiny.largest(tiny.attention[0])
    s = tiny.smallest("linear")
    assert s.attention == ("linear",) * min(tiny.depth) and s.embed_dim == min(tiny.embed_dim)
    assert len(tiny.uniform()) == len(tiny.embed_dim) * len(tiny.depth) * len(tiny.heads) * len(tiny.ffn_dim) * len(
        tiny.attention)
    assert all(u in tiny and len(set(u.attention)) == 1 for u in tiny.uniform())
    assert Subnet.from_dict(tiny.largest("linear").to_dict()) in tiny


def _mixing_models(space, n, seed, mixed: bool):
    """Retrained models of a space where mixing pays as the claim saw it: a subnet retrains about as well as the best
    attention type it contains (one local layer among global ones gives most of the local type's gain), a little
    worse per layer of a weak type; the inherited loss misjudges each type by its own offset."""
    quality = {a: q for a, q in zip(space.attention, np.linspace(0.0, 1.2, len(space.attention)))}
    misjudged = {a: e for a, e in zip(space.attention, np.random.default_rng(99).normal(0, 0.3, len(space.attention)))}
    rng = np.random.default_rng(seed)
    out: list[Retrained] = []
    while len(out) < n:
        s = space.sample(rng)
        if (len(set(s.attention)) > 1) != mixed:
            if mixed:
                continue
            s = Subnet(s.embed_dim, s.depth, (s.heads[0],) * s.depth, (s.ffn_dim[0],) * s.depth, (s.attention[0],) * s.depth)
        size = 2.5 - 0.15 * np.log(s.embed_dim * s.depth)
        best = min(quality[a] for a in s.attention)
        weak = np.mean([quality[a] for a in s.attention]) - best
        retrained = size + best + 0.2 * weak + rng.normal(0, 0.01)
        inherited = size + 0.5 + np.mean([quality[a] + misjudged[a] for a in s.attention]) + rng.normal(0, 0.02)
        out.append(Retrained(f"{'mixed' if mixed else 'uniform'}{seed}-{len(out)}", s, 1000 * s.embed_dim * s.depth,
                             float(inherited), float(retrained)))
    return out


def test_mixed_models_in_the_fit_set_teach_the_ranker_what_mixing_does():
    """Fitted on uniform models only, the ranker prices a mixed subnet at the mean of its types (it over-predicts the
    loss of every mixed subnet that holds a strong type); with mixed models among the fitted ones, the per-type
    presence features learn that the best type present decides, and held-out mixed subnets rank."""
    from scipy.stats import kendalltau

    space = load_space("long")
    uniform, fit_mixed = _mixing_models(space, 30, 0, False), _mixing_models(space, 20, 1, True)
    held = _mixing_models(space, 25, 2, True)
    truth = np.array([m.retrained for m in held])

    def on_held(ranker):
        pred = ranker.predict(space, [m.subnet for m in held], [m.inherited for m in held], [m.params for m in held])
        return np.abs(pred - truth).mean(), kendalltau(pred, truth).statistic, float(np.mean(pred - truth))

    only_uniform = fit_ranker(space, uniform, {"windows": 4}, "abc")
    both = fit_ranker(space, uniform + fit_mixed, {"windows": 4}, "abc")
    mae_u, tau_u, bias_u = on_held(only_uniform)
    mae_b, tau_b, bias_b = on_held(both)
    assert bias_u > 0.1  # the uniform-only ranker over-predicts mixed subnets' loss, as the claim's did
    assert both.kind in ("mix", "mix-depth", "mix-shape", "quality", "quality-mix")
    assert both.report["groups"] == {"uniform": 30, "mixed": 20}
    assert tau_b >= 0.6 and tau_b > tau_u and mae_b < mae_u / 2 and abs(bias_b) < 0.05
    uniform_loo = both.report["candidates"][both.kind]["groups"]["uniform"]["loo_mae"]
    assert mae_b <= 1.5 * max(uniform_loo, 0.02)
    assert "mixed MAE" in report_text(both) and "30 uniform, 20 mixed" in report_text(both)
    few = fit_ranker(space, uniform[:4] + fit_mixed[:6], {"windows": 4}, "abc")  # too few uniform models to price types
    assert not few.quality and not few.kind.startswith("quality")
