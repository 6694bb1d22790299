"""Progressive dynamic hurdles (So et al., *The Evolved Transformer*, 2019) after the supernet-scored search.

Inherited supernet weights rank subnets cheaply but roughly.  The hurdle stage spends real training
on the few that matter: the top ``K`` candidates of each budget (by the search's fitness) are trained
in ``rounds`` short rounds of ``tokens`` tokens each, the first from their inherited weights, every
later one from the weights of their previous round.  After each round the *hurdle* is the mean
trained bits/byte of that round's candidates; a candidate worse (higher) than the hurdle stops, the
others train on in the next round.  The final ranking uses trained bits/byte, scored on the search's
own validation windows (so the numbers compare with the inherited ones): the candidates that reached
the last round first, by their last bits/byte, then those stopped earlier, later rounds first::

    round 0: train all K from the supernet      -> bpb_0, hurdle_0 = mean(bpb_0); keep bpb_0 <= hurdle_0
    round 1: train the kept ones further        -> bpb_1, hurdle_1 = mean(bpb_1); keep bpb_1 <= hurdle_1
    ...

A training is a pure function of the subnet, its round and the training settings (tokens per round,
the trainer's configuration, the seed), so it is shared by the budgets whose candidates include the
subnet, and K or the number of rounds can change without redoing the trainings already done.

Storage: each training is one Optuna trial in the search's study, claimed like the search's slots
(:meth:`TrialStore.add_running`): system attr ``nas:hurdle`` = [settings tag, subnet key, round], its
value the trained bits/byte.  The lowest-numbered live trial of a training owns it, a worker that dies
has its trial failed by :meth:`TrialStore.recover`, and the next owner continues the training from its
checkpoint (``<root>/<tag>/<key>/round<r>/train/latest.pt``; a finished one is reused, see ``DONE``).
Which trainings come next is replayed from the finished ones (:func:`replay`), so a killed and rerun
stage, and several workers, end exactly as one uninterrupted worker.

The trainer is a :class:`CandidateTrainer`: :class:`SubnetTrainer` runs ``nas.train_subnet`` (the
``nas train-subnet`` library), tests pass a fast fake.
"""

from __future__ import annotations

import json
import logging
import math
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Protocol, Sequence

import numpy as np

from search_spaces import Space, Subnet, UserError
from supernet.files import atomic_write, atomic_write_csv

from .storage import OWNER, TrialStore, config_hash

log = logging.getLogger(__name__)

HURDLE = "nas:hurdle"  # trial system attr: [settings tag, subnet key, round]
DONE = "hurdle.json"  # written into a training's folder once it is trained and scored
TRAIN_BATCH = 16  # windows per training step (supernet.train.TrainConfig's default); --hurdle-tokens is >= one step
Training = tuple[str, int]  # (subnet key, round)


# --------------------------------------------------------------------------- settings


HURDLE_INITS = ("inherited", "scratch")  # --hurdle-from: round 0 starts from the supernet's weights, or from scratch


@dataclass(frozen=True)
class HurdleConfig:
    """``--hurdles ROUNDS --hurdle-candidates K --hurdle-tokens N``: K candidates per budget, ROUNDS rounds of N tokens."""

    rounds: int
    candidates: int = 8
    tokens: int = 999_424  # training tokens per round, whole steps (1M rounded down to steps of 16 x 128)
    per_type: int = 0  # --hurdle-per-type: also the best N of each attention type (:func:`hurdle_candidates`)
    init: str = "inherited"  # --hurdle-from
    batch: int = TRAIN_BATCH  # --hurdle-batch-size: windows per training step


