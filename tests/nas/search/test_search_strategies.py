"""Strategies, operators, constraints and Pareto tools, on the synthetic landscape (no model, no storage)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from nas.search import (
    NSGA2,
    AnalyticLatency,
    CachedLatency,
    Constraints,
    Evolution,
    LatencyBudget,
    ParamLimit,
    RandomSearch,
    SearchConfig,
    crossover,
    draw,
    feasible_seeds,
    format_ms,
    hypervolume,
    mutate,
    non_dominated_sort,
    param_counter,
    pareto_front,
)
from nas.search.constraints import lightest_subnets
from nas.search.pareto import crowding_distance
from search_spaces import UserError

from tests.nas.search.test_search_storage import synthetic_loss

SMALL = SearchConfig(population=20, parents=5, mutations=10, crossovers=10, generations=6)


@pytest.fixture(scope="module")
def proxy(tiny):
    p = AnalyticLatency(tiny)
    return CachedLatency(p.predict, p.name)


@pytest.fixture(scope="module")
def params(tiny):
    return param_counter(tiny)


def run_direct(strategy, proxy):
    """The plain ask/tell loop; returns every (subnet, loss, latency) evaluated."""
    seen = []
    while not strategy.done:
        subnets = strategy.ask()
        if not subnets:
            break
        losses = [synthetic_loss(s) for s in subnets]
        latencies = proxy(subnets)
        strategy.tell(subnets, losses, latencies)
        seen += list(zip(subnets, losses, latencies))
    return seen


def make(kind, tiny, cons, seed, config=SMALL, **kw):
    rng = np.random.default_rng(seed)
    return kind(tiny, config, cons.feasible, rng, feasible_seeds(tiny, cons, np.random.default_rng(seed)), **kw)


# --------------------------------------------------------------------------- operators


def test_mutation_and_crossover_stay_in_the_space(tiny):
    rng = np.random.default_rng(0)
    parents = [tiny.sample(rng) for _ in range(50)]
    for a, b in zip(parents, parents[1:]):
        for child in (mutate(tiny, a, rng, 0.5), crossover(tiny, a, b, rng)):
            assert child in tiny
        child = crossover(tiny, a, b, rng)
        assert child.embed_dim in (a.embed_dim, b.embed_dim) and child.depth in (a.depth, b.depth)
        for i, layer in enumerate(child.layers):
            assert layer in [p.layers[i] for p in (a, b) if i < p.depth] or any(
                getattr(layer, g) == getattr(p.layers[i], g)
                for p in (a, b)
                if i < p.depth
                for g in ("heads", "ffn_dim", "attention")
            )
    assert mutate(tiny, parents[0], rng, 0.0) == parents[0]
    assert crossover(tiny, parents[0], parents[0], rng) == parents[0]
    changed = sum(mutate(tiny, p, rng, 1.0) != p for p in parents)
    assert changed >= 45


def test_draw_is_bounded_and_explains_why_it_gave_up(tiny):
    rng = np.random.default_rng(0)
    found, stats = draw(lambda: tiny.sample(rng), 10, lambda subs: np.zeros(len(subs), bool), set(), max_tries=7)
    assert found == [] and stats.proposed == 70 and stats.infeasible + stats.repeated == 70
    assert "found 0 of 10 in 7 redraw rounds" in stats.explain("x", 7)


# --------------------------------------------------------------------------- strategies


@pytest.mark.parametrize(
    "kind, kw",
    [(Evolution, {}), (RandomSearch, {}), (NSGA2, {}), (Evolution, {"config": SearchConfig(population=20, parents=5, mutations=10,
     crossovers=10, generations=6, aging=True, selection="tournament", tournament_size=4)})],
    ids=["evolution", "random", "nsga2", "aging-tournament"],
)
def test_no_proposed_subnet_breaks_a_constraint_and_same_seed_same_search(tiny, proxy, params, kind, kw):
    cons = Constraints((LatencyBudget(5.0, proxy), ParamLimit(300_000, params)))
    first = run_direct(make(kind, tiny, cons, seed=1, **kw), proxy)
    assert len(first) == 20 + 5 * 20 or kind is not RandomSearch
    for subnet, _, _ in first:
        assert subnet in tiny and cons.violations(subnet) == []
    assert len({s for s, _, _ in first}) == len(first), "never evaluates a subnet twice"
    again = run_direct(make(kind, tiny, cons, seed=1, **kw), proxy)
    assert again == first
    other = run_direct(make(kind, tiny, cons, seed=2, **kw), proxy)
    assert other != first


def test_evolution_beats_random_search_at_equal_evaluations(tiny, proxy):
    cons = Constraints((LatencyBudget(6.0, proxy),))
    longer = SearchConfig(population=20, parents=5, mutations=10, crossovers=10, generations=12)
    wins = 0
    for seed in range(5):
        evo = run_direct(make(Evolution, tiny, cons, seed, config=longer), proxy)
        rnd = run_direct(make(RandomSearch, tiny, cons, seed, config=longer), proxy)
        n = min(len(evo), len(rnd))
        wins += min(loss for _, loss, _ in evo[:n]) < min(loss for _, loss, _ in rnd[:n])
    assert wins >= 4


def test_nsga2_keeps_a_non_dominated_population_front(tiny, proxy):
    cons = Constraints((LatencyBudget(8.0, proxy),))
    strategy = make(NSGA2, tiny, cons, seed=0)
    seen = run_direct(strategy, proxy)
    pts = np.array([[e.loss, e.latency] for e in strategy.population])
    all_pts = np.array([[loss, t] for _, loss, t in seen])
    front = {tuple(p) for p in all_pts[pareto_front(all_pts)]}
    population = {tuple(p) for p in pts}
    assert len(strategy.population) == SMALL.population
    # elitism: the population holds the whole front of everything evaluated, or only front points when it is larger
    assert front <= population if len(front) <= SMALL.population else population <= front
    assert len(front) > 5



def optuna_nsga2(tiny, proxy, budget_ms: float, seed: int, n_trials: int) -> list[tuple[str, float, float]]:
    """Optuna's own NSGA-II (``NSGAIISampler`` with the budget as its constraint) on the same problem as
    :func:`run_direct`, as one would write it with Optuna: every gene of the deepest subnet a categorical parameter
    (the layers past ``depth`` unused), the latency a second objective; each trial's (subnet key, loss, latency)."""
    import optuna

    from search_spaces import Subnet

    def objective(trial):
        depth = trial.suggest_categorical("depth", tiny.depth)
        layers = [[trial.suggest_categorical(f"l{i}.{gene}", choices) for gene, choices in
                   (("heads", tiny.heads), ("ffn_dim", tiny.ffn_dim), ("attention", tiny.attention))]
                  for i in range(max(tiny.depth))][:depth]
        subnet = Subnet.from_dict({"embed_dim": trial.suggest_categorical("embed_dim", tiny.embed_dim), "depth": depth,
                                   "heads": [h for h, _, _ in layers], "ffn_dim": [f for _, f, _ in layers],
                                   "attention": [a for _, _, a in layers]})
        ms = float(proxy([subnet])[0])
        if modern:
            trial.set_constraint("budget", ms - budget_ms)
        trial.set_user_attr("slack", [ms - budget_ms])
        trial.set_user_attr("key", subnet.key)
        return synthetic_loss(subnet), ms

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    modern = hasattr(optuna.trial.Trial, "set_constraint")  # Optuna 5; 4 takes a constraints_func
    sampler = optuna.samplers.NSGAIISampler(population_size=SMALL.population, seed=seed, **(
        {} if modern else {"constraints_func": lambda t: t.user_attrs["slack"]}))
    study = optuna.create_study(directions=["minimize", "minimize"], sampler=sampler)
    study.optimize(objective, n_trials=n_trials)
    return [(t.user_attrs["key"], *t.values) for t in study.trials]


