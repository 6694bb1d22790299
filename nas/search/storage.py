"""The search's Optuna storage: every evaluated subnet is one trial.

A trial holds the subnet as parameters (``embed_dim``, ``depth``, ``l{i}.heads`` ...,
categorical, so dashboards show them), two objectives, both minimised: its validation loss and its predicted
latency (ms), so that optuna-dashboard's Pareto-front view and ``study.best_trials`` show the front the search
found (a study of an earlier version keeps its one objective, the loss); user attrs
``subnet`` (JSON), ``latency_ms``, ``params``, ``budget``, ``generation`` and ``cached``
(the loss was reused from an earlier trial of the same subnet); each one a database row, so few.
A search trial also carries Optuna's constraint values (system attr ``constraints``, :data:`CONSTRAINTS`: each
constraint of its budget, the value less the limit, <= 0 where it holds), which the dashboard and
``study.best_trials`` read.
System attrs: ``nas:slot`` = [budget, generation, index], the place of the subnet in the
search, ``nas:owner`` = host:pid:start-time of the worker that claimed it and ``nas:claim``,
that claim's own name (it finds the new trial's number).

Only Optuna's public API is used: a worker *claims* a slot by adding a RUNNING trial for it
(``study.add_trial(optuna.trial.create_trial(state=RUNNING, ...))``: one transaction, parameters
and attrs included) and ends it with ``study.tell(number, ...)``.  The lowest-numbered live
trial of a slot owns it; a later one is PRUNED unevaluated.  Trials left RUNNING by a dead
worker are failed, so the slot is open again: at once when the worker ran on this host (its
process is gone or its pid was reused: psutil, so Linux and macOS alike), and on a database
server, when its heartbeat stops.  The heartbeat is Optuna's own (``RDBStorage(heartbeat_interval=
HEARTBEAT_S, grace_period=GRACE_S)``, :func:`open_storage`): a thread of the worker records it for each
of its RUNNING trials (``storage.record_heartbeat``, in Optuna's heartbeat table, read by no dashboard),
and ``optuna.storages.fail_stale_trials`` fails a trial whose heartbeat is older than the grace period
by the database server's clock (no clocks are compared across hosts).  A claim is marked with the
system attr ``nas:beating`` once its first heartbeat is recorded; one a worker died before marking is
failed when another worker has seen it unmarked for the grace period.  Nothing of this is left in the
study's attrs (earlier versions kept a ``nas:alive:<owner>`` study user attr per worker, which Optuna's
API cannot delete).  Why a trial was failed or dropped is the study user attr
``nas:ended:<number>`` (:func:`ended`).  The study's settings live in its user attr ``nas:config``;
opening it with other settings is refused.

The hurdle stage (:mod:`.hurdles`) keeps its trainings in the same study, claimed the same way
(:meth:`TrialStore.add_running`): those trials carry ``nas:hurdle`` instead of ``nas:slot``, so the
search's snapshot ignores them, and :meth:`TrialStore.recover` fails them like any other.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import socket
import threading
import time
import warnings
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from search_spaces import Space, Subnet, UserError
from search_spaces.errors import first_line, hide_password

SLOT, OWNER, CLAIM, CONFIG = "nas:slot", "nas:owner", "nas:claim", "nas:config"
BEATING = "nas:beating"  # trial system attr: its worker has recorded its first heartbeat
CONSTRAINTS = "constraints"  # trial system attr Optuna reads (optuna.study.Study.best_trials, the dashboard): <= 0 holds
LATENCY_METRIC = "latency (ms, predicted)"  # the second objective's name in the study
BEST = "best_trial_per_budget"  # study user attr: each budget's best trial (:meth:`TrialStore.mark_best`)
ENDED = "nas:ended:"  # study user attr prefix: why a trial ended early
HEARTBEAT_S, GRACE_S = 10, 60  # whole seconds, as Optuna's RDBStorage takes them
Slot = tuple[str, int, int]  # (budget label, generation, index)
_CLAIMS = itertools.count()  # the claim numbers of this process


def _optuna():
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    return optuna


def default_storage(out_dir: str | Path) -> str:
    return f"sqlite:///{Path(out_dir).resolve() / 'search.db'}"


def heartbeat_interval(url: str) -> int | None:
    """Seconds between a worker's heartbeats on storage ``url``: ``HEARTBEAT_S`` on a database server, where
    workers may run on several hosts; None for SQLite (one host: a dead worker is found by its process) and memory."""
    return None if url == "memory" or url.startswith("sqlite") else HEARTBEAT_S


def open_storage(url: str, attempts: int = 20, *, heartbeat_s: int | None = None, grace_s: int = GRACE_S):
    """An Optuna storage for ``url`` (any SQLAlchemy database URL Optuna takes; ``memory``: in-process).

    SQLite waits up to 60 s for a lock instead of 5.  Creating the tables races when several
    workers open a fresh database at once; that is retried.  ``heartbeat_s`` (default
    :func:`heartbeat_interval`: on a database server; 0: none) turns on Optuna's heartbeat with
    ``grace_s``: a :class:`TrialStore` on a study of this storage then records it for its trials and
    fails other workers' stale ones (the reason in ``nas:ended:<number>``).
    """
    optuna = _optuna()
    from sqlalchemy.exc import SQLAlchemyError

    if url == "memory":  # one process only, nothing kept: tests and benchmarks
        return optuna.storages.InMemoryStorage()
    kwargs: dict[str, Any] = {}
    if url.startswith("sqlite"):
        # WAL + synchronous=NORMAL: a commit is not an fsync (a killed process loses nothing; a power cut may lose
        # the last trials).
        kwargs["engine_kwargs"] = {"creator": _sqlite_creator(url)}
    heartbeat_s = heartbeat_interval(url) if heartbeat_s is None else heartbeat_s
    if heartbeat_s:
        if int(heartbeat_s) != heartbeat_s or int(grace_s) != grace_s or not 0 < heartbeat_s < grace_s:
            raise ValueError(f"heartbeat every {heartbeat_s} s, grace {grace_s} s: whole seconds, the grace the longer")
        import inspect

        named = "heartbeat_stale_trial_callback"  # Optuna 5's name; 4's: failed_trial_callback
        if named not in inspect.signature(optuna.storages.RDBStorage).parameters:
            named = "failed_trial_callback"
        kwargs.update({"heartbeat_interval": int(heartbeat_s), "grace_period": int(grace_s), named: _stale(int(grace_s))})
    for attempt in range(attempts):
        try:
            return optuna.storages.RDBStorage(url, **kwargs)
        except (SQLAlchemyError, optuna.exceptions.StorageInternalError) as e:
            if attempt == attempts - 1 or not _is_race(e):
                raise cannot_open(url, e) from None
            time.sleep(0.05 * (attempt + 1))
        except (ValueError, ImportError, ModuleNotFoundError) as e:
            raise cannot_open(url, e) from None
    raise AssertionError("unreachable: the last attempt returns or raises")


def check_storage(url: str) -> None:
    """Refuse a storage URL that SQLAlchemy cannot parse or whose database driver is not installed, without
    connecting: a command checks it before it makes anything (an output folder, a study)."""
    if url == "memory":
        return
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError, NoSuchModuleError

    try:
        make_url(url).get_dialect().import_dbapi()
    except (ArgumentError, NoSuchModuleError, ValueError, ImportError) as e:
        raise cannot_open(url, e) from None


def cannot_open(url: str, e: BaseException) -> UserError:
    """The one line for a storage that cannot be opened: the URL and the library's first line, its password hidden
    (:func:`search_spaces.errors.hide_password`), and where the driver is missing, how to install it."""
    hint = " (PostgreSQL's driver is the postgres extra: pip install 'nas-transformers[postgres]')" if (
        isinstance(e, ImportError) and url.startswith("postgres")) else ""
    return UserError(hide_password(f"--storage: cannot open {url!r}: {first_line(e, 300)}{hint}", url))


def _sqlite_creator(url: str):
    import sqlite3

    from sqlalchemy.engine import make_url

    database = make_url(url).database or ":memory:"
    if database != ":memory:":
        Path(database).parent.mkdir(parents=True, exist_ok=True)

    def connect():
        conn = sqlite3.connect(database, timeout=60, check_same_thread=False)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        return conn

    return connect


def _is_race(e: Exception) -> bool:
    text = str(e).lower()
    return any(s in text for s in ("already exists", "locked", "unique", "duplicate", "deadlock", "integrity", "version_info"))


def config_hash(config: dict) -> str:
    return hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()[:8]


def open_study(storage, name: str, config: dict, attempts: int = 20, *, metric: str = "loss"):
    """Create the study ``name`` once (several workers may race here) or load it; check its settings.

    Two objectives, both minimised: ``metric`` (the loss, e.g. ``loss (bits/byte)``) and :data:`LATENCY_METRIC`
    (``study.set_metric_names``: dashboards label the values with them, and draw the Pareto front).  A study of an
    earlier version has one objective, the loss; it is resumed as it is (its trials get the loss only)."""
    optuna = _optuna()
    for attempt in range(attempts):
        try:
            study = optuna.create_study(
                storage=storage, study_name=name, directions=["minimize", "minimize"], load_if_exists=True,
                sampler=optuna.samplers.RandomSampler(seed=0),  # never asked: trials are created with their parameters
            )
            stored = study.user_attrs.get(CONFIG)
            if stored is None:
                study.set_user_attr(CONFIG, config)
                stored = config
            names = [metric, LATENCY_METRIC][:len(study.directions)]
            if study.metric_names != names:
                study.set_metric_names(names)
            break
        except Exception as e:  # noqa: BLE001 - a lost creation race surfaces as several exception types
            if attempt == attempts - 1 or not _is_race(e):
                raise
            time.sleep(0.05 * (attempt + 1))
    stored = json.loads(json.dumps(stored))
    want = json.loads(json.dumps(config))
    if stored != want:
        diff = sorted(k for k in set(stored) | set(want) if stored.get(k) != want.get(k))
        raise UserError(
            f"--study {name}: the storage holds this study with other settings ({', '.join(diff)}: "
            f"{', '.join(f'{k}={stored.get(k)!r}' for k in diff)}); use another --study or --out"
        )
    _STORAGES[study] = storage
    return study


_STORAGES: "weakref.WeakKeyDictionary[Any, Any]" = weakref.WeakKeyDictionary()  # study -> the storage open_study opened it on


# --------------------------------------------------------------------------- workers


def _process_start(pid: int) -> str | None:
    """The start time of live process ``pid`` (a reused pid has another), None when there is none
    (or only its zombie), ``"?"`` when it lives but may not be inspected."""
    import psutil

    try:
        process = psutil.Process(pid)
        if process.status() == psutil.STATUS_ZOMBIE:
            return None
        return f"{process.create_time():.2f}"
    except psutil.NoSuchProcess:
        return None
    except psutil.AccessDenied:
        return "?"


def worker_id() -> str:
    """``host:pid:start`` of this process; the start time tells a reused pid apart."""
    return f"{socket.gethostname()}:{os.getpid()}:{_process_start(os.getpid()) or '?'}"


def worker_is_dead(owner: str) -> bool:
    """True only when ``owner`` ran on this host and its process is gone (unknown hosts: False)."""
    try:
        host, pid, start = owner.rsplit(":", 2)
        pid = int(pid)
    except ValueError:
        return False
    if host != socket.gethostname():
        return False
    now = _process_start(pid)
    if now is None:
        return True
    return "?" not in (now, start) and now != start


_RECOVERING = threading.local()  # TrialStore.recover's worker and the trials its fail_stale_trials call failed


def _stale(grace_s: int):
    """The storage's callback for each trial ``optuna.storages.fail_stale_trials`` failed (in the calling thread)."""

    def failed(study, trial) -> None:
        owner = trial.system_attrs.get(OWNER, "?")
        by = getattr(_RECOVERING, "owner", None) or worker_id()
        study.set_user_attr(f"{ENDED}{trial.number}",
                            {"state": "FAIL", "why": f"worker {owner} sent no heartbeat for {grace_s} s", "by": by})
        getattr(_RECOVERING, "failed", []).append(trial.number)

    return failed