def hurdle_config(rounds: int, candidates: int, tokens: str | int, *, step_tokens: int | None, evaluations: int,
                  per_type: int = 0, init: str = "inherited", batch: int = TRAIN_BATCH) -> HurdleConfig | None:
    """Check the hurdle flags (every problem at once, each naming its flag); None when ``rounds`` is 0 (off).

    ``step_tokens``: tokens of one training step at the default batch (the smallest ``--hurdle-tokens``; the tokens
    are rounded down to whole steps, which is what a round trains on); None where a step's tokens vary (an
    encoder-decoder's target bytes: its trainer counts them, and refuses a budget below its first batch);
    ``evaluations``: the most subnets the search evaluates per budget (the most candidates there can be).
    """
    from .budget import COUNT_FORMS, MAX_TOKENS, parse_count

    problems = []
    if not isinstance(rounds, int) or rounds < 0:
        problems.append(f"--hurdles: {rounds!r} is not a number of rounds >= 0 (0: no hurdle stage)")
    k = candidates
    if not isinstance(k, int) or k < 0:
        problems.append(f"--hurdle-candidates: {k!r} is not a count >= 0")
    elif rounds and k < 2:
        problems.append(f"--hurdle-candidates: {k} with --hurdles {rounds}; a hurdle is the mean of a round's candidates, "
                        "so it needs at least 2 candidates per budget")
    elif rounds and k > evaluations:
        problems.append(f"--hurdle-candidates: {k} is more than the {evaluations} subnets the search evaluates per budget "
                        "(--population + (--generations - 1) x (--mutations + --crossovers))")
    if not isinstance(per_type, int) or per_type < 0:
        problems.append(f"--hurdle-per-type: {per_type!r} is not a count >= 0 (0: the top --hurdle-candidates only)")
    n = 0
    try:
        n = parse_count(tokens, "--hurdle-tokens", "tokens", limit=MAX_TOKENS)
    except UserError as e:
        problems.append(str(e))
    if init not in HURDLE_INITS:
        problems.append(f"--hurdle-from: {init!r} is not one of {', '.join(HURDLE_INITS)}")
    if not isinstance(batch, int) or batch < 1:
        problems.append(f"--hurdle-batch-size: {batch!r} is not a positive number of windows")
        batch = TRAIN_BATCH
    # (given at the default batch of 16 windows; None: a step's tokens vary, so every count is whole steps)
    step_tokens = 1 if step_tokens is None else step_tokens // TRAIN_BATCH * batch
    if n and n < step_tokens:
        problems.append(f"--hurdle-tokens: {tokens} is less than one training step ({batch} windows x "
                        f"{step_tokens // batch} tokens = {step_tokens:,} tokens); write {COUNT_FORMS}")
    if problems:
        raise UserError("\n".join(problems))
    if not rounds:
        return None
    whole = n // step_tokens * step_tokens
    if whole != n:
        log.info("--hurdle-tokens %s: %s tokens per round, %d whole steps of %s", tokens, f"{whole:,}", whole // step_tokens,
                 f"{step_tokens:,}")
    return HurdleConfig(rounds, k, whole, per_type, init, batch)


def training_seed(seed: int, round: int) -> int:
    """The training seed of a round: every candidate of a round sees the same batches, each round other ones."""
    return int(np.random.SeedSequence([seed, 24, round]).generate_state(1)[0])


# --------------------------------------------------------------------------- the trainer


class TrainingStopped(Exception):
    """A training returned before its token budget (interrupted, e.g. by Ctrl-C): its checkpoint is kept, and
    running the stage again continues it."""


class CandidateTrainer(Protocol):
    """Trains one candidate for one round, then scores it.

    Call order, per training: ``train(subnet, round, init, out, resume) -> folder`` then ``score(folder)``.
    ``init`` is None for round 0 (start from the supernet's weights) and the previous round's folder after;
    ``out`` is a fresh folder, or with ``resume`` one holding the killed run's ``out/train/latest.pt`` to
    continue exactly.  ``tokens`` is the token budget of one round; ``description`` is everything besides the
    subnet and the round that decides a result (it names the settings' folder and trials: change it, retrain).
    ``train`` raises :class:`TrainingStopped` when it returns before the whole budget is trained.
    """

    tokens: int
    description: dict[str, Any]

    def train(self, subnet: Subnet, round: int, init: Path | None, out: Path, resume: bool) -> Path: ...

    def score(self, folder: Path) -> float: ...