def test_nsga2_kept_over_optunas_sampler_on_the_same_seeded_problem(tiny, proxy):
    """Why ``--strategy nsga2`` is this project's NSGA-II and not Optuna's ``NSGAIISampler`` (docs/workflow.md): on the
    synthetic landscape, same population, same number of evaluations, 3 seeds x 2 budgets, Optuna's spends
    evaluations on subnets over the budget (its constraint is soft: constrained domination) and on subnets it
    evaluated already (layers past the depth are genes it crosses and mutates, the same subnet under other
    parameters), and its feasible front covers less: ours evaluates only new feasible subnets (a redraw before
    evaluation costs a predictor call, an evaluation a forward pass over the held-out windows) and finds the larger
    hypervolume on average.  Its generations also come from the study's trials as they arrive, so two workers, or a
    resumed one, would not ask the same subnets: the driver's replay of ``ask``/``tell`` needs a strategy that is a
    function of the seed and the earlier generations' results."""
    config = SearchConfig(population=20, parents=5, mutations=10, crossovers=10, generations=10)
    for budget in (4.0, 8.0):
        cons = Constraints((LatencyBudget(budget, proxy),))
        ref = (7.0, budget)
        ours, theirs = [], []
        for seed in range(3):
            seen = run_direct(make(NSGA2, tiny, cons, seed, config=config), proxy)
            keys = [s.key for s, _, _ in seen]
            assert len(seen) == config.evaluations and len(set(keys)) == len(keys)  # every evaluation a new subnet
            assert all(t <= budget for _, _, t in seen)  # and a feasible one
            ours.append(hypervolume(np.array([[loss, t] for _, loss, t in seen]), ref))
            trials = optuna_nsga2(tiny, proxy, budget, seed, config.evaluations)
            over = sum(t > budget for _, _, t in trials)
            repeated = len(trials) - len({k for k, _, _ in trials})
            assert over > 0 and repeated > 0, (budget, seed, over, repeated)
            theirs.append(hypervolume(np.array([[loss, t] for _, loss, t in trials if t <= budget]), ref))
        assert np.mean(ours) > np.mean(theirs), (budget, ours, theirs)


