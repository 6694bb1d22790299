"""The search's study as optuna-dashboard reads it: two named objectives (the loss and the predicted latency: the
dashboard draws the Pareto front), each trial's budget constraint in Optuna's form, its latency, size, budget and
subnet as user attrs, each budget's best trial named, and no worker bookkeeping left behind.

A tiny search (the synthetic fitness and analytic latency of ``test_search_storage``: seconds) on SQLite with
Optuna's heartbeat switched on, as a database server would have it; then the study is read back with Optuna's
public API only, and, where optuna-dashboard is installed (``pip install -e '.[dashboard]'``), through its
WSGI app's own JSON API, the one its web page reads.
"""

from __future__ import annotations

import io
import json
import wsgiref.util

import numpy as np
import optuna
import pytest

from nas.search import SearchConfig, TrialStore, open_storage, open_study, pareto_front, run_search
from nas.search.storage import BEST, CONFIG, LATENCY_METRIC
from search_spaces import load_space
from tests.nas.search.test_search_storage import params_of, searches_for, synthetic_fitness

SMALL = SearchConfig(population=6, parents=2, mutations=3, crossovers=3, generations=2)
METRIC = "loss (bits/byte)"
ATTRS = {"stage", "budget", "generation", "latency_ms", "params", "subnet", "cached"}


@pytest.fixture(scope="module")
def searched(tmp_path_factory):
    """(storage URL, the search's result): two budgets in one study, finished."""
    url = f"sqlite:///{tmp_path_factory.mktemp('dashboard') / 'search.db'}"
    space = load_space("tiny")
    searches, latency = searches_for(space, seed=3, config=SMALL)
    storage = open_storage(url, heartbeat_s=1, grace_s=600)  # Optuna's heartbeat on, as on a database server
    with TrialStore(open_study(storage, "demo", {"seed": 3}, metric=METRIC), space) as store:
        result = run_search(searches, synthetic_fitness(), latency, params_of, store, batch=4, poll_s=0.05)
    return url, result, space


def load(url: str) -> optuna.Study:
    return optuna.load_study(study_name="demo", storage=url)  # as a dashboard opens it: the URL, no project code


def test_the_objectives_are_the_loss_and_the_latency_and_optunas_front_is_the_searchs(searched):
    url, result, _ = searched
    study = load(url)
    assert study.metric_names == [METRIC, LATENCY_METRIC]
    assert study.directions == [optuna.study.StudyDirection.MINIMIZE] * 2
    points = np.array([[r.loss, r.latency] for r in result.records])
    ours = {tuple(p) for p in points[pareto_front(points)].round(9)}
    theirs = {tuple(np.round(t.values, 9)) for t in study.best_trials}  # Optuna's own Pareto front of the trials
    assert theirs == ours and len(ours) >= 3
    for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)):
        budget = float(t.user_attrs["budget"].removesuffix("ms"))
        assert t.constraints == {"0": pytest.approx(t.values[1] - budget)} and t.values[1] <= budget  # Optuna's form


def test_a_study_of_an_earlier_version_keeps_its_one_objective(tmp_path):
    """A study made before latency was an objective resumes as it is: its trials get the loss alone."""
    url = f"sqlite:///{tmp_path / 'old.db'}"
    old = optuna.create_study(storage=url, study_name="old", direction="minimize")
    old.set_user_attr(CONFIG, {"seed": 3})
    space = load_space("tiny")
    searches, latency = searches_for(space, seed=3, config=SMALL)
    with TrialStore(open_study(open_storage(url), "old", {"seed": 3}, metric=METRIC), space) as store:
        result = run_search(searches, synthetic_fitness(), latency, params_of, store, batch=4, poll_s=0.05)
    study = load_study_named(url, "old")
    assert study.metric_names == [METRIC] and len(study.directions) == 1
    assert sorted(t.value for t in study.get_trials(states=(optuna.trial.TrialState.COMPLETE,))) == sorted(
        r.loss for r in result.records)