def ended(study) -> dict[int, dict[str, str]]:
    """Why trials were failed or dropped: trial number -> {"state", "why", "by"} (the ``nas:ended:<number>`` attrs)."""
    return {int(k[len(ENDED):]): v for k, v in study.user_attrs.items() if k.startswith(ENDED)}


class _Heartbeat:
    """Records Optuna's heartbeat of this worker's RUNNING trials (``storage.record_heartbeat``) every ``interval``
    seconds from a daemon thread: the first at once, as a trial is claimed, then marked ``nas:beating``."""

    def __init__(self, storage, study, owner: str, interval: int):
        self.storage, self.interval = storage, interval
        self.study_id = storage.get_study_id_from_name(study.study_name)
        self.trials: dict[int, int] = {}  # trial number -> trial id, while it runs
        self.lock, self.stop = threading.Lock(), threading.Event()
        self.thread = threading.Thread(target=self._run, name=f"nas heartbeat {owner}", daemon=True)
        self.thread.start()

    def add(self, numbers: Sequence[int]) -> None:
        optuna = _optuna()
        for number in numbers:
            trial_id = self.storage.get_trial_id_from_study_id_trial_number(self.study_id, number)
            self.storage.record_heartbeat(trial_id)  # first the heartbeat, then the mark that says there is one
            try:
                self.storage.set_trial_system_attr(trial_id, BEATING, True)
            except optuna.exceptions.UpdateFinishedTrialError:
                continue  # ended meanwhile
            with self.lock:
                self.trials[number] = trial_id

    def discard(self, number: int) -> None:
        with self.lock:
            self.trials.pop(number, None)

    def _run(self) -> None:
        while not self.stop.wait(self.interval):
            with self.lock:
                ids = list(self.trials.values())
            for trial_id in ids:
                try:
                    self.storage.record_heartbeat(trial_id)
                except Exception:  # noqa: BLE001 - a lost connection: try again at the next beat
                    break

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=5)


