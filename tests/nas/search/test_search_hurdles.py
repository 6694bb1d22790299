"""Progressive dynamic hurdles (``nas search --hurdles``) on a fake trainer: the decisions, resume, workers, the CLI.

The search before the hurdles is the synthetic one of ``test_search_storage`` (no model); the trainings are
:class:`tests.nas.search.hurdle_fakes.FakeTrainer`'s (bits/byte a function of the subnet and the tokens trained).
``python -m tests.nas.search.test_search_hurdles URL STUDY ROOT SLEEP [HANG_AFTER MARKER]`` runs one worker (a subprocess).
"""

from __future__ import annotations

import csv
import json
import signal
import subprocess
import sys
import time
import types
from pathlib import Path

import numpy as np
import optuna
import pytest

from nas.cli import main
from nas.search import HurdleConfig, TrialStore, hurdle_candidates, open_storage, open_study, replay, run_hurdles, run_search
from nas.search.hurdles import DONE, HURDLE, Candidate, TrainingStopped
from nas.search.storage import ended
from search_spaces import Subnet, load_space

from tests.nas.search.hurdle_fakes import MODEL, FakeTrainer, TableTrainer, fake_bpb, log_of
from tests.nas.search.test_search_fitness import run_dir, search_args, supernet  # noqa: F401 - fixtures of the CLI tests
from tests.nas.search.test_search_storage import CONFIG, params_of, postgres_url, searches_for, synthetic_fitness  # noqa: F401

ROOT = Path(__file__).resolve().parents[3]
HURDLES = HurdleConfig(rounds=3, candidates=4, tokens=500)  # 5 fake steps per training, a checkpoint every 2


# --------------------------------------------------------------------------- the decision, by hand


@pytest.fixture(scope="module")
def five(tiny):
    """Five distinct subnets, the search's candidates 1..5 (inherited 2.0 .. 2.4)."""
    rng = np.random.default_rng(0)
    subnets = list(dict.fromkeys(tiny.sample(rng) for _ in range(20)))[:5]
    return [Candidate(i + 1, s, 2.0 + 0.1 * i, 1.0, 1000) for i, s in enumerate(subnets)]


def by_hand(five):
    """Trained bits/byte per (candidate, round), binary fractions so the means are exact.

    round 0: 1.875 1.625 1.75 2.0 1.5   mean 1.75    -> keep 2, 3 (= the mean), 5; stop 1, 4
    round 1:       1.5   1.25     1.375 mean 1.375   -> keep 3, 5 (= the mean); stop 2
    round 2:             1.1875   1.125 mean 1.15625 -> keep 5; stop 3
    """
    c = {x.rank: x.subnet.key for x in five}
    return {(c[1], 0): 1.875, (c[2], 0): 1.625, (c[3], 0): 1.75, (c[4], 0): 2.0, (c[5], 0): 1.5,
            (c[2], 1): 1.5, (c[3], 1): 1.25, (c[5], 1): 1.375,
            (c[3], 2): 1.1875, (c[5], 2): 1.125}


def rows_of(b):
    return [(r.candidate.rank, r.round, r.bpb, r.hurdle, r.verdict) for r in b.rows]


EXPECTED = [
    (1, 0, 1.875, 1.75, "stopped"), (2, 0, 1.625, 1.75, "kept"), (3, 0, 1.75, 1.75, "kept"), (4, 0, 2.0, 1.75, "stopped"),
    (5, 0, 1.5, 1.75, "kept"),
    (2, 1, 1.5, 1.375, "stopped"), (3, 1, 1.25, 1.375, "kept"), (5, 1, 1.375, 1.375, "kept"),
    (3, 2, 1.1875, 1.15625, "stopped"), (5, 2, 1.125, 1.15625, "kept"),
]


def test_hurdles_stop_the_candidates_worse_than_the_round_mean(five):
    b = replay("x", five, 3, by_hand(five))
    assert b.done and b.round == 3
    assert rows_of(b) == EXPECTED
    # the final ranking: those that reached the last round first (by trained bits/byte), then by the round reached
    assert [(r.candidate.rank, r.round, r.bpb) for r in b.ranking()] == [(5, 2, 1.125), (3, 2, 1.1875), (2, 1, 1.5),
                                                                         (1, 0, 1.875), (4, 0, 2.0)]
    assert b.best.candidate.rank == 5  # the search's worst of five, the best after training