@dataclass
class SubnetTrainer:
    """The real trainer: ``nas.train_subnet`` (the ``nas train-subnet`` library), torch model folders only.

    Round 0 starts from ``supernet:CKPT`` (``init="inherited"``: fine-tuning rates, as ``nas finetune``) or from
    scratch (``init="scratch"``: ``nas train-subnet``'s rates, lr 3e-3 to 3e-4), round r from ``model:<round r-1's
    folder>``; each round runs its own schedule over exactly ``tokens // (batch x seq_len)`` steps
    (``training_seed(seed, round)``).
    The space's task trains (``Task.train_subnet``: an encoder-decoder's trainer turns the budget, target bytes, into
    its own steps) and reads the folder back (``Task.load_trained``).
    ``score`` is the folder's model on the search's own held-out data: ``scoring.static(model)`` (``scoring``: the
    search's fitness; an LM's bits/byte on its windows, an encoder-decoder's cross-entropy on its pairs).
    ``data``, ``data_seed``, ``val_fraction``, ``options``: the supernet's corpus and split (its checkpoint's record,
    :meth:`Task.training_data`), so the trainings never see the validation split the search scores on;
    ``corpus_dir``: where that corpus is cached (the search's ``--data-cache``), so no training encodes it again.
    None: ``train_subnet``'s defaults.
    """

    space: Space
    supernet: Path
    tokens: int
    seq_len: int
    scoring: Any  # the search's fitness: .static(model) scores a trained model on its held-out data
    seed: int = 0
    data: str | None = None
    data_seed: int | None = None
    val_fraction: float | None = None
    corpus_dir: Path | None = None
    options: dict[str, Any] | None = None  # the task's own data settings (an encoder-decoder's catalog language)
    device: str = "cpu"
    init: str = "inherited"  # round 0 from the supernet's weights, or "scratch"
    batch: int = TRAIN_BATCH  # windows per step
    description: dict[str, Any] = field(init=False)

    def __post_init__(self) -> None:
        self.description = {"trainer": "train_subnet", "tokens": self.tokens, "train": self.config(0).to_dict() | {"seed": None},
                            "seed": self.seed, "data": self.data, "data_seed": self.data_seed, "val_fraction": self.val_fraction,
                            **({"init": self.init} if self.init != "inherited" else {}),
                            **({"options": self.options} if self.options else {})}  # (the tag of earlier runs kept)

    def config(self, round: int):
        """The round's TrainConfig: fine-tuning rates (as ``nas finetune``) from inherited weights, ``nas train-subnet``'s
        from scratch; a short warm-up, a few checkpoints."""
        from supernet.train import TrainConfig

        steps = self.tokens // (self.batch * self.seq_len)
        scratch = self.init == "scratch"
        lr, min_lr, warmup = (3e-3, 3e-4, min(30, steps // 10)) if scratch else (3e-4, 3e-5, min(20, steps // 10))
        return TrainConfig(batch_size=self.batch, seq_len=self.seq_len, lr=lr, min_lr=min_lr, warmup_steps=warmup,
                           max_steps=steps, eval_interval=steps, ckpt_interval=max(1, min(100, steps // 4)),
                           seed=training_seed(self.seed, round))

    def train(self, subnet: Subnet, round: int, init: Path | None, out: Path, resume: bool) -> Path:
        from supernet.runs import SubnetTraining
        from search_spaces import tasks

        split = {k: v for k, v in (("data_seed", self.data_seed), ("val_fraction", self.val_fraction),
                                   ("corpus_dir", self.corpus_dir), ("options", self.options)) if v is not None}
        first = f"supernet:{self.supernet}" if self.init == "inherited" else "scratch"
        settings = SubnetTraining(
            space=self.space, subnet=subnet, out=out, init=first if init is None else f"model:{init}",
            tokens=self.tokens, config=self.config(round), data=self.data, formats=("torch",), resume=resume, device=self.device,
            **split,
        )
        result = tasks.of(self.space).train_subnet(settings)
        if result.stopped != "max_steps":  # its whole budget, or stopped early (and resumable)
            raise TrainingStopped(f"{subnet} round {round}: stopped at step {result.steps} ({result.stopped})")
        return Path(result.out)

    def score(self, folder: Path) -> float:
        from search_spaces import tasks

        _, _, model = tasks.of(self.space).load_trained(folder, self.device)
        return float(self.scoring.static(model))  # fp32, as the search's fitness


# --------------------------------------------------------------------------- the decision (pure)


@dataclass(frozen=True)
class Candidate:
    """One of a budget's top K by the supernet-scored search."""

    rank: int  # 1 = the search's best
    subnet: Subnet
    inherited: float  # bits/byte with inherited weights (the search's fitness)
    latency: float  # predicted ms
    params: int


@dataclass(frozen=True)
class Row:
    """One training of a candidate and its verdict."""

    candidate: Candidate
    round: int
    bpb: float  # trained bits/byte after this round
    hurdle: float  # the mean of this round's candidates
    kept: bool  # bpb <= hurdle: trains on in the next round

    @property
    def verdict(self) -> str:
        return "kept" if self.kept else "stopped"


@dataclass
class BudgetHurdles:
    """A budget's hurdles as far as the known trainings go (:func:`replay`)."""

    label: str
    candidates: list[Candidate]
    rounds: int
    rows: list[Row] = field(default_factory=list)
    round: int = 0  # the round in progress; == rounds once done
    waiting: list[Candidate] = field(default_factory=list)  # that round's candidates whose training is not known yet

    @property
    def done(self) -> bool:
        return not self.waiting

    def ranking(self) -> list[Row]:
        """Each candidate's last row: those that reached the last round first (by their bits/byte), then the ones
        stopped earlier, later rounds first; ties by the search's rank."""
        last = {r.candidate.rank: r for r in self.rows}
        return sorted(last.values(), key=lambda r: (-r.round, _finite(r.bpb), r.candidate.rank))

    @property
    def best(self) -> Row | None:
        """The first of the ranking, once done; None without candidates, or when every training diverged."""
        ranking = self.ranking() if self.done else []
        return ranking[0] if ranking and np.isfinite(ranking[0].bpb) else None


def replay(label: str, candidates: Sequence[Candidate], rounds: int, scores: Mapping[Training, float]) -> BudgetHurdles:
    """Run the hurdles over the trainings known so far: ``scores[(subnet key, round)]`` = trained bits/byte.

    Round 0's cohort is every candidate; a round whose trainings are all known sets its hurdle (the mean of its
    finite bits/byte; a diverged training, inf or NaN, stops) and the kept ones are the next round's cohort.
    Stops at the first round with a training missing (``waiting``) or after ``rounds`` rounds.
    """
    out = BudgetHurdles(label, list(candidates), rounds)
    cohort = list(candidates)
    for r in range(rounds):
        if not cohort:  # no candidate, or every one diverged
            break
        out.round = r
        known = {c.rank: scores.get((c.subnet.key, r)) for c in cohort}
        out.waiting = [c for c in cohort if known[c.rank] is None]
        if out.waiting:
            return out
        values = np.array([_finite(known[c.rank]) for c in cohort])
        finite = values[np.isfinite(values)]
        hurdle = float(finite.mean()) if finite.size else math.inf
        rows = [Row(c, r, float(v), hurdle, bool(np.isfinite(v) and v <= hurdle)) for c, v in zip(cohort, values)]
        out.rows += rows
        cohort = [row.candidate for row in rows if row.kept]
    out.round, out.waiting = rounds, []
    return out


def _finite(value: float) -> float:
    value = float(value)
    return value if np.isfinite(value) else math.inf


def attention_type(subnet: Subnet) -> str:
    """The attention type most of ``subnet``'s layers use (its kind, parameters aside: ``lsra:7`` is ``lsra``);
    a tie goes to the type of the lower layer."""
    kinds = [a.split(":")[0] for a in subnet.attention]
    return max(dict.fromkeys(kinds), key=kinds.count)


def hurdle_candidates(searches, records, k: int, per_type: int = 0) -> dict[str, list[Candidate]]:
    """Per budget: the ``k`` lowest-loss distinct subnets that meet its constraints (ties by subnet key, so the
    choice does not depend on trial numbers, which differ between a resumed and an uninterrupted search).

    ``per_type`` > 0 adds the ``per_type`` lowest-loss feasible subnets of each attention type
    (:func:`attention_type`) not already among them: inherited weights can misjudge a whole type (shared
    projections trained mostly for the others), and a type the search ranks low then still gets real training.
    The cohort is ranked by inherited loss, numbered from 1.
    """
    unique = list({r.subnet: r for r in records}.values())
    out: dict[str, list[Candidate]] = {}
    for s in searches:
        ok = s.constraints.feasible([r.subnet for r in unique]) if unique else np.zeros(0, dtype=bool)
        feasible = sorted((r for r, good in zip(unique, ok) if good and np.isfinite(r.loss)),
                          key=lambda r: (r.loss, r.subnet.key))
        chosen = feasible[:k]
        if per_type:
            taken: dict[str, int] = {}
            for r in feasible:
                kind = attention_type(r.subnet)
                taken[kind] = taken.get(kind, 0) + 1
                if taken[kind] <= per_type and r not in chosen:
                    chosen.append(r)
            chosen.sort(key=lambda r: (r.loss, r.subnet.key))
        out[s.label] = [Candidate(i, r.subnet, r.loss, r.latency, r.params) for i, r in enumerate(chosen, 1)]
    return out


# --------------------------------------------------------------------------- storage


@dataclass(frozen=True)
class TrainingRecord:
    trial: int
    subnet: Subnet
    round: int
    bpb: float
    folder: str  # relative to the stage's root
    owner: str


class TrainingTrials:
    """The hurdle trials of one settings ``tag`` in the study: finished ones parsed once, running ones afresh."""

    def __init__(self, store: TrialStore, tag: str):
        self.store, self.tag = store, tag
        self.complete: dict[Training, TrainingRecord] = {}
        self.running: dict[Training, list[tuple[int, str]]] = {}
        self._scanned, self._unfinished = 0, set()

    def _training(self, t) -> Training | None:
        h = t.system_attrs.get(HURDLE)
        return None if h is None or h[0] != self.tag else (str(h[1]), int(h[2]))

    def refresh(self) -> "TrainingTrials":
        trials = self.store.study.get_trials(deepcopy=False)  # in number order
        fresh = trials[self._scanned:] + [trials[n] for n in sorted(self._unfinished) if n < self._scanned]
        self._scanned = len(trials)
        for t in fresh:
            key = self._training(t)
            if key is None:
                continue
            if not t.state.is_finished():
                self._unfinished.add(t.number)
                continue
            self._unfinished.discard(t.number)
            if t.state.name == "COMPLETE" and (key not in self.complete or t.number < self.complete[key].trial):
                u, kind = t.user_attrs, self.store.space.subnet_type  # the subnet type of the space's task
                self.complete[key] = TrainingRecord(t.number, kind.from_json(u["subnet"]), key[1], float(t.values[0]),
                                                    str(u["folder"]), str(t.system_attrs.get(OWNER)))
        self.running = {}
        for n in sorted(self._unfinished):
            t = trials[n]
            if t.state.name == "RUNNING":
                self.running.setdefault(self._training(t), []).append((t.number, t.system_attrs.get(OWNER, "")))
        return self

    def owner_of(self, key: Training) -> int | None:
        if key in self.complete:
            return self.complete[key].trial
        claims = self.running.get(key)
        return claims[0][0] if claims else None

    @property
    def scores(self) -> dict[Training, float]:
        return {k: r.bpb for k, r in self.complete.items()}


# --------------------------------------------------------------------------- the stage's loop


@dataclass(frozen=True)
class HurdleProgress:
    done: int  # trainings finished (all workers)
    total: int  # trainings known to be needed so far (later rounds add theirs)
    rounds: dict[str, int]  # the round in progress per budget
    waiting: bool  # no open training: waiting for other workers


@dataclass
class HurdleOutcome:
    config: HurdleConfig
    tag: str  # the settings' tag: trials and folders
    root: Path  # the trainings' folders: root / tag / key / round<r>
    budgets: dict[str, BudgetHurdles]
    trained_here: int = 0
    notes: dict[str, list[str]] = field(default_factory=dict)

    def folder(self, row: Row) -> Path:
        return training_folder(self.root, self.tag, row.candidate.subnet, row.round)


def settings_tag(trainer: CandidateTrainer, study: str) -> str:
    """Names the trainings of one study (its supernet, fitness windows, ...: the study's settings) and one training
    setting: their trials' ``nas:hurdle`` and their folder under the stage's root."""
    return config_hash({"study": study, **trainer.description})


def training_folder(root: Path, tag: str, subnet: Subnet, round: int) -> Path:
    return Path(root) / tag / subnet.key / f"round{round}"


def run_hurdles(
    cohorts: Mapping[str, Sequence[Candidate]],
    config: HurdleConfig,
    trainer: CandidateTrainer,
    store: TrialStore,
    root: Path,
    *,
    poll_s: float = 2.0,
    progress: Callable[[HurdleProgress], None] | None = None,
    rng: np.random.Generator | None = None,
) -> HurdleOutcome:
    """Run (or resume, or join) the hurdle stage in ``store`` until every budget's last round is trained.

    ``cohorts``: each budget's candidates (:func:`hurdle_candidates`).  Trainings go to folders under ``root``
    (a folder every worker sees: the next round starts from the previous round's weights).  ``rng`` only
    spreads the trainings several workers pick at once; it never changes a result.
    """
    assert trainer.tokens == config.tokens, "the trainer's tokens per round are the stage's"
    tag = settings_tag(trainer, store.study.study_name)
    rng = rng or np.random.default_rng(abs(hash(store.owner)) % 2**32)
    notes = {label: [f"{len(c)} feasible candidates of the {config.candidates} asked for"]
             if len(c) < config.candidates else [] for label, c in cohorts.items()}
    trials = TrainingTrials(store, tag)
    trained = 0
    labels: dict[str, list[str]] = {}  # subnet key -> the budgets whose cohort holds it (the trial's "budget" attr)
    for label, cohort in cohorts.items():
        for c in cohort:
            labels.setdefault(c.subnet.key, []).append(label)
    store.recover()
    while True:
        trials.refresh()
        plans = {label: replay(label, c, config.rounds, trials.scores) for label, c in cohorts.items()}
        wanted = {(c.subnet.key, p.round): c for p in plans.values() for c in p.waiting}
        if not wanted:
            break
        open_ = sorted((r, key) for key, r in wanted if trials.owner_of((key, r)) is None)
        if progress:
            done = len(trials.complete)
            progress(HurdleProgress(done, done + len(wanted), {label: p.round for label, p in plans.items()}, not open_))
        if not open_:
            if not store.recover():
                time.sleep(poll_s)
            continue
        lowest = [t for t in open_ if t[0] == open_[0][0]]
        others = any(o != store.owner for claims in trials.running.values() for _, o in claims)
        r, key = lowest[int(rng.integers(len(lowest)))] if others else lowest[0]
        trained += _train(store, trials, trainer, tag, Path(root), wanted[(key, r)], r, ",".join(labels[key]))
    return HurdleOutcome(config, tag, Path(root), plans, trained, notes)


def _train(store: TrialStore, trials: TrainingTrials, trainer: CandidateTrainer, tag: str, root: Path, candidate: Candidate,
           round: int, budgets: str) -> int:
    """Claim the training (subnet, round); unless another worker claimed it first, train, score and complete it.
    ``budgets``: the labels of the budgets whose cohort holds it, comma-separated (a training serves them all)."""
    subnet = candidate.subnet
    folder = training_folder(root, tag, subnet, round)
    attrs = {"stage": "hurdles", "budget": budgets, "round": round, "latency_ms": float(candidate.latency),
             "params": int(candidate.params), "subnet": subnet.to_json(), "tokens": trainer.tokens * (round + 1),
             "folder": str(folder.relative_to(root))}
    (number,) = store.add_running([(subnet, attrs, {HURDLE: [tag, subnet.key, round]})])
    owner = trials.refresh().owner_of((subnet.key, round))
    if owner != number:
        store.drop(number, f"training {subnet.key} round {round} was claimed first by trial {owner}")
        return 0
    init = None if round == 0 else training_folder(root, tag, subnet, round - 1)
    try:
        bpb = _trained_bpb(trainer, subnet, round, init, folder)
    except BaseException as e:  # interrupted or broken: give the training back at once (its checkpoint stays)
        store.fail(number, f"training stopped: {type(e).__name__}")
        raise
    store.finish(number, bpb if np.isfinite(bpb) else float("inf"))
    return 1


def _trained_bpb(trainer: CandidateTrainer, subnet: Subnet, round: int, init: Path | None, folder: Path) -> float:
    """Train (continuing a killed run from its checkpoint) and score; a folder already trained and scored is reused."""
    done = folder / DONE
    if done.is_file():  # its worker died between the scoring and the trial's completion
        stored = json.loads(done.read_text())
        assert (stored["key"], stored["round"], stored["settings"]) == (subnet.key, round, _plain(trainer.description)), done
        return float(stored["bits_per_byte"])
    if init is not None and not (init / DONE).is_file():
        raise UserError(f"hurdles: the weights of round {round - 1} of {subnet} are not in {init}; workers on several hosts "
                        "need --out on a filesystem they all see")
    resume = (folder / "train" / "latest.pt").is_file()
    if not resume and folder.exists():  # a start killed before its first checkpoint
        shutil.rmtree(folder)
    log.info("hurdles: %s %s round %d (%s %s) of %s", "continuing" if resume else "training",
             subnet.key, round, f"{trainer.tokens:,}", token_unit(trainer), subnet)
    trained = Path(trainer.train(subnet, round, init, folder, resume))
    assert trained.resolve() == folder.resolve(), (trained, folder)
    bpb = float(trainer.score(folder))
    from supernet.artifact import write_json_atomic

    write_json_atomic(done, {"subnet": subnet.to_dict(), "key": subnet.key, "round": round, "bits_per_byte": bpb,
                             "tokens": trainer.tokens * (round + 1), "settings": trainer.description})
    return bpb


def _plain(data: Any) -> Any:
    """``data`` as it reads back from JSON (tuples become lists)."""
    return json.loads(json.dumps(data))


# --------------------------------------------------------------------------- reporting


def report(outcome: HurdleOutcome, unit: str = "bits/byte", tokens: str = "tokens") -> str:
    """The terminal table: every training with its hurdle and verdict, then the best per budget (scores in ``unit``,
    the search's fitness metric; ``tokens``: what the task's token counts count)."""
    c = outcome.config
    wl = max([6] + [len(label) for label in outcome.budgets])
    lines = [f"hurdles: top {c.candidates} per budget, {c.rounds} round{'s' * (c.rounds != 1)} of {c.tokens:,} training {tokens} "
             f"({'from scratch' if c.init == 'scratch' else 'from inherited weights'}); {unit} on the search's "
             "held-out data",
             f"{'budget':<{wl}} {'cand':>4} {'round':>5} {'inherited':>9} {'trained':>9} {'hurdle':>9}  verdict  subnet"]
    for label, b in outcome.budgets.items():
        for row in b.rows:
            lines.append(f"{label:<{wl}} {row.candidate.rank:>4} {row.round:>5} {row.candidate.inherited:>9.4f} "
                         f"{row.bpb:>9.4f} {row.hurdle:>9.4f}  {row.verdict:<7}  {row.candidate.subnet}")
        if not b.candidates:
            lines.append(f"{label:<{wl}}    -  no feasible candidate to train")
    for label, b in outcome.budgets.items():
        best = b.best
        if best is None:
            continue
        first = next((r for r in b.ranking() if r.candidate.rank == 1), None)
        if best.candidate.rank == 1:
            changed = "the search's best too"
        elif first is None:  # measured over the budget on the timing target, so never trained
            changed = "the search's best (candidate 1) was not trained"
        else:
            changed = f"the search's best (candidate 1) {first.verdict} at round {first.round}, {first.bpb:.4f}"
        lines.append(f"{label}: best after hurdles is candidate {best.candidate.rank}, {best.bpb:.4f} {unit} at round "
                     f"{best.round} ({c.tokens * (best.round + 1):,} {tokens} trained; {best.candidate.inherited:.4f} "
                     f"inherited), {changed}")
    return "\n".join(lines)


def token_unit(trainer: CandidateTrainer) -> str:
    """What the trainer's token budget counts (its space's task's ``token_unit``: an encoder-decoder's target bytes);
    ``tokens`` for a trainer without a space."""
    space = getattr(trainer, "space", None)
    if space is None:
        return "tokens"
    from search_spaces import tasks

    return tasks.of(space).token_unit


def write_files(out: Path, outcome: HurdleOutcome, space: Space, seed: int, unit: str = "bits/byte",
                tokens: str = "tokens") -> dict[str, Any]:
    """``hurdles.csv`` and ``hurdles_<budget>.yaml`` (the best after hurdles) per budget; the ``search.json`` entry.
    ``unit``: the search's fitness metric; ``tokens``: what the task's token counts count (as :func:`report`)."""
    c = outcome.config
    rows, doc = [], {"rounds": c.rounds, "candidates": c.candidates, "tokens_per_round": c.tokens, "tag": outcome.tag,
                     "models": str(outcome.root / outcome.tag), "budgets": {}}
    for label, b in outcome.budgets.items():
        table = []
        for row in b.rows:
            entry = {"budget": label, "candidate": row.candidate.rank, "round": row.round,
                     "tokens": c.tokens * (row.round + 1), "inherited_bpb": row.candidate.inherited, "trained_bpb": row.bpb,
                     "hurdle_bpb": row.hurdle, "verdict": row.verdict, "latency_ms": row.candidate.latency,
                     "params": row.candidate.params, "key": row.candidate.subnet.key, "subnet": str(row.candidate.subnet),
                     "model": str(outcome.folder(row))}
            rows.append(entry)
            table.append({**entry, "subnet": row.candidate.subnet.to_dict()})
        best = b.best
        entry = {"table": table, "notes": outcome.notes.get(label, []), "best": None,
                 "ranking": [{"candidate": r.candidate.rank, "round": r.round, "trained_bpb": r.bpb} for r in b.ranking()]}
        if best is not None:
            name = f"hurdles_{label}.yaml"
            atomic_write(
                out / name,
                f"# nas search --hurdles: best of the top {len(b.candidates)} candidates under {label} after progressive "
                "dynamic hurdles\n"
                f"# trained {best.bpb:.6f} {unit} at round {best.round} ({best.round + 1} x {c.tokens:,} {tokens}) "
                f"(inherited {best.candidate.inherited:.6f}), candidate {best.candidate.rank} of the search\n"
                f"# trained model: {outcome.folder(best)}\n"
                f"# space {space.name} (hash {space.hash}), seed {seed}, settings tag {outcome.tag}\n"
                + best.candidate.subnet.to_yaml()
            )
            entry["best"] = {"candidate": best.candidate.rank, "round": best.round, "trained_bpb": best.bpb,
                             "inherited_bpb": best.candidate.inherited, "key": best.candidate.subnet.key,
                             "subnet": best.candidate.subnet.to_dict(), "model": str(outcome.folder(best)), "file": name}
        doc["budgets"][label] = entry
    fields = ["budget", "candidate", "round", "tokens", "inherited_bpb", "trained_bpb", "hurdle_bpb", "verdict", "latency_ms",
              "params", "key", "subnet", "model"]
    atomic_write_csv(out / "hurdles.csv", fields, ({k: (f"{v:.6f}" if isinstance(v, float) else v) for k, v in r.items()}
                                                   for r in rows))
    return doc