def load_study_named(url: str, name: str) -> optuna.Study:
    return optuna.load_study(study_name=name, storage=url)


def test_every_complete_trial_says_its_budget_latency_size_and_subnet(searched):
    url, result, space = searched
    trials = load(url).get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
    assert len(trials) == len(result.records) and not any(r is None for r in result.best.values())
    records = {r.trial: r for r in result.records}
    for t in trials:
        u, r = t.user_attrs, records[t.number]
        assert ATTRS <= set(u), sorted(set(u))
        assert u["stage"] == "search" and (u["budget"], u["generation"]) == r.slot[:2]
        assert u["budget"] in result.best  # one study, several budgets: each trial says which
        assert isinstance(u["latency_ms"], float) and u["latency_ms"] == pytest.approx(r.latency)
        assert isinstance(u["params"], int) and u["params"] == params_of(r.subnet)
        assert space.subnet_type.from_json(u["subnet"]) == r.subnet and t.values == pytest.approx([r.loss, r.latency])
    assert {t.user_attrs["budget"] for t in trials} == set(result.best)


def test_each_budget_names_its_best_trial(searched):
    url, result, _ = searched
    study = load(url)
    best = study.user_attrs[BEST]
    assert best == {label: r.trial for label, r in result.best.items()}
    for label, number in best.items():
        t = study.trials[number]
        assert t.values[0] == pytest.approx(result.best[label].loss)
        assert t.user_attrs["latency_ms"] <= float(label.removesuffix("ms"))  # within that budget
    # each budget's best is on the study's Pareto front (the lowest loss at or under its latency)
    assert {best["8ms"], best["4ms"]} <= {t.number for t in study.best_trials} and best["8ms"] != best["4ms"]


def test_no_worker_bookkeeping_is_left_after_the_search(searched):
    study = load(searched[0])
    assert not [k for k in study.user_attrs if k.startswith("nas:alive:")]  # heartbeats of earlier versions
    assert set(study.user_attrs) == {"nas:config", BEST}  # nothing failed or dropped, nothing else
    assert not study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,))


def _get(app, path: str) -> dict:
    environ: dict = {"REQUEST_METHOD": "GET", "PATH_INFO": path, "wsgi.input": io.BytesIO()}
    wsgiref.util.setup_testing_defaults(environ)
    status = []
    body = b"".join(app(environ, lambda s, headers, exc_info=None: status.append(s)))
    assert status and status[0].startswith("200"), (status, body[:500])
    return json.loads(body)


def test_optuna_dashboard_serves_the_study(searched):
    optuna_dashboard = pytest.importorskip(
        "optuna_dashboard", reason="optuna-dashboard is not installed (the dashboard extra: pip install -e '.[dashboard]')"
    )
    url, result, _ = searched
    app = optuna_dashboard.wsgi(url)  # what `optuna-dashboard URL` serves
    studies = _get(app, "/api/studies")
    studies = studies.get("study_summaries", studies.get("studies"))  # the web page's JSON API (0.21: study_summaries)
    (summary,) = [s for s in studies if s["study_name"] == "demo"]
    detail = _get(app, f"/api/studies/{summary['study_id']}")
    assert detail["objective_names"] == [METRIC, LATENCY_METRIC] and detail["directions"] == ["minimize", "minimize"]
    assert all(t["constraints"] and t["constraints"][0] <= 0 for t in detail["trials"])  # the budget holds: feasible
    assert len(detail["trials"]) == len(result.records)
    columns = {a["key"]: a["sortable"] for a in detail["union_user_attrs"]}
    assert columns["latency_ms"] and columns["params"] and {"budget", "stage", "subnet"} <= set(columns)
    for trial in detail["trials"]:
        attrs = {a["key"]: a["value"] for a in trial["user_attrs"]}
        assert ATTRS <= set(attrs) and np.isfinite(float(attrs["latency_ms"]))
    assert {a["key"] for a in detail["user_attrs"]} == {"nas:config", BEST}