def test_replay_stops_at_the_first_missing_training_and_handles_a_diverged_one(five):
    scores = by_hand(five)
    del scores[(five[2].subnet.key, 1)]  # candidate 3, round 1 not trained yet
    b = replay("x", five, 3, scores)
    assert not b.done and b.round == 1 and [c.rank for c in b.waiting] == [3]
    assert rows_of(b) == EXPECTED[:5] and b.best is None
    assert replay("x", five, 1, scores).done  # one round: round 0 is all it needs
    diverged = {**by_hand(five), (five[0].subnet.key, 0): float("nan")}
    b = replay("x", five, 1, diverged)
    mean = (1.625 + 1.75 + 2.0 + 1.5) / 4  # of the finite ones
    assert [r.verdict for r in b.rows] == ["stopped", "kept", "stopped", "stopped", "kept"]
    assert b.rows[0].bpb == float("inf") and b.rows[0].hurdle == mean
    assert [r.candidate.rank for r in b.ranking()] == [5, 2, 3, 4, 1]
    every = replay("x", five[:2], 3, {(five[0].subnet.key, 0): float("nan"), (five[1].subnet.key, 0): float("inf")})
    assert every.done and [r.verdict for r in every.rows] == ["stopped"] * 2 and every.best is None  # no best to report


def test_the_report_names_the_best_when_the_searchs_first_was_never_trained(five, tmp_path):
    """Candidate 1 measured over the budget on the timing target is not trained: the report still names the best
    (it raised StopIteration looking for candidate 1's row, and ended a bench_claim run)."""
    from nas.search.hurdles import HurdleOutcome, report

    rest = five[1:]  # candidates 2..5: the first was dropped before training
    b = replay("x", rest, 1, {k: v for k, v in by_hand(five).items() if k[0] != five[0].subnet.key and k[1] == 0})
    assert b.done and b.best.candidate.rank == 5
    text = report(HurdleOutcome(HurdleConfig(rounds=1, candidates=4, tokens=500), "tag", tmp_path, {"x": b}))
    assert text.splitlines()[-1].startswith("x: best after hurdles is candidate 5, 1.5000 bits/byte at round 0")
    assert text.endswith("the search's best (candidate 1) was not trained")
    full = replay("x", five, 1, by_hand(five))
    text = report(HurdleOutcome(HurdleConfig(rounds=1, candidates=5, tokens=500), "tag", tmp_path, {"x": full}))
    assert text.endswith("the search's best (candidate 1) stopped at round 0, 1.8750")


def test_the_stage_trains_only_the_survivors_and_shares_trainings_between_budgets(five, tiny, tmp_path):
    # budget B's candidates are three of A's, in another order: 5, 2, 3 (its ranks 1, 2, 3)
    others = [Candidate(i + 1, c.subnet, c.inherited, c.latency, c.params) for i, c in enumerate([five[4], five[1], five[2]])]
    trainer = TableTrainer(300, by_hand(five))
    store = TrialStore(open_study(open_storage("memory"), "h", {}), tiny)
    outcome = run_hurdles({"A": five, "B": others}, HurdleConfig(3, 5, 300), trainer, store, tmp_path)
    assert rows_of(outcome.budgets["A"]) == EXPECTED
    # B: round 0: 1.5 1.625 1.75 (mean 1.625: keep 1, 2); round 1: 1.375 1.5 (mean 1.4375: keep 1); round 2: 1.125
    assert rows_of(outcome.budgets["B"]) == [(1, 0, 1.5, 1.625, "kept"), (2, 0, 1.625, 1.625, "kept"),
                                             (3, 0, 1.75, 1.625, "stopped"), (1, 1, 1.375, 1.4375, "kept"),
                                             (2, 1, 1.5, 1.4375, "stopped"), (1, 2, 1.125, 1.125, "kept")]
    # each training once, whichever budgets want it; the stopped candidates are never trained again
    assert sorted(trainer.calls) == sorted((key, r, False) for key, r in by_hand(five))
    assert outcome.trained_here == 10
    trials = [t for t in store.study.get_trials() if HURDLE in t.system_attrs]
    assert len(trials) == 10 and all(t.state.name == "COMPLETE" for t in trials)
    for t in trials:  # the trial holds the training: its subnet, round, tokens so far and folder
        key, r = t.system_attrs[HURDLE][1:]
        assert t.values == [by_hand(five)[(key, r)], t.user_attrs["latency_ms"]]  # trained loss, predicted latency
        assert t.user_attrs["round"] == r and t.user_attrs["tokens"] == 300 * (r + 1)
        assert Subnet.from_json(t.user_attrs["subnet"]).key == key
        c = next(c for c in five if c.subnet.key == key)  # and, for a dashboard, what the search's trials say
        want = "A,B" if any(o.subnet.key == key for o in others) else "A"  # the budgets whose cohort holds it
        assert (t.user_attrs["stage"], t.user_attrs["budget"]) == ("hurdles", want)
        assert (t.user_attrs["latency_ms"], t.user_attrs["params"]) == (c.latency, c.params)
    best = outcome.budgets["A"].best
    model = json.loads((outcome.folder(best) / MODEL).read_text())  # round 2 went on from round 1's weights
    assert model["tokens"] == 3 * 300 and best.round == 2
    assert json.loads((outcome.folder(best) / DONE).read_text())["bits_per_byte"] == 1.125