# --------------------------------------------------------------------------- trials


def trial_params(space: Space, subnet: Subnet):
    """The subnet as Optuna parameters with their (categorical) distributions: the space's genes."""
    from optuna.distributions import CategoricalDistribution

    genes = space.genes(subnet)
    return {k: v for k, (v, _) in genes.items()}, {k: CategoricalDistribution(c) for k, (_, c) in genes.items()}


@dataclass(frozen=True)
class Record:
    """One finished evaluation, as read back from storage."""

    trial: int  # number
    slot: Slot
    subnet: Subnet
    loss: float
    latency: float
    params: int
    cached: bool
    owner: str


@dataclass
class Snapshot:
    """What storage holds; ``complete`` and ``losses`` only grow, later snapshots extend the same dicts."""

    complete: dict[Slot, Record] = field(default_factory=dict)  # the owning (lowest-numbered) COMPLETE trial per slot
    running: dict[Slot, list[tuple[int, str]]] = field(default_factory=dict)  # slot -> [(trial number, owner)], ascending
    losses: dict[Subnet, float] = field(default_factory=dict)  # every subnet with a finished loss

    def owner_of(self, slot: Slot) -> int | None:
        """Number of the trial that owns ``slot``: the complete one, else the first running one."""
        if slot in self.complete:
            return self.complete[slot].trial
        claims = self.running.get(slot)
        return claims[0][0] if claims else None