def test_tight_budget_stops_with_a_note_instead_of_hanging(tiny, proxy):
    lightest = lightest_subnets(tiny)
    limit = float(np.sort(proxy(lightest))[1])  # only the two lightest subnets fit
    cons = Constraints((LatencyBudget(limit, proxy),))
    strategy = make(Evolution, tiny, cons, seed=0, config=SearchConfig(population=10, parents=2, mutations=5, crossovers=5,
                                                                          generations=5, max_tries=20))
    seen = run_direct(strategy, proxy)
    assert 1 <= len(seen) <= 10 and strategy.done
    assert all(cons.violations(s) == [] for s, _, _ in seen)
    assert any("no new feasible subnet found; the search stops here" in n for n in strategy.notes)
    assert any("broke a constraint" in n for n in strategy.notes)


def test_config_is_checked():
    with pytest.raises(UserError, match="--parents: 30 is more than --population 20"):
        SearchConfig(population=20, parents=30)
    with pytest.raises(UserError, match="--mutate-prob: 1.5 is not a probability"):
        SearchConfig(mutate_prob=1.5)
    with pytest.raises(UserError, match="both are 0"):
        SearchConfig(mutations=0, crossovers=0)


# --------------------------------------------------------------------------- infeasibility


def test_infeasible_budget_names_the_smallest_reachable_latency(tiny, proxy):
    fastest = float(proxy(lightest_subnets(tiny)).min())
    cons = Constraints((LatencyBudget(fastest * 0.9, proxy, "my-device predictor"),))
    with pytest.raises(UserError) as e:
        feasible_seeds(tiny, cons, np.random.default_rng(0))
    msg = str(e.value)
    assert msg.startswith(f"--budget {format_ms(fastest * 0.9)} is infeasible on my-device predictor")
    assert f"the smallest latency space 'tiny' reaches is {format_ms(fastest)}" in msg
    assert feasible_seeds(tiny, Constraints((LatencyBudget(fastest, proxy),)), np.random.default_rng(0))