def test_candidates_are_the_top_k_feasible_by_inherited_loss(tiny):
    searches, latency = searches_for(tiny, seed=3)
    store = TrialStore(open_study(open_storage("memory"), "s", {}), tiny)
    result = run_search(searches, synthetic_fitness(), latency, params_of, store, batch=4)
    cohorts = hurdle_candidates(searches, result.records, 4)
    for s in searches:
        cands = cohorts[s.label]
        feasible = sorted({r.subnet: r.loss for r in result.records if s.constraints.violations(r.subnet) == []}.items(),
                          key=lambda kv: kv[1])
        assert [(c.subnet, c.inherited) for c in cands] == feasible[:4] and [c.rank for c in cands] == [1, 2, 3, 4]
        assert cands[0].subnet == result.best[s.label].subnet


def test_per_type_adds_each_attention_types_best_to_the_top_k(tiny):
    """--hurdle-per-type 1: the top 3, plus the lowest-loss feasible subnet of every type not among them, ranked by loss."""
    from nas.search.hurdles import attention_type

    searches, latency = searches_for(tiny, seed=3)
    store = TrialStore(open_study(open_storage("memory"), "s", {}), tiny)
    result = run_search(searches, synthetic_fitness(), latency, params_of, store, batch=4)
    plain, typed = hurdle_candidates(searches, result.records, 3), hurdle_candidates(searches, result.records, 3, per_type=1)
    for s in searches:
        feasible = sorted({r.subnet: r.loss for r in result.records if s.constraints.violations(r.subnet) == []}.items(),
                          key=lambda kv: (kv[1], kv[0].key))
        best_of_type: dict[str, Subnet] = {}
        for subnet, _ in feasible:
            best_of_type.setdefault(attention_type(subnet), subnet)
        expected = {subnet for subnet, _ in feasible[:3]} | set(best_of_type.values())
        cands = typed[s.label]
        assert {c.subnet for c in cands} == expected and len(cands) == len(expected)
        assert len(best_of_type) >= 3 and len(cands) > 3  # the search met several types: some were added
        assert [c.rank for c in cands] == list(range(1, len(cands) + 1))
        assert [c.inherited for c in cands] == sorted(c.inherited for c in cands)
        assert [c.subnet for c in plain[s.label]] == [subnet for subnet, _ in feasible[:3]]


def test_attention_type_is_the_majority_kind_ties_to_the_lower_layer():
    from nas.search.hurdles import attention_type

    def net(*attention):
        n = len(attention)
        return Subnet(embed_dim=64, depth=n, heads=(2,) * n, ffn_dim=(128,) * n, attention=attention)

    assert attention_type(net("lsra:7", "softmax", "lsra:5")) == "lsra"
    assert attention_type(net("softmax", "convmod:7")) == "softmax"
    assert attention_type(net("hydra",)) == "hydra"