def _slot(t) -> Slot | None:
    slot = t.system_attrs.get(SLOT)
    return None if slot is None else (str(slot[0]), int(slot[1]), int(slot[2]))


class TrialStore:
    """Reads the search's trials (parsing each finished one once) and claims / finishes / recovers slots.

    ``storage``: the study's (default: the one :func:`open_study` opened it on).  Where it has Optuna's heartbeat
    (:func:`open_storage`: a database server shared by hosts), this worker records it for its RUNNING trials and
    :meth:`recover` fails stale ones of any worker; otherwise other hosts' trials are never failed (SQLite,
    memory).  :meth:`close` stops the heartbeat.
    """

    def __init__(self, study, space: Space, owner: str | None = None, *, storage=None):
        self.study, self.space = study, space
        self.owner = owner or worker_id()
        storage = storage if storage is not None else _STORAGES.get(study)
        self.heartbeat_s = storage.get_heartbeat_interval() if hasattr(storage, "get_heartbeat_interval") else None
        self.grace_s = (getattr(storage, "grace_period", None) or 2 * self.heartbeat_s) if self.heartbeat_s else None
        self._claims = _CLAIMS  # names this worker's claims: owner#n, unique in the process (stores of one study share names)
        self._complete: dict[Slot, Record] = {}  # grows as trials finish; shared by the snapshots
        self._losses: dict[Subnet, float] = {}
        self._scanned = 0  # trials (by number) looked at so far
        self._unfinished: set[int] = set()  # of those, the ones not finished when last looked at
        self._unmarked: dict[int, float] = {}  # others' trials seen without nas:beating -> when this worker first saw it
        self._latency: dict[int, float | None] = {}  # this worker's running trials -> their predicted latency (ms)
        self._heartbeat = _Heartbeat(storage, study, self.owner, self.heartbeat_s) if self.heartbeat_s else None

    def close(self) -> None:
        if self._heartbeat is not None:
            self._heartbeat.close()
            self._heartbeat = None

    def __enter__(self) -> "TrialStore":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _record(self, t) -> Record | None:
        slot = _slot(t)
        if t.state.name != "COMPLETE" or slot is None:
            return None
        u = t.user_attrs
        subnet = self.space.subnet_type.from_json(u["subnet"])  # the subnet type of the space's task
        return Record(t.number, slot, subnet, float(t.values[0]), float(u["latency_ms"]), int(u["params"]),
                      bool(u.get("cached")), str(t.system_attrs.get(OWNER)))

    def snapshot(self) -> Snapshot:
        """The trials now: finished ones are read once and kept (they never change), running ones afresh."""
        trials = self.study.get_trials(deepcopy=False)  # in number order
        fresh = [t for t in trials[self._scanned :]] + [trials[n] for n in sorted(self._unfinished) if n < self._scanned]
        self._scanned = len(trials)
        running: dict[Slot, list[tuple[int, str]]] = {}
        for t in fresh:
            if not t.state.is_finished():
                self._unfinished.add(t.number)
                continue
            self._unfinished.discard(t.number)
            rec = self._record(t)
            if rec is not None:
                owner = self._complete.get(rec.slot)
                if owner is None or rec.trial < owner.trial:  # the lowest-numbered complete trial owns a slot
                    self._complete[rec.slot] = rec
                self._losses.setdefault(rec.subnet, rec.loss)
        for n in sorted(self._unfinished):
            t = trials[n]
            slot = _slot(t)
            if t.state.name == "RUNNING" and slot is not None:
                running.setdefault(slot, []).append((t.number, t.system_attrs.get(OWNER, "")))
        return Snapshot(complete=self._complete, running=running, losses=self._losses)

    def claim(self, slot: Slot, subnet: Subnet, latency: float, params: int, cached: bool) -> int:
        """A RUNNING trial for ``slot`` (parameters and attrs in the same transaction); its number."""
        return self.claim_all([(slot, subnet, latency, params, cached)])[0]

    def claim_all(self, claims: Sequence[tuple]) -> list[int]:
        """:meth:`claim` each ``(slot, subnet, latency, params, cached)`` or ``(..., cached, constraints)`` (each
        constraint's value less its limit: Optuna's constraint values), one transaction each; their numbers, in order."""
        return self.add_running([
            (subnet, {"stage": "search", "budget": slot[0], "generation": slot[1], "latency_ms": float(latency),
                      "params": int(params), "subnet": subnet.to_json(), "cached": bool(cached)},
             {SLOT: list(slot), **({CONSTRAINTS: [float(c) for c in rest[0]]} if rest and rest[0] else {})})
            for slot, subnet, latency, params, cached, *rest in claims
        ])

    def add_running(self, claims: Sequence[tuple[Subnet, dict[str, Any], dict[str, Any]]]) -> list[int]:
        """A RUNNING trial of this worker per ``(subnet, user attrs, system attrs)`` (the subnet as parameters, the
        owner and claim name added), one transaction each; their numbers, in order.  What the trials are for is in
        their system attrs: ``nas:slot`` (the search's) or ``nas:hurdle`` (:mod:`.hurdles`'s trainings)."""
        optuna = _optuna()
        names = []
        latencies = []
        for subnet, user_attrs, system_attrs in claims:
            latencies.append(user_attrs.get("latency_ms"))
            values, dists = trial_params(self.space, subnet)
            names.append(f"{self.owner}#{next(self._claims)}")
            self.study.add_trial(optuna.trial.create_trial(
                state=optuna.trial.TrialState.RUNNING, params=values, distributions=dists, user_attrs=user_attrs,
                system_attrs={**system_attrs, OWNER: self.owner, CLAIM: names[-1]},
            ))
        # add_trial returns nothing: find each trial by its claim name, among the running ones (newest first; one
        # already failed by another worker is among all trials)
        found: dict[str, int] = {}
        running = self.study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,))
        for trials in (running, None):
            if len(found) == len(names):
                break
            for t in reversed(trials if trials is not None else self.study.get_trials(deepcopy=False)):
                name = t.system_attrs.get(CLAIM)
                if name in names:
                    found.setdefault(name, t.number)
        missing = [n for n in names if n not in found]
        assert not missing, f"storage: the trials of claims {missing} were added but are not found"
        numbers = [found[n] for n in names]
        self._latency.update(zip(numbers, latencies))
        if self._heartbeat is not None:
            self._heartbeat.add(numbers)
        return numbers

    def mark_best(self, best: dict[str, Record | None]) -> None:
        """Name each budget's best trial in the study user attr ``best_trial_per_budget`` (a budget label -> its trial
        number, None where nothing feasible was found): the study's own best trial mixes budgets.  Written when it
        changes; every worker that ends the search computes the same."""
        want = {label: None if r is None else r.trial for label, r in best.items()}
        if self.study.user_attrs.get(BEST) != want:
            self.study.set_user_attr(BEST, want)

    def finish(self, number: int, loss: float) -> bool:
        """Complete the trial with ``loss`` (and its claim's predicted latency, the second objective, in a study that has
        one); False when it had been failed meanwhile (the slot went to another)."""
        values: float | list[float] = float(loss)
        if len(self.study.directions) == 2:
            latency = self._latency.pop(number, None)
            if latency is None:  # claimed by another store of this worker: the trial says it
                latency = self.study.get_trials(deepcopy=False)[number].user_attrs.get("latency_ms")
            values = [float(loss), float(latency) if latency is not None else float("inf")]
        return self._tell(number, values=values)

    def drop(self, number: int, reason: str) -> None:
        """PRUNE a claim that lost its slot to a lower-numbered trial (it was never evaluated)."""
        self._end(number, "PRUNED", reason)

    def fail(self, number: int, reason: str) -> bool:
        """FAIL a RUNNING trial (its worker died, or its evaluation stopped); False when it had ended meanwhile."""
        return self._end(number, "FAIL", reason)

    def _tell(self, number: int, values: float | list[float] | None = None, state: str | None = None) -> bool:
        optuna = _optuna()
        if self._heartbeat is not None:
            self._heartbeat.discard(number)
        try:
            self.study.tell(number, values, state=None if state is None else optuna.trial.TrialState[state])
        except optuna.exceptions.UpdateFinishedTrialError:
            return False  # another worker ended it between the read and the write
        except ValueError as e:
            if "Cannot tell a" not in str(e):  # "Cannot tell a FAIL trial": it had ended before
                raise
            return False
        return True

    def _end(self, number: int, state: str, reason: str) -> bool:
        if not self._tell(number, state=state):
            return False  # finished meanwhile (another worker recovered it): nothing to do
        self.study.set_user_attr(f"{ENDED}{number}", {"state": state, "why": reason, "by": self.owner})
        return True

    def _unmarked_for(self, number: int, now: float) -> float:
        """Seconds, by this worker's clock, since it first saw the trial ``number`` without ``nas:beating``."""
        return now - self._unmarked.setdefault(number, now)

    def recover(self) -> list[int]:
        """Fail the RUNNING trials of dead workers (this host: process gone; elsewhere: heartbeat stale, or none
        recorded for the grace period); their numbers."""
        optuna = _optuna()
        running = self.study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,))
        others = [(t, t.system_attrs.get(OWNER, "")) for t in running]
        others = [(t, owner) for t, owner in others if owner != self.owner]
        here = socket.gethostname()
        now = time.monotonic()
        failed = []
        for t, owner in others:
            if worker_is_dead(owner):
                why = f"worker {owner} died"
            elif (self.heartbeat_s and owner.rsplit(":", 2)[0] != here and not t.system_attrs.get(BEATING)
                  and self._unmarked_for(t.number, now) >= self.grace_s):
                why = f"worker {owner} recorded no heartbeat for {self.grace_s:g} s after claiming it"
            else:
                continue
            if self.fail(t.number, why):
                failed.append(t.number)
        if self.heartbeat_s:  # Optuna's own check, by the database server's clock; the callback says why (_stale)
            _RECOVERING.owner, _RECOVERING.failed = self.owner, []
            try:
                optuna.storages.fail_stale_trials(self.study)
                failed += _RECOVERING.failed
            finally:
                del _RECOVERING.owner, _RECOVERING.failed
        return failed