def test_infeasible_params_and_joint_constraints(tiny, proxy, params):
    smallest = min(params(s) for s in lightest_subnets(tiny))  # (a type without keys is lighter than softmax)
    with pytest.raises(
        UserError, match=f"--max-params .* is infeasible: the smallest subnet of space 'tiny' has {smallest:,} parameters"
    ):
        feasible_seeds(tiny, Constraints((ParamLimit(smallest - 1, params),)), np.random.default_rng(0))
    # each alone is satisfiable, together they are not: the fastest latency, and at least 4 layers
    fastest = float(proxy(lightest_subnets(tiny)).min())
    cons = Constraints((LatencyBudget(fastest, proxy), DeepEnough()))
    with pytest.raises(UserError, match="no subnet of space 'tiny' meets latency <= .* and depth >= 4 together"):
        feasible_seeds(tiny, cons, np.random.default_rng(0), n_sample=64)


class DeepEnough:
    """A constraint of another kind (depth >= 4, as -depth <= -4): the Constraint protocol is all it needs."""

    flag, limit = "--min-depth", -4.0

    def values(self, subnets):
        return np.array([-s.depth for s in subnets], dtype=float)

    def format(self, value):
        return f"depth {-value:g}"

    def __str__(self):
        return "depth >= 4"


# --------------------------------------------------------------------------- Pareto


def brute_front(points):
    return {i for i, p in enumerate(points) if not any(np.all(q <= p) and np.any(q < p) for q in points)}


def test_non_dominated_sort_matches_brute_force():
    rng = np.random.default_rng(0)
    pts = np.round(rng.random((60, 2)), 1)  # with ties
    fronts = non_dominated_sort(pts)
    assert sorted(np.concatenate(fronts).tolist()) == list(range(60))
    remaining = list(range(60))
    for front in fronts:
        expect = {remaining[i] for i in brute_front(pts[remaining])}
        assert set(front.tolist()) == expect
        remaining = [i for i in remaining if i not in expect]
    assert set(pareto_front(pts).tolist()) == brute_front(pts)


def test_hypervolume_exact_and_against_a_grid():
    pts = np.array([[3.0, 1.0], [2.0, 2.0], [1.0, 3.0], [3.5, 3.5]])  # (loss, ms); the last is dominated
    assert hypervolume(pts, (4.0, 4.0)) == pytest.approx(1 + 2 + 3)
    assert hypervolume(pts, (0.5, 4.0)) == 0.0
    rng = np.random.default_rng(1)
    pts = rng.random((25, 2))
    g = (np.arange(400) + 0.5) / 400
    X, Y = np.meshgrid(g, g)  # loss, ms
    cells = np.stack([X.ravel(), Y.ravel()], 1)
    covered = np.any(np.all(pts[None, :, :] <= cells[:, None, :], axis=2), axis=1).mean()
    assert hypervolume(pts, (1.0, 1.0)) == pytest.approx(covered, abs=5e-3)


def test_crowding_distance_ends_are_infinite():
    pts = np.array([[1.0, 5.0], [2.0, 3.0], [3.0, 2.5], [4.0, 1.0]])
    d = crowding_distance(pts)
    assert np.isinf(d[[0, 3]]).all() and np.isfinite(d[[1, 2]]).all()
    assert d[1] == pytest.approx((3 - 1) / 3 + (5 - 2.5) / 4)


def test_every_pair_of_front_points_is_non_dominated():
    rng = np.random.default_rng(3)
    pts = rng.random((40, 2))
    front = pts[pareto_front(pts)]
    for a, b in itertools.permutations(front, 2):
        assert not (np.all(a <= b) and np.any(a < b))
    assert np.all(np.diff(front[:, 1]) >= 0) and np.all(np.diff(front[:, 0]) <= 0)