def test_hurdle_per_type_must_be_a_count():
    from nas.search import hurdle_config
    from search_spaces import UserError

    with pytest.raises(UserError, match=r"--hurdle-per-type: -1 is not a count >= 0"):
        hurdle_config(2, 4, "1M", step_tokens=2048, evaluations=100, per_type=-1)
    assert hurdle_config(2, 4, "1M", step_tokens=2048, evaluations=100, per_type=2).per_type == 2


# --------------------------------------------------------------------------- the real trainer's adapter


def stub_train_subnet(calls: list):
    """A stand-in for a one-stack task's ``train_subnet`` that trains nothing: the model folder holds the weights of
    ``init`` (the supernet's slice, or the previous folder's), written as ``nas export`` does."""
    from supernet import extract, load_model
    from supernet.artifact import save_model
    from supernet.checkpoint import load_supernet

    def train_subnet(settings, progress=None):
        calls.append(settings)
        kind, source = settings.init.split(":", 1)
        model = extract(load_supernet(source)[0], settings.subnet) if kind == "supernet" else load_model(source)
        save_model(model, settings.out, settings.space)
        steps = settings.tokens // (settings.config.batch_size * settings.config.seq_len)
        return types.SimpleNamespace(out=Path(settings.out), steps=steps, tokens=settings.tokens, val_bpb=0.0, seconds=0.0,
                                     stopped="max_steps")

    return train_subnet


def stub_the_tasks_trainer(monkeypatch, fn) -> None:
    """Every one-stack task trains a subnet with ``fn(settings, progress)``."""
    from tasks.stack import StackTask

    monkeypatch.setattr(StackTask, "train_subnet", lambda self, settings, progress=None: fn(settings, progress))


def test_subnet_trainer_calls_train_subnet_as_agreed_and_scores_on_the_search_windows(
        tiny, supernet, tmp_path, monkeypatch):  # noqa: F811
    from nas.search import InheritedLoss, SubnetTrainer
    from supernet.checkpoint import save_checkpoint

    calls = []
    stub_the_tasks_trainer(monkeypatch, stub_train_subnet(calls))
    ckpt = save_checkpoint(tmp_path / "supernet.pt", supernet)
    tokens = np.random.default_rng(0).integers(0, 256, size=3000).astype(np.uint8)
    fitness = InheritedLoss(supernet, tokens, seq_len=32, windows=5, batch_size=2, seed=1)
    trainer = SubnetTrainer(space=tiny, supernet=ckpt, tokens=2048, seq_len=32, scoring=fitness, seed=7,
                            data="/corpus", data_seed=3, val_fraction=0.25, corpus_dir=tmp_path)
    subnet = tiny.sample(np.random.default_rng(3))
    first = trainer.train(subnet, 0, None, tmp_path / "round0", resume=False)
    # untrained (the stub), so the folder's model scores exactly what the search scored with inherited weights
    assert trainer.score(first) == pytest.approx(float(fitness([subnet])[0]), abs=1e-6)
    second = trainer.train(subnet, 1, first, tmp_path / "round1", resume=True)
    assert second == tmp_path / "round1"
    a, b = calls
    assert (a.init, b.init) == (f"supernet:{ckpt}", f"model:{first}") and (a.resume, b.resume) == (False, True)
    assert a.subnet == subnet and a.space is tiny and a.out == tmp_path / "round0" and a.formats == ("torch",)
    assert a.tokens == 2048 and a.data == "/corpus" and a.device == "cpu" and a.distill == 0.0
    assert (a.data_seed, a.val_fraction, a.corpus_dir) == (3, 0.25, tmp_path)  # the supernet's split and corpus cache
    assert a.config.batch_size * a.config.seq_len * a.config.max_steps == 2048 and a.config.seq_len == 32
    assert a.config.seed != b.config.seed and a.config.to_dict() | {"seed": 0} == b.config.to_dict() | {"seed": 0}
    short = types.SimpleNamespace(out=tmp_path / "round0", steps=a.config.max_steps - 1, tokens=0, val_bpb=0.0, seconds=0.0,
                                  stopped="max_time")
    stub_the_tasks_trainer(monkeypatch, lambda settings, progress=None: short)
    with pytest.raises(TrainingStopped, match=r"stopped at step 3 \(max_time\)"):  # short of its budget: not finished
        trainer.train(subnet, 0, None, tmp_path / "round0", resume=True)


# --------------------------------------------------------------------------- resume and workers


def search_and_hurdles(url: str, study: str, root: Path, sleep: float = 0.0, hang_after=None, marker=None):
    """The synthetic search, then the hurdle stage on the fake trainer, in one storage (what one worker runs)."""
    space = load_space("tiny")
    searches, latency = searches_for(space, seed=3)
    storage = open_storage(url, grace_s=600)  # PostgreSQL: Optuna's heartbeat, no trial stale while the machine is busy
    with TrialStore(open_study(storage, study, {"seed": 3, "config": CONFIG.to_dict()}), space) as store:
        result = run_search(searches, synthetic_fitness(), latency, params_of, store, batch=4, poll_s=0.2)
        trainer = FakeTrainer(HURDLES.tokens, sleep=sleep, hang_after=hang_after, marker=marker)
        cohorts = hurdle_candidates(searches, result.records, HURDLES.candidates)
        outcome = run_hurdles(cohorts, HURDLES, trainer, store, root, poll_s=0.2)
    return outcome, trainer


def table(outcome):
    """What a hurdle stage produced: every row, the best per budget."""
    return {label: ([(r.candidate.rank, r.candidate.subnet.key, r.round, r.bpb, r.hurdle, r.kept) for r in b.rows],
                    b.best.candidate.subnet.key) for label, b in outcome.budgets.items()}


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The uninterrupted single worker (in memory): its table, its trainer and the outcome."""
    outcome, trainer = search_and_hurdles("memory", "s", tmp_path_factory.mktemp("ref"))
    return table(outcome), trainer, outcome


def test_uninterrupted_stage_matches_the_fake_curves(reference):
    got, trainer, outcome = reference
    assert set(got) == {"4ms", "8ms"}
    for label, b in outcome.budgets.items():
        assert [c.rank for c in b.candidates] == [1, 2, 3, 4] and sum(r.round == 0 for r in b.rows) == 4
        for row in b.rows:  # bits/byte after round + 1 rounds of 500 tokens, each round continuing the previous one
            assert row.bpb == fake_bpb(row.candidate.subnet, HURDLES.tokens * (row.round + 1))
            assert row.kept == (row.bpb <= row.hurdle)
            assert row.hurdle == pytest.approx(np.mean([r.bpb for r in b.rows if r.round == row.round]), abs=1e-12)
        last = [r for r in b.rows if r.round == HURDLES.rounds - 1]
        assert last and b.best == min(last, key=lambda r: r.bpb)
    assert len({(k, r) for k, r, _ in trainer.calls}) == len(trainer.calls)  # none twice, where budgets share a candidate
    assert not any(resume for _, _, resume in trainer.calls)


def start_worker(url: str, study: str, root: Path, sleep: float, hang_after: int | None = None, marker: Path | None = None):
    extra = [str(hang_after), str(marker)] if hang_after is not None else []
    argv = [sys.executable, "-m", "tests.nas.search.test_search_hurdles", url, study, str(root), str(sleep), *extra]
    return subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def hurdle_trials(url: str, study: str):
    return [t for t in optuna.load_study(study_name=study, storage=open_storage(url)).get_trials(deepcopy=False)
            if HURDLE in t.system_attrs]


def folders(root: Path):
    return sorted(p for p in root.glob("*/*/round*") if p.is_dir())


def test_killed_during_a_training_and_rerun_ends_like_an_uninterrupted_stage(tmp_path, reference):
    url, root, marker = f"sqlite:///{tmp_path / 'kill.db'}", tmp_path / "models", tmp_path / "training"
    worker = start_worker(url, "s", root, sleep=0.0, hang_after=13, marker=marker)  # the 3rd training, at step 3 of 5
    deadline = time.time() + 180
    while not marker.exists() and time.time() < deadline and worker.poll() is None:
        time.sleep(0.05)
    assert marker.exists(), worker.stderr.read() if worker.poll() is not None else "worker too slow"
    worker.send_signal(signal.SIGKILL)  # kill -9 in the middle of a training, its checkpoint at step 2
    worker.wait()
    before = hurdle_trials(url, "s")
    running = [t for t in before if t.state.name == "RUNNING"]
    assert len(running) == 1 and sum(t.state.name == "COMPLETE" for t in before) == 2
    killed = root / running[0].user_attrs["folder"]
    assert [e["event"] for e in log_of(killed)] == ["start"]

    outcome, trainer = search_and_hurdles(url, "s", root)  # the same command again
    assert table(outcome) == reference[0]
    assert outcome.trained_here == len({(k, r) for k, r, _ in reference[1].calls}) - 2  # finished ones are not redone
    # the killed training went on from its checkpoint (step 2), the others ran once from step 0
    assert [(e["event"], e["step"]) for e in log_of(killed)] == [("start", 0), ("start", 2), ("end", 5)]
    assert (running[0].system_attrs[HURDLE][1], running[0].system_attrs[HURDLE][2], True) in trainer.calls
    for folder in folders(root):
        if folder != killed:
            assert [(e["event"], e["step"]) for e in log_of(folder)] == [("start", 0), ("end", 5)], folder
    after = {t.number: t for t in hurdle_trials(url, "s")}
    assert after[running[0].number].state.name == "FAIL"
    why = ended(optuna.load_study(study_name="s", storage=open_storage(url)))
    assert "died" in why[running[0].number]["why"]
    complete = [t.system_attrs[HURDLE][1:] for t in after.values() if t.state.name == "COMPLETE"]
    assert len(complete) == len({tuple(c) for c in complete}) == len(folders(root))


def two_workers(url: str, root: Path, reference):
    workers = [start_worker(url, "s", root, sleep=0.05) for _ in range(2)]
    for w in workers:
        out, err = w.communicate(timeout=300)
        assert w.returncode == 0, err[-3000:]
    ts = hurdle_trials(url, "s")
    complete = [t for t in ts if t.state.name == "COMPLETE"]
    assert len({t.system_attrs["nas:owner"] for t in complete}) == 2, "both workers trained candidates"
    keys = [tuple(t.system_attrs[HURDLE][1:]) for t in complete]
    assert len(keys) == len(set(keys)) == len({(k, r) for k, r, _ in reference[1].calls})
    assert not any(t.state.name in ("RUNNING", "FAIL") for t in ts)  # lost claim races are PRUNED, never trained
    for folder in folders(root):  # every training ran once, by one worker
        assert [(e["event"], e["step"]) for e in log_of(folder)] == [("start", 0), ("end", 5)], folder
    joined, trainer = search_and_hurdles(url, "s", root)
    assert joined.trained_here == 0 and trainer.calls == [] and table(joined) == reference[0]


def test_two_workers_share_the_trainings_without_training_one_twice(tmp_path, reference):
    two_workers(f"sqlite:///{tmp_path / 'two.db'}", tmp_path / "models", reference)


def test_two_workers_share_the_trainings_on_postgresql(postgres_url, tmp_path, reference):  # noqa: F811
    two_workers(postgres_url, tmp_path / "models", reference)


# --------------------------------------------------------------------------- the CLI


class Made:
    """The trainer factory the tests put in place of ``nas.commands.search.trainer_factory``: fake trainers, kept."""

    def __init__(self):
        self.trainers: list[FakeTrainer] = []
        self.options: dict = {}  # for the next trainers: sleep, stop_after, ...

    def __call__(self):
        def make(**context):
            self.trainers.append(FakeTrainer(**context, **self.options))
            return self.trainers[-1]

        return make


@pytest.fixture
def fake_trainer(monkeypatch):
    made = Made()
    monkeypatch.setattr("nas.commands.search.trainer_factory", made)
    return made


def test_search_cli_with_hurdles_writes_the_table_and_the_best_and_resumes(run_dir, fake_trainer, capsys, tiny):  # noqa: F811
    tmp, ckpt, _ = run_dir
    base = search_args(tmp, ckpt, "--budget", "3ms,6ms", "--hurdle-candidates", "3", "--hurdle-tokens", "1.2k")
    args = base + ["--hurdles", "2"]
    assert main(args) == 0
    out = capsys.readouterr().out
    # 1,200 tokens are 2 whole steps of 16 windows x 32 tokens: 1,024 tokens per round
    assert "hurdles: top 3 per budget, 2 rounds of 1,024 training tokens" in out
    summary = json.loads((tmp / "out" / "search.json").read_text())
    doc = summary["hurdles"]
    assert doc["rounds"] == 2 and doc["candidates"] == 3 and doc["tokens_per_round"] == 1024
    rows = list(csv.DictReader(open(tmp / "out" / "hurdles.csv")))
    assert rows and set(rows[0]) >= {"budget", "candidate", "round", "trained_bpb", "hurdle_bpb", "verdict", "subnet"}
    for label in ("3ms", "6ms"):
        assert (tmp / "out" / f"best_{label}.yaml").exists()  # the supernet-scored best stays
        entry = doc["budgets"][label]
        mine = [r for r in rows if r["budget"] == label]
        assert len(mine) == len(entry["table"]) and sum(r["round"] == "0" for r in mine) == 3
        best = Subnet.load(tmp / "out" / f"hurdles_{label}.yaml")
        assert best.key == entry["best"]["key"] and entry["best"]["file"] == f"hurdles_{label}.yaml"
        last = [r for r in mine if r["round"] == "1"]
        assert best.key == min(last, key=lambda r: float(r["trained_bpb"]))["key"]
        assert entry["best"]["trained_bpb"] == pytest.approx(fake_bpb(best, 2 * 1024))
        for r in mine:  # the verdicts, the hurdles and the trained numbers
            assert (r["verdict"] == "kept") == (float(r["trained_bpb"]) <= float(r["hurdle_bpb"]))
            same = [float(x["trained_bpb"]) for x in mine if x["round"] == r["round"]]
            assert float(r["hurdle_bpb"]) == pytest.approx(np.mean(same), abs=1e-6)
        model = Path(entry["best"]["model"])
        assert json.loads((model / MODEL).read_text())["tokens"] == 2048
        assert f"{label}: best after hurdles is candidate {entry['best']['candidate']}" in out

    db = f"sqlite:///{tmp / 'out' / 'search.db'}"
    n_trials = len(optuna.load_study(study_name=summary["study"], storage=db).trials)
    assert main(args) == 0  # again: nothing trained, the same report
    assert capsys.readouterr().out == out and fake_trainer.trainers[-1].calls == []
    assert len(optuna.load_study(study_name=summary["study"], storage=db).trials) == n_trials

    # a third round: rounds 0 and 1 are reused, only the survivors' round 2 is trained
    assert main(base + ["--hurdles", "3"]) == 0
    calls = fake_trainer.trainers[-1].calls
    assert calls and {r for _, r, _ in calls} == {2}


def test_an_interrupted_training_exits_130_and_the_rerun_continues_it(run_dir, fake_trainer, capsys):  # noqa: F811
    tmp, ckpt, _ = run_dir
    args = search_args(tmp, ckpt, "--budget", "6ms", "--hurdles", "2", "--hurdle-candidates", "3", "--hurdle-tokens", "5120")
    fake_trainer.options = {"stop_after": 14}  # the 2nd training, at step 4 of 10 (of 512 tokens each)
    assert main(args) == 130
    out = capsys.readouterr().out
    assert "hurdles interrupted: " in out and "stopped at step 4 of 10; its checkpoint is kept" in out
    stopped = next(p for p in (tmp / "out" / "hurdles").glob("*/*/round0") if any(e["event"] == "stopped" for e in log_of(p)))
    fake_trainer.options = {}
    assert main(args) == 0
    capsys.readouterr()
    assert [(e["event"], e["step"]) for e in log_of(stopped)] == [("start", 0), ("stopped", 4), ("start", 4), ("end", 10)]
    assert fake_trainer.trainers[-1].calls[0][2] is True  # resumed first, then the rest
    assert (tmp / "out" / "hurdles_6ms.yaml").exists()


@pytest.mark.parametrize("flags, message", [
    (["--hurdles", "-1"], "--hurdles: -1 is not a number of rounds >= 0 (0: no hurdle stage)"),
    (["--hurdles", "2", "--hurdle-candidates", "1"], "--hurdle-candidates: 1 with --hurdles 2; a hurdle is the mean of a "
     "round's candidates, so it needs at least 2 candidates per budget"),
    (["--hurdles", "2", "--hurdle-candidates", "-3"], "--hurdle-candidates: -3 is not a count >= 0"),
    (["--hurdles", "2", "--hurdle-candidates", "25"], "--hurdle-candidates: 25 is more than the 24 subnets the search "
     "evaluates per budget"),
    (["--hurdles", "2", "--hurdle-tokens", "500"], "--hurdle-tokens: 500 is less than one training step (16 windows x 32 "
     "tokens = 512 tokens)"),
    (["--hurdles", "2", "--hurdle-tokens", "-5k"], "--hurdle-tokens: '-5k' must be greater than zero"),
    (["--hurdles", "2", "--hurdle-tokens", "lots"], "--hurdle-tokens: 'lots' is not a count"),
], ids=["rounds", "one-candidate", "negative-candidates", "too-many-candidates", "below-a-step", "negative-tokens", "words"])
def test_bad_hurdle_flags_are_one_line_exit_2_before_any_work(run_dir, fake_trainer, capsys, flags, message):  # noqa: F811
    tmp, ckpt, _ = run_dir
    assert main(search_args(tmp, ckpt, "--budget", "6ms", *flags)) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"nas search: error: {message}") and len(err.strip().splitlines()) == 1, err
    assert not (tmp / "out").exists() and fake_trainer.trainers == []  # nothing searched, nothing trained


def test_search_cli_with_hurdles_and_the_real_trainer(tmp_path, supernet, capsys):  # noqa: F811
    from supernet import load_model
    from supernet.checkpoint import save_checkpoint

    (tmp_path / "text").mkdir()  # (not "corpus": the corpus cache of the checkpoint's folder is named so)
    (tmp_path / "text" / "a.py").write_text("def f(x):\n    return x + 1\n" * 300)
    (tmp_path / "text" / "b.py").write_text("class A:\n    pass\n" * 300)
    ckpt = save_checkpoint(tmp_path / "supernet.pt", supernet, data=str(tmp_path / "text"), data_seed=0, val_fraction=0.5)
    (tmp_path / "pred.json").write_text("{}")
    from tests.nas.search.test_search_fitness import FakePredictor

    import latency.predictors as predictors

    fake = FakePredictor(supernet.space)
    with pytest.MonkeyPatch.context() as m:
        m.setattr(predictors, "load_predictor", lambda path: fake, raising=False)
        args = ["search", str(ckpt), "--predictor", str(tmp_path / "pred.json"), "--val-windows", "2", "--seq-len", "32",
                "--population", "6", "--parents", "2", "--mutations", "3", "--crossovers", "3", "--generations", "2",
                "--budget", "6ms", "--hurdles", "2", "--hurdle-candidates", "2", "--hurdle-tokens", "1024",
                "--out", str(tmp_path / "out"), "--no-progress", "--device", "cpu"]
        assert main(args) == 0
    capsys.readouterr()
    entry = json.loads((tmp_path / "out" / "search.json").read_text())["hurdles"]["budgets"]["6ms"]
    best = entry["best"]
    model = load_model(best["model"])
    assert model.subnet == Subnet.load(tmp_path / "out" / "hurdles_6ms.yaml")
    assert np.isfinite(best["trained_bpb"]) and len([r for r in entry["table"] if r["round"] == 0]) == 2
    assert Path(best["model"]).name == "round1"  # the winner trained both rounds, the second from the first's weights


if __name__ == "__main__":
    url, study, root, sleep = sys.argv[1], sys.argv[2], Path(sys.argv[3]), float(sys.argv[4])
    hang = (int(sys.argv[5]), Path(sys.argv[6])) if len(sys.argv) > 5 else (None, None)
    outcome, trainer = search_and_hurdles(url, study, root, sleep=sleep, hang_after=hang[0], marker=hang[1])
    print(outcome.trained_here, {label: b.best.bpb for label, b in outcome.budgets.items()})
